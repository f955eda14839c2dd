# shellcheck shell=bash
# shellcheck disable=SC2034,SC2153  # globals read by other libs; knobs assigned by name in settings.sh
# The commands a run is made of, built as argv arrays from the validated settings.

readonly SERVE_LABEL=glm53.launcher=serve
readonly UNPINNED='<resolved-at-run>'
readonly RESOLVE_CODE='import sys; from huggingface_hub import HfApi; print(HfApi().model_info(sys.argv[1]).sha)'
readonly FETCH_CODE='import sys; from huggingface_hub import snapshot_download; print(snapshot_download(sys.argv[1], revision=sys.argv[2]))'

rank_container() {
  REPLY=glm53-rank$1
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

speculative_config_json() {
  case ${SPEC} in
    dflash2)
      REPLY="{\"method\":\"dflash\",\"model\":\"${DRAFT_DIR}\",\"num_speculative_tokens\":${NUM_SPECULATIVE_TOKENS}}"
      ;;
    mtp) REPLY="{\"method\":\"mtp\",\"num_speculative_tokens\":${MTP_NUM_SPECULATIVE_TOKENS}}" ;;
    *) REPLY="" ;;
  esac
}

# The `vllm serve` argv for RANK (without the `vllm` entry point), into SERVE_ARGV.
vllm_serve_argv() {
  local rank=$1 nodes=${#NODE_LIST[@]}
  SERVE_ARGV=(serve "${MODEL}")
  [[ ${MODEL} == /* ]] || SERVE_ARGV+=(--revision "${MODEL_PIN}")
  ((rank != 0)) || SERVE_ARGV+=(--port "${PORT}")
  SERVE_ARGV+=(--tensor-parallel-size "${TP}" --max-model-len "${MAX_MODEL_LEN}"
    --max-num-seqs "${MAX_NUM_SEQS}" --kv-cache-dtype "${KV_CACHE_DTYPE}"
    --kv-cache-memory-bytes "${KV_CACHE_MEMORY_BYTES}")
  [[ -z ${BLOCK_SIZE} ]] || SERVE_ARGV+=(--block-size "${BLOCK_SIZE}")
  speculative_config_json
  [[ -z ${REPLY} ]] || SERVE_ARGV+=(--speculative-config "${REPLY}")
  if [[ ${ENFORCE_EAGER} == 1 ]]; then
    SERVE_ARGV+=(--enforce-eager)
  else
    capture_sizes
    SERVE_ARGV+=(--compilation-config "{\"cudagraph_capture_sizes\":[${REPLY}]}")
  fi
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

# `docker run` for RANK, into CMD.
serve_container_argv() {
  local rank=$1 name
  rank_container "${rank}"
  name=${REPLY}
  hub_access_argv
  local_dirs_argv
  vllm_serve_argv "${rank}"
  CMD=(docker run --detach --name "${name}" --label "${SERVE_LABEL}"
    --label "glm53.rank=${rank}" --network host --ipc host "${DOCKER_WORDS[@]}"
    "${HUB_ARGV[@]}" "${LOCAL_DIRS_ARGV[@]}")
  if ((${#NODE_LIST[@]} > 1)); then
    CMD+=(--env "NCCL_SOCKET_IFNAME=${IFACE}" --env "GLOO_SOCKET_IFNAME=${IFACE}"
      --env "NCCL_IB_HCA=${HCA}")
  fi
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
