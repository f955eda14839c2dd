"""Part d of the GPU tier (run on the GPU machine, parts a, moe, b and fi installed): tiny
Glm5Next checkpoints (tests/gpu/glm5next_models.py, made here from their seeds) served by vLLM
0.30.0's CUDA engine patched by the tier's layers, with the launcher's own one-node argv at
k = 7, CUDA graphs on and FP8 KV through FlashInfer's SM90 sparse MLA. What sm_90 or this
machine forces otherwise is in DEVIATIONS, and every result names it (`deviations`).

DeepGEMM's compiled module does not load under this machine's torch, so the indexer's two MQA
logits kernels are the float32 stand-in of tests/gpu/mqa_logits_reference.py (capturable), and
TileLang is absent, so the MHC ops take vLLM's own torch and Triton path
(tests/gpu/mhc_fallback.py); both are on the servers' PYTHONPATH through tests/gpu/standin.

Servers, all at once on one GPU (PLAN):
- the live target (`unequal`: random weights, attention alive): `live-undrafted`,
  `live-drafted` (DFlash2, a drafter that nearly never agrees: every step rejects, the tail
  ring's hardest case, GLM53_KPOOL_TAIL_FIX=1) and `live-ring-off` (the fix off: reported);
- the tokenwise target, whose every greedy token float64 designs (`tokenwise`: each expert's
  up half on its own global): `undrafted` (the fix's default route), `drafted` (the designed
  drafter, right at positions 1 to 5 of 7), `tau-0.3` (adaptive verify), `groups` (INT8
  target groups), `fold` (the fold route, where the tree has the exact route beside it),
  `stock` (the fix bypassed), and `twin` (the equal-scale checkpoint holding the same weights).
Every planned server has planned checks (`planned_checks`); a server that is not ready, an
answer that errs, or a check that did not run fails the run (`evaluate`, `verdict`).

    python3 tests/gpu/glm5next_engine.py PAYLOAD_DIR OUT_DIR
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from tests.gpu import engine as tier  # noqa: E402
from tests.gpu import glm5next_models as tiny  # noqa: E402
from tests.gpu.mhc_fallback import FALLBACK  # noqa: E402
from tests.gpu.mqa_logits_reference import STAND_IN  # noqa: E402

K = tiny.DRAFT_K
LAUNCHER = "launcher_rank0_k7.json"  # pack writes it: DRY_RUN=1 ./run.sh at k = 7
STANDIN = REPO_ROOT / "tests" / "gpu" / "standin"
FLASHINFER_SITE = "flashinfer-site"  # under the payload: part fi's FlashInfer (tests/gpu/run fi)
JIT_DIR = "jit"  # under the payload: the JIT caches every server shares (part fi fills one)
RING_PROMPT_TOKENS = 2048  # the indexer's top-k: past it, the kpool selection and its ring
PROMPT_TOKENS = 3072
MAX_TOKENS = 64
MAX_MODEL_LEN = int(tier.OVERRIDES["--max-model-len"][0])
READY_TIMEOUT_S = 420  # ten Glm5Next servers compile and capture at once
STACKS_BEFORE_DEADLINE_S = 15  # a server not ready by then has its stacks dumped
MARGIN_FLOOR_NATS = 0.1  # about 10x bf16's rounding of a logit of the live target's size
ACCEPTANCE_FLOOR = 0.5  # of drafted tokens, for the designed drafter (issue 47)
# relative error of an aux hidden state row, bf16 engine vs float64: a bf16 emulation of the
# forward on CPU errs up to 0.017 on rows the router decides by ROUTING_GAP (tests/vllm)
AUX_TOLERANCE = 0.05
AUX_APART = 3.0  # the tapped layer's float64 state is this many tolerances from the others
AUX_MIN_ROWS = 16  # rows judged: the prompt's first rows whose routing float64 decides clearly
GROUPS = "shared,mla,kda_o,kda_in,lm_head"
RING = "GLM53_KPOOL_TAIL_FIX"
ROUTE = "GLM53_MOE_SCALE_ROUTE"  # the MoE scale fix's route (exact or fold), read by v8's helper
MOE_FIX_FILE = "vllm/model_executor/layers/quantization/glm53_moe_scales.py"
FOLDED = "folded into block scales"  # the fold's log line (patches/v8/moe_global_scales.py)
SCALED = "route exact (up output x up/gate)"  # the exact route's log line (the same helper)
BYPASSED = "stock MoE: the v8_moe_scales decorator is bypassed"  # tests/gpu/engine_hooks.py
KV_ENV = "GPU_TIER_GLM5NEXT_KV"  # fp8 (the launcher's) or bf16 (a named deviation)
EAGER_ENV = "GPU_TIER_GLM5NEXT_EAGER"  # 1: --enforce-eager, for diagnosis; the run then fails
# kv mode -> (--kv-cache-dtype, the sparse MLA backend vLLM 0.30.0 picks on sm_90 with it)
KV_MODES = {"fp8": ("fp8_e4m3", "FLASHINFER_MLA_SPARSE_SM90"),
            "bf16": ("auto", "FLASH_ATTN_MLA_SPARSE")}
# what the launcher's argv has that Glm5Next must not get from tests/gpu/engine.py's servers
NOT_ADDED = ("--attention-backend", "--dtype")
ENV_ADDED = {
    "VLLM_USE_DEEP_GEMM": ("0", "no other path may reach DeepGEMM's module, which does not "
                                "load under this machine's torch"),
}
DEVIATIONS = {
    **{flag: reason.replace("nine servers", "part d's servers")
       for flag, (_, reason) in tier.OVERRIDES.items()},
    **{name: reason for name, (_, reason) in tier.ENV_OVERRIDES.items()
       if name != "VLLM_USE_FLASHINFER_SAMPLER"},
    "VLLM_USE_FLASHINFER_SAMPLER": "0: greedy answers only; FlashInfer's sampler would "
                                   "JIT-compile a module of its own at start-up",
    **{name: reason for name, (_, reason) in ENV_ADDED.items()},
    "--kernel-config": '{"enable_jit_warmup": false}: TileLang is absent here and its JIT '
                       "warm-up would import it (tests/gpu/mhc_fallback.py)",
    "--speculative-config": "the tiny drafters of tests/gpu/glm5next_models.py, and "
                            "attention_backend TRITON_ATTN for them: their head size 32 has no "
                            "FlashAttention 3 kernel and FlashAttention 2 is not carried",
    "indexer MQA logits": STAND_IN,
    "MHC ops": FALLBACK,
    "VLLM_CACHE_ROOT": "one per server: servers that differ only in GLM53_* levers would "
                       "share one compile-cache key; the other JIT caches are shared, as the "
                       "launcher's one /var/cache/glm53-jit per node is",
}
DRAFTER_BACKEND = "TRITON_ATTN"


def log(message: str) -> None:
    print(f"gpu glm5next: {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Server:
    model: str  # "live", "tokenwise" or "twin"
    drafter: str | None  # "live" or "designed"
    levers: tuple[tuple[str, str], ...]
    hooks: tuple[str, ...] = ()  # tests/gpu/engine_hooks.py: "stock", "aux"


def plan(exact_route: bool) -> dict[str, Server]:
    """The servers, by name. EXACT_ROUTE: the tree's MoE fix has the exact route beside the
    fold (ROUTE), so `undrafted` runs it and `fold` the fold; else `undrafted` is the fold."""
    base = ((RING, "1"), (ROUTE, "exact")) if exact_route else ((RING, "1"),)
    servers = {
        "live-undrafted": Server("live", None, base),
        "live-drafted": Server("live", "live", base),
        "live-ring-off": Server("live", "live", ((RING, "0"),) + base[1:]),
        "undrafted": Server("tokenwise", None, base),
        "drafted": Server("tokenwise", "designed", base, hooks=("aux",)),
        "tau-0.3": Server("tokenwise", "designed", base + (
            ("GLM53_ADAPTIVE_VERIFY", "1"), ("GLM53_ADAPTIVE_VERIFY_TAU", "0.3"))),
        "groups": Server("tokenwise", None, base + (("GLM53_INT8_W8A16", GROUPS),)),
        # no route asked: the whole fix sits behind the decorator the hook bypasses
        "stock": Server("tokenwise", None, ((RING, "1"),), hooks=("stock",)),
        "twin": Server("twin", None, base),
    }
    if exact_route:
        servers["fold"] = Server("tokenwise", None, ((RING, "1"), (ROUTE, "fold")))
    return servers


def exact_route_in(tree: Path) -> bool:
    """Whether the payload tree's MoE scale fix reads ROUTE (the exact route beside the fold)."""
    fix = tree / MOE_FIX_FILE
    if not fix.is_file():
        raise RuntimeError(f"{fix}: no MoE scale fix in the payload tree (layer v8_moe_scales)")
    return ROUTE in fix.read_text()


