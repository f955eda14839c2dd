"""Every bad value of every knob is refused before anything runs: exit 2, nothing on stdout,
one stderr line naming the variable, its value and what is accepted (or why it is unsafe).

Each case runs twice: through run.sh, and in the launcher's Python core directly (settings,
checks and pins, as run.sh's DRY_RUN reaches them).
"""

import re
from pathlib import Path

import pytest

from launcher.plan import plan
from launcher.plan.load import load
from launcher.plan.settings import Refused
from recipekit import recipe
from tests.unit.test_launcher_support import REPO, launcher_env, run

INT = "accepted: an integer"
K_WHY = "DFlash2 drafts at most block size 8 - 1 tokens; accepted: an integer 1..7"
CTX_WHY = ("the 4445787956-byte KV pin holds about 400,497 fp8 tokens, so it cannot hold more "
           "than 327680 context; accepted: 1..327680, or set FORCE_UNSAFE_CTX=1")
KV_WHY = ("above the 4445787956-byte pin, 5.0 GiB slowed decode 20-30% and 5.14 GiB crashed "
          "(unified memory); accepted: 1..4445787956, or set FORCE_UNSAFE_KV=1")
STOCK_WHY = ("stock vllm/vllm-openai images lack the v9-v11 layers (DFlash2 backport, Glm5Next "
             "tap capture, draft KV group); accepted: glm53-sm121-v13 (scripts/build.sh), or set "
             "FORCE_STOCK_IMAGE=1")
ALL_GROUPS = "shared,mla,kda_o,kda_in,lm_head"
OLD_IMAGE_WHY = ("it would serve without them; accepted: glm53-sm121-v13, or turn them off "
                 "(README's rollback line)")
WORDS_WHY = "No closing quotation; accepted: shell words (quote a word that holds spaces or JSON)"
TP_WHY = ("accepted: a multiple of the node count 2 (each node runs TP / nodes ranks), or empty "
          "for the node count")
PATH_WHY = "accepted: an absolute path (~/ allowed) without commas"
HEX_PIN = "accepted: a 40-hex commit hash, or empty"
MOE_ACCEPTED = "accepted: marlin | b12x, or set FORCE_UNSAFE_MOE=1"
MOE_WHY = ("on GB10 it ran out of memory in its JIT after the 90.67 GiB of weights (the seed's "
           f"run); {MOE_ACCEPTED}")
MOE_AUTO_WHY = ("vLLM's own order (model_executor/layers/fused_moe/oracle/nvfp4.py) tries "
                "FlashInfer's and CUTLASS's kernels before Marlin, and flashinfer_cutlass ran out "
                "of memory in its JIT after the 90.67 GiB of weights (the seed's run); "
                f"{MOE_ACCEPTED}")
MOE_OTHER_WHY = ("not run on GB10 by the seed or by this recipe; judge it on your Spark with "
                 "scripts/compare --reference '' --candidate 'MOE_BACKEND=cutlass "
                 f"FORCE_UNSAFE_MOE=1'; {MOE_ACCEPTED}")
LINEAR_WHY = ("auto picked a FlashInfer FP4 GEMM that JIT-compiles on sm_121 and six boots "
              "collapsed (the seed, September); accepted: marlin, or set FORCE_UNSAFE_LINEAR=1")
BLOCK_WHY = ("vLLM takes any block size above 0; 2304 tiles the 64-entry pool pages DeepGEMM's "
             "sm_12x fp8 paged MQA accepts; accepted: an integer 1..1048576")
FRACTION_WHY = "accepted: a fraction above 0 and at most 1, up to 4 decimals (the seed ran 0.85)"
PARSER_WHY = "accepted: a vLLM parser name such as glm47 or glm45, or empty to leave it out"
ENV_PREFIXES = "VLLM_ NCCL_ GLOO_ UCX_ TORCH_ TORCHINDUCTOR_ PYTORCH_ CUDA_ NVIDIA_ FLASHINFER_ TRITON_ TILELANG_ DG_ CUTE_DSL_ OMP_"
FLOOR_WHY = "GiB of MemAvailable below which the guard stops every rank (0: no floor); accepted: an integer 0..1024"

