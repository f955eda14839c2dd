"""A fork-shaped stand-in vLLM tree: a RECONSTRUCTION of the vendor fork image's vllm/.

The image users patch (``vllm/vllm-openai:glm53-flash-arm64-cu130``, vLLM
``0.1.dev20051+g487ecf187``) is upstream main of 2026-08-13 plus about 142 fork
commits that add Glm5Next. Its code is not public and none of it is copied here.
This module rebuilds a tree of the same *shape* at test time from three pinned PyPI
releases (0.27.1, 0.28.0, 0.30.0; wheel sha256 in ``vllm_sources``) and code of our
own, so that every layer can be proven on a fourth base. It is a stand-in, not the
fork: where the record says nothing, the 0.27.1 file is kept.

Facts it encodes (the vendor fork 0.1.dev20051+g487ecf187, as the seed's patches and PR record it):

1. ``model_executor/layers/logits_processor.py``, ``model_executor/models/qwen3_dflash.py``
   and ``v1/worker/gpu/spec_decode/__init__.py`` are 0.27.1's, byte for byte (every
   file not named below is 0.27.1's too).
2. ``v1/worker/gpu/sample/gumbel.py`` is 0.28.0's minus DFlash2's own change: it has
   upstream's pre-temperature logits cache (``logits_cache*``, the store before the
   temperature) and no ``gumbel_noised_argmax``.
3. ``v1/worker/gpu/spec_decode/speculator.py`` is 0.27.1's plus that cache: the cached
   draft logits are zeros of ``model_config.head_dtype`` and ``gumbel_sample`` is
   called with ``logits_cache=``; it has no ``draft_logits_spec`` hook.
4. Glm5Next's model package (``vllm/models/glm5next/``) is 0.30.0's, and so are the
   modules it imports that 0.27.1 lacks or that lack a name it imports (the fork
   commits add KDA kernels, the kpool indexer, mHC ...); ``model.py``'s
   ``Glm5NextForConditionalGeneration`` does not derive from ``MixtureOfExperts``.
5. ``model_executor/models/registry.py`` maps the two Glm5Next architectures (its
   DFlash lines keep 0.27.1's content, shifted).
6. ``v1/kv_cache_interface.py`` keeps 0.27.1's ``KVCacheTensor(size, shared_by,
   offset=0, block_stride=0)``; ``MLAAttentionSpec`` gains ``tokens_per_state`` and a
   ``KpoolTailSpec`` is added (our own code in that API).
7. ``v1/core/kv_cache_utils.py`` is 0.27.1's planner with a Glm5Next planner of our own
   in the fork's shape (``forkshape_planner.py.txt``): the same function names,
   signatures and 8-tuple as 0.30.0, the statement shapes the seed's patches anchor on,
   and tensors in the 0.27.1 form.
8. The fork carries the SM90 sparse-MLA (NoPE) attention backend, as the seed's v8
   shows: its exact-text edits D1 and D2a-c had to match once on the fork image. So
   ``v1/attention/backends/mla/flashinfer_mla_sparse_sm90.py`` is 0.30.0's (with the
   modules it imports that 0.27.1 cannot serve), ``AttentionBackendEnum`` gains
   0.30.0's ``FLASHINFER_MLA_SPARSE_SM90`` member after ``FLASHINFER_MLA_SPARSE_SM120``,
   and ``utils/flashinfer.py`` gains 0.30.0's ``has_flashinfer_sm90_nope_mla``. The
   priority list in ``platforms/cuda.py`` stays 0.27.1's (D1's target, verbatim there).

9. The fork's kpool indexer files are the fork-era text that the seed's v13 patches:
   ``models/glm5next/nvidia/ops/kpool_compress.py`` (``blk = t // KPOOL``, the packed
   seed address), ``models/glm5next/nvidia/attention.py`` (``Glm5NextTailCache``) and
   ``v1/attention/backends/mla/indexer.py`` (``compute_kpool_tail_slot_mapping``, the
   kpool tail metadata builder, ``return max_model_len * 40``) are 0.30.0's, whose text
   carries every anchor v13 names; the indexer backend is taken whole (not left to the
   import closure), since v13 edits it.

Not encoded: ``config/vllm.py``'s +52-line shift (kept as 0.27.1's), and Glm5Next's
kernels at run time (its package is proven by static checks, not imported here).
The tree is built once into the recipe cache, keyed by the hash of its inputs.
"""

from __future__ import annotations

import ast
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import libcst as cst

from recipekit.tree import TreeView
from recipekit.verify import ImportChecker, _resolve_relative

