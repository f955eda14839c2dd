"""The quality gate against fakes whose distributions are known: an identical candidate
passes at KL 0, a tilted one has exactly the KL its tilt implies and fails beyond the band
an A/A run measured, a greedy flip at a planted near-tie is reported as one, and a server
that tokenizes differently or answers garbage makes the gate refuse (exit 2)."""

import json
import math

import pytest

from bench import divergence, plot, quality
from tests.fakes import fake_vllm

MAX_TOKENS = 24
NEEDLE_WORDS = 300
TOP_N = 5


def _run(tmp_path, name, *args):
    out = tmp_path / f"{name}.json"
    code = quality.main([*args, "--out", str(out), "--quiet"])
    return code, (json.loads(out.read_text()) if out.exists() else None), out


@pytest.fixture(scope="module")
def reference():
    with fake_vllm.spawn("--near-ties", "11") as fake:
        yield fake


@pytest.fixture
def recorded(tmp_path, reference):
    code, doc, path = _run(tmp_path, "ref", "record", "--url", reference.url,
                           "--max-tokens", str(MAX_TOKENS), "--top-n", str(TOP_N),
                           "--needle-words", str(NEEDLE_WORDS))
    assert code == 0
    return doc, path


def tilt_kl(tilt: float) -> float:
    """KL(reference || tilted) of the fake's listed distribution, over the top N and a tail
    bucket, from its definition (top-1 at -0.01 nats, lowered by `tilt` in the candidate; its
    listed mass exceeds 1, so the reference's tail is empty, as divergence.py clamps it)."""
    top = fake_vllm.TOP_LOGPROB
    margin = fake_vllm.CLEAR_MARGIN_NATS
    listed = [top, top - margin] + [top - margin - i for i in range(1, TOP_N - 1)]
    p = [math.exp(lp) for lp in listed]
    q = [math.exp(listed[0] - tilt)] + p[1:]
    p_tail = max(1 - sum(p), 0.0)
    return p[0] * tilt + (p_tail * math.log(p_tail / (1 - sum(q))) if p_tail else 0.0)


def test_record_has_every_phase_with_top_n_per_token(recorded):
    doc, _ = recorded
    assert [p["phase"] for p in doc["prompts"]] == list(quality.PHASES)
    for prompt in doc["prompts"]:
        assert len(prompt["tokens"]) == MAX_TOKENS
        assert all(len(top) == TOP_N for top in prompt["top"])
        assert prompt["prompt_tokens"][-1] == fake_vllm.PROMPT_END
    needle = next(p for p in doc["prompts"] if p["phase"] == "needle")
    assert len(needle["prompt_tokens"]) > 5 * len(doc["prompts"][0]["prompt_tokens"])


def test_identical_candidate_passes_at_kl_zero(tmp_path, recorded):
    _, ref = recorded
    with fake_vllm.spawn("--near-ties", "11") as second:
        code, band, band_path = _run(tmp_path, "band", "aa", "--reference", str(ref),
                                     "--url", second.url)
        assert code == 0 and band["overall"]["kl_mean"] == 0.0
        code, gate, _ = _run(tmp_path, "gate", "gate", "--reference", str(ref), "--band",
                             str(band_path), "--url", second.url)
    assert code == 0 and gate["passed"]
    assert gate["overall"]["top1_agreement"] == 1.0
    assert gate["overall"]["positions"] == MAX_TOKENS * len(quality.PHASES)
    assert {p["first_divergence"]["verdict"] for p in gate["prompts"]} == {"identical"}


def test_tilted_candidate_has_the_kl_its_tilt_implies_and_fails_beyond_the_band(
        tmp_path, recorded, capsys):
    _, ref = recorded
    with fake_vllm.spawn("--near-ties", "11", "--logprob-tilt", "0.02") as noisy:
        code, band, band_path = _run(tmp_path, "band", "aa", "--reference", str(ref),
                                     "--url", noisy.url)
    assert code == 0
    # the near-tie position has another margin: compare the clear positions only
    kls = [k for p in band["prompts"] for i, k in enumerate(p["kl"]) if i != 11]
    assert kls == pytest.approx([tilt_kl(0.02)] * len(kls), rel=1e-3)
    for tilt, passes in (("0.01", True), ("0.02", True), ("0.2", False)):
        with fake_vllm.spawn("--near-ties", "11", "--logprob-tilt", tilt) as candidate:
            code, gate, _ = _run(tmp_path, "gate", "gate", "--reference", str(ref), "--band",
                                 str(band_path), "--url", candidate.url)
        assert (code, gate["passed"]) == ((0, True) if passes else (1, False)), tilt
        assert gate["overall"]["kl_mean"] > 0
        if passes:
            assert gate["overall"]["top1_agreement"] == 1.0
    assert "FAIL overall kl_mean" in capsys.readouterr().out
    failed = {(c["scope"], c["metric"]) for c in gate["checks"] if not c["passed"]}
    assert ("overall", "kl_mean") in failed and ("prose", "kl_mean") in failed
    # a tilt of 0.2 nats exceeds the near-tie's 0.05 margin: top-1 flips there, only there
    assert {tuple(p["top1_disagree_at"]) for p in gate["prompts"]} == {(11,)}


