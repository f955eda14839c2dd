"""Two turns of one conversation through vLLM's own Scheduler with Glm5Next's KV groups.

Run with PYTHONPATH set to a vLLM tree (0.30.0 or the fork shape, with or without v11;
0.33.0 or 0.34.0 as released). The KV cache config is what the tree's own planner builds for
GLM-5.3-Flash at TP=2 and the seed's settings (block 2304: five MLA layers with their
DSA indexers and kpool tails in the model's own tail spec, 18 KDA states in "align"
mode) plus, when drafting, DFlash2's five sliding-window layers (window 2048). The
scheduler is the tree's ``Scheduler`` (or ``AsyncScheduler``), driven by
``schedule()`` and ``update_from_output()`` with model-runner outputs made here, the way
vLLM's engine core drives it: request 1 to completion, then request 2 whose prompt is
request 1's prompt and answer plus new tokens.

Arguments: case names, each ``drafting-async-pool`` with drafting one of off, accept,
reject; async one of sync, async; pool one of roomy, tight (tight: a filler request
between the turns evicts part of turn 1's cached blocks); a trailing ``-aligned`` makes turn
1's prompt a multiple of 2304, ``-fullblock`` gives the drafter's group the attention block
(2304) instead of v11's quarter, ``-stockdrop`` runs the case with patcher
v11_dflash_block_drop undone (its planted fault: 0.30.0's ``use_eagle_block_drop`` undecorated,
the fork shape's scheduler gate giving ``use_eagle`` back). Prints one JSON object.
"""

import dataclasses
import json
import sys
import traceback
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import vllm.platforms  # noqa: E402
from vllm.platforms.cpu import CpuPlatform  # noqa: E402

vllm.platforms._current_platform = CpuPlatform()

from vllm.config import CacheConfig, SchedulerConfig, SpeculativeConfig, VllmConfig  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core import kv_cache_utils as utils  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1 import kv_cache_interface as interface  # noqa: E402
from vllm.v1.kv_cache_interface import MambaSpec, SlidingWindowSpec  # noqa: E402
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

import glm5next_kv_groups as kv_groups  # noqa: E402

BLOCK = kv_groups.REAL_BLOCK  # the seed's --block-size 2304
KPOOL = 4  # index_kpool: one indexer state per 4 tokens (76,032 = 576 states of 132 B)
INDEXER_HEAD_DIM = 128
NUM_SPEC = 7  # the launcher's k for DFlash2
WINDOW = 2048  # DFlash2's sliding window
CHUNK = 8192  # max_num_batched_tokens (vLLM's default for the server)
MAX_MODEL_LEN = 327680
TURN1_PROMPT = 9 * BLOCK  # 20,736 tokens
ANSWER = 24  # tokens request 1 generates
TURN2_NEW = 1000  # the user's new tokens in turn 2
FILLER = 6 * BLOCK  # the tight pool's unrelated request between the turns
KV_PIN = kv_groups.KV_PIN
# The roomy pool: twice the launcher's pin, since 0.33.0's planner finds the pin too small for
# 327,680 tokens with the drafter (the "pin" case reports that).
ROOMY = 2 * KV_PIN


