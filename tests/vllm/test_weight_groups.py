"""v13's weight groups on the pinned release trees: every group resolves to the Glm5Next
model code's linears (the seed's list, per layer type), the drafter group to DFlash2's; the
change applies where both exist and refuses drift in a module name or a signature; and
(CPU torch) quantize-and-pack through vLLM's own code round-trips real-shaped weights
within each format's error bound, NVFP4's searched block scales err less than amax's overall and
more in no block and are packed as vLLM's dequantize_to_dtype reads them, and the swapped layer
holds exactly what vLLM's schemes register."""

import ast
import json
import os
import shutil
import sys

import pytest

from recipekit.layers import run_layer
from recipekit.layers.v13_weights import (
    HELPER,
    HELPER_SOURCE,
    OWNERS,
    TARGET,
    attribute_classes,
    build,
    owner_file,
    resolved_owners,
)
from recipekit.tree import TreeView
from tests.vllm.conftest import REPO_ROOT, run_python

GLM5NEXT_RELEASES = ("0.30.0", "0.33.0", "0.34.0")
# the seed's v13 list: group -> (the layer type that holds it, its linears, the vLLM class
# each is built from); GLM-5.3-Flash has 45 layers, 34 KDA and 11 MLA
SEED_GROUPS = {
    "kda_in": ("Glm5NextLinearAttention",
               {"in_proj_qkvbfg_a": "_Glm5NextMergedColumnParallelLinear"}),
    "kda_o": ("Glm5NextLinearAttention", {"o_proj": "RowParallelLinear"}),
    "mla": ("Glm5NextMLAAttention", {"q_b_proj": "ColumnParallelLinear",
                                     "o_proj": "RowParallelLinear"}),
    "shared": ("Glm5NextMoE", {"shared_experts.gate_up_proj": "MergedColumnParallelLinear",
                               "shared_experts.down_proj": "RowParallelLinear"}),
    "lm_head": ("Glm5NextForCausalLM", {"lm_head": "ParallelLMHead"}),
}
SEED_COUNTS = {"kda_in": 34, "kda_o": 34, "mla": 22, "lm_head": 1}
LAYERS = {"Glm5NextLinearAttention": 34, "Glm5NextMLAAttention": 11, "Glm5NextForCausalLM": 1}


