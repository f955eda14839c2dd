"""What a local checkpoint is, read without loading its weights.

It reads config.json (and hf_quant_config.json, where ModelOpt wrote one), then every shard's
safetensors header (names, dtypes, shapes), and only then, shard by shard, the data of the
per-tensor global scales of the modules vLLM fuses into one kernel: the routed experts' gate
and up projections and the merged linears (recipekit/fused_groups.py holds the table). From
them it reports:

- the quantization format and its producer version, as the config declares them;
- the precision of every module, grouped by module name with layer and expert numbers
  folded to `*` (NVFP4, FP8, BF16, ...), as the header's dtypes show it;
- per kind of fused group (routed experts gate/up, shared experts and dense MLP gate_up,
  MLA fused_qkv_a, ...): how many groups, how many have unequal global scales, and the
  largest ratio;
- whether this recipe's image chain corrects that (the v8 layer folds each half's ratio
  into its block scales for ModelOpt's NVFP4 fused MoE; nothing here corrects a merged
  linear or the compressed-tensors path).

It refuses (CheckpointRefused) a fused group one of whose halves has no global scale while
another has, or an NVFP4 half without one, and a global scale that is NaN, infinite, zero or
negative: vLLM allocates the fused global scales with torch.empty, so such a half would be
served from whatever that memory holds.

Tensor names follow vLLM 0.30.0's loaders: Glm5Next maps `experts.<E>.gate_proj.` and
`experts.<E>.up_proj.` to the fused `w13_` parameters (fused_moe routed_experts.py,
build_expert_params_mapping), and its `stacked_params_mapping` loads the merged linears'
shards into one parameter each. ModelOpt stores `weight` (packed FP4 as U8), `weight_scale`
(E4M3 block scales) and `weight_scale_2`, the scale a block decodes with
(modelopt.py, ModelOptNvFp4FusedMoE.create_weights, KNvfp4Static.create_weights).
compressed-tensors stores `weight_packed`, `weight_scale` and `weight_global_scale`, the
reciprocal of that scale (compressed_tensors_moe_w4a4_nvfp4.py hands
`1 / w13_weight_global_scale` to the kernel). Both MoE paths keep only the gate's global
scale for the fused gate+up GEMM. ModelOpt's NVFP4 linear keeps `weight_scale_2.max()` for
every shard of a merged layer (KNvfp4Static.process); compressed-tensors' keeps
`1 / weight_global_scale.max()`, the smallest decode scale
(compressed_tensors_w4a4_nvfp4.py, process_weights_after_loading). Neither touches the
block scales, so a shard whose own decode scale differs is served off by kept / own.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from safetensors import SafetensorError, safe_open

from recipekit.fused_groups import KINDS, FusedKind, built_kinds, kind_of

CONFIG = "config.json"
HF_QUANT_CONFIG = "hf_quant_config.json"
SHARD_INDEX = "model.safetensors.index.json"
# The image layer whose patchers correct ModelOpt NVFP4's fused groups (v8_moe_scales: the
# experts' up half; v8_linear_scales: a merged linear's shards): every chain image from it on.
FIX_LAYER = 8
# (format kind, fused kind key) -> the chain layer from which images correct unequal global
# scales in such groups; a pair not here is corrected by no image of this recipe.
FIXED_FROM_LAYER = {("modelopt", key): FIX_LAYER for key in (
    "experts", "shared_gate_up", "dense_gate_up", "mla_qkv_a", "indexer_wk", "kda_in_proj")}
# ModelOpt's NVFP4 quant_algo values (vLLM 0.30.0 modelopt.py, LINEAR_ALGOS).
MODELOPT_NVFP4_ALGOS = ("NVFP4", "W4A16_NVFP4")
# The global scale each format stores per projection, and whether it is the reciprocal of
# the scale a block decodes with.
GLOBAL_SCALE = {"modelopt": ("weight_scale_2", False),
                "compressed-tensors": ("weight_global_scale", True)}
# Which decode scale vLLM 0.30.0 keeps for a whole merged NVFP4 linear, by format: ModelOpt
# the largest weight_scale_2, compressed-tensors 1 / the largest weight_global_scale.
LINEAR_KEEPS = {"modelopt": ("largest", max), "compressed-tensors": ("smallest", min)}
# The dtypes a global scale may have: numpy reads them (it has no bfloat16).
SCALE_DTYPES = ("F16", "F32", "F64")
_NUMBER = re.compile(r"^[0-9]+$")
_DTYPE_NAMES = {"BF16": "BF16", "F16": "FP16", "F32": "FP32", "F64": "FP64",
                "F8_E4M3": "FP8", "F8_E5M2": "FP8"}


class ScanError(Exception):
    """The directory cannot be scanned: one line naming the file and what to do."""


class CheckpointRefused(ScanError):
    """The checkpoint was read, and vLLM would serve it from an uninitialised or unusable
    global scale whatever the image: one line naming the tensor and what to do."""


@dataclass(frozen=True)
class QuantFormat:
    kind: str  # "modelopt", "compressed-tensors", "other" or "none"
    label: str
    scheme: str = ""  # ModelOpt's quant_algo, compressed-tensors' format, as declared
    producer: str = ""
    producer_version: str = ""
    declared_in: str = ""


@dataclass
class PrecisionGroup:
    group: str
    precision: str
    modules: int = 0
    layers: set[int] = field(default_factory=set)

    def to_json(self) -> dict:
        return {"group": self.group, "precision": self.precision, "modules": self.modules,
                "layers": sorted(self.layers)}


@dataclass(frozen=True)
class Header:
    shard: Path
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class KindScales:
    """One kind of fused group's global scales, compared as the scales a block decodes with."""
    kind: FusedKind
    scale_param: str
    keeps: str  # which decode scale vLLM keeps for the fused group: "gate's", "largest", ...
    groups: int = 0
    differ: int = 0
    largest_ratio: float | None = None  # max over groups of (largest / smallest decode scale)
    largest_at: str = ""  # that group's parent module
    # at that group: the decode scale of each shard, and the shard vLLM serves furthest off
    decode_at_largest: tuple[tuple[str, float], ...] = ()
    served_shard: str = ""
    served_factor: float | None = None  # what vLLM's kept scale over that shard's own is
    fixed_from_layer: int | None = None

    def to_json(self) -> dict:
        return {"kind": self.kind.key, "label": self.kind.label, "fused": self.kind.fused,
                "shards": list(self.kind.shards), "scale_param": self.scale_param,
                "vllm_keeps": self.keeps, "groups": self.groups, "differ": self.differ,
                "largest_ratio": self.largest_ratio, "largest_at": self.largest_at or None,
                "served_shard": self.served_shard or None,
                "served_factor": self.served_factor, "fixed_from_layer": self.fixed_from_layer}


