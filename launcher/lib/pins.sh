# shellcheck shell=bash
# shellcheck disable=SC2153  # knobs are assigned by name in load_settings (settings.sh)
# Pinned revisions: the model and the drafter are fetched at a commit, never at a branch.
# The pin comes from the knob, else the drafter catalog, else PINS_FILE (git-ignored,
# written by the first run that resolved it).

readonly PIN_LINE_RE='^([^[:space:]]+)[[:space:]]+([0-9a-f]{40})$'

# Sets REPLY to the recorded pin of REPO, or empty.
recorded_pin() {
  local repo=$1 line number=0
  REPLY=""
  [[ -f ${PINS_FILE} ]] || return 0
  # shellcheck disable=SC2094  # refuse only names the file, it does not write it
  while IFS= read -r line || [[ -n ${line} ]]; do
    number=$((number + 1))
    [[ ${line} =~ ^[[:space:]]*(#|$) ]] && continue
    [[ ${line} =~ ${PIN_LINE_RE} ]] \
      || refuse PINS_FILE "${PINS_FILE}" "line ${number} reads '${line}'; accepted: lines '<repo id> <40-hex commit>'"
    [[ ${BASH_REMATCH[1]} != "${repo}" ]] || REPLY=${BASH_REMATCH[2]}
  done <"${PINS_FILE}"
}

# Sets REPLY to the pin of REPO from OVERRIDE, CATALOG or PINS_FILE; empty when unknown.
known_pin() {
  local repo=$1 override=$2 catalog_pin=$3
  if [[ -n ${override} ]]; then
    REPLY=${override}
  elif [[ -n ${catalog_pin} ]]; then
    REPLY=${catalog_pin}
  else
    recorded_pin "${repo}"
  fi
}

# Asks the Hub (from inside the serving image on the head) for REPO's current commit,
# records it in PINS_FILE and says so; REPLY is the commit.
resolve_and_record_pin() {
  local repo=$1 output sha
  resolve_revision_argv "${repo}"
  output=$(on_node 0 "${CMD[@]}") || die "could not resolve the revision of ${repo} (is the Hub reachable and HF_TOKEN_FILE set for gated repos?)"
  sha=${output##*$'\n'}
  [[ ${sha} =~ ${HEX40_RE} ]] || die "resolving ${repo} gave '${sha}', not a 40-hex commit"
  mkdir -p "$(dirname "${PINS_FILE}")"
  printf '%s %s\n' "${repo}" "${sha}" >>"${PINS_FILE}"
  say "pinned ${repo} at ${sha} (recorded in ${PINS_FILE}; delete the line to re-resolve)"
  REPLY=${sha}
}
