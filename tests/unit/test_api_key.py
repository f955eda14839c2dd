"""The API key (issue 37): its file, the launcher that hands it to rank 0 and the clients
that send it.

The launcher's part runs a real run.sh against tests/fakes/fake-docker (which reads
`--env-file` as docker does) and fake-ssh; the clients' part runs bench/'s tools against
tests/fakes/fake_vllm.py started with `--api-key`, which guards /v1 as vLLM 0.30.0 does.
"""

import json
import os
import stat

import pytest

from bench import bench_decode, probes, quality, receipts
from launcher.plan import apikey as launcher_apikey
from recipekit import apikey, recipe
from recipekit.layers.v8_api_key import open_paths
from tests.fakes import fake_vllm
from tests.unit.test_launcher_lifecycle import (
    HEAD,
    WORKER,
    calls,
    containers,
    make_cluster,
    serve,
    started,
)
from tests.unit.test_launcher_support import FAKE_SSH, REPO, dry_run, run, serve_commands

KEY = "k3y-planted-for-the-test_0123456789abcdefghijklm"


def planted_key(path, mode=0o600, key=KEY):
    path.write_text(key + "\n")
    path.chmod(mode)
    return path


def everything_recorded(tmp_path, state, result) -> str:
    """What a run left where people and tools look: its stdout and stderr, every docker call
    on every node (the argv ps would show), and every file of its run records (RUNS_DIR)."""
    parts = [result.stdout, result.stderr, (state / "calls.jsonl").read_text()]
    runs = tmp_path / "runs"
    if runs.exists():
        parts += [path.read_text(errors="replace") for path in runs.rglob("*") if path.is_file()]
    return "\n".join(parts)


# ----------------------------------------------------------------------------- the key file


def test_the_default_key_file_is_the_recipes_and_git_ignores_it():
    default = apikey.default_key_file()
    assert default == REPO / recipe.load().knobs["API_KEY_FILE"].default
    ignored = (REPO / ".gitignore").read_text().splitlines()
    assert "/" + str(default.relative_to(REPO)) in ignored


def test_a_new_key_is_random_one_line_and_its_owners_alone(tmp_path):
    first, second = tmp_path / "a" / "key", tmp_path / "b"
    key = apikey.create_key(first)
    assert stat.S_IMODE(first.stat().st_mode) == 0o600
    assert apikey.read_key(first) == key and len(key) >= 43
    assert apikey.create_key(second) != key
    with pytest.raises(FileExistsError):
        apikey.create_key(first)  # never over an existing key
    assert apikey.read_key(first) == key


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660])
def test_a_key_file_others_can_read_is_refused_naming_it(tmp_path, mode):
    path = planted_key(tmp_path / "key", mode)
    with pytest.raises(apikey.KeyFileError) as refused:
        apikey.read_key(path)
    assert str(refused.value) == (f"{path} has mode {mode:04o}: others can read the API key; run "
                                  f"chmod 600 {path} (or delete it, and ./run.sh writes a new key)")
    assert KEY not in str(refused.value)


@pytest.mark.parametrize("text", ["", "\n", "two words\n", "one\ntwo\n"])
def test_a_key_file_without_one_key_is_refused(tmp_path, text):
    path = tmp_path / "key"
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(apikey.KeyFileError, match="does not hold one key on one line"):
        apikey.read_key(path)


def test_a_client_takes_the_file_given_then_openai_api_key_then_the_default(tmp_path,
                                                                           monkeypatch):
    given = planted_key(tmp_path / "given", key="from-the-file")
    environ = {"OPENAI_API_KEY": "from-the-environment"}
    assert apikey.client_key(str(given), environ) == apikey.ClientKey("from-the-file", str(given))
    assert apikey.client_key(None, environ) == apikey.ClientKey("from-the-environment",
                                                                "OPENAI_API_KEY")
    default = planted_key(tmp_path / "default", key="from-the-default")
    monkeypatch.setattr(apikey, "default_key_file", lambda the_recipe=None: default)
    assert apikey.client_key(None, {}) == apikey.ClientKey("from-the-default", str(default))
    default.unlink()
    none = apikey.client_key(None, {})
    assert none.value is None and none.headers() == {}
    assert none.source == f"no --api-key-file, no OPENAI_API_KEY, no {default}"
    with pytest.raises(apikey.KeyFileError, match="does not exist"):
        apikey.client_key(str(tmp_path / "missing"), environ)  # a file given must be there


