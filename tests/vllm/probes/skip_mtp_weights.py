"""Exercise layer v13's MTP-weight skip in the patched weight filter, on CPU.

Run with PYTHONPATH set to a v13-patched tree and GLM53_* in the environment. The current
vLLM config is GLM-5.3-Flash's shape (45 layers, one MTP layer) with the drafter named by
the first argument (dflash or mtp). Prints one JSON object: which checkpoint names
`should_skip_weight` skips, with expert parallelism off and on.
"""

import json
import sys
from types import SimpleNamespace

import vllm.config

from vllm.model_executor.model_loader.ep_weight_filter import should_skip_weight

METHOD = sys.argv[1]
CONFIG = SimpleNamespace(
    speculative_config=SimpleNamespace(method=METHOD),
    model_config=SimpleNamespace(hf_config=SimpleNamespace(num_hidden_layers=45, num_nextn_predict_layers=1)),
)
vllm.config.get_current_vllm_config = lambda: CONFIG

NAMES = [
    "model.layers.45.mlp.experts.3.down_proj.weight",  # the MTP layer
    "model.layers.45.eh_proj.weight",
    "layers.45.enorm.weight",
    "model.layers.44.self_attn.q_b_proj.weight",  # the last main layer
    "model.layers.4.mlp.shared_experts.down_proj.weight",
    "model.layers.450.mlp.gate.weight",  # not layer 45
    "model.embed_tokens.weight",
]
try:
    report = {
        "without_ep": [n for n in NAMES if should_skip_weight(n, None)],
        "with_ep": [n for n in NAMES if should_skip_weight(n, {0, 1, 2})],
    }
except ValueError as error:
    report = {"refused": str(error)}
print(json.dumps(report))