def routes(servers: dict[str, Server]) -> dict[str, str]:
    """Which route each fixed MoE server runs: the server's ROUTE, else the fix's only one."""
    return {name: dict(s.levers).get(ROUTE, "fold, the tree's only route")
            for name, s in servers.items() if s.model == "tokenwise" and "stock" not in s.hooks}


# ----------------------------------------------------------------------------- the checks


@dataclass
class Observed:
    """Everything a run saw, and what it expected: the input of `evaluate`."""

    servers: dict[str, Server]
    kv: str  # a key of KV_MODES
    prompt: list[int]
    design: dict  # TokenwiseDesign.summary()
    argv: dict[str, list[str]] = field(default_factory=dict)
    replies: dict[str, dict | str] = field(default_factory=dict)  # answer, or what went wrong
    logs: dict[str, list[str]] = field(default_factory=dict)
    aux: dict | str | None = None  # the drafted server's dump, or why there is none
    aux_reference: object = None  # token ids -> tiny.tokenwise_forward's float64 dict


class Missing(Exception):
    """A check's input is absent (a server not ready, an answer that erred)."""


def _answer(seen: Observed, name: str) -> dict:
    reply = seen.replies.get(name)
    if reply is None:
        raise Missing(f"{name}: not ready")
    if not isinstance(reply, dict):
        raise Missing(f"{name}: {reply}"[:300])
    return reply


