"""What upstream fixed after 0.28.0 for DFlash, checked on the real release trees.

- #54282 (the salted draft Gumbel stream, in 0.30.0): v9 carries it onto 0.28.0 and the
  fork shape, generated from 0.30.0 and pinned; every call of vLLM's Gumbel samplers in
  the patched tree says whether it drafts, drafts saying yes and the target no. On the
  noise itself (tests/vllm/probes/gumbel_streams.py, the trees' own gumbel.py in Triton's
  interpreter): 0.28.0 as released gives a draft the target's noise, v9 gives it its own
  and leaves the target's as it was, and one speculative step's tokens fit the target's
  distribution (chi-square, alpha 0.001) with v9 and not without.
- #54374 (FlashAttention's ahead-of-time split schedule off for a sliding-window DFlash
  drafter, in 0.30.0's DFlash speculator): not carried, because on sm_121 the path cannot
  be taken: FlashAttentionMetadataBuilder schedules ahead of time only under FA3, and
  vLLM's own version choice never gives FA3 to a device of major 12.
"""

import ast
import json
import math
import os
import shutil
import sys
import types

import pytest

from recipekit.backport import load_manifest, salt_diff_file_name, salt_shapes, sha256_text
from tests.vllm.conftest import REPO_ROOT, patch_layer, run_python, tree_digest

GUMBEL_CALLS = {"gumbel_sample": "is_drafting", "gumbel_block_argmax": "IS_DRAFTING",
                "gumbel_noised_argmax": "IS_DRAFTING"}
# Where a call draws: True for a drafter's proposal, False for the target's sample or resample.
DRAFTS = {
    "vllm/v1/worker/gpu/spec_decode/speculator.py": True,
    "vllm/v1/worker/gpu/spec_decode/dflash2/speculator.py": True,
    "vllm/v1/worker/gpu/spec_decode/dspark/speculator.py": True,
    "vllm/v1/worker/gpu/sample/sampler.py": False,
    "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py": False,
}
FA_UTILS = "vllm/v1/attention/backends/fa_utils.py"
FLASH_ATTN = "vllm/v1/attention/backends/flash_attn.py"
DFLASH_SPECULATOR = "vllm/v1/worker/gpu/spec_decode/dflash/speculator.py"


def patch_v9(root, diff_dir, *extra):
    return patch_layer("v9", root, "--diff", str(diff_dir), *extra)


@pytest.fixture(scope="module")
def salted(tmp_path_factory, release, diff_dir):
    """{base: tree with v9 applied} for the bases where v9 carries the salt."""
    trees = {}
    for base in ("0.28.0", "fork"):
        root = tmp_path_factory.mktemp(f"salt-{base}") / "tree"
        shutil.copytree(release(base), root, copy_function=os.link)
        code, report, stderr = patch_v9(root, diff_dir, "--import-check", "on")
        assert code == 0 and report["outcome"] == "applied", (report, stderr)
        trees[base] = (root, report)
    return trees


def gumbel_calls(root):
    """[(file, callee, the drafting keyword's value or None)] for every call in vllm/v1."""
    found = []
    for path in sorted((root / "vllm" / "v1").rglob("*.py")):
        relative = str(path.relative_to(root))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in GUMBEL_CALLS:
                keyword = GUMBEL_CALLS[ast.unparse(node.func)]
                value = next((k.value for k in node.keywords if k.arg == keyword), None)
                if value is not None:
                    value = value.value if isinstance(value, ast.Constant) else ast.unparse(value)
                found.append((relative, ast.unparse(node.func), value))
    return found


def test_the_salt_diffs_are_pinned_and_taken_from_0_30_0(release, diff_dir):
    manifest = load_manifest()
    salt = manifest["draft_noise_salt"]
    assert salt["pr"] == 54282 and salt["source"] == "0.30.0"
    own = {line for entries in salt["recipe_insertions"].values() for entry in entries for line in entry["lines"]}
    assert own == {"        IS_DRAFTING=False,", "                    is_drafting=True,"}
    for shape in salt_shapes(manifest):
        text = (diff_dir / salt_diff_file_name(shape)).read_text()
        assert sha256_text(text) == salt["diff_sha256"][shape]
        current = None
        for line in text.splitlines():
            if line.startswith("+++ b/"):
                current = (release("0.30.0") / line[6:]).read_text().splitlines()
            elif line.startswith("+") and not line.startswith("+++"):
                assert line[1:] in current or line[1:] in own, (shape, line)
            elif line.startswith("-") and not line.startswith("---"):
                raise AssertionError(f"{shape}: the salt only adds lines, yet removes {line!r}")


