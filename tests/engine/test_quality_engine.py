"""bench/quality.py against real vLLM (float32, CPU): two boots of the target pass the gate;
a candidate whose weights were rounded to INT8 per group of 64 has the KL a float64
computation from both models' weights gives on the same tokens, and fails beyond the A/A
band; a candidate built to flip the greedy path at the reference's closest call is reported
as a near-tie there, with the margins float64 predicts."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.engine import tiny_models
from tests.engine.cache import cached_dir, content_key, progress
from tests.engine.conftest import ENGINE_NICENESS, plain_spec
from tests.engine.engine_server import EngineServer
from tests.engine.float64_kl import expected_kls

# four engines boot here on a shared 2-core machine: minutes each
pytestmark = pytest.mark.timeout(2700)
REPO_ROOT = Path(__file__).resolve().parents[2]
FLOAT64 = Path(__file__).with_name("float64_logprobs.py")
MAX_TOKENS = 48
TOP_N = 20
NEEDLE_WORDS = 300
GROUP_SIZE = 64
# the candidate's margin at the planted flip, in nats
FLIP_MARGIN = 0.02
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quality(tmp_path: Path, name: str, *args: str) -> tuple[int, dict, Path, str]:
    out = tmp_path / f"{name}.json"
    result = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "quality.py"), *args,
                             "--out", str(out)], capture_output=True, text=True, timeout=900,
                            check=False)
    doc = json.loads(out.read_text()) if out.exists() else {}
    return result.returncode, doc, out, result.stdout + result.stderr


def int8_rounded(weight: np.ndarray, group: int) -> np.ndarray:
    """Symmetric INT8 per group of `group` input columns (scale = absmax / 127), back to
    float32: what a weight-only W8A16 layer multiplies with."""
    rows, cols = weight.shape
    grouped = weight.astype(np.float64).reshape(rows, cols // group, group)
    scale = np.abs(grouped).max(axis=-1, keepdims=True) / 127.0
    scale[scale == 0] = 1.0
    return (np.clip(np.round(grouped / scale), -127, 127) * scale).reshape(rows, cols) \
        .astype(np.float32)


def _target_tensors() -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file
    return load_file(str(tiny_models.target_dir() / "model.safetensors"))


def _derived_model(name: str, key: str, change) -> Path:
    tokenizer = tiny_models.tokenizer_dir()

    def build(out: Path) -> None:
        tensors = _target_tensors()
        change(tensors)
        tiny_models.write_model(out, tensors, tokenizer, {"made_by": __file__, "what": name})

    return cached_dir(tiny_models.GROUP, f"{name}-{content_key(key, Path(__file__))}", build)


def int8_model_dir() -> Path:
    def change(tensors: dict[str, np.ndarray]) -> None:
        for name in list(tensors):
            if name == "lm_head.weight" or name.split(".")[-2] in LINEARS:
                tensors[name] = int8_rounded(tensors[name], GROUP_SIZE)

    return _derived_model("int8-g64", f"int8 g{GROUP_SIZE}", change)


def serve(engine, model: Path, name: str, log_dir: Path) -> EngineServer:
    """A boot of MODEL of its own, with the argv and environment of the fleet's plain server
    (boot A)."""
    return plain_spec(model).server(engine, name, log_dir, niceness=ENGINE_NICENESS).start()


def float64_logprobs(engine, models: list[Path], record: dict, tmp_path: Path) -> dict:
    request = tmp_path / "float64-request.json"
    answer = tmp_path / "float64-answer.json"
    request.write_text(json.dumps({"models": [str(m) for m in models], "sequences": [
        {"ids": p["prompt_tokens"] + p["tokens"], "start": len(p["prompt_tokens"])}
        for p in record["prompts"]]}))
    done = engine.run(str(FLOAT64), str(request), str(answer), timeout=900,
                      env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(answer.read_text())
    return {"logprobs": {Path(k): v for k, v in doc["logprobs"].items()},
            "hidden": {Path(k): v for k, v in doc["hidden"].items()}}


@pytest.fixture(scope="module")
def gate_run(engine, fleet, tmp_path_factory):
    """Boot A records, boot B measures the band; the INT8 candidate is gated. Boot A is the
    fleet's plain server, a boot of the same target with the same argv and environment as
    B, shared with the bench, receipts and probes tests: every request of bench/quality.py
    carries a cache salt of its own, so nothing their requests left in the prefix cache can
    serve it. B (the second boot the band needs) and the candidate are boots of their own."""
    tmp = tmp_path_factory.mktemp("quality")
    target, int8 = tiny_models.target_dir(), int8_model_dir()
    servers = [serve(engine, target, "quality-b", tmp), serve(engine, int8, "quality-int8", tmp)]
    try:
        boot_a = fleet.serve(plain_spec(target))
        boot_b, cand = (s.wait_ready() for s in servers)
        code, record, ref, out = quality(tmp, "ref", "record", "--url", boot_a.url,
                                         "--max-tokens", str(MAX_TOKENS), "--top-n", str(TOP_N),
                                         "--needle-words", str(NEEDLE_WORDS))
        assert code == 0, out
        code, band, band_path, out = quality(tmp, "band", "aa", "--reference", str(ref),
                                             "--url", boot_b.url)
        assert code == 0, out
        started = time.monotonic()
        same = quality(tmp, "same", "gate", "--reference", str(ref), "--band", str(band_path),
                       "--url", boot_b.url)
        gate_wall_s = time.monotonic() - started
        int8_gate = quality(tmp, "int8", "gate", "--reference", str(ref), "--band",
                            str(band_path), "--url", cand.url)
    finally:
        for s in servers:
            s.stop()
    progress(f"quality: A/A band mean KL {band['overall']['kl_mean']:.3g}, top-1 "
             f"{band['overall']['top1_agreement']:.4f}; one gate run {gate_wall_s:.1f} s")
    return {"tmp": tmp, "record": record, "ref": ref, "band": band, "band_path": band_path,
            "same": same, "int8": int8_gate, "target": target, "int8_dir": int8}


def test_two_boots_of_the_target_pass(gate_run):
    band = gate_run["band"]
    code, gate, _, out = gate_run["same"]
    assert code == 0 and gate["passed"], out
    assert band["overall"]["top1_agreement"] == 1.0
    # float32 prefill against float32 decode of one model: rounding noise only
    assert band["overall"]["kl_mean"] < 1e-8
    assert gate["overall"]["positions"] == MAX_TOKENS * 4


@pytest.fixture(scope="module")
def float64(gate_run, engine) -> dict:
    """The target's and the INT8 candidate's float64 logprobs (and the target's hidden
    states) on the record's tokens, computed once for both tests that read them."""
    return float64_logprobs(engine, [gate_run["target"], gate_run["int8_dir"]],
                            gate_run["record"], gate_run["tmp"])


