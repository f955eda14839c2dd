# shellcheck shell=bash
# shellcheck disable=SC2034,SC2153  # globals read by other libs; knobs assigned by name in settings.sh
# The unified-memory guard. While run.sh waits for readiness, every node's MemAvailable is
# sampled MEM_SAMPLES_PER_SECOND times a second over SSH and the boot phase is read from
# the rank logs; a node under its phase's floor stops every rank at once (containers and
# logs kept). Each node has one sampler (one ssh running a remote loop) and one reader on
# the head, both in the background, so the readiness loop is never held up by them.

readonly GUARD_PHASES=(load profile kv_ready serving)
# vLLM's own log lines that end a phase (vLLM 0.30.0's workers and engine core, uvicorn):
# weights loaded -> profile; KV cache sized (profiled, or pinned by --kv-cache-memory-bytes)
# -> kv_ready; API up -> serving.
readonly PHASE_MARKER_RE='Model loading took|Available KV cache memory|KV Cache as specified by kv_cache_memory_bytes|KV cache size: |Application startup complete'
readonly MEM_CSV_HEADER=time_unix,elapsed_s,node,phase,mem_available_bytes,floor_bytes
readonly GIB_BYTES=1073741824
# A sampler silent this long is lost: a remote child can keep the pipe open after the
# sampling loop has ended, so end-of-file alone cannot be relied on to say so.
readonly SAMPLER_SILENCE_SECONDS=10

# The remote side, POSIX sh, run as: sh -c SCRIPT memory-sampler CONTAINER MARKER_RE INTERVAL.
# Prints "mem <kB>" every INTERVAL seconds and each phase marker as the rank logs it. The
# log is followed through a FIFO so that its PID is known and killed on the way out; the
# loop ends (and the follower with it) once the head stops reading. Test seam:
# GLM53_MEMINFO names a file read instead of /proc/meminfo.
# One line, so that DRY_RUN prints it as one command.
# shellcheck disable=SC2016  # expanded by the node's shell, not here
SAMPLER_STATEMENTS=(
  'meminfo=${GLM53_MEMINFO:-/proc/meminfo}'
  'work=$(mktemp -d) || exit 1'
  'follower='
  'trap '"'"'kill "$follower" 2>/dev/null; rm -rf "$work"'"'"' EXIT'
  'trap '"'"'exit 0'"'"' HUP INT TERM'
  'mkfifo "$work/log" || exit 1'
  'docker logs --follow "$1" >"$work/log" 2>&1 &'
  'follower=$!'
  'grep --line-buffered -o -E "$2" <"$work/log" &'
  'while awk '"'"'/^MemAvailable:/ { print "mem", $2; found = 1; exit } END { exit !found }'"'"' "$meminfo"; do sleep "$3"; done'
)
SAMPLER_SCRIPT=""
for statement in "${SAMPLER_STATEMENTS[@]}"; do
  # A statement sent to the background ends in & already; the others need a ;.
  [[ ${statement} == *'&' ]] && SAMPLER_SCRIPT+="${statement} " || SAMPLER_SCRIPT+="${statement}; "
done
unset statement
readonly SAMPLER_SCRIPT=${SAMPLER_SCRIPT%; }

GUARD_STATE=""
GUARD_READERS=()
GUARD_SAMPLERS=()
RUN_DIR=""
MEM_CSV=""

# Seconds between samples as a decimal (4 a second -> 0.250).
sample_interval() {
  local ms=$((1000 / MEM_SAMPLES_PER_SECOND))
  printf -v REPLY '%d.%03d' $((ms / 1000)) $((ms % 1000))
}

# The sampler of node INDEX, into CMD (run with on_node).
memory_sampler_argv() {
  rank_container "$1"
  local container=${REPLY}
  sample_interval
  CMD=(sh -c "${SAMPLER_SCRIPT}" memory-sampler "${container}" "${PHASE_MARKER_RE}" "${REPLY}")
}

# Phase index a marker starts (0 when it is not one).
marker_phase() {
  case $1 in
    'Model loading took') REPLY=1 ;;
    'Available KV cache memory' | 'KV Cache as specified by kv_cache_memory_bytes' | 'KV cache size: ') REPLY=2 ;;
    'Application startup complete') REPLY=3 ;;
    *) REPLY=0 ;;
  esac
}

