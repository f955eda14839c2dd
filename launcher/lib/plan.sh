# shellcheck shell=bash
# shellcheck disable=SC2034,SC2153  # globals read by other libs; knobs assigned by name in settings.sh
# The commands a run is made of, built as argv arrays from the validated settings.

readonly SERVE_LABEL=glm53.launcher=serve
readonly UNPINNED='<resolved-at-run>'
readonly RESOLVE_CODE='import sys; from huggingface_hub import HfApi; print(HfApi().model_info(sys.argv[1]).sha)'
readonly FETCH_CODE='import sys; from huggingface_hub import snapshot_download; print(snapshot_download(sys.argv[1], revision=sys.argv[2]))'

# The container environment the launcher sets, by name, and the setting each comes from
# ("fixed": part of the seed's verified run). EXTRA_ENV may not set these names.
readonly -A LAUNCHER_ENV=(
  ["HF_HOME"]=HF_CACHE ["HF_TOKEN_PATH"]=HF_TOKEN_FILE
  ["TORCH_CUDA_ARCH_LIST"]=CUDA_ARCH_LIST ["FLASHINFER_CUDA_ARCH_LIST"]=CUDA_ARCH_LIST
  ["FLASHINFER_DISABLE_VERSION_CHECK"]=fixed ["VLLM_ENGINE_READY_TIMEOUT_S"]=ENGINE_READY_TIMEOUT
  ["PYTORCH_CUDA_ALLOC_CONF"]=fixed
  ["VLLM_CACHE_ROOT"]=JIT_CACHE ["FLASHINFER_WORKSPACE_BASE"]=JIT_CACHE ["DG_JIT_CACHE_DIR"]=JIT_CACHE
  ["TRITON_CACHE_DIR"]=JIT_CACHE ["TILELANG_CACHE_DIR"]=JIT_CACHE ["TORCHINDUCTOR_CACHE_DIR"]=JIT_CACHE
  ["CUDA_CACHE_PATH"]=JIT_CACHE
  ["VLLM_HOST_IP"]=NODES ["NCCL_SOCKET_IFNAME"]=IFACE ["GLOO_SOCKET_IFNAME"]=IFACE
  ["TP_SOCKET_IFNAME"]=IFACE ["NCCL_IB_HCA"]=HCA ["NCCL_NET"]=fixed ["NCCL_IB_DISABLE"]=fixed
  ["NCCL_CROSS_NIC"]=fixed ["NCCL_NVLS_ENABLE"]=fixed ["NCCL_CUMEM_ENABLE"]=fixed
  ["NCCL_DEBUG"]=NCCL_DEBUG_LEVEL
)

# Each engine's JIT cache variable and its directory under CONTAINER_JIT_DIR (variable
# names checked in vLLM 0.30.0, flashinfer-python 0.6.18, triton 3.7, tilelang 0.1.12,
# torch 2.13; CUDA_CACHE_PATH is the CUDA driver's PTX JIT cache).
readonly JIT_CACHE_VARS=(VLLM_CACHE_ROOT=vllm FLASHINFER_WORKSPACE_BASE=flashinfer
  DG_JIT_CACHE_DIR=deep_gemm TRITON_CACHE_DIR=triton TILELANG_CACHE_DIR=tilelang
  TORCHINDUCTOR_CACHE_DIR=inductor CUDA_CACHE_PATH=cuda)

# The image ID every node runs (set once the images agree; DRY_RUN shows a placeholder).
IMAGE_ID='<image-id>'

rank_container() {
  REPLY=glm53-rank$1
}

# This run's JIT cache directory on every node: JIT_CACHE keyed by the image ID, so a
# new image starts a new directory and an old one is never fed kernels it did not build.
jit_dir() {
  REPLY=${JIT_CACHE}/${IMAGE_ID#sha256:}
}

# k drafted per step: what the capture sizes and the start-up line are built from.
speculative_tokens() {
  case ${SPEC} in
    dflash2) REPLY=${NUM_SPECULATIVE_TOKENS} ;;
    mtp) REPLY=${MTP_NUM_SPECULATIVE_TOKENS} ;;
    *) REPLY=0 ;;
  esac
}