def test_band_scale_widens_the_limit(tmp_path, recorded):
    _, ref = recorded
    with fake_vllm.spawn("--near-ties", "11", "--logprob-tilt", "0.02") as noisy:
        _, _, band_path = _run(tmp_path, "band", "aa", "--reference", str(ref),
                               "--url", noisy.url)
    with fake_vllm.spawn("--near-ties", "11", "--logprob-tilt", "0.05") as candidate:
        strict, _, _ = _run(tmp_path, "g1", "gate", "--reference", str(ref), "--band",
                            str(band_path), "--url", candidate.url)
        wide, _, _ = _run(tmp_path, "g2", "gate", "--reference", str(ref), "--band",
                          str(band_path), "--url", candidate.url, "--band-scale", "10")
    assert (strict, wide) == (1, 0)


def test_near_tie_flip_is_reported_as_one_and_a_clear_one_as_a_difference(tmp_path, recorded):
    _, ref = recorded
    with fake_vllm.spawn("--near-ties", "11", "--flip-near-ties") as flipper:
        code, doc, _ = _run(tmp_path, "aa", "aa", "--reference", str(ref), "--url", flipper.url)
    assert code == 0
    for prompt in doc["prompts"]:
        first = prompt["first_divergence"]
        assert (first["verdict"], first["position"]) == ("near_tie", 11)
        assert first["margin_a"] == pytest.approx(0.05) and "near-tie" in first["text"]
    # scored on the reference's own tokens the flipper's distributions are the reference's
    assert doc["overall"]["kl_mean"] == 0.0
    with fake_vllm.spawn("--near-ties", "11", "--diverge-at", "7") as differ:
        _, doc, _ = _run(tmp_path, "aa", "aa", "--reference", str(ref), "--url", differ.url)
    assert {(p["first_divergence"]["verdict"], p["first_divergence"]["position"])
            for p in doc["prompts"]} == {("differs", 7)}


def test_refusals_exit_2(tmp_path, recorded, capsys):
    doc, ref = recorded
    # another tokenization: the reference record's prompt ids altered
    doc["prompts"][0]["prompt_tokens"][0] += 1
    other = tmp_path / "other.json"
    other.write_text(json.dumps(doc))
    with fake_vllm.spawn("--near-ties", "11") as second:
        code, _, _ = _run(tmp_path, "x", "aa", "--reference", str(other), "--url", second.url)
        assert code == 2
        assert "tokenizes the prose prompt to other ids" in capsys.readouterr().err
        code, _, _ = _run(tmp_path, "x", "gate", "--reference", str(ref), "--band", str(ref),
                          "--url", second.url)
        assert code == 2 and "not a quality-aa file" in capsys.readouterr().err
        # a band measured against another record
        _, _, band = _run(tmp_path, "band", "aa", "--reference", str(ref), "--url", second.url)
        record2 = json.loads(ref.read_text())
        record2["settings"]["needle_words"] += 1
        ref2 = tmp_path / "ref2.json"
        ref2.write_text(json.dumps(record2))
        code, _, _ = _run(tmp_path, "x", "gate", "--reference", str(ref2), "--band", str(band),
                          "--url", second.url)
        assert code == 2 and "another reference record" in capsys.readouterr().err
    code, _, _ = _run(tmp_path, "x", "aa", "--reference", str(ref), "--url",
                      "http://127.0.0.1:9")
    assert code == 2 and "is the server up?" in capsys.readouterr().err


def test_tail_bucket_and_imputation():
    # equal lists: KL 0, top-1 agrees
    same = {1: math.log(0.5), 2: math.log(0.3)}
    assert divergence.score_position(same, same).kl == pytest.approx(0.0, abs=1e-15)
    # a reference token the candidate does not list gets the candidate's floor
    ref = {1: math.log(0.5), 2: math.log(0.3)}
    cand = {1: math.log(0.6), 3: math.log(0.1)}
    s = divergence.score_position(ref, cand)
    p_tail, q_tail = 0.2, 1 - 0.6 - 0.1
    expected = 0.5 * math.log(0.5 / 0.6) + 0.3 * math.log(0.3 / 0.1) \
        + p_tail * math.log(p_tail / q_tail)
    assert s.imputed == 1 and s.kl == pytest.approx(expected) and s.top1_agrees
    # the coarse KL never exceeds the full one (log-sum inequality), on a full distribution
    full_p = [0.4, 0.3, 0.2, 0.1]
    full_q = [0.25, 0.25, 0.25, 0.25]
    full = sum(p * math.log(p / q) for p, q in zip(full_p, full_q))
    coarse = divergence.score_position({i: math.log(full_p[i]) for i in range(2)},
                                       {i: math.log(full_q[i]) for i in range(4)})
    assert 0 < coarse.kl <= full


def test_plot_draws_a_gate_file(tmp_path, recorded):
    _, ref = recorded
    with fake_vllm.spawn("--near-ties", "11", "--logprob-tilt", "0.02") as noisy:
        _, _, band = _run(tmp_path, "band", "aa", "--reference", str(ref), "--url", noisy.url)
        _, _, gate = _run(tmp_path, "gate", "gate", "--reference", str(ref), "--band",
                          str(band), "--url", noisy.url)
    assert plot.main([str(gate), "-o", str(tmp_path / "gate.png")]) == 0
    assert (tmp_path / "gate.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot.main([str(ref), "-o", str(tmp_path / "ref.png")]) == 2