# The phase of the cluster: the furthest any node's log has reached (tensor-parallel ranks
# move together, and the head alone logs some markers).
cluster_phase() {
  local file phase=0 value
  for file in "${GUARD_STATE}"/phase.*; do
    [[ -e ${file} ]] || continue
    value=""
    read -r value <"${file}" || true
    [[ ${value} =~ ^[0-3]$ ]] && ((value > phase)) && phase=${value}
  done
  REPLY=${phase}
}

# Records why the guard fires and wakes run.sh (its USR1 trap stops every rank).
guard_fires() {
  local index=$1 message=$2
  [[ -e ${GUARD_STATE}/stop ]] && return 0
  printf '%s\n' "${message}" >"${GUARD_STATE}/fired.${index}"
  kill -USR1 "${GUARD_MAIN_PID}" 2>/dev/null || true
}

# Runs in the background per node: reads the sampler's lines, writes one CSV row per
# sample, and fires when a sample is under the floor of the cluster's phase.
read_samples() {
  local index=$1 node=${NODE_LIST[$1]} line own=0 now floor bytes phase_name
  local -a floors=($((MEM_FLOOR_LOAD_GIB * GIB_BYTES)) $((MEM_FLOOR_PROFILE_GIB * GIB_BYTES))
    $((MEM_FLOOR_KV_READY_GIB * GIB_BYTES)) $((MEM_FLOOR_SERVING_GIB * GIB_BYTES)))
  while IFS= read -r -t "${SAMPLER_SILENCE_SECONDS}" line; do
    if [[ ${line} =~ ^mem\ ([0-9]+)$ ]]; then
      bytes=$((BASH_REMATCH[1] * 1024))
      now=${EPOCHREALTIME/[.,]/}
      cluster_phase
      floor=${floors[REPLY]}
      phase_name=${GUARD_PHASES[REPLY]}
      printf '%d.%06d,%d.%03d,%s,%s,%d,%d\n' $((now / 1000000)) $((now % 1000000)) \
        $(((now - GUARD_START_US) / 1000000)) $(((now - GUARD_START_US) / 1000 % 1000)) \
        "${node}" "${phase_name}" "${bytes}" "${floor}" >>"${MEM_CSV}"
      if ((floor > 0 && bytes < floor)); then
        gib "${bytes}"
        guard_fires "${index}" "${node} has MemAvailable ${REPLY} GiB (${bytes} bytes), under the ${phase_name} floor of $((floor / GIB_BYTES)) GiB"
        return 0
      fi
    else
      marker_phase "${line}"
      if ((REPLY > own)); then
        own=${REPLY}
        printf '%d\n' "${own}" >"${GUARD_STATE}/phase.${index}"
      fi
    fi
  done
  guard_fires "${index}" "lost the MemAvailable samples of ${node} (its sampler over SSH ended or was silent for ${SAMPLER_SILENCE_SECONDS} s; see MEM_GUARD in README)"
}

