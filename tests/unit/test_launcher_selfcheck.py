"""run.sh's self-check once ready (launcher/apply/selfcheck.py): one Korean answer judged by
recipekit/text_integrity.py, one line; a fault warns, naming the likely cause, and the ranks
keep running; SELF_CHECK=0 asks nothing. Against tests/fakes/fake_vllm.py (which answers a
Korean question in every mode, its --answer-faults planted), alone and through a real
run.sh on a one-node fake cluster whose rank runs the fake."""

from __future__ import annotations

import http.server
import json
import subprocess
import threading

import pytest

from launcher.apply import selfcheck
from tests.compare_cluster import fake_model, fake_rank_command, make_cluster
from tests.fakes import fake_vllm
from tests.timing import HANG_GUARD_S
from tests.unit.test_launcher_support import REPO, dry_run

FAST = ("--step-seconds", "0.0005", "--ttft-seconds", "0.005")
FIELD_PROMPT = "한국어로 퍼셉트론과 신경망의 차이를 자세히 설명해 주세요. 최소 400자 이상으로 작성하세요."


def test_a_clean_answer_prints_one_line_with_its_counts(tmp_path):
    log = tmp_path / "requests.jsonl"
    with fake_vllm.spawn(*FAST, "--request-log", str(log)) as fake:
        code, line, warning = selfcheck.check(fake.url + "/v1")
    assert code == selfcheck.CLEAN and warning is None
    assert line.startswith("glm53: self-check: clean: one Korean answer to the field's prompt "
                           "(700 tokens): 0 U+FFFD, 0 lone surrogates, 0 control chars, 0 "
                           "mojibake runs in the answer; no repeating tail; 0 invalid UTF-8 "
                           "sequences in "), line
    body = json.loads(log.read_text().splitlines()[0])["body"]
    assert body["messages"] == [{"role": "user", "content": FIELD_PROMPT}]
    assert (body["max_tokens"], body["temperature"], body["logprobs"]) == (700, 0.0, True)
    assert body["chat_template_kwargs"] == {"enable_thinking": False}


@pytest.mark.parametrize("fault, counts", [
    ("mb_replacement", "4 U+FFFD, 0 lone surrogates, 0 control chars, 0 mojibake runs in the "
                       "answer"),
    ("mb_token_bytes", "0 U+FFFD, 0 lone surrogates, 0 control chars, 0 mojibake runs in the "
                       "answer; no repeating tail; 1 invalid UTF-8 sequences in "),
    ("mb_reasoning", "1 U+FFFD, 0 lone surrogates, 0 control chars, 0 mojibake runs in the "
                     "reasoning"),
    ("mb_mojibake", "0 U+FFFD, 0 lone surrogates, 0 control chars, 1 mojibake runs in the "
                    "answer"),
    ("mb_loop", "; the answer ends repeating "),
])
def test_a_fault_warns_naming_the_likely_cause(fault, counts):
    with fake_vllm.spawn(*FAST, "--answer-faults", fault) as fake:
        code, line, warning = selfcheck.check(fake.url)
    assert code == selfcheck.FAULT
    assert line.startswith("glm53: self-check: FAULT: one Korean answer") and counts in line
    assert warning.startswith("glm53: WARNING: the served text is corrupted (")
    assert counts in warning
    assert "ModelOpt NVFP4 checkpoint" in warning and "gate's global scale" in warning
    assert warning.endswith("The ranks keep running.")


def test_a_short_answer_is_inconclusive_not_clean():
    with fake_vllm.spawn(*FAST, "--answer-faults", "mb_short") as fake:
        code, line, warning = selfcheck.check(fake.url)
    assert code == selfcheck.INCONCLUSIVE and warning is None
    assert line.startswith("glm53: self-check inconclusive (answer of 120 chars, under 400): ")


def test_a_server_that_refuses_logprobs_is_asked_again_without_them():
    """The text is judged all the same, but with the byte check not run the answer is not
    clean: inconclusive, the line says which check did not run."""
    with fake_vllm.spawn(*FAST, "--faults", "http400@1") as fake:
        code, line, _ = selfcheck.check(fake.url)
    assert code == selfcheck.INCONCLUSIVE
    assert line.startswith("glm53: self-check inconclusive (token byte check not run: no token "
                           "bytes given): one Korean answer"), line
    assert "mojibake runs in the answer; no repeating tail; token byte check not run: no token " \
           "bytes given; 480 chars, 99% of letters in the script" in line


def test_no_server_is_one_line_and_not_a_verdict():
    with fake_vllm.spawn(*FAST) as fake:
        url = fake.url
    code, line, warning = selfcheck.check(url)
    assert code == selfcheck.COULD_NOT_RUN and warning is None
    assert line.startswith(f"glm53: self-check could not run: no answer from {url}/v1/models")
    assert line.endswith("; the ranks keep running") and "\n" not in line


