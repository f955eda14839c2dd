"""Run Glm5Next's _expand_pools_and_append_tail_kernel from a kpool_compress.py on CPU.

Usage: TRITON_INTERPRET=1 python kpool_expand.py PATH/TO/kpool_compress.py
Prints one JSON line. The kernel and its launcher are taken from the file itself (its own
syntax tree, compiled here) and run by Triton's interpreter, so no GPU and no vLLM import
is needed: what runs is the file's code, stock or patched.
"""

import ast
import json
import sys

import torch
import triton
import triton.language as tl

WANTED = ("_expand_pools_and_append_tail_kernel", "expand_pools_and_append_tail")


def load(path: str) -> dict:
    tree = ast.parse(open(path, encoding="utf-8").read(), filename=path)
    functions = [
        node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in WANTED
    ]
    assert sorted(f.name for f in functions) == sorted(WANTED), f"{path}: {WANTED} not both found"
    namespace = {"torch": torch, "triton": triton, "tl": tl}
    code = compile(ast.Module(body=functions, type_ignores=[]), path, "exec")
    exec(code, namespace)
    return namespace


def main() -> None:
    namespace = load(sys.argv[1])
    pool_size = 4
    # Row 0: seq_len 17 -> pool_len 4 (pools 0..3 valid, tail token 16). Its top-k ids hold
    # valid pools 0 and 3, id 6 (past pool_len, what an uninitialised slot can hold) and -1.
    # Row 1: seq_len 8 -> pool_len 2; id 2 is exactly pool_len.
    pool_ids = torch.tensor([[0, 3, 6, -1], [1, 2, -1, -1]], dtype=torch.int32)
    seq_lens = torch.tensor([17, 8], dtype=torch.int32)
    out = namespace["expand_pools_and_append_tail"](pool_ids, seq_lens, pool_size)
    print(json.dumps({"file": sys.argv[1], "pool_size": pool_size, "rows": out.tolist()}))


if __name__ == "__main__":
    main()