@pytest.mark.parametrize("base", ["0.28.0", "fork"])
def test_v9_salts_every_draw_and_only_the_drafts(salted, release, base):
    root, report = salted[base]
    assert "draft-noise salt (PR #54282)" in report["reason"]
    unsalted = gumbel_calls(release(base))
    assert any(value is None for _, _, value in unsalted)  # the tree as released does not say
    calls = gumbel_calls(root)
    assert len(calls) >= len(unsalted) >= 5  # the fork shape gains DFlash2's own calls
    for relative, callee, value in calls:
        expected = DRAFTS.get(relative, "passed on")
        if relative == "vllm/v1/worker/gpu/sample/gumbel.py":
            assert value == "IS_DRAFTING" or value == "is_drafting", (callee, value)
        else:
            assert value is expected, (relative, callee, value)
    gumbel = (root / "vllm/v1/worker/gpu/sample/gumbel.py").read_text()
    assert "_DRAFT_NOISE_SALT = tl.constexpr(1 << 30)" in gumbel
    assert "        if IS_DRAFTING:\n            pos = pos + _DRAFT_NOISE_SALT\n        gumbel_seed = tl.randint(seed, pos)" in gumbel
    assert gumbel.count("tl.randint(") == 1  # one draw site, so the salt reaches every draw


@pytest.mark.parametrize("base", ["0.28.0", "fork"])
def test_salted_trees_are_already_applied_on_a_second_run(salted, diff_dir, base):
    root, _ = salted[base]
    before = tree_digest(root)
    code, report, _ = patch_v9(root, diff_dir)
    assert (code, report["outcome"]) == (0, "already-applied")
    assert tree_digest(root) == before


@pytest.mark.parametrize("version", ["0.30.0", "0.33.0"])
def test_bases_with_the_salt_provide_it(release, diff_dir, version):
    code, report, _ = patch_v9(release(version), diff_dir, "--check")
    assert (code, report["outcome"]) == (0, "provided-by-base")
    assert "_DRAFT_NOISE_SALT, PR #54282" in report["reason"]


def test_a_missing_salt_diff_in_the_diff_directory_is_a_setup_error(tree_copy, diff_dir, tmp_path):
    partial = tmp_path / "partial"
    shutil.copytree(diff_dir, partial)
    (partial / salt_diff_file_name("release")).unlink()
    code, _, stderr = patch_v9(tree_copy("0.28.0"), partial, "--check")
    assert code == 2
    assert "draft-noise-salt-release.diff: cannot read the diff" in stderr


# --- #54374 -------------------------------------------------------------------------


def test_54374_landed_in_0_30_0s_dflash_speculator(release):
    fix = "builder.aot_schedule = False"
    for version in ("0.30.0", "0.33.0"):
        source = (release(version) / DFLASH_SPECULATOR).read_text()
        assert fix in source and "get_kv_cache_spec_sliding_window(builder.kv_cache_spec)" in source, version
    for version in ("0.27.1", "0.28.0", "fork"):
        assert fix not in (release(version) / DFLASH_SPECULATOR).read_text(), version


def _aot_schedule_rule(root):
    """The expression FlashAttentionMetadataBuilder.__init__ assigns to self.aot_schedule."""
    tree = ast.parse((root / FLASH_ATTN).read_text())
    builder = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "FlashAttentionMetadataBuilder")
    init = next(n for n in builder.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    rules = [ast.unparse(n.value) for n in ast.walk(init) if isinstance(n, ast.Assign)
             and [ast.unparse(t) for t in n.targets] == ["self.aot_schedule"]]
    assert len(rules) == 1
    return rules[0]


def _flash_attn_version(root, monkeypatch, major, minor, configured):
    """vLLM's own get_flash_attn_version of ``root``, run on a stated device capability with
    every FlashAttention version reported supported and ``configured`` set in the config."""
    tree = ast.parse((root / FA_UTILS).read_text())
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name != "is_fa_version_supported"]
    silent = types.SimpleNamespace(warning_once=lambda *a, **k: None, info_once=lambda *a, **k: None,
                                   error=lambda *a, **k: None, warning=lambda *a, **k: None)
    platform = types.SimpleNamespace(
        is_xpu=lambda: False, is_rocm=lambda: False, is_cuda=lambda: True,
        get_device_capability=lambda: types.SimpleNamespace(major=major, minor=minor),
        is_device_capability_family=lambda family: major * 10 + minor >= family,
    )
    namespace = {"current_platform": platform, "logger": silent, "Any": object,
                 "envs": types.SimpleNamespace(VLLM_BATCH_INVARIANT=False),
                 "is_quantized_kv_cache": lambda dtype: False}
    exec(compile(ast.Module(body=functions, type_ignores=[]), str(root / FA_UTILS), "exec"), namespace)
    interface = types.ModuleType("vllm.vllm_flash_attn.flash_attn_interface")
    interface.is_fa_version_supported = lambda version, *a, **k: True
    interface.fa_version_unsupported_reason = lambda version, *a, **k: None
    config = types.ModuleType("vllm.config")
    vllm_config = types.SimpleNamespace(attention_config=types.SimpleNamespace(flash_attn_version=configured),
                                        model_config=None, cache_config=None)
    config.get_current_vllm_config_or_none = lambda: vllm_config
    monkeypatch.setitem(sys.modules, interface.__name__, interface)
    monkeypatch.setitem(sys.modules, "vllm.config", config)
    namespace["is_fa_version_supported"] = interface.is_fa_version_supported
    return namespace["get_flash_attn_version"](head_size=128)


