"""DRY_RUN prints exactly the commands of a run: the defaults in full, each knob's effect exactly."""

import json
import os
import shlex
import stat

import pytest

from tests.unit.test_launcher_refusals import core_refusal
from tests.unit.test_launcher_support import (
    DRAFTER_PIN,
    FAKE_SSH,
    HOME,
    MODEL_PIN,
    NODES,
    REPO,
    dry_run,
    node_commands,
    run,
    sealed_bin,
    serve_commands,
    startup_line,
    vllm_argv,
)

# The whole DRY_RUN of `NODES="192.0.2.1 192.0.2.2" IFACE=ifx0 HCA=hca0 DRY_RUN=1 ./run.sh`
# on a fresh clone, reviewed line by line. The model and the drafter are pinned already
# (the seed's commits), so nothing is resolved.
DEFAULTS_DRY_RUN = r"""# glm53: model LibertAIDAI/GLM-5.3-Flash-NVFP4@aa28e1f54130286c95fee10d0705c74ce8743734, drafter incoai/GLM-5.3-Flash-DFlash2 (CC BY-NC-ND 4.0, non-commercial), 5 sliding layers, window 2048, non-causal, mask row from an embedding table, revision 7d74cdd881ed7e32c31175984a67823127b66cfe, k=7, context 327680, 2 seqs, CUDA graphs (capture 1,2,4,8,16), KV pin 4445787956 bytes (4.14 GiB fp8_e4m3), weight-only target int8 g128 shared,mla,kda_o,kda_in,lm_head, drafter nvfp4, image glm53-sm121-v13 (KPOOL_TAIL_FIX ADAPTIVE_VERIFY on; verify tau 0.3, max 7), nodes 192.0.2.1 192.0.2.2 (TP=2); API key in {tmp}/api-key: send 'Authorization: Bearer $(cat {tmp}/api-key)'; every route but /health needs it (docs/security.md)
# refuse if a glm53.launcher=serve container is running on any node
docker ps --filter label=glm53.launcher=serve --format '{{.Names}}'
ssh -o BatchMode=yes 192.0.2.2 'docker ps --filter label=glm53.launcher=serve --format '\''{{.Names}}'\'''
# every node: the cache directory
mkdir -p /home/user/.cache/huggingface
ssh -o BatchMode=yes 192.0.2.2 'mkdir -p /home/user/.cache/huggingface'
# every node: report vm.swappiness, MemAvailable and other GPU containers; refuse the boot under MEM_BOOT_FLOOR_GIB=100 GiB
sh -c 'meminfo=${GLM53_MEMINFO:-/proc/meminfo}; swappiness=${GLM53_SWAPPINESS:-/proc/sys/vm/swappiness}; printf "swappiness %s\n" "$(cat "$swappiness" 2>/dev/null || echo unknown)"; awk '\''/^MemAvailable:/ { print "mem", $2 }'\'' "$meminfo"; for id in $(docker ps --quiet); do docker inspect --format '\''{{.Name}} {{json .HostConfig.DeviceRequests}}'\'' "$id"; done | awk '\''/"gpu"/ { sub(/^\//, "", $1); print "gpu", $1 }'\''' memory-preflight
ssh -o BatchMode=yes 192.0.2.2 'sh -c '\''meminfo=${GLM53_MEMINFO:-/proc/meminfo}; swappiness=${GLM53_SWAPPINESS:-/proc/sys/vm/swappiness}; printf "swappiness %s\n" "$(cat "$swappiness" 2>/dev/null || echo unknown)"; awk '\''\'\'''\''/^MemAvailable:/ { print "mem", $2 }'\''\'\'''\'' "$meminfo"; for id in $(docker ps --quiet); do docker inspect --format '\''\'\'''\''{{.Name}} {{json .HostConfig.DeviceRequests}}'\''\'\'''\'' "$id"; done | awk '\''\'\'''\''/"gpu"/ { sub(/^\//, "", $1); print "gpu", $1 }'\''\'\'''\'''\'' memory-preflight'
# image: glm53-sm121-v13 must exist on the head (built by scripts/build.sh from vllm/vllm-openai:glm53-flash-arm64-cu130 when missing) and have the head's ID on every worker (streamed when missing; refused when a worker's differs)
docker image inspect --format '{{.Id}}' glm53-sm121-v13
# base: refused when {repo}/recipe.lock records another image ID for vllm/vllm-openai:glm53-flash-arm64-cu130 than its tag names here
docker image inspect --format '{{.Id}}' vllm/vllm-openai:glm53-flash-arm64-cu130
# only when glm53-sm121-v13 is missing on the head (scripts/build.sh pulls vllm/vllm-openai:glm53-flash-arm64-cu130 through the docker SDK when it is missing too; BASE_LOCK=first-use: it records its ID in recipe.lock on first use; a refusal of scripts/build.sh is the run's, in its one line):
{repo}/scripts/build.sh --base vllm/vllm-openai:glm53-flash-arm64-cu130 --to v13 --base-lock first-use
# labels of glm53-sm121-v13 on the head: its base's vLLM release (glm53.base.vllm) and the layers that base provides (glm53.provided), for the start-up line; an image without them: unknown
docker image inspect --format '{{json .Config.Labels}}' glm53-sm121-v13
# 192.0.2.2: glm53-sm121-v13 with the head's image ID
ssh -o BatchMode=yes 192.0.2.2 'docker image inspect --format '\''{{.Id}}'\'' glm53-sm121-v13'
# only when glm53-sm121-v13 is missing on 192.0.2.2:
docker save glm53-sm121-v13 | python3 {repo}/launcher/count_bytes.py 'glm53-sm121-v13 to 192.0.2.2' '<image-bytes>' | ssh -o BatchMode=yes 192.0.2.2 'docker load'
# every node: the JIT cache directory of this image (JIT_CACHE/<image ID>, kept by stop.sh)
mkdir -p '/home/user/.cache/glm53-jit/<image-id>'
ssh -o BatchMode=yes 192.0.2.2 'mkdir -p '\''/home/user/.cache/glm53-jit/<image-id>'\'''
# drafter: fetch it at its pin and derive /root/.cache/huggingface/glm53-drafters/incoai-7d74cdd881ed7e32c31175984a67823127b66cfe on every node
docker run --rm --label glm53.launcher=tool --network host --mount type=bind,src=/home/user/.cache/huggingface,dst=/root/.cache/huggingface --env HF_HOME=/root/.cache/huggingface --entrypoint python3 glm53-sm121-v13 -c 'import sys; from huggingface_hub import snapshot_download; print(snapshot_download(sys.argv[1], revision=sys.argv[2]))' incoai/GLM-5.3-Flash-DFlash2 7d74cdd881ed7e32c31175984a67823127b66cfe
docker run --rm --label glm53.launcher=tool --network none --mount type=bind,src=/home/user/.cache/huggingface,dst=/root/.cache/huggingface --env HF_HOME=/root/.cache/huggingface --entrypoint python3 glm53-sm121-v13 /opt/glm53-recipe/scripts/prepare-drafter /root/.cache/huggingface/hub/models--incoai--GLM-5.3-Flash-DFlash2/snapshots/7d74cdd881ed7e32c31175984a67823127b66cfe --out /root/.cache/huggingface/glm53-drafters/incoai-7d74cdd881ed7e32c31175984a67823127b66cfe --window 2048 --json
ssh -o BatchMode=yes 192.0.2.2 'docker run --rm --label glm53.launcher=tool --network host --mount type=bind,src=/home/user/.cache/huggingface,dst=/root/.cache/huggingface --env HF_HOME=/root/.cache/huggingface --entrypoint python3 glm53-sm121-v13 -c '\''import sys; from huggingface_hub import snapshot_download; print(snapshot_download(sys.argv[1], revision=sys.argv[2]))'\'' incoai/GLM-5.3-Flash-DFlash2 7d74cdd881ed7e32c31175984a67823127b66cfe'
ssh -o BatchMode=yes 192.0.2.2 'docker run --rm --label glm53.launcher=tool --network none --mount type=bind,src=/home/user/.cache/huggingface,dst=/root/.cache/huggingface --env HF_HOME=/root/.cache/huggingface --entrypoint python3 glm53-sm121-v13 /opt/glm53-recipe/scripts/prepare-drafter /root/.cache/huggingface/hub/models--incoai--GLM-5.3-Flash-DFlash2/snapshots/7d74cdd881ed7e32c31175984a67823127b66cfe --out /root/.cache/huggingface/glm53-drafters/incoai-7d74cdd881ed7e32c31175984a67823127b66cfe --window 2048 --json'
# remove the exited serve containers an earlier run left (kept for their logs until nothing can refuse)
docker ps --all --quiet --filter label=glm53.launcher=serve
docker rm --force '<listed-ids>'
ssh -o BatchMode=yes 192.0.2.2 'docker ps --all --quiet --filter label=glm53.launcher=serve'
ssh -o BatchMode=yes 192.0.2.2 'docker rm --force '\''<listed-ids>'\'''
# API key: {tmp}/api-key (API_KEY_FILE), written with a random key, mode 0600, when missing and refused when others can read it; rank 0 gets it as VLLM_API_KEY from <api-key-env-file>, a 0600 file removed once the rank started
# start one rank per node, head first
docker run --detach --name glm53-rank0 --label glm53.launcher=serve --label glm53.rank=0 --network host --ipc host --shm-size 32g --cap-add IPC_LOCK --restart no --gpus all --device /dev/infiniband --ulimit memlock=-1:-1 --mount type=bind,src=/home/user/.cache/huggingface,dst=/root/.cache/huggingface --env HF_HOME=/root/.cache/huggingface --env TORCH_CUDA_ARCH_LIST=12.1a --env FLASHINFER_CUDA_ARCH_LIST=12.1a --env FLASHINFER_DISABLE_VERSION_CHECK=1 --env VLLM_ENGINE_READY_TIMEOUT_S=3600 --env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True --mount 'type=bind,src=/home/user/.cache/glm53-jit/<image-id>,dst=/var/cache/glm53-jit' --env VLLM_CACHE_ROOT=/var/cache/glm53-jit/vllm --env FLASHINFER_WORKSPACE_BASE=/var/cache/glm53-jit/flashinfer --env DG_JIT_CACHE_DIR=/var/cache/glm53-jit/deep_gemm --env TRITON_CACHE_DIR=/var/cache/glm53-jit/triton --env TILELANG_CACHE_DIR=/var/cache/glm53-jit/tilelang --env TORCHINDUCTOR_CACHE_DIR=/var/cache/glm53-jit/inductor --env CUDA_CACHE_PATH=/var/cache/glm53-jit/cuda --env VLLM_HOST_IP=192.0.2.1 --env NCCL_SOCKET_IFNAME=ifx0 --env GLOO_SOCKET_IFNAME=ifx0 --env TP_SOCKET_IFNAME=ifx0 --env NCCL_IB_HCA=hca0 --env NCCL_NET=IB --env NCCL_IB_DISABLE=0 --env NCCL_CROSS_NIC=1 --env NCCL_NVLS_ENABLE=0 --env NCCL_CUMEM_ENABLE=0 --env NCCL_DEBUG=WARN --env GLM53_KPOOL_TAIL_FIX=1 --env GLM53_ADAPTIVE_VERIFY=1 --env GLM53_ADAPTIVE_VERIFY_TAU=0.3 --env GLM53_INT8_W8A16=shared,mla,kda_o,kda_in,lm_head --env GLM53_DRAFT_WEIGHTS=nvfp4 --env VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 --env-file '<api-key-env-file>' --entrypoint vllm glm53-sm121-v13 serve LibertAIDAI/GLM-5.3-Flash-NVFP4 --revision aa28e1f54130286c95fee10d0705c74ce8743734 --host 0.0.0.0 --port 8000 --tensor-parallel-size 2 --max-model-len 327680 --kv-cache-dtype fp8_e4m3 --kv-cache-memory-bytes 4445787956 --gpu-memory-utilization 0.85 --max-num-seqs 2 --block-size 2304 --moe-backend marlin --linear-backend marlin --speculative-config '{"method":"dflash","model":"/root/.cache/huggingface/glm53-drafters/incoai-7d74cdd881ed7e32c31175984a67823127b66cfe","num_speculative_tokens":7}' --compilation-config '{"cudagraph_capture_sizes":[1,2,4,8,16]}' --tool-call-parser glm47 --enable-auto-tool-choice --reasoning-parser glm45 --default-chat-template-kwargs '{"enable_thinking": false}' --served-model-name glm-5.3-flash --trust-remote-code --mm-processor-cache-gb 1 --override-generation-config '{"max_new_tokens": 65536}' --nnodes 2 --node-rank 0 --master-addr 192.0.2.1 --master-port 29501 --distributed-executor-backend mp
ssh -o BatchMode=yes 192.0.2.2 'docker run --detach --name glm53-rank1 --label glm53.launcher=serve --label glm53.rank=1 --network host --ipc host --shm-size 32g --cap-add IPC_LOCK --restart no --gpus all --device /dev/infiniband --ulimit memlock=-1:-1 --mount type=bind,src=/home/user/.cache/huggingface,dst=/root/.cache/huggingface --env HF_HOME=/root/.cache/huggingface --env TORCH_CUDA_ARCH_LIST=12.1a --env FLASHINFER_CUDA_ARCH_LIST=12.1a --env FLASHINFER_DISABLE_VERSION_CHECK=1 --env VLLM_ENGINE_READY_TIMEOUT_S=3600 --env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True --mount '\''type=bind,src=/home/user/.cache/glm53-jit/<image-id>,dst=/var/cache/glm53-jit'\'' --env VLLM_CACHE_ROOT=/var/cache/glm53-jit/vllm --env FLASHINFER_WORKSPACE_BASE=/var/cache/glm53-jit/flashinfer --env DG_JIT_CACHE_DIR=/var/cache/glm53-jit/deep_gemm --env TRITON_CACHE_DIR=/var/cache/glm53-jit/triton --env TILELANG_CACHE_DIR=/var/cache/glm53-jit/tilelang --env TORCHINDUCTOR_CACHE_DIR=/var/cache/glm53-jit/inductor --env CUDA_CACHE_PATH=/var/cache/glm53-jit/cuda --env VLLM_HOST_IP=192.0.2.2 --env NCCL_SOCKET_IFNAME=ifx0 --env GLOO_SOCKET_IFNAME=ifx0 --env TP_SOCKET_IFNAME=ifx0 --env NCCL_IB_HCA=hca0 --env NCCL_NET=IB --env NCCL_IB_DISABLE=0 --env NCCL_CROSS_NIC=1 --env NCCL_NVLS_ENABLE=0 --env NCCL_CUMEM_ENABLE=0 --env NCCL_DEBUG=WARN --env GLM53_KPOOL_TAIL_FIX=1 --env GLM53_ADAPTIVE_VERIFY=1 --env GLM53_ADAPTIVE_VERIFY_TAU=0.3 --env GLM53_INT8_W8A16=shared,mla,kda_o,kda_in,lm_head --env GLM53_DRAFT_WEIGHTS=nvfp4 --env VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 --entrypoint vllm glm53-sm121-v13 serve LibertAIDAI/GLM-5.3-Flash-NVFP4 --revision aa28e1f54130286c95fee10d0705c74ce8743734 --tensor-parallel-size 2 --max-model-len 327680 --kv-cache-dtype fp8_e4m3 --kv-cache-memory-bytes 4445787956 --gpu-memory-utilization 0.85 --max-num-seqs 2 --block-size 2304 --moe-backend marlin --linear-backend marlin --speculative-config '\''{"method":"dflash","model":"/root/.cache/huggingface/glm53-drafters/incoai-7d74cdd881ed7e32c31175984a67823127b66cfe","num_speculative_tokens":7}'\'' --compilation-config '\''{"cudagraph_capture_sizes":[1,2,4,8,16]}'\'' --tool-call-parser glm47 --enable-auto-tool-choice --reasoning-parser glm45 --default-chat-template-kwargs '\''{"enable_thinking": false}'\'' --served-model-name glm-5.3-flash --trust-remote-code --mm-processor-cache-gb 1 --override-generation-config '\''{"max_new_tokens": 65536}'\'' --nnodes 2 --node-rank 1 --master-addr 192.0.2.1 --master-port 29501 --distributed-executor-backend mp --headless'
# while waiting, on every node: MemAvailable every 0.250 s and the rank log's phase markers; under the phase's floor (load 10, profile 8, kv_ready 3, serving 2 GiB) every rank is killed; samples to {repo}/runs/<UTC time>/memory.csv
sh -c 'meminfo=${GLM53_MEMINFO:-/proc/meminfo}; work=$(mktemp -d) || exit 1; follower=; trap '\''kill "$follower" 2>/dev/null; rm -rf "$work"'\'' EXIT; trap '\''exit 0'\'' HUP INT TERM; mkfifo "$work/log" || exit 1; docker logs --follow "$1" >"$work/log" 2>&1 & follower=$!; grep --line-buffered -o -E "$2" <"$work/log" & while awk '\''/^MemAvailable:/ { print "mem", $2; found = 1; exit } END { exit !found }'\'' "$meminfo"; do sleep "$3"; done' memory-sampler glm53-rank0 'Model loading took|Available KV cache memory|KV Cache as specified by kv_cache_memory_bytes|KV cache size: |Application startup complete' 0.250
ssh -o BatchMode=yes 192.0.2.2 'sh -c '\''meminfo=${GLM53_MEMINFO:-/proc/meminfo}; work=$(mktemp -d) || exit 1; follower=; trap '\''\'\'''\''kill "$follower" 2>/dev/null; rm -rf "$work"'\''\'\'''\'' EXIT; trap '\''\'\'''\''exit 0'\''\'\'''\'' HUP INT TERM; mkfifo "$work/log" || exit 1; docker logs --follow "$1" >"$work/log" 2>&1 & follower=$!; grep --line-buffered -o -E "$2" <"$work/log" & while awk '\''\'\'''\''/^MemAvailable:/ { print "mem", $2; found = 1; exit } END { exit !found }'\''\'\'''\'' "$meminfo"; do sleep "$3"; done'\'' memory-sampler glm53-rank1 '\''Model loading took|Available KV cache memory|KV Cache as specified by kv_cache_memory_bytes|KV cache size: |Application startup complete'\'' 0.250'
# wait: poll /health every 5 s (up to 7200 s) until it answers 200 twice in a row, while every rank is running; a dead rank stops all
curl --silent --fail --output /dev/null --max-time 5 http://127.0.0.1:8000/health
docker inspect --format '{{.State.Status}}' glm53-rank0
ssh -o BatchMode=yes 192.0.2.2 'docker inspect --format '\''{{.State.Status}}'\'' glm53-rank1'
# once ready, on the head: one Korean answer to the field's prompt (700 tokens, greedy), its U+FFFD, lone surrogate, control character and invalid token-byte counts in one line; a fault warns, naming the likely cause, and the ranks keep running (SELF_CHECK=0: no check)
python3 {repo}/launcher/entry.py self-check http://127.0.0.1:8000 --api-key-file {tmp}/api-key
"""

