"""The checkpoint scan (recipekit/checkpoint_scan.py, scripts/scan-checkpoint) on four tiny
checkpoints made here (tests/unit/synthetic_checkpoints.py): its exact report, that it reads
every header before any data and no weight tensor's data, that a reciprocal taken the wrong
way and a merged linear's kept scale taken the wrong way show, and its one-line refusals:
a fused half without its global scale, a global that is NaN, infinite, zero or negative."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from recipekit import checkpoint_scan
from recipekit.checkpoint_scan import CheckpointRefused, ScanError, layer_ranges, scan
from tests.timing import HANG_GUARD_S
from tests.unit import synthetic_checkpoints as synthetic

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "scan-checkpoint"
# The reports as docs/checkpoints.md quotes them (the temporary directory written <tmp>).
MODELOPT_UNEQUAL = """\
checkpoint: <tmp>/modelopt-unequal
format: ModelOpt NVFP4 (quant_algo W4A16_NVFP4, modelopt 0.45.0, declared in hf_quant_config.json)
read: 2 shard(s), 94 tensor headers, 16 scale tensors (no weights)
precision by module group:
  BF16   lm_head                                      1 module
  BF16   model.embed_tokens                           1 module
  BF16   model.layers.*.input_layernorm               layers 0-2, 3 modules
  BF16   model.layers.*.mlp.down_proj                 layer 0, 1 module
  NVFP4  model.layers.*.mlp.experts.*.down_proj       layers 1-2, 8 modules
  NVFP4  model.layers.*.mlp.experts.*.gate_proj       layers 1-2, 8 modules
  NVFP4  model.layers.*.mlp.experts.*.up_proj         layers 1-2, 8 modules
  BF16   model.layers.*.mlp.gate                      layers 1-2, 2 modules
  BF16   model.layers.*.mlp.gate_proj                 layer 0, 1 module
  BF16   model.layers.*.mlp.shared_experts.down_proj  layers 1-2, 2 modules
  BF16   model.layers.*.mlp.shared_experts.gate_proj  layers 1-2, 2 modules
  BF16   model.layers.*.mlp.shared_experts.up_proj    layers 1-2, 2 modules
  BF16   model.layers.*.mlp.up_proj                   layer 0, 1 module
  BF16   model.layers.*.self_attn.o_proj              layers 0-2, 3 modules
  BF16   model.norm                                   1 module
routed experts: gate/up weight_scale_2 differ in 3 of 8 routed experts, largest ratio 4 at model.layers.2.mlp.experts.0 (decode scale up/gate 0.25)
merged linears: none in NVFP4
fix: corrected on this recipe's chain images from layer v8 on (ModelOpt's NVFP4 fused MoE: each up output row times its expert's up/gate on Marlin, the ratio folded into the block scales elsewhere); any other image decodes the up half off by up/gate
"""

NVIDIA_LIKE = """\
checkpoint: <tmp>/nvidia-like
format: ModelOpt NVFP4 (quant_algo NVFP4, modelopt 0.47.0, declared in config.json quantization_config)
read: 3 shard(s), 146 tensor headers, 18 scale tensors (no weights)
precision by module group:
  BF16   lm_head                                      1 module
  BF16   model.embed_tokens                           1 module
  BF16   model.layers.*.input_layernorm               layers 0-3, 4 modules
  NVFP4  model.layers.*.mlp.down_proj                 layer 0, 1 module
  BF16   model.layers.*.mlp.experts.*.down_proj       layer 3, 4 modules
  NVFP4  model.layers.*.mlp.experts.*.down_proj       layers 1-2, 8 modules
  BF16   model.layers.*.mlp.experts.*.gate_proj       layer 3, 4 modules
  NVFP4  model.layers.*.mlp.experts.*.gate_proj       layers 1-2, 8 modules
  BF16   model.layers.*.mlp.experts.*.up_proj         layer 3, 4 modules
  NVFP4  model.layers.*.mlp.experts.*.up_proj         layers 1-2, 8 modules
  BF16   model.layers.*.mlp.gate                      layers 1-3, 3 modules
  NVFP4  model.layers.*.mlp.gate_proj                 layer 0, 1 module
  BF16   model.layers.*.mlp.shared_experts.down_proj  layers 1-3, 3 modules
  BF16   model.layers.*.mlp.shared_experts.gate_proj  layers 1-3, 3 modules
  BF16   model.layers.*.mlp.shared_experts.up_proj    layers 1-3, 3 modules
  NVFP4  model.layers.*.mlp.up_proj                   layer 0, 1 module
  BF16   model.layers.*.self_attn.o_proj              layers 0-3, 4 modules
  BF16   model.norm                                   1 module