@pytest.mark.parametrize("version", ["0.27.1", "0.28.0", "fork", "0.30.0"])
def test_54374s_path_is_unreachable_on_sm_121(release, monkeypatch, version):
    root = release(version)
    # The drafter's layers are plain attention: on a CUDA device of major 12 vLLM tries
    # FlashAttention first for them (the MLA list is the target's), so the drafter may run on it ...
    cuda = ast.parse((root / "vllm/platforms/cuda.py").read_text())
    priorities = next(n for n in cuda.body if isinstance(n, ast.FunctionDef) and n.name == "_get_backend_priorities")
    branch = next(n for n in priorities.body if isinstance(n, ast.If) and ast.unparse(n.test) == "use_mla")
    plain = ast.Module(body=branch.orelse, type_ignores=[])
    lists = [n.value.elts for n in ast.walk(plain) if isinstance(n, ast.Return) and isinstance(n.value, ast.List)]
    # The last list is the one not for major 10; a starred entry there is for major 9 only.
    first = next(ast.unparse(e) for e in lists[-1] if not isinstance(e, ast.Starred))
    assert first == "AttentionBackendEnum.FLASH_ATTN"
    # ... but its builder schedules ahead of time only under FA3 ...
    assert _aot_schedule_rule(root) == "get_flash_attn_version() == 3"
    # ... which vLLM's version choice never gives sm_121, not even when FA3 is asked for.
    for configured in (None, 2, 3):
        assert _flash_attn_version(root, monkeypatch, 12, 1, configured) != 3, configured
    # The same function does pick FA3 on Hopper: the check above can fail.
    assert _flash_attn_version(root, monkeypatch, 9, 0, None) == 3


# --- #54282 on the noise itself -------------------------------------------------------

GUMBEL_STREAMS = REPO_ROOT / "tests/vllm/probes/gumbel_streams.py"
# One speculative step's target p and draft q, chosen (by simulation) so that a draft and
# a resample sharing one noise vector move 0.066 of p's mass from token 1 to token 0
# (biased [0.366, 0.484, 0.070, 0.080]); every expected count is >= 140 at N = 2000.
STEP_P = [0.30, 0.55, 0.07, 0.08]
STEP_Q = [0.01, 0.37, 0.22, 0.40]
STEP_SEEDS = 2000  # seeds 1..N: the verdict is a fixed number, the same on every run
# The probe draws many seeds a program; these first seeds it also draws one scalar seed a
# program, as vLLM's kernels do, and the two must agree token for token.
ALONE_SEEDS = 16
ALPHA = 0.001
# chi-square's upper ALPHA point with 3 degrees of freedom (checked below by its closed form)
CRITICAL_3DF = 16.266236196238129


def _chi_square_3df_tail(x: float) -> float:
    """P(X > x) for a chi-square X with 3 degrees of freedom."""
    return math.erfc(math.sqrt(x / 2)) + math.sqrt(2 * x / math.pi) * math.exp(-x / 2)


def _streams(label, root, tmp_path):
    request = tmp_path / f"request-{label}.json"
    request.write_text(json.dumps({"seeds": STEP_SEEDS, "noise_seeds": 8,
                                   "alone_seeds": ALONE_SEEDS, "pos": 17,
                                   "p": STEP_P, "q": STEP_Q}))
    result = run_python([sys.executable, str(GUMBEL_STREAMS), str(root), str(request)],
                        capture_output=True, text=True, timeout=900, check=False,
                        env={**os.environ, "TRITON_INTERPRET": "1",
                             "PYTHONDONTWRITEBYTECODE": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["gumbel_file"].startswith(str(root))
    return report


def _chi_square(tokens: list[int]) -> float:
    n = len(tokens)
    counts = [tokens.count(token) for token in range(len(STEP_P))]
    assert sum(counts) == n
    return sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, STEP_P))


