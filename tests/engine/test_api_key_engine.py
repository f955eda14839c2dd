"""The API key (issue 37) on a real vLLM engine: run.sh with its defaults (API_AUTH=key)
through tests/fakes/fake-docker, whose rank runs run.sh's `vllm serve` argv on the tiny
target (tests/engine/rank_engine.py, with the `--env-file` variables docker would give it).

vLLM's own middleware answers here, as the image's (the engine venv carries v8_api_key,
tests/engine/engine_env.py IMAGE_STEPS): /v1 without the key is 401, with it 200, and so are
/invocations (SageMaker's route), /generative_scoring, /metrics and /tokenize, which stock
vLLM serves without the key; /health stays open. The key is on no argv and in nothing the run
printed or recorded. The bench tools reach the keyed server by the key file alone
(scripts/compare's engine test runs the quality gate, the receipts and the probes the same
way, every boot keyed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from tests.compare_cluster import make_cluster
from tests.engine.cache import engine_cache_root
from tests.engine.engine_server import note_ready
from tests.unit.test_launcher_support import REPO

pytestmark = pytest.mark.timeout(1800)
RUN_GUARD_S = 900


def status_of(url: str, key: str | None = None, body: dict | None = None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = None
    if body is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.fixture(scope="module")
def keyed(engine, models, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("api-key-engine")
    cluster = make_cluster(
        tmp, f"{sys.executable} -m tests.engine.rank_engine", MODEL=models.target,
        MAX_MODEL_LEN=4096, KV_CACHE_MEMORY_BYTES=256 << 20, ENFORCE_EAGER=1, MAX_NUM_SEQS=4,
        READY_TIMEOUT=RUN_GUARD_S, PYTHONPATH=REPO, ENGINE_RANK_VENV=engine.path,
        ENGINE_RANK_PATH=os.environ["PATH"], GLM53_ENGINE_CACHE=engine_cache_root())
    assert "API_AUTH" not in cluster.env  # the default: a key
    begun = time.monotonic()
    started = subprocess.run([str(REPO / "run.sh")], env=cluster.env, cwd=tmp,
                             capture_output=True, text=True, timeout=RUN_GUARD_S, check=False)
    note_ready("run.sh", time.monotonic() - begun, time.monotonic() - begun)
    try:
        yield cluster, started
    finally:
        subprocess.run([str(REPO / "stop.sh")], env=cluster.env, cwd=tmp, capture_output=True,
                       timeout=120, check=False)


def test_the_default_run_serves_v1_to_its_key_alone(keyed):
    cluster, started = keyed
    assert started.returncode == 0, started.stdout + started.stderr
    key_file = cluster.tmp / "api-key"
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    key = key_file.read_text().strip()
    base = f"http://127.0.0.1:{cluster.env['PORT']}"
    assert status_of(base + "/v1/models") == 401
    assert status_of(base + "/v1/models", "not-" + key) == 401
    assert status_of(base + "/v1/models", key) == 200
    assert status_of(base + "/health") == 200  # open, as docs/security.md says
    # the routes stock vLLM serves without the key (issue 46), closed by v8_api_key
    completion = {"prompt": "hi", "max_tokens": 1}  # /invocations dispatches it to completions
    for path, body in (("/invocations", completion), ("/generative_scoring", {"prompt": "hi"}),
                       ("/metrics", None), ("/tokenize", {"prompt": "hi"})):
        assert status_of(base + path, body=body) == 401, path
        assert status_of(base + path, "not-" + key, body=body) == 401, path
    assert status_of(base + "/invocations", key, body=completion) == 200
    assert status_of(base + "/metrics", key) == 200
    # on no argv (docker's, the rank's vllm), in no output or record of the run
    seen = [started.stdout, started.stderr, (cluster.state / "calls.jsonl").read_text(),
            *(p.read_text(errors="replace") for p in (cluster.tmp / "runs").rglob("*")
              if p.is_file()),
            *(p.read_text() for p in cluster.state.glob("*.argv.json"))]
    assert [text for text in seen if key in text] == []
    assert f"Authorization: Bearer $(cat {key_file})" in started.stdout


def test_the_bench_and_the_probes_reach_it_by_the_key_file(keyed, tmp_path):
    cluster, started = keyed
    assert started.returncode == 0, started.stderr
    url = f"http://127.0.0.1:{cluster.env['PORT']}"
    env = {**os.environ, "OPENAI_API_KEY": ""}
    key_file = str(cluster.tmp / "api-key")
    # no warm-up: on a busy CPU the server may merge its 16 tokens into one chunk, which the
    # bench refuses (too_short) before it runs any cell (seen in a whole tier run beside
    # other work); the measured stream tolerates it (below)
    bench = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_decode.py"), "--url", url, "--phase",
         "prose", "--concurrency", "1", "--runs", "1", "--max-tokens", "64", "--quiet",
         "--warmup", "0", "--api-key-file", key_file, "--json", str(tmp_path / "bench.json")],
        env=env, capture_output=True, text=True, timeout=RUN_GUARD_S, check=False)
    # too_short is judged only after a whole keyed stream (usage, [DONE]): the server merged
    # its chunks, which a busy CPU may make it do; any other failure is the key's
    stream, = json.loads((tmp_path / "bench.json").read_text())["waves"][0]["streams"]
    assert stream["failure"] in (None, "too_short"), bench.stdout + bench.stderr
    assert stream["completion_tokens"] == 64 and stream["saw_done"]
    assert bench.returncode == (0 if stream["failure"] is None else 1), bench.stdout + bench.stderr
    probed = subprocess.run(
        [sys.executable, str(REPO / "bench" / "probes.py"), "--base-url", url, "--only",
         "multibyte", "--api-key-file", key_file, "--json", str(tmp_path / "probes.json")],
        env=env, capture_output=True, text=True, timeout=RUN_GUARD_S, check=False)
    # the random tiny target's bytes may or may not be whole: a verdict, not an error
    result = json.loads((tmp_path / "probes.json").read_text())["probes"]["multibyte"]
    assert probed.returncode in (0, 1) and result["status"] in ("pass", "fail", "inconclusive"), \
        probed.stdout + probed.stderr
    wrong = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_decode.py"), "--url", url, "--phase",
         "prose", "--concurrency", "1", "--runs", "1", "--max-tokens", "8", "--quiet"],
        env={**env, "OPENAI_API_KEY": "not-the-key"}, capture_output=True, text=True,
        timeout=RUN_GUARD_S, check=False)
    assert wrong.returncode != 0
    assert "401 Unauthorized: the key from OPENAI_API_KEY is not the server's" in \
        wrong.stdout + wrong.stderr