REFUSALS = [
    ({"PROFILE": "fast"}, "PROFILE=fast: accepted: default | seed-pr | mtp | eager | field-fastest"),
    ({"SPEC": "dflash"}, "SPEC=dflash: accepted: dflash2 | mtp | off"),
    ({"SPEC": "MTP"}, "SPEC=MTP: accepted: dflash2 | mtp | off"),
    ({"DRAFTER": "incoai-v2"}, "DRAFTER=incoai-v2: accepted: dflash2-g | incoai | an absolute path"),
    ({"DRAFTER": "/data/a,b"},
     "DRAFTER=/data/a,b: accepted: a catalog key (incoai, dflash2-g) or an absolute path without commas"),
    ({"DRAFTER_REVISION": "main"},
     f"DRAFTER_REVISION=main: {HEX_PIN} for the catalog's or the recorded pin"),
    ({"DRAFTER_REVISION": "ABCDEF0123456789abcdef0123456789abcdef01"},
     f"DRAFTER_REVISION=ABCDEF0123456789abcdef0123456789abcdef01: {HEX_PIN} for the catalog's or the recorded pin"),
    ({"DRAFTER_WINDOW": "64"},
     f"DRAFTER_WINDOW=64: the fixed window full-attention drafter layers are served at; {INT} 128..32768"),
    ({"NUM_SPECULATIVE_TOKENS": "8"}, f"NUM_SPECULATIVE_TOKENS=8: {K_WHY}"),
    ({"NUM_SPECULATIVE_TOKENS": "0"}, f"NUM_SPECULATIVE_TOKENS=0: {K_WHY}"),
    ({"NUM_SPECULATIVE_TOKENS": "five"}, f"NUM_SPECULATIVE_TOKENS=five: {K_WHY}"),
    ({"NUM_SPECULATIVE_TOKENS": "05"}, f"NUM_SPECULATIVE_TOKENS=05: {K_WHY}"),
    ({"NUM_SPECULATIVE_TOKENS": "-1"}, f"NUM_SPECULATIVE_TOKENS=-1: {K_WHY}"),
    ({"MTP_NUM_SPECULATIVE_TOKENS": "9", "SPEC": "mtp"}, f"MTP_NUM_SPECULATIVE_TOKENS=9: {INT} 1..7"),
    ({"MAX_NUM_SEQS": "0"}, f"MAX_NUM_SEQS=0: {INT} 1..64"),
    ({"MAX_NUM_SEQS": "65"}, f"MAX_NUM_SEQS=65: {INT} 1..64"),
    ({"MAX_MODEL_LEN": "327681"}, f"MAX_MODEL_LEN=327681: {CTX_WHY}"),
    ({"MAX_MODEL_LEN": "1M"}, f"MAX_MODEL_LEN=1M: {INT} 1..999999999"),
    ({"FORCE_UNSAFE_CTX": "yes"}, "FORCE_UNSAFE_CTX=yes: accepted: 0 | 1"),
    ({"ENFORCE_EAGER": "true"}, "ENFORCE_EAGER=true: accepted: 0 | 1"),
    ({"KV_CACHE_MEMORY_BYTES": "5368709120"}, f"KV_CACHE_MEMORY_BYTES=5368709120: {KV_WHY}"),
    ({"KV_CACHE_MEMORY_BYTES": "4.14GiB"}, f"KV_CACHE_MEMORY_BYTES=4.14GiB: {INT} 1..999999999999"),
    ({"FORCE_UNSAFE_KV": "2"}, "FORCE_UNSAFE_KV=2: accepted: 0 | 1"),
    ({"KV_CACHE_DTYPE": "auto"},
     ("KV_CACHE_DTYPE=auto: the KV pin and the context bound hold for 1-byte fp8 KV only; "
      "accepted: fp8_e4m3 | fp8 | fp8_e5m2")),
    ({"BLOCK_SIZE": "0"}, f"BLOCK_SIZE=0: {BLOCK_WHY}"),
    ({"BLOCK_SIZE": "2k"}, f"BLOCK_SIZE=2k: {BLOCK_WHY}"),
    ({"GPU_MEMORY_UTILIZATION": "1.5"}, f"GPU_MEMORY_UTILIZATION=1.5: {FRACTION_WHY}"),
    ({"GPU_MEMORY_UTILIZATION": "0.0"}, f"GPU_MEMORY_UTILIZATION=0.0: {FRACTION_WHY}"),
    ({"GPU_MEMORY_UTILIZATION": "85%"}, f"GPU_MEMORY_UTILIZATION=85%: {FRACTION_WHY}"),
    # each backend its own reason (issue 48): b12x is accepted here and judged by the image
    ({"MOE_BACKEND": "flashinfer_cutlass"}, f"MOE_BACKEND=flashinfer_cutlass: {MOE_WHY}"),
    ({"MOE_BACKEND": "auto"}, f"MOE_BACKEND=auto: {MOE_AUTO_WHY}"),
    ({"MOE_BACKEND": "cutlass"}, f"MOE_BACKEND=cutlass: {MOE_OTHER_WHY}"),
    ({"MOE_BACKEND": "flashinfer_b12x"},
     "MOE_BACKEND=flashinfer_b12x: vLLM 0.30.0 leaves it out of its own choice until the "
     "upstream CUTLASS SM121 MMA op guard is resolved (model_executor/layers/fused_moe/oracle/"
     f"nvfp4.py); b12x is the B12X kernels' own backend; {MOE_ACCEPTED}"),
    ({"MOE_BACKEND": "Marlin!", "FORCE_UNSAFE_MOE": "1"},
     "MOE_BACKEND=Marlin!: accepted: a vLLM backend name such as marlin or b12x"),
    ({"DRAFT_TP": "1"},
     "DRAFT_TP=1: vLLM's DFlash and DFlash2 loader (v1/worker/gpu/spec_decode/dflash/utils.py, "
     "load_dflash_model, in 0.30.0, 0.33.0, 0.34.0 and the vendor fork) builds the drafter with "
     "the target's parallel config and never reads draft_tensor_parallel_size, so the drafter "
     "would still be split across the nodes; accepted: target"),
    ({"DRAFT_TP": "2"}, "DRAFT_TP=2: accepted: target | 1"),
    ({"COMPACT_MEMORY": "yes"}, "COMPACT_MEMORY=yes: accepted: 0 | 1"),
    ({"GPU_CLOCK_MHZ": "2150MHz"},
     "GPU_CLOCK_MHZ=2150MHz: accepted: MHz as N (locked at N) or MIN,MAX (a cap: 0,2150), or "
     "empty"),
    ({"GPU_CLOCK_MHZ": "0"},
     "GPU_CLOCK_MHZ=0: accepted: MHz as N (locked at N) or MIN,MAX (a cap: 0,2150), or empty"),
    ({"GPU_CLOCK_MHZ": "2200,2100"},
     "GPU_CLOCK_MHZ=2200,2100: the lowest clock 2200 MHz is above the highest 2100; accepted: "
     "N, or MIN,MAX with MIN at most MAX"),
    ({"FORCE_UNSAFE_MOE": "yes"}, "FORCE_UNSAFE_MOE=yes: accepted: 0 | 1"),
    ({"LINEAR_BACKEND": "auto"}, f"LINEAR_BACKEND=auto: {LINEAR_WHY}"),
    ({"LINEAR_BACKEND": "flashinfer_cutlass"}, f"LINEAR_BACKEND=flashinfer_cutlass: {LINEAR_WHY}"),
    ({"FORCE_UNSAFE_LINEAR": "2"}, "FORCE_UNSAFE_LINEAR=2: accepted: 0 | 1"),
    # weight-only quantization (v13)
    ({"TARGET_WEIGHT_GROUPS_INT8": "shared,moe"},
     "TARGET_WEIGHT_GROUPS_INT8=shared,moe: accepted: a comma list of shared, mla, kda_o, "
     "kda_in, lm_head, or none"),
    ({"TARGET_WEIGHT_GROUPS_INT8": "mla,"},
     "TARGET_WEIGHT_GROUPS_INT8=mla,: accepted: a comma list of shared, mla, kda_o, kda_in, "
     "lm_head, or none"),
    ({"INT_GROUP_SIZE": "32"}, "INT_GROUP_SIZE=32: accepted: 64 | 128"),
    ({"TARGET_WEIGHT_FORMAT": "nvfp4"},
     "TARGET_WEIGHT_FORMAT=nvfp4: NVFP4 on target groups failed the seed's v13 quality gate on "
     "KL; judge it with scripts/compare --candidate TARGET_WEIGHT_FORMAT=nvfp4 on your Spark; "
     "accepted: int8, or set FORCE_UNSAFE_WEIGHTS=1"),
    ({"TARGET_WEIGHT_FORMAT": "fp8"},
     "TARGET_WEIGHT_FORMAT=fp8: accepted: int8 or nvfp4 (FP8 on target groups failed the "
     "seed's quality gate on KL and is not offered)"),
    ({"FORCE_UNSAFE_WEIGHTS": "yes"}, "FORCE_UNSAFE_WEIGHTS=yes: accepted: 0 | 1"),
    ({"DRAFT_WEIGHTS": "fp8"}, "DRAFT_WEIGHTS=fp8: accepted: bf16 | nvfp4"),
    ({"MM_PROCESSOR_CACHE_GB": "4GiB"},
     ("MM_PROCESSOR_CACHE_GB=4GiB: accepted: GiB as a decimal number such as 1 or 0.5, or empty "
      "for vLLM's default (4, too much on unified memory)")),
    ({"MAX_NEW_TOKENS": "0"},
     f"MAX_NEW_TOKENS=0: the server-wide ceiling on output tokens per request; {INT} 1..999999999"),
    ({"GENERATION_CONFIG": "temperature=0.6"},
     ("GENERATION_CONFIG=temperature=0.6: not JSON (Expecting value: line 1 column 1 (char 0)); "
      'accepted: a JSON object such as {"temperature": 0.6}, or empty')),
    ({"GENERATION_CONFIG": "[0.6]"},
     'GENERATION_CONFIG=[0.6]: accepted: a JSON object such as {"temperature": 0.6}, or empty'),
    ({"GENERATION_CONFIG": '{"max_new_tokens": 10}'},
     ('GENERATION_CONFIG={"max_new_tokens": 10}: max_new_tokens is set from MAX_NEW_TOKENS; set '
      "that instead and leave it out here")),
    ({"SERVED_MODEL_NAME": "glm 5.3"},
     ("SERVED_MODEL_NAME=glm 5.3: accepted: letters, digits and . _ : / - (no spaces), or empty "
      "to serve under MODEL")),
    ({"TOOL_CALL_PARSER": "GLM-47"}, f"TOOL_CALL_PARSER=GLM-47: {PARSER_WHY}"),
    ({"REASONING_PARSER": "glm 45"}, f"REASONING_PARSER=glm 45: {PARSER_WHY}"),
    ({"THINKING": "off"}, "THINKING=off: accepted: 0 | 1"),
    ({"NCCL_DEBUG_LEVEL": "debug"}, "NCCL_DEBUG_LEVEL=debug: accepted: VERSION | WARN | INFO | TRACE"),
    ({"CUDA_ARCH_LIST": "sm_121"},
     "CUDA_ARCH_LIST=sm_121: accepted: a TORCH_CUDA_ARCH_LIST value such as 12.1a (GB10 is sm_121)"),
    ({"ENGINE_READY_TIMEOUT": "30"},
     ("ENGINE_READY_TIMEOUT=30: seconds vLLM waits for its engine; a GB10 boot takes 15-21 "
      f"minutes; {INT} 60..86400")),
    ({"EXTRA_ENV": "VLLM_LOGGING_LEVEL=DEBUG lower_case=1"},
     ("EXTRA_ENV=lower_case=1: not NAME=VALUE with an environment variable name; accepted: "
      "NAME=VALUE words, NAME in capitals")),
    ({"EXTRA_ENV": "VLLM_DEBUG"},
     ("EXTRA_ENV=VLLM_DEBUG: not NAME=VALUE with an environment variable name; accepted: "
      "NAME=VALUE words, NAME in capitals")),
    ({"EXTRA_ENV": "VLLM_API_KEY=sk-abc123"},
     ("EXTRA_ENV=VLLM_API_KEY=<hidden>: VLLM_API_KEY looks like a credential (holds TOKEN, KEY, "
      "SECRET or PASSWORD) and would show in docker inspect; accepted: engine settings only (the "
      "API key goes in API_KEY_FILE, the Hub token in HF_TOKEN_FILE)")),
    ({"EXTRA_ENV": "HF_TOKEN=hf_abc"},
     ("EXTRA_ENV=HF_TOKEN=<hidden>: HF_TOKEN looks like a credential (holds TOKEN, KEY, SECRET or "
      "PASSWORD) and would show in docker inspect; accepted: engine settings only (the API key "
      "goes in API_KEY_FILE, the Hub token in HF_TOKEN_FILE)")),
    ({"EXTRA_ENV": "NCCL_IB_HCA=mlx5_9"},
     "EXTRA_ENV=NCCL_IB_HCA=mlx5_9: the launcher sets NCCL_IB_HCA: set from HCA; set that instead"),
    ({"EXTRA_ENV": "VLLM_HOST_IP=10.0.0.1"},
     "EXTRA_ENV=VLLM_HOST_IP=10.0.0.1: the launcher sets VLLM_HOST_IP: set from NODES; set that instead"),
    ({"EXTRA_ENV": "NCCL_NET=Socket"},
     ("EXTRA_ENV=NCCL_NET=Socket: the launcher sets NCCL_NET: a fixed part of the seed's verified "
      "run (recipe.toml, [fixed])")),
    ({"EXTRA_ENV": "LD_PRELOAD=/tmp/x.so"},
     f"EXTRA_ENV=LD_PRELOAD=/tmp/x.so: LD_PRELOAD is not an engine variable; accepted: names starting with {ENV_PREFIXES}"),
    ({"EXTRA_ENV": "VLLM_X='unclosed"}, f"EXTRA_ENV=VLLM_X='unclosed: {WORDS_WHY}"),
    ({"JIT_CACHE": "jit"}, f"JIT_CACHE=jit: {PATH_WHY}"),
    ({"API_AUTH": "off"}, "API_AUTH=off: who may use the API; accepted: key | none"),
    ({"API_KEY_FILE": "api\nkey"}, "API_KEY_FILE=api\\nkey: accepted: a path without control characters"),
    ({"RUNS_DIR": "runs\tnow"}, "RUNS_DIR=runs\tnow: accepted: a directory (relative to the repository, or absolute)"),
    ({"MEM_GUARD": "on"}, "MEM_GUARD=on: accepted: 0 | 1"),
    ({"SELF_CHECK": "yes"}, "SELF_CHECK=yes: accepted: 0 | 1"),
    ({"MEM_SAMPLES_PER_SECOND": "50"}, f"MEM_SAMPLES_PER_SECOND=50: {INT} 1..20"),
    ({"MEM_FLOOR_LOAD_GIB": "10.5"}, f"MEM_FLOOR_LOAD_GIB=10.5: {FLOOR_WHY}"),
    ({"MEM_FLOOR_PROFILE_GIB": "-1"}, f"MEM_FLOOR_PROFILE_GIB=-1: {FLOOR_WHY}"),
    ({"MEM_FLOOR_KV_READY_GIB": "2000"}, f"MEM_FLOOR_KV_READY_GIB=2000: {FLOOR_WHY}"),
    ({"MEM_FLOOR_SERVING_GIB": "x"}, f"MEM_FLOOR_SERVING_GIB=x: {FLOOR_WHY}"),
    ({"NODES": "head-node 192.0.2.2"},
     ("NODES=head-node 192.0.2.2: 'head-node' is a name; with two or more nodes each entry is "
      "that node's address on the link (it becomes VLLM_HOST_IP and --master-addr); accepted: "
      "IPv4 or IPv6 addresses")),
    ({"NODES": "192.0.2.1 192.0.2.256"},
     ("NODES=192.0.2.1 192.0.2.256: '192.0.2.256' is a name; with two or more nodes each entry is "
      "that node's address on the link (it becomes VLLM_HOST_IP and --master-addr); accepted: "
      "IPv4 or IPv6 addresses")),
    ({"IMAGE": "vllm/vllm-openai:glm53-flash-arm64-cu130"},
     f"IMAGE=vllm/vllm-openai:glm53-flash-arm64-cu130: {STOCK_WHY}"),
    ({"IMAGE": "docker.io/vllm/vllm-openai:latest"},
     f"IMAGE=docker.io/vllm/vllm-openai:latest: {STOCK_WHY}"),
    ({"IMAGE": "Bad Image"}, "IMAGE=Bad Image: accepted: a Docker image reference"),
    # The defaults' levers on an older chain image would be set and silently ignored.
    ({"IMAGE": "glm53-sm121-v11"},
     ("IMAGE=glm53-sm121-v11: image v11 predates layer v13, which reads KPOOL_TAIL_FIX=1 "
      f"TARGET_WEIGHT_GROUPS_INT8={ALL_GROUPS} DRAFT_WEIGHTS=nvfp4: {OLD_IMAGE_WHY}")),
    ({"IMAGE": "registry.example:5000/lab/glm53-sm121-v10:rc1", "KPOOL_TAIL_FIX": "0",
      "TARGET_WEIGHT_GROUPS_INT8": "none", "DRAFT_WEIGHTS": "bf16", "ADAPTIVE_VERIFY": "1"},
     ("IMAGE=registry.example:5000/lab/glm53-sm121-v10:rc1: image v10 predates layer v13, "
      f"which reads ADAPTIVE_VERIFY=1: {OLD_IMAGE_WHY}")),
    ({"BASE_IMAGE": "base;rm"}, "BASE_IMAGE=base;rm: accepted: a Docker image reference"),
    ({"BASE_LOCK": "tofu"}, "BASE_LOCK=tofu: accepted: first-use | strict"),
    ({"FORCE_STOCK_IMAGE": "y"}, "FORCE_STOCK_IMAGE=y: accepted: 0 | 1"),
    ({"KPOOL_TAIL_FIX": "yes"}, "KPOOL_TAIL_FIX=yes: accepted: 0 | 1"),
    ({"KPOOL_TAIL_FIX": "1", "NUM_SPECULATIVE_TOKENS": "7", "BLOCK_SIZE": "2312"},
     ("BLOCK_SIZE=2312: KPOOL_TAIL_FIX=1 needs the tail ring (16 slots at NUM_SPECULATIVE_TOKENS=7) "
      "to divide the block size; accepted: a multiple of 16, or set KPOOL_TAIL_FIX=0")),
    ({"KPOOL_TAIL_FIX": "1", "SPEC": "mtp", "BLOCK_SIZE": "2308"},
     ("BLOCK_SIZE=2308: KPOOL_TAIL_FIX=1 needs the tail ring (8 slots at MTP_NUM_SPECULATIVE_TOKENS=4) "
      "to divide the block size; accepted: a multiple of 8, or set KPOOL_TAIL_FIX=0")),
    ({"ROUTER_FP32": "2"}, "ROUTER_FP32=2: accepted: 0 | 1"),
    ({"INDEXER_WS_FACTOR": "40"}, "INDEXER_WS_FACTOR=40: accepted: 0 | 1"),
    ({"MODEL": "GLM-5.3-Flash"},
     "MODEL=GLM-5.3-Flash: accepted: a Hugging Face repo id (org/name) or an absolute directory"),
    ({"MODEL_REVISION": "v1.0"}, f"MODEL_REVISION=v1.0: {HEX_PIN} to resolve once and pin"),
    ({"MODEL": "/models/glm", "MODEL_REVISION": "0" * 40},
     f"MODEL_REVISION={'0' * 40}: a local MODEL directory has no revision; accepted: empty"),
    ({"CHECKPOINT_SCAN": "yes"}, "CHECKPOINT_SCAN=yes: accepted: refuse | warn | off"),
    ({"MODEL": "nvidia/GLM-5.3-Flash-NVFP4", "SPEC": "mtp"},
     "SPEC=mtp: nvidia/GLM-5.3-Flash-NVFP4: its layer-45 MTP weights are BF16 and outside the "
     "quantization ignore list, so MTP cannot load on sm_121; accepted: dflash2 | off, or "
     "another MODEL"),
    ({"NODES": None},
     ("NODES is unset: set the node addresses, head first (e.g. NODES=\"<head> <worker>\" in "
      "cluster.env; see cluster.env.example)")),
    ({"NODES": "192.0.2.1 192.0.2.1"},
     "NODES=192.0.2.1 192.0.2.1: '192.0.2.1' is listed twice; accepted: distinct addresses"),
    ({"NODES": "192.0.2.1 user@192.0.2.2"},
     ("NODES=192.0.2.1 user@192.0.2.2: 'user@192.0.2.2' is not a host name or address; "
      "accepted: addresses separated by spaces or commas, head first")),
    ({"NODES": "-oProxyCommand=x 192.0.2.2"},
     ("NODES=-oProxyCommand=x 192.0.2.2: '-oProxyCommand=x' is not a host name or address; "
      "accepted: addresses separated by spaces or commas, head first")),
    ({"TP": "3"}, f"TP=3: {TP_WHY}"),
    ({"TP": "0"}, f"TP=0: {TP_WHY}"),
    ({"PORT": "80"}, f"PORT=80: {INT} 1024..65535"),
    ({"MASTER_PORT": "70000"}, f"MASTER_PORT=70000: {INT} 1024..65535"),
    ({"PORT": "29501"}, "MASTER_PORT=29501: equals PORT; accepted: a different port"),
    ({"IFACE": None},
     ("IFACE is unset: NCCL and Gloo need the node-to-node network interface, the same name on "
      "every node (see `ip -br addr`; set IFACE in cluster.env)")),
    ({"IFACE": "a-very-long-interface-name"},
     "IFACE=a-very-long-interface-name: accepted: a network interface name"),
    ({"HCA": None},
     ("HCA is unset: NCCL needs the RDMA device of the node-to-node link (see `ibdev2netdev` or "
      "/sys/class/infiniband; set HCA in cluster.env)")),
    ({"HCA": "dev 0"}, "HCA=dev 0: accepted: an NCCL_IB_HCA list such as <device>[,<device>]"),
    ({"HF_CACHE": "cache"}, f"HF_CACHE=cache: {PATH_WHY}"),
    ({"HF_CACHE": "/a,b"}, f"HF_CACHE=/a,b: {PATH_WHY}"),
    ({"HF_TOKEN_FILE": "token"}, f"HF_TOKEN_FILE=token: {PATH_WHY}"),
    ({"EXTRA_ARGS": "--served-model-name 'glm"}, f"EXTRA_ARGS=--served-model-name 'glm: {WORDS_WHY}"),
    ({"EXTRA_ARGS": "--kv-cache-memory 5000000000"},
     ("EXTRA_ARGS=--kv-cache-memory 5000000000: --kv-cache-memory would override "
      "--kv-cache-memory-bytes, which the launcher sets: set from KV_CACHE_MEMORY_BYTES; set that instead")),
    ({"EXTRA_ARGS": "--max-model-len=1000000"},
     ("EXTRA_ARGS=--max-model-len=1000000: --max-model-len would override --max-model-len, which "
      "the launcher sets: set from MAX_MODEL_LEN; set that instead")),
    ({"EXTRA_ARGS": """--override-generation-config '{"temperature": 0.6}'"""},
     ("""EXTRA_ARGS=--override-generation-config '{"temperature": 0.6}': --override-generation-config """
      "would override --override-generation-config, which the launcher sets: set from "
      "MAX_NEW_TOKENS and GENERATION_CONFIG; set that instead")),
    ({"EXTRA_ARGS": "--no-trust-remote-code"},
     ("EXTRA_ARGS=--no-trust-remote-code: --no-trust-remote-code would override "
      "--trust-remote-code, which the launcher sets: a fixed part of the seed's verified run "
      "(recipe.toml, [fixed])")),
    ({"EXTRA_ARGS": "--api-key sk-abc123"},
     ("EXTRA_ARGS=--api-key '<hidden>': --api-key would put a credential on every rank's command "
      "line (ps, docker inspect) and in DRY_RUN's output; accepted: the API key in API_KEY_FILE, "
      "which the launcher hands over without a command line")),
    ({"EXTRA_ARGS": "--seed 7 --hf-tok=hf_abc"},
     ("EXTRA_ARGS=--seed 7 '--hf-tok=<hidden>': --hf-tok (vLLM reads it as --hf-token) would put "
      "a credential on every rank's command line (ps, docker inspect) and in DRY_RUN's output; "
      "accepted: the Hub token in HF_TOKEN_FILE, which the launcher hands over without a command "
      "line")),
    ({"DOCKER_ARGS": "--gpus all -e HF_TOKEN=hf_abc"},
     ("DOCKER_ARGS=--env HF_TOKEN=<hidden>: HF_TOKEN looks like a credential (holds TOKEN, KEY, "
      "SECRET or PASSWORD) and would show on the docker command line and in docker inspect; "
      "accepted: the API key in API_KEY_FILE, the Hub token in HF_TOKEN_FILE")),
    ({"DOCKER_ARGS": "--env=VLLM_API_KEY=sk-abc123"},
     ("DOCKER_ARGS=--env VLLM_API_KEY=<hidden>: VLLM_API_KEY looks like a credential (holds TOKEN, "
      "KEY, SECRET or PASSWORD) and would show on the docker command line and in docker inspect; "
      "accepted: the API key in API_KEY_FILE, the Hub token in HF_TOKEN_FILE")),
    ({"SSH": "ssh -o 'BatchMode=yes"}, f"SSH=ssh -o 'BatchMode=yes: {WORDS_WHY}"),
    ({"SSH": "''"}, "SSH='': accepted: a remote-exec command such as ssh -o BatchMode=yes"),
    ({"DOCKER_ARGS": '--gpus "all'}, f'DOCKER_ARGS=--gpus "all: {WORDS_WHY}'),
    ({"READY_TIMEOUT": "0"}, f"READY_TIMEOUT=0: {INT} 1..86400"),
    ({"POLL_SECONDS": "0"}, f"POLL_SECONDS=0: {INT} 1..60"),
    ({"DRY_RUN": "yes"}, "DRY_RUN=yes: accepted: 0 | 1"),
    ({"READY_CHECK": "v1"}, "READY_CHECK=v1: accepted: health | models"),
    ({"CUDAGRAPH_MEMORY_ESTIMATE": "off"}, "CUDAGRAPH_MEMORY_ESTIMATE=off: accepted: 0 | 1"),
    ({"MEM_PREFLIGHT": "2"}, "MEM_PREFLIGHT=2: accepted: 0 | 1"),
    ({"MEM_BOOT_FLOOR_GIB": "-1"}, "MEM_BOOT_FLOOR_GIB=-1: GiB of MemAvailable a node must have "
     "before its rank starts (0: no floor); accepted: an integer 0..1024"),
    ({"FORCE_UNSAFE_BOOT_MEMORY": "yes"}, "FORCE_UNSAFE_BOOT_MEMORY=yes: accepted: 0 | 1"),
    ({"SKIP_MTP_WEIGHTS": "1", "SPEC": "mtp"}, "SKIP_MTP_WEIGHTS=1: SPEC=mtp drafts with the MTP "
     "layer whose weights this skips; set SKIP_MTP_WEIGHTS=0"),
    ({"ADAPTIVE_VERIFY": "2"}, "ADAPTIVE_VERIFY=2: accepted: 0 | 1"),
    ({"ADAPTIVE_VERIFY": "1", "SPEC": "mtp"}, "ADAPTIVE_VERIFY=1: adaptive verify needs a drafter "
     "that reports confidence (DFlash2's selector); SPEC=mtp has none: set ADAPTIVE_VERIFY=0"),
    ({"ADAPTIVE_VERIFY_TAU": "1.5"}, "ADAPTIVE_VERIFY_TAU=1.5: accepted: a decimal number from 0 "
     "to 1 (0.3, 1.0)"),
    ({"ADAPTIVE_VERIFY_MAX": "8"}, "ADAPTIVE_VERIFY_MAX=8: drafts verified a step, at most the "
     "speculative tokens; accepted: an integer 0..7"),
    ({"ADAPTIVE_VERIFY_MAX": "5", "NUM_SPECULATIVE_TOKENS": "3"}, "ADAPTIVE_VERIFY_MAX=5: a step "
     "cannot verify more drafts than it drafts; accepted: 0 to NUM_SPECULATIVE_TOKENS (3), or "
     "empty for all"),
]


