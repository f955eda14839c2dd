"""Every rank's `vllm serve` argv that DRY_RUN prints parses with vLLM 0.30.0's own parser.

The parser runs in one subprocess (vLLM's CpuPlatform set as the current one) so that
platform set-up does not leak into other tests; the parsed values must equal what each
knob intends: speculative config, capture sizes, KV bytes, context, eager, multi-node.
"""

import json
import sys
from importlib import metadata

import pytest

from tests.unit.test_launcher_support import (
    DRAFTER_PIN,
    MODEL_PIN,
    NODES,
    dry_run,
    serve_commands,
    vllm_argv,
)
from tests.vllm.conftest import run_python

MODEL = "LibertAIDAI/GLM-5.3-Flash-NVFP4"
PINNED = {"MODEL_REVISION": MODEL_PIN, "DRAFTER_REVISION": DRAFTER_PIN}
INCOAI_DIR = f"/root/.cache/huggingface/glm53-drafters/incoai-{DRAFTER_PIN}"
G_DIR = f"/root/.cache/huggingface/glm53-drafters/dflash2-g-{DRAFTER_PIN}"

# vLLM's CLI imports transformers, whose image utilities import torchvision; a CPU-only
# torch 2.13.0 beside PyPI's torchvision 0.28.0 fails there (seen when building the test
# venv), so those
# packages are hidden: the argument parser needs none of them.
PARSE_PROBE = r"""
import importlib.util, json, sys
_HIDDEN = ("torchvision", "torchaudio", "torchcodec")
_find_spec = importlib.util.find_spec
def _visible_find_spec(name, package=None):
    return None if name.split(".")[0] in _HIDDEN else _find_spec(name, package)
importlib.util.find_spec = _visible_find_spec
class _Hide:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] in _HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _Hide)

import vllm.platforms
from vllm.platforms.cpu import CpuPlatform
vllm.platforms._current_platform = CpuPlatform()
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser

from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args

FIELDS = ("model_tag", "revision", "host", "port", "tensor_parallel_size", "max_model_len",
          "max_num_seqs", "kv_cache_dtype", "kv_cache_memory_bytes", "block_size",
          "gpu_memory_utilization", "moe_backend", "linear_backend", "speculative_config",
          "enforce_eager", "nnodes", "node_rank", "master_addr", "master_port",
          "distributed_executor_backend", "headless", "served_model_name",
          "override_generation_config", "tool_call_parser", "enable_auto_tool_choice",
          "reasoning_parser", "default_chat_template_kwargs", "trust_remote_code",
          "mm_processor_cache_gb", "root_path")

def capture_sizes(config):
    if config is None:
        return None
    if isinstance(config, dict):
        return config.get("cudagraph_capture_sizes")
    return config.cudagraph_capture_sizes

results = []
for argv in json.load(sys.stdin):
    parser = FlexibleArgumentParser()
    ServeSubcommand().subparser_init(parser.add_subparsers())
    try:
        args = parser.parse_args(argv)
        validate_parsed_serve_args(args)
    except SystemExit as exit_:
        results.append({"error": exit_.code})
        continue
    except (TypeError, ValueError) as error:
        results.append({"error": str(error)})
        continue
    parsed = {field: getattr(args, field) for field in FIELDS}
    parsed["cudagraph_capture_sizes"] = capture_sizes(args.compilation_config)
    results.append(parsed)

def literal_values(literal):
    from typing import get_args
    values = []
    for arg in get_args(literal):
        values += literal_values(arg) if get_args(arg) else [arg]
    return values

from vllm.config.speculative import SpeculativeMethod
from vllm.reasoning import ReasoningParserManager
from vllm.tool_parsers import ToolParserManager
results.append({"methods": literal_values(SpeculativeMethod),
                "tool_parsers": ToolParserManager.list_registered(),
                "reasoning_parsers": ReasoningParserManager.list_registered()})
print(json.dumps(results, default=str))
"""

SCENARIOS = {
    "defaults": ({}, 2),
    "spec-mtp": ({"SPEC": "mtp"}, 2),
    "spec-off": ({"SPEC": "off"}, 2),
    "eager": ({"ENFORCE_EAGER": 1}, 2),
    "k5-4seqs": ({"NUM_SPECULATIVE_TOKENS": 5, "MAX_NUM_SEQS": 4}, 2),  # PROFILE=seed-pr's
    "3-nodes": ({}, 3),
    "4-nodes": ({}, 4),
    "dflash2-g": ({"DRAFTER": "dflash2-g"}, 2),
    "block-64-tp4": ({"BLOCK_SIZE": 64, "TP": 4}, 2),
    "chat-knobs": ({"THINKING": 1, "MAX_NEW_TOKENS": 4096, "SERVED_MODEL_NAME": "glm",
                    "GENERATION_CONFIG": '''{"temperature": 0.6, "note": "it's"}''',
                    "EXTRA_ARGS": """--root-path "/it's glm" """}, 2),
    "forced-backends": ({"MOE_BACKEND": "flashinfer_cutlass", "FORCE_UNSAFE_MOE": 1,
                         "LINEAR_BACKEND": "auto", "FORCE_UNSAFE_LINEAR": 1}, 2),
    # MOE_BACKEND=b12x (issue 48): 0.30.0's parser has the backend (the vendor fork's has not)
    "b12x": ({"MOE_BACKEND": "b12x"}, 2),
    "none-optional": ({"TOOL_CALL_PARSER": "none", "REASONING_PARSER": "none",
                       "SERVED_MODEL_NAME": "none", "MM_PROCESSOR_CACHE_GB": "none",
                       "MAX_NEW_TOKENS": "none", "BLOCK_SIZE": "none"}, 2),
}