def helper_literal(name: str):
    """A literal assignment of the helper module (it imports vLLM, so it is read, not run)."""
    for node in ast.parse(HELPER_SOURCE.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{HELPER_SOURCE} has no {name}")


def built_from(view: TreeView, owner: str, path: str) -> set[str]:
    """The classes an attribute path of an owner is built from, walking the model code."""
    cls = owner
    for part in path.split("."):
        source_file = owner_file(view, OWNERS[cls][0])
        tree = ast.parse(view.read_text(source_file))
        node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
        built = attribute_classes(node).get(part, set())
        cls = next(iter(built & set(OWNERS)), None) or next(iter(built), "")
    return built


@pytest.mark.parametrize("version", GLM5NEXT_RELEASES)
def test_every_group_resolves_to_the_seeds_linears(release, version):
    view = TreeView(release(version))
    groups = helper_literal("GROUPS")
    assert set(groups) == set(SEED_GROUPS)
    resolved_owners(view)  # refuses on any drift
    for group, (owner, linears) in SEED_GROUPS.items():
        assert groups[group] == (owner, tuple(linears)), group
        for path, linear in linears.items():
            assert linear in built_from(view, owner, path), (group, path)
    # the decoder layer holds one attention of each kind, and the MoE its shared experts
    layer_file = owner_file(view, OWNERS["Glm5NextMoE"][0])
    decoder = next(n for n in ast.parse(view.read_text(layer_file)).body
                   if isinstance(n, ast.ClassDef) and n.name == "Glm5NextDecoderLayer")
    assert attribute_classes(decoder)["self_attn"] == {"Glm5NextLinearAttention",
                                                       "Glm5NextMLAAttention"}
    # linears per model: per layer type times the layers of that type
    for group, count in SEED_COUNTS.items():
        owner, linears = SEED_GROUPS[group]
        assert LAYERS[owner] * len(linears) == count


@pytest.mark.parametrize("version", ["0.30.0"])
def test_drafter_group_resolves_to_dflash2s_linears(release, version):
    view = TreeView(release(version))
    draft = helper_literal("DRAFT_OWNERS")
    assert helper_literal("DRAFT_ROOTS") == ("DFlash2Qwen3ForCausalLM",)
    assert built_from(view, "DFlashQwen3Attention", "qkv_proj") == {"QKVParallelLinear"}
    assert built_from(view, "DFlashQwen3Attention", "o_proj") == {"RowParallelLinear"}
    assert built_from(view, "Qwen2MLP", "gate_up_proj") == {"MergedColumnParallelLinear"}
    assert built_from(view, "DFlashQwen3Model", "fc") == {"ReplicatedLinear"}
    assert draft == {"DFlashQwen3Attention": ("qkv_proj", "o_proj"),
                     "Qwen2MLP": ("gate_up_proj", "down_proj"), "DFlash2Qwen3Model": ("fc",)}
    # the drafter's decoder layer builds its attention and MLP from those classes
    source = view.read_text("vllm/model_executor/models/qwen3_dflash.py")
    layer = next(n for n in ast.parse(source).body
                 if isinstance(n, ast.ClassDef) and n.name == "DFlashQwen3DecoderLayer")
    have = attribute_classes(layer)
    assert have["self_attn"] == {"DFlashQwen3Attention"} and have["mlp"] == {"Qwen3MLP"}
    assert "from .qwen2 import Qwen2MLP as Qwen3MLP" in source


@pytest.mark.parametrize("version", GLM5NEXT_RELEASES)
def test_change_applies_then_is_already_applied(tree_copy, version):
    root = tree_copy(version)
    result = run_layer(build(), root, import_check="off")
    assert result.outcome == "applied", result.reason
    assert sorted(result.files) == sorted([TARGET, HELPER])
    source = (root / TARGET).read_text()
    assert "@with_weight_groups\ndef process_weights_after_loading(" in source
    assert (root / HELPER).read_text() == HELPER_SOURCE.read_text()
    again = run_layer(build(), root, import_check="off")
    assert again.outcome == "already-applied", again.reason


DRIFTS = [
    ("vllm/models/glm5next/nvidia/attention.py", "self.q_b_proj = ColumnParallelLinear(",
     "self.q_b_proj = ReplicatedLinear(", "Glm5NextMLAAttention.q_b_proj is built from "
                                          "ReplicatedLinear"),
    ("vllm/models/glm5next/nvidia/kda.py", "self.in_proj_qkvbfg_a =", "self.in_proj_qkvbfga =",
     "Glm5NextLinearAttention.in_proj_qkvbfg_a is built from nothing"),
    ("vllm/model_executor/layers/quantization/compressed_tensors/schemes/"
     "compressed_tensors_wNa16.py", "        layer_name: str | None = None,\n",
     "        name: str | None = None,\n", "lacks layer_name"),
    ("vllm/model_executor/layers/quantization/utils/quant_utils.py",
     "def pack_quantized_values_into_int32(\n    w_q: torch.Tensor, wtype: ScalarType, "
     "packed_dim: int = 0",
     "def pack_quantized_values_into_int32(\n    w_q: torch.Tensor, wtype: ScalarType, "
     "dim: int = 0",
     "lacks packed_dim"),
    (TARGET, "def process_weights_after_loading(\n    model: nn.Module, model_config: ModelConfig,"
             " target_device: torch.device\n)",
     "def process_weights_after_loading(\n    model: nn.Module, model_config: ModelConfig\n)",
     "lacks target_device"),
]


@pytest.mark.parametrize("path, old, new, reason", DRIFTS, ids=[d[3][:30] for d in DRIFTS])
def test_drift_is_refused_naming_the_file(tree_copy, path, old, new, reason):
    root = tree_copy("0.30.0")
    target = root / path
    text = target.read_text()
    assert text.count(old) == 1, f"{path}: the drift's anchor is not in 0.30.0"
    target.unlink()  # a hard link into the cache: write a new file instead
    target.write_text(text.replace(old, new))
    result = run_layer(build(), root, check=True, import_check="off")
    assert result.outcome == "refused"
    assert path in result.reason and reason in result.reason, result.reason


def test_bases_without_the_code_are_refused(release):
    assert "no Glm5Next" in run_layer(build(), release("0.28.0"), check=True).reason


torch = pytest.importorskip("torch", reason="the vllm tier needs CPU torch (scripts/test "
                                            "installs it)")


def run_probe(release, name: str) -> dict:
    """A probe of tests/vllm/probes on HELPER_SOURCE with vLLM 0.30.0's tree: its JSON line."""
    result = run_python(
        [sys.executable, str(REPO_ROOT / "tests/vllm/probes" / name), str(HELPER_SOURCE)],
        capture_output=True, text=True, timeout=900, check=False,
        env={**os.environ, "PYTHONPATH": str(release("0.30.0")), "PYTHONDONTWRITEBYTECODE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def roundtrip(release):
    doc = run_probe(release, "weight_groups_roundtrip.py")
    for name in doc["int8"]:
        i8, fp4 = doc["int8"][name], doc["nvfp4"][name]
        print(f"round trip {name}: int8 g64 max/bound {i8['g64']['max_error_over_bound']:.3f} "
              f"rms/weight {i8['g64']['rms_error_over_rms_weight']:.4f}, g128 "
              f"{i8['g128']['max_error_over_bound']:.3f} "
              f"{i8['g128']['rms_error_over_rms_weight']:.4f}; nvfp4 "
              f"{fp4['max_error_over_bound']:.3f} {fp4['rms_error_over_rms_weight']:.4f}")
    return doc


def test_int8_round_trip_within_the_bound_at_both_group_sizes(roundtrip, release):
    assert roundtrip["vllm_file"].startswith(str(release("0.30.0")))
    for name, cases in roundtrip["int8"].items():
        for group, case in cases.items():
            assert case["max_error_over_bound"] <= 1.0, (name, group, case)
            # uniform rounding error: 1/sqrt(12) = 0.289 of a step (plus the bf16 scale's share)
            assert 0.25 < case["rms_error_over_rms_step"] < 0.30, (name, group, case)
            size = int(group[1:])
            n, k4 = case["packed_shape"]
            assert case["scale_shape"] == [n, k4 * 4 // size]
    g64 = [c["g64"]["rms_error_over_rms_weight"] for c in roundtrip["int8"].values()]
    g128 = [c["g128"]["rms_error_over_rms_weight"] for c in roundtrip["int8"].values()]
    assert all(a <= b for a, b in zip(g64, g128))  # smaller groups, finer scales


def test_nvfp4_round_trip_within_the_bound(roundtrip):
    for name, case in roundtrip["nvfp4"].items():
        assert case["max_error_over_bound"] <= 1.0, (name, case)
        # a block scale in FP8 E4M3 (3 mantissa bits) can clip its largest value by < 1/16
        assert case["max_clip_over_block_amax"] < 1 / 16, (name, case)


@pytest.fixture(scope="module")
def scales(release):
    doc = run_probe(release, "nvfp4_scales.py")
    print("NVFP4 round trip, amax -> searched block scales (errors in units of the weights' "
          "RMS; blocks the search changed, all of them to a smaller error; seconds on CPU)")
    for name, case in doc["shapes"].items():
        amax, searched, rms = case["amax"], case["searched"], case["rms_weight"]
        print(f"  {name:20s} RMS {amax['rms_error'] / rms:.4f} -> "
              f"{searched['rms_error'] / rms:.4f}, worst {amax['max_error'] / rms:.3f} -> "
              f"{searched['max_error'] / rms:.3f}, blocks changed {case['scales_changed']} of "
              f"{case['blocks']}, {amax['seconds']:.1f} s -> {searched['seconds']:.1f} s")
    controls = doc["controls"]
    print(f"  controls on {controls['shape']}: nibbles swapped, "
          f"{controls['nibble_swapped_mismatches']} of {controls['weights']} weights read "
          f"otherwise; scales 3 codes up, "
          f"{controls['scale_bumped_blocks_worse']} of {controls['blocks']} blocks worse")
    return doc


def test_nvfp4_searched_scales_err_less_than_amax_and_never_more_in_a_block(scales, release):
    assert scales["vllm_file"].startswith(str(release("0.30.0")))
    for name, case in scales["shapes"].items():
        assert case["blocks_worse"] == 0, (name, case)
        # the search changes a block's scale only for a smaller error
        assert case["blocks_better"] == case["scales_changed"] > case["blocks"] // 4, name
        amax, searched = case["amax"]["rms_error"], case["searched"]["rms_error"]
        assert searched < 0.95 * amax, (name, amax, searched)


def test_nvfp4_packing_is_exactly_what_vllm_reads(scales):
    """Per shape and both scalings: dequantize_to_dtype of the packed tensors equals, to the
    last bit, the chosen E2M1 values (each the nearest to its weight at its block's scale)
    times the scales; the layout is the amax path's (the format vLLM's Marlin FP4 reads)."""
    for name, case in scales["shapes"].items():
        n, k = case["shape"]
        layout = {"weight_packed": [[n, k // 2], "torch.uint8"],
                  "weight_scale": [[n, k // 16], "torch.float8_e4m3fn"],
                  "weight_global_scale": [[1], "torch.float32"]}
        assert case["same_global_scale"], name
        for scaling in ("amax", "searched"):
            assert case[scaling]["layout"] == layout, (name, scaling)
            assert case[scaling]["reader_mismatches"] == 0, (name, scaling)
            assert case[scaling]["not_nearest"] == 0, (name, scaling)
            assert case[scaling]["nearest_checked"] >= min(n * k, 1 << 20), (name, scaling)


def test_nvfp4_checks_catch_a_wrong_packing_and_a_worse_scale(scales):
    """The checks above can fail: the searched result packed high nibble first is read as
    other values, and scales three E4M3 codes up err more in most blocks; the amax path is
    ref_nvfp4_quant's on the whole tensor, as before; the search's rounding is cast_to_fp4's."""
    controls = scales["controls"]
    assert controls["nibble_swapped_mismatches"] > 0
    assert controls["scale_bumped_blocks_worse"] > controls["blocks"] // 2
    assert controls["amax_as_before"]
    assert controls["search_rounding_mismatches"] == 0 and controls["rounding_points"] > 2e6


def test_the_image_refuses_nvfp4_target_groups_unforced_naming_scripts_compare(roundtrip):
    assert roundtrip["nvfp4_refusal"] == (
        "GLM53_TARGET_WEIGHT_FORMAT=nvfp4: NVFP4 on target groups failed the seed's v13 quality "
        "gate on KL; judge it with scripts/compare --candidate TARGET_WEIGHT_FORMAT=nvfp4 on "
        "your Spark; use int8, or set GLM53_FORCE_UNSAFE_WEIGHTS=1")
    assert roundtrip["nvfp4_forced_format"] == "nvfp4"


def test_swap_gives_the_layer_what_vllms_schemes_register(roundtrip):
    int8, fp4 = roundtrip["swap"]["int8"], roundtrip["swap"]["nvfp4"]
    assert int8["params"] == {"weight_packed": [[512, 256], "torch.int32"],
                              "weight_scale": [[512, 8], "torch.bfloat16"],
                              "weight_shape": [[2], "torch.int64"]}
    assert set(fp4["params"]) == {"weight", "weight_scale", "weight_global_scale"}
    assert fp4["params"]["weight"] == [[512, 512], "torch.uint8"]
    assert fp4["params"]["weight_scale"] == [[512, 64], "torch.float8_e4m3fn"]
    for case in (int8, fp4):
        assert case["as_direct"]  # the layer holds what int8_wna16 / nvfp4 (searched) give
        assert case["freed_bytes"] == 512 * 1024 * 2 and not case["has_bf16_weight"]
        assert case["method"] == "CompressedTensorsLinearMethod" and case["kernel_processed"]
    assert int8["scheme"] == "CompressedTensorsWNA16"
    assert fp4["scheme"] == "CompressedTensorsW4A4Fp4"


@pytest.mark.parametrize("scales", ["amax", "searched"])
def test_load_cost_probe_measures_one_scaling(release, scales):
    """tests/vllm/probes/nvfp4_load_cost.py, which docs/quality.md's load-time figure comes
    from, on a small shape: its output is the packed weight, scales and global scale."""
    probe = REPO_ROOT / "tests/vllm/probes/nvfp4_load_cost.py"
    result = run_python(
        [sys.executable, str(probe), str(HELPER_SOURCE), "256", "4096", scales],
        capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "PYTHONPATH": str(release("0.30.0")), "PYTHONDONTWRITEBYTECODE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads(result.stdout.strip().splitlines()[-1])
    assert doc["shape"] == [256, 4096] and doc["scales"] == scales and doc["threads"] == 1
    assert doc["output_bytes"] == 256 * 4096 // 2 + 256 * 4096 // 16 + 4
    assert doc["weight_bytes"] == 256 * 4096 * 2 and doc["seconds"] >= 0


def _helper_importing_compressed_tensors_at_top() -> str:
    """The helper as first written: vLLM's compressed-tensors imports at module top."""
    lines = HELPER_SOURCE.read_text().splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines)
                 if line.startswith("    from vllm.model_executor.layers.quantization.compressed"))
    end = next(i for i in range(start, len(lines)) if lines[i].strip() == "")
    block = [line[4:] for line in lines[start:end]]
    rest = lines[:start] + lines[end:]
    anchor = next(i for i, line in enumerate(rest) if line.startswith("from vllm.logger import"))
    return "".join(rest[:anchor + 1] + block + rest[anchor + 1:])


def test_a_model_module_imports_first_after_the_change(tree_copy, release, tmp_path,
                                                      monkeypatch):
    """vLLM's registry imports a model module first, which reaches model_loader/utils.py
    through the model utilities: the layer's import check does the same, and refuses the
    helper whose top-level quantization imports closed a cycle there (every model failed to
    import on vLLM 0.30.0's CUDA build)."""
    from recipekit.layers import v13_weights

    root = tree_copy("0.30.0")
    result = run_layer(build(), root, import_check="on")
    assert result.outcome == "applied", result.reason
    assert "import vllm.model_executor.models.utils" not in result.reason
    cyclic = tmp_path / "weight_groups.py"
    cyclic.write_text(_helper_importing_compressed_tensors_at_top())
    monkeypatch.setattr(v13_weights, "HELPER_SOURCE", cyclic)
    monkeypatch.setattr(v13_weights.WeightGroups, "helper_source", cyclic)
    second = tmp_path / "second"
    shutil.copytree(release("0.30.0"), second, copy_function=os.link)
    result = run_layer(v13_weights.build(), second, import_check="on")
    assert result.outcome == "refused", result.reason
    assert "import vllm.model_executor.models.utils failed" in result.reason
    assert "circular import" in result.reason