def tail_spec(drafting: bool):
    """The kpool tail's spec as the tree's model makes it: ``Glm5NextTailCache.get_kv_cache_spec``
    (0.30.0: ``KpoolTailSpec`` of block and window index_kpool, not prefix-cacheable; 0.33.0:
    a ``CircularBufferSpec`` ring of index_kpool times the next power of two of the pools
    k drafts span). The fork shape's ``KpoolTailSpec`` (ours, 0.27.1's KV API) has no opt-out
    of prefix caching; its tail is taken at the attention block, as the fork shape's planner
    tests take it, since the 0.27.1 engine core sets the cache block to the smallest group's
    and a 4-token tail group would refuse to start."""
    tail = {"num_kv_heads": 2, "head_size": INDEXER_HEAD_DIM, "head_size_v": 0, "dtype": torch.bfloat16}
    kpool_tail = getattr(interface, "KpoolTailSpec", None)
    if kpool_tail is None:
        ring = KPOOL * next_power_of_two(cdiv(KPOOL + (NUM_SPEC if drafting else 0), KPOOL))
        return "CircularBufferSpec", interface.CircularBufferSpec(block_size=ring, **tail, dcp_sharded=False)
    if hasattr(kpool_tail, "prefix_cacheable"):
        return "KpoolTailSpec", kpool_tail(block_size=KPOOL, sliding_window=KPOOL, **tail)
    return "KpoolTailSpec@block", kpool_tail(
        block_size=BLOCK, num_kv_heads=1, head_size=16, dtype=torch.uint8, sliding_window=KPOOL)


def next_power_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length()


def target_specs(drafting: bool) -> dict:
    """GLM-5.3-Flash at TP=2: the published pages (five MLA layers and their DSA indexers),
    the tree's own tail spec, KDA states in align mode with a speculative block per draft
    token, as the model makes them."""
    specs = kv_groups.target_specs(BLOCK, kv_groups.REAL_MLA_LAYERS, real_pages=True, with_tail=False)
    _, tail = tail_spec(drafting)
    for name in list(specs):
        if name.endswith(".indexer.k_cache"):
            specs[name.replace(".k_cache", ".tail")] = tail
        elif isinstance(specs[name], MambaSpec):
            specs[name] = dataclasses.replace(
                specs[name], mamba_cache_mode="align", num_speculative_blocks=NUM_SPEC if drafting else 0,
            )
    return specs


def drafter_specs() -> dict:
    specs = kv_groups.drafter_specs(block=BLOCK)
    if "is_draft" in {f.name for f in dataclasses.fields(SlidingWindowSpec)}:
        # 0.33.0's runners mark the drafter's layers (gpu/attn_utils.py: replace(spec, is_draft=True)).
        specs = {name: dataclasses.replace(spec, is_draft=True) for name, spec in specs.items()}
    return specs


def bare(cls, **values):
    """An instance of the tree's config dataclass CLS with its defaults and VALUES, built
    without its validation (which wants a checkpoint to read)."""
    config = object.__new__(cls)
    for field in dataclasses.fields(cls):
        if field.default is not dataclasses.MISSING:
            value = field.default
        elif field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
        else:
            value = None
        if hasattr(value, "get_default"):  # a pydantic Field(...) as the dataclass default
            value = value.get_default(call_default_factory=True)
        object.__setattr__(config, field.name, values.get(field.name, value))
    return config


def make_vllm_config(drafting: bool, async_scheduling: bool, num_blocks: int | None = None) -> VllmConfig:
    """A VllmConfig built field by field (no checkpoint to read): the tree's own sub-configs
    at the launcher's settings, a model config carrying what the scheduler reads."""
    config = bare(VllmConfig)
    scheduler = SchedulerConfig(
        max_model_len=MAX_MODEL_LEN, is_encoder_decoder=False, max_num_batched_tokens=CHUNK,
        max_num_seqs=2, async_scheduling=async_scheduling,
    )
    cache = CacheConfig(block_size=BLOCK, enable_prefix_caching=True, mamba_cache_mode="align")
    cache.num_gpu_blocks = num_blocks
    if hasattr(cache, "kv_cache_layout") and cache.kv_cache_layout is None:
        cache.kv_cache_layout = "BLHNC"  # 0.33.0: resolved by the engine core; the probe's planner layout
    model = SimpleNamespace(
        uses_mrope=False, is_encoder_decoder=False, max_model_len=MAX_MODEL_LEN,
        original_max_model_len=MAX_MODEL_LEN, is_diffusion=False,
        enable_return_routed_experts=False, return_sampling_mask=False, multimodal_config=None,
        is_multimodal_model=False, hf_config=SimpleNamespace(model_type="glm5_next"),
        runner_type="generate", is_hybrid=True, get_vocab_size=lambda: 1000, skip_tokenizer_init=True,
        supports_kv_cache_grouping=False, supports_multimodal_inputs=False,  # Glm5Next declares no grouping of its own (0.33.0)
    )
    for name, value in (("scheduler_config", scheduler), ("cache_config", cache), ("model_config", model),
                        ("speculative_config", bare(SpeculativeConfig, method="dflash", num_speculative_tokens=NUM_SPEC)
                                                if drafting else None)):
        object.__setattr__(config, name, value)
    return config