MODEL = "LibertAIDAI/GLM-5.3-Flash-NVFP4"
SEED_MODEL_PIN = "aa28e1f54130286c95fee10d0705c74ce8743734"
SEED_DRAFTER_PIN = "7d74cdd881ed7e32c31175984a67823127b66cfe"
HF_MOUNT = [
    "--mount", f"type=bind,src={HOME}/.cache/huggingface,dst=/root/.cache/huggingface",
    "--env", "HF_HOME=/root/.cache/huggingface",
]
FIXED_DOCKER = ["--network", "host", "--ipc", "host", "--shm-size", "32g", "--cap-add", "IPC_LOCK",
                "--restart", "no"]
DOCKER_DEFAULTS = ["--gpus", "all", "--device", "/dev/infiniband", "--ulimit", "memlock=-1:-1"]
ENGINE_ENV = ["--env", "TORCH_CUDA_ARCH_LIST=12.1a", "--env", "FLASHINFER_CUDA_ARCH_LIST=12.1a",
              "--env", "FLASHINFER_DISABLE_VERSION_CHECK=1",
              "--env", "VLLM_ENGINE_READY_TIMEOUT_S=3600",
              "--env", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"]
JIT_VARS = {"VLLM_CACHE_ROOT": "vllm", "FLASHINFER_WORKSPACE_BASE": "flashinfer",
            "DG_JIT_CACHE_DIR": "deep_gemm", "TRITON_CACHE_DIR": "triton",
            "TILELANG_CACHE_DIR": "tilelang", "TORCHINDUCTOR_CACHE_DIR": "inductor",
            "CUDA_CACHE_PATH": "cuda"}
JIT = ["--mount", f"type=bind,src={HOME}/.cache/glm53-jit/<image-id>,dst=/var/cache/glm53-jit"]
for _name, _dir in JIT_VARS.items():
    JIT += ["--env", f"{_name}=/var/cache/glm53-jit/{_dir}"]
PINNED = {"MODEL_REVISION": MODEL_PIN, "DRAFTER_REVISION": DRAFTER_PIN}
INCOAI_DIR = f"/root/.cache/huggingface/glm53-drafters/incoai-{DRAFTER_PIN}"


def link_env(rank):
    return ["--env", f"VLLM_HOST_IP={NODES[rank]}", "--env", "NCCL_SOCKET_IFNAME=ifx0",
            "--env", "GLOO_SOCKET_IFNAME=ifx0", "--env", "TP_SOCKET_IFNAME=ifx0",
            "--env", "NCCL_IB_HCA=hca0", "--env", "NCCL_NET=IB", "--env", "NCCL_IB_DISABLE=0",
            "--env", "NCCL_CROSS_NIC=1", "--env", "NCCL_NVLS_ENABLE=0",
            "--env", "NCCL_CUMEM_ENABLE=0", "--env", "NCCL_DEBUG=WARN"]


# The image v13 levers on by default (recipe.toml, the seed's v13 setting), after the link's.
VERIFY_ENV = ["--env", "GLM53_ADAPTIVE_VERIFY=1", "--env", "GLM53_ADAPTIVE_VERIFY_TAU=0.3"]
LEVER_ENV = ["--env", "GLM53_KPOOL_TAIL_FIX=1", *VERIFY_ENV,
             "--env", "GLM53_INT8_W8A16=shared,mla,kda_o,kda_in,lm_head",
             "--env", "GLM53_DRAFT_WEIGHTS=nvfp4"]
# adaptive verify is off with a drafter that reports no confidence (MTP, none)
LEVER_ENV_NO_DFLASH2 = LEVER_ENV[:2] + LEVER_ENV[2 + len(VERIFY_ENV):]
# CUDAGRAPH_MEMORY_ESTIMATE's default: vLLM's CUDA-graph memory estimate off on every rank.
MEMORY_ENV = ["--env", "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0"]


def expected_docker_run(rank, nodes, vllm_words, mounts=(), multi_node=True, extra_env=(),
                        levers=LEVER_ENV):
    argv = ["docker", "run", "--detach", "--name", f"glm53-rank{rank}",
            "--label", "glm53.launcher=serve", "--label", f"glm53.rank={rank}",
            *FIXED_DOCKER, *DOCKER_DEFAULTS, *HF_MOUNT, *mounts, *ENGINE_ENV, *JIT]
    if multi_node:
        argv += link_env(rank)
    argv += levers + MEMORY_ENV
    for word in extra_env:
        argv += ["--env", word]
    if rank == 0:  # the API key (API_AUTH=key): VLLM_API_KEY from a file written at run time
        argv += ["--env-file", "<api-key-env-file>"]
    return argv + ["--entrypoint", "vllm", "glm53-sm121-v13", *vllm_words]


CHAT = ["--tool-call-parser", "glm47", "--enable-auto-tool-choice", "--reasoning-parser", "glm45",
        "--default-chat-template-kwargs", '{"enable_thinking": false}',
        "--served-model-name", "glm-5.3-flash", "--trust-remote-code",
        "--mm-processor-cache-gb", "1", "--override-generation-config", '{"max_new_tokens": 65536}']


def expected_vllm(rank, nodes, middle, tp=None, extra=(), chat=CHAT):
    """`serve MODEL ...` as the launcher orders it; `middle` is what sits between the
    memory flags and the chat flags (speculative and compilation config)."""
    words = ["serve", MODEL, "--revision", MODEL_PIN]
    if rank == 0:
        words += ["--host", "0.0.0.0", "--port", "8000"]
    words += ["--tensor-parallel-size", str(tp or nodes), "--max-model-len", "327680",
              "--kv-cache-dtype", "fp8_e4m3", "--kv-cache-memory-bytes", "4445787956",
              "--gpu-memory-utilization", "0.85", "--max-num-seqs", "2", "--block-size", "2304",
              "--moe-backend", "marlin", "--linear-backend", "marlin", *middle, *chat]
    if nodes > 1:
        words += ["--nnodes", str(nodes), "--node-rank", str(rank), "--master-addr", NODES[0],
                  "--master-port", "29501", "--distributed-executor-backend", "mp"]
        if rank > 0:
            words.append("--headless")
    return words + list(extra)


def dflash(k=7, directory=INCOAI_DIR):
    return ["--speculative-config", json.dumps(
        {"method": "dflash", "model": directory, "num_speculative_tokens": k},
        separators=(",", ":"))]


def graphs(*sizes):
    return ["--compilation-config",
            '{"cudagraph_capture_sizes":[' + ",".join(map(str, sizes)) + "]}"]


def assert_ranks(stdout, nodes, middle, tp=None, extra=(), mounts=(), chat=CHAT, extra_env=(),
                 levers=LEVER_ENV):
    ranks = serve_commands(stdout)
    assert sorted(ranks) == list(range(nodes))
    for rank, (node, argv) in ranks.items():
        assert node == NODES[rank]
        assert argv == expected_docker_run(
            rank, nodes, expected_vllm(rank, nodes, middle, tp, extra, chat), mounts, nodes > 1,
            extra_env, levers)


def test_defaults_print_exactly_the_reviewed_commands(tmp_path):
    assert dry_run(tmp_path) == DEFAULTS_DRY_RUN.replace("{repo}", str(REPO)).replace(
        "{tmp}", str(tmp_path))


def test_defaults_serve_the_seeds_checkpoint_and_drafter_at_their_commits(tmp_path):
    ranks = serve_commands(dry_run(tmp_path))
    for _, argv in ranks.values():
        words = vllm_argv(argv)
        assert words[:4] == ["serve", MODEL, "--revision", SEED_MODEL_PIN]
        spec = json.loads(words[words.index("--speculative-config") + 1])
        assert spec["model"].endswith(f"/incoai-{SEED_DRAFTER_PIN}")


def test_another_model_does_not_inherit_the_seeds_commit(tmp_path):
    stdout = dry_run(tmp_path, MODEL="someone/other-checkpoint")
    assert SEED_MODEL_PIN not in stdout
    assert "--revision '<resolved-at-run>'" in stdout
    assert "model_info(sys.argv[1]).sha)' someone/other-checkpoint" in stdout


def test_defaults_pinned_serve_dflash2_k7_with_graphs(tmp_path):
    stdout = dry_run(tmp_path, **PINNED)
    assert_ranks(stdout, 2, dflash(7) + graphs(1, 2, 4, 8, 16))
    assert "resolve" not in stdout
    assert startup_line(stdout) == (
        f"model {MODEL}@{MODEL_PIN}, drafter incoai/GLM-5.3-Flash-DFlash2 (CC BY-NC-ND 4.0, "
        f"non-commercial), 5 sliding layers, window 2048, non-causal, "
        f"mask row from an embedding table, revision {DRAFTER_PIN}, k=7, "
        "context 327680, 2 seqs, CUDA graphs (capture 1,2,4,8,16), KV pin 4445787956 "
        "bytes (4.14 GiB fp8_e4m3), weight-only target int8 g128 shared,mla,kda_o,kda_in,lm_head, "
        "drafter nvfp4, image glm53-sm121-v13 (KPOOL_TAIL_FIX ADAPTIVE_VERIFY on; verify tau 0.3, "
        "max 7), nodes 192.0.2.1 192.0.2.2 (TP=2); API key in "
        f"{tmp_path}/api-key: send 'Authorization: Bearer $(cat {tmp_path}/api-key)'; every "
        "route but /health needs it (docs/security.md)")


def test_pins_file_supplies_revisions_nothing_else_pins(tmp_path):
    other, g_repo = "someone/other-checkpoint", "canada-quant/GLM-5.3-Flash-DFlash2-G"
    (tmp_path / "pins.env").write_text(
        f"# recorded by run.sh\n{other} {MODEL_PIN}\n{g_repo} {DRAFTER_PIN}\n")
    settings = {"MODEL": other, "DRAFTER": "dflash2-g"}
    assert dry_run(tmp_path, **settings) == dry_run(tmp_path, **settings, **PINNED)


def test_spec_mtp_uses_the_checkpoint_head_with_4_tokens(tmp_path):
    stdout = dry_run(tmp_path, SPEC="mtp", **PINNED)
    mtp = ["--speculative-config", '{"method":"mtp","num_speculative_tokens":4}']
    assert_ranks(stdout, 2, mtp + graphs(1, 2, 4, 5, 10), levers=LEVER_ENV_NO_DFLASH2)
    assert "prepare-drafter" not in stdout and "DFlash2" not in stdout
    assert "drafter the checkpoint's MTP head, k=4," in startup_line(stdout)
    # DRAFT_WEIGHTS=nvfp4 swaps only a DFlash2 drafter: the line does not claim it for MTP
    assert "drafter nvfp4" not in startup_line(stdout)


def test_spec_off_passes_no_speculative_config(tmp_path):
    stdout = dry_run(tmp_path, SPEC="off", **PINNED)
    assert_ranks(stdout, 2, graphs(1, 2, 4), levers=LEVER_ENV_NO_DFLASH2)
    assert "--speculative-config" not in stdout and "prepare-drafter" not in stdout
    assert "no drafter (SPEC=off)" in startup_line(stdout)


def test_enforce_eager_replaces_the_capture_sizes(tmp_path):
    stdout = dry_run(tmp_path, ENFORCE_EAGER=1, **PINNED)
    assert_ranks(stdout, 2, dflash() + ["--enforce-eager"])
    assert "--compilation-config" not in stdout
    assert ", eager, " in startup_line(stdout)


# k, seqs -> capture sizes: 1, 2, 4 and (k + 1) x {1..seqs}, sorted, none repeated
CAPTURES = {(7, 2): (1, 2, 4, 8, 16),  # the default: 8 x {1, 2}
            (5, 4): (1, 2, 4, 6, 12, 18, 24)}  # PROFILE=seed-pr's k and seqs


@pytest.mark.parametrize("k, seqs", CAPTURES)
def test_k_and_seqs_capture_sorted_unique_sizes(tmp_path, k, seqs):
    stdout = dry_run(tmp_path, NUM_SPECULATIVE_TOKENS=k, MAX_NUM_SEQS=seqs, **PINNED)
    ranks = serve_commands(stdout)
    assert sorted(ranks) == [0, 1]
    for _, argv in ranks.values():
        words = vllm_argv(argv)
        assert words[words.index("--max-num-seqs") + 1] == str(seqs)
        assert words[words.index("--speculative-config") + 1] == dflash(k)[1]
        assert words[words.index("--compilation-config") + 1] == graphs(*CAPTURES[k, seqs])[1]


def test_capture_sizes_deduplicate_where_verify_shapes_meet_1_2_4(tmp_path):
    stdout = dry_run(tmp_path, NUM_SPECULATIVE_TOKENS=1, MAX_NUM_SEQS=3, **PINNED)
    assert graphs(1, 2, 4, 6)[1] in stdout


@pytest.mark.parametrize("nodes", [3, 4])
def test_three_and_four_nodes(tmp_path, nodes):
    stdout = dry_run(tmp_path, nodes=nodes, **PINNED)
    assert_ranks(stdout, nodes, dflash() + graphs(1, 2, 4, 8, 16))
    workers = {node for node, argv in node_commands(stdout) if node != NODES[0]}
    assert workers == set(NODES[1:nodes])
    assert f"nodes {' '.join(NODES[:nodes])} (TP={nodes}); API key in " in startup_line(stdout)


def test_tp_may_be_a_multiple_of_the_node_count(tmp_path):
    stdout = dry_run(tmp_path, TP=4, **PINNED)
    assert_ranks(stdout, 2, dflash() + graphs(1, 2, 4, 8, 16), tp=4)


def test_one_node_needs_no_network_settings(tmp_path):
    stdout = dry_run(tmp_path, nodes=1, IFACE=None, HCA=None, **PINNED)
    assert_ranks(stdout, 1, dflash() + graphs(1, 2, 4, 8, 16))
    assert "ssh" not in stdout


EXTRA_ARGS = (
    """--hf-overrides '{"note": "a \\"quoted\\" $HOME `x`"}' """
    """--root-path "/it's glm" --chat-template-content-format=string"""
)
EXTRA_WORDS = [
    "--hf-overrides", '{"note": "a \\"quoted\\" $HOME `x`"}',
    "--root-path", "/it's glm", "--chat-template-content-format=string",
]


def test_extra_args_reach_every_rank_as_shell_words(tmp_path):
    stdout = dry_run(tmp_path, EXTRA_ARGS=EXTRA_ARGS, **PINNED)
    assert_ranks(stdout, 2, dflash() + graphs(1, 2, 4, 8, 16), extra=EXTRA_WORDS)
    json.loads(EXTRA_WORDS[1])  # the JSON word is still JSON after both shell levels


def test_generation_config_merges_with_the_max_new_tokens_ceiling(tmp_path):
    stdout = dry_run(tmp_path, GENERATION_CONFIG='{"temperature": 0.6, "note": "it\'s"}', **PINNED)
    for _, argv in serve_commands(stdout).values():
        words = vllm_argv(argv)
        assert json.loads(words[words.index("--override-generation-config") + 1]) == {
            "max_new_tokens": 65536, "temperature": 0.6, "note": "it's"}


def test_chat_knobs_change_their_flags_and_empty_leaves_them_out(tmp_path):
    stdout = dry_run(tmp_path, THINKING=1, MAX_NEW_TOKENS=4096, SERVED_MODEL_NAME="glm",
                     TOOL_CALL_PARSER="glm45", REASONING_PARSER="glm47", **PINNED)
    chat = ["--tool-call-parser", "glm45", "--enable-auto-tool-choice", "--reasoning-parser",
            "glm47", "--default-chat-template-kwargs", '{"enable_thinking": true}',
            "--served-model-name", "glm", "--trust-remote-code", "--mm-processor-cache-gb", "1",
            "--override-generation-config", '{"max_new_tokens": 4096}']
    assert_ranks(stdout, 2, dflash() + graphs(1, 2, 4, 8, 16), chat=chat)


def test_block_size_2304_is_the_default_and_others_are_accepted(tmp_path):
    for block, expected in ((None, "2304"), (64, "64"), (4608, "4608")):
        stdout = dry_run(tmp_path, BLOCK_SIZE=block, **PINNED)
        for _, argv in serve_commands(stdout).values():
            words = vllm_argv(argv)
            assert words[words.index("--block-size") + 1] == expected


def test_a_forced_backend_is_passed_as_asked(tmp_path):
    stdout = dry_run(tmp_path, MOE_BACKEND="flashinfer_cutlass", FORCE_UNSAFE_MOE=1,
                     LINEAR_BACKEND="auto", FORCE_UNSAFE_LINEAR=1, **PINNED)
    for _, argv in serve_commands(stdout).values():
        words = vllm_argv(argv)
        assert words[words.index("--moe-backend") + 1] == "flashinfer_cutlass"
        assert words[words.index("--linear-backend") + 1] == "auto"


def test_extra_env_reaches_every_rank_after_the_launchers_own(tmp_path):
    extra = ["VLLM_LOGGING_LEVEL=DEBUG", "NCCL_IB_TIMEOUT=22", "TORCH_NCCL_BLOCKING_WAIT=1",
             "CUDA_LAUNCH_BLOCKING=0", "FLASHINFER_LOGLEVEL=3"]
    stdout = dry_run(tmp_path, EXTRA_ENV=" ".join(extra), **PINNED)
    assert_ranks(stdout, 2, dflash() + graphs(1, 2, 4, 8, 16), extra_env=extra)


def test_every_variable_the_launcher_sets_is_refused_in_extra_env(tmp_path):
    token = tmp_path / "tok"  # DRY_RUN refuses a token file the head cannot read, as the run
    token.write_text("hf_x\n")
    argv = serve_commands(dry_run(tmp_path, HF_TOKEN_FILE=token, **PINNED))[1][1]
    names = sorted({argv[i + 1].split("=", 1)[0] for i, word in enumerate(argv) if word == "--env"})
    assert len(names) == 31  # HF 2, engines 5, JIT caches 7, the link 11, levers 5, memory 1
    # The Python core's check itself, once per name (a whole run.sh each is slow).
    for name in names:
        line = core_refusal(tmp_path, EXTRA_ENV=f"{name}=1", HF_TOKEN_FILE=token, **PINNED)
        assert line.startswith(f"refused: EXTRA_ENV={name}"), line
        assert (f"the launcher sets {name}: " in line or "looks like a credential" in line), line


def test_none_leaves_optional_flags_and_the_jit_cache_out(tmp_path):
    stdout = dry_run(tmp_path, JIT_CACHE="none", TOOL_CALL_PARSER="none", REASONING_PARSER="none",
                     SERVED_MODEL_NAME="none", MM_PROCESSOR_CACHE_GB="none", MAX_NEW_TOKENS="none",
                     BLOCK_SIZE="none", **PINNED)
    assert "glm53-jit" not in stdout and "JIT cache" not in stdout
    for _, argv in serve_commands(stdout).values():
        words = vllm_argv(argv)
        for flag in ("--tool-call-parser", "--enable-auto-tool-choice", "--reasoning-parser",
                     "--served-model-name", "--mm-processor-cache-gb",
                     "--override-generation-config", "--block-size"):
            assert flag not in words
        assert "--default-chat-template-kwargs" in words and "--trust-remote-code" in words
        assert not any(word.startswith(tuple(JIT_VARS)) for word in argv)


def test_dflash2_g_says_licence_and_window_and_serves_the_derived_dir(tmp_path):
    stdout = dry_run(tmp_path, DRAFTER="dflash2-g", DRAFTER_WINDOW=4096, **PINNED)
    derived = f"/root/.cache/huggingface/glm53-drafters/dflash2-g-{DRAFTER_PIN}"
    assert_ranks(stdout, 2, dflash(directory=derived) + graphs(1, 2, 4, 8, 16))
    assert ("drafter canada-quant/GLM-5.3-Flash-DFlash2-G (Apache-2.0), 8 full-attention "
            "layers served at a 4096-token window, non-causal, mask row from mask_embedding.pt"
            ) in startup_line(stdout)
    snapshot = ("/root/.cache/huggingface/hub/models--canada-quant--GLM-5.3-Flash-DFlash2-G/"
                f"snapshots/{DRAFTER_PIN}")
    prepares = [argv for _, argv in node_commands(stdout) if "prepare-drafter" in " ".join(argv)]
    assert len(prepares) == 2
    for argv in prepares:
        assert argv[-7:] == ["/opt/glm53-recipe/scripts/prepare-drafter", snapshot,
                             "--out", derived, "--window", "4096", "--json"]


def test_local_drafter_is_mounted_read_only_and_not_fetched(tmp_path):
    local = "/srv/drafters/my drafter"
    stdout = dry_run(tmp_path, DRAFTER=local, **PINNED)
    checksum = os.popen(f"printf %s {shlex.quote(local)} | cksum").read().split()[0]
    derived = f"/root/.cache/huggingface/glm53-drafters/local-{checksum}"
    mount = ["--mount", f"type=bind,src={local},dst={local},readonly"]
    assert_ranks(stdout, 2, dflash(directory=derived) + graphs(1, 2, 4, 8, 16), mounts=mount)
    assert "snapshot_download" not in stdout
    prepares = [argv for _, argv in node_commands(stdout) if "prepare-drafter" in " ".join(argv)]
    assert [argv[argv.index("/opt/glm53-recipe/scripts/prepare-drafter") + 1]
            for argv in prepares] == [local, local]


def test_local_model_is_mounted_and_has_no_revision(tmp_path):
    # no such directory here: the scan DRY_RUN runs on this host would refuse it
    stdout = dry_run(tmp_path, MODEL="/models/glm", DRAFTER_REVISION=DRAFTER_PIN,
                     CHECKPOINT_SCAN="off")
    for _, argv in serve_commands(stdout).values():
        assert "type=bind,src=/models/glm,dst=/models/glm,readonly" in argv
        assert vllm_argv(argv)[:2] == ["serve", "/models/glm"]
        assert "--revision" not in argv
    assert "model_info" not in stdout


def test_token_file_is_mounted_read_only_and_its_content_never_printed(tmp_path):
    token = tmp_path / "token"
    token.write_text("hf_SECRETVALUE\n")
    stdout = dry_run(tmp_path, HF_TOKEN_FILE=token, HF_TOKEN="hf_SECRETVALUE", **PINNED)
    assert "hf_SECRETVALUE" not in stdout
    for _, argv in node_commands(stdout):
        if argv[:2] == ["docker", "run"]:
            at = argv.index(f"type=bind,src={token},dst=/run/secrets/hf_token,readonly")
            assert argv[at - 1] == "--mount"
            assert "HF_TOKEN_PATH=/run/secrets/hf_token" in argv
            assert not any(word.startswith("HF_TOKEN=") for word in argv)


def test_cluster_env_is_read_literally_and_the_environment_wins(tmp_path):
    cluster = tmp_path / "cluster.env"
    cluster.write_text(
        "# site values\n"
        'NODES="192.0.2.3 192.0.2.4"\n'
        "IFACE=ifsite\n"
        "HCA=hcasite\n"
        """GENERATION_CONFIG='{"top_k": 20}'\n"""
        "MAX_NUM_SEQS=2\n")
    stdout = dry_run(tmp_path, CLUSTER_ENV=cluster, NODES=None, IFACE=None, HCA=None,
                     MAX_NUM_SEQS=3, **PINNED)
    ranks = serve_commands(stdout, head="192.0.2.3")
    assert [node for node, _ in ranks.values()] == ["192.0.2.3", "192.0.2.4"]
    words = vllm_argv(ranks[1][1])
    assert words[words.index("--override-generation-config") + 1] == (
        '{"max_new_tokens": 65536, "top_k": 20}')
    assert words[words.index("--max-num-seqs") + 1] == "3"
    assert "NCCL_SOCKET_IFNAME=ifsite" in ranks[1][1] and "NCCL_IB_HCA=hcasite" in ranks[1][1]


def test_ssh_and_docker_args_are_settings(tmp_path):
    stdout = dry_run(tmp_path, SSH=f"{FAKE_SSH} -p 2222", DOCKER_ARGS="--runtime runc",
                     **PINNED)
    worker_lines = [line for line in stdout.splitlines() if NODES[1] in line.split(" ")[:4]]
    assert worker_lines and all(line.startswith(f"{FAKE_SSH} -p 2222 {NODES[1]} ")
                                for line in worker_lines)
    for _, argv in serve_commands(stdout).values():
        after_fixed = argv.index("--restart") + 2
        assert argv[after_fixed:after_fixed + 3] == ["--runtime", "runc", "--mount"]
        assert "--gpus" not in argv


def test_streams_through_pv_when_it_is_installed(tmp_path):
    pv = sealed_bin(tmp_path) / "pv"
    pv.write_text("#!/bin/sh\nexec cat\n")
    pv.chmod(pv.stat().st_mode | stat.S_IXUSR)
    stdout = dry_run(tmp_path, **PINNED)
    assert (f"docker save glm53-sm121-v13 | pv --size '<image-bytes>' --name "
            f"'glm53-sm121-v13 to {NODES[1]}' | ssh -o BatchMode=yes {NODES[1]} 'docker load'"
            ) in stdout.splitlines()


def test_stop_dry_run_removes_the_serve_containers_on_every_node(tmp_path):
    result = run(tmp_path, script="stop.sh", nodes=3)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "# remove the serve containers listed on each node",
        "docker ps --all --quiet --filter label=glm53.launcher=serve",
        "docker rm --force '<listed-ids>'",
        f"ssh -o BatchMode=yes {NODES[1]} 'docker ps --all --quiet --filter label=glm53.launcher=serve'",
        f"ssh -o BatchMode=yes {NODES[1]} 'docker rm --force '\\''<listed-ids>'\\'''",
        f"ssh -o BatchMode=yes {NODES[2]} 'docker ps --all --quiet --filter label=glm53.launcher=serve'",
        f"ssh -o BatchMode=yes {NODES[2]} 'docker rm --force '\\''<listed-ids>'\\'''",
    ]


def test_nodes_may_be_separated_by_newlines_commas_or_spaces(tmp_path):
    stdout = dry_run(tmp_path, NODES=f"{NODES[0]},\n{NODES[1]}", **PINNED)
    assert [node for node, _ in serve_commands(stdout).values()] == list(NODES[:2])
