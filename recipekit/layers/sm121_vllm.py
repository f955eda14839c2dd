"""v8's vLLM changes (D1, D2a-c, D4, V7a-c), each a LibCST edit found by name and shape.

Ids and reasons are the seed's (the seed's PR #1 deployment). Every edit knows
the stock shape it rewrites and the shape it leaves, so a second run finds the change
``present``; any other shape is drift, which refuses the layer.
"""

from __future__ import annotations

import functools

import libcst as cst
import libcst.matchers as m

from recipekit.layers.sm121_edits import (
    Change,
    Drift,
    class_has_member,
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

CUDA = "vllm/platforms/cuda.py"
REGISTRY = "vllm/v1/attention/backends/registry.py"
SM90_BACKEND = "vllm/v1/attention/backends/mla/flashinfer_mla_sparse_sm90.py"
# sparse_attn_indexer_kpool: 0.30.0 and the fork keep it under layers/, 0.33.0 moved it.
KPOOL_INDEXERS = (
    "vllm/model_executor/layers/sparse_attn_indexer_kpool.py",
    "vllm/models/glm5next/nvidia/sparse_indexer.py",
)
# The module vLLM imports each indexer through (the import check imports that one).
KPOOL_INDEXER_IMPORTERS = {
    KPOOL_INDEXERS[0]: "vllm.models.glm5next.nvidia.attention",
    KPOOL_INDEXERS[1]: "vllm.models.glm5next.sparse_indexer",
}
KPOOL_KERNELS = "vllm/models/glm5next/nvidia/ops/kpool_compress.py"
GLM5NEXT = "vllm/models/glm5next/__init__.py"

SM90 = "AttentionBackendEnum.FLASHINFER_MLA_SPARSE_SM90"
SM120 = "AttentionBackendEnum.FLASHINFER_MLA_SPARSE_SM120"
TRITON = "AttentionBackendEnum.TRITON_MLA"


@functools.lru_cache(maxsize=4)
def _has_sm90_member(registry_source: str) -> bool:
    module = cst.parse_module(registry_source)
    return class_has_member(module, "AttentionBackendEnum", "FLASHINFER_MLA_SPARSE_SM90")


def _no_sm90_backend(view: TreeView) -> str | None:
    source = view.read_text(REGISTRY)
    if source is not None and _has_sm90_member(source):
        return None
    return (
        "this base has no SM90 sparse MLA backend (AttentionBackendEnum in "
        f"{REGISTRY} has no FLASHINFER_MLA_SPARSE_SM90; vLLM 0.30.0 has it)"
    )


def _no_glm5next(view: TreeView) -> str | None:
    if view.exists(GLM5NEXT):
        return None
    return "this base has no Glm5Next (vllm/models/glm5next/ is absent), so no kpool sparse indexer"


def _class_defining(module: cst.Module, name: str) -> cst.ClassDef:
    owners = [
        node
        for node in module.body
        if isinstance(node, cst.ClassDef)
        and any(m.matches(item, m.FunctionDef(name=m.Name(name))) for item in node.body.body)
    ]
    return only(owners, f"class defining {name}")


def _param_names(func: cst.FunctionDef) -> list[str]:
    params = func.params
    return [p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)]


# D1: at capability 12, try the SM90 NoPE sparse backend before the SM120 one.
def _sm90_before_sm120(module: cst.Module):
    func = top_function(module, "_get_backend_priorities")
    mla = only(m.findall(func, m.If(test=m.Name("use_mla"))), "`if use_mla:` branch")
    major12 = compare(dotted("device_capability", "major"), m.Equal(), m.Integer("12"))
    branch = only(
        m.findall(mla.body, m.If(test=major12)), "`device_capability.major == 12` MLA branch"
    )
    ret = only(m.findall(branch.body, m.Return(value=m.List())), "`return [...]` in that branch")
    names = [code(element.value) for element in ret.value.elements]
    if SM90 in names and SM120 in names and names.index(SM90) < names.index(SM120):
        return module, True, f"the capability-12 MLA list already tries {SM90} before {SM120}"
    if names != [TRITON, SM120]:
        raise Drift(f"the capability-12 MLA list is [{', '.join(names)}], not [{TRITON}, {SM120}]")
    elements = list(ret.value.elements)
    added = cst.Element(value=cst.parse_expression(SM90), comma=elements[0].comma)
    new_list = ret.value.with_changes(elements=[elements[0], added, elements[1]])
    return (
        edited(module, [func], ret, ret.with_changes(value=new_list)),
        False,
        (f"_get_backend_priorities, capability 12: [{TRITON}, {SM90}, {SM120}]"),
    )