@dataclass(frozen=True)
class ExpertScales:
    """The routed experts' gate/up global scales, compared as the scale a block decodes with."""
    scale_param: str  # the tensor read per half; "" when the format has none to compare
    pairs: int = 0
    differ: int = 0
    largest_ratio: float | None = None  # max over experts of max(up/gate, gate/up)
    largest_at: str = ""
    up_over_gate_at_largest: float | None = None

    def to_json(self) -> dict:
        return {"scale_param": self.scale_param, "pairs": self.pairs, "differ": self.differ,
                "largest_ratio": self.largest_ratio, "largest_at": self.largest_at or None,
                "up_over_gate_at_largest": self.up_over_gate_at_largest}


@dataclass(frozen=True)
class Fix:
    needed: bool
    from_layer: int | None  # the chain layer from which images correct it; None: none does
    says: str

    def to_json(self) -> dict:
        return {"needed": self.needed, "from_layer": self.from_layer, "says": self.says}


@dataclass
class Report:
    checkpoint: str
    format: QuantFormat
    shards: int
    tensors: int
    scale_tensors_read: int
    groups: list[PrecisionGroup]
    fused: list[KindScales]  # every kind of the table, in its order ([] when no global scale)
    fix: Fix

    @property
    def experts(self) -> ExpertScales:
        return experts_of(self.fused)

    @property
    def merged_linears(self) -> list[KindScales]:
        return [kind for kind in self.fused if not kind.kind.routed_experts]

    def precision_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for group in self.groups:
            counts[group.precision] = counts.get(group.precision, 0) + group.modules
        return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))

    def summary(self) -> str:
        """The one line the launcher prints: format, module precisions, and each kind of
        fused group's scales."""
        fmt = self.format
        producer = " ".join(part for part in (fmt.producer, fmt.producer_version) if part)
        counts = ", ".join(f"{count} {name}" for name, count in self.precision_counts().items())
        return (f"{fmt.label}{f' ({producer})' if producer else ''}; modules {counts or 'none'}; "
                f"{experts_phrase(self.experts)}; {linears_phrase(self.merged_linears)}")

    def to_json(self) -> dict:
        return {"checkpoint": self.checkpoint, "format": vars(self.format), "shards": self.shards,
                "tensors": self.tensors, "scale_tensors_read": self.scale_tensors_read,
                "groups": [group.to_json() for group in self.groups],
                "routed_experts": self.experts.to_json(),
                "fused_groups": [kind.to_json() for kind in self.fused],
                "fix": self.fix.to_json(), "summary": self.summary()}

    def text(self) -> str:
        fmt = self.format
        lines = [f"checkpoint: {self.checkpoint}"]
        details = [fmt.scheme,
                   f"{fmt.producer} {fmt.producer_version}".strip() if fmt.producer else "",
                   f"declared in {fmt.declared_in}" if fmt.declared_in else ""]
        details = [part for part in details if part]
        lines.append(f"format: {fmt.label}" + (f" ({', '.join(details)})" if details else ""))
        lines.append(f"read: {self.shards} shard(s), {self.tensors} tensor headers, "
                     f"{self.scale_tensors_read} scale tensors (no weights)")
        lines.append("precision by module group:")
        width = max((len(group.group) for group in self.groups), default=0)
        for group in self.groups:
            plural = "s" if len(group.layers) > 1 else ""
            where = f"layer{plural} {layer_ranges(group.layers)}, " if group.layers else ""
            lines.append(f"  {group.precision:<6} {group.group:<{width}}  {where}"
                         f"{group.modules} module{'s' if group.modules != 1 else ''}")
        lines.append(f"routed experts: {experts_phrase(self.experts)}")
        lines.extend(linears_lines(self.merged_linears))
        lines.append(f"fix: {self.fix.says}")
        return "\n".join(lines)