NAME = "fork"
BASE_RELEASE = "0.27.1"
CACHE_RELEASE = "0.28.0"
GLM5NEXT_RELEASE = "0.30.0"
PLANNER_SOURCE = Path(__file__).with_name("forkshape_planner.py.txt")

GUMBEL = "vllm/v1/worker/gpu/sample/gumbel.py"
SPECULATOR = "vllm/v1/worker/gpu/spec_decode/speculator.py"
REGISTRY = "vllm/model_executor/models/registry.py"
KV_INTERFACE = "vllm/v1/kv_cache_interface.py"
KV_UTILS = "vllm/v1/core/kv_cache_utils.py"
KV_LAYOUT = "vllm/v1/kv_cache_layout.py"
SM90_BACKEND = "vllm/v1/attention/backends/mla/flashinfer_mla_sparse_sm90.py"
KPOOL_TAIL_BACKEND = "vllm/v1/attention/backends/mla/indexer.py"
ATTENTION_REGISTRY = "vllm/v1/attention/backends/registry.py"
FLASHINFER_UTILS = "vllm/utils/flashinfer.py"
GLM5NEXT = "vllm/models/glm5next"
GLM5NEXT_MODEL = f"{GLM5NEXT}/nvidia/model.py"
# Reconstructed here, never overlaid from 0.30.0 by the import closure.
_OWN_SHAPE = {KV_INTERFACE, KV_UTILS, GUMBEL, SPECULATOR, REGISTRY, ATTENTION_REGISTRY,
              FLASHINFER_UTILS}


class ForkShapeError(RuntimeError):
    """A pinned release no longer looks the way this reconstruction expects."""


def _replace_once(text: str, old: str, new: str, where: str) -> str:
    count = text.count(old)
    if count != 1:
        raise ForkShapeError(f"{where}: expected {old.splitlines()[0]!r} once, found it {count} times")
    return text.replace(old, new)


def _between(text: str, start: str, end: str, where: str) -> str:
    """The slice of ``text`` from ``start`` up to and including ``end`` (each once)."""
    for anchor in (start, end):
        if text.count(anchor) != 1:
            raise ForkShapeError(f"{where}: expected {anchor.splitlines()[0]!r} once")
    first = text.index(start)
    last = text.index(end, first) + len(end)
    return text[first:last]


def logits_cache_gumbel(old: str, new: str) -> str:
    """0.28.0's gumbel.py with DFlash2's ``gumbel_noised_argmax`` taken back out.

    ``gumbel_block_argmax`` keeps the cache PR's store of the pre-temperature logits
    and gets back, after it, 0.27.1's inline temperature, Gumbel noise and argmax.
    """
    where = f"{GUMBEL} (fork shape)"
    helper = _between(new, "@triton.jit\ndef gumbel_noised_argmax(", "    return tl.max(logits, axis=0, return_indices=True)\n\n\n", where)
    text = new.replace(helper, "")
    call = _between(
        text,
        "    seed = tl.load(seeds_ptr + req_state_idx, mask=is_valid_req, other=0)\n"
        "    pos = tl.load(pos_ptr + token_idx)\n    return gumbel_noised_argmax(\n",
        "        APPLY_TEMPERATURE=APPLY_TEMPERATURE,\n    )\n",
        where,
    )
    temperature = _between(old, "    if temp != 0.0 and APPLY_TEMPERATURE:\n", "        logits = logits / temp\n", where)
    noise = _between(old, "    # fp32 is the default reduction dtype", "    value, idx = tl.max(logits, axis=0, return_indices=True)\n    return value, idx\n", where)
    text = text.replace(call, temperature + "\n" + noise)
    if "gumbel_noised_argmax" in text:
        raise ForkShapeError(f"{where}: gumbel_noised_argmax is still referenced")
    ast.parse(text)
    return text


def logits_cache_speculator(old: str) -> str:
    """0.27.1's speculator.py with the pre-temperature logits cache (no DFlash2 hook)."""
    where = f"{SPECULATOR} (fork shape)"
    allocation = _between(
        old, "            self.draft_logits = torch.zeros(\n", "                dtype=torch.float32,\n", where
    )
    text = old.replace(
        allocation,
        "            # Pre-temperature logits, cached from the previous decode step.\n"
        + allocation.replace("dtype=torch.float32,", "dtype=vllm_config.model_config.head_dtype,"),
    )
    text = _replace_once(text, "output_processed_logits=draft_logits,", "logits_cache=draft_logits,", where)
    text = _replace_once(text, "output_processed_logits_col=draft_step,", "logits_cache_col=draft_step,", where)
    ast.parse(text)
    return text