def plan(config: VllmConfig, specs: dict, memory: int):
    """The tree's own planner: (kv_cache_config, scheduler_block_size, hash_block_size)."""
    if hasattr(utils, "get_global_kv_cache_groups") or not hasattr(utils, "get_kv_cache_config_from_groups"):
        from vllm.v1.core import kv_cache_planning as planning  # 0.33.0: planning moved here
        groups = planning.get_global_kv_cache_groups(config, [dict(specs)])
        kv_config = utils.generate_scheduler_kv_cache_config(
            planning.get_kv_cache_configs(config, [dict(specs)], [memory], groups))
    else:
        groups = utils.get_kv_cache_groups(config, dict(specs))
        kv_config = utils.get_kv_cache_config_from_groups(config, groups, memory)
    kv_config = utils.generate_scheduler_kv_cache_config([kv_config])
    config.cache_config.num_gpu_blocks = kv_config.num_blocks
    # The engine core's next step (0.30.0's core.py): the cache block size is the smallest
    # prefix-cacheable group's, then both block sizes are resolved from the groups.
    cacheable = [g.kv_cache_spec.block_size for g in kv_config.kv_cache_groups
                 if getattr(g.kv_cache_spec, "prefix_cacheable", True)]
    config.cache_config.block_size = min(cacheable or [g.kv_cache_spec.block_size for g in kv_config.kv_cache_groups])
    scheduler_block, hash_block = utils.resolve_kv_cache_block_sizes(kv_config, config)
    return kv_config, scheduler_block, hash_block