IDS = [next(iter(settings)) + "=" + str(next(iter(settings.values()))) for settings, _ in REFUSALS]


@pytest.mark.parametrize("settings, message", REFUSALS, ids=IDS)
def test_bad_value_is_refused_in_one_line(tmp_path, settings, message):
    result = run(tmp_path, **settings)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == f"refused: {message}\n"


def core_refusal(tmp_path, **settings):
    """The refusal the Python core raises for SETTINGS (None when it accepts them)."""
    try:
        checked = load(launcher_env(tmp_path, **settings))
        plan.build(checked, plan.nodes_of(checked), REPO)
    except Refused as refused:
        return refused.line
    return None


@pytest.mark.parametrize("settings, message", REFUSALS, ids=IDS)
def test_the_python_core_refuses_the_same_way(tmp_path, settings, message):
    assert core_refusal(tmp_path, **settings) == f"refused: {message}"


def test_the_core_accepts_the_defaults(tmp_path):
    # The refusals above are not the core refusing everything.
    assert core_refusal(tmp_path) is None


def test_every_knob_has_a_refusal_case():
    free_text = {"EXTRA_ARGS"}  # any shell words are fine; bad quoting is its refusal
    refused = {name for settings, _ in REFUSALS for name in settings}
    assert set(recipe.load().knobs) - refused - free_text <= {"PINS_FILE"}