def layer_ranges(layers: set[int]) -> str:
    """{0, 1, 2, 45} -> "0-2, 45"."""
    ordered, parts = sorted(layers), []
    start = previous = None
    for number in ordered + [None]:
        if number is not None and previous is not None and number == previous + 1:
            previous = number
            continue
        if start is not None:
            parts.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = number
    return ", ".join(parts)


def ratio_text(value: float) -> str:
    return f"{value:.4g}"


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def experts_of(fused: list[KindScales]) -> ExpertScales:
    """The routed experts' kind as the report's routed-experts line says it."""
    kind = next((kind for kind in fused if kind.kind.routed_experts), None)
    if kind is None:
        return ExpertScales("")
    decode = dict(kind.decode_at_largest)
    gate, up = kind.kind.shards
    up_over_gate = decode[up] / decode[gate] if decode else None
    return ExpertScales(kind.scale_param, kind.groups, kind.differ, kind.largest_ratio,
                        kind.largest_at, up_over_gate)


def experts_phrase(experts: ExpertScales) -> str:
    if not experts.scale_param:
        return "gate/up global scales not compared (no NVFP4 global scales in this format)"
    if experts.pairs == 0:
        return f"no routed-expert gate/up {experts.scale_param} found"
    if experts.differ == 0:
        return f"gate/up {experts.scale_param} equal in all {experts.pairs} routed experts"
    return (f"gate/up {experts.scale_param} differ in {experts.differ} of {experts.pairs} routed "
            f"experts, largest ratio {ratio_text(experts.largest_ratio)} at {experts.largest_at} "
            f"(decode scale up/gate {ratio_text(experts.up_over_gate_at_largest)})")


def linears_phrase(linears: list[KindScales]) -> str:
    """The summary's words for the merged linears: per kind found, unequal of groups and the
    largest ratio."""
    if not linears:
        return "merged linears not compared (no NVFP4 global scales in this format)"
    found = [kind for kind in linears if kind.groups]
    if not found:
        return "no NVFP4 merged linears"
    return "merged linears: " + ", ".join(
        f"{kind.kind.label} {kind.differ} of {plural(kind.groups, 'group')} unequal"
        + (f" (largest ratio {ratio_text(kind.largest_ratio)})" if kind.differ else "")
        for kind in found)