def _log(seen: Observed, name: str) -> list[str]:
    lines = seen.logs.get(name) or []
    if not lines:
        raise Missing(f"{name}: no log")
    return lines


def compare(reference: dict, other: dict) -> dict:
    """Where the tokens first differ (also when one answer is shorter), and whether the
    reference's margin there, or before, is under the floor (a near-tie bf16 may decide)."""
    ours, theirs = reference["tokens"], other["tokens"]
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    if first is None and len(ours) != len(theirs):
        first = min(len(ours), len(theirs))
    near = [i for i, m in enumerate(reference["margins"]) if m < MARGIN_FLOOR_NATS]
    decided = first is None or bool(near and near[0] <= first)
    return {"first_difference": first, "near_ties": near, "equal_or_near_tie": decided}


def _design_path(seen: Observed) -> list[int]:
    return seen.design["path"][1:MAX_TOKENS + 1]


def _follows_design(seen: Observed, name: str) -> tuple[bool, dict]:
    tokens = _answer(seen, name)["tokens"]
    wanted = _design_path(seen)
    first = next((i for i, (a, b) in enumerate(zip(tokens, wanted)) if a != b), None)
    return tokens == wanted, {"first_difference": first, "answered": len(tokens)}


def _equal(seen: Observed, reference: str, name: str, drafted: bool = False) -> tuple[bool, dict]:
    base, got = _answer(seen, reference), _answer(seen, name)
    found = compare(base, got)
    numbers = {**found, **({"drafts": got["drafts"], "accepted": got["accepted"]}
                           if drafted else {})}
    return found["equal_or_near_tie"] and (not drafted or got["drafts"] > 0), numbers


def _designed_acceptance(seen: Observed) -> tuple[bool, dict]:
    got = _answer(seen, "drafted")
    drafts, per_position = got["drafts"], got["per_position"]
    designed = [1.0] * tiny.DESIGN_RIGHT + [0.0] * (K - tiny.DESIGN_RIGHT)
    # the last step of an answer may be cut short by max_tokens: one draft of slack
    ok = drafts > 0 and all((n >= drafts - 1) if rate else n == 0
                            for n, rate in zip(per_position, designed))
    return ok, {"drafts": drafts, "per_position": per_position, "designed_rates": designed}


