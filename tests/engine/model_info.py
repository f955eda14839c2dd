"""vLLM's model-info cache (`$VLLM_CACHE_ROOT/modelinfos`), filled once before servers that
share a cache root start together.

At start `vllm serve` inspects each architecture it loads (the target's, a drafter's) in a
subprocess that imports torch and vLLM (about 10 s of CPU here, 15 s for an overlay through
Triton's interpreter), unless the cache holds the result for the model module's source;
servers started together on an empty cache all pay it (seen: a DFlash2 server 100 s of its
135 s to ready beside two others). `warm` does the inspections once, in one process of the
venv, with vLLM's own cache writer; servers after it read the cache.

    warm(venv, env, ["Qwen3ForCausalLM"])   # env: the servers' (VLLM_CACHE_ROOT, PYTHONPATH)
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from recipekit.pinned_wheels import exclusive
from tests.engine.cache import progress
from tests.engine.engine_env import EngineEnvError, EngineVenv

# Run in the venv: vLLM's inspection of each architecture (argv), done in this process (it is
# the subprocess vLLM would start for it: plugins loaded, then the model class imported), and
# the cache file each one leaves, as JSON.
_WARM = """
import json, sys
from vllm.plugins import load_general_plugins
from vllm.model_executor.models import registry
load_general_plugins()
registry._run_in_subprocess = lambda fn: fn()
left = {}
for arch in sys.argv[1:]:
    model = registry.ModelRegistry.models[arch]
    model.inspect_model_cls()
    left[arch] = str(model._get_cache_dir() / model._get_cache_filename())
print(json.dumps(left))
"""


def marker(cache_root: Path, architecture: str) -> Path:
    return cache_root / "modelinfos" / f".warmed-{architecture}"


def warm(venv: EngineVenv, env: Mapping[str, str], architectures: Sequence[str]) -> None:
    """Fills ENV's VLLM_CACHE_ROOT with the model info of ARCHITECTURES, unless a marker says
    it was; refuses in one line when vLLM's cache did not come out where it reads it."""
    cache_root = Path(env["VLLM_CACHE_ROOT"])
    if all(marker(cache_root, arch).is_file() for arch in architectures):
        return
    with exclusive(cache_root / "modelinfos" / ".warm.lock"):  # one process of the tier warms
        _warm(venv, env, cache_root,
              [arch for arch in architectures if not marker(cache_root, arch).is_file()])


def _warm(venv: EngineVenv, env: Mapping[str, str], cache_root: Path,
          missing: Sequence[str]) -> None:
    if not missing:
        return
    result = venv.run("-c", _WARM, *missing, env=dict(env), timeout=600)
    try:
        left = json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        left = None
    if result.returncode != 0 or not isinstance(left, dict):
        raise EngineEnvError(f"tests/engine/model_info.py: vLLM's model-info inspection of "
                             f"{', '.join(missing)} in {venv.path.name} failed (its registry "
                             f"moved?): {(result.stdout + result.stderr).strip()[-600:]}")
    for arch in missing:
        cached = Path(left.get(arch, ""))
        if cached.parent != cache_root / "modelinfos" or not cached.is_file():
            raise EngineEnvError(f"tests/engine/model_info.py: {arch}'s model info is at "
                                 f"{left.get(arch)!r}, not in {cache_root / 'modelinfos'} where "
                                 f"the servers read it; re-check vLLM's registry.py")
        marker(cache_root, arch).touch()
    progress(f"model info: {', '.join(missing)} cached in {cache_root}")