def linears_lines(linears: list[KindScales]) -> list[str]:
    """The report's lines for the merged linears: one a kind found."""
    found = [kind for kind in linears if kind.groups]
    if not found:
        return ["merged linears: " + ("none in NVFP4" if linears else
                                      "not compared (no NVFP4 global scales in this format)")]
    first = found[0]
    lines = [f"merged linears ({first.scale_param} per shard; vLLM keeps the {first.keeps} "
             "decode scale for the whole layer):"]
    width = max(len(kind.kind.label) for kind in found)
    for kind in found:
        said = f"{plural(kind.groups, 'group')}, "
        if kind.differ:
            said += (f"{kind.differ} unequal, largest ratio {ratio_text(kind.largest_ratio)} at "
                     f"{kind.largest_at} (vLLM decodes {kind.served_shard} "
                     f"x{ratio_text(kind.served_factor)})")
        else:
            said += "all equal"
        lines.append(f"  {kind.kind.label:<{width}}  {said}")
    return lines


# ----------------------------------------------------------------------------- the config


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ScanError(f"{path}: cannot read it ({error.strerror or error}); pass a checkpoint "
                        "directory this user can read") from None
    except ValueError as error:
        raise ScanError(f"{path}: not JSON ({error}); re-download the checkpoint's config "
                        "files") from None
    if not isinstance(data, dict):
        raise ScanError(f"{path}: holds a {type(data).__name__}, not a JSON object; re-download "
                        "it")
    return data


def _producer(*configs: dict) -> tuple[str, str]:
    for config in configs:
        producer = config.get("producer")
        if isinstance(producer, dict) and producer.get("name"):
            return str(producer["name"]), str(producer.get("version", ""))
    return "", ""


def _is_nvfp4_scheme(scheme: object) -> bool:
    """compressed-tensors' NVFP4 weights, as vLLM 0.30.0's _is_nvfp4_format reads them."""
    weights = scheme.get("weights") if isinstance(scheme, dict) else None
    return (isinstance(weights, dict) and weights.get("num_bits") == 4
            and weights.get("type") == "float" and weights.get("group_size") == 16
            and weights.get("strategy") == "tensor_group")


def read_format(directory: Path) -> QuantFormat:
    """The quantization the checkpoint declares: config.json's quantization_config (ModelOpt
    0.31 and later, compressed-tensors), else hf_quant_config.json (earlier ModelOpt)."""
    config_path = directory / CONFIG
    if not config_path.is_file():
        raise ScanError(f"{config_path}: missing; pass the checkpoint directory that holds "
                        "config.json and its *.safetensors shards")
    config = _read_json(config_path)
    quant = config.get("quantization_config") or config.get("compression_config")
    declared_in = f"{CONFIG} quantization_config"
    legacy_path = directory / HF_QUANT_CONFIG
    legacy = _read_json(legacy_path) if legacy_path.is_file() else {}
    if not quant and legacy:
        quant, declared_in = legacy, HF_QUANT_CONFIG
    if not isinstance(quant, dict) or not quant:
        return QuantFormat("none", "not quantized (no quantization_config)")
    method = str(quant.get("quant_method", "")).lower()
    producer, version = _producer(quant, legacy)
    if method.startswith("modelopt") or producer == "modelopt":
        nested = quant.get("quantization")
        algo = str((nested if isinstance(nested, dict) else quant).get("quant_algo", "")).upper()
        label = "ModelOpt NVFP4" if algo in MODELOPT_NVFP4_ALGOS else f"ModelOpt {algo or '?'}"
        return QuantFormat("modelopt", label, f"quant_algo {algo}" if algo else "",
                           producer or "modelopt", version, declared_in)
    if method == "compressed-tensors":
        groups = quant.get("config_groups")
        nvfp4 = isinstance(groups, dict) and any(map(_is_nvfp4_scheme, groups.values()))
        layout = str(quant.get("format", ""))
        label = "compressed-tensors NVFP4" if nvfp4 else f"compressed-tensors {layout or '?'}"
        return QuantFormat("compressed-tensors", label, f"format {layout}" if layout else "",
                           "compressed-tensors",
                           str(quant.get("version", "")), declared_in)
    return QuantFormat("other", f"other ({method or 'no quant_method'})", "", producer, version,
                       declared_in)


# ----------------------------------------------------------------------------- the shards