def _acceptance_floor(seen: Observed) -> tuple[bool, dict]:
    got = _answer(seen, "drafted")
    rate = got["accepted"] / got["draft_tokens"] if got["draft_tokens"] else 0.0
    return rate >= ACCEPTANCE_FLOOR, {"accepted": got["accepted"],
                                      "draft_tokens": got["draft_tokens"], "rate": rate,
                                      "floor": ACCEPTANCE_FLOOR}


def _stock_diverges(seen: Observed) -> tuple[bool, dict]:
    twin, stock = _answer(seen, "twin"), _answer(seen, "stock")
    found = compare(twin, stock)
    at = seen.design["flip_at"]
    chosen = stock["tokens"][at] if len(stock["tokens"]) > at else None
    return (found["first_difference"] == at and chosen == seen.design["stock_choice"],
            {**found, "designed_at": at, "designed_token": seen.design["stock_choice"],
             "stock_token_there": chosen})


def _log_says(seen: Observed, name: str, *present: str, absent: tuple[str, ...] = ()
              ) -> tuple[bool, dict]:
    lines = _log(seen, name)
    found = {text: any(text in line for line in lines) for text in (*present, *absent)}
    return (all(found[t] for t in present) and not any(found[t] for t in absent),
            {"present": list(present), "absent": list(absent), "found": found})


def _backend(seen: Observed, name: str) -> tuple[bool, dict]:
    dtype, backend = KV_MODES[seen.kv]
    argv = seen.argv.get(name, [])
    kv = argv[argv.index("--kv-cache-dtype") + 1] if "--kv-cache-dtype" in argv else None
    chosen = sorted({m.group(1) for line in _log(seen, name)
                     if (m := re.search(r"Using (\w+) attention backend", line))})
    return kv == dtype and backend in chosen, {"kv_cache_dtype": kv, "chosen": chosen,
                                               "expected": backend}


def _graphs(seen: Observed, name: str) -> tuple[bool, dict]:
    eager = "--enforce-eager" in seen.argv.get(name, [])
    captured = [line[-120:] for line in _log(seen, name) if "Graph capturing finished" in line]
    return not eager and bool(captured), {"enforce_eager": eager, "captured": captured[:2]}


def _prompt_as_sent(seen: Observed, name: str) -> tuple[bool, dict]:
    counted = _answer(seen, name)["prompt_tokens"]
    return counted == len(seen.prompt) > RING_PROMPT_TOKENS, {"server_counted": counted,
                                                               "sent": len(seen.prompt)}


def _prompt_sized(seen: Observed) -> tuple[bool, dict]:
    ceiling = MAX_MODEL_LEN - MAX_TOKENS - (K + 1)
    n = len(seen.prompt)
    return RING_PROMPT_TOKENS < n <= ceiling, {"tokens": n, "past": RING_PROMPT_TOKENS,
                                               "at_most": ceiling}


def _aux(seen: Observed) -> tuple[bool, dict]:
    """The drafter's aux hidden states against float64 of the tapped layers, and the
    comparison shown able to tell the tapped layer from every other."""
    import torch

    if not isinstance(seen.aux, dict):
        raise Missing(f"drafted: no aux hidden state dump ({seen.aux})")
    ids, positions = seen.aux["input_ids"], seen.aux["positions"]
    rows = len(ids)
    if positions.tolist() != list(range(rows)) or ids.tolist() != seen.prompt[:rows]:
        return False, {"reason": "the dump is not the prompt's first rows",
                       "positions": positions.tolist()[:8], "ids": ids.tolist()[:8]}
    reference = seen.aux_reference(ids)
    states = reference["states"]  # [layers, rows, hidden] float64
    # a row whose router nearly ties may take other experts in bf16: listed, not judged
    judged = reference["routing_gap"] >= tiny.ROUTING_GAP
    if len(seen.aux["aux"]) != len(tiny.DRAFT_TAPS):
        return False, {"reason": f"{len(seen.aux['aux'])} aux states for taps {tiny.DRAFT_TAPS}"}
    if int(judged.sum()) < AUX_MIN_ROWS:
        return False, {"reason": f"{int(judged.sum())} rows routed clearly, "
                                 f"{AUX_MIN_ROWS} needed"}
    errors, apart = {}, {}
    for got, tap in zip(seen.aux["aux"], tiny.DRAFT_TAPS):
        truth = states[tap][judged]
        norm = truth.norm(dim=-1)
        errors[tap] = ((got.double()[judged] - truth).norm(dim=-1) / norm).max().item()
        apart[tap] = min(((states[other][judged] - truth).norm(dim=-1) / norm).min().item()
                         for other in range(states.shape[0]) if other != tap)
    ok = all(e <= AUX_TOLERANCE for e in errors.values()) and \
        all(a >= AUX_APART * AUX_TOLERANCE for a in apart.values())
    return ok, {"rows": rows, "judged_rows": int(judged.sum()),
                "worst_relative_error": errors, "tolerance": AUX_TOLERANCE,
                "nearest_other_layer": apart, "apart_at_least": AUX_APART * AUX_TOLERANCE}