def test_forcing_lifts_the_context_and_kv_bounds(tmp_path):
    result = run(tmp_path, MAX_MODEL_LEN=400000, FORCE_UNSAFE_CTX=1,
                 KV_CACHE_MEMORY_BYTES=5368709120, FORCE_UNSAFE_KV=1)
    assert result.returncode == 0, result.stderr
    assert "--max-model-len 400000" in result.stdout
    assert "--kv-cache-memory-bytes 5368709120" in result.stdout


def test_forcing_lifts_the_backend_rule(tmp_path):
    result = run(tmp_path, MOE_BACKEND="flashinfer_cutlass", FORCE_UNSAFE_MOE=1,
                 LINEAR_BACKEND="flashinfer_cutlass", FORCE_UNSAFE_LINEAR=1)
    assert result.returncode == 0, result.stderr
    assert "--moe-backend flashinfer_cutlass --linear-backend flashinfer_cutlass" in result.stdout


def test_an_older_chain_image_is_accepted_with_its_levers_off(tmp_path):
    """README's rollback line and the PR-era profile serve v11; adaptive verify left empty
    resolves to off there, and a FORCE_ knob or a BF16 drafter asks nothing of v13."""
    rollback = {"IMAGE": "glm53-sm121-v11", "DRAFT_WEIGHTS": "bf16",
                "TARGET_WEIGHT_GROUPS_INT8": "none", "KPOOL_TAIL_FIX": "0", "ADAPTIVE_VERIFY": "0"}
    assert core_refusal(tmp_path, **rollback) is None
    assert core_refusal(tmp_path, PROFILE="seed-pr") is None
    unset = {**rollback, "ADAPTIVE_VERIFY": "", "FORCE_UNSAFE_WEIGHTS": "1"}
    checked = load(launcher_env(tmp_path, **unset))
    assert checked["ADAPTIVE_VERIFY"] == "0"
    result = run(tmp_path, **unset)
    assert result.returncode == 0, result.stderr
    # Each rank gets only the as-loaded drafter and the force, which v11 ignores harmlessly.
    assert set(re.findall(r"GLM53_\w+=\S+", result.stdout)) == {
        "GLM53_DRAFT_WEIGHTS=bf16", "GLM53_FORCE_UNSAFE_WEIGHTS=1"}
    # The same unset ADAPTIVE_VERIFY on image v13 (or an image named otherwise) is on.
    for image in ("glm53-sm121-v13", "lab/my-serving-image:1"):
        assert load(launcher_env(tmp_path, **{**unset, "IMAGE": image}))["ADAPTIVE_VERIFY"] == "1"