def shard_paths(directory: Path) -> list[Path]:
    """The shards the index names (each must exist), else every *.safetensors here."""
    index = directory / SHARD_INDEX
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ScanError(f"{index}: no weight_map; re-download the checkpoint's index")
        shards = [directory / name for name in sorted(set(map(str, weight_map.values())))]
        for shard in shards:
            if not shard.is_file():
                raise ScanError(f"{shard}: named by {SHARD_INDEX} but missing; finish the "
                                "download of this checkpoint")
        return shards
    shards = sorted(directory.glob("*.safetensors"))
    if not shards:
        raise ScanError(f"{directory}: no *.safetensors shards; pass the checkpoint directory "
                        "that holds them")
    return shards


def _numpy_opener(path: Path):
    return safe_open(str(path), framework="numpy")  # numpy: the scan needs no torch


def precision_of(params: dict[str, str]) -> str | None:
    """A module's precision from its tensors' dtypes; None when it has no weight."""
    packed = params.get("weight_packed")
    weight = packed or params.get("weight")
    if weight is None:
        return None
    if weight == "U8":  # two FP4 values a byte; the block scales say which 4-bit format
        return "NVFP4" if params.get("weight_scale") == "F8_E4M3" else "packed U8"
    return _DTYPE_NAMES.get(weight, weight)


def group_of(module: str) -> tuple[str, int | None]:
    """`model.layers.3.mlp.experts.7.up_proj` -> (`model.layers.*.mlp.experts.*.up_proj`, 3)."""
    parts = module.split(".")
    layer = None
    for at, part in enumerate(parts):
        if _NUMBER.match(part):
            if layer is None and at > 0 and parts[at - 1] == "layers":
                layer = int(part)
            parts[at] = "*"
    return ".".join(parts), layer




# ----------------------------------------------------------------------------- the scales


@dataclass
class FusedGroup:
    """One parent module's shards that vLLM fuses: {shard: {param: header}} as found."""
    kind: FusedKind
    parent: str
    shards: dict[str, dict[str, Header]] = field(default_factory=dict)

    def tensor(self, shard: str, param: str) -> str:
        return f"{self.parent}.{shard}.{param}"


def read_headers(shards: list[Path], opener: Callable,
                 progress: Callable | None) -> dict[str, Header]:
    """Every tensor's header (shard, dtype, shape), shard by shard; no tensor's data."""
    headers: dict[str, Header] = {}
    for done, shard in enumerate(shards, start=1):
        with _reading(shard), opener(shard) as handle:
            for name in handle.keys():
                view = handle.get_slice(name)
                headers[name] = Header(shard, view.get_dtype(), tuple(view.get_shape()))
        if progress:
            progress(done, len(shards), shard.name)
    return headers


class _reading:
    """Turns a shard's read errors into the scan's one-line refusals."""

    def __init__(self, shard: Path):
        self.shard = shard

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if isinstance(error, OSError):
            raise ScanError(f"{self.shard}: cannot read it ({error.strerror or error}); pass a "
                            "checkpoint this user can read") from None
        if isinstance(error, SafetensorError):
            raise ScanError(f"{self.shard}: unreadable safetensors header ({error}); re-download "
                            "this shard") from None
        return False


def fused_groups(modules: dict[str, dict[str, Header]], built: set[str]) -> list[FusedGroup]:
    """The checkpoint's modules that vLLM fuses, by kind and parent, in a stable order."""
    groups: dict[tuple[str, str], FusedGroup] = {}
    for module, params in modules.items():
        found = kind_of(module, built)
        if found is None:
            continue
        kind, parent, shard = found
        groups.setdefault((kind.key, parent), FusedGroup(kind, parent)).shards[shard] = params
    order = {kind.key: at for at, kind in enumerate(KINDS)}
    return sorted(groups.values(), key=lambda group: (order[group.kind.key],
                                                      _module_order(group.parent)))


def _module_order(module: str) -> tuple:
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part)
                 for part in module.split("."))


def judged(group: FusedGroup, scale_param: str) -> bool:
    """A group is NVFP4 (and its scales judged) when any shard has a global scale or NVFP4
    weights; a 16-bit or FP8 group has none to compare."""
    return any(scale_param in params or precision_of(
        {param: header.dtype for param, header in params.items()}) == "NVFP4"
        for params in group.shards.values())


