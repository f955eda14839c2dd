# shellcheck shell=bash
# shellcheck disable=SC2153  # knobs are assigned by name in load_settings (settings.sh)
# Starting, watching and stopping the rank containers (glm53-rank<N>, one per node).

readonly PROGRESS_EVERY_SECONDS=30
readonly LOG_TAIL_LINES=40

RANKS_STARTED=0
CLUSTER_READY=0
STOP_FAILURES=0
SLEEP_PID=""

# Removes every serve container on every node (also ones a rank left behind); a node that
# cannot be reached is reported and counted in STOP_FAILURES, and the others still stopped.
stop_all_ranks() {
  local index ids
  local -a id_list
  STOP_FAILURES=0
  for index in "${!NODE_LIST[@]}"; do
    serve_containers_argv
    if ! ids=$(on_node "${index}" "${CMD[@]}"); then
      printf 'glm53: could not list containers on %s\n' "${NODE_LIST[index]}" >&2
      STOP_FAILURES=$((STOP_FAILURES + 1))
      continue
    fi
    [[ -n ${ids} ]] || continue
    read -r -d '' -a id_list <<<"${ids}" || true
    if ! on_node "${index}" docker rm --force "${id_list[@]}" >/dev/null; then
      printf 'glm53: could not remove %s on %s\n' "${id_list[*]}" "${NODE_LIST[index]}" >&2
      STOP_FAILURES=$((STOP_FAILURES + 1))
    fi
  done
  RANKS_STARTED=0
}

# Refuses to start over a cluster that is already up, and clears exited leftovers.
check_no_running_ranks() {
  local index names
  for index in "${!NODE_LIST[@]}"; do
    names=$(on_node "${index}" docker ps --filter "label=${SERVE_LABEL}" --format '{{.Names}}') \
      || die "cannot reach Docker on ${NODE_LIST[index]}"
    [[ -z ${names} ]] || die "already running on ${NODE_LIST[index]}: ${names//$'\n'/ }; run ./stop.sh first"
  done
  stop_all_ranks
}

# Every node needs the cache directory (a bind mount's source must exist) and, when set,
# the token file at the same path.
prepare_nodes() {
  local index
  for index in "${!NODE_LIST[@]}"; do
    on_node "${index}" mkdir -p "${HF_CACHE}" || die "cannot create HF_CACHE=${HF_CACHE} on ${NODE_LIST[index]}"
    if [[ -n ${HF_TOKEN_FILE} ]] && ! on_node "${index}" test -r "${HF_TOKEN_FILE}"; then
      refuse HF_TOKEN_FILE "${HF_TOKEN_FILE}" "not a readable file on ${NODE_LIST[index]}; accepted: the token file at this path on every node, or empty"
    fi
  done
}

show_prepare_nodes() {
  local index
  printf '# every node: the cache directory%s\n' "${HF_TOKEN_FILE:+ and a readable token file}"
  for index in "${!NODE_LIST[@]}"; do
    show_on_node "${index}" mkdir -p "${HF_CACHE}"
    [[ -z ${HF_TOKEN_FILE} ]] || show_on_node "${index}" test -r "${HF_TOKEN_FILE}"
  done
}

# Every node: this image's JIT cache directory. stop.sh leaves it, so the next boot of
# the same image skips the kernel builds; a new image ID gets a new directory.
prepare_jit_cache() {
  local index dir
  [[ -n ${JIT_CACHE} ]] || return 0
  jit_dir
  dir=${REPLY}
  for index in "${!NODE_LIST[@]}"; do
    on_node "${index}" mkdir -p "${dir}" || die "cannot create the JIT cache ${dir} on ${NODE_LIST[index]}"
  done
  say "JIT cache: ${dir} on every node"
}

show_jit_cache() {
  local index dir
  [[ -n ${JIT_CACHE} ]] || return 0
  printf '# every node: the JIT cache directory of this image (JIT_CACHE/<image ID>, kept by stop.sh)\n'
  jit_dir
  dir=${REPLY}
  for index in "${!NODE_LIST[@]}"; do
    show_on_node "${index}" mkdir -p "${dir}"
  done
}

start_ranks() {
  local index
  RANKS_STARTED=1
  for index in "${!NODE_LIST[@]}"; do
    serve_container_argv "${index}"
    node_label "${index}"
    say "starting rank ${index} on ${REPLY}"
    on_node "${index}" "${CMD[@]}" >/dev/null || die "docker run failed for rank ${index} on ${NODE_LIST[index]}"
  done
}