# D2a: the SM90 NoPE backend accepts compute capability 12.
def _sm90_backend_accepts_12(module: cst.Module):
    cls = _class_defining(module, "supports_compute_capability")
    func = method(cls, "supports_compute_capability")
    names = _param_names(func)
    if len(names) != 2:
        raise Drift(
            f"supports_compute_capability takes ({', '.join(names)}), not (cls, capability)"
        )
    major = dotted(names[1], "major")
    ret = only(m.findall(func, m.Return()), "return in supports_compute_capability")
    where = f"{cls.name.value}.supports_compute_capability"
    if m.matches(ret.value, compare(major, m.In(), int_tuple(9, 12))):
        return module, True, f"{where} already accepts majors 9 and 12"
    if not m.matches(ret.value, compare(major, m.Equal(), m.Integer("9"))):
        raise Drift(f"{where} returns `{code(ret.value)}`, not `{names[1]}.major == 9`")
    new = cst.parse_expression(f"{names[1]}.major in (9, 12)")
    return (
        edited(module, [cls, func], ret, ret.with_changes(value=new)),
        False,
        f"{where}: `{names[1]}.major in (9, 12)`",
    )


_WRAPPER = m.Call(
    func=m.Name("BatchMLAPagedAttentionWrapper")
    | m.Attribute(attr=m.Name("BatchMLAPagedAttentionWrapper"))
)
_FA3_ON_HOPPER = '"fa3" if torch.cuda.get_device_capability()[0] == 9 else "fa2"'


# D2b: FA3 only on Hopper (major 9); elsewhere the wrapper runs FA2.
def _fa2_off_hopper(module: cst.Module):
    imports_torch = m.SimpleStatementLine(
        body=[m.Import(names=[m.ImportAlias(name=m.Name("torch"))])]
    )
    if not any(m.matches(node, imports_torch) for node in module.body):
        raise Drift("the module does not `import torch` at top level")
    hits = [(top, call) for top in module.body for call in m.findall(top, _WRAPPER)]
    top, call = only(hits, "BatchMLAPagedAttentionWrapper(...) call")
    arg = only(
        [a for a in call.args if a.keyword and a.keyword.value == "backend"], "backend= argument"
    )
    if m.matches(arg.value, m.IfExp(body=m.SimpleString('"fa3"'), orelse=m.SimpleString('"fa2"'))):
        return module, True, "BatchMLAPagedAttentionWrapper already takes fa3 on Hopper only"
    if not m.matches(arg.value, m.SimpleString('"fa3"') | m.SimpleString("'fa3'")):
        raise Drift(
            f'BatchMLAPagedAttentionWrapper gets backend={code(arg.value)}, not backend="fa3"'
        )
    new_arg = arg.with_changes(value=cst.parse_expression(_FA3_ON_HOPPER))
    return (
        edited(module, [top], arg, new_arg),
        False,
        f"BatchMLAPagedAttentionWrapper(backend={_FA3_ON_HOPPER})",
    )


_NEEDS_FEATURE = m.UnaryOperation(
    operator=m.Not(), expression=m.Call(func=m.Name("has_flashinfer_sm90_nope_mla"))
)
_FP8_KV = m.Tuple(
    elements=[m.Element(m.SimpleString('"fp8"')), m.Element(m.SimpleString('"fp8_e4m3"'))]
)


# D2c: only fp8 KV needs FlashInfer's SM90 NoPE feature (FlashInfer >= 0.6.18).
def _feature_check_fp8_only(module: cst.Module):
    cls = _class_defining(module, "supports_combination")
    func = method(cls, "supports_combination")
    where = f"{cls.name.value}.supports_combination"
    if "kv_cache_dtype" not in _param_names(func):
        raise Drift(f"{where} has no kv_cache_dtype parameter")
    checks = [node for node in func.body.body if isinstance(node, cst.If)]
    if not checks:
        raise Drift(f"{where} has no checks")
    first = checks[0]
    fp8_only = m.BooleanOperation(
        left=compare(m.Name("kv_cache_dtype"), m.In(), _FP8_KV),
        operator=m.And(),
        right=_NEEDS_FEATURE,
    )
    if m.matches(first.test, fp8_only):
        return module, True, f"{where} already asks for the FlashInfer feature for fp8 KV only"
    if not m.matches(first.test, _NEEDS_FEATURE):
        raise Drift(
            f"{where}'s first check is `if {code(first.test)}:`, not `if not has_flashinfer_sm90_nope_mla():`"
        )
    new_test = cst.parse_expression(
        'kv_cache_dtype in ("fp8", "fp8_e4m3") and not has_flashinfer_sm90_nope_mla()'
    )
    return (
        edited(module, [cls, func], first, first.with_changes(test=new_test)),
        False,
        (f'{where}: the FlashInfer check applies to kv_cache_dtype in ("fp8", "fp8_e4m3") only'),
    )