def global_scale_tensors(directory: Path, groups: list[FusedGroup],
                         scale_param: str) -> dict[str, Header]:
    """{tensor: header} of every judged group's global scales, all present and each one
    value of a dtype numpy reads: checked on the headers, before any data is read."""
    wanted: dict[str, Header] = {}
    for group in groups:
        if not judged(group, scale_param):
            continue
        present = [shard for shard in group.kind.shards
                   if scale_param in group.shards.get(shard, {})]
        for shard in group.kind.shards:
            if shard in present:
                continue
            missing = group.tensor(shard, scale_param)
            fused = f"{group.parent}.{group.kind.fused}"
            if present:
                partner = group.tensor(present[0], scale_param)
                where = group.shards[present[0]][scale_param].shard.name
                said = f"missing, while its fused partner {partner} is in {where}"
            else:
                said = "missing from this NVFP4 group: no half of it has its global scale"
            raise CheckpointRefused(
                f"{directory}: {missing} is {said}; vLLM would serve {fused} with an "
                "uninitialised global scale (torch.empty): re-download the checkpoint, or use "
                "one exported with every half's global scale")
        for shard in group.kind.shards:
            name = group.tensor(shard, scale_param)
            header = group.shards[shard][scale_param]
            if header.dtype not in SCALE_DTYPES:
                raise ScanError(f"{header.shard}: {name} is stored as {header.dtype}; the scan "
                                f"reads {', '.join(SCALE_DTYPES[:-1])} or {SCALE_DTYPES[-1]} "
                                "global scales")
            if math.prod(header.shape) != 1:
                raise ScanError(f"{header.shard}: {name} has shape {list(header.shape)}, not "
                                "one global scale; this is not the layout the scan knows")
            wanted[name] = header
    return wanted


def read_scales(wanted: dict[str, Header], opener: Callable, fused_of: dict[str, str],
                progress: Callable | None) -> dict[str, float]:
    """The data of the WANTED scale tensors only, one shard open at a time; each must be
    a finite positive number (FUSED_OF names the fused module each one serves)."""
    by_shard: dict[Path, list[str]] = {}
    for name, header in wanted.items():
        by_shard.setdefault(header.shard, []).append(name)
    values: dict[str, float] = {}
    for done, shard in enumerate(sorted(by_shard), start=1):
        with _reading(shard), opener(shard) as handle:
            for name in sorted(by_shard[shard]):
                value = float(handle.get_tensor(name).reshape(-1)[0])
                if not math.isfinite(value) or value <= 0:
                    raise CheckpointRefused(
                        f"{shard}: {name} is {value}, not a finite positive global scale; vLLM "
                        f"would decode its part of {fused_of[name]} with it: the checkpoint is "
                        "damaged, re-download this shard")
                values[name] = value
        if progress:
            progress(done, len(by_shard), shard.name, stage="scales")
    return values


def compare(fmt: QuantFormat, kind: FusedKind, groups: list[FusedGroup],
            values: dict[str, float], scale_param: str, reciprocal: bool) -> KindScales:
    """KIND's groups compared as the scales a block decodes with (the stored global, or its
    reciprocal for compressed-tensors): how many differ, and the largest ratio."""
    if kind.routed_experts:
        keeps, kept_of = "gate's", lambda decode: decode[kind.shards[0]]
    else:
        keeps, pick = LINEAR_KEEPS[fmt.kind]
        kept_of = lambda decode: pick(decode.values())  # noqa: E731
    count = differ = 0
    largest, at, decode_at, served, factor = None, "", (), "", None
    for group in groups:
        if group.kind is not kind or not judged(group, scale_param):
            continue
        count += 1
        decode = {shard: (1 / values[name] if reciprocal else values[name])
                  for shard in kind.shards
                  for name in [group.tensor(shard, scale_param)]}
        if len(set(decode.values())) == 1:
            continue
        differ += 1
        spread = max(decode.values()) / min(decode.values())
        if largest is None or spread > largest:
            kept = kept_of(decode)
            worst = max(kind.shards, key=lambda shard: max(kept / decode[shard],
                                                           decode[shard] / kept))
            largest, at, decode_at = spread, group.parent, tuple(decode.items())
            served, factor = worst, kept / decode[worst]
    return KindScales(kind, scale_param, keeps, count, differ, largest, at, decode_at, served,
                      factor, FIXED_FROM_LAYER.get((fmt.kind, kind.key)))