routed experts: gate/up weight_scale_2 equal in all 8 routed experts
merged linears (weight_scale_2 per shard; vLLM keeps the largest decode scale for the whole layer):
  dense MLP gate_up  1 group, all equal
fix: nothing to fix: every fused group's global scales are equal
"""

COMPRESSED_TENSORS = """\
checkpoint: <tmp>/compressed-tensors
format: compressed-tensors NVFP4 (format nvfp4-pack-quantized, compressed-tensors 0.12.2, declared in config.json quantization_config)
read: 2 shard(s), 153 tensor headers, 16 scale tensors (no weights)
precision by module group:
  BF16   lm_head                                      1 module
  BF16   model.embed_tokens                           1 module
  BF16   model.layers.*.input_layernorm               layers 0-3, 4 modules
  BF16   model.layers.*.mlp.down_proj                 layer 0, 1 module
  FP8    model.layers.*.mlp.experts.*.down_proj       layer 3, 4 modules
  NVFP4  model.layers.*.mlp.experts.*.down_proj       layers 1-2, 8 modules
  FP8    model.layers.*.mlp.experts.*.gate_proj       layer 3, 4 modules
  NVFP4  model.layers.*.mlp.experts.*.gate_proj       layers 1-2, 8 modules
  FP8    model.layers.*.mlp.experts.*.up_proj         layer 3, 4 modules
  NVFP4  model.layers.*.mlp.experts.*.up_proj         layers 1-2, 8 modules
  BF16   model.layers.*.mlp.gate                      layers 1-3, 3 modules
  BF16   model.layers.*.mlp.gate_proj                 layer 0, 1 module
  BF16   model.layers.*.mlp.shared_experts.down_proj  layers 1-2, 2 modules
  FP8    model.layers.*.mlp.shared_experts.down_proj  layer 3, 1 module
  BF16   model.layers.*.mlp.shared_experts.gate_proj  layers 1-2, 2 modules
  FP8    model.layers.*.mlp.shared_experts.gate_proj  layer 3, 1 module
  BF16   model.layers.*.mlp.shared_experts.up_proj    layers 1-2, 2 modules
  FP8    model.layers.*.mlp.shared_experts.up_proj    layer 3, 1 module
  BF16   model.layers.*.mlp.up_proj                   layer 0, 1 module
  BF16   model.layers.*.self_attn.o_proj              layers 0-2, 3 modules
  FP8    model.layers.*.self_attn.o_proj              layer 3, 1 module
  BF16   model.norm                                   1 module
