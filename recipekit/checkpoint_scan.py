"""What a local checkpoint is, read without loading its weights.

It reads config.json (and hf_quant_config.json, where ModelOpt wrote one), every shard's
safetensors header (names, dtypes, shapes), and, one by one, only the per-tensor global
scales of the routed experts' gate and up projections. From them it reports:

- the quantization format and its producer version, as the config declares them;
- the precision of every module, grouped by module name with layer and expert numbers
  folded to `*` (NVFP4, FP8, BF16, ...), as the header's dtypes show it;
- how many routed experts have gate and up global scales that differ, and the largest
  ratio between them;
- whether this recipe's image chain corrects that (the v8 layer folds each half's ratio
  into its block scales for ModelOpt's NVFP4 fused MoE; nothing here touches the
  compressed-tensors path).

Tensor names follow vLLM 0.30.0's loaders: Glm5Next maps `experts.<E>.gate_proj.` and
`experts.<E>.up_proj.` to the fused `w13_` parameters (fused_moe routed_experts.py,
build_expert_params_mapping). ModelOpt stores `weight` (packed FP4 as U8), `weight_scale`
(E4M3 block scales) and `weight_scale_2`, the scale a block decodes with
(modelopt.py, ModelOptNvFp4FusedMoE.create_weights). compressed-tensors stores
`weight_packed`, `weight_scale` and `weight_global_scale`, the reciprocal of that scale
(compressed_tensors_moe_w4a4_nvfp4.py hands `1 / w13_weight_global_scale` to the kernel).
Both keep only the gate's global scale for the fused gate+up GEMM.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from safetensors import SafetensorError, safe_open

CONFIG = "config.json"
HF_QUANT_CONFIG = "hf_quant_config.json"
SHARD_INDEX = "model.safetensors.index.json"
# The image layer whose MoE scale fold (its v8_moe_scales patcher) corrects ModelOpt NVFP4
# experts: every chain image from it on carries the fold.
FIX_LAYER = 8
# ModelOpt's NVFP4 quant_algo values (vLLM 0.30.0 modelopt.py, LINEAR_ALGOS).
MODELOPT_NVFP4_ALGOS = ("NVFP4", "W4A16_NVFP4")
# The global scale each format stores per projection, and whether it is the reciprocal of
# the scale a block decodes with.
GLOBAL_SCALE = {"modelopt": ("weight_scale_2", False),
                "compressed-tensors": ("weight_global_scale", True)}
_EXPERT_HALF = re.compile(r"(?P<expert>.*\.experts\.(?P<number>[0-9]+))\."
                          r"(?P<half>gate_proj|up_proj)\.(?P<param>[A-Za-z0-9_]+)")
_NUMBER = re.compile(r"^[0-9]+$")
_DTYPE_NAMES = {"BF16": "BF16", "F16": "FP16", "F32": "FP32", "F64": "FP64",
                "F8_E4M3": "FP8", "F8_E5M2": "FP8"}


class ScanError(Exception):
    """The directory cannot be scanned: one line naming the file and what to do."""


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
class ExpertScales:
    """The routed experts' gate/up global scales, compared as the scale a block decodes with."""
    scale_param: str  # the tensor read per half; "" when the format has none to compare
    pairs: int = 0
    differ: int = 0
    unpaired: int = 0
    largest_ratio: float | None = None  # max over experts of max(up/gate, gate/up)
    largest_at: str = ""
    up_over_gate_at_largest: float | None = None

    def to_json(self) -> dict:
        return {"scale_param": self.scale_param, "pairs": self.pairs, "differ": self.differ,
                "unpaired": self.unpaired, "largest_ratio": self.largest_ratio,
                "largest_at": self.largest_at or None,
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
    experts: ExpertScales
    fix: Fix

    def precision_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for group in self.groups:
            counts[group.precision] = counts.get(group.precision, 0) + group.modules
        return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))

    def summary(self) -> str:
        """The one line the launcher prints: format, module precisions, the experts' scales."""
        fmt = self.format
        producer = " ".join(part for part in (fmt.producer, fmt.producer_version) if part)
        counts = ", ".join(f"{count} {name}" for name, count in self.precision_counts().items())
        return (f"{fmt.label}{f' ({producer})' if producer else ''}; modules {counts or 'none'}; "
                f"{experts_phrase(self.experts)}")

    def to_json(self) -> dict:
        return {"checkpoint": self.checkpoint, "format": vars(self.format), "shards": self.shards,
                "tensors": self.tensors, "scale_tensors_read": self.scale_tensors_read,
                "groups": [group.to_json() for group in self.groups],
                "routed_experts": self.experts.to_json(), "fix": self.fix.to_json(),
                "summary": self.summary()}

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


def experts_phrase(experts: ExpertScales) -> str:
    if not experts.scale_param:
        return "gate/up global scales not compared (no NVFP4 global scales in this format)"
    if experts.pairs == 0:
        return f"no routed-expert gate/up {experts.scale_param} found"
    unpaired = f", {experts.unpaired} half without its pair" if experts.unpaired else ""
    if experts.differ == 0:
        return (f"gate/up {experts.scale_param} equal in all {experts.pairs} routed experts"
                f"{unpaired}")
    return (f"gate/up {experts.scale_param} differ in {experts.differ} of {experts.pairs} routed "
            f"experts, largest ratio {ratio_text(experts.largest_ratio)} at {experts.largest_at} "
            f"(decode scale up/gate {ratio_text(experts.up_over_gate_at_largest)}){unpaired}")


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