def fix_for(fmt: QuantFormat, fused: list[KindScales]) -> Fix:
    """Whether any fused group's scales need correcting, and from which chain layer images
    do (None when some kind that differs is corrected by no image)."""
    unequal = [kind for kind in fused if kind.differ]
    if not unequal:
        return Fix(False, None, "nothing to fix: every fused group's global scales are equal"
                   if any(kind.groups for kind in fused) else
                   "nothing to fix: no NVFP4 fused-group global scales to compare")
    experts = next((kind for kind in unequal if kind.kind.routed_experts), None)
    linears = [kind for kind in unequal if not kind.kind.routed_experts]
    says = []
    if experts and experts.fixed_from_layer is not None:
        says.append(f"corrected on this recipe's chain images from layer "
                    f"v{experts.fixed_from_layer} on (ModelOpt's NVFP4 fused MoE: each up output "
                    "row times its expert's up/gate on Marlin, the ratio folded into the block "
                    "scales elsewhere); any other image decodes the up half off by up/gate")
    elif experts:
        says.append("not corrected by any image of this recipe: vLLM's compressed-tensors NVFP4 "
                    "MoE keeps the gate's global scale for both halves, and layer "
                    f"v{FIX_LAYER}'s fold covers ModelOpt's path only")
    fixed_linears = [kind for kind in linears if kind.fixed_from_layer is not None]
    if linears and len(fixed_linears) == len(linears):
        says.append(f"corrected on this recipe's chain images from layer "
                    f"v{max(kind.fixed_from_layer for kind in linears)} on (each shard's output "
                    "columns times its own global over the one vLLM keeps); any other image "
                    "serves each other shard off by kept/own")
    elif linears:
        says.append(f"not corrected by any image of this recipe: vLLM's NVFP4 linear keeps the "
                    f"{linears[0].keeps} decode scale of a merged layer's shards and leaves "
                    "their block scales, so each other shard is served off by kept/own")
    if experts and linears:  # say which is which
        says = [f"routed experts {says[0]}",
                f"merged linears ({', '.join(kind.kind.label for kind in linears)}) {says[1]}"]
    layers = [kind.fixed_from_layer for kind in unequal]
    from_layer = None if None in layers else max(layers)
    return Fix(True, from_layer, "; ".join(says))


def scan(directory: Path | str, opener: Callable | None = None,
         progress: Callable[..., None] | None = None) -> Report:
    """Scan DIRECTORY. OPENER(path) opens a shard as safetensors' safe_open does (numpy);
    PROGRESS(done, total, shard name) is called after each shard's headers, and
    PROGRESS(done, total, shard name, stage="scales") after each shard's scales."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ScanError(f"{directory}: not a directory; pass the checkpoint directory that "
                        "holds config.json and its *.safetensors shards")
    fmt = read_format(directory)
    config = _read_json(directory / CONFIG)
    shards = shard_paths(directory)
    opener = opener or _numpy_opener
    scale_param, reciprocal = GLOBAL_SCALE.get(fmt.kind, ("", False))
    headers = read_headers(shards, opener, progress)
    modules: dict[str, dict[str, Header]] = {}
    for name, header in headers.items():
        module, _, param = name.rpartition(".")
        modules.setdefault(module, {})[param] = header
    groups: dict[tuple[str, str], PrecisionGroup] = {}
    for module, params in modules.items():
        precision = precision_of({param: header.dtype for param, header in params.items()})
        if precision is None:
            continue
        name, layer = group_of(module)
        group = groups.setdefault((name, precision), PrecisionGroup(name, precision))
        group.modules += 1
        if layer is not None:
            group.layers.add(layer)
    fused: list[KindScales] = []
    read = 0
    if scale_param:
        found = fused_groups(modules, built_kinds(config))
        wanted = global_scale_tensors(directory, found, scale_param)
        fused_of = {group.tensor(shard, scale_param): f"{group.parent}.{group.kind.fused}"
                    for group in found for shard in group.kind.shards}
        values = read_scales(wanted, opener, fused_of, progress)
        read = len(values)
        fused = [compare(fmt, kind, found, values, scale_param, reciprocal) for kind in KINDS]
    return Report(str(directory), fmt, len(shards), len(headers), read,
                  [groups[key] for key in sorted(groups)], fused, fix_for(fmt, fused))