routed experts: gate/up weight_global_scale differ in 2 of 8 routed experts, largest ratio 4 at model.layers.1.mlp.experts.2 (decode scale up/gate 4)
merged linears: none in NVFP4
fix: not corrected by any image of this recipe: vLLM's compressed-tensors NVFP4 MoE keeps the gate's global scale for both halves, and layer v8's fold covers ModelOpt's path only
"""

MODELOPT_MERGED = """\
checkpoint: <tmp>/modelopt-merged
format: ModelOpt NVFP4 (quant_algo W4A16_NVFP4, modelopt 0.47.0, declared in config.json quantization_config)
read: 2 shard(s), 168 tensor headers, 38 scale tensors (no weights)
precision by module group:
  BF16   lm_head                                        1 module
  BF16   model.embed_tokens                             1 module
  BF16   model.layers.*.input_layernorm                 layers 0-2, 3 modules
  NVFP4  model.layers.*.mlp.down_proj                   layer 0, 1 module
  NVFP4  model.layers.*.mlp.experts.*.down_proj         layers 1-2, 8 modules
  NVFP4  model.layers.*.mlp.experts.*.gate_proj         layers 1-2, 8 modules
  NVFP4  model.layers.*.mlp.experts.*.up_proj           layers 1-2, 8 modules
  BF16   model.layers.*.mlp.gate                        layers 1-2, 2 modules
  NVFP4  model.layers.*.mlp.gate_proj                   layer 0, 1 module
  NVFP4  model.layers.*.mlp.shared_experts.down_proj    layers 1-2, 2 modules
  NVFP4  model.layers.*.mlp.shared_experts.gate_proj    layers 1-2, 2 modules
  NVFP4  model.layers.*.mlp.shared_experts.up_proj      layers 1-2, 2 modules
  NVFP4  model.layers.*.mlp.up_proj                     layer 0, 1 module
  NVFP4  model.layers.*.self_attn.b_proj                layers 1-2, 2 modules
  NVFP4  model.layers.*.self_attn.f_a_proj              layers 1-2, 2 modules
  NVFP4  model.layers.*.self_attn.g_a_proj              layers 1-2, 2 modules
  NVFP4  model.layers.*.self_attn.indexer.weights_proj  layer 0, 1 module
  NVFP4  model.layers.*.self_attn.indexer.wk            layer 0, 1 module
  NVFP4  model.layers.*.self_attn.k_proj                layers 1-2, 2 modules
  NVFP4  model.layers.*.self_attn.kv_a_proj_with_mqa    layer 0, 1 module
  NVFP4  model.layers.*.self_attn.kv_b_proj             layer 0, 1 module
  BF16   model.layers.*.self_attn.o_proj                layers 1-2, 2 modules
  NVFP4  model.layers.*.self_attn.o_proj                layer 0, 1 module
  NVFP4  model.layers.*.self_attn.q_a_proj              layer 0, 1 module
  NVFP4  model.layers.*.self_attn.q_b_proj              layer 0, 1 module
  NVFP4  model.layers.*.self_attn.q_proj                layers 1-2, 2 modules
  NVFP4  model.layers.*.self_attn.v_proj                layers 1-2, 2 modules
  BF16   model.norm                                     1 module
routed experts: gate/up weight_scale_2 equal in all 8 routed experts
merged linears (weight_scale_2 per shard; vLLM keeps the largest decode scale for the whole layer):
  shared experts gate_up  2 groups, 1 unequal, largest ratio 2 at model.layers.2.mlp.shared_experts (vLLM decodes up_proj x2)
  dense MLP gate_up       1 group, 1 unequal, largest ratio 2 at model.layers.0.mlp (vLLM decodes up_proj x2)
  MLA fused_qkv_a         1 group, all equal
  indexer wk_weights      1 group, all equal
  KDA in_proj_qkvbfg_a    2 groups, 1 unequal, largest ratio 4 at model.layers.1.self_attn (vLLM decodes v_proj x4)