# 1, 2, 4 and (k + 1) x {1..MAX_NUM_SEQS}, sorted and de-duplicated, comma-separated.
capture_sizes() {
  local -a present=()
  local k seqs size
  speculative_tokens
  k=${REPLY}
  present[1]=1 present[2]=1 present[4]=1
  for ((seqs = 1; seqs <= MAX_NUM_SEQS; seqs++)); do
    present[(k + 1) * seqs]=1
  done
  # An indexed array lists its indices in ascending order, once each.
  size="${!present[*]}"
  REPLY=${size// /,}
}

# vLLM's speculative_config.method for SPEC (DFlash2 keeps "dflash"); empty for off.
speculative_method() {
  case ${SPEC} in
    dflash2) REPLY=dflash ;;
    mtp) REPLY=mtp ;;
    *) REPLY="" ;;
  esac
}

speculative_config_json() {
  local k
  speculative_tokens
  k=${REPLY}
  speculative_method
  case ${SPEC} in
    dflash2) REPLY="{\"method\":\"${REPLY}\",\"model\":\"${DRAFT_DIR}\",\"num_speculative_tokens\":${k}}" ;;
    mtp) REPLY="{\"method\":\"${REPLY}\",\"num_speculative_tokens\":${k}}" ;;
    *) REPLY="" ;;
  esac
}