def _scale_value(handle, name: str, shard: Path) -> float:
    try:
        values = handle.get_tensor(name).reshape(-1)
    except (TypeError, ValueError) as error:
        raise ScanError(f"{shard}: {name} cannot be read as a float array ({error}); the scan "
                        "reads F16, F32 or F64 global scales") from None
    if values.size != 1:
        raise ScanError(f"{shard}: {name} holds {values.size} values, not one global scale; "
                        "this is not the layout the scan knows")
    value = float(values[0])
    if not math.isfinite(value) or value <= 0:
        raise ScanError(f"{shard}: {name} is {value}, not a positive scale; the checkpoint is "
                        "damaged: re-download this shard")
    return value


def _compare(scales: dict[str, dict[str, float]], param: str, reciprocal: bool) -> ExpertScales:
    """Each expert's up/gate ratio of the scale a block decodes with (the stored global scale,
    or its reciprocal for compressed-tensors)."""
    pairs = differ = unpaired = 0
    largest, at, up_over_gate = None, "", None
    for expert in sorted(scales, key=_expert_order):
        halves = scales[expert]
        if set(halves) != {"gate_proj", "up_proj"}:
            unpaired += 1
            continue
        pairs += 1
        gate, up = halves["gate_proj"], halves["up_proj"]
        if gate == up:
            continue
        differ += 1
        ratio = gate / up if reciprocal else up / gate  # 1/g_up over 1/g_gate is g_gate / g_up
        spread = max(ratio, 1 / ratio)
        if largest is None or spread > largest:
            largest, at, up_over_gate = spread, expert, ratio
    return ExpertScales(param, pairs, differ, unpaired, largest, at, up_over_gate)


def _expert_order(expert: str) -> tuple:
    return tuple(int(part) if part.isdigit() else part for part in expert.split("."))


def fix_for(fmt: QuantFormat, experts: ExpertScales) -> Fix:
    """Whether gate/up scales need correcting, and from which chain layer images do."""
    if not experts.differ:
        return Fix(False, None, "nothing to fix: every routed expert's gate and up global "
                   "scales are equal" if experts.pairs else "nothing to fix: no routed-expert "
                   "gate/up global scales to compare")
    if fmt.kind == "modelopt":
        return Fix(True, FIX_LAYER, f"corrected on this recipe's chain images from layer "
                   f"v{FIX_LAYER} on (its fold of each half's global scale into the block "
                   "scales of ModelOpt's NVFP4 fused MoE); any other image decodes the up half "
                   "off by up/gate")
    return Fix(True, None, "not corrected by any image of this recipe: vLLM's "
               "compressed-tensors NVFP4 MoE keeps the gate's global scale for both halves, and "
               f"layer v{FIX_LAYER}'s fold covers ModelOpt's path only")


def scan(directory: Path | str, opener: Callable | None = None,
         progress: Callable[[int, int, str], None] | None = None) -> Report:
    """Scan DIRECTORY. OPENER(path) opens a shard as safetensors' safe_open does (numpy);
    PROGRESS(done, total, shard name) is called after each shard."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ScanError(f"{directory}: not a directory; pass the checkpoint directory that "
                        "holds config.json and its *.safetensors shards")
    fmt = read_format(directory)
    shards = shard_paths(directory)
    opener = opener or _numpy_opener
    scale_param, reciprocal = GLOBAL_SCALE.get(fmt.kind, ("", False))
    modules: dict[str, dict[str, str]] = {}
    scales: dict[str, dict[str, float]] = {}
    tensors = read = 0
    for done, shard in enumerate(shards, start=1):
        try:
            with opener(shard) as handle:
                for name in handle.keys():
                    module, _, param = name.rpartition(".")
                    modules.setdefault(module, {})[param] = handle.get_slice(name).get_dtype()
                    tensors += 1
                    half = _EXPERT_HALF.fullmatch(name)
                    if scale_param and half and half["param"] == scale_param:
                        scales.setdefault(half["expert"], {})[half["half"]] = _scale_value(
                            handle, name, shard)
                        read += 1
        except OSError as error:
            raise ScanError(f"{shard}: cannot read it ({error.strerror or error}); pass a "
                            "checkpoint this user can read") from None
        except SafetensorError as error:
            raise ScanError(f"{shard}: unreadable safetensors header ({error}); re-download this "
                            "shard") from None
        if progress:
            progress(done, len(shards), shard.name)
    groups: dict[tuple[str, str], PrecisionGroup] = {}
    for module, params in modules.items():
        precision = precision_of(params)
        if precision is None:
            continue
        name, layer = group_of(module)
        group = groups.setdefault((name, precision), PrecisionGroup(name, precision))
        group.modules += 1
        if layer is not None:
            group.layers.add(layer)
    experts = (_compare(scales, scale_param, reciprocal) if scale_param
               else ExpertScales(""))
    return Report(str(directory), fmt, len(shards), tensors, read,
                  [groups[key] for key in sorted(groups)], experts, fix_for(fmt, experts))