BASE = {"model_tag": MODEL, "revision": MODEL_PIN, "max_model_len": 327680,
        "max_num_seqs": 2, "kv_cache_dtype": "fp8_e4m3", "kv_cache_memory_bytes": 4445787956,
        "block_size": 2304, "gpu_memory_utilization": 0.85, "moe_backend": "marlin",
        "linear_backend": "marlin", "enforce_eager": False,
        "cudagraph_capture_sizes": [1, 2, 4, 8, 16],
        "speculative_config": {"method": "dflash", "model": INCOAI_DIR, "num_speculative_tokens": 7},
        "served_model_name": ["glm-5.3-flash"], "override_generation_config": {"max_new_tokens": 65536},
        "tool_call_parser": "glm47", "enable_auto_tool_choice": True, "reasoning_parser": "glm45",
        "default_chat_template_kwargs": {"enable_thinking": False}, "trust_remote_code": True,
        "mm_processor_cache_gb": 1.0, "root_path": None}

CHANGES = {
    "defaults": {},
    "spec-mtp": {"speculative_config": {"method": "mtp", "num_speculative_tokens": 4},
                 "cudagraph_capture_sizes": [1, 2, 4, 5, 10]},
    "spec-off": {"speculative_config": None, "cudagraph_capture_sizes": [1, 2, 4]},
    "eager": {"enforce_eager": True, "cudagraph_capture_sizes": None},
    "k5-4seqs": {"max_num_seqs": 4, "cudagraph_capture_sizes": [1, 2, 4, 6, 12, 18, 24],
                 "speculative_config": {"method": "dflash", "model": INCOAI_DIR,
                                        "num_speculative_tokens": 5}},
    "3-nodes": {},
    "4-nodes": {},
    "dflash2-g": {"speculative_config": {"method": "dflash", "model": G_DIR,
                                         "num_speculative_tokens": 7}},
    "block-64-tp4": {"block_size": 64},
    "chat-knobs": {"served_model_name": ["glm"],
                   "default_chat_template_kwargs": {"enable_thinking": True},
                   "override_generation_config": {"max_new_tokens": 4096, "temperature": 0.6,
                                                  "note": "it's"},
                   "root_path": "/it's glm"},
    "forced-backends": {"moe_backend": "flashinfer_cutlass", "linear_backend": "auto"},
    "b12x": {"moe_backend": "b12x"},
    "none-optional": {"tool_call_parser": None, "enable_auto_tool_choice": False,
                      "reasoning_parser": "", "served_model_name": None,
                      "mm_processor_cache_gb": 4.0, "override_generation_config": {},
                      "block_size": None},
}


def intended(scenario, rank, nodes):
    expected = {**BASE, **CHANGES[scenario]}
    expected["tensor_parallel_size"] = 4 if scenario == "block-64-tp4" else nodes
    expected["port"] = 8000  # rank 0 sets it; the rest keep vLLM's default, also 8000
    expected["host"] = "0.0.0.0" if rank == 0 else None
    expected.update(nnodes=nodes, node_rank=rank, master_addr=NODES[0], master_port=29501,
                    distributed_executor_backend="mp", headless=rank > 0)
    return expected


@pytest.fixture(scope="module")
def parsed(tmp_path_factory):
    """scenario -> rank -> what vLLM 0.30.0's parser made of that rank's argv."""
    assert metadata.version("vllm") == "0.30.0"
    argvs, keys = [], []
    for scenario, (settings, nodes) in SCENARIOS.items():
        stdout = dry_run(tmp_path_factory.mktemp(scenario), nodes=nodes, **PINNED, **settings)
        for rank, (_, docker_argv) in sorted(serve_commands(stdout).items()):
            argvs.append(vllm_argv(docker_argv))
            keys.append((scenario, rank))
    # Controls: the parser does refuse an unknown flag and a backend it does not have.
    argvs.append(["serve", MODEL, "--no-such-flag"])
    argvs.append(["serve", MODEL, "--moe-backend", "no_such_backend"])
    result = run_python([sys.executable, "-c", PARSE_PROBE], input=json.dumps(argvs),
                        capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(result.stdout.splitlines()[-1])
    table = results.pop()
    assert results[-2:] == [{"error": 2}, {"error": 2}]
    for (scenario, rank), values in zip(keys, results[:-2]):
        table.setdefault(scenario, {})[rank] = values
    return table


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_each_rank_parses_to_the_intended_values(parsed, scenario):
    nodes = SCENARIOS[scenario][1]
    assert sorted(parsed[scenario]) == list(range(nodes))
    for rank, values in parsed[scenario].items():
        assert "error" not in values, f"rank {rank} refused by vllm's parser"
        assert values == intended(scenario, rank, nodes), f"rank {rank}"


def test_speculative_methods_are_ones_vllm_0_30_0_accepts(parsed):
    # DFlash2 keeps method "dflash" (chosen by the draft's architecture); the MTP head is "mtp".
    assert {"dflash", "mtp"} <= set(parsed["methods"])
    used = {values["speculative_config"]["method"] for scenario in SCENARIOS
            for values in parsed[scenario].values() if values["speculative_config"]}
    assert used == {"dflash", "mtp"}


def test_the_glm_parsers_are_registered_in_vllm_0_30_0(parsed):
    assert "glm47" in parsed["tool_parsers"]
    assert "glm45" in parsed["reasoning_parsers"]