def checks(servers: dict[str, Server]) -> dict[str, object]:
    """Every planned check, by name: a function of Observed giving (passed, numbers)."""
    table: dict[str, object] = {
        "the prompt is sized by the tokenizer past 2,048 tokens and inside --max-model-len":
            _prompt_sized,
    }
    for name in servers:
        table.update({
            f"{name}: ready and answered": lambda s, n=name: (bool(_answer(s, n)), {}),
            f"{name}: the prompt as sent": lambda s, n=name: _prompt_as_sent(s, n),
            f"{name}: the stand-in and the MHC fallback installed (its log)":
                lambda s, n=name: _log_says(s, n, "stand-in installed", "MHC fallback installed"),
            f"{name}: sparse MLA on the backend the KV dtype picks (its log)":
                lambda s, n=name: _backend(s, n),
            f"{name}: CUDA graphs captured, no --enforce-eager (its log)":
                lambda s, n=name: _graphs(s, n),
        })
    fixed = routes(servers)
    table.update({
        "live-drafted = live-undrafted past 2,048 tokens (ring fix on), up to near ties":
            lambda s: _equal(s, "live-undrafted", "live-drafted", drafted=True),
        "undrafted: greedy tokens follow the float64 design":
            lambda s: _follows_design(s, "undrafted"),
        "drafted = undrafted (designed drafter, k = 7, ring fix on)":
            lambda s: _equal(s, "undrafted", "drafted", drafted=True),
        "drafted: acceptance per position as designed": _designed_acceptance,
        "drafted: acceptance at least 0.5 of drafted tokens": _acceptance_floor,
        "drafted: the drafter's aux hidden states are the target's layers 1 and 3 (float64)":
            _aux,
        "tau-0.3 = undrafted": lambda s: _equal(s, "undrafted", "tau-0.3", drafted=True),
        "groups: the target groups swapped by Glm5Next's names (its log)":
            lambda s: _log_says(s, "groups", "GLM53 weight groups on Glm5NextForCausalLM:"),
        "groups = undrafted": lambda s: _equal(s, "undrafted", "groups"),
        "twin: greedy tokens follow the float64 design (the intended weights)":
            lambda s: _follows_design(s, "twin"),
        "stock diverges from twin where float64 designs it": _stock_diverges,
        "stock: the fix bypassed and nothing folded (its log)":
            lambda s: _log_says(s, "stock", BYPASSED, absent=(FOLDED,)),
    })
    for name, route in fixed.items():
        if name in ("undrafted", "fold"):
            table[f"{name} = twin (MoE fix: {route})"] = lambda s, n=name: _equal(s, "twin", n)
            if route.startswith("fold"):
                table[f"{name}: the fold's log line"] = lambda s, n=name: _log_says(s, n, FOLDED)
            else:
                table[f"{name}: the {route} route's log line, and nothing folded"] = \
                    lambda s, n=name: _log_says(s, n, SCALED, absent=(FOLDED,))
    return table


def planned_checks(servers: dict[str, Server]) -> list[str]:
    return list(checks(servers))