_STATE = m.Call(func=m.Name("_SM90State"))
_STORAGE_DTYPE = m.Attribute(value=m.Name("kv_cache_spec"), attr=m.Name("dtype"))
_LOGICAL_DTYPE = "torch.float8_e4m3fn if kv_cache_spec.dtype == torch.uint8 else kv_cache_spec.dtype"
_MAPS_UINT8 = m.IfExp(
    test=compare(_STORAGE_DTYPE, m.Equal(), dotted("torch", "uint8")),
    body=dotted("torch", "float8_e4m3fn"),
)


# D2e: FP8 KV is stored as uint8; FlashInfer's MLA plan wants its logical dtype (vLLM 0.33.0
# maps it; 0.30.0 and the fork shape hand plan() torch.uint8, which FlashInfer refuses).
def _fp8_plan_dtype(module: cst.Module):
    hits = [(top, call) for top in module.body for call in m.findall(top, _STATE)]
    top, call = only(hits, "_SM90State(...) call")
    if len(call.args) < 3 or call.args[2].keyword is not None:
        raise Drift(f"_SM90State(...) takes no third positional argument: {code(call)}")
    arg = call.args[2]
    where = "the SM90 sparse MLA builder's _SM90State(...)"
    if m.matches(arg.value, _MAPS_UINT8) or any(m.findall(top, _MAPS_UINT8)):
        return module, True, f"{where} already plans FP8 KV as float8_e4m3fn"
    if not m.matches(arg.value, _STORAGE_DTYPE):
        raise Drift(f"{where} gets `{code(arg.value)}` as its KV dtype, not kv_cache_spec.dtype")
    new_arg = arg.with_changes(value=cst.parse_expression(_LOGICAL_DTYPE))
    return (
        edited(module, [top], arg, new_arg),
        False,
        f"{where}: KV dtype `{_LOGICAL_DTYPE}`",
    )


# D4: programmatic dependent launch on Hopper and Blackwell datacenter parts only.
def _pdl_on_9_and_10(module: cst.Module):
    cls = _class_defining(module, "is_arch_support_pdl")
    func = method(cls, "is_arch_support_pdl")
    where = f"{cls.name.value}.is_arch_support_pdl"
    stock = compare(m.Name("major"), m.GreaterThanEqual(), m.Integer("9"))
    patched = compare(m.Name("major"), m.In(), int_tuple(9, 10))
    rets = [
        r
        for r in m.findall(func, m.Return())
        if r.value is not None and m.matches(r.value, stock | patched)
    ]
    ret = only(rets, f"`return major >= 9` in {where}")
    if m.matches(ret.value, patched):
        return module, True, f"{where} already returns `major in (9, 10)`"
    new_ret = ret.with_changes(value=cst.parse_expression("major in (9, 10)"))
    return edited(module, [cls, func], ret, new_ret), False, (f"{where}: `return major in (9, 10)`")


def _pool_topk_minus_one(branch_flag: str):
    """V7a/V7b: the kpool top-k buffer of one branch starts filled with -1."""

    def edit(module: cst.Module):
        func = top_function(module, "sparse_attn_indexer_kpool")
        branch = only(
            [s for s in func.body.body if m.matches(s, m.If(test=m.Name(branch_flag)))],
            f"`if {branch_flag}:` branch of sparse_attn_indexer_kpool",
        )
        alloc = m.Call(func=dotted("torch", "empty") | dotted("torch", "full"))
        assign = m.Assign(targets=[m.AssignTarget(target=m.Name("pool_topk"))], value=alloc)
        found = only(
            m.findall(branch.body, assign),
            f"`pool_topk = torch.empty(...)` under `if {branch_flag}:`",
        )
        call = found.value
        where = f"sparse_attn_indexer_kpool, `if {branch_flag}:`"
        if m.matches(call.func, dotted("torch", "full")):
            if len(call.args) > 1 and m.matches(
                call.args[1].value, m.UnaryOperation(m.Minus(), m.Integer("1"))
            ):
                return module, True, f"{where}: pool_topk already starts filled with -1"
            raise Drift(f"{where}: pool_topk = {code(call)} does not fill with -1")
        if not call.args or call.args[0].keyword is not None:
            raise Drift(f"{where}: pool_topk = {code(call)} has no positional shape")
        args = list(call.args)
        minus_one = cst.Arg(value=cst.parse_expression("-1"), comma=args[0].comma)
        new_call = call.with_changes(
            func=cst.parse_expression("torch.full"), args=[args[0], minus_one, *args[1:]]
        )
        return (
            edited(module, [func], call, new_call),
            False,
            f"{where}: pool_topk = torch.full(..., -1, ...)",
        )

    return edit


