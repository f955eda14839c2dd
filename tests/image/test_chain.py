"""The image chain v8 -> v9 -> v10 -> v11 built by scripts/build.sh on stand-in bases, real engine."""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from recipekit.baselock import BaseLock
from tests.image.imagetools import FULL_CHAIN, LAYERS, REPO_ROOT, docker, image_id, labels, run_build

PATCH_LAYER = REPO_ROOT / "scripts" / "patch-layer"
OK = ("applied", "already-applied", "provided-by-base")


def tag(prefix: str, layer: str) -> str:
    return f"{prefix}glm53-sm121-{layer}"


def vllm_src(version: str) -> Path:
    out = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "vllm-src"), version],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def tree_from_image(ref: str, directory: str) -> dict[str, bytes]:
    """Every regular file under ``directory`` in the image, by path relative to its parent."""
    container = docker("create", ref, "true").stdout.strip()
    try:
        stream = subprocess.run(
            ["docker", "cp", f"{container}:{directory}", "-"], capture_output=True, check=True
        ).stdout
    finally:
        docker("rm", container, check=False)
    files = {}
    with tarfile.open(fileobj=io.BytesIO(stream)) as archive:
        for member in archive.getmembers():
            if member.isfile():
                files[member.name] = archive.extractfile(member).read()
    return files


