"""The fake `vllm` executable: started with real vLLM command lines, standard library only,
clean on SIGTERM, and its programmed truth visible on the wire."""

import ast
import itertools
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.fakes import fake_vllm

FAKE = Path(fake_vllm.__file__)


def _get(url):
    with urllib.request.urlopen(url, timeout=5) as reply:
        return reply.status, reply.read().decode()


def _post(url, body):
    request = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return reply.read().decode()


def test_imports_only_the_standard_library():
    tree = ast.parse(FAKE.read_text())
    modules = {alias.name.split(".")[0] for node in ast.walk(tree)
               if isinstance(node, ast.Import) for alias in node.names}
    modules |= {node.module.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.level == 0}
    assert modules - {"__future__"} <= set(sys.stdlib_module_names), modules


def test_real_vllm_command_line_is_accepted_and_honoured():
    spec = json.dumps({"method": "dflash", "model": "/drafts/x", "num_speculative_tokens": 5})
    with fake_vllm.spawn("--served-model-name", "glm", "--tensor-parallel-size", "2",
                         "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1",
                         "--kv-cache-memory", "4445787956", "--speculative-config", spec,
                         "--compilation-config", '{"cudagraph_capture_sizes":[1,2,4]}',
                         "--enforce-eager", "--max-model-len", "327680",
                         "--distributed-executor-backend", "mp") as fake:
        assert _get(fake.url + "/health")[0] == 200
        models = json.loads(_get(fake.url + "/v1/models")[1])
        assert models["data"][0]["id"] == "glm"
        assert json.loads(_get(fake.url + "/version")[1]) == {"version": "0.30.0"}
        _post(fake.url, {"model": "glm", "messages": [{"role": "user", "content": "x"}],
                         "max_tokens": 13})
        metrics = _get(fake.url + "/metrics")[1]
    # 13 tokens = 1 prefill token + two steps each accepting all 5 drafts plus one token
    assert 'vllm:spec_decode_num_drafts_total{engine="0",model_name="glm"} 2.0' in metrics
    assert 'position="4"} 2.0' in metrics and "process_start_time_seconds" in metrics
    assert fake.process.returncode == 0


def test_invalid_speculative_config_exits_non_zero_naming_it():
    result = subprocess.run([sys.executable, str(FAKE), "serve", "m", "--port", "0",
                             "--speculative-config", "{method: dflash"],
                            check=False, capture_output=True, text=True, timeout=20)
    assert result.returncode != 0 and "--speculative-config is not valid JSON" in result.stderr


def test_headless_rank_serves_nothing_and_stops_cleanly_on_sigterm():
    process = subprocess.Popen([sys.executable, str(FAKE), "serve", "m", "--headless",
                                "--port", "0", "--node-rank", "1"], stderr=subprocess.PIPE,
                               text=True)
    assert "headless rank" in process.stderr.readline()
    time.sleep(0.2)
    assert process.poll() is None
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == 0
    process.stderr.close()


def test_launcher_options_report_max_model_len_and_log_the_boot_phases():
    with fake_vllm.spawn("--max-model-len", "200000") as fake:
        assert json.loads(_get(fake.url + "/v1/models")[1])["data"][0]["max_model_len"] == 200000
    process = subprocess.Popen([sys.executable, str(FAKE), "serve", "m", "--port", "0",
                                "--boot-log", "--startup-seconds", "0.6"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    began = time.monotonic()
    assert process.stdout.readline().startswith("fake-vllm listening on ")
    assert time.monotonic() - began >= 0.5
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=10)
    lines = stderr.splitlines()
    assert "Model loading took" in lines[0] and "GPU KV cache size: " in lines[1]
    assert lines[2] == "INFO: Application startup complete."


def test_environment_programs_the_fake_and_counters_can_drop_total():
    env = {"FAKE_VLLM_NUM_SPEC_TOKENS": "2", "FAKE_VLLM_ACCEPT_PATTERN": "1",
           "FAKE_VLLM_METRICS_WITHOUT_TOTAL": "1", "FAKE_VLLM_START_TIME": "1234.5"}
    with fake_vllm.spawn(env=env) as fake:
        _post(fake.url, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 5})
        metrics = _get(fake.url + "/metrics")[1]
    assert 'vllm:spec_decode_num_accepted_tokens{engine="0",model_name="fake/model"} 2.0' \
        in metrics
    assert "_total" not in metrics and "process_start_time_seconds 1234.500" in metrics


