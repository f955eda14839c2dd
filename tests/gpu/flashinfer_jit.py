"""Part fi of the GPU tier (run on the GPU machine, parts a and fi installed): FlashInfer, the
version vLLM 0.30.0 pins (tests/gpu/requirements-fi.txt), JIT-compiles here with the machine's
nvcc the one module vLLM's FLASHINFER_MLA_SPARSE_SM90 backend builds for part d's servers
(BatchMLAPagedAttentionWrapper: fa3, bf16 queries, FP8 E4M3 KV, head_dim_ckv 512, head_dim_kpe
0, int32 indices), into the JIT cache those servers share (tests/gpu/glm5next_engine.py), so
no server compiles it. Then it runs that module once as vLLM's sparse decode calls it (page
size 1, each row's top-k slots as its page list, per-tensor KV scale) and compares with float64
computed from the FP8 codes; a planted KV scale 5% off must fail the same comparison.

    python3 tests/gpu/flashinfer_jit.py PAYLOAD_DIR OUT.json
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

HEADS, CKV = 16, 512  # the tiny Glm5Next's MLA heads (tp 1) and GLM-5.3-Flash's latent width
ROWS, WIDTH, PAGES = 6, 2048, 8192  # decode rows, the indexer's top-k, KV slots
TOLERANCE = 0.01  # relative error of an output row: bf16 P and output against float64
PLANT = 1.05  # the KV scale the planted reference uses


def jit_env(payload: Path) -> dict[str, str]:
    """FlashInfer's workspace and arch list exactly as part d's servers get them."""
    from tests.gpu import engine as tier
    from tests.gpu import glm5next_engine as part_d

    launcher = json.loads((payload / part_d.LAUNCHER).read_text())
    base = launcher["env"]["FLASHINFER_WORKSPACE_BASE"]
    return {"FLASHINFER_WORKSPACE_BASE": str(payload / part_d.JIT_DIR / base.lstrip("/")),
            "FLASHINFER_CUDA_ARCH_LIST": tier.ENV_OVERRIDES["FLASHINFER_CUDA_ARCH_LIST"][0]}


def decode_case(torch, generator):
    lengths = [1, 7, 64, 300, 1500, WIDTH]
    q = (torch.randn(ROWS, HEADS, CKV, generator=generator) * 0.5).to(torch.bfloat16)
    ckv = (torch.randn(PAGES, 1, CKV, generator=generator) * 3).to(torch.float8_e4m3fn)
    indices = torch.zeros(ROWS, WIDTH, dtype=torch.int32)
    for row, length in enumerate(lengths):
        indices[row, :length] = torch.randperm(PAGES, generator=generator)[:length].int()
    return q, ckv, indices, torch.tensor(lengths, dtype=torch.int32)


def reference(torch, q, ckv, indices, lengths, scale: float, sm_scale: float):
    out = torch.empty(q.shape, dtype=torch.float64)
    values = ckv.double().squeeze(1) * scale
    for row, length in enumerate(lengths.tolist()):
        keys = values[indices[row, :length].long()]
        weights = torch.softmax(q[row].double() @ keys.T * sm_scale, -1)
        out[row] = weights @ keys
    return out


def run(doc: dict, payload: Path) -> None:
    os.environ.update(jit_env(payload))
    import torch

    import flashinfer
    from flashinfer.jit import gen_batch_mla_module
    from vllm.utils.flashinfer import has_flashinfer, has_flashinfer_sm90_nope_mla

    from tests.gpu.payload import flashinfer_pin

    doc.update({"flashinfer": flashinfer.__version__, "pinned": flashinfer_pin(),
                "file": flashinfer.__file__, "env": jit_env(payload),
                "device": torch.cuda.get_device_name(0)})
    if flashinfer.__version__ != doc["pinned"]:
        raise RuntimeError(f"FlashInfer {flashinfer.__version__} here, {doc['pinned']} pinned")
    doc["vllm_sees"] = {"has_flashinfer": has_flashinfer(),
                        "has_flashinfer_sm90_nope_mla": has_flashinfer_sm90_nope_mla()}
    started = time.monotonic()
    spec = gen_batch_mla_module("fa3", torch.bfloat16, torch.float8_e4m3fn, torch.bfloat16,
                                torch.int32, CKV, 0, False)
    spec.build_and_load()
    doc["jit"] = {"module": spec.name, "seconds": round(time.monotonic() - started, 1)}
    generator = torch.Generator().manual_seed(47)
    q, ckv, indices, lengths = decode_case(torch, generator)
    scale, sm_scale = 0.75, CKV ** -0.5
    device = torch.device("cuda")
    wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(
        torch.empty(128 << 20, dtype=torch.uint8, device=device), backend="fa3")
    wrapper.plan(torch.arange(ROWS + 1, dtype=torch.int32), torch.arange(ROWS + 1,
                 dtype=torch.int32) * WIDTH, indices.flatten().to(device), lengths, HEADS, CKV,
                 0, 1, False, sm_scale, q_data_type=torch.bfloat16,
                 kv_data_type=torch.float8_e4m3fn)
    empty = torch.empty(PAGES, 1, 0, dtype=torch.float8_e4m3fn, device=device)
    out = wrapper.run(q.to(device), torch.empty(ROWS, HEADS, 0, dtype=torch.bfloat16,
                                                device=device),
                      ckv.to(device), empty, ckv_scale=scale, kpe_scale=1.0)
    got = out.double().cpu()

    def error(truth):
        return ((got - truth).flatten(1).norm(dim=-1) / truth.flatten(1).norm(dim=-1)).max().item()

    honest = error(reference(torch, q, ckv, indices, lengths, scale, sm_scale))
    planted = error(reference(torch, q, ckv, indices, lengths, scale * PLANT, sm_scale))
    doc["check"] = {"rows": lengths.tolist(), "worst_relative_error": honest,
                    "tolerance": TOLERANCE, "planted_kv_scale": PLANT,
                    "planted_error": planted}
    doc["passed"] = all(doc["vllm_sees"].values()) and honest <= TOLERANCE < planted


def main(payload: str, out: str) -> int:
    doc: dict = {"passed": False}
    try:
        run(doc, Path(payload))
    except BaseException as error:
        doc["error"] = "".join(traceback.format_exception(error))[-4000:]
        doc["passed"] = False
    finally:
        Path(out).write_text(json.dumps(doc, indent=1))
    print(f"gpu fi: {'passed' if doc['passed'] else 'FAILED'}; {out}", file=sys.stderr)
    return 0 if doc["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
