"""DFlash's causality and DFlash2's probabilistic drafting, as the vLLM tree on PYTHONPATH does them.

Prints one JSON object:
- "causal": for each named drafter config (and each config.json given as an argument), `_dflash_layer_causal(config, i)` of the
  tree's qwen3_dflash for every layer (vLLM's own function, on CPU torch);
- "hooks": the (dtype, fill) the tree's speculators give the cached draft
  distribution, when the tree has the draft_logits_spec hook;
- "probabilistic": the real speculator the tree's `init_speculator` builds on CPU for a
  DFlash2 (and a DFlash) draft with draft_sample_method "probabilistic", and the dtype
  and fill of its cached draft distribution; or the refusal it raises instead.
"""

import json
import math
import sys
from types import SimpleNamespace

import torch
import vllm
import vllm.platforms
from vllm.platforms.cpu import CpuPlatform

vllm.platforms._current_platform = CpuPlatform()

from vllm.model_executor.models.qwen3_dflash import _dflash_layer_causal
from vllm.v1.worker.gpu.spec_decode import init_speculator
from vllm.v1.worker.gpu.spec_decode import speculator as base_module

SLIDING, FULL = "sliding_attention", "full_attention"


def drafter(layer_type, layers=5, **fields):
    return SimpleNamespace(layer_types=[layer_type] * layers, num_hidden_layers=layers, **fields)


CONFIGS = {
    # incoai's published drafter: sliding layers with a top-level is_causal false.
    "incoai": drafter(SLIDING, is_causal=False, dflash_config={}),
    "sliding_no_is_causal": drafter(SLIDING, dflash_config={}),
    "sliding_dflash_causal_false": drafter(SLIDING, dflash_config={"causal": False}),
    "full_no_is_causal": drafter(FULL, layers=8, dflash_config={}),
    "full_is_causal_true": drafter(FULL, layers=8, is_causal=True, dflash_config={"causal": False}),
    "use_swa_full": drafter(FULL, layers=8, dflash_config={"use_swa": True}),
}


def hooks():
    found = {}
    config = SimpleNamespace(model_config=SimpleNamespace(head_dtype=torch.bfloat16))
    for name in dir(base_module):
        cls = getattr(base_module, name)
        if isinstance(cls, type) and "draft_logits_spec" in vars(cls):
            found[name] = cls.draft_logits_spec(None, config)
    try:
        from vllm.v1.worker.gpu.spec_decode.dflash2.speculator import DFlash2Speculator
    except ImportError:
        return {}
    if "draft_logits_spec" in vars(DFlash2Speculator):
        found["DFlash2Speculator"] = DFlash2Speculator.draft_logits_spec(None, config)
    return {
        name: [str(dtype).removeprefix("torch."), "-inf" if math.isinf(fill) and fill < 0 else fill]
        for name, (dtype, fill) in found.items()
    }


def speculator_config(architecture):
    """A stub VllmConfig holding what a DFlash speculator's constructor reads."""
    hf_config = SimpleNamespace(
        dflash_config={"selector_top_k": 4, "mask_token_id": 500, "target_layer_ids": [1, 2]},
        num_hidden_layers=5, layer_types=[SLIDING] * 5, is_causal=False, hidden_size=64,
        vocab_size=512,
    )
    draft = SimpleNamespace(
        architectures=[architecture], hf_config=hf_config,
        get_hidden_size=lambda: 64, get_vocab_size=lambda: 512,
    )
    return SimpleNamespace(
        speculative_config=SimpleNamespace(
            method="dflash", draft_sample_method="probabilistic", num_speculative_tokens=7,
            draft_model_config=draft, use_local_argmax_reduction=False,
        ),
        scheduler_config=SimpleNamespace(max_num_seqs=2, max_num_batched_tokens=64),
        model_config=SimpleNamespace(
            max_model_len=128, dtype=torch.bfloat16, head_dtype=torch.bfloat16, use_fp64_gumbel=False,
        ),
        parallel_config=SimpleNamespace(data_parallel_size=1, data_parallel_rank=0),
    )


def probabilistic(architecture):
    """The real speculator the tree builds on CPU, and its cached draft distribution."""
    try:
        built = init_speculator(speculator_config(architecture), torch.device("cpu"))
    except ValueError as error:
        return {"refused": str(error)}
    except Exception as error:  # noqa: BLE001 (a tree that cannot build it says so)
        return {"error": f"{type(error).__name__}: {error}"}
    cache = built.draft_logits
    return {
        "speculator": type(built).__name__,
        "dtype": str(cache.dtype).removeprefix("torch."),
        "shape": list(cache.shape),
        "fill": sorted({str(v) for v in cache.flatten().tolist()}),
    }


for path in sys.argv[1:]:  # drafter config.json files, read as vLLM's config object exposes them
    with open(path) as handle:
        raw = json.load(handle)
    CONFIGS[path] = SimpleNamespace(**{k: raw.get(k) for k in ("layer_types", "is_causal", "num_hidden_layers")},
                                    dflash_config=raw.get("dflash_config") or {})

print(json.dumps({
    "vllm_file": vllm.__file__,
    "causal": {
        name: [_dflash_layer_causal(config, i) for i in range(config.num_hidden_layers)]
        for name, config in CONFIGS.items()
    },
    "hooks": hooks(),
    "probabilistic": {
        "DFlash2DraftModel": probabilistic("DFlash2DraftModel"),
        "DFlashDraftModel": probabilistic("DFlashDraftModel"),
    },
}))