# ----------------------------------------------------------------------------- the launcher


@pytest.fixture
def first_run(tmp_path):
    """A real run.sh on a fresh head: no key file yet."""
    state = make_cluster(tmp_path)
    result = serve(tmp_path, state, FAKE_CURL_READY_AFTER=1)
    assert result.returncode == 0, result.stderr
    return state, result


def test_the_first_run_writes_a_key_0600_and_hands_it_to_rank_0_only_by_env_file(tmp_path,
                                                                               first_run):
    state, result = first_run
    key_file = tmp_path / "api-key"
    key = apikey.read_key(key_file)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert (f"glm53: wrote a new random API key to {key_file} (mode 0600, git-ignored; later "
            "runs reuse it)") in result.stdout.splitlines()
    head = containers(state, "head")["glm53-rank0"]
    (env_file,) = head["env_file"]
    assert env_file["mode"] == "0600" and env_file["uid"] == os.geteuid()
    assert head["env_file_env"] == [f"VLLM_API_KEY={key}"]
    assert not os.path.exists(env_file["path"])  # removed once the rank started
    worker = containers(state, WORKER)["glm53-rank1"]
    assert worker["env_file"] == [] and "--env-file" not in worker["argv"]
    assert key not in everything_recorded(tmp_path, state, result)


def test_the_start_up_line_says_how_to_call_the_api_and_what_stays_open(tmp_path, first_run):
    _, result = first_run
    key_file = tmp_path / "api-key"
    (startup,) = [line for line in result.stdout.splitlines() if line.startswith("glm53: model ")]
    assert startup.endswith(
        f"; API key in {key_file}: send 'Authorization: Bearer $(cat {key_file})'; every route "
        "but /health needs it (docs/security.md)")


def test_an_image_from_elsewhere_is_not_said_to_guard_every_route(tmp_path):
    stdout = run(tmp_path, IMAGE="vllm/vllm-openai:latest", FORCE_STOCK_IMAGE=1).stdout
    assert stdout.splitlines()[0].endswith(
        "; IMAGE=vllm/vllm-openai:latest is not of the image chain, whose v8 layer guards every "
        "route: its vLLM may answer routes outside /v1 without the key (docs/security.md)")


def test_the_key_survives_a_second_run_unchanged(tmp_path, first_run):
    state, _ = first_run
    key = (tmp_path / "api-key").read_text()
    stopped = run(tmp_path, script="stop.sh", DRY_RUN=0, SSH=str(FAKE_SSH), FAKE_DOCKER_STATE=state)
    assert stopped.returncode == 0, stopped.stderr
    again = serve(tmp_path, state, FAKE_CURL_READY_AFTER=1)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "api-key").read_text() == key
    assert "wrote a new random API key" not in again.stdout
    assert containers(state, "head")["glm53-rank0"]["env_file_env"] == [
        f"VLLM_API_KEY={key.strip()}"]
    assert key.strip() not in everything_recorded(tmp_path, state, again)


@pytest.mark.parametrize("mode", [0o644, 0o640])
def test_a_loose_key_file_is_refused_in_one_line_before_anything_runs(tmp_path, mode):
    state = make_cluster(tmp_path)
    key_file = planted_key(tmp_path / "api-key", mode)
    result = serve(tmp_path, state, FAKE_CURL_READY_AFTER=1)
    assert result.returncode == 2
    assert result.stderr == (
        f"refused: API_KEY_FILE={key_file}: has mode {mode:04o}: others can read the API key; "
        f"run chmod 600 {key_file} (or delete it, and ./run.sh writes a new key)\n")
    assert not (state / "calls.jsonl").exists()  # not even the running check
    assert key_file.read_text() == KEY + "\n"  # left as it was