class Driver:
    """Drives one Scheduler as the engine core does, with outputs made here: a prefill chunk
    samples nothing, the step that ends a prompt samples one token, a decode step samples
    its accepted drafts plus one (every draft accepted, or none)."""

    def __init__(self, scheduler, drafting: str, async_scheduling: bool):
        self.scheduler = scheduler
        self.drafting = drafting
        self.async_scheduling = async_scheduling
        self.prefill_tokens: dict[str, int] = {}
        self.first_hit: dict[str, int] = {}
        self.drafts_scheduled = 0
        self.drafts_accepted = 0
        self.steps = 0
        self.next_token = 500
        self.min_free = 1 << 62

    def add(self, request_id: str, prompt: list[int], max_tokens: int, hasher) -> Request:
        request = Request(
            request_id, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0),
            None, block_hasher=hasher,
        )
        self.scheduler.add_request(request)
        self.prefill_tokens[request_id] = 0
        return request

    def _output(self, scheduler_output) -> ModelRunnerOutput:
        req_ids = list(scheduler_output.num_scheduled_tokens)
        sampled = []
        for req_id in req_ids:
            request = self.scheduler.requests[req_id]
            spec = scheduler_output.scheduled_spec_decode_tokens.get(req_id, [])
            scheduled = scheduler_output.num_scheduled_tokens[req_id]
            done = self._scheduled_upto[req_id]
            if done < request.num_prompt_tokens:
                sampled.append([])
                continue
            accepted = len(spec) if self.drafting == "accept" else 0
            self.drafts_scheduled += len(spec)
            self.drafts_accepted += accepted
            sampled.append([self._token() for _ in range(accepted + 1)])
            del scheduled
        index = {}
        if "req_id_to_index" in {f.name for f in dataclasses.fields(ModelRunnerOutput)}:
            # 0.34.0 dropped the field: its scheduler indexes the outputs by req_ids' order.
            index["req_id_to_index"] = {r: i for i, r in enumerate(req_ids)}
        return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled, **index)

    def _token(self) -> int:
        self.next_token += 1
        return 100 + self.next_token % 800

    def _note_schedule(self, scheduler_output):
        for new in scheduler_output.scheduled_new_reqs:
            self.first_hit.setdefault(new.req_id, new.num_computed_tokens)
            self._scheduled_upto[new.req_id] = new.num_computed_tokens
        for req_id, count in scheduler_output.num_scheduled_tokens.items():
            spec = len(scheduler_output.scheduled_spec_decode_tokens.get(req_id, []))
            request = self.scheduler.requests[req_id]
            before = self._scheduled_upto.get(req_id, 0)
            if before < request.num_prompt_tokens:
                self.prefill_tokens[req_id] += min(count, request.num_prompt_tokens - before)
            self._scheduled_upto[req_id] = before + count - spec

    def run(self, limit: int = 400):
        """Steps until nothing is left; returns the requests that finished."""
        self._scheduled_upto = getattr(self, "_scheduled_upto", {})
        pending = []
        for _ in range(limit):
            if not self.scheduler.has_unfinished_requests() and not pending:
                return
            scheduler_output = self.scheduler.schedule()
            self._note_schedule(scheduler_output)
            self.steps += 1
            self.min_free = min(self.min_free, self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks())
            pending.append((scheduler_output, self._output(scheduler_output)))
            # Async scheduling keeps one step in flight: step N's output lands after N+1 is scheduled.
            while pending and (not self.async_scheduling or len(pending) > 1
                               or not self.scheduler.has_unfinished_requests()
                               or not scheduler_output.num_scheduled_tokens):
                done_output, model_output = pending.pop(0)
                # The fake output was made at schedule time; with async, a request may have
                # grown placeholders meanwhile, which the scheduler reconciles itself.
                self.scheduler.update_from_output(done_output, model_output)
                if not self.async_scheduling and self.drafting != "off":
                    self._draft(done_output)
        raise RuntimeError(f"the scheduler did not finish within {limit} steps")

    def _draft(self, scheduler_output):
        """The drafter's proposals after a step (the synchronous engine's take_draft_token_ids)."""
        req_ids = [r for r in scheduler_output.num_scheduled_tokens
                   if r in self.scheduler.requests and not self.scheduler.requests[r].is_finished()]
        if req_ids:
            self.scheduler.update_draft_token_ids(
                DraftTokenIds(req_ids, [[self._token() for _ in range(NUM_SPEC)] for _ in req_ids]))


def free_block_ids(block_pool) -> list[int]:
    queue = block_pool.free_block_queue
    ids, block = [], queue.fake_free_list_head.next_free_block
    while block is not None and block is not queue.fake_free_list_tail:
        ids.append(block.block_id)
        block = block.next_free_block
    return ids


def group_blocks(scheduler, request_id: str) -> list[int]:
    """Non-null blocks the request holds in each KV cache group."""
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    return [sum(1 for b in m.req_to_blocks.get(request_id, []) if not b.is_null) for m in managers]


