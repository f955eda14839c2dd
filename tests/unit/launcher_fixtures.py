"""DRY_RUN outputs saved before the launcher moved to Python, and the command that saves them.

Each scenario is a setting the launcher tests cover (unit, vllm and engine tiers); its
fixture is `tests/unit/fixtures/dry_run/<name>.txt`: stdout of `DRY_RUN=1 ./run.sh` (or
`./stop.sh`) in the sealed environment of tests/unit/test_launcher_support.py, with this
checkout's path written `{repo}` and the test's temporary directory `{tmp}`.

    python3 -m tests.unit.launcher_fixtures            # write every fixture
    python3 -m tests.unit.launcher_fixtures --check    # compare, write nothing

The fixtures were written by the bash launcher (commit "Fixtures: DRY_RUN of the bash
launcher, saved before the move to Python"); tests/unit/test_launcher_fixtures.py holds
today's launcher to them byte for byte.
"""

import argparse
import stat
import sys
import tempfile
from pathlib import Path

from tests.unit.test_launcher_support import (
    DRAFTER_PIN,
    FAKE_SSH,
    MODEL_PIN,
    NODES,
    REPO,
    run,
    sealed_bin,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "dry_run"
PINNED = {"MODEL_REVISION": MODEL_PIN, "DRAFTER_REVISION": DRAFTER_PIN}
OTHER_MODEL = "someone/other-checkpoint"
G_REPO = "canada-quant/GLM-5.3-Flash-DFlash2-G"
EXTRA_ARGS = (
    """--hf-overrides '{"note": "a \\"quoted\\" $HOME `x`"}' """
    """--root-path "/it's glm" --chat-template-content-format=string"""
)
NONE_OPTIONAL = {"TOOL_CALL_PARSER": "none", "REASONING_PARSER": "none",
                 "SERVED_MODEL_NAME": "none", "MM_PROCESSOR_CACHE_GB": "none",
                 "MAX_NEW_TOKENS": "none", "BLOCK_SIZE": "none"}


def _pins_file(tmp):
    (tmp / "pins.env").write_text(
        f"# recorded by run.sh\n{OTHER_MODEL} {MODEL_PIN}\n{G_REPO} {DRAFTER_PIN}\n")
    return {}


def _cluster_env(tmp):
    cluster = tmp / "cluster.env"
    cluster.write_text(
        "# site values\n"
        'NODES="192.0.2.3 192.0.2.4"\n'
        "IFACE=ifsite\n"
        "HCA=hcasite\n"
        """GENERATION_CONFIG='{"top_k": 20}'\n"""
        "MAX_NUM_SEQS=2\n")
    return {"CLUSTER_ENV": cluster, "NODES": None, "IFACE": None, "HCA": None}


def _token_file(tmp):
    token = tmp / "token"
    token.write_text("hf_SECRETVALUE\n")
    return {"HF_TOKEN_FILE": token, "HF_TOKEN": "hf_SECRETVALUE"}


def _local_model(name):
    """A set-up that makes a small checkpoint at {tmp}/models/NAME (equal gate/up scales),
    which DRY_RUN scans on this host, and points MODEL at it; python3 is this interpreter as
    invoked, whose venv has safetensors for the scan."""

    def set_up(tmp):
        from tests.unit.synthetic_checkpoints import nvidia_like

        python = sealed_bin(tmp) / "python3"
        python.unlink()
        python.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
        python.chmod(0o755)
        (tmp / "models").mkdir()
        return {"MODEL": nvidia_like(tmp / "models").rename(tmp / "models" / name)}

    return set_up


def _pv(tmp):
    pv = sealed_bin(tmp) / "pv"
    pv.write_text("#!/bin/sh\nexec cat\n")
    pv.chmod(pv.stat().st_mode | stat.S_IXUSR)
    return {}


def _clock_record(tmp):
    """A GPU clock record a run left (launcher/apply/host_levers.py), as stop.sh reads it."""
    from launcher.apply import host_levers

    entry = {"mhz": "0,2150", "image": "glm53-sm121-v13",
             "docker_args": ["--gpus", "all", "--device", "/dev/infiniband"]}
    host_levers.write_record(str(tmp / "runs"), {NODES[0]: {"head": True, **entry},
                                                 NODES[1]: {"head": False, **entry}})
    return {"RUNS_DIR": tmp / "runs"}


# name -> (script, nodes, settings, set-up run in the temporary directory first)
SCENARIOS = {
    "defaults": ("run.sh", 2, {}, None),
    "seed-pr": ("run.sh", 2, {"PROFILE": "seed-pr"}, None),  # byte-equal to the saved defaults of before issue 19
    "pinned": ("run.sh", 2, PINNED, None),
    "other-model": ("run.sh", 2, {"MODEL": OTHER_MODEL}, None),
    "pins-file": ("run.sh", 2, {"MODEL": OTHER_MODEL, "DRAFTER": "dflash2-g"}, _pins_file),
    "dflash2-g-unpinned": ("run.sh", 2, {"DRAFTER": "dflash2-g"}, None),
    "spec-mtp": ("run.sh", 2, {"SPEC": "mtp", **PINNED}, None),
    "spec-off": ("run.sh", 2, {"SPEC": "off", **PINNED}, None),
    "eager": ("run.sh", 2, {"ENFORCE_EAGER": 1, **PINNED}, None),
    "spec-mtp-unpinned": ("run.sh", 2, {"SPEC": "mtp"}, None),
    "eager-unpinned": ("run.sh", 2, {"ENFORCE_EAGER": 1}, None),
    "spec-off-eager": ("run.sh", 2, {"SPEC": "off", "ENFORCE_EAGER": 1, **PINNED}, None),
    "k7-2seqs": ("run.sh", 2, {"NUM_SPECULATIVE_TOKENS": 7, "MAX_NUM_SEQS": 2, **PINNED}, None),
    "k1-3seqs": ("run.sh", 2, {"NUM_SPECULATIVE_TOKENS": 1, "MAX_NUM_SEQS": 3, **PINNED}, None),
    "3-nodes": ("run.sh", 3, PINNED, None),
    "4-nodes": ("run.sh", 4, PINNED, None),
    "tp4": ("run.sh", 2, {"TP": 4, **PINNED}, None),
    "one-node": ("run.sh", 1, {"IFACE": None, "HCA": None, **PINNED}, None),
    "extra-args": ("run.sh", 2, {"EXTRA_ARGS": EXTRA_ARGS, **PINNED}, None),
    "generation-config": ("run.sh", 2, {"GENERATION_CONFIG": '{"temperature": 0.6, "note": "it\'s"}',
                                        **PINNED}, None),
    "chat-knobs": ("run.sh", 2, {"THINKING": 1, "MAX_NEW_TOKENS": 4096, "SERVED_MODEL_NAME": "glm",
                                 "TOOL_CALL_PARSER": "glm45", "REASONING_PARSER": "glm47",
                                 **PINNED}, None),
    "block-64": ("run.sh", 2, {"BLOCK_SIZE": 64, **PINNED}, None),
    "block-4608": ("run.sh", 2, {"BLOCK_SIZE": 4608, **PINNED}, None),
    "forced-backends": ("run.sh", 2, {"MOE_BACKEND": "flashinfer_cutlass", "FORCE_UNSAFE_MOE": 1,
                                      "LINEAR_BACKEND": "auto", "FORCE_UNSAFE_LINEAR": 1,
                                      **PINNED}, None),
    "forced-bounds": ("run.sh", 2, {"MAX_MODEL_LEN": 400000, "FORCE_UNSAFE_CTX": 1,
                                    "KV_CACHE_MEMORY_BYTES": 5368709120, "FORCE_UNSAFE_KV": 1},
                      None),
    "forced-stock-image": ("run.sh", 2, {"IMAGE": "vllm/vllm-openai:latest",
                                         "FORCE_STOCK_IMAGE": 1}, None),
    "extra-env": ("run.sh", 2, {"EXTRA_ENV": "VLLM_LOGGING_LEVEL=DEBUG NCCL_IB_TIMEOUT=22 "
                                "TORCH_NCCL_BLOCKING_WAIT=1 CUDA_LAUNCH_BLOCKING=0 "
                                "FLASHINFER_LOGLEVEL=3", **PINNED}, None),
    "token-file": ("run.sh", 2, PINNED, _token_file),
    "none-optional": ("run.sh", 2, {**NONE_OPTIONAL, **PINNED}, None),
    "none-optional-no-jit": ("run.sh", 2, {**NONE_OPTIONAL, "JIT_CACHE": "none", **PINNED}, None),
    "dflash2-g": ("run.sh", 2, {"DRAFTER": "dflash2-g", **PINNED}, None),
    "dflash2-g-window-4096": ("run.sh", 2, {"DRAFTER": "dflash2-g", "DRAFTER_WINDOW": 4096,
                                            **PINNED}, None),
    "local-drafter": ("run.sh", 2, {"DRAFTER": "/srv/drafters/my drafter", **PINNED}, None),
    "local-model": ("run.sh", 2, {"DRAFTER_REVISION": DRAFTER_PIN}, _local_model("glm")),
    "nvidia-model": ("run.sh", 2, {"MODEL": "nvidia/GLM-5.3-Flash-NVFP4"}, None),
    "cluster-env": ("run.sh", 2, {"MAX_NUM_SEQS": 3, **PINNED}, _cluster_env),
    "ssh-docker-args": ("run.sh", 2, {"SSH": f"{FAKE_SSH} -p 2222", "DOCKER_ARGS": "--runtime runc",
                                      **PINNED}, None),
    "pv": ("run.sh", 2, PINNED, _pv),
    "nodes-newline-comma": ("run.sh", 2, {"NODES": f"{NODES[0]},\n{NODES[1]}", **PINNED}, None),
    "vllm-chat-knobs": ("run.sh", 2, {"THINKING": 1, "MAX_NEW_TOKENS": 4096,
                                      "SERVED_MODEL_NAME": "glm",
                                      "GENERATION_CONFIG": '''{"temperature": 0.6, "note": "it's"}''',
                                      "EXTRA_ARGS": """--root-path "/it's glm" """, **PINNED}, None),
    "vllm-block-64-tp4": ("run.sh", 2, {"BLOCK_SIZE": 64, "TP": 4, **PINNED}, None),
    "engine-one-node": ("run.sh", 1, {"MODEL_REVISION": None}, _local_model("tiny-target")),
    "engine-two-nodes": ("run.sh", 2, {"MODEL_REVISION": None}, _local_model("tiny-target")),
    "guard-off": ("run.sh", 2, {"MEM_GUARD": 0, **PINNED}, None),
    "guard-settings": ("run.sh", 2, {"MEM_SAMPLES_PER_SECOND": 3, "MEM_FLOOR_LOAD_GIB": 0,
                                     "RUNS_DIR": "/var/glm53/runs", "POLL_SECONDS": 2,
                                     "READY_TIMEOUT": 60, **PINNED}, None),
    "engine-env": ("run.sh", 2, {"NCCL_DEBUG_LEVEL": "INFO", "CUDA_ARCH_LIST": "12.0 12.1a",
                                 "ENGINE_READY_TIMEOUT": 600, "PORT": 8080,
                                 "MASTER_PORT": 29600, "HF_CACHE": "/srv/hf",
                                 "JIT_CACHE": "/srv/jit", **PINNED}, None),
    # issue 48: the host levers on every node, B12X, the field's fastest profile, and stop.sh
    # resetting the clocks a record lists
    "host-levers": ("run.sh", 2, {"COMPACT_MEMORY": 1, "GPU_CLOCK_MHZ": "2150", **PINNED}, None),
    "b12x": ("run.sh", 2, {"MOE_BACKEND": "b12x", **PINNED}, None),
    "field-fastest": ("run.sh", 2, {"MOE_BACKEND": "b12x", "TARGET_WEIGHT_FORMAT": "nvfp4",
                                    "COMPACT_MEMORY": 1, "GPU_CLOCK_MHZ": "0,2150",
                                    "FORCE_UNSAFE_WEIGHTS": 1, **PINNED}, None),
    "stop-clock-record": ("stop.sh", 2, {}, _clock_record),
    "stop-2-nodes": ("stop.sh", 2, {}, None),
    "stop-3-nodes": ("stop.sh", 3, {}, None),
}


def normalised(text, tmp):
    return text.replace(str(tmp), "{tmp}").replace(str(REPO), "{repo}")


def dry_run_output(name):
    """The normalised stdout of scenario NAME, run now; fails loudly if it does not succeed."""
    script, nodes, settings, set_up = SCENARIOS[name]
    with tempfile.TemporaryDirectory(prefix="glm53-dry-run-") as folder:
        tmp = Path(folder).resolve()
        extra = set_up(tmp) if set_up else {}
        result = run(tmp, script=script, nodes=nodes, **{**settings, **extra})
        if result.returncode != 0 or result.stderr:
            raise AssertionError(f"{name}: exit {result.returncode}: {result.stderr}")
        return normalised(result.stdout, tmp)


def fixture(name):
    return (FIXTURES / f"{name}.txt").read_text()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only, write nothing")
    args = parser.parse_args(argv)
    FIXTURES.mkdir(parents=True, exist_ok=True)
    differ = []
    for name in SCENARIOS:
        output = dry_run_output(name)
        if args.check:
            if output != fixture(name):
                differ.append(name)
        else:
            (FIXTURES / f"{name}.txt").write_text(output)
    if differ:
        print("differ from their fixture: " + " ".join(differ), file=sys.stderr)
        return 1
    print(f"{len(SCENARIOS)} scenarios {'match' if args.check else 'written to'} "
          f"{FIXTURES.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