def test_dry_run_names_where_the_key_comes_from_never_the_key(tmp_path):
    key_file = planted_key(tmp_path / "api-key")
    stdout = dry_run(tmp_path)
    assert KEY not in stdout
    assert (f"# API key: {key_file} (API_KEY_FILE), written with a random key, mode 0600, when "
            "missing and refused when others can read it; rank 0 gets it as VLLM_API_KEY from "
            "<api-key-env-file>, a 0600 file removed once the rank started") in stdout.splitlines()
    ranks = serve_commands(stdout)
    head = ranks[0][1]
    assert head[head.index("--env-file") + 1] == "<api-key-env-file>"
    assert "--env-file" not in ranks[1][1]
    assert not any(word.startswith("VLLM_API_KEY") for _, argv in ranks.values() for word in argv)


def test_api_auth_none_serves_open_and_says_who_can_reach_it(tmp_path):
    state = make_cluster(tmp_path)
    result = serve(tmp_path, state, FAKE_CURL_READY_AFTER=1, API_AUTH="none")
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "api-key").exists()
    (startup,) = [line for line in result.stdout.splitlines() if line.startswith("glm53: model ")]
    assert startup.endswith("; API open (API_AUTH=none): anyone who can reach port 8000 on any "
                            "address of the head can use it")
    for call in started(state):
        assert "--env-file" not in call["argv"]
    assert containers(state, "head")["glm53-rank0"]["env_file_env"] == []
    assert "# API key:" not in dry_run(tmp_path, API_AUTH="none")


STDIN_CURL = """#!/bin/sh
# Answers every poll; what a poll for /v1 read on stdin is kept in curl-stdin, its argv in
# curl-argv.
echo "$*" >>"$FAKE_DOCKER_STATE/curl-argv"
case "$*" in *"--config -"*) cat >>"$FAKE_DOCKER_STATE/curl-stdin" ;; esac
exit 0
"""


def test_the_models_wait_sends_the_key_on_curls_stdin_never_in_its_argv(tmp_path):
    state = make_cluster(tmp_path)
    curl = tmp_path / "bin" / "curl"
    curl.write_text(STDIN_CURL)
    key_file = planted_key(tmp_path / "api-key")
    result = serve(tmp_path, state, READY_CHECK="models")
    assert result.returncode == 0, result.stderr
    assert (state / "curl-stdin").read_text() == f'header = "Authorization: Bearer {KEY}"\n'
    argv = (state / "curl-argv").read_text()
    assert "--config -" in argv and "/v1/models" in argv and KEY not in argv
    assert key_file.read_text() == KEY + "\n"
    assert KEY not in everything_recorded(tmp_path, state, result)


def test_the_health_wait_sends_no_key(tmp_path):
    state = make_cluster(tmp_path)
    (tmp_path / "bin" / "curl").write_text(STDIN_CURL)
    result = serve(tmp_path, state)
    assert result.returncode == 0, result.stderr
    assert not (state / "curl-stdin").exists()
    assert "--config" not in (state / "curl-argv").read_text()


# ----------------------------------------------------------------------------- the clients


CLIENTS = {  # every bench tool that reads a server: its argv after the URL
    "bench": lambda url, out, *key: bench_decode.main(
        ["--url", url, "--quiet", "--runs", "1", "--concurrency", "1", "--max-tokens", "4",
         "--warmup", "0", "--phase", "structured", *key]),
    "probes": lambda url, out, *key: probes.main(
        ["--base-url", url, "--only", "counting", "--quiet", *key]),
    "receipts": lambda url, out, *key: receipts.main(
        ["solo-vs-concurrent", "--url", url, "--max-tokens", "4", *key]),
    "quality": lambda url, out, *key: quality.main(
        ["record", "--url", url, "--out", str(out), "--quiet", "--max-tokens", "4",
         "--needle-words", "20", *key]),
}
FAST = ("--step-seconds", "0.0005", "--ttft-seconds", "0.001")


