"""run.sh and the checkpoints: a local MODEL scanned before the ranks start (the real
scripts/scan-checkpoint, run by tests/fakes/fake-docker as the image would, on the synthetic
checkpoints of tests/unit/synthetic_checkpoints.py), and nvidia/GLM-5.3-Flash-NVFP4's known
facts from recipe.toml (its revision check, SPEC=mtp refused)."""

import sys

import pytest

from launcher.plan import scan_verdict
from recipekit import recipe
from tests.unit import synthetic_checkpoints as synthetic
from tests.unit.test_launcher_lifecycle import (
    IMAGE,
    IMAGE_ID,
    WORKER,
    calls,
    containers,
    make_cluster,
    serve,
    started,
)
from tests.unit.test_launcher_support import REPO, dry_run, run, sealed_bin

NVIDIA = "nvidia/GLM-5.3-Flash-NVFP4"
STOCK = "vllm/vllm-openai:latest"
DOCS = (REPO / "docs" / "checkpoints.md").read_text()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return {name: make(root) for name, make in synthetic.MAKERS.items()}


def cluster(tmp_path, images=(IMAGE,)):
    """Two fake nodes holding IMAGES; python3 is this interpreter as invoked (its venv has
    safetensors), so fake-docker runs the real scan."""
    held = {image: {"id": IMAGE_ID, "size": 4096} for image in images}
    state = make_cluster(tmp_path, head_images=held, worker_images=held)
    python = sealed_bin(tmp_path) / "python3"
    python.unlink()
    python.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return state


def serve_local(tmp_path, state, model, **settings):
    return serve(tmp_path, state, MODEL=model, MODEL_REVISION=None, SPEC="off",
                 FAKE_CURL_READY_AFTER=1, **settings)


def scan_calls(state):
    return [call for call in calls(state) if any("scan-checkpoint" in word for word in call["argv"])]


def test_a_modelopt_checkpoint_on_the_chain_image_boots_with_its_summary(tmp_path, checkpoints):
    state = cluster(tmp_path)
    model = checkpoints["modelopt-unequal"]
    result = serve_local(tmp_path, state, model)
    assert result.returncode == 0, result.stderr
    line = (f"glm53: checkpoint {model}: ModelOpt NVFP4 (modelopt 0.45.0); modules 24 NVFP4, "
            "20 BF16; gate/up weight_scale_2 differ in 3 of 8 routed experts, largest ratio 4 at "
            "model.layers.2.mlp.experts.0 (decode scale up/gate 0.25); no NVFP4 merged linears; "
            "glm53-sm121-v13 corrects them (layer v8 and later apply each half's and shard's own "
            "global scale)")
    assert line in result.stdout.splitlines()
    assert line.replace(str(model), "/models/glm") in DOCS
    # on the head only, in the image, offline, the directory read-only, before any rank
    scans = scan_calls(state)
    assert [call["node"] for call in scans] == ["head"]
    argv = scans[0]["argv"]
    assert argv[argv.index("--network") + 1] == "none"
    assert f"type=bind,src={model},dst={model},readonly" in argv
    assert argv[-4:] == [IMAGE, "/opt/glm53-recipe/scripts/scan-checkpoint", str(model), "--json"]
    order = calls(state)
    assert order.index(scans[0]) < order.index(started(state)[0])


def test_equal_scales_boot_with_nothing_to_fix(tmp_path, checkpoints):
    state = cluster(tmp_path)
    model = checkpoints["nvidia-like"]
    result = serve_local(tmp_path, state, model)
    assert result.returncode == 0, result.stderr
    assert (f"glm53: checkpoint {model}: ModelOpt NVFP4 (modelopt 0.47.0); modules 35 BF16, "
            "27 NVFP4; gate/up weight_scale_2 equal in all 8 routed experts; merged linears: dense "
            "MLP gate_up 0 of 1 group unequal; nothing to fix: every fused group's global scales "
            "are equal") in result.stdout.splitlines()


def test_unequal_scales_on_an_image_that_does_not_correct_them_are_refused(tmp_path,
                                                                            checkpoints):
    state = cluster(tmp_path, images=(STOCK,))
    model = checkpoints["modelopt-unequal"]
    result = serve_local(tmp_path, state, model, IMAGE=STOCK, FORCE_STOCK_IMAGE=1)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"refused: MODEL={model}: 3 of 8 routed experts' gate/up global scales differ (largest "
        f"ratio 4), and IMAGE={STOCK} is not a chain image from layer v8 on, which corrects "
        "them: it would serve each such half or shard off by its ratio (corrupt multibyte "
        "text, broken tool calls); accepted: IMAGE=glm53-sm121-v13, or CHECKPOINT_SCAN=warn to "
        "boot anyway"]
    assert f"{STOCK} does not correct them" in result.stdout
    assert started(state) == [] and containers(state, WORKER) == {}