@pytest.fixture(scope="module")
def noise_streams(salted, release, tmp_path_factory):
    """The probe's report on 0.28.0 as released and on 0.28.0 with v9."""
    out = tmp_path_factory.mktemp("gumbel-streams")
    return {"released": _streams("released", release("0.28.0"), out),
            "v9": _streams("v9", salted["0.28.0"][0], out)}


def test_the_critical_value_is_chi_squares():
    assert abs(_chi_square_3df_tail(CRITICAL_3DF) - ALPHA) < 1e-12


@pytest.mark.parametrize("base", ["released", "v9"])
def test_the_draft_and_the_resample_draw_at_one_seed_position_and_keys(salted, release, base):
    """What the probe assumes of the call sites: DFlash2's walk draws a draft for position Q
    at Q - 1 keyed by the candidates' token ids, and the resample at the verifier's pos
    (the predecessor's, Q - 1) keyed by token ids (`block`), both with the request's seed."""
    root = release("0.28.0") if base == "released" else salted["0.28.0"][0]
    v1 = root / "vllm/v1/worker/gpu"
    walk = (v1 / "spec_decode/dflash2/speculator.py").read_text()
    assert "position = tl.load(sample_pos_ptr + flat) - 1" in walk
    assert "gumbel_noised_argmax(\n            scores,\n            candidates,\n" in walk
    assert "seed = tl.load(seeds_ptr + req_state, mask=valid, other=0)" in walk
    dflash = (v1 / "spec_decode/dflash/speculator.py").read_text()
    assert "verification keys\n        # Gumbel by the predecessor (Q-1)" in dflash
    resample = (v1 / "spec_decode/rejection_sampler_utils.py").read_text()
    assert "gumbel_block_argmax(\n        residual_logits,\n        block,\n" in resample
    gumbel = (v1 / "sample/gumbel.py").read_text()
    assert "seed = tl.load(seeds_ptr + req_state_idx, mask=is_valid_req, other=0)" in gumbel
    assert "pos = tl.load(pos_ptr + token_idx)" in gumbel


def test_without_the_salt_a_draft_and_its_resample_draw_the_same_noise(noise_streams):
    """0.28.0's gumbel_noised_argmax has no IS_DRAFTING, so a draft and a resample at one
    (seed, pos, keys), which the source check above shows they share, are one call: this
    confirms it at run time; the v9 and chi-square tests below are the ones that can differ."""
    released = noise_streams["released"]
    assert released["salted"] is False
    assert released["draft_noise"] == released["target_noise"]


def test_with_the_salt_the_draft_stream_is_apart_and_the_targets_unchanged(noise_streams):
    released, v9 = noise_streams["released"], noise_streams["v9"]
    assert v9["salted"] is True
    # the target's sampler and resampler draw exactly what 0.28.0 drew: undrafted sampling
    # is untouched by v9
    assert v9["target_noise"] == released["target_noise"]
    draft = [x for row in v9["draft_noise"] for x in row]
    target = [x for row in v9["target_noise"] for x in row]
    assert all(d != t for d, t in zip(draft, target))


@pytest.mark.parametrize("base", ["released", "v9"])
def test_seeds_drawn_together_give_the_tokens_each_seed_gives_alone(noise_streams, base):
    report = noise_streams[base]
    assert len(report["tokens"]) == STEP_SEEDS
    assert len(report["tokens_alone"]) == ALONE_SEEDS
    assert report["tokens"][:ALONE_SEEDS] == report["tokens_alone"]


def test_one_speculative_step_is_lossless_with_the_salt_and_biased_without(noise_streams):
    """The token one step emits, over seeds 1..N, against the target's own p (float64):
    chi-square at ALPHA = 0.001. Without the salt the expected statistic is about 47
    (noncentrality N * 0.0225); the test's power against that bias is 0.997 (simulated:
    20,000 multinomial draws of N from the biased distribution)."""
    with_salt = _chi_square(noise_streams["v9"]["tokens"])
    without = _chi_square(noise_streams["released"]["tokens"])
    assert with_salt < CRITICAL_3DF, f"v9: chi-square {with_salt:.2f} >= {CRITICAL_3DF:.2f}"
    assert without > CRITICAL_3DF, f"0.28.0: chi-square {without:.2f} <= {CRITICAL_3DF:.2f}"