# Starts a sampler and a reader per node; MEM_CSV gets the header now and a row per sample.
start_memory_guard() {
  local index stamp
  [[ ${MEM_GUARD} == 1 ]] || return 0
  [[ -n ${EPOCHREALTIME:-} ]] || die "the memory guard needs bash 5 (EPOCHREALTIME); install it or set MEM_GUARD=0"
  stamp=$(date -u +%Y%m%dT%H%M%SZ)
  RUN_DIR=${RUNS_DIR}/${stamp}
  [[ ! -e ${RUN_DIR} ]] || RUN_DIR+=-$$
  mkdir -p "${RUN_DIR}" || die "cannot create ${RUN_DIR} for the memory samples (RUNS_DIR)"
  GUARD_STATE=$(mktemp -d) || die "cannot create a temporary directory for the memory guard"
  MEM_CSV=${RUN_DIR}/memory.csv
  printf '%s\n' "${MEM_CSV_HEADER}" >"${MEM_CSV}"
  GUARD_MAIN_PID=$$
  GUARD_START_US=${EPOCHREALTIME/[.,]/}
  trap on_memory_guard_fired USR1
  for index in "${!NODE_LIST[@]}"; do
    memory_sampler_argv "${index}"
    node_argv "${index}" "${CMD[@]}"
    # Sampler and reader are two jobs joined by a FIFO (not a pipeline), so that each PID is
    # known: stopping the guard must not wait on a sampler that is blocked remotely.
    mkfifo "${GUARD_STATE}/samples.${index}" || die "cannot create a FIFO in ${GUARD_STATE}"
    "${NODE_ARGV[@]}" </dev/null 2>/dev/null >"${GUARD_STATE}/samples.${index}" &
    GUARD_SAMPLERS+=("$!")
    read_samples "${index}" <"${GUARD_STATE}/samples.${index}" &
    GUARD_READERS+=("$!")
  done
  sample_interval
  say "memory guard: MemAvailable every ${REPLY} s on ${NODE_LIST[*]}, floors load ${MEM_FLOOR_LOAD_GIB} / profile ${MEM_FLOOR_PROFILE_GIB} / kv_ready ${MEM_FLOOR_KV_READY_GIB} / serving ${MEM_FLOOR_SERVING_GIB} GiB; samples in ${MEM_CSV}"
}

# Stops the readers and the samplers (a remote loop ends on its next write); safe to call
# twice.
stop_memory_guard() {
  local pid
  [[ -n ${GUARD_STATE} ]] || return 0
  trap '' USR1
  : >"${GUARD_STATE}/stop"
  for pid in "${GUARD_READERS[@]}" "${GUARD_SAMPLERS[@]}"; do
    kill "${pid}" 2>/dev/null || true
  done
  for pid in "${GUARD_READERS[@]}" "${GUARD_SAMPLERS[@]}"; do
    wait "${pid}" 2>/dev/null || true
  done
  GUARD_READERS=()
  GUARD_SAMPLERS=()
  rm -rf "${GUARD_STATE}"
  GUARD_STATE=""
}

# Kills every rank's container (kept, so `docker logs` still shows it) and copies each
# rank's log into RUN_DIR.
kill_and_keep_ranks() {
  local index container
  for index in "${!NODE_LIST[@]}"; do
    rank_container "${index}"
    on_node "${index}" docker kill "${REPLY}" >/dev/null 2>&1 \
      || printf 'glm53: could not kill %s on %s\n' "${REPLY}" "${NODE_LIST[index]}" >&2
  done
  for index in "${!NODE_LIST[@]}"; do
    rank_container "${index}"
    container=${REPLY}
    on_node "${index}" docker logs "${container}" >"${RUN_DIR}/${container}.log" 2>&1 || true
  done
}

# USR1 from a reader: the first reason recorded is the one reported.
on_memory_guard_fired() {
  local file message="fired"
  trap '' USR1
  [[ -z ${SLEEP_PID} ]] || kill "${SLEEP_PID}" 2>/dev/null || true
  for file in "${GUARD_STATE}"/fired.*; do
    [[ -e ${file} ]] || continue
    read -r message <"${file}" || true
    break
  done
  kill_and_keep_ranks
  stop_memory_guard
  # The containers stay for their logs; the next run.sh removes them.
  RANKS_STARTED=0
  die "memory guard: ${message}; every rank was stopped (containers kept for docker logs; logs and samples in ${RUN_DIR})"
}

# DRY_RUN: the sampler each node runs while run.sh waits.
show_memory_guard() {
  local index
  [[ ${MEM_GUARD} == 1 ]] || return 0
  sample_interval
  printf '# while waiting, on every node: MemAvailable every %s s and the rank log'"'"'s phase markers; under the phase'"'"'s floor (load %s, profile %s, kv_ready %s, serving %s GiB) every rank is killed; samples to %s/<UTC time>/memory.csv\n' \
    "${REPLY}" "${MEM_FLOOR_LOAD_GIB}" "${MEM_FLOOR_PROFILE_GIB}" "${MEM_FLOOR_KV_READY_GIB}" \
    "${MEM_FLOOR_SERVING_GIB}" "${RUNS_DIR}"
  for index in "${!NODE_LIST[@]}"; do
    memory_sampler_argv "${index}"
    show_on_node "${index}" "${CMD[@]}"
  done
}