# The `vllm serve` argv for RANK (without the `vllm` entry point), into SERVE_ARGV.
# Order follows the seed's command; README's launcher section gives each flag's source.
vllm_serve_argv() {
  local rank=$1 nodes=${#NODE_LIST[@]} thinking=false
  SERVE_ARGV=(serve "${MODEL}")
  [[ ${MODEL} == /* ]] || SERVE_ARGV+=(--revision "${MODEL_PIN}")
  ((rank != 0)) || SERVE_ARGV+=(--host 0.0.0.0 --port "${PORT}")
  SERVE_ARGV+=(--tensor-parallel-size "${TP}" --max-model-len "${MAX_MODEL_LEN}"
    --kv-cache-dtype "${KV_CACHE_DTYPE}" --kv-cache-memory-bytes "${KV_CACHE_MEMORY_BYTES}"
    --gpu-memory-utilization "${GPU_MEMORY_UTILIZATION}" --max-num-seqs "${MAX_NUM_SEQS}")
  [[ -z ${BLOCK_SIZE} ]] || SERVE_ARGV+=(--block-size "${BLOCK_SIZE}")
  [[ -z ${MOE_BACKEND} ]] || SERVE_ARGV+=(--moe-backend "${MOE_BACKEND}")
  [[ -z ${LINEAR_BACKEND} ]] || SERVE_ARGV+=(--linear-backend "${LINEAR_BACKEND}")
  speculative_config_json
  [[ -z ${REPLY} ]] || SERVE_ARGV+=(--speculative-config "${REPLY}")
  if [[ ${ENFORCE_EAGER} == 1 ]]; then
    SERVE_ARGV+=(--enforce-eager)
  else
    capture_sizes
    SERVE_ARGV+=(--compilation-config "{\"cudagraph_capture_sizes\":[${REPLY}]}")
  fi
  [[ -z ${TOOL_CALL_PARSER} ]] || SERVE_ARGV+=(--tool-call-parser "${TOOL_CALL_PARSER}" --enable-auto-tool-choice)
  [[ -z ${REASONING_PARSER} ]] || SERVE_ARGV+=(--reasoning-parser "${REASONING_PARSER}")
  [[ ${THINKING} == 0 ]] || thinking=true
  SERVE_ARGV+=(--default-chat-template-kwargs "{\"enable_thinking\": ${thinking}}")
  [[ -z ${SERVED_MODEL_NAME} ]] || SERVE_ARGV+=(--served-model-name "${SERVED_MODEL_NAME}")
  SERVE_ARGV+=(--trust-remote-code)
  [[ -z ${MM_PROCESSOR_CACHE_GB} ]] || SERVE_ARGV+=(--mm-processor-cache-gb "${MM_PROCESSOR_CACHE_GB}")
  [[ -z ${GENERATION_JSON} ]] || SERVE_ARGV+=(--override-generation-config "${GENERATION_JSON}")
  if ((nodes > 1)); then
    SERVE_ARGV+=(--nnodes "${nodes}" --node-rank "${rank}" --master-addr "${NODE_LIST[0]}"
      --master-port "${MASTER_PORT}" --distributed-executor-backend mp)
    ((rank == 0)) || SERVE_ARGV+=(--headless)
  fi
  SERVE_ARGV+=("${EXTRA_WORDS[@]}")
}

# Mounts and environment every container of a run gets: the HF cache, and the token as a
# read-only file (its path, never its value, is in the environment).
hub_access_argv() {
  HUB_ARGV=(--mount "type=bind,src=${HF_CACHE},dst=${CONTAINER_HF_HOME}"
    --env "HF_HOME=${CONTAINER_HF_HOME}")
  if [[ -n ${HF_TOKEN_FILE} ]]; then
    HUB_ARGV+=(--mount "type=bind,src=${HF_TOKEN_FILE},dst=${CONTAINER_TOKEN_PATH},readonly"
      --env "HF_TOKEN_PATH=${CONTAINER_TOKEN_PATH}")
  fi
}

# Local model and drafter directories appear at the same path inside the container.
local_dirs_argv() {
  LOCAL_DIRS_ARGV=()
  if [[ ${MODEL} == /* ]]; then
    LOCAL_DIRS_ARGV+=(--mount "type=bind,src=${MODEL},dst=${MODEL},readonly")
  fi
  if [[ ${SPEC} == dflash2 && ${DRAFTER} == /* ]]; then
    LOCAL_DIRS_ARGV+=(--mount "type=bind,src=${DRAFTER},dst=${DRAFTER},readonly")
  fi
}

# What every rank's engines need on GB10 (the seed's verified run), into ENGINE_ENV_ARGV.
engine_env_argv() {
  ENGINE_ENV_ARGV=(--env "TORCH_CUDA_ARCH_LIST=${CUDA_ARCH_LIST}"
    --env "FLASHINFER_CUDA_ARCH_LIST=${CUDA_ARCH_LIST}"
    --env FLASHINFER_DISABLE_VERSION_CHECK=1
    --env "VLLM_ENGINE_READY_TIMEOUT_S=${ENGINE_READY_TIMEOUT}"
    --env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)
}

# The node's JIT cache directory mounted into the rank, every engine's cache pointed into
# it, into JIT_ARGV (empty when JIT_CACHE is empty).
jit_cache_argv() {
  local pair
  JIT_ARGV=()
  [[ -n ${JIT_CACHE} ]] || return 0
  jit_dir
  JIT_ARGV=(--mount "type=bind,src=${REPLY},dst=${CONTAINER_JIT_DIR}")
  for pair in "${JIT_CACHE_VARS[@]}"; do
    JIT_ARGV+=(--env "${pair%%=*}=${CONTAINER_JIT_DIR}/${pair#*=}")
  done
}

# The node-to-node link for RANK (two or more nodes), into LINK_ENV_ARGV: this node's own
# address as VLLM_HOST_IP, the link's interface and RDMA device, the seed's NCCL settings.
link_env_argv() {
  local rank=$1
  LINK_ENV_ARGV=()
  ((${#NODE_LIST[@]} > 1)) || return 0
  LINK_ENV_ARGV=(--env "VLLM_HOST_IP=${NODE_LIST[rank]}"
    --env "NCCL_SOCKET_IFNAME=${IFACE}" --env "GLOO_SOCKET_IFNAME=${IFACE}"
    --env "TP_SOCKET_IFNAME=${IFACE}" --env "NCCL_IB_HCA=${HCA}"
    --env NCCL_NET=IB --env NCCL_IB_DISABLE=0 --env NCCL_CROSS_NIC=1
    --env NCCL_NVLS_ENABLE=0 --env NCCL_CUMEM_ENABLE=0 --env "NCCL_DEBUG=${NCCL_DEBUG_LEVEL}")
}

# `docker run` for RANK, into CMD.
serve_container_argv() {
  local rank=$1 name word
  rank_container "${rank}"
  name=${REPLY}
  hub_access_argv
  local_dirs_argv
  engine_env_argv
  jit_cache_argv
  link_env_argv "${rank}"
  vllm_serve_argv "${rank}"
  CMD=(docker run --detach --name "${name}" --label "${SERVE_LABEL}"
    --label "glm53.rank=${rank}" --network host --ipc host --shm-size 32g
    --cap-add IPC_LOCK --restart no "${DOCKER_WORDS[@]}"
    "${HUB_ARGV[@]}" "${LOCAL_DIRS_ARGV[@]}" "${ENGINE_ENV_ARGV[@]}" "${JIT_ARGV[@]}"
    "${LINK_ENV_ARGV[@]}")
  for word in "${EXTRA_ENV_WORDS[@]}"; do
    CMD+=(--env "${word}")
  done
  CMD+=(--entrypoint vllm "${IMAGE}" "${SERVE_ARGV[@]}")
}

# A one-off container in the serving image (it has huggingface_hub, torch and the toolkit).
tool_container_argv() {
  local network=$1
  shift
  hub_access_argv
  local_dirs_argv
  CMD=(docker run --rm --label glm53.launcher=tool --network "${network}"
    "${HUB_ARGV[@]}" "${LOCAL_DIRS_ARGV[@]}" --entrypoint python3 "${IMAGE}" "$@")
}

resolve_revision_argv() {
  tool_container_argv host -c "${RESOLVE_CODE}" "$1"
}

fetch_snapshot_argv() {
  tool_container_argv host -c "${FETCH_CODE}" "$1" "$2"
}

prepare_drafter_argv() {
  tool_container_argv none "${IN_IMAGE_PREPARE_DRAFTER}" "${DRAFT_SNAPSHOT}" \
    --out "${DRAFT_DIR}" --window "${DRAFTER_WINDOW}" --json
}

image_id_argv() {
  CMD=(docker image inspect --format '{{.Id}}' "$1")
}

container_status_argv() {
  rank_container "$1"
  CMD=(docker inspect --format '{{.State.Status}}' "${REPLY}")
}

serve_containers_argv() {
  CMD=(docker ps --all --quiet --filter "label=${SERVE_LABEL}")
}

api_probe_argv() {
  CMD=(curl --silent --fail --output /dev/null --max-time 5 "http://127.0.0.1:${PORT}/v1/models")
}

# The same request, printing the model list.
api_models_argv() {
  CMD=(curl --silent --fail --max-time 5 "http://127.0.0.1:${PORT}/v1/models")
}

# What scripts/doctor reads of a rank container: status, image ID and argv.
rank_facts_argv() {
  rank_container "$1"
  CMD=(docker inspect --format '{{.State.Status}} {{.Image}} {{json .Args}}' "${REPLY}")
}

# Bytes as GiB with two decimals, truncated (4445787956 -> 4.14).
gib() {
  local hundredths=$(($1 * 100 / 1073741824))
  printf -v REPLY '%d.%02d' $((hundredths / 100)) $((hundredths % 100))
}

# The one start-up line: model, drafter and licence, k, context, graphs, KV pin, nodes.
startup_line() {
  local drafter_phrase=$1 model mode k
  model=${MODEL}
  [[ ${MODEL} == /* ]] || model+="@${MODEL_PIN}"
  speculative_tokens
  k=${REPLY}
  case ${SPEC} in
    dflash2) drafter_phrase="drafter ${drafter_phrase}, revision ${DRAFTER_PIN}, k=${k}" ;;
    mtp) drafter_phrase="drafter the checkpoint's MTP head, k=${k}" ;;
    *) drafter_phrase="no drafter (SPEC=off)" ;;
  esac
  if [[ ${ENFORCE_EAGER} == 1 ]]; then
    mode="eager"
  else
    capture_sizes
    mode="CUDA graphs (capture ${REPLY})"
  fi
  gib "${KV_CACHE_MEMORY_BYTES}"
  REPLY="model ${model}, ${drafter_phrase}, context ${MAX_MODEL_LEN}, ${MAX_NUM_SEQS} seqs, ${mode}, KV pin ${KV_CACHE_MEMORY_BYTES} bytes (${REPLY} GiB ${KV_CACHE_DTYPE}), image ${IMAGE}, nodes ${NODE_LIST[*]} (TP=${TP})"
}
