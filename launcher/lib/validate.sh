# shellcheck shell=bash
# shellcheck disable=SC2034,SC2153  # globals read by other libs; knobs assigned by name in settings.sh
# Every knob is checked before anything runs; a bad value is refused in one line.

readonly HEX40_RE='^[0-9a-f]{40}$'
readonly REPO_ID_RE='^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$'
readonly HOST_RE='^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$|^[0-9A-Fa-f:]*:[0-9A-Fa-f:.]*$'
readonly IMAGE_RE='^[a-z0-9]+([._/:@-][A-Za-z0-9_]+)*([._-][A-Za-z0-9_]+)*$'
readonly IFACE_RE='^[A-Za-z0-9_.:-]{1,15}$'
readonly HCA_RE='^[=^]?[A-Za-z0-9_.:-]+(,[A-Za-z0-9_.:-]+)*$'

NODE_LIST=()
SSH_WORDS=()
DOCKER_WORDS=()
EXTRA_WORDS=()

require_choice() {
  local name=$1 choice
  shift
  for choice in "$@"; do
    [[ ${!name} == "${choice}" ]] && return 0
  done
  local accepted
  printf -v accepted '%s | ' "$@"
  refuse "${name}" "${!name}" "accepted: ${accepted% | }"
}

# A decimal integer inside [low, high] (no sign, no leading zeros, no spaces).
require_int_in() {
  local name=$1 low=$2 high=$3 why=${4:-}
  local value=${!name}
  if [[ ! ${value} =~ ^(0|[1-9][0-9]{0,17})$ ]] || ((value < low || value > high)); then
    refuse "${name}" "${value}" "${why:+${why}; }accepted: an integer ${low}..${high}"
  fi
}

require_flag() {
  require_choice "$1" 0 1
}