def _read(root: Path, relative: str) -> str:
    try:
        return (Path(root) / relative).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ForkShapeError(f"{root} has no {relative}") from None


def logits_cache_files(old_root: Path, new_root: Path) -> dict[str, str]:
    """The two files that carry the pre-temperature logits cache on the fork shape."""
    read = _read
    return {
        GUMBEL: logits_cache_gumbel(read(old_root, GUMBEL), read(new_root, GUMBEL)),
        SPECULATOR: logits_cache_speculator(read(old_root, SPECULATOR)),
    }


def _module_of(relative: str) -> tuple[str, bool]:
    is_package = relative.endswith("__init__.py")
    dotted = relative[:-3].replace("/", ".")
    return (dotted[: -len(".__init__")] if is_package else dotted), is_package


def overlay_with_import_closure(base: Path, source: Path) -> dict[str, str]:
    """Glm5Next's package, the SM90 sparse-MLA and the kpool indexer backends from
    ``source``, plus the modules they need that ``base`` cannot serve.

    A module is taken from ``source`` when an overlaid file imports it and ``base``
    lacks it or lacks one of the imported names; repeated until nothing changes.
    """
    source_view = TreeView(source)
    overlay = {
        str(p.relative_to(source)): p.read_text(encoding="utf-8")
        for p in sorted((source / GLM5NEXT).rglob("*.py"))
    }
    for relative in (KV_LAYOUT, SM90_BACKEND, KPOOL_TAIL_BACKEND):
        overlay[relative] = (source / relative).read_text(encoding="utf-8")
    while True:
        view = TreeView(base, {k: v.encode() for k, v in overlay.items()})
        checker = ImportChecker(view)
        added = False
        for relative, text in list(overlay.items()):
            module, is_package = _module_of(relative)
            for node in ast.walk(ast.parse(text)):
                if not isinstance(node, ast.ImportFrom):
                    continue
                target = _resolve_relative(module, is_package, "." * node.level + (node.module or ""))
                if not target.startswith("vllm."):
                    continue
                names = [a.name for a in node.names if a.name != "*"]
                if view.module_file(target) and all(checker.defines(target, n) for n in names):
                    continue
                wanted = source_view.module_file(target)
                if wanted is None or wanted in overlay or wanted in _OWN_SHAPE:
                    continue
                overlay[wanted] = (source / wanted).read_text(encoding="utf-8")
                added = True
        if not added:
            return overlay