def run_case(case: str) -> dict:
    if case.endswith("-stockdrop"):
        return with_stock_block_drop(case.removesuffix("-stockdrop"))
    if case.endswith("-fullblock"):
        return with_full_draft_block(case.removesuffix("-fullblock"))
    drafting, mode, pool, *rest = case.split("-")
    # A conversation's prompt ends on a block boundary one time in 2304; "aligned" is that case.
    turn1_length = TURN1_PROMPT if rest == ["aligned"] else TURN1_PROMPT - 700
    with_drafter = drafting != "off"
    async_scheduling = mode == "async"
    config = make_vllm_config(with_drafter, async_scheduling)
    specs = target_specs(with_drafter)
    if with_drafter:
        specs.update(drafter_specs())
    memory = ROOMY
    if pool == "tight":
        # Room for what either turn alone holds at its peak (measured on the roomy pool; turn 1
        # holds more than turn 2 when turn 2 hits) and 8 blocks more (the admission reserve of
        # the drafter's window): the filler between the turns evicts part of turn 1's cached blocks.
        roomy = run_case("-".join([drafting, mode, "roomy", *rest]))
        peak = max(roomy["turn1_peak_blocks"], roomy["turn2_peak_blocks"])
        memory = ROOMY // roomy["num_blocks"] * (peak + 8)
        config.model_config.max_model_len = 24576  # a small pool cannot hold 327,680 tokens
    kv_config, scheduler_block, hash_block = plan(config, specs, memory)
    from vllm.utils.hashing import sha256
    hasher = utils.get_request_block_hasher(hash_block, sha256)
    utils.init_none_hash(sha256)
    scheduler_cls = AsyncScheduler if async_scheduling else Scheduler
    scheduler = scheduler_cls(
        vllm_config=config, kv_cache_config=kv_config, structured_output_manager=StructuredOutputManager(config),
        block_size=scheduler_block, hash_block_size=hash_block, log_stats=True,
    )
    pool_obj = scheduler.kv_cache_manager.block_pool
    free_at_start = pool_obj.get_num_free_blocks()
    groups = kv_config.kv_cache_groups
    coordinator = scheduler.kv_cache_manager.coordinator
    report = {
        "groups": [f"{type(g.kv_cache_spec).__name__}/{g.kv_cache_spec.block_size}" for g in groups],
        "eagle_group_ids": sorted(getattr(coordinator, "eagle_group_ids", set())),
        "coordinator": type(coordinator).__name__,
        "num_blocks": kv_config.num_blocks, "scheduler_block": scheduler_block, "hash_block": hash_block,
        "free_at_start": free_at_start,
    }
    driver = Driver(scheduler, drafting, async_scheduling)
    prompt1 = [(7 * i) % 997 + 1 for i in range(turn1_length)]
    turn1 = driver.add("turn1", prompt1, ANSWER, hasher)
    driver.run()
    answer = list(turn1.output_token_ids)
    report["turn1_prefill"] = driver.prefill_tokens["turn1"]
    report["turn1_peak_blocks"] = free_at_start - driver.min_free
    report["turn1_answer"] = len(answer)
    if pool == "tight":
        driver.add("filler", [(11 * i) % 991 + 3 for i in range(FILLER)], 2, hasher)
        driver.run()
    prompt2 = prompt1 + answer + [(13 * i) % 983 + 5 for i in range(TURN2_NEW)]
    report["shared_prefix"] = len(prompt1) + len(answer)
    driver.add("turn2", prompt2, 4, hasher)
    driver.min_free = free_at_start  # from here on, what turn 2 alone holds
    # The first step of turn 2: its hit and the blocks it holds per group.
    scheduler_output = scheduler.schedule()
    driver._note_schedule(scheduler_output)
    driver.min_free = min(driver.min_free, pool_obj.get_num_free_blocks())
    report["turn2_hit"] = driver.first_hit["turn2"]
    report["turn2_blocks"] = group_blocks(scheduler, "turn2")
    draft_ids = [i for i, g in enumerate(groups) if type(g.kv_cache_spec) is SlidingWindowSpec]
    hit = report["turn2_hit"]
    if draft_ids:
        # The drafter's window before the hit's end: its blocks there must be real (hit), not null.
        manager = coordinator.single_type_managers[draft_ids[0]]
        size = manager.block_size
        blocks = scheduler.kv_cache_manager.coordinator.single_type_managers[draft_ids[0]].req_to_blocks["turn2"]
        window = range(max(0, hit - WINDOW) // size, cdiv(hit, size))
        report["draft_window_blocks_present"] = sum(1 for i in window if i < len(blocks) and not blocks[i].is_null)
        report["draft_window_blocks_needed"] = len(window)
    driver.steps += 1
    pending_output = driver._output(scheduler_output)
    scheduler.update_from_output(scheduler_output, pending_output)
    if not async_scheduling and drafting != "off":
        driver._draft(scheduler_output)
    driver.run()
    report["turn2_prefill"] = driver.prefill_tokens["turn2"]
    report["turn2_peak_blocks"] = free_at_start - driver.min_free
    report["turn2_prompt"] = len(prompt2)
    report["drafts_scheduled"] = driver.drafts_scheduled
    report["drafts_accepted"] = driver.drafts_accepted
    report["free_at_end"] = pool_obj.get_num_free_blocks()
    ids = free_block_ids(pool_obj)
    report["free_ids_unique"] = len(ids) == len(set(ids))
    report["ref_counts_zero"] = all(b.ref_cnt == 0 for b in pool_obj.blocks if not b.is_null)
    return report


def with_stock_block_drop(case: str) -> dict:
    """CASE with v11_dflash_block_drop undone: the base's own answer again, from the function the
    decorator wrapped (0.30.0) or from a scheduler gate that passes use_eagle through (fork)."""
    import vllm.v1.core.sched.scheduler as scheduler_module
    decorated = getattr(SpeculativeConfig, "use_eagle_block_drop", None)
    if hasattr(decorated, "__wrapped__"):
        owner, name, stock = SpeculativeConfig, "use_eagle_block_drop", decorated.__wrapped__
    elif hasattr(scheduler_module, "drops_trailing_block"):
        owner, name, stock = scheduler_module, "drops_trailing_block", lambda use_eagle, _config: use_eagle
    else:
        raise RuntimeError("v11_dflash_block_drop is not applied to this tree; apply it first")
    patched = getattr(owner, name)
    setattr(owner, name, stock)
    try:
        return run_case(case)
    finally:
        setattr(owner, name, patched)


def with_full_draft_block(case: str) -> dict:
    """CASE with the drafter's KV group at the attention block (v11's helper at divisor 1): the
    fork shape's way to start with prefix caching beside the drafter, at a cost in pool."""
    from vllm.v1.core import glm5_next_draft_kv as draft_kv
    quarter = draft_kv.DRAFT_BLOCK_DIVISOR
    draft_kv.DRAFT_BLOCK_DIVISOR = 1
    try:
        if case.startswith("pin-"):
            return pin_case(case == "pin-drafter")
        return run_case(case)
    finally:
        draft_kv.DRAFT_BLOCK_DIVISOR = quarter


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pin_case(drafting: bool) -> dict:
    """The pool at the launcher's --kv-cache-memory-bytes, planned by the tree for 327,680 tokens."""
    specs = target_specs(drafting)
    if drafting:
        specs.update(drafter_specs())
    kv_config, _, _ = plan(make_vllm_config(drafting, False), specs, KV_PIN)
    return {"num_blocks": kv_config.num_blocks}


def main():
    report = {"vllm_file": vllm.__file__}
    for case in sys.argv[1:]:
        try:
            if case.startswith("pin-") and not case.endswith("-fullblock"):
                report[case] = pin_case(case == "pin-drafter")
                continue
            report[case] = run_case(case)
        except Exception as error:  # reported per case: the table shows which cases fail and where
            frame = traceback.extract_tb(error.__traceback__)[-1]
            report[case] = {"error": f"{type(error).__name__}: {error}".splitlines()[0][:300],
                            "where": f"{Path(frame.filename).name}:{frame.lineno}"}
    json.dump(report, sys.stdout)
    print()


if __name__ == "__main__":
    main()
