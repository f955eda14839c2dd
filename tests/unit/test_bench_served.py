"""The bench measures what the server serves (issue 48, part 7), each rule shown against the
fake server catching the failure it was written for: concurrencies stop at the server's
max_num_seqs (learned from /server_info, from the launcher's settings on this host, or
stated), one beyond it is refused, a wave the server queued invalidates its cell, a failed
warm-up stops the run, a cell whose streams all failed shows no acceptance, and every
client takes its server's URL by one name with a trailing /v1."""

from __future__ import annotations

import json

import pytest

from bench import bench_decode, quality, receipts, report
from tests.fakes import fake_vllm

SEQS = 2


def _run(url: str, tmp_path, *args: str) -> tuple[int, dict | None]:
    out = tmp_path / "result.json"
    code = bench_decode.main(["--url", url, "--warmup", "0", "--quiet", "--json", str(out),
                              "--phase", "prose", "--runs", "1", *args])
    return code, (json.loads(out.read_text()) if out.exists() else None)


def _arrivals(log) -> int:
    return sum("body" in json.loads(line) for line in log.read_text().splitlines()) \
        if log.exists() else 0


@pytest.fixture(scope="module")
def queueing(tmp_path_factory):
    """A server of max_num_seqs 2 that says so on /server_info and holds a third request
    waiting, as vLLM does; 20 ms a token."""
    log = tmp_path_factory.mktemp("queueing") / "requests.jsonl"
    with fake_vllm.spawn("--max-num-seqs", str(SEQS), "--queue", "--step-seconds", "0.02",
                         "--request-log", str(log),
                         env={"VLLM_SERVER_DEV_MODE": "1"}) as fake:
        fake.log = log
        yield fake


def test_the_default_concurrencies_stop_at_the_servers_max_num_seqs(queueing, tmp_path):
    """Before, 1,2,4 against max_num_seqs 2 timed two streams and two queued at c=4."""
    code, doc = _run(queueing.url, tmp_path, "--max-tokens", "8")
    assert code == 0
    assert [c["concurrency"] for c in doc["cells"]] == [1, 2]
    assert doc["settings"]["concurrency"] == [1, 2]
    assert doc["server"]["max_num_seqs"] == {
        "value": SEQS, "source": f"{queueing.url}/server_info (vLLM's VLLM_SERVER_DEV_MODE=1)"}


def test_a_concurrency_beyond_max_num_seqs_is_refused_in_one_line(queueing, tmp_path, capsys):
    before = _arrivals(queueing.log)
    code, doc = _run(queueing.url, tmp_path, "--concurrency", "1,4")
    assert (code, doc) == (2, None)
    assert capsys.readouterr().err == (
        f"bench_decode: --concurrency 1,4: 4 is beyond the server's max_num_seqs {SEQS} (from "
        f"{queueing.url}/server_info (vLLM's VLLM_SERVER_DEV_MODE=1)), so those streams would "
        f"wait in its queue; ask at most {SEQS}, or pass --max-num-seqs if the server runs "
        "more\n")
    assert _arrivals(queueing.log) == before  # nothing was sent


def test_a_wave_the_server_queued_invalidates_its_cell(queueing, tmp_path, capsys):
    """A wrong --max-num-seqs (or none known) lets c=3 run: the third request waits while the
    first two decode (2 s: 101 tokens of 20 ms, the margin /metrics is read within), and the
    cell is void, not a c=2 figure labelled c=3."""
    code, doc = _run(queueing.url, tmp_path, "--max-num-seqs", "3", "--concurrency", "3",
                     "--max-tokens", "101")
    assert code == 1
    (cell,) = doc["cells"]
    assert cell["invalid"] and cell["measured_streams"] == 3 and cell["failed_streams"] == 0
    assert cell["invalid_reason"] == (
        "run 1: /metrics showed 1 request(s) waiting after the wave's first token, so the server "
        "ran fewer than 3 streams at once (its max_num_seqs is below that, or another client "
        "was using it)")
    assert [w["waiting"] for w in doc["waves"]] == [1.0]
    assert doc["server"]["max_num_seqs"] == {"value": 3, "source": "--max-num-seqs"}
    assert "prose c=3 invalid: run 1: /metrics showed 1 request(s) waiting" in \
        capsys.readouterr().err


def test_a_wave_the_server_ran_whole_is_valid(queueing, tmp_path):
    """The same server at c=2: nothing waits (the fake frees a place before its stream's last
    bytes reach the client), so the check cannot void a healthy cell."""
    code, doc = _run(queueing.url, tmp_path, "--concurrency", "2", "--runs", "2",
                     "--max-tokens", "8")
    assert code == 0
    assert [w["waiting"] for w in doc["waves"]] == [0.0, 0.0]
    assert not doc["cells"][0]["invalid"]


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """A server that says nothing of its max_num_seqs (no /server_info)."""
    with fake_vllm.spawn("--max-model-len", "4096", "--step-seconds", "0.01") as fake:
        yield fake


def _launcher_env(monkeypatch, tmp_path, url: str, **values: str) -> None:
    """The launcher's settings on this checkout as a user's shell would hold them."""
    monkeypatch.setenv("CLUSTER_ENV", str(tmp_path / "absent-cluster.env"))
    for name in ("PROFILE", "MAX_NUM_SEQS", "MAX_MODEL_LEN", "PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PORT", url.rsplit(":", 1)[1])
    for name, value in values.items():
        monkeypatch.setenv(name, value)


