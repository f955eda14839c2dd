"""The checkpoint scan (recipekit/checkpoint_scan.py, scripts/scan-checkpoint) on three tiny
checkpoints made here (tests/unit/synthetic_checkpoints.py): its exact report, that it reads
no weight tensor, that a reciprocal taken the wrong way shows, and its one-line refusals."""

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
from recipekit.checkpoint_scan import ScanError, layer_ranges, scan
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
fix: corrected on this recipe's chain images from layer v8 on (its fold of each half's global scale into the block scales of ModelOpt's NVFP4 fused MoE); any other image decodes the up half off by up/gate
"""

NVIDIA_LIKE = """\
checkpoint: <tmp>/nvidia-like
format: ModelOpt NVFP4 (quant_algo NVFP4, modelopt 0.47.0, declared in config.json quantization_config)
read: 3 shard(s), 146 tensor headers, 16 scale tensors (no weights)
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
fix: nothing to fix: every routed expert's gate and up global scales are equal
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
fix: not corrected by any image of this recipe: vLLM's compressed-tensors NVFP4 MoE keeps the gate's global scale for both halves, and layer v8's fold covers ModelOpt's path only
"""

EXPECTED = {"modelopt-unequal": MODELOPT_UNEQUAL, "nvidia-like": NVIDIA_LIKE,
            "compressed-tensors": COMPRESSED_TENSORS}


class RecordingOpener:
    """safe_open as the scan uses it, noting every tensor whose data is asked for."""

    def __init__(self):
        self.read: list[str] = []
        self.headers: list[str] = []

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
        self.record.headers.append(name)
        return self.handle.get_slice(name)

    def get_tensor(self, name):
        self.record.read.append(name)
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


def expert_scale_names(report_json, made_tensors):
    return sorted(name for name in made_tensors
                  if checkpoint_scan._EXPERT_HALF.fullmatch(name)
                  and name.endswith("." + report_json["routed_experts"]["scale_param"]))


@pytest.mark.parametrize("name", EXPECTED)
def test_only_the_experts_gate_and_up_global_scales_are_read(checkpoints, name):
    _, made = checkpoints
    opener = RecordingOpener()
    report = scan(made[name], opener=opener)
    every = sorted(opener.headers)
    scales = sorted(tensor for tensor in every
                    if tensor.endswith((".gate_proj.weight_scale_2", ".up_proj.weight_scale_2",
                                        ".gate_proj.weight_global_scale",
                                        ".up_proj.weight_global_scale"))
                    and ".experts." in tensor and ".shared_experts." not in tensor)
    assert len(every) == report.tensors and len(set(every)) == len(every)  # each header once
    assert sorted(opener.read) == scales and len(scales) == 16  # 8 experts x gate, up
    assert report.scale_tensors_read == 16
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
        "(decode scale up/gate 0.25)")
    assert "scan-checkpoint: read 2/2 shards (model-00002-of-00002.safetensors)" in result.stderr


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


def test_a_global_scale_the_scan_cannot_read_is_refused(tmp_path):
    """A BF16 global scale (numpy has no bfloat16) is refused naming the tensor, not guessed."""
    directory = _config(tmp_path / "bf16-scale", quantization_config={
        "quant_method": "modelopt", "quant_algo": "NVFP4"})
    name = "model.layers.1.mlp.experts.0.gate_proj.weight_scale_2"
    save_file({name: torch.tensor(1.0, dtype=torch.bfloat16)}, str(directory / "model.safetensors"))
    with pytest.raises(ScanError, match=rf"model.safetensors: {name} cannot be read as a float "
                                        "array .*the scan reads F16, F32 or F64 global scales"):
        scan(directory)