def test_warn_says_it_loudly_and_boots(tmp_path, checkpoints):
    state = cluster(tmp_path, images=(STOCK,))
    model = checkpoints["modelopt-unequal"]
    result = serve_local(tmp_path, state, model, IMAGE=STOCK, FORCE_STOCK_IMAGE=1,
                         CHECKPOINT_SCAN="warn")
    assert result.returncode == 0, result.stderr
    assert (f"glm53: WARNING: MODEL={model}: 3 of 8 routed experts' gate/up global scales differ "
            f"(largest ratio 4), and IMAGE={STOCK} is not a chain image from layer v8 on"
            ) in result.stderr
    assert result.stderr.rstrip().endswith("booting anyway (CHECKPOINT_SCAN=warn)")
    assert len(started(state)) == 2


def test_compressed_tensors_mismatches_are_refused_on_every_image(tmp_path, checkpoints):
    state = cluster(tmp_path)
    model = checkpoints["compressed-tensors"]
    result = serve_local(tmp_path, state, model)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"refused: MODEL={model}: 2 of 8 routed experts' gate/up global scales differ (largest "
        "ratio 4): not corrected by any image of this recipe: vLLM's compressed-tensors NVFP4 "
        "MoE keeps the gate's global scale for both halves, and layer v8's fold covers "
        "ModelOpt's path only; accepted: a checkpoint whose fused halves' global scales are "
        "equal, or CHECKPOINT_SCAN=warn to boot anyway"]
    assert started(state) == []


def test_unequal_merged_linears_boot_on_the_chain_image_and_are_refused_on_another(
        tmp_path, checkpoints):
    """Routed experts equal, three merged linears not: layer v8's v8_linear_scales corrects
    them, so the chain image boots it and a stock image is refused."""
    model = checkpoints["modelopt-merged"]
    merged = ("1 of 2 shared experts gate_up groups' global scales differ (largest ratio 2), and "
              "1 of 1 dense MLP gate_up groups' global scales differ (largest ratio 2), and 1 of "
              "2 KDA in_proj_qkvbfg_a groups' global scales differ (largest ratio 4)")
    (tmp_path / "stock").mkdir()
    (tmp_path / "chain").mkdir()
    state = cluster(tmp_path / "stock", images=(STOCK,))
    result = serve_local(tmp_path / "stock", state, model, IMAGE=STOCK, FORCE_STOCK_IMAGE=1)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"refused: MODEL={model}: {merged}, and IMAGE={STOCK} is not a chain image from layer "
        "v8 on, which corrects them: it would serve each such half or shard off by its ratio "
        "(corrupt multibyte text, broken tool calls); accepted: IMAGE=glm53-sm121-v13, or "
        "CHECKPOINT_SCAN=warn to boot anyway"]
    state = cluster(tmp_path / "chain")
    result = serve_local(tmp_path / "chain", state, model)
    assert result.returncode == 0, result.stderr
    summary = [line for line in result.stdout.splitlines()
               if line.startswith("glm53: checkpoint ")][-1]
    assert summary == (
        f"glm53: checkpoint {model}: ModelOpt NVFP4 (modelopt 0.47.0); modules 52 NVFP4, 10 "
        "BF16; gate/up weight_scale_2 equal in all 8 routed experts; merged linears: shared "
        "experts gate_up 1 of 2 groups unequal (largest ratio 2), dense MLP gate_up 1 of 1 group "
        "unequal (largest ratio 2), MLA fused_qkv_a 0 of 1 group unequal, indexer wk_weights 0 "
        "of 1 group unequal, KDA in_proj_qkvbfg_a 1 of 2 groups unequal (largest ratio 4); "
        "glm53-sm121-v13 corrects them (layer v8 and later apply each half's and shard's own "
        "global scale)")
    assert summary.replace(str(model), "/models/glm") in DOCS
    assert len(started(state)) == 2  # both ranks


def test_a_checkpoint_the_scan_refuses_is_refused_in_one_line(tmp_path):
    state = cluster(tmp_path)
    missing = "model.layers.1.mlp.experts.0.up_proj.weight_scale_2"
    model = synthetic.modelopt_merged(tmp_path, drop=(missing,))
    result = serve_local(tmp_path, state, model)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"refused: MODEL={model}: the checkpoint scan in {IMAGE} refuses it (scan-checkpoint: "
        f"{model}: {missing} is missing, while its fused partner "
        "model.layers.1.mlp.experts.0.gate_proj.weight_scale_2 is in "
        "model-00002-of-00002.safetensors; vLLM would serve model.layers.1.mlp.experts.0.w13 "
        "with an uninitialised global scale (torch.empty): re-download the checkpoint, or use "
        "one exported with every half's global scale), whatever the image; accepted: a "
        "checkpoint whose fused halves each have a finite, positive global scale (re-download "
        "it, or use one exported with them) (CHECKPOINT_SCAN=warn does not boot it: vLLM would "
        "serve that part from uninitialised memory)"]
    assert started(state) == []
    # warn boots what the image would serve off by a ratio, never a damaged checkpoint
    warned = serve_local(tmp_path, state, model, CHECKPOINT_SCAN="warn")
    assert (warned.returncode, warned.stderr.splitlines()) == (2, result.stderr.splitlines())
    assert started(state) == []