# V7c: pool ids past the row's valid pools expand to -1, never to tokens.
def _expand_valid_pools_only(module: cst.Module):
    func = top_function(module, "_expand_pools_and_append_tail_kernel")
    pool_len = m.Assign(targets=[m.AssignTarget(target=m.Name("pool_len"))])
    if not m.findall(func, pool_len):
        raise Drift("_expand_pools_and_append_tail_kernel computes no pool_len")
    where_call = m.Call(func=dotted("tl", "where"))
    assign = only(
        m.findall(
            func, m.Assign(targets=[m.AssignTarget(target=m.Name("hist_out"))], value=where_call)
        ),
        "`hist_out = tl.where(...)` in _expand_pools_and_append_tail_kernel",
    )
    call = assign.value
    condition = call.args[0].value
    pid_ok = compare(m.Name("pid"), m.GreaterThanEqual(), m.Integer("0"))
    below = compare(m.Name("pid"), m.LessThan(), m.Name("pool_len"))
    if m.matches(condition, m.BinaryOperation(left=pid_ok, operator=m.BitAnd(), right=below)):
        return module, True, "hist_out already keeps pool ids in [0, pool_len) only"
    if not m.matches(condition, pid_ok):
        raise Drift(f"hist_out = tl.where({code(condition)}, ...), not tl.where(pid >= 0, ...)")
    new_condition = cst.parse_expression("(pid >= 0) & (pid < pool_len)")
    new_call = call.with_changes(
        args=[call.args[0].with_changes(value=new_condition), *call.args[1:]]
    )
    return (
        edited(module, [func], call, new_call),
        False,
        (
            "_expand_pools_and_append_tail_kernel: hist_out = tl.where((pid >= 0) & (pid < pool_len), ...)"
        ),
    )


CHANGES = (
    Change(
        "D1",
        (CUDA,),
        "SM90 sparse MLA backend before the SM120 one at capability 12",
        _sm90_before_sm120,
        skip_when=_no_sm90_backend,
    ),
    Change(
        "D2a",
        (SM90_BACKEND,),
        "the SM90 sparse MLA backend accepts capability 12",
        _sm90_backend_accepts_12,
        skip_when=_no_sm90_backend,
    ),
    Change(
        "D2b",
        (SM90_BACKEND,),
        "the SM90 sparse MLA wrapper runs FA3 on Hopper only, else FA2",
        _fa2_off_hopper,
        skip_when=_no_sm90_backend,
    ),
    Change(
        "D2c",
        (SM90_BACKEND,),
        "bf16 KV no longer needs FlashInfer's SM90 NoPE feature",
        _feature_check_fp8_only,
        skip_when=_no_sm90_backend,
    ),
    Change(
        "D2e",
        (SM90_BACKEND,),
        "FP8 KV planned as float8_e4m3fn, not its uint8 storage",
        _fp8_plan_dtype,
        skip_when=_no_sm90_backend,
    ),
    Change("D4", (CUDA,), "PDL on majors 9 and 10 only", _pdl_on_9_and_10),
    Change(
        "V7a",
        KPOOL_INDEXERS,
        "prefill pool_topk starts filled with -1",
        _pool_topk_minus_one("has_prefill"),
        skip_when=_no_glm5next,
    ),
    Change(
        "V7b",
        KPOOL_INDEXERS,
        "decode pool_topk starts filled with -1",
        _pool_topk_minus_one("has_decode"),
        skip_when=_no_glm5next,
    ),
    Change(
        "V7c",
        (KPOOL_KERNELS,),
        "pool ids at or past pool_len expand to -1",
        _expand_valid_pools_only,
        skip_when=_no_glm5next,
    ),
)