def evaluate(seen: Observed) -> list[dict]:
    """Every planned check, run or failed: a check whose input is missing fails, naming what
    is missing; one that raises fails with its error."""
    results = []
    for name, check in checks(seen.servers).items():
        try:
            passed, numbers = check(seen)
        except Missing as missing:
            passed, numbers = False, {"missing": str(missing)}
        except Exception as error:  # a check that cannot run is a failed check
            passed, numbers = False, {"error": f"{type(error).__name__}: {error}"[:500]}
        results.append({"check": name, "passed": bool(passed), **numbers})
    return results


def verdict(results: list[dict], servers: dict[str, Server]) -> bool:
    """Passed only when every planned check is there once and passed."""
    names = [r["check"] for r in results if "check" in r]
    return sorted(names) == sorted(planned_checks(servers)) and \
        all(r["passed"] for r in results if "check" in r)


# ----------------------------------------------------------------------------- the run


def prompt_ids(tokenizer: Path, last: int) -> list[int]:
    """PROMPT_TOKENS ids, counted by the served tokenizer (numbered words, then LAST: the
    tokenwise target's path starts there); refuses when outside the ring's case or the model's
    length."""
    from tokenizers import Tokenizer

    text = " ".join(f"w{i % 97}x{i % 13}" for i in range(PROMPT_TOKENS))
    ids = Tokenizer.from_file(str(tokenizer / "tokenizer.json")).encode(
        text, add_special_tokens=False).ids[:PROMPT_TOKENS - 1] + [last]
    ceiling = MAX_MODEL_LEN - MAX_TOKENS - (K + 1)
    if not RING_PROMPT_TOKENS < len(ids) <= ceiling:
        raise RuntimeError(f"prompt of {len(ids)} tokens: outside ({RING_PROMPT_TOKENS}, "
                           f"{ceiling}]")
    return ids


def kv_mode() -> str:
    mode = os.environ.get(KV_ENV, "fp8")
    if mode not in KV_MODES:
        raise RuntimeError(f"{KV_ENV}={mode!r}: use one of {', '.join(KV_MODES)}")
    return mode


def deviations(kv: str, eager: bool) -> dict[str, str]:
    found = dict(DEVIATIONS)
    if kv != "fp8":
        found["--kv-cache-dtype"] = ("auto (BF16): FlashInfer's SM90 sparse MLA was not used "
                                     f"({KV_ENV}={kv}); FLASH_ATTN_MLA_SPARSE takes BF16 only")
    if eager:
        found["--enforce-eager"] = f"{EAGER_ENV}=1, for diagnosis: this run cannot pass"
    return found


def served_argv(launcher: dict, model: Path, port: int, drafter: Path | None, kv: str,
                eager: bool) -> list[str]:
    speculative = None if drafter is None else {
        "method": "dflash", "model": str(drafter), "num_speculative_tokens": K,
        "attention_backend": DRAFTER_BACKEND}
    argv = tier.served_argv(launcher, model, port, speculative, kv_auto=KV_MODES[kv][0] == "auto")
    for flag in NOT_ADDED:
        index = argv.index(flag)
        del argv[index:index + 2]
    argv += ["--kernel-config", json.dumps({"enable_jit_warmup": False})]
    return argv + (["--enforce-eager"] if eager else [])


def served_env(launcher: dict, payload: Path, scratch: Path, server: Server,
               kv: str) -> dict[str, str]:
    env = tier.served_env(launcher, scratch, dict(server.levers), remap=False)
    shared = payload / JIT_DIR
    for name, value in launcher["env"].items():  # one JIT cache per machine, as per node
        if value.startswith("/var/cache/") and name != "VLLM_CACHE_ROOT":
            env[name] = str(shared / value.lstrip("/"))
    path = [str(STANDIN)] + ([str(payload / FLASHINFER_SITE)] if kv == "fp8" else [])
    env["PYTHONPATH"] = os.pathsep.join([*path, env["PYTHONPATH"]])
    env.update({name: value for name, (value, _) in ENV_ADDED.items()})
    if "stock" in server.hooks:
        env["GPU_TIER_STOCK_MOE"] = "1"
    if "aux" in server.hooks:
        env["GPU_TIER_AUX_DUMP"] = str(scratch / "aux.pt")
    return env


