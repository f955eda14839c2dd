# shellcheck shell=bash
# shellcheck disable=SC2034,SC2153  # globals read by other libs; knobs assigned by name in settings.sh
# Every knob is checked before anything runs; a bad value is refused in one line.

readonly HEX40_RE='^[0-9a-f]{40}$'
readonly REPO_ID_RE='^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$'
readonly HOST_RE='^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$|^[0-9A-Fa-f:]*:[0-9A-Fa-f:.]*$'
readonly IMAGE_RE='^[a-z0-9]+([._/:@-][A-Za-z0-9_]+)*([._-][A-Za-z0-9_]+)*$'
readonly IFACE_RE='^[A-Za-z0-9_.:-]{1,15}$'
readonly HCA_RE='^[=^]?[A-Za-z0-9_.:-]+(,[A-Za-z0-9_.:-]+)*$'
readonly OCTET='(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])'
readonly IPV4_RE="^(${OCTET}\\.){3}${OCTET}\$"
readonly IPV6_RE='^[0-9A-Fa-f:]*:[0-9A-Fa-f:.]*$'
readonly FRACTION_RE='^(0\.[0-9]{1,4}|1(\.0{1,4})?)$'
readonly DECIMAL_RE='^(0|[1-9][0-9]{0,5})(\.[0-9]{1,3})?$'
readonly NAME_TOKEN_RE='^[a-z0-9][a-z0-9_]*$'
readonly SERVED_NAME_RE='^[A-Za-z0-9][A-Za-z0-9._:/-]*$'
readonly CUDA_ARCH_RE='^[0-9]+\.[0-9]+[a-z]?([ ;][0-9]+\.[0-9]+[a-z]?)*$'
readonly ENV_NAME_RE='^[A-Z_][A-Z0-9_]*$'
# EXTRA_ENV reaches the engines only: names must start with one of these.
readonly EXTRA_ENV_PREFIXES=(VLLM_ NCCL_ GLOO_ UCX_ TORCH_ TORCHINDUCTOR_ PYTORCH_ CUDA_
  NVIDIA_ FLASHINFER_ TRITON_ TILELANG_ DG_ CUTE_DSL_ OMP_)
# A name holding one of these would put a credential in `docker inspect`.
readonly SECRET_NAME_RE='TOKEN|KEY|SECRET|PASSWORD'
# Measured reasons a backend other than marlin is refused (REFERENCE.md, "The seed's deployment").
readonly MOE_WHY="on GB10 flashinfer_cutlass ran out of memory in its JIT after the 90.67 GiB of weights (the seed's run)"
readonly LINEAR_WHY="auto picked a FlashInfer FP4 GEMM that JIT-compiles on sm_121 and six boots collapsed (the seed, September)"

NODE_LIST=()
SSH_WORDS=()
DOCKER_WORDS=()
EXTRA_WORDS=()
EXTRA_ENV_WORDS=()
GENERATION_JSON=""

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

# An empty value means "use the default" (settings.sh), so optional knobs whose default
# is on take `none` to be left out; from here on they are empty.
none_means_empty() {
  local name
  for name in "$@"; do
    [[ ${!name} != none ]] || printf -v "${name}" '%s' ""
  done
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
    require_int_in BLOCK_SIZE 1 1048576 "vLLM takes any block size above 0; 2304 tiles the 64-entry pool pages DeepGEMM's sm_12x fp8 paged MQA accepts"
  fi
  if [[ ! ${GPU_MEMORY_UTILIZATION} =~ ${FRACTION_RE} || ${GPU_MEMORY_UTILIZATION} =~ ^0\.0*$ ]]; then
    refuse GPU_MEMORY_UTILIZATION "${GPU_MEMORY_UTILIZATION}" "accepted: a fraction above 0 and at most 1, up to 4 decimals (the seed ran 0.85)"
  fi
  if [[ -n ${MM_PROCESSOR_CACHE_GB} && ! ${MM_PROCESSOR_CACHE_GB} =~ ${DECIMAL_RE} ]]; then
    refuse MM_PROCESSOR_CACHE_GB "${MM_PROCESSOR_CACHE_GB}" "accepted: GiB as a decimal number such as 1 or 0.5, or empty for vLLM's default (4, too much on unified memory)"
  fi
  require_flag ENFORCE_EAGER
}

# NAME must be marlin unless FORCE is 1; even forced it must look like a backend name.
validate_backend() {
  local name=$1 force=$2 why=$3
  require_flag "${force}"
  if [[ -n ${!name} && ! ${!name} =~ ${NAME_TOKEN_RE} ]]; then
    refuse "${name}" "${!name}" "accepted: a vLLM backend name such as marlin"
  fi
  if [[ ${!name} != marlin && ${!force} != 1 ]]; then
    refuse "${name}" "${!name}" "${why}; accepted: marlin, or set ${force}=1"
  fi
}

