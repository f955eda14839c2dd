"""Part d of the GPU tier (issues 38 and 47) up to what needs a GPU: the servers it would start
(the launcher's argv at k = 7 with only the named deviations, the stand-in and FlashInfer on
PYTHONPATH, the hooks where asked), the stand-in's install hook, the hooks of
tests/gpu/engine_hooks.py, and the evaluation: every planned server has its planned checks, and
a run with no answer, an erroring server, a missing check or the smallest corruption of any
answer fails."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import types

import pytest
import torch

from tests.gpu import engine_hooks
from tests.gpu import glm5next_engine as part_d
from tests.gpu import glm5next_models as tiny
from tests.gpu.payload import LAUNCHERS, launcher_rank0


@pytest.fixture(scope="module")
def launcher_payload(tmp_path_factory):
    root = tmp_path_factory.mktemp("payload")
    (root / "models" / "margin-target").mkdir(parents=True)
    for name, k in LAUNCHERS.items():
        (root / name).write_text(json.dumps(launcher_rank0("/models/tiny", k)))
    return root


@pytest.mark.parametrize("exact_route", [True, False])
def test_part_d_servers_run_the_launchers_k7_argv_with_only_the_named_deviations(
        launcher_payload, tmp_path, exact_route):
    servers = part_d.plan(exact_route)
    models = {name: tmp_path / name for name in ("live", "tokenwise", "twin", "drafter-live",
                                                 "drafter-designed")}
    made = part_d.build(launcher_payload, tmp_path / "out", servers, models, "fp8", eager=False)
    assert ("fold" in made) is exact_route
    launcher = json.loads((launcher_payload / part_d.LAUNCHER).read_text())
    for name, server in made.items():
        argv = server.argv
        assert "--attention-backend" not in argv and "--dtype" not in argv, name
        assert "--enforce-eager" not in argv
        assert argv[argv.index("--kv-cache-dtype") + 1] == "fp8_e4m3"
        assert argv[argv.index("--block-size") + 1] == "2304"
        assert argv[argv.index("--compilation-config") + 1] == \
            '{"cudagraph_capture_sizes":[1,2,4,8,16]}'  # the launcher's at k = 7
        assert json.loads(argv[argv.index("--kernel-config") + 1]) == {"enable_jit_warmup": False}
        # every flag the launcher wrote is there; only the named ones changed
        drafted = servers[name].drafter is not None
        flags = [a for a in launcher["argv"] if a.startswith("--")
                 and (drafted or a != "--speculative-config")]
        assert all(flag in argv for flag in flags if flag not in part_d.NOT_ADDED)
        changed = {flag for flag in flags if argv[argv.index(flag) + 1]
                   != launcher["argv"][launcher["argv"].index(flag) + 1]}
        assert changed <= set(part_d.DEVIATIONS) | {"--speculative-config"}, changed
        path = server.env["PYTHONPATH"].split(os.pathsep)
        assert path[:2] == [str(part_d.STANDIN), str(launcher_payload / part_d.FLASHINFER_SITE)]
        assert server.env["VLLM_USE_DEEP_GEMM"] == "0"
        # one JIT cache per machine (part fi compiled FlashInfer's into it), vLLM's own per server
        jit = launcher_payload / part_d.JIT_DIR
        assert server.env["FLASHINFER_WORKSPACE_BASE"].startswith(str(jit))
        assert server.env["TRITON_CACHE_DIR"].startswith(str(jit))
        assert str(tmp_path / "out" / "scratch" / name) in server.env["VLLM_CACHE_ROOT"]
        assert ("--speculative-config" in argv) is drafted, name
        if drafted:
            spec = json.loads(argv[argv.index("--speculative-config") + 1])
            assert spec["num_speculative_tokens"] == 7
            assert spec["attention_backend"] == part_d.DRAFTER_BACKEND
        assert server.env["GLM53_KPOOL_TAIL_FIX"] == ("0" if name == "live-ring-off" else "1")
        assert (server.env.get("GPU_TIER_STOCK_MOE") == "1") is (name == "stock")
        assert ("GPU_TIER_AUX_DUMP" in server.env) is (name == "drafted")
    assert made["groups"].env["GLM53_INT8_W8A16"] == "shared,mla,kda_o,kda_in,lm_head"
    assert "GLM53_INT8_W8A16" not in made["drafted"].env
    assert part_d.ROUTE not in made["stock"].env
    assert made["undrafted"].env.get(part_d.ROUTE) == ("exact" if exact_route else None)
    bf16 = part_d.build(launcher_payload, tmp_path / "out2", servers, models, "bf16", eager=True)
    argv = bf16["undrafted"].argv
    assert argv[argv.index("--kv-cache-dtype") + 1] == "auto" and "--enforce-eager" in argv
    assert str(launcher_payload / part_d.FLASHINFER_SITE) not in bf16["undrafted"].env["PYTHONPATH"]
    assert {"--kv-cache-dtype", "--enforce-eager"} <= set(part_d.deviations("bf16", True))


def test_the_stand_in_replaces_only_the_indexer_kernels_at_first_import(tmp_path):
    """tests/gpu/standin's sitecustomize on a fake vllm.utils.deep_gemm: a module importing
    the kernels by name after it binds the stand-in; the module's other names stay."""
    fake = tmp_path / "fake" / "vllm" / "utils"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "deep_gemm.py").write_text(textwrap.dedent("""
        def _missing(*a, **k):
            raise RuntimeError("DeepGEMM's module is not loaded")
        fp8_fp4_mqa_logits = fp8_fp4_paged_mqa_logits = get_paged_mqa_logits_metadata = _missing
        fp8_gemm_nt = _missing
        def _paged_mqa_logits_schedule_slots(num_sms, next_n):
            return num_sms
    """))
    probe = textwrap.dedent("""
        from vllm.utils.deep_gemm import fp8_fp4_paged_mqa_logits, fp8_gemm_nt
        import vllm.utils.deep_gemm as dg
        print(fp8_fp4_paged_mqa_logits.__module__, fp8_gemm_nt.__name__,
              dg.fp8_fp4_mqa_logits.__module__)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(part_d.STANDIN),
                                                        str(tmp_path / "fake")])}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["gpu_mqa_logits_reference", "_missing",
                                   "gpu_mqa_logits_reference"]
    assert "stand-in installed: tests/gpu/mqa_logits_reference.py" in done.stderr


def test_a_server_not_ready_near_its_deadline_dumps_every_processs_stacks(tmp_path):
    """dump_stacks sends SIGUSR1 to a not-ready server's process group; with tests/gpu/standin
    on PYTHONPATH a parent and its child (as the API server and its engine core) each write
    their stack to the log and live on; a ready server gets nothing."""
    script = textwrap.dedent("""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c",
                                  "import time\\ndef engine_core_waits():\\n time.sleep(60)\\n"
                                  "engine_core_waits()"])
        def api_server_waits():
            time.sleep(60)
        print("started", flush=True)
        api_server_waits()
    """)
    log_path = tmp_path / "server.log"
    env = {**os.environ, "PYTHONPATH": str(part_d.STANDIN)}
    with log_path.open("w") as log_file:
        process = subprocess.Popen([sys.executable, "-c", script], stdout=log_file,
                                   stderr=subprocess.STDOUT, env=env, process_group=0)
    try:
        for _ in range(600):
            if "started" in log_path.read_text():
                break
            time.sleep(0.1)
        time.sleep(1.0)  # the child's interpreter has read sitecustomize by then
        waiting = types.SimpleNamespace(process=process, ready_s=None,
                                        started_at=time.monotonic() - 400)
        ready = types.SimpleNamespace(process=None, ready_s=12.0, started_at=0.0)
        doc = {"servers": {"waiting": {}, "ready": {}}}
        part_d.dump_stacks({"waiting": waiting, "ready": ready}, doc)
        for _ in range(100):
            text = log_path.read_text()
            if "engine_core_waits" in text and "api_server_waits" in text:
                break
            time.sleep(0.1)
        assert "engine_core_waits" in text and "api_server_waits" in text, text[-2000:]
        assert process.poll() is None, "SIGUSR1 must not stop the server"
        assert 399 < doc["servers"]["waiting"]["stacks_dumped_at_s"] < 460
        assert doc["servers"]["ready"] == {}
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def test_the_mhc_ops_take_vllms_own_path_without_tilelang():
    """tests/gpu/standin on the real vLLM 0.30.0 (the test venv's): every MHC op with a
    TileLang-free path has forward_cuda pointing at it, and the log says so."""
    probe = textwrap.dedent("""
        import vllm.model_executor.layers.mhc as mhc
        ops = [n for n, v in vars(mhc).items() if isinstance(v, type)
               and issubclass(v, mhc.CustomOp) and v is not mhc.CustomOp]
        print(" ".join(sorted(n for n in ops
                              if getattr(mhc, n).forward_cuda is getattr(mhc, n).forward_hip)))
    """)
    env = {**os.environ, "PYTHONPATH": str(part_d.STANDIN)}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    ops = "HCHeadOp MHCFusedPostPreOp MHCPostOp MHCPreDelayedOp MHCPreOp"
    assert done.stdout.strip().splitlines()[-1].split() == ops.split()  # vLLM may warn first
    assert f"MHC fallback installed for {ops.replace(' ', ', ')}" in done.stderr


# ----------------------------------------------------------------------------- the hooks


def test_the_stock_hook_bypasses_the_decorator_and_refuses_without_one(capsys):
    def fixed(self, layer):
        return "fixed"

    def decorated(self, layer):
        return "fixed"

    decorated.__wrapped__ = lambda self, layer: "stock"
    modelopt = types.SimpleNamespace(ModelOptNvFp4FusedMoE=type("M", (), {
        "process_weights_after_loading": decorated}))
    engine_hooks.bypass_moe_fix(modelopt)
    assert modelopt.ModelOptNvFp4FusedMoE().process_weights_after_loading(None) == "stock"
    assert part_d.BYPASSED in capsys.readouterr().err
    bare = types.SimpleNamespace(ModelOptNvFp4FusedMoE=type("M", (), {
        "process_weights_after_loading": fixed}))
    with pytest.raises(RuntimeError, match="no MoE scale fix to bypass"):
        engine_hooks.bypass_moe_fix(bare)


def test_the_aux_hook_saves_the_first_real_prefill_once(tmp_path, monkeypatch):
    rows = engine_hooks.AUX_ROWS
    calls = []

    class DFlashSpeculator:
        def propose(self, input_batch, attn_metadata, slot_mappings, last_hidden_states,
                    aux_hidden_states, *rest, dummy_run=False, **kwargs):
            calls.append(dummy_run)
            return "drafts"

    module = types.SimpleNamespace(DFlashSpeculator=DFlashSpeculator)
    monkeypatch.setenv("GPU_TIER_AUX_DUMP", str(tmp_path / "aux.pt"))
    engine_hooks.dump_aux_hidden_states(module)

    def batch(n):
        return types.SimpleNamespace(num_tokens=n, input_ids=torch.arange(n) + 7,
                                     positions=torch.arange(n))

    aux = [torch.randn(100, 8), torch.randn(100, 8)]
    speculator = module.DFlashSpeculator()
    assert speculator.propose(batch(100), {}, {}, None, aux, dummy_run=True) == "drafts"
    assert speculator.propose(batch(8), {}, {}, None, aux) == "drafts"  # a decode step
    assert not (tmp_path / "aux.pt").exists()
    speculator.propose(batch(100), {}, {}, None, aux)
    saved = torch.load(tmp_path / "aux.pt")
    assert torch.equal(saved["aux"][1], aux[1][:rows]) and saved["positions"].tolist() == \
        list(range(rows))
    (tmp_path / "aux.pt").unlink()
    speculator.propose(batch(100), {}, {}, None, [a * 2 for a in aux])
    assert not (tmp_path / "aux.pt").exists() and calls == [True, False, False, False]


def test_the_hooks_install_only_where_asked(tmp_path):
    """GPU_TIER_STOCK_MOE=1 installs the stock hook when vLLM's modelopt module is imported;
    without it the module keeps the fix."""
    quant = tmp_path / "fake" / "vllm" / "model_executor" / "layers" / "quantization"
    quant.mkdir(parents=True)
    for folder in (quant, *quant.parents):
        if folder == tmp_path / "fake":
            break
        (folder / "__init__.py").write_text("")
    (quant / "modelopt.py").write_text(textwrap.dedent("""
        import functools
        def fold(method):
            @functools.wraps(method)
            def wrapper(self, layer):
                return "fixed"
            return wrapper
        class ModelOptNvFp4FusedMoE:
            @fold
            def process_weights_after_loading(self, layer):
                return "stock"
    """))
    probe = ("from vllm.model_executor.layers.quantization.modelopt import "
             "ModelOptNvFp4FusedMoE as M; print(M().process_weights_after_loading(None))")
    for flag, expected in (("1", "stock"), ("0", "fixed")):
        env = {**os.environ, "GPU_TIER_STOCK_MOE": flag,
               "PYTHONPATH": os.pathsep.join([str(part_d.STANDIN), str(tmp_path / "fake")])}
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              env=env, timeout=120, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip() == expected


# ----------------------------------------------------------------------------- the evaluation


@pytest.mark.parametrize("other, near, equal", [
    ([1, 2, 3], [], True),
    ([1, 9, 3], [], False),            # differs where the reference decided clearly
    ([1, 9, 3], [1], True),            # differs at a listed near-tie
    ([1, 2, 9], [0], True),            # a near-tie earlier: later tokens may follow it
    ([1, 2], [], False),               # an answer cut short differs
])
def test_drafted_tokens_are_judged_against_undrafted_up_to_a_near_tie(other, near, equal):
    margins = [part_d.MARGIN_FLOOR_NATS / 2 if i in near else 5.0 for i in range(3)]
    found = part_d.compare({"tokens": [1, 2, 3], "margins": margins}, {"tokens": other})
    assert found["equal_or_near_tie"] is equal
    assert found["near_ties"] == near


LAYERS, HIDDEN = 4, 16


def passing_run(exact_route: bool = True) -> part_d.Observed:
    """What a run that passes every check would have seen: answers, logs and the aux dump."""
    servers = part_d.plan(exact_route)
    path = list(range(100, 100 + part_d.MAX_TOKENS + 8))
    flip_at, stock_choice = 6, 7
    prompt = list(range(part_d.PROMPT_TOKENS - 1)) + [path[0]]
    generator = torch.Generator().manual_seed(0)
    states = torch.randn(LAYERS, 700, HIDDEN, generator=generator, dtype=torch.float64)
    gaps = torch.full((700,), 0.5, dtype=torch.float64)
    gaps[3] = 0.0  # a row the router nearly ties: not judged
    seen = part_d.Observed(servers=servers, kv="fp8", prompt=prompt, design={
        "path": path, "flip_at": flip_at, "stock_choice": stock_choice})
    seen.aux_reference = lambda ids: {"states": states[:, ids.long()],
                                      "routing_gap": gaps[ids.long()]}
    rows = engine_hooks.AUX_ROWS
    seen.aux = {"aux": [states[tap, :rows] * 1.001 for tap in tiny.DRAFT_TAPS],
                "input_ids": torch.tensor(prompt[:rows]), "positions": torch.arange(rows)}
    designed = path[1:part_d.MAX_TOKENS + 1]
    drafts = 11
    for name, server in servers.items():
        tokens = list(designed)
        if server.model == "live":
            tokens = [5] * part_d.MAX_TOKENS
        if name == "stock":
            tokens[flip_at:] = [stock_choice] * (len(tokens) - flip_at)
        drafted = server.drafter is not None
        per_position = [drafts] * tiny.DESIGN_RIGHT + [0] * (part_d.K - tiny.DESIGN_RIGHT)
        seen.replies[name] = {
            "tokens": tokens, "margins": [10.0] * len(tokens), "prompt_tokens": len(prompt),
            "drafts": drafts if drafted else 0,
            "draft_tokens": drafts * part_d.K if drafted else 0,
            "accepted": sum(per_position) if drafted else 0,
            "per_position": per_position if drafted else [0] * part_d.K}
        seen.argv[name] = ["serve", "m", "--kv-cache-dtype", "fp8_e4m3"]
        lines = ["gpu tier: stand-in installed: x", "gpu tier: MHC fallback installed for y",
                 "INFO Using FLASHINFER_MLA_SPARSE_SM90 attention backend out of potential "
                 "backends: [...]", "INFO Graph capturing finished in 5 secs, took 0.1 GiB"]
        if name == "groups":
            lines.append("INFO GLM53 weight groups on Glm5NextForCausalLM: shared 6, mla 4")
        if name == "stock":
            lines.append(f"gpu tier: {part_d.BYPASSED} (each up half ...)")
        route = part_d.routes(servers).get(name, "")
        if route.startswith("fold"):
            lines.append(f"INFO ModelOpt NVFP4 MoE: unequal ... {part_d.FOLDED}; ...")
        elif route == "exact":
            lines.append(f"INFO ModelOpt NVFP4 MoE layer: unequal ..., {part_d.SCALED}; ...")
        seen.logs[name] = lines
    return seen


def failed(seen: part_d.Observed) -> list[str]:
    return [r["check"] for r in part_d.evaluate(seen) if not r["passed"]]


@pytest.mark.parametrize("exact_route", [True, False])
def test_a_run_that_saw_everything_passes(exact_route):
    seen = passing_run(exact_route)
    results = part_d.evaluate(seen)
    assert [r["check"] for r in results if not r["passed"]] == []
    assert part_d.verdict(results, seen.servers)
    # every planned server has its planned checks
    for name in seen.servers:
        assert sum(r["check"].startswith(f"{name}: ") for r in results) >= 5, name


def test_a_run_with_no_answer_fails_every_check_that_needs_one():
    """The first Glm5Next runs: no server ready (or no answers) and `"passed": true`."""
    seen = passing_run()
    seen.replies, seen.logs, seen.aux = {}, {}, "not written"
    results = part_d.evaluate(seen)
    assert not part_d.verdict(results, seen.servers)
    assert len(results) == len(part_d.planned_checks(seen.servers))
    passing = [r["check"] for r in results if r["passed"]]
    assert passing == ["the prompt is sized by the tokenizer past 2,048 tokens and inside "
                       "--max-model-len"]  # the only check that needs no server
    assert all("missing" in r for r in results if not r["passed"])


def test_one_erroring_server_fails_the_run():
    """The third run: every server ready, every answer an HTTP 400."""
    seen = passing_run()
    seen.replies["drafted"] = "HTTPError: HTTP Error 400: Bad Request"
    assert set(failed(seen)) == {
        "drafted: ready and answered", "drafted: the prompt as sent",
        "drafted = undrafted (designed drafter, k = 7, ring fix on)",
        "drafted: acceptance per position as designed",
        "drafted: acceptance at least 0.5 of drafted tokens"}
    results = part_d.evaluate(seen)
    assert not part_d.verdict(results, seen.servers)
    assert not part_d.verdict(results[:-1], seen.servers)  # a missing check fails alike
    everything = part_d.evaluate(passing_run())
    assert not part_d.verdict(everything[:-1], seen.servers)
    assert not part_d.verdict(everything + everything[-1:], seen.servers)


def corrupt(change):
    seen = passing_run()
    change(seen)
    return failed(seen)


@pytest.mark.parametrize("change, fails", [
    # one token of the drafted answer
    (lambda s: s.replies["drafted"]["tokens"].__setitem__(30, 1),
     "drafted = undrafted (designed drafter, k = 7, ring fix on)"),
    (lambda s: s.replies["live-drafted"]["tokens"].__setitem__(63, 1),
     "live-drafted = live-undrafted past 2,048 tokens (ring fix on), up to near ties"),
    (lambda s: s.replies["tau-0.3"].update(drafts=0), "tau-0.3 = undrafted"),
    (lambda s: s.replies["groups"]["tokens"].__setitem__(0, 1), "groups = undrafted"),
    (lambda s: s.replies["undrafted"]["tokens"].__setitem__(63, 1),
     "undrafted: greedy tokens follow the float64 design"),
    (lambda s: s.replies["twin"]["tokens"].pop(), "twin: greedy tokens follow the float64 "
     "design (the intended weights)"),
    (lambda s: s.replies["fold"]["tokens"].__setitem__(10, 1), "fold = twin (MoE fix: fold)"),
    (lambda s: s.replies["undrafted"]["tokens"].__setitem__(10, 1),
     "undrafted = twin (MoE fix: exact)"),
    # stock that follows the twin, or diverges one answer late, or to another token
    (lambda s: s.replies["stock"].update(tokens=list(s.replies["twin"]["tokens"])),
     "stock diverges from twin where float64 designs it"),
    (lambda s: s.replies["stock"]["tokens"].__setitem__(6, s.replies["twin"]["tokens"][6]),
     "stock diverges from twin where float64 designs it"),
    (lambda s: s.replies["stock"]["tokens"].__setitem__(6, 8),
     "stock diverges from twin where float64 designs it"),
    # one accepted draft missing at a designed-right position, one accepted where wrong
    (lambda s: s.replies["drafted"]["per_position"].__setitem__(2, 9),
     "drafted: acceptance per position as designed"),
    (lambda s: s.replies["drafted"]["per_position"].__setitem__(5, 1),
     "drafted: acceptance per position as designed"),
    (lambda s: s.replies["drafted"].update(accepted=38),
     "drafted: acceptance at least 0.5 of drafted tokens"),
    # the aux states 6% off in one judged row, or the wrong layer tapped, or not the prompt's
    (lambda s: s.aux["aux"][0][4].mul_(1.06),
     "drafted: the drafter's aux hidden states are the target's layers 1 and 3 (float64)"),
    (lambda s: s.aux.update(aux=[s.aux_reference(s.aux["input_ids"])["states"][2],
                                 s.aux["aux"][1]]),
     "drafted: the drafter's aux hidden states are the target's layers 1 and 3 (float64)"),
    (lambda s: s.aux.update(positions=s.aux["positions"] + 1),
     "drafted: the drafter's aux hidden states are the target's layers 1 and 3 (float64)"),
    # a prompt one token short of the ring, the server counting one more than was sent
    (lambda s: s.prompt.__delitem__(slice(2048, None)),
     "the prompt is sized by the tokenizer past 2,048 tokens and inside --max-model-len"),
    (lambda s: s.replies["twin"].update(prompt_tokens=len(s.prompt) + 1),
     "twin: the prompt as sent"),
    # the logs: BF16 KV's backend, eager, the stand-in or the fix lines absent, a fold in stock
    (lambda s: s.logs["undrafted"].__setitem__(2, "Using FLASH_ATTN_MLA_SPARSE attention "
                                                  "backend"),
     "undrafted: sparse MLA on the backend the KV dtype picks (its log)"),
    (lambda s: s.argv["drafted"].append("--enforce-eager"),
     "drafted: CUDA graphs captured, no --enforce-eager (its log)"),
    (lambda s: s.logs["twin"].pop(3), "twin: CUDA graphs captured, no --enforce-eager (its log)"),
    (lambda s: s.logs["stock"].pop(0),
     "stock: the stand-in and the MHC fallback installed (its log)"),
    (lambda s: s.logs.__setitem__("groups", [line for line in s.logs["groups"]
                                             if "GLM53 weight groups" not in line]),
     "groups: the target groups swapped by Glm5Next's names "
     "(its log)"),
    (lambda s: s.logs["stock"].append(part_d.FOLDED),
     "stock: the fix bypassed and nothing folded (its log)"),
    (lambda s: s.logs["undrafted"].append(part_d.FOLDED),
     "undrafted: the exact route's log line, and nothing folded"),
    (lambda s: s.logs["undrafted"].pop(), "undrafted: the exact route's log line, and nothing "
     "folded"),
    (lambda s: s.logs["fold"].pop(), "fold: the fold's log line"),
])
def test_the_smallest_corruption_of_any_answer_fails_its_check(change, fails):
    assert fails in corrupt(change)


def test_an_aux_row_the_router_nearly_ties_is_listed_not_judged():
    seen = passing_run()
    seen.aux["aux"][1][3].mul_(2.0)  # row 3: routing gap 0 in float64
    check = "drafted: the drafter's aux hidden states are the target's layers 1 and 3 (float64)"
    assert check not in failed(seen)
    result = next(r for r in part_d.evaluate(seen) if r["check"] == check)
    assert result["judged_rows"] == engine_hooks.AUX_ROWS - 1


def test_the_designed_acceptance_allows_the_last_step_only():
    """An answer cut by max_tokens may leave its last step one draft short; two is a fault."""
    seen = passing_run()
    seen.replies["drafted"]["per_position"][:5] = [10] * 5
    assert "drafted: acceptance per position as designed" not in failed(seen)
    seen.replies["drafted"]["per_position"][0] = 9
    assert "drafted: acceptance per position as designed" in failed(seen)


def test_the_prompt_is_sized_by_the_tokenizer():
    from tests.gpu import models

    tokenizer = models.tiny_models.tokenizer_dir()
    ids = part_d.prompt_ids(tokenizer, last=123)
    assert len(ids) == part_d.PROMPT_TOKENS and ids[-1] == 123
    assert part_d.RING_PROMPT_TOKENS < len(ids) <= part_d.MAX_MODEL_LEN - part_d.MAX_TOKENS - 8
    seen = copy.copy(passing_run())
    seen.prompt = ids
    assert "the prompt is sized by the tokenizer past 2,048 tokens and inside " \
           "--max-model-len" not in failed(seen)