def make_models(payload: Path, out: Path) -> tuple[dict[str, Path], tiny.TokenwiseDesign]:
    tokenizer = payload / "models" / "margin-target"
    models = out / "models"
    design = tiny.tokenwise_design(tiny.special_ids(tokenizer))
    made = {"live": tiny.write(models / "live", "unequal", tokenizer=tokenizer),
            "tokenwise": tiny.write(models / "tokenwise", "tokenwise", tokenizer=tokenizer),
            "twin": tiny.write(models / "twin", "twin", tokenizer=tokenizer),
            "drafter-live": tiny.write_drafter(models / "drafter-live", tokenizer=tokenizer),
            "drafter-designed": tiny.write_drafter(models / "drafter-designed",
                                                   tokenizer=tokenizer,
                                                   next_token=design.next_token)}
    return made, design


def build(payload: Path, out: Path, servers: dict[str, Server], models: dict[str, Path],
          kv: str, eager: bool) -> dict:
    from tests.engine.engine_server import EngineServer, free_port

    launcher = json.loads((payload / LAUNCHER).read_text())
    runtime = tier.Runtime(out / "runtime")
    made = {}
    for name, server in servers.items():
        port = free_port()
        drafter = models[f"drafter-{server.drafter}"] if server.drafter else None
        made[name] = EngineServer(
            runtime, models[server.model], name=name, port=port,
            argv=served_argv(launcher, models[server.model], port, drafter, kv, eager),
            env=served_env(launcher, payload, out / "scratch" / name, server, kv),
            ready_timeout=READY_TIMEOUT_S, log_dir=out / "logs")
    return made


def answer(server, prompt: list[int]) -> dict:
    from tests.engine.engine_client import post_json, spec_counters

    before = spec_counters(server)
    reply = post_json(server.url + "/v1/completions", {
        "model": server.model_id, "prompt": prompt, "max_tokens": MAX_TOKENS,
        "temperature": 0.0, "logprobs": 2, "ignore_eos": True,
        "return_tokens_as_token_ids": True})
    after = spec_counters(server)
    logprobs = reply["choices"][0]["logprobs"]
    margins = []
    for top in logprobs["top_logprobs"]:
        ranked = sorted(top.values(), reverse=True)
        margins.append(ranked[0] - ranked[1] if len(ranked) > 1 else float("inf"))
    return {"tokens": [int(t.removeprefix("token_id:")) for t in logprobs["tokens"]],
            "margins": margins, "prompt_tokens": reply["usage"]["prompt_tokens"],
            "drafts": after["drafts"] - before["drafts"],
            "draft_tokens": after["draft_tokens"] - before["draft_tokens"],
            "accepted": after["accepted_tokens"] - before["accepted_tokens"],
            "per_position": [after["per_position"].get(p, 0) - before["per_position"].get(p, 0)
                             for p in range(K)]}


def dump_stacks(made: dict, doc: dict) -> None:
    """SIGUSR1 to every process of each server not yet ready: faulthandler (registered by
    tests/gpu/standin) writes each thread's stack to the server's log, so that a stalled start
    shows where it waits."""
    for name, server in made.items():
        if server.ready_s is None and server.process is not None:
            try:
                os.killpg(server.process.pid, signal.SIGUSR1)
            except ProcessLookupError:
                continue
            doc["servers"][name]["stacks_dumped_at_s"] = round(
                time.monotonic() - server.started_at, 1)
            log(f"{name}: not ready yet; its processes' stacks are in its log")


def _or_error(call):
    try:
        return call()
    except Exception as error:  # a server that answers wrongly: its error is the finding
        return f"{type(error).__name__}: {error}"[:1500]


def load_aux(path: Path) -> dict | str:
    import torch

    if not path.is_file():
        return f"{path} was not written"
    try:
        return torch.load(path)
    except Exception as error:
        return f"{type(error).__name__}: {error}"[:500]


TMA_DUMP = "Failed to initialize the TMA descriptor"
LOG_FACTS = re.compile(r"stand-in|fallback installed|GLM53|Using \w+ attention backend|"
                       r"Graph capturing finished|stock MoE|aux hidden|folded|FlashInfer")