def tree_from_disk(root: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def patch_on_host(root: Path, layer: str, *extra: str) -> dict:
    result = subprocess.run(
        [sys.executable, str(PATCH_LAYER), layer, "--root", str(root), "--json", *extra],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.stdout.strip(), f"patch-layer {layer} printed nothing: {result.stderr}"
    return json.loads(result.stdout)


def backport_pins_sha256() -> str:
    """What build.sh labels glm53.backport.sha256: the hash of every v9 diff's pin (DFlash2 per
    base shape, the draft-noise salt per salt shape)."""
    manifest = json.loads((REPO_ROOT / "patches" / "v9" / "manifest.json").read_text())
    pins = {f"dflash2-{shape}": pin for shape, pin in manifest["diff_sha256"].items()}
    pins |= {f"draft-noise-salt-{shape}": pin for shape, pin in manifest["draft_noise_salt"]["diff_sha256"].items()}
    text = "".join(f"{name} {pin}\n" for name, pin in sorted(pins.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def backport_diff(prefix: str) -> Path:
    """The directory of v9 diffs (DFlash2 per base shape, the salt per salt shape) build.sh
    generated."""
    sha = labels(tag(prefix, "v9"))["glm53.backport.sha256"]
    path = REPO_ROOT / "build" / "backport" / sha[:16]
    assert sorted(p.name for p in path.glob("*.diff")) == [
        "dflash2-logits-cache.diff", "dflash2-no-logits-cache.diff",
        "draft-noise-salt-logits-cache.diff", "draft-noise-salt-release.diff",
    ], f"{path} lacks the diffs build.sh generated"
    return path


def test_chain_on_0300_standin_builds_every_layer_with_labels(chain_0300):
    prefix, base, run = chain_0300
    assert run.returncode == 0, run.output
    expected = {"v9": "provided-by-base", "v10": "applied", "v11": "applied", "v13": "applied"}
    parent = image_id(base)
    patch_hashes = set()
    for layer, outcome in expected.items():
        found = labels(tag(prefix, layer))
        assert found["glm53.layer"] == layer
        assert found["glm53.outcome"] == outcome, found.get("glm53.reason")
        assert found["glm53.base.id"] == parent, f"{layer} was not built on the previous layer"
        assert re.fullmatch(r"[0-9a-f]{64}", found["glm53.inputs"])
        assert re.fullmatch(r"[0-9a-f]{64}", found["glm53.patch.sha256"])
        assert found["glm53.backport.sha256"] == backport_pins_sha256()
        assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", found["glm53.commit"])
        assert re.fullmatch(r"/usr/local/lib/python3\.\d+/dist-packages", found["glm53.vllm.root"])
        patch_hashes.add(found["glm53.patch.sha256"])
        assert f"{layer}: {outcome}: tagged {tag(prefix, layer)}" in run.output
        parent = image_id(tag(prefix, layer))
    assert len(patch_hashes) == 4, "each layer carries its own patch hash"
    assert labels(tag(prefix, "v11"))["glm53.chain"] == (
        "v9=provided-by-base v10=applied v11=applied"
    )
    assert labels(tag(prefix, "v13"))["glm53.chain"] == (
        "v9=provided-by-base v10=applied v11=applied v13=applied"
    )
    # The probe read the stand-in's vllm/_version.py; the launcher reads these two.
    top = labels(tag(prefix, "v13"))
    assert (top["glm53.base.vllm"], top["glm53.provided"]) == ("0.30.0", "v9")
    assert re.search(r"base: \S+ \(\w+\): Python 3\.\d+, \S+, glibc [\d.]+, vLLM 0\.30\.0", run.output)
    # Image v13 ran v13_weights after v13 (docker/Dockerfile.sm121-v13), its record beside v13's.
    weights = docker("run", "--rm", "--network", "none", "--entrypoint", "cat", tag(prefix, "v13"),
                     "/opt/glm53-recipe/build-record/v13_weights.json").stdout
    assert json.loads(weights)["outcome"] == "applied", weights
    assert labels(tag(prefix, "v10"))["glm53.files"].split(",") == [
        "vllm/models/glm5next/nvidia/model.py",
        "vllm/models/glm5next/nvidia/mhc_aux_capture.py",
    ]
    assert "build.sh: summary:" in run.output


def test_v11_image_tree_is_byte_identical_to_patch_layer_on_a_host_copy(chain_0300, tmp_path):
    assert_image_tree_matches_host(chain_0300, "0.30.0", tmp_path)


def flashinfer_src(version: str) -> Path:
    out = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "flashinfer-src"), version],
        capture_output=True, text=True, check=True,
    )
    return Path(out.stdout.strip())


IMAGE_PATCHERS = {"v8": ("v8_moe_scales", "v8_linear_scales", "v8_api_key"),  # Dockerfile.sm121-v8
                  "v11": ("v11_dflash_block_drop",)}  # docker/Dockerfile.sm121-v11


def assert_image_tree_matches_host(chain, version, tmp_path, layers=LAYERS):
    """v11's trees in the image equal what patch-layer makes of the same sources on the host.

    With v8 in ``layers`` the host root holds flashinfer-python 0.6.18 (what v8 installs) beside
    vllm, and the image's flashinfer/ is compared too (bytecode pip compiled left out).
    """
    prefix, _, run = chain
    assert run.returncode == 0, run.output
    release = vllm_src(version)
    host_root = tmp_path / "tree"
    shutil.copytree(release / "vllm", host_root / "vllm")
    packages = ["vllm"]
    if "v8" in layers:
        shutil.copytree(flashinfer_src("0.6.18") / "flashinfer", host_root / "flashinfer")
        packages.append("flashinfer")
    touched = set()
    for layer in layers:
        extra = ["--import-check", "off"]
        if layer == "v9":
            extra += ["--diff", str(backport_diff(prefix))]
        if layer == "v8":
            extra += ["--require-flashinfer"]
        result = patch_on_host(host_root, layer, *extra)
        assert result["outcome"] == labels(tag(prefix, layer))["glm53.outcome"], result
        touched.update(result["files"])
        # the patchers the layer's Dockerfile runs after it (image v11: v11_dflash_block_drop)
        for patcher in IMAGE_PATCHERS.get(layer, ()):
            result = patch_on_host(host_root, patcher, "--import-check", "off")
            record = docker("run", "--rm", "--network", "none", "--entrypoint", "cat",
                            tag(prefix, layer), f"/opt/glm53-recipe/build-record/{patcher}.json").stdout
            assert result["outcome"] == json.loads(record)["outcome"], result
            touched.update(result["files"])
    root_in_image = labels(tag(prefix, "v11"))["glm53.vllm.root"]
    in_image, on_host = {}, {}
    for package in packages:
        found = tree_from_image(tag(prefix, "v11"), f"{root_in_image}/{package}")
        in_image.update({k: v for k, v in found.items() if "__pycache__/" not in k})
        on_host.update({f"{package}/{k}": v for k, v in tree_from_disk(host_root / package).items()})
    assert sorted(in_image) == sorted(on_host), (
        f"only in image: {sorted(set(in_image) - set(on_host))[:5]}, "
        f"only on host: {sorted(set(on_host) - set(in_image))[:5]}"
    )
    differing = [name for name in on_host if in_image[name] != on_host[name]]
    assert differing == []
    pristine = tree_from_disk(release)
    if "v8" in layers:
        pristine.update({f"flashinfer/{k}": v for k, v in tree_from_disk(flashinfer_src("0.6.18") / "flashinfer").items()})
    assert len(touched) >= 4
    for name in touched:
        assert in_image[name] != pristine.get(name), f"{name} was not changed by the chain"


def test_toolkit_is_in_the_serving_image(chain_0300):
    prefix, _, run = chain_0300
    assert run.returncode == 0, run.output
    root = labels(tag(prefix, "v11"))["glm53.vllm.root"]
    # One container: the toolkit's layout, the v11 record, a --check of v11 by the tool inside
    # the image on its own tree (already applied), and the fake vllm on PATH.
    script = (
        "set -e; ls -A /opt/glm53-recipe | tr '\\n' ' '; echo; "
        "cat /opt/glm53-recipe/build-record/v11.json | tr -d '\\n'; echo; "
        "PYTHONPATH=/opt/glm53-recipe/pylib python3 /opt/glm53-recipe/scripts/patch-layer v11 "
        f"--root {root} --check --json; command -v vllm"
    )
    result = docker(
        "run", "--rm", "--network", "none", "--entrypoint", "sh", tag(prefix, "v11"), "-c", script
    )
    entries, record, check, vllm = result.stdout.splitlines()
    for needed in ("scripts", "recipekit", "patches", "pylib", "build-record", "wheelhouse"):
        assert needed in entries.split()
    assert ".incoming" not in entries.split()
    record = json.loads(record)
    assert record["layer"] == "v11" and record["outcome"] == "applied"
    assert record["vllm_root"] == root
    assert json.loads(check)["outcome"] == "already-applied"
    assert vllm == "/usr/local/bin/vllm"


def test_rebuild_with_unchanged_inputs_builds_nothing(chain_0300):
    prefix, base, first = chain_0300
    assert first.returncode == 0, first.output
    before = {layer: image_id(tag(prefix, layer)) for layer in LAYERS}
    again = run_build(prefix, "--from", "v9", "--base", base)
    assert again.returncode == 0, again.output
    for layer in LAYERS:
        assert f"{layer}: up to date: {tag(prefix, layer)}" in again.output
    assert "building" not in again.output
    assert {layer: image_id(tag(prefix, layer)) for layer in LAYERS} == before
    print(f"no-op rebuild: {again.seconds:.2f} s")
    assert again.seconds < 60, f"a no-op rebuild took {again.seconds:.1f} s"


def test_check_prints_the_plan_and_builds_nothing(chain_0300, session_prefix):
    prefix, base, first = chain_0300
    assert first.returncode == 0, first.output
    up_to_date = run_build(prefix, "--from", "v9", "--base", base, "--check")
    assert up_to_date.returncode == 0, up_to_date.output
    assert up_to_date.output.count("up to date:") == 4
    fresh = session_prefix("check")
    plan = run_build(fresh, "--from", "v9", "--base", base, "--check")
    assert plan.returncode == 0, plan.output
    assert f"v9: would build {tag(fresh, 'v9')} on {base}" in plan.output
    assert f"v10: would build {tag(fresh, 'v10')} after v9" in plan.output
    assert f"v11: would build {tag(fresh, 'v11')} after v9" in plan.output
    assert f"v13: would build {tag(fresh, 'v13')} after v9" in plan.output
    assert "nothing was built" in plan.output
    assert all(image_id(tag(fresh, layer)) is None for layer in LAYERS)


def test_0271_standin_v9_applies_then_v10_refuses_no_glm5next(standin, session_prefix):
    base = standin("0.27.1")
    prefix = session_prefix("v0271")
    # The refusal patch-layer gives on the same release on the host is what the build shows.
    expected = patch_on_host(vllm_src("0.27.1"), "v10", "--check", "--import-check", "off")
    assert expected["outcome"] == "refused" and "no Glm5Next" in expected["reason"], expected
    run = run_build(prefix, "--from", "v9", "--base", base)
    assert run.returncode == 3, run.output
    assert expected["reason"].splitlines()[0] in run.output
    assert "REFUSED" in run.output
    v9 = labels(tag(prefix, "v9"))
    assert v9["glm53.outcome"] == "applied"
    assert "vllm/model_executor/models/qwen3_dflash2.py" in v9["glm53.files"].split(",")
    assert image_id(tag(prefix, "v10")) is None
    assert image_id(tag(prefix, "v11")) is None
    assert "build.sh: FAILED at v10" in run.output


def test_drifted_standin_fails_at_that_layer_and_leaves_it_untagged(
    standin, session_prefix, tmp_path
):
    base = standin("0.30.0", drift="v11")
    prefix = session_prefix("drift")
    # What patch-layer says on the same drifted tree on the host is what the build must show.
    python = labels(base)["glm53.standin.python"]
    for name, data in tree_from_image(
        base, f"/usr/local/lib/python{python}/dist-packages/vllm"
    ).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    expected = patch_on_host(tmp_path, "v11", "--check", "--import-check", "off")
    assert expected["outcome"] == "refused", expected
    # An image an earlier build left under the v11 tag must not pass for this build's result.
    docker("tag", base, tag(prefix, "v11"))
    run = run_build(prefix, "--from", "v9", "--base", base)
    assert run.returncode == 3, run.output
    assert expected["reason"].splitlines()[0] in run.output
    assert labels(tag(prefix, "v9"))["glm53.outcome"] == "provided-by-base"
    assert labels(tag(prefix, "v10"))["glm53.outcome"] == "applied"
    assert image_id(tag(prefix, "v11")) is None, "the failed layer must not be tagged"
    assert image_id(f"{tag(prefix, 'v11')}:stale") == image_id(base)
    assert "build.sh: FAILED at v11" in run.output


def test_missing_base_is_refused_by_name(session_prefix):
    prefix = session_prefix("nobase")
    run = run_build(prefix, "--base", "glm53-no-such-base:none")
    assert run.returncode == 4
    assert "base image glm53-no-such-base:none not found" in run.output
    assert all(image_id(tag(prefix, layer)) is None for layer in LAYERS)


def test_chain_on_the_fork_shaped_standin_applies_every_layer(chain_fork, tmp_path):
    """The real deployment's chain, v8 -> v9 -> v10 -> v11, built as images on the fork shape."""
    prefix, _, run = chain_fork
    assert run.returncode == 0, run.output
    assert labels(tag(prefix, "v11"))["glm53.chain"] == "v8=applied v9=applied v10=applied v11=applied"
    v9 = labels(tag(prefix, "v9"))
    assert "base shape logits-cache" in v9["glm53.reason"]
    assert "vllm/v1/worker/gpu/spec_decode/speculator.py" in v9["glm53.files"].split(",")
    assert labels(tag(prefix, "v10"))["glm53.base.id"] == image_id(tag(prefix, "v9"))
    assert_image_tree_matches_host(chain_fork, "fork", tmp_path, FULL_CHAIN)


PINNED = sorted([
    "flashinfer-python==0.6.18", "nvidia-nccl-cu13==2.30.7", "nvidia-cutlass-dsl==4.6.2",
    "nvidia-cutlass-dsl-libs-base==4.6.2", "nvidia-cutlass-dsl-libs-core==4.6.2",
    "nvidia-cutlass-dsl-libs-cu12==4.6.2", "nvidia-cutlass-dsl-libs-cu13==4.6.2",
])


def test_v8_on_the_fork_standin_installs_the_pins_and_records_every_change(chain_fork):
    prefix, base, run = chain_fork
    assert run.returncode == 0, run.output
    v8 = labels(tag(prefix, "v8"))
    assert v8["glm53.outcome"] == "applied", v8["glm53.reason"]
    assert v8["glm53.base.id"] == image_id(base)
    assert sorted(v8["glm53.packages"].split(",")) == PINNED
    assert re.fullmatch(r"[0-9a-f]{64}", v8["glm53.packages.wheelhouse.sha256"])
    # the stand-in's release has no set of its own: the fork's, picked from its _version.py
    assert f"sm121 packages: patches/v8/packages.txt for vLLM {v8['glm53.base.vllm']}:" in run.output
    assert v8["glm53.base.vllm"] != "-" and v8["glm53.provided"] == ""
    files = v8["glm53.files"].split(",")
    assert "flashinfer/data/include/flashinfer/attention/mla.cuh" in files
    assert "flashinfer/mla/_core.py" in files
    assert "vllm/platforms/cuda.py" in files
    assert "vllm/v1/attention/backends/mla/flashinfer_mla_sparse_sm90.py" in files
    # Docker hands labels down: the serving image says which pins its v8 installed.
    assert labels(tag(prefix, "v11"))["glm53.packages"] == v8["glm53.packages"]
    log = (REPO_ROOT / "build" / "logs" / "v8.log").read_text()
    assert "removing flashinfer-jit-cache 0.6.17" in log
    assert "v8: packages checked: " + " ".join(PINNED) in log


def test_the_serving_image_holds_the_pins_and_every_v8_change(chain_fork):
    """Inside v11: the versions, no jit-cache, and v8 already applied to the installed trees."""
    prefix, _, run = chain_fork
    assert run.returncode == 0, run.output
    root = labels(tag(prefix, "v11"))["glm53.vllm.root"]
    script = (
        "set -e; python3 /opt/glm53-recipe/scripts/sm121-packages check --root "
        f"{root} --json; PYTHONPATH=/opt/glm53-recipe/pylib python3 "
        f"/opt/glm53-recipe/scripts/patch-layer v8 --root {root} --require-flashinfer --check --json; "
        "python3 -c 'import importlib.util as u; print(u.find_spec(\"flashinfer_jit_cache\") is None)'"
    )
    result = docker(
        "run", "--rm", "--network", "none", "--entrypoint", "sh", tag(prefix, "v11"), "-c", script
    )
    packages, check, no_jit_cache = result.stdout.splitlines()[-3:]
    packages = json.loads(packages)
    assert packages["ok"], packages["problems"]
    assert packages["packages"] == PINNED
    assert "JIT-compiles" in packages["notes"][0]
    check = json.loads(check)
    assert check["outcome"] == "already-applied", check["reason"]
    found = {finding["change"]: finding["status"] for finding in check["changes"]}
    assert found == dict.fromkeys(
        ("D1", "D2a", "D2b", "D2c", "D2e", "D4", "V7a", "V7b", "V7c", "F1", "F2"), "present"
    ) | {"F3": "skipped"}  # FlashInfer 0.6.18 has no Python mirror of the fp8 tile
    assert no_jit_cache == "True"


def test_a_base_whose_tag_moved_is_refused_until_accepted(standin, session_prefix, tmp_path):
    """recipe.lock (beside the recipe) holds the base's image ID; a tag that now names another
    image is refused in one line, and --accept-base rewrites the lock, never the recipe."""
    prefix = session_prefix("pin")
    base = f"{prefix}vendor:tag"
    docker("tag", standin("0.30.0"), base)
    accepted_before = image_id(standin("0.27.1"))  # what the tag named when it was accepted
    recipe = tmp_path / "recipe.toml"
    recipe.write_text((REPO_ROOT / "recipe.toml").read_text())
    lock = BaseLock.read(tmp_path / "recipe.lock")
    lock.record(base, accepted_before, "", "accepted")
    args = ("--from", "v9", "--base", base, "--check", "--recipe", str(recipe))
    moved = run_build(prefix, *args)
    assert moved.returncode == 4, moved.output
    refusals = [line for line in moved.output.splitlines() if line.startswith("build.sh: refused:")]
    assert refusals == [
        f"build.sh: refused: {base}: {tmp_path / 'recipe.lock'} records {accepted_before}, but the "
        f"tag now names {image_id(base)} (it moved); check what changed, then accept it with "
        f"scripts/build.sh --accept-base --base {base}"
    ]
    assert "would build" not in moved.output
    # --check writes nothing, --accept-base or not (issue 35): the lock keeps the old ID
    checked = run_build(prefix, *args, "--accept-base")
    assert BaseLock.read(tmp_path / "recipe.lock").images[base].image_id == accepted_before
    assert recipe.read_text() == (REPO_ROOT / "recipe.toml").read_text(), checked.output
    BaseLock.read(tmp_path / "recipe.lock").record(base, image_id(base), "", "accepted")
    again = run_build(prefix, *args)
    assert again.returncode == 0, again.output
    assert f"v9: would build {tag(prefix, 'v9')} on {base}" in again.output


def test_v8_on_a_0330_standin_installs_that_releases_set_and_patches_flashinfer_07(v8_on_0330):
    prefix, base, run = v8_on_0330
    assert run.returncode == 0, run.output
    assert "sm121 packages: patches/v8/packages-vllm-0.33.0.txt for vLLM 0.33.0:" in run.output
    v8 = labels(tag(prefix, "v8"))
    assert v8["glm53.outcome"] == "applied", v8["glm53.reason"]
    assert v8["glm53.base.vllm"] == "0.33.0"
    installed = dict(pin.split("==") for pin in v8["glm53.packages"].split(","))
    assert installed["flashinfer-python"] == "0.7.2.post1"
    assert {v for name, v in installed.items() if name.startswith("nvidia-cutlass-dsl")} == {"4.8.0"}
    assert v8["glm53.reason"].endswith(
        "[applied: D1 D2a D2b D2c D4 V7a V7b V7c F1 F2 F3; present: D2e]")
    assert "flashinfer/mla/_batch_mla/_backends/_fa_common.py" in v8["glm53.files"].split(",")
    log = (REPO_ROOT / "build" / "logs" / "v8.log").read_text()  # last in the file: its v8 build is the last
    assert "removing flashinfer-jit-cache 0.6.18" in log