def without_moe_base(model_source: str) -> str:
    """``Glm5NextForConditionalGeneration`` without its ``MixtureOfExperts`` base."""
    module = cst.parse_module(model_source)
    found = []

    class DropBase(cst.CSTTransformer):
        def leave_ClassDef(self, original, updated):
            if updated.name.value != "Glm5NextForConditionalGeneration":
                return updated
            bases = [b for b in updated.bases if not _is_name(b.value, "MixtureOfExperts")]
            found.append(len(updated.bases) - len(bases))
            if bases:
                bases[-1] = bases[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            return updated.with_changes(bases=bases)

    new = module.visit(DropBase())
    if found != [1]:
        raise ForkShapeError(f"{GLM5NEXT_MODEL}: Glm5NextForConditionalGeneration with a MixtureOfExperts base not found")
    return new.code


def _is_name(node: cst.CSTNode, name: str) -> bool:
    return isinstance(node, cst.Name) and node.value == name


def registry_with_glm5next(base_text: str, source_text: str) -> str:
    """0.27.1's registry plus 0.30.0's two Glm5Next architecture entries, each after its neighbour."""
    where = f"{REGISTRY} (fork shape)"
    text = base_text
    for neighbour, start, end in (
        ('    "GlmMoeDsaForCausalLM":', '    "Glm5NextForCausalLM":', '"Glm5NextForCausalLM"),\n'),
        (
            '    "GlmOcrForConditionalGeneration":',
            '    "Glm5NextForConditionalGeneration": (\n',
            '        "Glm5NextForConditionalGeneration",\n    ),\n',
        ),
    ):
        entry = _between(source_text, start, end, where)
        if text.count(neighbour) != 1:
            raise ForkShapeError(f"{where}: {neighbour.strip()} not found once in the base registry")
        line_end = text.index("\n", text.index(neighbour)) + 1
        text = text[:line_end] + entry + text[line_end:]
    return text


def attention_registry_with_sm90(base_text: str, source_text: str) -> str:
    """0.27.1's ``AttentionBackendEnum`` plus 0.30.0's ``FLASHINFER_MLA_SPARSE_SM90`` member."""
    where = f"{ATTENTION_REGISTRY} (fork shape)"
    member = _between(source_text, "    FLASHINFER_MLA_SPARSE_SM90 = (\n", '"FlashInferMLASparseSM90Backend"\n    )\n', where)
    neighbour = _between(base_text, "    FLASHINFER_MLA_SPARSE_SM120 = (\n", '"FlashInferMLASparseSM120Backend"\n    )\n', where)
    return _replace_once(base_text, neighbour, neighbour + member, where)


def flashinfer_utils_with_sm90_probe(base_text: str, source_text: str) -> str:
    """0.27.1's ``vllm.utils.flashinfer`` plus 0.30.0's ``has_flashinfer_sm90_nope_mla``."""
    where = f"{FLASHINFER_UTILS} (fork shape)"
    start, end = _function_span(source_text, "has_flashinfer_sm90_nope_mla", where)
    probe = source_text[start:end]
    _, after = _function_span(base_text, "has_flashinfer_moe", where)
    return base_text[:after] + "\n\n" + probe + base_text[after:]


def kv_interface_fork(text: str) -> str:
    """0.27.1's KV interface plus ``tokens_per_state`` on MLA specs and ``KpoolTailSpec``."""
    where = f"{KV_INTERFACE} (fork shape)"
    # The kpool indexer backend (taken from 0.30.0) imports KVCacheLayout from here.
    text = _replace_once(
        text,
        "from vllm.utils.torch_utils import get_dtype_size, nvfp4_kv_cache_full_dim\n",
        "from vllm.utils.torch_utils import get_dtype_size, nvfp4_kv_cache_full_dim\nfrom vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: F401\n",
        where,
    )
    text = _replace_once(
        text,
        "\n@dataclass\nclass KVCacheTensor:",
        "\n" + (PLANNER_SOURCE.with_name("forkshape_kpool.py.txt")).read_text() + "\n@dataclass\nclass KVCacheTensor:",
        where,
    )
    text = _replace_once(
        text,
        "    non_causal_multi_token_decode: bool = False\n",
        "    non_causal_multi_token_decode: bool = False\n"
        "    # Glm5Next's DSA indexer keeps one state per tokens_per_state tokens.\n"
        "    tokens_per_state: int = 1\n",
        where,
    )
    start, end = _function_span(text, "MLAAttentionSpec", where, kind=ast.ClassDef)
    body = _replace_once(
        text[start:end],
        "        return self.block_size // self.compress_ratio\n",
        "        return self.block_size // self.compress_ratio // self.tokens_per_state\n",
        where,
    )
    return text[:start] + body + text[end:]


def _function_span(text: str, name: str, where: str, kind: type = ast.FunctionDef) -> tuple[int, int]:
    """Character span of the top-level definition ``name``, its decorators included."""
    nodes = [n for n in ast.parse(text).body if isinstance(n, kind) and n.name == name]
    if len(nodes) != 1:
        raise ForkShapeError(f"{where}: function {name} not found once")
    first_line = min([nodes[0].lineno] + [d.lineno for d in nodes[0].decorator_list])
    lines = text.splitlines(keepends=True)
    start = sum(len(line) for line in lines[: first_line - 1])
    end = sum(len(line) for line in lines[: nodes[0].end_lineno])
    return start, end


def _insert_in_function(text: str, name: str, anchor: str, block: str, where: str, before: bool = True) -> str:
    start, end = _function_span(text, name, where)
    body = text[start:end]
    if body.count(anchor) != 1:
        raise ForkShapeError(f"{where}: {name}: anchor {anchor.splitlines()[0]!r} not found once")
    body = body.replace(anchor, block + anchor if before else anchor + block)
    return text[:start] + body + text[end:]


_CONFIG_BRANCH = """\
    if (glm5_layout := _glm5_next_tensor_layout(kv_cache_groups)) is not None:
        return _glm5_next_kv_cache_config(
            vllm_config, kv_cache_groups, available_memory, glm5_layout
        )

"""
_BYTES_BRANCH = """\
    if (glm5_layout := _glm5_next_tensor_layout(kv_cache_groups)) is not None:
        _, _, mla_names, idx_names, mla_page, idx_page, _, _ = glm5_layout
        return len(mla_names) * mla_page + len(idx_names) * idx_page
"""
_MEMORY_BRANCH = """\
    if (glm5_layout := _glm5_next_tensor_layout(kv_cache_groups)) is not None:
        attn_group, _, mla_names, idx_names, mla_page, idx_page, _, _ = glm5_layout
        attn_spec = cast(UniformTypeKVCacheSpecs, attn_group.kv_cache_spec)
        blocks_needed = attn_spec.max_memory_usage_pages(vllm_config)
        return blocks_needed * (len(mla_names) * mla_page + len(idx_names) * idx_page)

"""
_GROUPS_BRANCH = """\
    elif glm5_groups := _get_kv_cache_groups_glm5_next(vllm_config, kv_cache_spec):
        return glm5_groups
"""


def kv_utils_fork(text: str) -> str:
    """0.27.1's planner with our fork-shaped Glm5Next planner wired where 0.30.0 wires its own."""
    where = f"{KV_UTILS} (fork shape)"
    text = _replace_once(text, "    KVCacheTensor,\n    MambaSpec,\n", "    KVCacheTensor,\n    KpoolTailSpec,\n    MambaSpec,\n", where)
    start, _ = _function_span(text, "get_kv_cache_config_from_groups", where)
    text = text[:start] + PLANNER_SOURCE.read_text(encoding="utf-8") + "\n\n" + text[start:]
    text = _insert_in_function(
        text, "get_kv_cache_config_from_groups",
        "    # Determine how model runners should initialize the KV cache tensors.\n", _CONFIG_BRANCH, where,
    )
    text = _insert_in_function(
        text, "_pool_bytes_per_block",
        "    if len(kv_cache_groups) == 1 and isinstance(\n", _BYTES_BRANCH, where,
    )
    text = _insert_in_function(
        text, "_max_memory_usage_bytes_from_groups",
        "    if len(kv_cache_groups) == 1 and isinstance(\n", _MEMORY_BRANCH, where,
    )
    text = _insert_in_function(
        text, "get_kv_cache_groups",
        "        return _get_kv_cache_groups_uniform_type(uniform_spec)\n", _GROUPS_BRANCH, where, before=False,
    )
    ast.parse(text)
    return text


def inputs_key(wheel_hashes: dict[str, str]) -> str:
    """Hash of everything the tree is made from: this builder, our sources, the wheels."""
    digest = hashlib.sha256()
    for path in (Path(__file__), PLANNER_SOURCE, PLANNER_SOURCE.with_name("forkshape_kpool.py.txt")):
        digest.update(path.read_bytes())
    for release in (BASE_RELEASE, CACHE_RELEASE, GLM5NEXT_RELEASE):
        digest.update(f"{release} {wheel_hashes[release]}\n".encode())
    return digest.hexdigest()[:16]


def fork_files(base: Path, cache: Path, glm5next: Path) -> dict[str, str]:
    """Every file of the stand-in that differs from ``base`` (0.27.1), by relative path."""
    read = _read
    changed = overlay_with_import_closure(base, glm5next)
    changed[GLM5NEXT_MODEL] = without_moe_base(changed[GLM5NEXT_MODEL])
    changed.update(logits_cache_files(base, cache))
    changed[REGISTRY] = registry_with_glm5next(read(base, REGISTRY), read(glm5next, REGISTRY))
    changed[ATTENTION_REGISTRY] = attention_registry_with_sm90(
        read(base, ATTENTION_REGISTRY), read(glm5next, ATTENTION_REGISTRY))
    changed[FLASHINFER_UTILS] = flashinfer_utils_with_sm90_probe(
        read(base, FLASHINFER_UTILS), read(glm5next, FLASHINFER_UTILS))
    changed[KV_INTERFACE] = kv_interface_fork(read(base, KV_INTERFACE))
    changed[KV_UTILS] = kv_utils_fork(read(base, KV_UTILS))
    return changed


def build(dest: Path, base: Path, cache: Path, glm5next: Path, log=lambda message: None) -> int:
    """Write the stand-in into the new directory ``dest``; returns the number of files taken from 0.30.0 or rebuilt."""
    changed = fork_files(base, cache, glm5next)
    for path in sorted(base.rglob("*.py")):
        relative = path.relative_to(base)
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if str(relative) in changed:
            continue
        try:
            os.link(path, target)
        except OSError:
            shutil.copy2(path, target)
    for relative, text in changed.items():
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            target.unlink()
        target.write_text(text, encoding="utf-8")
    log(f"fork-shaped stand-in: {len(changed)} files reconstructed or taken from {GLM5NEXT_RELEASE} on top of {BASE_RELEASE}")
    return len(changed)


def staging_dir(parent: Path) -> Path:
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{NAME}-", dir=parent))