def run(doc: dict, payload: Path, out: Path) -> None:
    """Fills `doc` as it goes, so that a run cut short still reports what it saw."""
    started = time.monotonic()
    kv, eager = kv_mode(), os.environ.get(EAGER_ENV) == "1"
    if kv == "fp8" and not (payload / FLASHINFER_SITE / "flashinfer").is_dir():
        raise RuntimeError(f"{payload / FLASHINFER_SITE}: no FlashInfer for FP8 KV; install "
                           f"part fi (tests/gpu/run fi) or set {KV_ENV}=bf16")
    servers = plan(exact_route_in(payload / "tree"))
    doc.update({"k": K, "kv": kv, "deviations": deviations(kv, eager), "checks": [],
                "servers": {}, "routes": routes(servers),
                "planned_checks": len(planned_checks(servers))})
    models, design = make_models(payload, out)
    doc["design"] = design.summary()
    seen = Observed(servers=servers, kv=kv, design=design.summary(),
                    prompt=prompt_ids(payload / "models" / "margin-target", design.path[0]))
    experts = tiny.intended_experts(design.tensors["tokenwise"])
    seen.aux_reference = lambda ids: tiny.tokenwise_forward(
        design.tensors["tokenwise"], ids.long(), experts=experts)
    doc["prompt_tokens"] = len(seen.prompt)
    if (payload / "fi.json").is_file():  # part fi's JIT compile and kernel check
        doc["flashinfer_jit"] = json.loads((payload / "fi.json").read_text())
    made = build(payload, out, servers, models, kv, eager)
    for name, server in made.items():
        seen.argv[name] = server.argv[3:]
        doc["servers"][name] = {"argv": server.argv[3:], "env": {
            k: v for k, v in server.env.items() if k.startswith(("GLM53_", "GPU_TIER_"))}}
    stacks = threading.Timer(READY_TIMEOUT_S - STACKS_BEFORE_DEADLINE_S, dump_stacks,
                             args=(made, doc))
    stacks.start()
    try:
        up = tier.boot(made, doc)
        stacks.cancel()
        log(f"{len(up)} of {len(made)} servers ready after {time.monotonic() - started:.0f} s")
        with ThreadPoolExecutor(max(1, len(up))) as pool:
            seen.replies = dict(zip(up, pool.map(
                lambda name: _or_error(lambda: answer(up[name], seen.prompt)), up)))
        doc["answers"] = seen.replies
        live = seen.replies.get("live-undrafted"), seen.replies.get("live-ring-off")
        if all(isinstance(r, dict) for r in live):
            doc["ring_off_reported"] = compare(*live)  # not judged: docs/gpu-tier.md says why
    finally:
        stacks.cancel()
        with ThreadPoolExecutor(len(made)) as pool:
            list(pool.map(lambda server: server.stop(), made.values()))
    for name, server in made.items():
        lines = tier.log_lines(server)
        seen.logs[name] = lines
        doc["servers"][name].update(
            log_facts=[line[:300] for line in lines if LOG_FACTS.search(line)][:60],
            tma_descriptor_dumps=sum(TMA_DUMP in line for line in lines))
    seen.aux = load_aux(out / "scratch" / "drafted" / "aux.pt")
    doc["checks"] = evaluate(seen)
    doc["passed"] = verdict(doc["checks"], servers)
    doc["wall_s"] = round(time.monotonic() - started, 1)


def main(payload: str, out: str) -> int:
    signal.signal(signal.SIGTERM, tier._stopped)
    Path(out).mkdir(parents=True, exist_ok=True)
    doc: dict = {"passed": False, "stand_in": STAND_IN, "mhc": FALLBACK}
    try:
        run(doc, Path(payload), Path(out))
    except BaseException as error:
        doc["error"] = "".join(traceback.format_exception(error))[-4000:]
        doc["passed"] = False
    finally:
        (Path(out) / "glm5next.json").write_text(json.dumps(doc, indent=1, default=str))
    failed = [r["check"] for r in doc.get("checks", []) if not r["passed"]]
    log(f"{'passed' if doc['passed'] else 'FAILED'} ({len(failed)} checks failed); "
        f"{out}/glm5next.json")
    return 0 if doc["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
