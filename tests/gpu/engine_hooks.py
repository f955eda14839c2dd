"""Hooks of part d's servers that a tier variable turns on, one server at a time
(tests/gpu/standin installs each as its vLLM module is first imported; tests/gpu/run d):

- GPU_TIER_STOCK_MOE=1: stock vLLM's ModelOpt NVFP4 MoE, the v8_moe_scales decorator bypassed
  (its `__wrapped__`, the method as vLLM 0.30.0 has it), so the same tree serves the unfixed
  reading of each expert's up half (the gate's global);
- GPU_TIER_AUX_DUMP=FILE: the first AUX_ROWS rows of the auxiliary hidden states the target
  hands its DFlash drafter at the first prefill step, with their token ids and positions, saved
  to FILE (torch.save) so part d can compare them with the float64 forward of the tapped
  layers.

Each says on stderr what it did; part d's checks read those lines from the server's log."""

from __future__ import annotations

import functools
import inspect
import os
import sys

AUX_ROWS = 64


def _say(message: str) -> None:
    print(f"gpu tier: {message}", file=sys.stderr, flush=True)


def bypass_moe_fix(modelopt) -> None:
    """ModelOptNvFp4FusedMoE.process_weights_after_loading back to the undecorated method;
    refuses when the tree has no decorator to bypass (v8_moe_scales not applied)."""
    method = modelopt.ModelOptNvFp4FusedMoE.process_weights_after_loading
    stock = getattr(method, "__wrapped__", None)
    if stock is None:
        raise RuntimeError("tests/gpu/engine_hooks.py: ModelOptNvFp4FusedMoE."
                           "process_weights_after_loading has no __wrapped__: the tree "
                           "carries no MoE scale fix to bypass (layer v8_moe_scales)")
    modelopt.ModelOptNvFp4FusedMoE.process_weights_after_loading = stock
    _say("stock MoE: the v8_moe_scales decorator is bypassed (each up half read with its "
         "gate's global)")


def dump_aux_hidden_states(speculator) -> None:
    """Wrap DFlashSpeculator.propose (vllm.v1.worker.gpu.spec_decode.dflash.speculator; the
    DFlash2 speculator inherits it) to save the first real prefill's aux hidden states once."""
    import torch

    path = os.environ["GPU_TIER_AUX_DUMP"]
    propose = speculator.DFlashSpeculator.propose
    signature = inspect.signature(propose)
    done = []

    @functools.wraps(propose)
    def recording(self, *args, **kwargs):
        if not done:
            given = signature.bind(self, *args, **kwargs).arguments
            aux, batch = given.get("aux_hidden_states"), given.get("input_batch")
            if aux and batch is not None and not given.get("dummy_run", False) \
                    and batch.num_tokens >= AUX_ROWS \
                    and not (aux[0].is_cuda and torch.cuda.is_current_stream_capturing()):
                torch.save({"aux": [t[:AUX_ROWS].float().cpu() for t in aux],
                            "input_ids": batch.input_ids[:AUX_ROWS].cpu(),
                            "positions": batch.positions[:AUX_ROWS].cpu()}, path)
                done.append(path)
                _say(f"aux hidden states dumped: {len(aux)} x {AUX_ROWS} rows to {path}")
        return propose(self, *args, **kwargs)

    speculator.DFlashSpeculator.propose = recording
    _say("aux hidden state dump armed (GPU_TIER_AUX_DUMP)")