def test_stream_follows_the_programmed_schedule_on_absolute_deadlines(tmp_path):
    """Chunks are due at t0 + ttft + j * step: each lands one wake-up's lag after its own
    deadline, not after the sum of every earlier lag. Judged by the fake's own record of when
    it wrote each chunk (its --request-log, the clock its deadlines are set on), not by when
    this process read them, and by what the code controls rather than by how late the fake's
    process woke: never before its deadline, exactly; and the lateness does not accumulate. A
    fake that slept a step after each write would be later at every one of the 40 steps than
    at the one before (each wake-up lag adds); on absolute deadlines the lags are independent,
    so some step lands less late than the previous one (all 40 rising by chance: odds about
    1 in 40!). A bound on the lag itself would measure the machine's load, not the fake."""
    log = tmp_path / "requests.jsonl"
    with fake_vllm.spawn("--step-seconds", "0.01", "--ttft-seconds", "0.05",
                         "--num-spec-tokens", "3", "--accept-pattern", "3,0",
                         "--request-log", str(log)) as fake:
        request = urllib.request.Request(
            fake.url + "/v1/chat/completions", headers={"content-type": "application/json"},
            data=json.dumps({"messages": [{"role": "user", "content": "[x] y"}], "max_tokens": 101,
                             "stream": True, "stream_options": {"include_usage": True,
                                                                "continuous_usage_stats": True}
                             }).encode())
        usages, done = [], False
        with urllib.request.urlopen(request, timeout=10) as reply:
            for raw in reply:
                line = raw.decode().strip()
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    chunk = json.loads(line[6:])
                    if chunk["choices"] and chunk["usage"]["completion_tokens"]:
                        usages.append(chunk["usage"]["completion_tokens"])
    assert done and usages[-1] == 101
    # 1 token, then steps of 4 and 1 tokens: 40 steps carry the other 100
    assert len(usages) == 41 and usages[:4] == [1, 5, 6, 10]
    (arrived,) = [json.loads(entry)["arrival_monotonic"] for entry in log.read_text().splitlines()
                  if "arrival" in json.loads(entry)]
    (sent,) = fake_vllm.deliveries(log).values()
    assert list(itertools.accumulate(sent.chunk_tokens)) == usages
    deadlines = [arrived + 0.05 + j * 0.01 for j in range(41)]
    late = [written - due for written, due in zip(sent.chunk_monotonic, deadlines)]
    assert min(late) >= 0, late
    assert any(later < earlier for earlier, later in itertools.pairwise(late)), late


def test_answer_mode_refuses_a_tool_result_for_a_call_never_made():
    """The probes' second turn is checked as a real server would: a tool message must answer
    an assistant tool call by its id."""
    messages = [{"role": "user", "content": "weather in Paris?"},
                {"role": "assistant", "content": "",
                 "tool_calls": [{"id": "call_1", "type": "function",
                                 "function": {"name": "get_weather", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_2", "content": "{}"}]
    with fake_vllm.spawn("--answer-probes") as fake:
        with pytest.raises(urllib.error.HTTPError) as error:
            _post(fake.url, {"messages": messages})
        assert error.value.code == 400
        assert "tool_call_id 'call_2' matches no assistant tool_calls id" in error.value.read(
            ).decode()
        messages[2]["tool_call_id"] = "call_1"
        answer = json.loads(_post(fake.url, {"messages": messages}))
    assert answer["choices"][0]["message"]["content"].startswith("The tool said: {}")


def test_answer_mode_refuses_an_unknown_fault():
    result = subprocess.run([sys.executable, str(FAKE), "serve", "m", "--port", "0",
                             "--answer-probes", "--answer-faults", "needle_missing,vibes"],
                            check=False, capture_output=True, text=True, timeout=20)
    assert result.returncode != 0 and "--answer-faults vibes unknown" in result.stderr