@pytest.fixture(scope="module")
def keyed_servers():
    """Two fakes guarded by KEY: one answering the probes, one with logprobs for the rest."""
    with fake_vllm.spawn(*FAST, "--answer-probes", "--api-key", KEY, model="org/glm-fake") as \
            answering, fake_vllm.spawn(*FAST, "--api-key", KEY) as scoring:
        yield {"probes": answering, "other": scoring}


@pytest.fixture
def keyed_server(request, keyed_servers):
    """The keyed fake the test's TOOL reads (the scoring one when the test names none)."""
    tool = request.node.callspec.params.get("tool") if hasattr(request.node, "callspec") else None
    return keyed_servers["probes" if tool == "probes" else "other"]


@pytest.mark.parametrize("tool", sorted(CLIENTS))
def test_every_client_reads_the_key_file_it_is_given(tool, tmp_path, keyed_server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    key_file = planted_key(tmp_path / "api-key")
    code = CLIENTS[tool](keyed_server.url, tmp_path / "out.json", "--api-key-file", str(key_file))
    assert code == 0


@pytest.mark.parametrize("tool", sorted(CLIENTS))
def test_every_client_honours_openai_api_key(tool, tmp_path, keyed_server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    assert CLIENTS[tool](keyed_server.url, tmp_path / "out.json") == 0


@pytest.mark.parametrize("tool", sorted(CLIENTS))
def test_a_401_is_one_line_saying_where_the_key_came_from(tool, tmp_path, keyed_server,
                                                          monkeypatch, capsys):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    wrong = planted_key(tmp_path / "wrong", key="not-the-servers-key")
    code = CLIENTS[tool](keyed_server.url, tmp_path / "out.json", "--api-key-file", str(wrong))
    assert code == 2
    err = capsys.readouterr().err
    assert (f"{keyed_server.url}/v1/models answered 401 Unauthorized: the key from {wrong} is "
            "not the server's; pass --api-key-file with the file the server was started with "
            "(API_KEY_FILE)") in err
    assert len([line for line in err.splitlines() if "401" in line]) == 1
    assert "not-the-servers-key" not in err


@pytest.mark.parametrize("tool", sorted(CLIENTS))
def test_a_loose_key_file_is_refused_by_every_client(tool, tmp_path, keyed_server, capsys):
    loose = planted_key(tmp_path / "loose", 0o644)
    code = CLIENTS[tool](keyed_server.url, tmp_path / "out.json", "--api-key-file", str(loose))
    assert code == 2
    assert f"{loose} has mode 0644: others can read the API key" in capsys.readouterr().err


def test_the_fake_guards_every_route_but_health_as_the_chain_does(keyed_server):
    import urllib.error
    import urllib.request

    assert fake_vllm.OPEN_PATHS == open_paths() == frozenset(launcher_apikey.OPEN_PATHS)
    for path in ("/v1/models", "/metrics", "/version", "/invocations"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(keyed_server.url + path, timeout=5)
        assert refused.value.code == 401, path
    for path in ("/v1/models", "/metrics", "/version"):
        keyed = urllib.request.Request(keyed_server.url + path,
                                       headers={"Authorization": f"Bearer {KEY}"})
        assert urllib.request.urlopen(keyed, timeout=5).status == 200, path
    assert urllib.request.urlopen(keyed_server.url + "/health", timeout=5).status == 200


def test_a_key_in_a_receipts_settings_is_never_written(tmp_path, keyed_server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    out = tmp_path / "receipt.json"
    assert receipts.main(["solo-vs-concurrent", "--url", keyed_server.url, "--max-tokens", "4",
                          "--json", str(out)]) == 0
    assert KEY not in out.read_text()
    assert json.loads(out.read_text())["settings"]["api_key_file"] is None