def test_a_directory_the_scan_cannot_read_is_refused_with_its_line(tmp_path):
    state = cluster(tmp_path)
    model = tmp_path / "not-a-checkpoint"
    model.mkdir()
    result = serve_local(tmp_path, state, model)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"refused: MODEL={model}: the checkpoint scan in {IMAGE} failed (it exited 3: "
        f"scan-checkpoint: {model}/config.json: missing; pass the checkpoint directory that "
        "holds config.json and its *.safetensors shards); accepted: a checkpoint directory the "
        "scan reads, or CHECKPOINT_SCAN=off to boot without the scan"]
    assert started(state) == []


def test_off_runs_no_scan(tmp_path):
    state = cluster(tmp_path)
    model = tmp_path / "not-a-checkpoint"
    model.mkdir()
    result = serve_local(tmp_path, state, model, CHECKPOINT_SCAN="off")
    assert result.returncode == 0, result.stderr
    assert scan_calls(state) == [] and len(started(state)) == 2


def test_dry_run_shows_the_step_for_a_local_model_only(tmp_path):
    def comments(**settings):
        return [line for line in dry_run(tmp_path, **settings).splitlines()
                if line.startswith("# checkpoint:")]

    model = synthetic.nvidia_like(tmp_path)
    python = sealed_bin(tmp_path) / "python3"  # this interpreter as invoked: it has safetensors
    python.unlink()
    python.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    found = ("; on this host it found: ModelOpt NVFP4 (modelopt 0.47.0); modules 35 BF16, 27 "
             "NVFP4; gate/up weight_scale_2 equal in all 8 routed experts; merged linears: dense "
             "MLP gate_up 0 of 1 group unequal; nothing to fix: every fused group's global "
             "scales are equal")
    assert comments(MODEL=model)[0].endswith("does not correct, a checkpoint the scan refuses, "
                                             "or a directory it cannot read: refused" + found)
    assert comments(MODEL=model, CHECKPOINT_SCAN="warn")[0].endswith(
        "said loudly (CHECKPOINT_SCAN=warn), the run goes on" + found)
    assert comments(MODEL="/models/glm", CHECKPOINT_SCAN="off") == []
    assert comments() == []  # a Hub MODEL


def test_an_image_without_the_scan_is_told_to_rebuild():
    why, accepted = scan_verdict.failure(IMAGE, 2, "python3: can't open file "
                                         "'/opt/glm53-recipe/scripts/scan-checkpoint': [Errno 2] "
                                         "No such file or directory\n")
    assert why.startswith(f"IMAGE={IMAGE} has no scripts/scan-checkpoint: it was built before")
    assert accepted.startswith("the chain rebuilt (scripts/build.sh")
    why, accepted = scan_verdict.failure(IMAGE, 3, "scan-checkpoint: read 1/2 shards\n"
                                         "scan-checkpoint: /m/x.safetensors: unreadable\n")
    assert why == (f"the checkpoint scan in {IMAGE} failed (it exited 3: scan-checkpoint: "
                   "/m/x.safetensors: unreadable)")


def report(needed=True, from_layer=8):
    return {"summary": "S", "fix": {"needed": needed, "from_layer": from_layer, "says": "W"},
            "fused_groups": [{"kind": "experts", "label": "routed experts gate/up", "differ": 1,
                              "groups": 2, "largest_ratio": 3.0},
                             {"kind": "dense_gate_up", "label": "dense MLP gate_up",
                              "differ": 0, "groups": 1, "largest_ratio": None}]}


def test_the_verdict_by_the_images_chain_layer():
    the_recipe = recipe.load()
    chain = "glm53-sm121-v13"
    assert scan_verdict.judge(report(), "registry.example/glm53-sm121-v8:2026", the_recipe,
                              chain).problem == ""
    early = scan_verdict.judge(report(), "glm53-sm121-v7", the_recipe, chain)
    assert "IMAGE=glm53-sm121-v7 is chain layer v7, before v8" in early.problem
    assert early.accepted == f"IMAGE={chain}"
    assert scan_verdict.judge(report(needed=False), STOCK, the_recipe, chain).problem == ""
    with pytest.raises(scan_verdict.BadReport):
        scan_verdict.judge({"summary": "S"}, chain, the_recipe, chain)
    # an image whose scan predates fused_groups (its report has routed_experts only)
    old = {**report(), "routed_experts": {"differ": 1, "pairs": 2, "largest_ratio": 3.0}}
    del old["fused_groups"]
    with pytest.raises(scan_verdict.BadReport, match="rebuild the chain"):
        scan_verdict.judge(old, chain, the_recipe, chain)
    linear = report(from_layer=None)
    linear["fused_groups"][1].update(differ=1, largest_ratio=2.0)
    refused = scan_verdict.judge(linear, chain, the_recipe, chain)
    assert refused.problem == ("1 of 2 routed experts' gate/up global scales differ (largest "
                               "ratio 3), and 1 of 1 dense MLP gate_up groups' global scales "
                               "differ (largest ratio 2): W")


