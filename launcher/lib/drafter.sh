# shellcheck shell=bash
# shellcheck disable=SC2034,SC2153  # globals read by other libs; knobs assigned by name in settings.sh
# Which drafter a run serves, where its snapshot and derived directory are, and fetching it.

DRAFTER_NAME=""
DRAFTER_CATALOG_PIN=""
DRAFTER_PIN=""
DRAFTER_PHRASE=""
DRAFT_SNAPSHOT=""
DRAFT_DIR=""
MODEL_PIN=""

# Fills DRAFTER_NAME, DRAFTER_CATALOG_PIN and DRAFTER_PHRASE from the catalog or the path.
describe_drafter() {
  local name value
  if [[ ${DRAFTER} == /* ]]; then
    DRAFTER_NAME=${DRAFTER}
    DRAFTER_PHRASE="${DRAFTER} (local; prepare-drafter reads its licence from the model card)"
    return 0
  fi
  while IFS='=' read -r name value; do
    case ${name} in
      repo_id) DRAFTER_NAME=${value} ;;
      revision) DRAFTER_CATALOG_PIN=${value} ;;
      startup) DRAFTER_PHRASE=${value} ;;
      *) ;;
    esac
  done < <(python3 "${LAUNCHER_DIR}/drafter_info.py" "${DRAFTER}" "${DRAFTER_WINDOW}")
  helper_status "$!" drafter_info.py
}

# Snapshot and derived directory (container paths) once the pin is known.
drafter_paths() {
  if [[ ${DRAFTER} == /* ]]; then
    DRAFTER_PIN=local
    DRAFT_SNAPSHOT=${DRAFTER}
    local sum
    sum=$(printf '%s' "${DRAFTER}" | cksum)
    DRAFT_DIR=${CONTAINER_HF_HOME}/glm53-drafters/local-${sum%% *}
  else
    DRAFT_SNAPSHOT=${CONTAINER_HF_HOME}/hub/models--${DRAFTER_NAME//\//--}/snapshots/${DRAFTER_PIN}
    DRAFT_DIR=${CONTAINER_HF_HOME}/glm53-drafters/${DRAFTER}-${DRAFTER_PIN}
  fi
}

# Sets MODEL_PIN and DRAFTER_PIN; RESOLVE=1 asks the Hub for what is not pinned yet,
# otherwise an unknown pin stays the DRY_RUN placeholder.
settle_pins() {
  local resolve=$1
  MODEL_PIN=""
  if [[ ${MODEL} != /* ]]; then
    known_pin "${MODEL}" "${MODEL_REVISION}" "${KNOWN_MODEL_PINS[${MODEL}]:-}"
    MODEL_PIN=${REPLY:-${UNPINNED}}
    if [[ -z ${REPLY} && ${resolve} == 1 ]]; then
      resolve_and_record_pin "${MODEL}"
      MODEL_PIN=${REPLY}
    fi
  fi
  [[ ${SPEC} == dflash2 ]] || return 0
  if [[ ${DRAFTER} != /* ]]; then
    known_pin "${DRAFTER_NAME}" "${DRAFTER_REVISION}" "${DRAFTER_CATALOG_PIN}"
    DRAFTER_PIN=${REPLY:-${UNPINNED}}
    if [[ -z ${REPLY} && ${resolve} == 1 ]]; then
      resolve_and_record_pin "${DRAFTER_NAME}"
      DRAFTER_PIN=${REPLY}
    fi
  fi
  drafter_paths
}

# Fetches the pinned drafter on every node and derives the directory vLLM loads; the
# head's prepare-drafter summary gives the start-up phrase (licence, window).
prepare_drafter_everywhere() {
  local index summary=""
  [[ ${SPEC} == dflash2 ]] || return 0
  for index in "${!NODE_LIST[@]}"; do
    node_label "${index}"
    if [[ ${DRAFTER} != /* ]]; then
      say "fetching ${DRAFTER_NAME}@${DRAFTER_PIN} on ${REPLY}"
      fetch_snapshot_argv "${DRAFTER_NAME}" "${DRAFTER_PIN}"
      on_node "${index}" "${CMD[@]}" >/dev/null || die "fetching ${DRAFTER_NAME}@${DRAFTER_PIN} failed on ${REPLY}"
    fi
    say "preparing the drafter on ${REPLY}"
    prepare_drafter_argv
    summary=$(on_node "${index}" "${CMD[@]}") || die "prepare-drafter refused ${DRAFT_SNAPSHOT} on ${REPLY}"
    ((index == 0)) || continue
    DRAFTER_PHRASE=$(python3 -c 'import json, sys; print(json.loads(sys.stdin.read())["startup"])' <<<"${summary}") \
      || die "prepare-drafter printed no start-up phrase: ${summary}"
  done
}

# DRY_RUN: the pin, fetch and prepare commands, unresolved pins shown as a placeholder.
show_pins_and_drafter() {
  local index
  if [[ ${MODEL_PIN} == "${UNPINNED}" ]]; then
    printf '# only once: resolve %s to a commit on the head and record it in %s\n' "${MODEL}" "${PINS_FILE}"
    resolve_revision_argv "${MODEL}"
    show_on_node 0 "${CMD[@]}"
  fi
  [[ ${SPEC} == dflash2 ]] || return 0
  if [[ ${DRAFTER_PIN} == "${UNPINNED}" ]]; then
    printf '# only once: resolve %s to a commit on the head and record it in %s\n' "${DRAFTER_NAME}" "${PINS_FILE}"
    resolve_revision_argv "${DRAFTER_NAME}"
    show_on_node 0 "${CMD[@]}"
  fi
  printf '# drafter: fetch it at its pin and derive %s on every node\n' "${DRAFT_DIR}"
  for index in "${!NODE_LIST[@]}"; do
    if [[ ${DRAFTER} != /* ]]; then
      fetch_snapshot_argv "${DRAFTER_NAME}" "${DRAFTER_PIN}"
      show_on_node "${index}" "${CMD[@]}"
    fi
    prepare_drafter_argv
    show_on_node "${index}" "${CMD[@]}"
  done
}