fix: corrected on this recipe's chain images from layer v8 on (each shard's output columns times its own global over the one vLLM keeps); any other image serves each other shard off by kept/own
"""

EXPECTED = {"modelopt-unequal": MODELOPT_UNEQUAL, "nvidia-like": NVIDIA_LIKE,
            "compressed-tensors": COMPRESSED_TENSORS, "modelopt-merged": MODELOPT_MERGED}
# The global scales each checkpoint holds for the groups vLLM fuses: 8 routed experts x gate,
# up everywhere; nvidia-like's dense MLP gate, up; modelopt-merged's every merged linear.
SCALES_READ = {"modelopt-unequal": 16, "nvidia-like": 18, "compressed-tensors": 16,
               "modelopt-merged": 38}


class RecordingOpener:
    """safe_open as the scan uses it, noting in order every header and every tensor's data
    asked for."""

    def __init__(self):
        self.events: list[tuple[str, str]] = []  # ("header" | "data", tensor)

    @property
    def headers(self) -> list[str]:
        return [name for what, name in self.events if what == "header"]

    @property
    def read(self) -> list[str]:
        return [name for what, name in self.events if what == "data"]

    def __call__(self, path):
        return _Recorded(safe_open(str(path), framework="numpy"), self)


class _Recorded:
    def __init__(self, handle, record):
        self.handle, self.record = handle, record

    def __enter__(self):
        self.handle.__enter__()
        return self

    def __exit__(self, *exc):
        return self.handle.__exit__(*exc)

    def keys(self):
        return self.handle.keys()

    def get_slice(self, name):
        self.record.events.append(("header", name))
        return self.handle.get_slice(name)

    def get_tensor(self, name):
        self.record.events.append(("data", name))
        return self.handle.get_tensor(name)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return root, {name: make(root) for name, make in synthetic.MAKERS.items()}


def report_text(root, directory, **kwargs):
    return scan(directory, **kwargs).text().replace(str(root), "<tmp>") + "\n"


@pytest.mark.parametrize("name", EXPECTED)
def test_the_report_of_each_synthetic_checkpoint_is_exact(checkpoints, name):
    root, made = checkpoints
    assert report_text(root, made[name]) == EXPECTED[name]


def test_the_docs_quote_the_reports_the_scan_gives():
    page = (REPO / "docs" / "checkpoints.md").read_text()
    for name, text in EXPECTED.items():
        assert text in page, f"docs/checkpoints.md does not quote the {name} report as it is"


FUSED_SHARDS = {"gate_proj", "up_proj", "q_a_proj", "kv_a_proj_with_mqa", "wk", "weights_proj",
                "q_proj", "k_proj", "v_proj", "b_proj", "f_a_proj", "g_a_proj"}


@pytest.mark.parametrize("name", EXPECTED)
def test_every_header_then_only_the_fused_groups_global_scales_are_read(checkpoints, name):
    _, made = checkpoints
    opener = RecordingOpener()
    report = scan(made[name], opener=opener)
    every = opener.headers
    assert len(every) == report.tensors and len(set(every)) == len(every)  # each header once
    first_data = [what for what, _ in opener.events].index("data")
    assert set(opener.headers[:first_data]) == set(every)  # every header before any data
    scale_param = report.experts.scale_param
    scales = sorted(tensor for tensor in every if tensor.endswith("." + scale_param)
                    and tensor.split(".")[-2] in FUSED_SHARDS)
    assert sorted(opener.read) == scales and len(scales) == SCALES_READ[name]
    assert report.scale_tensors_read == SCALES_READ[name] == len(set(opener.read))
    assert not [tensor for tensor in opener.read
                if tensor.endswith((".weight", ".weight_packed", ".weight_scale"))]


def test_the_compressed_tensors_global_scale_is_taken_as_the_reciprocal(checkpoints,
                                                                         monkeypatch):
    """Layer 1 expert 2 stores global up = global gate / 4: its up half decodes with 4x the
    gate's scale (up/gate 4). Taking the stored value as the decode scale (the reciprocal
    mistaken) reports 1/4, and the exact report no longer matches."""
    root, made = checkpoints
    experts = scan(made["compressed-tensors"]).experts
    assert (experts.differ, experts.pairs, experts.largest_ratio) == (2, 8, 4.0)
    assert (experts.largest_at, experts.up_over_gate_at_largest) == (
        "model.layers.1.mlp.experts.2", 4.0)
    monkeypatch.setitem(checkpoint_scan.GLOBAL_SCALE, "compressed-tensors",
                        ("weight_global_scale", False))
    mistaken = scan(made["compressed-tensors"])
    assert mistaken.experts.up_over_gate_at_largest == 0.25
    assert report_text(root, made["compressed-tensors"]) != COMPRESSED_TENSORS


def test_modelopt_scales_are_compared_as_stored(checkpoints, monkeypatch):
    """ModelOpt's weight_scale_2 is the decode scale itself: layer 2 expert 0 has up = gate / 4.
    Taking it as a reciprocal would say up/gate 4."""
    _, made = checkpoints
    experts = scan(made["modelopt-unequal"]).experts
    assert (experts.differ, experts.largest_ratio, experts.largest_at,
            experts.up_over_gate_at_largest) == (3, 4.0, "model.layers.2.mlp.experts.0", 0.25)
    monkeypatch.setitem(checkpoint_scan.GLOBAL_SCALE, "modelopt", ("weight_scale_2", True))
    assert scan(made["modelopt-unequal"]).experts.up_over_gate_at_largest == 4.0


def test_the_fix_each_checkpoint_needs(checkpoints):
    _, made = checkpoints
    fixes = {name: scan(path).fix for name, path in made.items()}
    assert (fixes["modelopt-unequal"].needed, fixes["modelopt-unequal"].from_layer) == (True, 8)
    assert (fixes["nvidia-like"].needed, fixes["nvidia-like"].from_layer) == (False, None)
    assert (fixes["compressed-tensors"].needed,
            fixes["compressed-tensors"].from_layer) == (True, None)
    # layer v8 corrects ModelOpt's merged linears (v8_linear_scales) as it does the experts
    assert (fixes["modelopt-merged"].needed, fixes["modelopt-merged"].from_layer) == (True, 8)


def test_layer_ranges():
    assert layer_ranges({45, 0, 2, 1}) == "0-2, 45"
    assert layer_ranges({3}) == "3"
    assert layer_ranges(set()) == ""


def cli(*args, python=sys.executable, env=None):
    return subprocess.run([python, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=HANG_GUARD_S, check=False, env=env)


def test_the_command_prints_one_json_object_and_its_progress(checkpoints):
    root, made = checkpoints
    result = cli(made["modelopt-unequal"], "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["fix"] == scan(made["modelopt-unequal"]).fix.to_json()
    assert doc["routed_experts"]["differ"] == 3 and doc["format"]["producer_version"] == "0.45.0"
    assert doc["summary"] == (
        "ModelOpt NVFP4 (modelopt 0.45.0); modules 24 NVFP4, 20 BF16; gate/up weight_scale_2 "
        "differ in 3 of 8 routed experts, largest ratio 4 at model.layers.2.mlp.experts.0 "
        "(decode scale up/gate 0.25); no NVFP4 merged linears")
    assert [kind["kind"] for kind in doc["fused_groups"]] == [
        "experts", "shared_gate_up", "dense_gate_up", "mla_qkv_a", "indexer_wk", "kda_in_proj"]
    assert "scan-checkpoint: read 2/2 shards (model-00002-of-00002.safetensors)" in result.stderr
    assert ("scan-checkpoint: read 2/2 shards' global scales (model-00002-of-00002.safetensors)"
            in result.stderr)


def test_help_and_a_bad_argument_touch_nothing(tmp_path):
    """Under a python without safetensors, anything past the arguments would build the tool
    environment in GLM53_RECIPE_CACHE; -h and a refused argument leave it empty."""
    bare = os.path.realpath(sys.executable)  # the venv's base interpreter, without its packages
    cache = tmp_path / "cache"
    cache.mkdir()
    env = {"PATH": os.environ.get("PATH", ""), "GLM53_RECIPE_CACHE": str(cache), "HOME": str(tmp_path)}
    shown = cli("--help", python=bare, env=env)
    assert shown.returncode == 0 and "scan-checkpoint" in shown.stdout and shown.stderr == ""
    refused = cli(tmp_path, "--weights", python=bare, env=env)
    assert refused.returncode == 2
    assert refused.stderr == ("scan-checkpoint: unrecognized arguments: --weights; see "
                              "scripts/scan-checkpoint --help\n")
    assert list(cache.iterdir()) == []


def _config(directory, **extra):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"architectures": ["X"], **extra}))
    return directory


def test_refusals_name_the_file_and_what_to_do(tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    cases = {
        bare: f"{bare}/config.json: missing; pass the checkpoint directory that holds "
              "config.json and its *.safetensors shards",
        _config(tmp_path / "no-shards"): f"{tmp_path}/no-shards: no *.safetensors shards; pass "
                                         "the checkpoint directory that holds them",
    }
    broken = _config(tmp_path / "broken")
    (broken / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    cases[broken] = f"{broken}/model.safetensors: unreadable safetensors header ("
    indexed = _config(tmp_path / "indexed")
    (indexed / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a.weight": "model-00001-of-00002.safetensors"}}))
    cases[indexed] = (f"{indexed}/model-00001-of-00002.safetensors: named by "
                      "model.safetensors.index.json but missing; finish the download")
    garbled = tmp_path / "garbled"
    garbled.mkdir()
    (garbled / "config.json").write_text("{not json")
    cases[garbled] = f"{garbled}/config.json: not JSON ("
    for directory, line in cases.items():
        with pytest.raises(ScanError) as refused:
            scan(directory)
        assert str(refused.value).startswith(line), str(refused.value)
        result = cli(directory)
        assert result.returncode == 3 and result.stdout == ""
        assert result.stderr.startswith(f"scan-checkpoint: {line}")
        assert result.stderr.count("\n") == 1, result.stderr


def _scale_file(directory, tensor):
    """A one-tensor checkpoint: TENSOR as a global scale of a ModelOpt NVFP4 expert."""
    directory = _config(directory, quantization_config={"quant_method": "modelopt",
                                                        "quant_algo": "NVFP4"})
    name = "model.layers.1.mlp.experts.0.gate_proj.weight_scale_2"
    save_file({name: tensor, name.replace("gate_proj", "up_proj"): torch.tensor(1.0)},
              str(directory / "model.safetensors"))
    return directory, name


def test_a_global_scale_the_scan_cannot_read_is_refused_from_its_header(tmp_path):
    """A BF16 global scale (numpy has no bfloat16) and one of two values are refused naming
    the tensor, from the header, before any data is read."""
    for label, tensor, line in (
            ("bf16", torch.tensor(1.0, dtype=torch.bfloat16),
             "{name} is stored as BF16; the scan reads F16, F32 or F64 global scales"),
            ("two", torch.tensor([1.0, 1.0]),
             "{name} has shape [2], not one global scale; this is not the layout the scan "
             "knows")):
        directory, name = _scale_file(tmp_path / label, tensor)
        opener = RecordingOpener()
        with pytest.raises(ScanError) as refused:
            scan(directory, opener=opener)
        assert not isinstance(refused.value, CheckpointRefused)
        assert str(refused.value) == f"{directory}/model.safetensors: " + line.format(name=name)
        assert opener.read == []


# ----------------------------------------------------------------------------- merged linears


def test_merged_linears_with_unequal_shards_are_reported_per_kind_with_their_ratio(checkpoints):
    """modelopt-merged: layer 0's dense up global is the gate's / 2, layer 1's KDA v_proj the
    others' / 4, layer 2's shared-experts gate twice its up; vLLM keeps the largest, so the
    smaller shard decodes x2, x4, x2."""
    _, made = checkpoints
    report = scan(made["modelopt-merged"])
    kinds = {kind.kind.key: (kind.groups, kind.differ, kind.largest_ratio, kind.largest_at,
                             kind.served_shard, kind.served_factor) for kind in report.fused}
    assert kinds == {
        "experts": (8, 0, None, "", "", None),
        "shared_gate_up": (2, 1, 2.0, "model.layers.2.mlp.shared_experts", "up_proj", 2.0),
        "dense_gate_up": (1, 1, 2.0, "model.layers.0.mlp", "up_proj", 2.0),
        "mla_qkv_a": (1, 0, None, "", "", None),
        "indexer_wk": (1, 0, None, "", "", None),
        "kda_in_proj": (2, 1, 4.0, "model.layers.1.self_attn", "v_proj", 4.0)}
    assert report.summary().endswith(
        "; gate/up weight_scale_2 equal in all 8 routed experts; merged linears: shared experts "
        "gate_up 1 of 2 groups unequal (largest ratio 2), dense MLP gate_up 1 of 1 group unequal "
        "(largest ratio 2), MLA fused_qkv_a 0 of 1 group unequal, indexer wk_weights 0 of 1 "
        "group unequal, KDA in_proj_qkvbfg_a 1 of 2 groups unequal (largest ratio 4)")


def test_the_kept_scale_of_a_merged_linear_is_vllms(checkpoints, monkeypatch):
    """Were vLLM's kept global the smallest (compressed-tensors' choice, in decode scales)
    rather than ModelOpt's largest, the other shard would be the one served off, by 1/ratio:
    the report says so, and no longer matches."""
    root, made = checkpoints
    monkeypatch.setitem(checkpoint_scan.LINEAR_KEEPS, "modelopt", ("smallest", min))
    kda = scan(made["modelopt-merged"]).fused[-1]
    assert (kda.largest_ratio, kda.served_shard, kda.served_factor) == (4.0, "q_proj", 0.25)
    assert report_text(root, made["modelopt-merged"]) != MODELOPT_MERGED


def test_a_compressed_tensors_merged_linear_keeps_the_smallest_decode_scale(tmp_path):
    """compressed-tensors stores the reciprocal; vLLM keeps 1 / its largest stored value: the
    shard with the larger decode scale (gate, 1 / (G / 2)) is served at half of it."""
    directory = _config(tmp_path / "ct-dense", quantization_config={
        "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"})
    tensors = {}
    for shard, stored in (("gate_proj", 0.5), ("up_proj", 1.0)):
        for param, tensor in synthetic.ct_nvfp4(16, 32, 1.0).items():
            tensors[f"model.layers.0.mlp.{shard}.{param}"] = tensor
        tensors[f"model.layers.0.mlp.{shard}.weight_global_scale"] = torch.tensor([stored])
    save_file(tensors, str(directory / "model.safetensors"))
    dense = scan(directory).fused[2]
    assert (dense.keeps, dense.differ, dense.largest_ratio, dense.served_shard,
            dense.served_factor) == ("smallest", 1, 2.0, "gate_proj", 0.5)


def test_equal_globals_in_every_fused_group_are_clean(tmp_path):
    directory = synthetic.modelopt_merged(tmp_path, equal=True)
    report = scan(directory)
    assert [(kind.groups, kind.differ) for kind in report.fused] == [
        (8, 0), (2, 0), (1, 0), (1, 0), (1, 0), (2, 0)]
    assert report.fix.to_json() == {"needed": False, "from_layer": None, "says": (
        "nothing to fix: every fused group's global scales are equal")}
    assert report.text().count(", all equal") == 5


MISSING = "is missing, while its fused partner {partner} is in {where}; vLLM would serve {fused} "
UNINITIALISED = ("with an uninitialised global scale (torch.empty): re-download the checkpoint, "
                 "or use one exported with every half's global scale")


@pytest.mark.parametrize("drop, missing, partner, fused", [
    # a routed expert's up global alone
    (("model.layers.1.mlp.experts.0.up_proj.weight_scale_2",),
     "model.layers.1.mlp.experts.0.up_proj.weight_scale_2",
     "model.layers.1.mlp.experts.0.gate_proj.weight_scale_2", "model.layers.1.mlp.experts.0.w13"),
    # a whole up_proj of a shared expert
    (tuple(f"model.layers.2.mlp.shared_experts.up_proj.{param}"
           for param in ("weight", "weight_scale", "weight_scale_2")),
     "model.layers.2.mlp.shared_experts.up_proj.weight_scale_2",
     "model.layers.2.mlp.shared_experts.gate_proj.weight_scale_2",
     "model.layers.2.mlp.shared_experts.gate_up_proj"),
    # q_proj's global with no k_proj's or v_proj's
    (("model.layers.1.self_attn.k_proj.weight_scale_2",
      "model.layers.1.self_attn.v_proj.weight_scale_2"),
     "model.layers.1.self_attn.k_proj.weight_scale_2",
     "model.layers.1.self_attn.q_proj.weight_scale_2", "model.layers.1.self_attn.in_proj_qkvbfg_a"),
    # the MLA's q_a_proj global
    (("model.layers.0.self_attn.q_a_proj.weight_scale_2",),
     "model.layers.0.self_attn.q_a_proj.weight_scale_2",
     "model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_2",
     "model.layers.0.self_attn.fused_qkv_a_proj"),
])
def test_a_fused_half_without_its_global_is_refused_before_any_data(tmp_path, drop, missing,
                                                                      partner, fused):
    directory = synthetic.modelopt_merged(tmp_path, drop=drop)
    where = json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"][
        partner]
    line = (f"{directory}: {missing} " + MISSING.format(partner=partner, where=where, fused=fused)
            + UNINITIALISED)
    opener = RecordingOpener()
    with pytest.raises(CheckpointRefused) as refused:
        scan(directory, opener=opener)
    assert str(refused.value) == line
    assert opener.read == []  # refused on the headers
    result = cli(directory)
    assert (result.returncode, result.stdout) == (4, "")
    assert result.stderr.splitlines()[-1] == f"scan-checkpoint: {line}"
    assert not [said for said in result.stderr.splitlines()[:-1] if "read" not in said]


def test_an_nvfp4_group_with_no_global_at_all_is_refused(tmp_path):
    directory = synthetic.modelopt_merged(tmp_path, drop=(
        "model.layers.0.mlp.gate_proj.weight_scale_2", "model.layers.0.mlp.up_proj.weight_scale_2"))
    with pytest.raises(CheckpointRefused) as refused:
        scan(directory)
    assert str(refused.value) == (
        f"{directory}: model.layers.0.mlp.gate_proj.weight_scale_2 is missing from this NVFP4 "
        "group: no half of it has its global scale; vLLM would serve "
        f"model.layers.0.mlp.gate_up_proj {UNINITIALISED}")


def test_a_lone_kv_a_proj_is_not_fused_where_the_model_has_no_q_lora_rank(tmp_path):
    """vLLM builds fused_qkv_a_proj only with a q_lora_rank; without one kv_a_proj_with_mqa is
    a linear of its own, and a checkpoint without q_a_proj is no unpaired half."""
    no_q_a = tuple(f"model.layers.0.self_attn.q_a_proj.{param}"
                   for param in ("weight", "weight_scale", "weight_scale_2"))
    lone = synthetic.modelopt_merged(tmp_path, "no-q-lora", drop=no_q_a,
                                     config={"q_lora_rank": None})
    mla = scan(lone).fused[3]
    assert (mla.kind.key, mla.groups) == ("mla_qkv_a", 0)
    with pytest.raises(CheckpointRefused, match="q_a_proj.weight_scale_2 is missing, while"):
        scan(synthetic.modelopt_merged(tmp_path, "q-lora", drop=no_q_a))


@pytest.mark.parametrize("value, said", [(float("nan"), "nan"), (float("inf"), "inf"),
                                         (0.0, "0.0"), (-2.0 ** -10, "-0.0009765625")])
@pytest.mark.parametrize("tensor, fused", [
    ("model.layers.0.mlp.up_proj.weight_scale_2", "model.layers.0.mlp.gate_up_proj"),
    ("model.layers.2.mlp.experts.3.gate_proj.weight_scale_2", "model.layers.2.mlp.experts.3.w13"),
])
def test_a_global_that_is_nan_infinite_zero_or_negative_is_refused(tmp_path, value, said,
                                                                   tensor, fused):
    directory = synthetic.modelopt_merged(tmp_path, scales={tensor: value})
    shard = json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"][
        tensor]
    with pytest.raises(CheckpointRefused) as refused:
        scan(directory)
    assert str(refused.value) == (
        f"{directory}/{shard}: {tensor} is {said}, not a finite positive global scale; vLLM "
        f"would decode its part of {fused} with it: the checkpoint is damaged, re-download this "
        "shard")


def test_the_docs_quote_the_refusals(tmp_path):
    page = (REPO / "docs" / "checkpoints.md").read_text()
    for name, plant in {
            "expert": {"drop": ("model.layers.1.mlp.experts.0.up_proj.weight_scale_2",)},
            "kda": {"drop": ("model.layers.1.self_attn.k_proj.weight_scale_2",
                             "model.layers.1.self_attn.v_proj.weight_scale_2")},
            "nan": {"scales": {"model.layers.0.mlp.up_proj.weight_scale_2": float("nan")}}}.items():
        directory = synthetic.modelopt_merged(tmp_path, name, **plant)
        with pytest.raises(CheckpointRefused) as refused:
            scan(directory)
        line = f"scan-checkpoint: {refused.value}".replace(str(directory), "/models/glm")
        assert line in page, f"docs/checkpoints.md does not quote the {name} refusal as it is"


def test_the_command_refuses_a_nan_global_in_one_line(tmp_path):
    tensor = "model.layers.1.self_attn.g_a_proj.weight_scale_2"
    result = cli(synthetic.modelopt_merged(tmp_path, scales={tensor: float("nan")}))
    assert (result.returncode, result.stdout) == (4, "")
    refused = result.stderr.splitlines()[-1]
    assert refused.startswith("scan-checkpoint: ") and f": {tensor} is nan, not a " in refused