# ----------------------------------------------------------------------------- nvidia's


def test_nvidia_renders_with_its_revision_resolved_and_checked_on_first_use(tmp_path):
    stdout = dry_run(tmp_path, MODEL=NVIDIA)
    assert stdout.startswith(f"# glm53: model {NVIDIA}@<resolved-at-run>, drafter incoai/")
    assert (f"# only once: resolve {NVIDIA} to a commit on the head and record it in "
            f"{tmp_path}/pins.env; refused unless it starts with 09b04e5e, the latest revision "
            "recipe.toml knows (MODEL_REVISION serves another)") in stdout.splitlines()


@pytest.mark.parametrize("settings", [{"SPEC": "mtp"}, {"PROFILE": "mtp"}])
def test_spec_mtp_with_nvidia_is_refused_in_one_line(tmp_path, settings):
    result = run(tmp_path, MODEL=NVIDIA, **settings)
    line = (f"refused: SPEC=mtp: {NVIDIA}: its layer-45 MTP weights are BF16 and outside the "
            "quantization ignore list, so MTP cannot load on sm_121; accepted: dflash2 | off, or "
            "another MODEL")
    assert (result.returncode, result.stdout, result.stderr) == (2, "", line + "\n")
    assert line in DOCS
    assert run(tmp_path, SPEC="mtp").returncode == 0  # the default checkpoint's MTP loads


def test_a_resolved_nvidia_commit_of_09b04e5e_is_pinned(tmp_path):
    state = cluster(tmp_path)
    commit = "09b04e5e" + "0123456789abcdef" * 2
    result = serve(tmp_path, state, MODEL=NVIDIA, MODEL_REVISION=None, SPEC="off",
                   FAKE_RESOLVED_SHA=commit, FAKE_CURL_READY_AFTER=1)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "pins.env").read_text() == f"{NVIDIA} {commit}\n"
    rank0 = containers(state, "head")["glm53-rank0"]["argv"]
    assert rank0[rank0.index("--revision") + 1] == commit


def test_another_resolved_nvidia_commit_is_refused_and_not_recorded(tmp_path):
    state = cluster(tmp_path)
    commit = "423acf37" + "0123456789abcdef" * 2
    result = serve(tmp_path, state, MODEL=NVIDIA, MODEL_REVISION=None, SPEC="off",
                   FAKE_RESOLVED_SHA=commit, FAKE_CURL_READY_AFTER=1)
    line = (f"refused: MODEL={NVIDIA}: the Hub resolves it to {commit}, not 09b04e5e, the latest "
            "revision recipe.toml knows of it ([checkpoints]); a new revision is not served "
            "unasked; accepted: MODEL_REVISION=<a commit starting with 09b04e5e>, or "
            f"MODEL_REVISION={commit} to serve it")
    assert (result.returncode, result.stderr.splitlines()) == (2, [line])
    assert line.replace(commit, "<commit>") in DOCS
    assert not (tmp_path / "pins.env").exists() and started(state) == []
    # named explicitly, the same commit is served
    asked = dry_run(tmp_path, MODEL=NVIDIA, MODEL_REVISION=commit)
    assert f"serve {NVIDIA} --revision {commit} " in asked


def test_a_recorded_nvidia_commit_outside_09b04e5e_is_refused(tmp_path):
    commit = "423acf37" + "0123456789abcdef" * 2
    (tmp_path / "pins.env").write_text(f"{NVIDIA} {commit}\n")
    result = run(tmp_path, MODEL=NVIDIA)
    assert (result.returncode, result.stderr) == (2, (
        f"refused: MODEL={NVIDIA}: {tmp_path}/pins.env records {commit}, not 09b04e5e, the "
        "latest revision recipe.toml knows of it ([checkpoints]); a new revision is not served "
        f"unasked; accepted: delete that line to resolve it again, or MODEL_REVISION={commit} "
        "to serve it\n"))
    good = "09b04e5e" + "f" * 32
    (tmp_path / "pins.env").write_text(f"{NVIDIA} {good}\n")
    assert f"serve {NVIDIA} --revision {good} " in dry_run(tmp_path, MODEL=NVIDIA)
