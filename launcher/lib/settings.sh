# shellcheck shell=bash
# shellcheck disable=SC2034  # constants and globals here are read by the other libs
# Settings: environment first, then cluster.env, then launcher/defaults.env.
# Values are read literally (never sourced or eval'ed), so JSON, quotes and spaces survive.

readonly CONTAINER_HF_HOME=/root/.cache/huggingface
# Where a rank sees its node's JIT cache directory (JIT_CACHE/<image id> on the host).
readonly CONTAINER_JIT_DIR=/var/cache/glm53-jit
readonly CONTAINER_TOKEN_PATH=/run/secrets/hf_token
readonly IN_IMAGE_PREPARE_DRAFTER=/opt/glm53-recipe/scripts/prepare-drafter
readonly CHAIN_IMAGE=glm53-sm121-v11
readonly FORK_IMAGE=vllm/vllm-openai:glm53-flash-arm64-cu130
# The verified KV pin and the context it holds with 1-byte fp8 KV (seed PR, measured).
readonly PIN_BYTES=4445787956
readonly PIN_CONTEXT=327680
# Checkpoints whose commit is known: the seed's verified run (REFERENCE.md, "The seed's
# deployment"). Kept here, not as MODEL_REVISION's default, so that another MODEL never
# inherits this commit.
readonly -A KNOWN_MODEL_PINS=(
  ["LibertAIDAI/GLM-5.3-Flash-NVFP4"]=aa28e1f54130286c95fee10d0705c74ce8743734
)
# Both published drafters train blocks of 8 (dflash_config.block_size); k stops one short.
readonly DRAFT_BLOCK_SIZE=8

KNOB_NAMES=()

# One line naming the variable, its value and what is accepted; exit 2.
refuse() {
  local name=$1 value=$2 why=$3
  value=${value//$'\n'/\\n}
  printf 'refused: %s=%s: %s\n' "${name}" "${value}" "${why}" >&2
  exit 2
}

# A required setting with no value: name it and say where to set it.
refuse_unset() {
  printf 'refused: %s is unset: %s\n' "$1" "$2" >&2
  exit 2
}

die() {
  printf 'glm53: %s\n' "$*" >&2
  exit 1
}

# Waits for a helper started in a process substitution: its exit 2 is a refusal it has
# already printed; anything else is a failure to name here.
helper_status() {
  local pid=$1 helper=$2 status=0
  wait "${pid}" || status=$?
  ((status == 0)) && return 0
  ((status == 2)) && exit 2
  die "launcher/${helper} failed (exit ${status}); is python3 3.8 or newer on PATH?"
}

say() {
  printf 'glm53: %s\n' "$*"
}

# Emits NAME and VALUE, NUL-terminated, for every NAME=VALUE line of a settings file.
read_setting_file() {
  local file=$1 line name value number=0
  while IFS= read -r line || [[ -n ${line} ]]; do
    number=$((number + 1))
    [[ ${line} =~ ^[[:space:]]*(#|$) ]] && continue
    if [[ ! ${line} =~ ^[[:space:]]*([A-Z_][A-Z0-9_]*)=(.*)$ ]]; then
      printf 'refused: %s line %d: %s: accepted: NAME=VALUE lines and # comments\n' \
        "${file}" "${number}" "${line}" >&2
      exit 2
    fi
    name=${BASH_REMATCH[1]}
    value=${BASH_REMATCH[2]}
    printf '%s\0%s\0' "${name}" "${value}"
  done <"${file}"
}

# cluster.env may wrap a value in one pair of quotes out of habit; drop them.
strip_outer_quotes() {
  local value=$1
  if [[ ${value} =~ ^\"(.*)\"$ || ${value} =~ ^\'(.*)\'$ ]]; then
    value=${BASH_REMATCH[1]}
  fi
  printf '%s' "${value}"
}

is_knob() {
  local candidate=$1 name
  for name in "${KNOB_NAMES[@]}"; do
    [[ ${name} == "${candidate}" ]] && return 0
  done
  return 1
}

# Fills every knob: a non-empty environment value wins, then cluster.env, then the default.
# An empty value counts as unset (testing and assigning keeps JSON defaults intact).
load_settings() {
  local defaults_file=$1 cluster_file=$2 name value
  local -A defaults=()
  KNOB_NAMES=()
  while IFS= read -r -d '' name && IFS= read -r -d '' value; do
    KNOB_NAMES+=("${name}")
    defaults[${name}]=${value}
  done < <(read_setting_file "${defaults_file}")
  wait "$!" || exit 2
  if [[ -f ${cluster_file} ]]; then
    while IFS= read -r -d '' name && IFS= read -r -d '' value; do
      is_knob "${name}" \
        || refuse "${name}" "${value}" "in ${cluster_file}, not a launcher setting; accepted: the names in launcher/defaults.env"
      [[ -n ${!name-} ]] || printf -v "${name}" '%s' "$(strip_outer_quotes "${value}")"
    done < <(read_setting_file "${cluster_file}")
    # A malformed line was refused inside the substitution; stop here too.
    wait "$!" || exit 2
  fi
  for name in "${KNOB_NAMES[@]}"; do
    [[ -n ${!name-} ]] || printf -v "${name}" '%s' "${defaults[${name}]}"
  done
}

# Expands a leading ~/ to $HOME; with ROOT given, a relative path is taken from ROOT.
expand_path() {
  local path=$1 root=${2:-}
  # The setting is text, so a leading ~/ is matched literally and replaced by $HOME.
  if [[ ${path:0:1} == "~" && ${path:1:1} == / ]]; then
    path=${HOME}/${path:2}
  elif [[ -n ${root} && ${path} != /* ]]; then
    path=${root}/${path}
  fi
  printf '%s' "${path}"
}