# Fails when rank INDEX's container is not running; REPLY is its status.
rank_running() {
  container_status_argv "$1"
  REPLY=$(on_node "$1" "${CMD[@]}" 2>/dev/null) || REPLY=missing
  [[ ${REPLY} == running ]]
}

report_dead_rank() {
  local index=$1 status=$2 container
  rank_container "${index}"
  container=${REPLY}
  printf 'glm53: last %d log lines of %s on %s:\n' "${LOG_TAIL_LINES}" "${container}" "${NODE_LIST[index]}" >&2
  on_node "${index}" docker logs --tail "${LOG_TAIL_LINES}" "${container}" >&2 2>&1 || true
  stop_memory_guard
  stop_all_ranks
  die "rank ${index} (${container} on ${NODE_LIST[index]}) is ${status} before the API answered; every rank was stopped"
}

# Sleeps SECONDS so that a signal (the memory guard's USR1) is handled at once.
guarded_sleep() {
  sleep "$1" &
  SLEEP_PID=$!
  wait "${SLEEP_PID}" || true
  SLEEP_PID=""
}

api_ready() {
  api_probe_argv
  "${CMD[@]}"
}

# Polls the API while every rank's container is watched; a dead rank stops all of them.
# (run.sh only: it also sources memguard.sh, whose guard runs during this wait.)
wait_until_ready() {
  local index start now last_report=-${PROGRESS_EVERY_SECONDS}
  start=${SECONDS}
  while true; do
    for index in "${!NODE_LIST[@]}"; do
      rank_running "${index}" || report_dead_rank "${index}" "${REPLY}"
    done
    if api_ready; then
      CLUSTER_READY=1
      say "ready: http://${NODE_LIST[0]}:${PORT}/v1 after $((SECONDS - start)) s; ./stop.sh stops every rank"
      return 0
    fi
    now=$((SECONDS - start))
    if ((now >= READY_TIMEOUT)); then
      stop_memory_guard
      stop_all_ranks
      die "the API did not answer within READY_TIMEOUT=${READY_TIMEOUT} s; every rank was stopped"
    fi
    if ((now - last_report >= PROGRESS_EVERY_SECONDS)); then
      say "waiting for http://127.0.0.1:${PORT}/v1/models: ${now} s, all ${#NODE_LIST[@]} ranks running"
      last_report=${now}
    fi
    guarded_sleep "${POLL_SECONDS}"
  done
}

# EXIT trap: a run that started ranks and did not reach ready leaves none behind.
stop_if_half_started() {
  local status=$?
  stop_memory_guard
  if [[ ${RANKS_STARTED} == 1 && ${CLUSTER_READY} != 1 ]]; then
    printf 'glm53: start-up did not finish; stopping every rank\n' >&2
    stop_all_ranks
  fi
  return "${status}"
}

# DRY_RUN: what stop_all_ranks runs.
show_stop_all_ranks() {
  local index
  for index in "${!NODE_LIST[@]}"; do
    serve_containers_argv
    show_on_node "${index}" "${CMD[@]}"
    show_on_node "${index}" docker rm --force '<listed-ids>'
  done
}

show_running_check() {
  local index
  printf '# refuse if a %s container is running on any node; then remove exited ones\n' "${SERVE_LABEL}"
  for index in "${!NODE_LIST[@]}"; do
    show_on_node "${index}" docker ps --filter "label=${SERVE_LABEL}" --format '{{.Names}}'
  done
  show_stop_all_ranks
}

show_ranks() {
  local index
  printf '# start one rank per node, head first\n'
  for index in "${!NODE_LIST[@]}"; do
    serve_container_argv "${index}"
    show_on_node "${index}" "${CMD[@]}"
  done
  show_memory_guard
  printf '# wait: poll the API every %s s (up to %s s) while every rank is running; a dead rank stops all\n' \
    "${POLL_SECONDS}" "${READY_TIMEOUT}"
  api_probe_argv
  show_on_node 0 "${CMD[@]}"
  for index in "${!NODE_LIST[@]}"; do
    container_status_argv "${index}"
    show_on_node "${index}" "${CMD[@]}"
  done
}
