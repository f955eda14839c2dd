"""v8's FlashInfer changes: F1 in a CUDA header (exact context), F2 in Python (LibCST).

Both targets are in ``flashinfer-python==0.6.18`` (the pin in patches/v8/packages.txt); in
0.6.17 F1's code does not exist and FP8 MLA is FA3-only, so both refuse there and say
to install the pinned version first.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from recipekit import exact_patch
from recipekit.exact_patch import PatchRefused
from recipekit.layers.sm121_edits import (
    Change,
    Drift,
    code,
    compare,
    dotted,
    edited,
    int_tuple,
    method,
    only,
)
from recipekit.tree import TreeView

MLA_HEADER = "flashinfer/data/include/flashinfer/attention/mla.cuh"
MLA_CORE = "flashinfer/mla/_core.py"
PACKAGE = "flashinfer/__init__.py"
PINNED = "flashinfer-python==0.6.18"
INSTALL_FIRST = (
    f"install the pinned {PINNED} first (patches/v8/packages.txt; scripts/build.sh does)"
)

# F1: inside BatchMLAPagedAttention's DISPATCH_SMEM_CONFIG, the fp8 KV tile is capped at the
# dispatched CTA_TILE_KV instead of forced to 32 (32 assumes Hopper's 228 KB of shared memory).
_FP8_TILE_DIFF = """\
--- a/{path}
+++ b/{path}
@@ -1264,4 +1264,5 @@
   DISPATCH_SMEM_CONFIG(smem_limit_per_sm, NUM_STAGES, CTA_TILE_KV, QK_SHARD, {{
     constexpr uint32_t EFF_NUM_STAGES = NUM_STAGES;
-    constexpr uint32_t EFF_CTA_TILE_KV = std::is_same_v<DTypeKV, __nv_fp8_e4m3> ? 32 : CTA_TILE_KV;
+    // glm53 v8: sm_12x dispatches CTA_TILE_KV 16 (99 KB of shared memory); never force fp8 to 32.
+    constexpr uint32_t EFF_CTA_TILE_KV = std::is_same_v<DTypeKV, __nv_fp8_e4m3> ? (CTA_TILE_KV < 32 ? CTA_TILE_KV : 32) : CTA_TILE_KV;
     constexpr bool EFF_QK_SHARD = std::is_same_v<DTypeKV, __nv_fp8_e4m3> ? false : QK_SHARD;
"""


def _no_flashinfer(required: bool):
    def check(view: TreeView) -> str | None:
        if view.exists(PACKAGE):
            return None
        if required:
            raise Drift(f"no flashinfer/ package beside vllm/ in {view.root}; {INSTALL_FIRST}")
        return f"no flashinfer/ package beside vllm/ in {view.root} (pass a root holding both to patch it)"

    return check


def _fp8_tile_capped(text: str):
    try:
        present, new_text = exact_patch.plan_text(
            MLA_HEADER, text, _FP8_TILE_DIFF.format(path=MLA_HEADER)
        )
    except PatchRefused:
        raise Drift(
            "BatchMLAPagedAttention's DISPATCH_SMEM_CONFIG has no fp8 `EFF_CTA_TILE_KV = ... ? 32 : "
            f"CTA_TILE_KV` line at exactly one place; this is not the pinned FlashInfer: {INSTALL_FIRST}"
        ) from None
    if present:
        return text, True, "the fp8 EFF_CTA_TILE_KV is already min(CTA_TILE_KV, 32)"
    return new_text, False, "BatchMLAPagedAttention: fp8 EFF_CTA_TILE_KV = min(CTA_TILE_KV, 32)"


# F2: FP8 MLA plans on sm_12x too, not only on an SM90 device.
def _fp8_plan_on_12(module: cst.Module):
    cls = only(
        [
            n
            for n in module.body
            if m.matches(n, m.ClassDef(name=m.Name("BatchMLAPagedAttentionWrapper")))
        ],
        "class BatchMLAPagedAttentionWrapper",
    )
    plan = method(cls, "plan")
    fp8 = compare(m.Name("kv_data_type"), m.Equal(), dotted("torch", "float8_e4m3fn"))
    branch = only(
        m.findall(plan, m.If(test=fp8)), "`if kv_data_type == torch.float8_e4m3fn:` in plan"
    )
    fa2_allowed = compare(dotted("self", "_backend"), m.NotIn(), m.Tuple())
    backend_checks = m.findall(
        branch.body, m.If(test=compare(dotted("self", "_backend"), m.DoNotCare(), m.DoNotCare()))
    )
    if not any(
        m.matches(check.test, fa2_allowed) and '"fa2"' in code(check.test)
        for check in backend_checks
    ):
        shown = code(backend_checks[0].test) if backend_checks else "no backend check"
        raise Drift(
            f"plan's FP8 branch still allows the fa3 backend only (`{shown}`); this is not the "
            f"pinned FlashInfer: {INSTALL_FIRST}"
        )
    stock = compare(m.Name("major"), m.NotEqual(), m.Integer("9"))
    patched = compare(m.Name("major"), m.NotIn(), int_tuple(9, 12))
    check = only(
        m.findall(branch.body, m.If(test=stock | patched)), "`if major != 9:` in plan's FP8 branch"
    )
    if m.matches(check.test, patched):
        return module, True, "plan's FP8 branch already accepts majors 9 and 12"
    new_check = check.with_changes(test=cst.parse_expression("major not in (9, 12)"))
    return (
        edited(module, [cls, plan], check, new_check),
        False,
        ("BatchMLAPagedAttentionWrapper.plan: FP8 KV raises unless `major not in (9, 12)`"),
    )


def changes(require_flashinfer: bool) -> tuple[Change, ...]:
    skip = _no_flashinfer(require_flashinfer)
    return (
        Change(
            "F1",
            (MLA_HEADER,),
            "fp8 MLA tile capped at the dispatched CTA_TILE_KV",
            _fp8_tile_capped,
            skip,
        ),
        Change("F2", (MLA_CORE,), "FP8 MLA plans on sm_12x too", _fp8_plan_on_12, skip),
    )
