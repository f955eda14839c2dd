"""v8's FlashInfer changes: F1 in a CUDA header (exact context), F2 and F3 in Python (LibCST).

F1 and F2's targets are in ``flashinfer-python==0.6.18`` (the fork set's pin, patches/v8/packages.txt);
in 0.6.17 F1's code does not exist and FP8 MLA is FA3-only, so both refuse there and say
to install the pinned version first. FlashInfer 0.7.x (what vLLM 0.33.0 and 0.34.0 require)
keeps F1's line, moves F2's check to the FA backends' shared planner
(``mla/_batch_mla/_backends/_fa_common.py``) and adds two Python mirrors of the kernel's fp8
tile there (its shared-memory size and its causal tile bound): F3 makes them follow F1.
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
    top_function,
)
from recipekit.tree import TreeView

MLA_HEADER = "flashinfer/data/include/flashinfer/attention/mla.cuh"
MLA_CORE = "flashinfer/mla/_core.py"
FA_COMMON = "flashinfer/mla/_batch_mla/_backends/_fa_common.py"  # FlashInfer 0.7.x
PACKAGE = "flashinfer/__init__.py"
INSTALL_FIRST = ("install the FlashInfer of v8's package set for this base first "
                 "(patches/v8/packages*.txt; scripts/build.sh does)")

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


def _fp8_plan_on_12_in_fa_planner(module: cst.Module):
    """F2 on FlashInfer 0.7.x: the FA backends' plan check admits major 12 for FP8 KV."""
    plan = top_function(module, "_validate_generated_fa_plan")
    fp8 = compare(m.Name("kv_data_type"), m.Equal(), dotted("torch", "float8_e4m3fn"))
    branch = only(
        m.findall(plan, m.If(test=fp8)),
        "`if kv_data_type == torch.float8_e4m3fn:` in _validate_generated_fa_plan",
    )
    stock = compare(m.Name("major"), m.NotEqual(), m.Integer("9"))
    patched = compare(m.Name("major"), m.NotIn(), int_tuple(9, 12))
    check = only(
        m.findall(branch.body, m.If(test=stock | patched)),
        "`if major != 9:` in _validate_generated_fa_plan's FP8 branch",
    )
    if m.matches(check.test, patched):
        return module, True, "the FA planner's FP8 check already accepts majors 9 and 12"
    new_check = check.with_changes(test=cst.parse_expression("major not in (9, 12)"))
    return (
        edited(module, [plan], check, new_check),
        False,
        "_validate_generated_fa_plan: FP8 KV raises unless `major not in (9, 12)`",
    )


_TILE = m.Name("tile_kv")
_CAPPED = m.Call(func=m.Name("min"), args=[m.Arg(value=_TILE), m.Arg(value=m.Integer("32"))])


def _assigns(target: m.BaseMatcherNode, value: m.BaseMatcherNode) -> m.SimpleStatementLine:
    return m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=target)], value=value)])


def _shared_bytes_tile(module: cst.Module):
    """``if fp8_kv: tile_kv = 32`` -> ``tile_kv = min(tile_kv, 32)`` (F1's tile, in bytes)."""
    sizer = top_function(module, "_generated_fa_shared_bytes")
    branch = only(
        m.findall(sizer, m.If(test=m.Name("fp8_kv"), body=m.IndentedBlock(
            body=[_assigns(_TILE, m.Integer("32") | _CAPPED)]))),
        "`if fp8_kv: tile_kv = 32` in _generated_fa_shared_bytes",
    )
    line = branch.body.body[0]
    if m.matches(line, _assigns(_TILE, _CAPPED)):
        return module, True
    return edited(module, [sizer], line, cst.parse_statement("tile_kv = min(tile_kv, 32)")), False


def _causal_bound_tile(module: cst.Module):
    """The causal tile bound's fp8 tile: the dispatched tile capped at 32, not 32."""
    bound = top_function(module, "_validate_fa_causal_tile_bound")
    fa3 = compare(m.Name("backend"), m.Equal(), m.SimpleString('"fa3"'))
    choice = only(m.findall(bound, m.If(test=fa3)), '`if backend == "fa3":` in _validate_fa_causal_tile_bound')
    fp8 = m.If(test=compare(m.Name("kv_data_type"), m.Equal(), dotted("torch", "float8_e4m3fn")),
               body=m.IndentedBlock(body=[_assigns(_TILE, m.Integer("32"))]), orelse=m.Else())
    capped = m.If(test=compare(m.Name("kv_data_type"), m.Equal(), dotted("torch", "float8_e4m3fn")),
                  body=m.IndentedBlock(body=[_assigns(_TILE, _CAPPED)]))
    if m.matches(choice.orelse, fp8):
        dispatched = choice.orelse.orelse.body.body
        new_else = cst.Else(body=cst.IndentedBlock(body=[
            *dispatched,
            cst.parse_statement(
                "if kv_data_type == torch.float8_e4m3fn:\n"
                "    # glm53 v8: the kernel's fp8 tile is min(dispatched, 32) since F1\n"
                "    tile_kv = min(tile_kv, 32)\n"
            ),
        ]))
        return edited(module, [bound], choice, choice.with_changes(orelse=new_else)), False
    if m.matches(choice.orelse, m.Else()) and any(
        m.matches(line, capped) for line in choice.orelse.body.body
    ):
        return module, True
    raise Drift(
        "_validate_fa_causal_tile_bound does not choose the fp8 tile as `elif kv_data_type == "
        "torch.float8_e4m3fn: tile_kv = 32` before the shared-memory tiers; this is not "
        "FlashInfer 0.7.x as v8 knows it"
    )


def _planner_tile_follows_f1(module: cst.Module):
    """F3: both Python mirrors of the fp8 tile follow F1's min(CTA_TILE_KV, 32)."""
    module, sized = _shared_bytes_tile(module)
    module, bounded = _causal_bound_tile(module)
    if sized and bounded:
        return module, True, "the planner's fp8 tile already follows min(dispatched tile, 32)"
    return module, False, (
        "_generated_fa_shared_bytes and _validate_fa_causal_tile_bound: fp8 tile_kv = "
        "min(dispatched tile, 32), as F1 makes the kernel's"
    )


def _plan_check_file(view: TreeView) -> list[str]:
    """F2's target: the FA planner on FlashInfer 0.7.x, the MLA wrapper's module before it."""
    return [FA_COMMON] if view.exists(FA_COMMON) else [path for path in (MLA_CORE,) if view.exists(path)]


def _without_fa_planner(skip):
    def check(view: TreeView) -> str | None:
        if reason := skip(view):
            return reason
        if not view.exists(FA_COMMON):
            return ("this FlashInfer (before 0.7) has no Python mirror of the kernel's fp8 tile; "
                    "F1 alone sets it")
        return None

    return check


def _plan_on_12(module: cst.Module):
    """F2 by the module's shape: FlashInfer 0.6.x's wrapper or 0.7.x's FA planner."""
    if any(m.matches(n, m.FunctionDef(name=m.Name("_validate_generated_fa_plan"))) for n in module.body):
        return _fp8_plan_on_12_in_fa_planner(module)
    return _fp8_plan_on_12(module)


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
        Change("F2", (MLA_CORE, FA_COMMON), "FP8 MLA plans on sm_12x too", _plan_on_12, skip,
               locate=_plan_check_file),
        Change("F3", (FA_COMMON,), "the planner's fp8 tile follows F1", _planner_tile_follows_f1,
               _without_fa_planner(skip)),
    )
