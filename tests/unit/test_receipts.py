"""Receipts: identical outputs pass, a planted difference fails naming its position, a
planted near-tie is classed as one; each receipt's exit code is its verdict."""

import json

import pytest

from bench import receipts
from bench.greedy import GreedyOutput, compare_outputs
from tests.fakes import fake_vllm

FAST = ("--step-seconds", "0.001", "--ttft-seconds", "0.005")


def _take(tmp_path, *args):
    out = tmp_path / "verdict.json"
    code = receipts.main([*args, "--max-tokens", "24", "--json", str(out)])
    return code, json.loads(out.read_text()) if out.exists() else None


@pytest.fixture(scope="module")
def undrafted():
    with fake_vllm.spawn(*FAST, "--near-ties", "11") as fake:
        yield fake


def test_lossless_identical_passes(tmp_path, undrafted):
    with fake_vllm.spawn(*FAST, "--near-ties", "11", "--num-spec-tokens", "3",
                         "--accept-pattern", "3,0,1") as drafted:
        code, verdict = _take(tmp_path, "lossless", "--drafted", drafted.url,
                              "--undrafted", undrafted.url)
    assert code == 0 and verdict["passed"]
    assert {r["verdict"] for r in verdict["results"]} == {"identical"}
    assert all(r["compared"] == 24 for r in verdict["results"])


def test_lossless_planted_difference_fails_at_its_position(tmp_path, undrafted, capsys):
    with fake_vllm.spawn(*FAST, "--near-ties", "11", "--num-spec-tokens", "3",
                         "--diverge-at", "7") as drafted:
        code, verdict = _take(tmp_path, "lossless", "--drafted", drafted.url,
                              "--undrafted", undrafted.url)
    assert code == 1 and not verdict["passed"]
    for result in verdict["results"]:
        assert result["verdict"] == "differs" and result["position"] == 7
        assert result["margin_a"] == pytest.approx(3.0)
    assert "FAIL prompt 1 (undrafted vs drafted): differs at position 7" in capsys.readouterr().out


def test_lossless_planted_near_tie_is_classed_as_one(tmp_path, undrafted):
    with fake_vllm.spawn(*FAST, "--near-ties", "11", "--num-spec-tokens", "3",
                         "--flip-near-ties") as drafted:
        code, verdict = _take(tmp_path, "lossless", "--drafted", drafted.url,
                              "--undrafted", undrafted.url)
        assert code == 0
        assert [r["verdict"] for r in verdict["results"]] == ["near_tie"] * 4
        assert all(r["position"] == 11 and r["margin_b"] == pytest.approx(0.05)
                   for r in verdict["results"])
        # the same flip judged against a threshold below its margin is a failure
        code, verdict = _take(tmp_path, "lossless", "--drafted", drafted.url,
                              "--undrafted", undrafted.url, "--near-tie-nats", "0.01")
    assert code == 1 and verdict["results"][0]["verdict"] == "differs"


def test_lossless_refuses_a_drafted_server_that_does_not_draft(tmp_path, undrafted, capsys):
    code, verdict = _take(tmp_path, "lossless", "--drafted", undrafted.url,
                          "--undrafted", undrafted.url)
    assert code == 1 and "made no drafts" in verdict["problems"][0]
    assert "FAIL the drafted server" in capsys.readouterr().out


def test_solo_vs_concurrent(tmp_path, undrafted):
    code, verdict = _take(tmp_path, "solo-vs-concurrent", "--url", undrafted.url)
    assert code == 0 and verdict["passed"]
    # a server that decodes differently under load: later arrivals of the batch diverge
    with fake_vllm.spawn("--step-seconds", "0.002", "--diverge-at", "3",
                         "--diverge-when", "concurrent") as fake:
        code, verdict = _take(tmp_path, "solo-vs-concurrent", "--url", fake.url)
    assert code == 1
    differing = [r for r in verdict["results"] if r["verdict"] == "differs"]
    assert differing and all(r["position"] == 3 for r in differing)


def test_resumed_vs_fresh(tmp_path, undrafted):
    code, verdict = _take(tmp_path, "resumed-vs-fresh", "--url", undrafted.url)
    assert code == 0 and verdict["passed"]
    # a server whose prefix-cached continuation decodes differently
    with fake_vllm.spawn(*FAST, "--diverge-at", "5", "--diverge-when", "cached") as fake:
        code, verdict = _take(tmp_path, "resumed-vs-fresh", "--url", fake.url)
    assert code == 1
    assert [(r["verdict"], r["position"]) for r in verdict["results"]] == [("differs", 5)] * 4


def test_receipt_that_cannot_be_taken_exits_2(tmp_path, capsys):
    code, _ = _take(tmp_path, "solo-vs-concurrent", "--url", "http://127.0.0.1:9")
    assert code == 2 and "cannot take the receipt" in capsys.readouterr().err
    empty = tmp_path / "prompts.txt"
    empty.write_text("# nothing\n\n")
    code, _ = _take(tmp_path, "solo-vs-concurrent", "--prompts", str(empty))
    assert code == 2 and "no prompts in it" in capsys.readouterr().err


def _out(tokens, margins):
    return GreedyOutput(tokens, margins, "", None, None)


def test_comparison_rules():
    same = _out(["a", "b"], [1.0, 1.0])
    assert compare_outputs(same, same, 0.2).verdict == "identical"
    # an early end is a difference: there is no margin to call it a near-tie
    ended = compare_outputs(_out(["a"], [1.0]), same, 0.2)
    assert (ended.verdict, ended.position, ended.token_a) == ("differs", 1, "<end>")
    # a near-tie needs both sides under the threshold; one missing margin fails closed
    assert compare_outputs(_out(["a", "x"], [1, 0.1]), _out(["a", "y"], [1, 0.1]),
                           0.2).verdict == "near_tie"
    assert compare_outputs(_out(["a", "x"], [1, 0.1]), _out(["a", "y"], [1, 0.5]),
                           0.2).verdict == "differs"
    assert compare_outputs(_out(["a", "x"], [1, 0.1]), _out(["a", "y"], [1, None]),
                           0.2).verdict == "differs"
