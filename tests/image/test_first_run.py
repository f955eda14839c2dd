"""The first run on a fresh head node: `./run.sh` alone gets the vendor image, trusts it on
first use, builds the chain and serves; a second run builds nothing; a moved tag is refused.

The head is a copy of this checkout (what a clone has: no build/, no recipe.lock) whose
recipe.toml names the stand-in vendor image by a reference of a local registry
(tests/image/registry.py, serving the fork-shaped stand-in with FlashInfer, as the one the
image tier already builds, under a label of its own so the engine holds none of it) and puts
the chain's tags under a prefix of the session. No other command is typed: `./run.sh` pulls
the image through the docker SDK, records recipe.lock, builds v8 to v13 and starts two ranks
(the worker through tests/fakes/fake-ssh, as in test_launcher_image.py).

Each refusal is checked for what it leaves: the lock, the images and the containers as they
were, and nothing built or started.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

from recipekit.baselock import BaseLock
from recipekit.bootstrap import cache_root
from tests.checkout import copy_checkout, rewrite
from tests.image.imagetools import docker, image_id, labels
from tests.image.registry import ArchiveRegistry, saved_archive

VENDOR_TAG = "glm53-flash-arm64-cu130"
CHAIN = ("v8", "v9", "v10", "v11", "v13")
SERVE_LABEL = "label=glm53.launcher=serve"
WORKER = "127.0.0.2"
RUN_TIMEOUT_S = 1800  # the cold chain v8 -> v13 on a loaded 2-core machine; a few minutes idle


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_containers(*flags: str) -> list[str]:
    return docker("ps", *flags, "--filter", SERVE_LABEL, "--format", "{{.Names}}").stdout.split()


@pytest.fixture(scope="module")
def registry(standin, tmp_path_factory):
    """The stand-in vendor image, only in a registry on the loopback: (registry, port)."""
    base = standin("fork", flashinfer="0.6.17")
    served = ArchiveRegistry(saved_archive(image_id(base), cache_root() / "registry"),
                             {"glm53.test.vendor": "registry"}, tmp_path_factory.mktemp("registry"))
    assert image_id(served.image_id) is None, "the engine already holds the registry's image"
    port = served.start()
    yield served, port
    served.stop()
    for ref in docker("images", "--format", "{{.Repository}}:{{.Tag}}", check=False).stdout.split():
        if ref.startswith(f"127.0.0.1:{port}/"):
            docker("rmi", ref, check=False)


class Head:
    """A fresh head node: a copy of this checkout whose recipe names VENDOR and the chain's
    tags under PREFIX, and the environment of a two-rank run from it."""

    def __init__(self, root: Path, vendor: str, prefix: str, scratch: Path) -> None:
        copy_checkout(root)
        rewrite(root / "recipe.toml",
                ('chain_prefix = "glm53-sm121-"', f'chain_prefix = "{prefix}glm53-sm121-"'),
                ('default = "glm53-sm121-v13"', f'default = "{prefix}glm53-sm121-v13"'),
                (f'default = "vllm/vllm-openai:{VENDOR_TAG}"', f'default = "{vendor}"'))
        self.root, self.vendor, self.prefix = root, vendor, prefix
        self.lock = root / "recipe.lock"
        (scratch / "model").mkdir(parents=True)
        meminfo = scratch / "meminfo"
        meminfo.write_text(f"MemAvailable: {50 << 20} kB\n")
        self.env = {
            **{name: value for name, value in os.environ.items()
               if name not in ("GLM53_TAG_PREFIX", "BASE_LOCK")},
            "NODES": f"127.0.0.1,{WORKER}", "IFACE": "lo", "HCA": "standin0", "SPEC": "off",
            "MODEL": str(scratch / "model"), "HF_CACHE": str(scratch / "hf"),
            "PORT": str(free_port()), "MASTER_PORT": str(free_port()),
            "SSH": str(root / "tests" / "fakes" / "fake-ssh"), "DOCKER_ARGS": "--init",
            "POLL_SECONDS": "1", "READY_TIMEOUT": "120", "CLUSTER_ENV": str(scratch / "no-cluster.env"),
            "GLM53_MEMINFO": str(meminfo), "MEM_BOOT_FLOOR_GIB": "40",
            "RUNS_DIR": str(scratch / "runs"), "JIT_CACHE": str(scratch / "jit"),
            # the model is an empty directory the fake vllm serves: nothing to scan
            "CHECKPOINT_SCAN": "off",
        }

    def tag(self, layer: str) -> str:
        return f"{self.prefix}glm53-sm121-{layer}"

    def chain_ids(self) -> dict[str, str | None]:
        return {layer: image_id(self.tag(layer)) for layer in CHAIN}

    def run(self, script: str = "run.sh", **settings: str) -> subprocess.CompletedProcess:
        result = subprocess.run([str(self.root / script)], env={**self.env, **settings},
                                capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
        print(f"$ {script} (exit {result.returncode})\n{result.stdout}\n{result.stderr}")
        return result

    def stop(self) -> None:
        self.run("stop.sh")
        for name in serve_containers("--all"):
            docker("rm", "--force", name, check=False)


def fresh_head(tmp_path: Path, session_prefix, name: str, port: int) -> Head:
    prefix = session_prefix(name)
    assert not serve_containers("--all"), "serve containers left over from an earlier run"
    head = Head(tmp_path / "head", f"127.0.0.1:{port}/{prefix}vendor/vllm-openai:{VENDOR_TAG}",
                prefix, tmp_path)
    assert image_id(head.vendor) is None and not head.lock.exists()
    assert head.chain_ids() == dict.fromkeys(CHAIN)
    return head


def assert_nothing_built_or_started(result: subprocess.CompletedProcess) -> None:
    assert not re.search(r"v\d+: building ", result.stdout), "a layer was built"
    assert "starting rank" not in result.stdout


def test_a_strict_lock_refuses_the_first_use_before_pulling(registry, session_prefix, tmp_path):
    served, port = registry
    head = fresh_head(tmp_path, session_prefix, "strict", port)
    try:
        refused = head.run(BASE_LOCK="strict")
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr == (
            f"refused: BASE_LOCK=strict: recipe.lock records no image ID for {head.vendor} and "
            "BASE_LOCK=strict records none on first use; check the image, then record it with "
            "scripts/build.sh --accept-base (or commit the site's recipe.lock)\n")
        asked = [path for path in served.asked if f"/{head.prefix}vendor/" in path]
        assert asked == [], "a pull began"
        assert image_id(head.vendor) is None
        assert not head.lock.exists() and head.chain_ids() == dict.fromkeys(CHAIN)
        assert_nothing_built_or_started(refused)
        assert serve_containers("--all") == []
    finally:
        head.stop()  # what a run that was not refused started


def test_a_registry_out_of_reach_is_refused_in_one_line_naming_docker_load(
        registry, session_prefix, tmp_path):
    head = fresh_head(tmp_path, session_prefix, "offline", free_port())  # nothing listens there
    try:
        refused = head.run()
        assert refused.returncode == 2, refused.stdout + refused.stderr
        said = [line for line in refused.stderr.splitlines() if "tool environment" not in line]
        assert len(said) == 1, refused.stderr
        assert re.fullmatch(
            rf"build\.sh: refused: {re.escape(head.vendor)} is not on this host and pulling it "
            r"failed \(.*connection refused.*\); where its registry cannot be reached, docker load "
            r"it from an archive \(docker save on a host that has it\), then run this again",
            said[0]), said[0]
        assert image_id(head.vendor) is None and not head.lock.exists()
        assert head.chain_ids() == dict.fromkeys(CHAIN)
        assert_nothing_built_or_started(refused)
        assert serve_containers("--all") == []
    finally:
        head.stop()


@pytest.fixture(scope="module")
def first_run(registry, session_prefix, tmp_path_factory):
    """The head after `./run.sh` alone served on it (ranks stopped again): (head, its output)."""
    served, port = registry
    head = fresh_head(tmp_path_factory.mktemp("first-run"), session_prefix, "first", port)
    recipe_before = (head.root / "recipe.toml").read_bytes()
    result = head.run()
    running = sorted(serve_containers())
    head.stop()
    assert (head.root / "recipe.toml").read_bytes() == recipe_before, "a tool edited recipe.toml"
    return head, result, running


def test_one_run_sh_on_a_fresh_head_pulls_trusts_builds_and_serves(registry, first_run):
    served, _ = registry
    head, result, running = first_run
    assert result.returncode == 0, result.stdout + result.stderr
    assert "glm53: ready: http://127.0.0.1:" in result.stdout
    assert running == ["glm53-rank0", "glm53-rank1"]
    # The pull, layer by layer, through the docker SDK.
    assert f"base: {head.vendor} is not on this host: pulling it" in result.stdout
    count = served.layers  # every layer downloaded and extracted, as on a host that had none
    assert len(re.findall(r"layer [0-9a-f]{12}: downloaded \(", result.stdout)) == count
    assert re.search(rf"layer [0-9a-f]{{12}}: extracted \({count} of {count} layers to pull\)",
                     result.stdout)
    assert f"base: pulled {head.vendor} ({served.image_id[7:19]})" in result.stdout
    # Trusted on first use: recorded in the lock, said in one line with the ID.
    trusted = BaseLock.read(head.lock).images
    assert list(trusted) == [head.vendor]
    assert (trusted[head.vendor].image_id, trusted[head.vendor].digest, trusted[head.vendor].how) == (
        served.image_id, served.digest, "first use")
    recorded = [line for line in result.stderr.splitlines() if "recorded" in line]
    assert recorded == [
        f"build.sh: recorded {head.vendor} as {served.image_id} (digest {served.digest}) in "
        "recipe.lock on first use; a later build or ./run.sh refuses the tag once it names "
        "another image"]
    # v8 to v13, each built on the one before, from the pulled image.
    for layer in CHAIN:
        assert re.search(rf"{layer}: applied: tagged {re.escape(head.tag(layer))} ", result.stdout)
    assert labels(head.tag("v8"))["glm53.base.id"] == served.image_id
    assert labels(head.tag("v13"))["glm53.chain"] == " ".join(f"{layer}=applied" for layer in CHAIN)
    timed = re.findall(r"(v\d+): applied: tagged \S+ \(\w+, (\d+) s\)", result.stdout)
    print(f"the chain built in {sum(int(seconds) for _, seconds in timed)} s: "
          + ", ".join(f"{layer} {seconds} s" for layer, seconds in timed))


def test_a_second_run_sh_builds_nothing(first_run):
    head, _, _ = first_run
    chain, lock = head.chain_ids(), head.lock.read_bytes()
    again = head.run()
    try:
        assert again.returncode == 0, again.stdout + again.stderr
        assert "glm53: ready: http://127.0.0.1:" in again.stdout
        assert "build.sh" not in again.stdout + again.stderr
        assert "is not on the head" not in again.stdout
        assert head.chain_ids() == chain and head.lock.read_bytes() == lock
    finally:
        head.stop()


def test_a_moved_vendor_tag_is_refused_with_nothing_built_or_started(first_run, tmp_path):
    head, _, _ = first_run
    trusted = image_id(head.vendor)
    moved = subprocess.run(
        ["docker", "build", "--quiet", "--tag", head.vendor, "-"], capture_output=True, text=True,
        input=f"FROM {head.vendor}\nLABEL glm53.test.moved={tmp_path.name}\n", check=False,
        env={**os.environ, "DOCKER_BUILDKIT": "0"}, timeout=300)
    assert moved.returncode == 0, moved.stderr
    new = image_id(head.vendor)
    leftover = f"{head.prefix}leftover"  # an exited rank an earlier run kept for its logs
    docker("run", "--name", leftover, "--label", "glm53.launcher=serve", "--entrypoint", "true",
           head.tag("v13"))
    chain, lock = head.chain_ids(), head.lock.read_bytes()
    try:
        refused = head.run()
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert refused.stderr == (
            f"refused: BASE_IMAGE={head.vendor}: recipe.lock records {trusted}, but the tag now "
            f"names {new} (it moved); check what changed, then accept it with scripts/build.sh "
            "--accept-base\n")
        assert_nothing_built_or_started(refused)
        assert head.lock.read_bytes() == lock, "the refused run changed recipe.lock"
        assert head.chain_ids() == chain and image_id(head.vendor) == new
        assert serve_containers() == [] and serve_containers("--all") == [leftover]
    finally:
        head.stop()  # the leftover, and what a run that was not refused started
        docker("rm", "--force", leftover, check=False)
        docker("tag", trusted, head.vendor)
        docker("rmi", new, check=False)
