"""tests/engine/model_info.py against a stand-in venv whose python answers as vLLM's warm-up
would: the markers are written only for a model info found where the servers read it, a
warm cache starts no process, and every other outcome is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.engine import model_info
from tests.engine.engine_env import EngineEnvError, EngineVenv

# The stand-in python: records its call, then does what $MODE says with each architecture
# (argv after `-c CODE`): "ok" writes the cache file where VLLM_CACHE_ROOT says and reports
# it, "elsewhere" writes it to another directory, "fail" exits 1 as a moved registry would.
FAKE_PYTHON = """#!/usr/bin/env python3
import json, os, sys
from pathlib import Path
calls = Path(os.environ["CALLS"])
calls.write_text(calls.read_text() + json.dumps(sys.argv[3:]) + "\\n" if calls.exists() else
                 json.dumps(sys.argv[3:]) + "\\n")
mode = os.environ["MODE"]
if mode == "fail":
    sys.exit("AttributeError: module 'vllm.model_executor.models.registry' has no attribute "
             "'_run_in_subprocess'")
root = Path(os.environ["VLLM_CACHE_ROOT"]) if mode == "ok" else Path(os.environ["ELSEWHERE"])
left = {}
for arch in sys.argv[3:]:
    path = root / "modelinfos" / f"vllm-model_executor-models-x-{arch}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}")
    left[arch] = str(path)
print("INFO a log line first")
print(json.dumps(left))
"""


@pytest.fixture
def venv(tmp_path: Path) -> EngineVenv:
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return EngineVenv(tmp_path / "venv", "0.32.0")


def env_for(tmp_path: Path, monkeypatch, mode: str) -> dict[str, str]:
    monkeypatch.setenv("MODE", mode)
    monkeypatch.setenv("CALLS", str(tmp_path / "calls"))
    monkeypatch.setenv("ELSEWHERE", str(tmp_path / "elsewhere"))
    return {"VLLM_CACHE_ROOT": str(tmp_path / "cache" / "vllm")}


def calls(tmp_path: Path) -> list[list[str]]:
    path = tmp_path / "calls"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_warm_caches_each_architecture_once_and_a_warm_cache_starts_nothing(
        tmp_path, venv, monkeypatch):
    env = env_for(tmp_path, monkeypatch, "ok")
    model_info.warm(venv, env, ["Qwen3ForCausalLM", "DFlash2DraftModel"])
    root = Path(env["VLLM_CACHE_ROOT"])
    assert model_info.marker(root, "Qwen3ForCausalLM").is_file()
    assert model_info.marker(root, "DFlash2DraftModel").is_file()
    model_info.warm(venv, env, ["Qwen3ForCausalLM", "DFlash2DraftModel"])
    model_info.warm(venv, env, ["Qwen3ForCausalLM"])
    assert calls(tmp_path) == [["Qwen3ForCausalLM", "DFlash2DraftModel"]]


def test_only_the_architectures_not_yet_cached_are_inspected(tmp_path, venv, monkeypatch):
    env = env_for(tmp_path, monkeypatch, "ok")
    model_info.warm(venv, env, ["Qwen3ForCausalLM"])
    model_info.warm(venv, env, ["Qwen3ForCausalLM", "DFlash2DraftModel"])
    assert calls(tmp_path) == [["Qwen3ForCausalLM"], ["DFlash2DraftModel"]]


def test_a_model_info_left_where_the_servers_do_not_read_it_is_refused(
        tmp_path, venv, monkeypatch):
    env = env_for(tmp_path, monkeypatch, "elsewhere")
    with pytest.raises(EngineEnvError, match=r"Qwen3ForCausalLM's model info is at .*elsewhere.*"
                                             r"not in .*cache/vllm/modelinfos where the servers"):
        model_info.warm(venv, env, ["Qwen3ForCausalLM"])
    assert not model_info.marker(Path(env["VLLM_CACHE_ROOT"]), "Qwen3ForCausalLM").exists()


def test_an_inspection_that_fails_is_refused_in_one_line_with_its_error(
        tmp_path, venv, monkeypatch):
    env = env_for(tmp_path, monkeypatch, "fail")
    with pytest.raises(EngineEnvError) as refused:
        model_info.warm(venv, env, ["Qwen3ForCausalLM"])
    assert "inspection of Qwen3ForCausalLM" in str(refused.value)
    assert "has no attribute '_run_in_subprocess'" in str(refused.value)
    assert not model_info.marker(Path(env["VLLM_CACHE_ROOT"]), "Qwen3ForCausalLM").exists()