validate_chat() {
  local name
  for name in TOOL_CALL_PARSER REASONING_PARSER; do
    if [[ -n ${!name} && ! ${!name} =~ ${NAME_TOKEN_RE} ]]; then
      refuse "${name}" "${!name}" "accepted: a vLLM parser name such as glm47 or glm45, or empty to leave it out"
    fi
  done
  require_flag THINKING
  if [[ -n ${SERVED_MODEL_NAME} && ! ${SERVED_MODEL_NAME} =~ ${SERVED_NAME_RE} ]]; then
    refuse SERVED_MODEL_NAME "${SERVED_MODEL_NAME}" "accepted: letters, digits and . _ : / - (no spaces), or empty to serve under MODEL"
  fi
  [[ -z ${MAX_NEW_TOKENS} ]] || require_int_in MAX_NEW_TOKENS 1 999999999 "the server-wide ceiling on output tokens per request"
  # generation_config.py refuses a bad object itself and prints the merged JSON.
  GENERATION_JSON=$(python3 "${LAUNCHER_DIR}/generation_config.py" "${MAX_NEW_TOKENS}" "${GENERATION_CONFIG}") \
    || { (($? == 2)) && exit 2; die "launcher/generation_config.py failed; is python3 3.8 or newer on PATH?"; }
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
    if ((${#NODE_LIST[@]} > 1)) && [[ ! ${node} =~ ${IPV4_RE} && ! ${node} =~ ${IPV6_RE} ]]; then
      refuse NODES "${NODES}" "'${node}' is a name; with two or more nodes each entry is that node's address on the link (it becomes VLLM_HOST_IP and --master-addr); accepted: IPv4 or IPv6 addresses"
    fi
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

validate_engine_env() {
  require_choice NCCL_DEBUG_LEVEL VERSION WARN INFO TRACE
  [[ ${CUDA_ARCH_LIST} =~ ${CUDA_ARCH_RE} ]] \
    || refuse CUDA_ARCH_LIST "${CUDA_ARCH_LIST}" "accepted: a TORCH_CUDA_ARCH_LIST value such as 12.1a (GB10 is sm_121)"
  require_int_in ENGINE_READY_TIMEOUT 60 86400 "seconds vLLM waits for its engine; a GB10 boot takes 15-21 minutes"
}

validate_paths() {
  require_mount_path HF_CACHE "$(expand_path "${HF_CACHE}")"
  HF_CACHE=$(expand_path "${HF_CACHE}")
  if [[ -n ${HF_TOKEN_FILE} ]]; then
    require_mount_path HF_TOKEN_FILE "$(expand_path "${HF_TOKEN_FILE}")"
    HF_TOKEN_FILE=$(expand_path "${HF_TOKEN_FILE}")
  fi
  if [[ -n ${JIT_CACHE} ]]; then
    require_mount_path JIT_CACHE "$(expand_path "${JIT_CACHE}")"
    JIT_CACHE=$(expand_path "${JIT_CACHE}")
  fi
  PINS_FILE=$(expand_path "${PINS_FILE}" "${ROOT_DIR}")
  [[ -n ${RUNS_DIR} && ! ${RUNS_DIR} =~ [[:cntrl:]] ]] \
    || refuse RUNS_DIR "${RUNS_DIR}" "accepted: a directory (relative to the repository, or absolute)"
  RUNS_DIR=$(expand_path "${RUNS_DIR}" "${ROOT_DIR}")
}

validate_words() {
  split_words SSH SSH_WORDS
  [[ -n ${SSH_WORDS[0]:-} ]] || refuse SSH "${SSH}" "accepted: a remote-exec command such as ssh -o BatchMode=yes"
  split_words DOCKER_ARGS DOCKER_WORDS
  split_words EXTRA_ARGS EXTRA_WORDS
  validate_extra_words
  split_words EXTRA_ENV EXTRA_ENV_WORDS
  validate_extra_env
}

# Flags the launcher sets, and the setting each comes from ("fixed": part of the seed's
# verified run). EXTRA_ARGS may not set them a second time, not even by an argparse prefix
# (the seed's --kv-cache-memory was one) or a --no- negation.
readonly -A MANAGED_FLAGS=(
  ["--speculative-config"]="SPEC, DRAFTER and NUM_SPECULATIVE_TOKENS"
  ["--compilation-config"]="ENFORCE_EAGER (capture sizes from k and MAX_NUM_SEQS)"
  ["--enforce-eager"]=ENFORCE_EAGER ["--max-model-len"]=MAX_MODEL_LEN ["--max-num-seqs"]=MAX_NUM_SEQS
  ["--kv-cache-dtype"]=KV_CACHE_DTYPE ["--kv-cache-memory-bytes"]=KV_CACHE_MEMORY_BYTES
  ["--block-size"]=BLOCK_SIZE ["--gpu-memory-utilization"]=GPU_MEMORY_UTILIZATION
  ["--moe-backend"]=MOE_BACKEND ["--linear-backend"]=LINEAR_BACKEND
  ["--mm-processor-cache-gb"]=MM_PROCESSOR_CACHE_GB
  ["--override-generation-config"]="MAX_NEW_TOKENS and GENERATION_CONFIG"
  ["--tool-call-parser"]=TOOL_CALL_PARSER ["--enable-auto-tool-choice"]=TOOL_CALL_PARSER
  ["--reasoning-parser"]=REASONING_PARSER ["--default-chat-template-kwargs"]=THINKING
  ["--served-model-name"]=SERVED_MODEL_NAME ["--trust-remote-code"]=fixed ["--host"]=fixed
  ["--tensor-parallel-size"]=TP ["--nnodes"]=NODES ["--node-rank"]=NODES ["--master-addr"]=NODES
  ["--master-port"]=MASTER_PORT ["--distributed-executor-backend"]=fixed ["--headless"]=NODES
  ["--port"]=PORT ["--revision"]=MODEL_REVISION
)

# "set it with KNOB" or "fixed": the end of a refusal that names what owns a setting.
owner_phrase() {
  if [[ $1 == fixed ]]; then
    REPLY="a fixed part of the seed's verified run (README, launcher section)"
  else
    REPLY="set from ${1}; set that instead"
  fi
}

validate_extra_words() {
  local word flag managed
  for word in "${EXTRA_WORDS[@]}"; do
    [[ ${word} == --?* ]] || continue
    flag=${word%%=*}
    [[ ${flag} != --no-?* ]] || flag=--${flag#--no-}
    for managed in "${!MANAGED_FLAGS[@]}"; do
      if [[ ${managed} == "${flag}"* ]]; then
        owner_phrase "${MANAGED_FLAGS[${managed}]}"
        refuse EXTRA_ARGS "${EXTRA_ARGS}" "${word%%=*} would override ${managed}, which the launcher sets: ${REPLY}"
      fi
    done
  done
}

# EXTRA_ENV: NAME=VALUE words for the rank containers, engine variables only. A refusal
# shows the offending word alone (a secret-looking one without its value).
validate_extra_env() {
  local word name prefix
  for word in "${EXTRA_ENV_WORDS[@]}"; do
    name=${word%%=*}
    if [[ ${word} != *=* || ! ${name} =~ ${ENV_NAME_RE} ]]; then
      refuse EXTRA_ENV "${word}" "not NAME=VALUE with an environment variable name; accepted: NAME=VALUE words, NAME in capitals"
    fi
    if [[ ${name} =~ ${SECRET_NAME_RE} ]]; then
      refuse EXTRA_ENV "${name}=<hidden>" "${name} looks like a credential (holds TOKEN, KEY, SECRET or PASSWORD) and would show in docker inspect; accepted: engine settings only (the Hub token goes in HF_TOKEN_FILE)"
    fi
    if [[ -n ${LAUNCHER_ENV[${name}]:-} ]]; then
      owner_phrase "${LAUNCHER_ENV[${name}]}"
      refuse EXTRA_ENV "${word}" "the launcher sets ${name}: ${REPLY}"
    fi
    for prefix in "${EXTRA_ENV_PREFIXES[@]}"; do
      [[ ${name} != "${prefix}"* ]] || continue 2
    done
    refuse EXTRA_ENV "${word}" "${name} is not an engine variable; accepted: names starting with ${EXTRA_ENV_PREFIXES[*]}"
  done
}

validate_guard() {
  local name
  require_flag MEM_GUARD
  require_int_in MEM_SAMPLES_PER_SECOND 1 20
  for name in MEM_FLOOR_LOAD_GIB MEM_FLOOR_PROFILE_GIB MEM_FLOOR_KV_READY_GIB MEM_FLOOR_SERVING_GIB; do
    require_int_in "${name}" 0 1024 "GiB of MemAvailable below which the guard stops every rank (0: no floor)"
  done
}

validate_run_control() {
  require_flag DRY_RUN
  require_int_in READY_TIMEOUT 1 86400
  require_int_in POLL_SECONDS 1 60
}

validate_settings() {
  none_means_empty BLOCK_SIZE MM_PROCESSOR_CACHE_GB MAX_NEW_TOKENS SERVED_MODEL_NAME \
    TOOL_CALL_PARSER REASONING_PARSER JIT_CACHE
  validate_run_control
  validate_spec
  validate_memory
  validate_backend MOE_BACKEND FORCE_UNSAFE_MOE "${MOE_WHY}"
  validate_backend LINEAR_BACKEND FORCE_UNSAFE_LINEAR "${LINEAR_WHY}"
  validate_chat
  validate_image
  validate_model
  validate_nodes
  validate_network
  validate_engine_env
  validate_paths
  validate_words
  validate_guard
}