def test_forcing_a_stock_image_is_allowed(tmp_path):
    result = run(tmp_path, IMAGE="vllm/vllm-openai:latest", FORCE_STOCK_IMAGE=1)
    assert result.returncode == 0, result.stderr


def test_cluster_env_with_an_unknown_name_is_refused(tmp_path):
    cluster = tmp_path / "cluster.env"
    cluster.write_text("NODE=192.0.2.1\n")
    result = run(tmp_path, CLUSTER_ENV=cluster)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"refused: NODE=192.0.2.1: in {cluster}, not a launcher setting; accepted: the names "
        "in recipe.toml\n")


def test_cluster_env_line_that_is_not_a_setting_is_refused(tmp_path):
    cluster = tmp_path / "cluster.env"
    cluster.write_text("export NODES=192.0.2.1\n")
    result = run(tmp_path, CLUSTER_ENV=cluster)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"refused: {cluster} line 1: export NODES=192.0.2.1: accepted: NAME=VALUE lines and # comments\n")


def test_a_corrupt_pins_file_is_refused(tmp_path):
    (tmp_path / "pins.env").write_text("someone/other-checkpoint main\n")
    result = run(tmp_path, MODEL="someone/other-checkpoint")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"refused: PINS_FILE={tmp_path / 'pins.env'}: line 1 reads 'someone/other-checkpoint "
        "main'; accepted: lines '<repo id> <40-hex commit>'\n")


def test_the_launchers_ring_is_the_images(monkeypatch):
    """launcher/plan/checks.py's ring formula equals the one image v13 runs (patches/v13)."""
    import importlib.util
    import sys
    import types

    from launcher.plan.checks import kpool_ring

    torch = types.ModuleType("torch")  # the unit tier has no torch; only annotations name it
    torch.Tensor, torch.dtype = object, object
    monkeypatch.setitem(sys.modules, "torch", torch)
    spec = importlib.util.spec_from_file_location(
        "glm53_v13_switches", Path(__file__).resolve().parents[2] / "patches/v13/glm53_v13_switches.py")
    switches = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(switches)
    assert [kpool_ring(k) for k in range(1, 8)] == [switches.kpool_ring(4, k) for k in range(1, 8)]
    assert [kpool_ring(k) for k in (4, 5, 7)] == [8, 8, 16]