@pytest.mark.parametrize("source", ["environment", "file"])
def test_the_api_key_is_sent_and_shown_nowhere(monkeypatch, capsys, tmp_path, source):
    """From OPENAI_API_KEY, or from --api-key-file (how run.sh calls it with API_AUTH=key); a
    wrong key's 401 is one line naming where the key came from."""
    seen = []
    # 450 Hangul syllables, none repeated, a word of nine and a space; each one token
    answer = " ".join("".join(chr(0xAC00 + 13 * (9 * word + i)) for i in range(9))
                      for word in range(50))
    logprobs = {"content": [{"token": char, "logprob": 0.0, "bytes": list(char.encode())}
                            for char in answer]}

    class Server(http.server.BaseHTTPRequestHandler):
        def reply(self, doc):
            seen.append((self.path, self.headers.get("Authorization")))
            data = json.dumps(doc).encode()
            self.send_response(200 if seen[-1][1] == "Bearer sk-probe-secret" else 401)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self.reply({"data": [{"id": "glm"}]})

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.reply({"choices": [{"message": {"content": answer}, "logprobs": logprobs,
                                     "finish_reason": "stop"}]})

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    key_file, wrong_file = tmp_path / "api-key", tmp_path / "wrong-key"
    for path, key in ((key_file, "sk-probe-secret"), (wrong_file, "sk-wrong")):
        path.write_text(key + "\n")
        path.chmod(0o600)
    if source == "environment":
        monkeypatch.setenv("OPENAI_API_KEY", "sk-probe-secret")
        argv = [url]
    else:
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        argv = [url, "--api-key-file", str(key_file)]
    try:
        code = selfcheck.main(argv)
        out = capsys.readouterr()
        wrong = selfcheck.main([url, "--api-key-file", str(wrong_file)])
        refused = capsys.readouterr()
    finally:
        server.shutdown()
        server.server_close()
    assert code == selfcheck.CLEAN
    assert seen[:2] == [("/v1/models", "Bearer sk-probe-secret"),
                        ("/v1/chat/completions", "Bearer sk-probe-secret")]
    assert "sk-probe-secret" not in out.out + out.err
    assert wrong == selfcheck.COULD_NOT_RUN
    assert refused.out == (f"glm53: self-check could not run: {url}/v1/models answered 401 "
                           f"Unauthorized: the key from {wrong_file} is not the server's; pass "
                           "--api-key-file with the file the server was started with "
                           "(API_KEY_FILE); the ranks keep running\n")
    assert "sk-wrong" not in refused.out + refused.err


def test_dry_run_shows_the_step_and_self_check_0_leaves_it_out(tmp_path):
    shown = dry_run(tmp_path, SELF_CHECK=1).splitlines()
    assert shown[-2].startswith("# once ready, on the head: one Korean answer to the field's "
                                "prompt (700 tokens, greedy)")
    assert shown[-1].startswith(f"python3 {REPO}/launcher/entry.py self-check "
                                "http://127.0.0.1:8000 --api-key-file ")
    assert shown[-1].endswith("/api-key")
    off = dry_run(tmp_path, SELF_CHECK=0)
    assert "self-check" not in off and off.splitlines() == shown[:-2]


# ----------------------------------------------------------------------------- through run.sh


def run_sh(cluster, script: str = "run.sh", **settings) -> subprocess.CompletedProcess:
    env = {**cluster.env, **{name: str(value) for name, value in settings.items()}}
    return subprocess.run([str(REPO / script)], env=env, cwd=cluster.tmp, capture_output=True,
                          text=True, timeout=HANG_GUARD_S, check=False)


@pytest.fixture
def cluster(tmp_path):
    log = tmp_path / "requests.jsonl"
    models = {"clean": fake_model(tmp_path / "models" / "clean", REQUEST_LOG=log),
              "corrupt": fake_model(tmp_path / "models" / "corrupt", REQUEST_LOG=log,
                                    ANSWER_FAULTS="mb_replacement")}
    the_cluster = make_cluster(tmp_path, fake_rank_command(), MODEL=models["clean"],
                               SELF_CHECK=1)
    yield the_cluster, models, log
    run_sh(the_cluster, "stop.sh")


def chat_requests(log) -> list[dict]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [json.loads(line)["body"] for line in lines if '"body"' in line]


def test_run_sh_checks_once_ready_and_the_ranks_keep_running(cluster):
    the_cluster, _, log = cluster
    result = run_sh(the_cluster)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    ready = next(i for i, line in enumerate(lines) if line.startswith("glm53: ready: "))
    assert lines[ready + 1].startswith("glm53: self-check: clean: one Korean answer"), lines
    assert "WARNING" not in result.stderr
    assert [body["messages"][0]["content"] for body in chat_requests(log)] == [FIELD_PROMPT]
    assert the_cluster.containers()["glm53-rank0"]["status"] == "running"


def test_run_sh_warns_on_a_fault_and_leaves_the_server_up(cluster):
    the_cluster, models, _ = cluster
    result = run_sh(the_cluster, MODEL=models["corrupt"])
    assert result.returncode == 0, result.stderr
    assert "glm53: self-check: FAULT: one Korean answer to the field's prompt (700 tokens): 4 " \
           "U+FFFD" in result.stdout
    warning = result.stderr.splitlines()[-1]
    assert warning.startswith("glm53: WARNING: the served text is corrupted (4 U+FFFD"), warning
    assert the_cluster.containers()["glm53-rank0"]["status"] == "running"


def test_self_check_0_asks_nothing(cluster):
    the_cluster, _, log = cluster
    result = run_sh(the_cluster, SELF_CHECK=0)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith("glm53: ready: ")
    assert "self-check" not in result.stdout + result.stderr
    assert chat_requests(log) == []