def test_on_the_head_the_launchers_max_num_seqs_is_the_servers(plain, tmp_path, monkeypatch):
    _launcher_env(monkeypatch, tmp_path, plain.url, MAX_NUM_SEQS="1", MAX_MODEL_LEN="4096")
    code, doc = _run(plain.url, tmp_path, "--max-tokens", "4")
    assert code == 0
    assert [c["concurrency"] for c in doc["cells"]] == [1]
    assert doc["server"]["max_num_seqs"] == {
        "value": 1, "source": "the launcher's MAX_NUM_SEQS on this checkout (its PORT and "
                              "MAX_MODEL_LEN are the server's)"}


def test_launcher_settings_that_are_not_the_servers_are_not_used(plain, tmp_path, monkeypatch):
    """Another max_model_len: another server, or one started with other settings. Unknown:
    the defaults run, the result says why, and a queued wave would void its cell."""
    _launcher_env(monkeypatch, tmp_path, plain.url, MAX_NUM_SEQS="1", MAX_MODEL_LEN="8192")
    code, doc = _run(plain.url, tmp_path, "--max-tokens", "4")
    assert code == 0
    assert [c["concurrency"] for c in doc["cells"]] == [1, 2, 4]
    learned = doc["server"]["max_num_seqs"]
    assert learned["value"] is None
    assert learned["source"] == (
        f"unknown: {plain.url} serves no /server_info (vLLM serves it only with "
        f"VLLM_SERVER_DEV_MODE=1) and {plain.url} serves max_model_len 4096, not the launcher's "
        "MAX_MODEL_LEN 8192; pass --max-num-seqs")
    assert doc["notes"] == [f"max_num_seqs {learned['source']}"]


def test_a_failed_warm_up_stops_the_bench_before_any_cell(tmp_path, capsys):
    """Before, it noted the failure and ran every cell: against a hung server, each stream
    waited out the 600 s timeout."""
    log = tmp_path / "requests.jsonl"
    with fake_vllm.spawn("--faults", "http500@1", "--request-log", str(log)) as fake:
        code = bench_decode.main(["--url", fake.url, "--quiet", "--json",
                                  str(tmp_path / "result.json")])
    assert code == 2 and not (tmp_path / "result.json").exists()
    assert _arrivals(log) == 1
    assert capsys.readouterr().err == (
        "bench_decode: the 16-token warm-up request 1 failed (http_500: fake: injected server "
        "error), so no cell was run; scripts/doctor says more\n")


def test_a_cell_whose_streams_all_failed_shows_no_acceptance(tmp_path, capsys):
    """The server drafted for the broken stream, so the counters moved: before, the cell
    showed acceptance 3.00 (k=2, every draft accepted) with nothing measured."""
    with fake_vllm.spawn("--num-spec-tokens", "2", "--step-seconds", "0.01",
                         "--faults", "error_event@1") as fake:
        code, doc = _run(fake.url, tmp_path, "--concurrency", "1", "--max-tokens", "31")
    assert code == 1
    (cell,) = doc["cells"]
    assert (cell["measured_streams"], cell["failed_streams"]) == (0, 1)
    assert cell["spec_counters"]["drafts"] > 0   # what fooled it
    assert cell["acceptance_length"] is None and cell["draft_acceptance_rate"] is None
    assert cell["per_position_acceptance"] is None
    assert doc["waves"][0]["acceptance_length"] is None
    row = report.markdown_table(doc["cells"]).splitlines()[-1]
    assert row == "| prose | 1 | - | - | - | - | - | 1/1 | - |"
    assert row in capsys.readouterr().out.splitlines()  # the table the bench printed


@pytest.mark.parametrize("given", ["{url}/v1", "{url}/v1/", "{url}/"])
def test_the_url_takes_a_trailing_v1_under_either_name(plain, tmp_path, given):
    for flag in ("--url", "--base-url"):
        out = tmp_path / f"{flag[2:]}.json"
        code = bench_decode.main([flag, given.format(url=plain.url), "--warmup", "0", "--quiet",
                                  "--phase", "prose", "--concurrency", "1", "--runs", "1",
                                  "--max-tokens", "4", "--max-num-seqs", "1", "--json", str(out)])
        assert code == 0
        assert json.loads(out.read_text())["settings"]["url"] == plain.url


PARSERS = {
    "bench_decode": lambda flag, url: bench_decode.build_parser().parse_args([flag, url]),
    "quality": lambda flag, url: quality.build_parser().parse_args(
        ["record", flag, url, "--out", "x.json"]),
    "receipts": lambda flag, url: receipts.build_parser().parse_args(
        ["solo-vs-concurrent", flag, url]),
    "receipts lossless": lambda flag, url: receipts.build_parser().parse_args(
        ["lossless", "--drafted", url, "--undrafted", url]),
}


@pytest.mark.parametrize("tool", sorted(PARSERS))
def test_every_client_takes_the_url_by_one_name_with_v1(tool, capsys):
    flags = ("--drafted",) if tool == "receipts lossless" else ("--url", "--base-url")
    for flag in flags:
        opts = PARSERS[tool](flag, "http://head:8000/v1")
        assert (opts.drafted if tool == "receipts lossless" else opts.url) == "http://head:8000"
    with pytest.raises(SystemExit) as refused:
        PARSERS[tool](flags[-1], "head:8000")
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "must be the server's http:// or https:// URL, like " \
        "http://127.0.0.1:8000, got 'head:8000'" in err