# An absolute path that can go into `docker run --mount` (which splits on commas).
require_mount_path() {
  local name=$1 value=$2
  if [[ ${value} != /* || ${value} == *,* || ${value} =~ [[:cntrl:]] ]]; then
    refuse "${name}" "${!name}" "accepted: an absolute path (~/ allowed) without commas"
  fi
}

# Splits a shell-words setting with launcher/words.py into the named array; a bad quote
# is refused by words.py itself.
split_words() {
  local name=$1 array=$2
  mapfile -d '' -t "${array}" < <(python3 "${LAUNCHER_DIR}/words.py" "${name}" "${!name}")
  helper_status "$!" words.py
}

validate_spec() {
  require_choice SPEC dflash2 mtp off
  require_int_in NUM_SPECULATIVE_TOKENS 1 $((DRAFT_BLOCK_SIZE - 1)) \
    "DFlash2 drafts at most block size ${DRAFT_BLOCK_SIZE} - 1 tokens"
  require_int_in MTP_NUM_SPECULATIVE_TOKENS 1 $((DRAFT_BLOCK_SIZE - 1))
  require_int_in DRAFTER_WINDOW 128 32768 "the fixed window full-attention drafter layers are served at"
  if [[ ${DRAFTER} == /* && (${DRAFTER} == *,* || ${DRAFTER} =~ [[:cntrl:]]) ]]; then
    refuse DRAFTER "${DRAFTER}" "accepted: a catalog key (incoai, dflash2-g) or an absolute path without commas"
  fi
  # The catalog refuses keys it does not know (drafter_info.py lists them).
  describe_drafter
  if [[ -n ${DRAFTER_REVISION} && ! ${DRAFTER_REVISION} =~ ${HEX40_RE} ]]; then
    refuse DRAFTER_REVISION "${DRAFTER_REVISION}" "accepted: a 40-hex commit hash, or empty for the catalog's or the recorded pin"
  fi
}

validate_memory() {
  require_int_in MAX_NUM_SEQS 1 64
  require_flag FORCE_UNSAFE_CTX
  require_flag FORCE_UNSAFE_KV
  if [[ ! ${KV_CACHE_DTYPE} =~ ^(fp8_e4m3|fp8|fp8_e5m2)$ ]]; then
    refuse KV_CACHE_DTYPE "${KV_CACHE_DTYPE}" "the KV pin and the context bound hold for 1-byte fp8 KV only; accepted: fp8_e4m3 | fp8 | fp8_e5m2"
  fi
  require_int_in KV_CACHE_MEMORY_BYTES 1 999999999999
  if ((KV_CACHE_MEMORY_BYTES > PIN_BYTES)) && [[ ${FORCE_UNSAFE_KV} != 1 ]]; then
    refuse KV_CACHE_MEMORY_BYTES "${KV_CACHE_MEMORY_BYTES}" \
      "above the ${PIN_BYTES}-byte pin, 5.0 GiB slowed decode 20-30% and 5.14 GiB crashed (unified memory); accepted: 1..${PIN_BYTES}, or set FORCE_UNSAFE_KV=1"
  fi
  require_int_in MAX_MODEL_LEN 1 999999999
  if ((MAX_MODEL_LEN > PIN_CONTEXT)) && [[ ${FORCE_UNSAFE_CTX} != 1 ]]; then
    refuse MAX_MODEL_LEN "${MAX_MODEL_LEN}" \
      "the ${PIN_BYTES}-byte KV pin holds about 400,497 fp8 tokens, so it cannot hold more than ${PIN_CONTEXT} context; accepted: 1..${PIN_CONTEXT}, or set FORCE_UNSAFE_CTX=1"
  fi
  if [[ -n ${BLOCK_SIZE} ]]; then
    require_choice BLOCK_SIZE 16 32 64 128 256
  fi
  require_flag ENFORCE_EAGER
}

validate_image() {
  [[ ${IMAGE} =~ ${IMAGE_RE} ]] || refuse IMAGE "${IMAGE}" "accepted: a Docker image reference"
  [[ ${BASE_IMAGE} =~ ${IMAGE_RE} ]] || refuse BASE_IMAGE "${BASE_IMAGE}" "accepted: a Docker image reference"
  require_flag FORCE_STOCK_IMAGE
  if [[ ${IMAGE} =~ ^(docker\.io/)?(library/)?vllm/vllm-openai(:|@|$) && ${FORCE_STOCK_IMAGE} != 1 ]]; then
    refuse IMAGE "${IMAGE}" \
      "stock vllm/vllm-openai images lack the v9-v11 layers (DFlash2 backport, Glm5Next tap capture, draft KV group); accepted: ${CHAIN_IMAGE} (scripts/build.sh), or set FORCE_STOCK_IMAGE=1"
  fi
}

validate_model() {
  if [[ ${MODEL} == /* ]]; then
    require_mount_path MODEL "${MODEL}"
    [[ -z ${MODEL_REVISION} ]] \
      || refuse MODEL_REVISION "${MODEL_REVISION}" "a local MODEL directory has no revision; accepted: empty"
    return 0
  fi
  [[ ${MODEL} =~ ${REPO_ID_RE} ]] \
    || refuse MODEL "${MODEL}" "accepted: a Hugging Face repo id (org/name) or an absolute directory"
  if [[ -n ${MODEL_REVISION} && ! ${MODEL_REVISION} =~ ${HEX40_RE} ]]; then
    refuse MODEL_REVISION "${MODEL_REVISION}" "accepted: a 40-hex commit hash, or empty to resolve once and pin"
  fi
}

validate_nodes() {
  local node seen=" "
  read -r -a NODE_LIST <<<"${NODES//[,$'\n']/ }"
  ((${#NODE_LIST[@]} > 0)) \
    || refuse_unset NODES "set the node addresses, head first (e.g. NODES=\"<head> <worker>\" in cluster.env; see cluster.env.example)"
  ((${#NODE_LIST[@]} <= 16)) || refuse NODES "${NODES}" "accepted: 1 to 16 addresses"
  for node in "${NODE_LIST[@]}"; do
    [[ ${node} =~ ${HOST_RE} ]] \
      || refuse NODES "${NODES}" "'${node}' is not a host name or address; accepted: addresses separated by spaces or commas, head first"
    [[ ${seen} != *" ${node} "* ]] || refuse NODES "${NODES}" "'${node}' is listed twice; accepted: distinct addresses"
    seen+="${node} "
  done
  if [[ -z ${TP} ]]; then
    TP=${#NODE_LIST[@]}
  elif [[ ! ${TP} =~ ^[1-9][0-9]{0,3}$ ]] || ((TP % ${#NODE_LIST[@]} != 0)); then
    refuse TP "${TP}" "accepted: a multiple of the node count ${#NODE_LIST[@]} (each node runs TP / nodes ranks), or empty for the node count"
  fi
}

validate_network() {
  require_int_in PORT 1024 65535
  require_int_in MASTER_PORT 1024 65535
  ((PORT != MASTER_PORT)) || refuse MASTER_PORT "${MASTER_PORT}" "equals PORT; accepted: a different port"
  ((${#NODE_LIST[@]} > 1)) || return 0
  [[ -n ${IFACE} ]] \
    || refuse_unset IFACE "NCCL and Gloo need the node-to-node network interface, the same name on every node (see \`ip -br addr\`; set IFACE in cluster.env)"
  [[ ${IFACE} =~ ${IFACE_RE} ]] || refuse IFACE "${IFACE}" "accepted: a network interface name"
  [[ -n ${HCA} ]] \
    || refuse_unset HCA "NCCL needs the RDMA device of the node-to-node link (see \`ibdev2netdev\` or /sys/class/infiniband; set HCA in cluster.env)"
  [[ ${HCA} =~ ${HCA_RE} ]] || refuse HCA "${HCA}" "accepted: an NCCL_IB_HCA list such as <device>[,<device>]"
}

validate_paths() {
  require_mount_path HF_CACHE "$(expand_path "${HF_CACHE}")"
  HF_CACHE=$(expand_path "${HF_CACHE}")
  if [[ -n ${HF_TOKEN_FILE} ]]; then
    require_mount_path HF_TOKEN_FILE "$(expand_path "${HF_TOKEN_FILE}")"
    HF_TOKEN_FILE=$(expand_path "${HF_TOKEN_FILE}")
  fi
  PINS_FILE=$(expand_path "${PINS_FILE}" "${ROOT_DIR}")
}

validate_words() {
  split_words SSH SSH_WORDS
  [[ -n ${SSH_WORDS[0]:-} ]] || refuse SSH "${SSH}" "accepted: a remote-exec command such as ssh -o BatchMode=yes"
  split_words DOCKER_ARGS DOCKER_WORDS
  split_words EXTRA_ARGS EXTRA_WORDS
  validate_extra_words
}

# Flags the launcher sets from knobs; EXTRA_ARGS may not set them a second time, not even
# by an argparse prefix (the seed's --kv-cache-memory was one).
readonly MANAGED_FLAGS=(--speculative-config --compilation-config --enforce-eager
  --max-model-len --max-num-seqs --kv-cache-dtype --kv-cache-memory-bytes --block-size
  --tensor-parallel-size --nnodes --node-rank --master-addr --master-port
  --distributed-executor-backend --headless --port --revision)

validate_extra_words() {
  local word flag managed
  for word in "${EXTRA_WORDS[@]}"; do
    [[ ${word} == --?* ]] || continue
    flag=${word%%=*}
    for managed in "${MANAGED_FLAGS[@]}"; do
      if [[ ${managed} == "${flag}"* ]]; then
        refuse EXTRA_ARGS "${EXTRA_ARGS}" "${flag} would override ${managed}, which the launcher sets from its knobs; accepted: other vllm serve flags"
      fi
    done
  done
}

validate_run_control() {
  require_flag DRY_RUN
  require_int_in READY_TIMEOUT 1 86400
  require_int_in POLL_SECONDS 1 60
}

validate_settings() {
  validate_run_control
  validate_spec
  validate_memory
  validate_image
  validate_model
  validate_nodes
  validate_network
  validate_paths
  validate_words
}