def test_int8_candidate_has_the_float64_kl_and_fails_beyond_the_band(gate_run, float64):
    code, gate, _, out = gate_run["int8"]
    assert code == 1 and not gate["passed"], out
    record = gate_run["record"]
    f64 = float64
    all_coarse, all_full = [], []
    for index, prompt in enumerate(record["prompts"]):
        coarse, full = expected_kls(f64["logprobs"][gate_run["target"]][index],
                                    f64["logprobs"][gate_run["int8_dir"]][index],
                                    prompt["tokens"], TOP_N)
        measured = gate["prompts"][index]["kl"]
        # per position: float32 serving against float64, to 2% or 1e-7 nats
        assert measured == pytest.approx(coarse, rel=2e-2, abs=1e-7), prompt["phase"]
        all_coarse += coarse
        all_full += full
    assert gate["overall"]["kl_mean"] == pytest.approx(np.mean(all_coarse), rel=1e-2)
    # the top-N estimate is a lower bound of the full KL, and close to it here
    assert np.mean(all_coarse) <= np.mean(all_full) * (1 + 1e-6)
    assert gate["overall"]["kl_mean"] > 100 * gate_run["band"]["overall"]["kl_mean"]
    progress(f"quality: INT8 g{GROUP_SIZE} mean KL {gate['overall']['kl_mean']:.3g} (float64 "
             f"top-{TOP_N} {np.mean(all_coarse):.3g}, full {np.mean(all_full):.3g}), top-1 "
             f"{gate['overall']['top1_agreement']:.4f}")


def test_a_flip_at_the_closest_call_is_reported_as_a_near_tie(gate_run, float64, engine):
    record, tmp = gate_run["record"], gate_run["tmp"]
    target = gate_run["target"]
    f64 = float64
    # the reference's closest call: the smallest float64 top-2 margin on its own tokens
    calls = []
    for index, rows in enumerate(f64["logprobs"][target]):
        for position, row in enumerate(rows):
            best, second = np.argsort(row)[::-1][:2]
            calls.append((row[best] - row[second], index, position, int(second)))
    margin, index, position, runner_up = min(calls)
    hidden = np.array(f64["hidden"][target][index][position])
    lift = (margin + FLIP_MARGIN) * hidden / float(hidden @ hidden)

    def change(tensors: dict[str, np.ndarray]) -> None:
        tensors["lm_head.weight"][runner_up] += lift.astype(np.float32)

    flipped = _derived_model("flip", f"{index} {position} {runner_up} {margin:.6f}", change)
    f64_flip = float64_logprobs(engine, [flipped], record, tmp)["logprobs"][flipped][index]
    ref_tokens = record["prompts"][index]["tokens"]
    # the first position where the flipped model's greedy choice leaves the reference path
    first = next(j for j, row in enumerate(f64_flip) if int(np.argmax(row)) != ref_tokens[j])
    ranked = sorted(f64_flip[first], reverse=True)
    ref_ranked = sorted(f64["logprobs"][target][index][first], reverse=True)
    # the receipts' rule: a near-tie when both sides' margins are under the threshold
    near_tie_nats = max(0.25, ref_ranked[0] - ref_ranked[1] + 0.05, ranked[0] - ranked[1] + 0.05)
    server = serve(engine, flipped, "quality-flip", tmp)
    try:
        server.wait_ready()
        code, doc, _, out = quality(tmp, "flip", "aa", "--reference", str(gate_run["ref"]),
                                    "--url", server.url, "--near-tie-nats", str(near_tie_nats))
    finally:
        server.stop()
    assert code == 0, out
    got = doc["prompts"][index]["first_divergence"]
    assert (got["verdict"], got["position"]) == ("near_tie", first), got
    assert got["token_b"] == f"token_id:{int(np.argmax(f64_flip[first]))}"
    assert got["margin_a"] == pytest.approx(ref_ranked[0] - ref_ranked[1], abs=1e-3)
    assert got["margin_b"] == pytest.approx(ranked[0] - ranked[1], abs=1e-3)
    assert "near-tie at position" in got["text"]
    assert first in doc["prompts"][index]["top1_disagree_at"]
    progress(f"quality: planted flip at {index}/{position} (reference margin {margin:.3f}), "
             f"first divergence {first}, margins {got['margin_a']:.3f}/{got['margin_b']:.3f}")
    assert math.isfinite(doc["overall"]["kl_mean"])
