"""The memory guard's rules (launcher/apply/memguard.py runs it): the boot phases, the log
lines of vLLM's that end each, the knob that sets each phase's floor, and the sampler: one
POSIX-shell loop a node runs (through SSH on a worker), printing its MemAvailable and the
rank log's phase markers for the guard on the head to read.
"""

from __future__ import annotations

PHASES = ("load", "profile", "kv_ready", "serving")
# vLLM's own log lines that end a phase (vLLM 0.30.0's workers and engine core, uvicorn):
# weights loaded -> profile; KV cache sized (profiled, or pinned by --kv-cache-memory-bytes)
# -> kv_ready; API up -> serving.
MARKER_PHASE = {"Model loading took": 1, "Available KV cache memory": 2,
                "KV Cache as specified by kv_cache_memory_bytes": 2, "KV cache size: ": 2,
                "Application startup complete": 3}
PHASE_MARKER_RE = "|".join(MARKER_PHASE)
FLOOR_KNOBS = ("MEM_FLOOR_LOAD_GIB", "MEM_FLOOR_PROFILE_GIB", "MEM_FLOOR_KV_READY_GIB",
               "MEM_FLOOR_SERVING_GIB")

# The remote side, POSIX sh, run as: sh -c SCRIPT memory-sampler CONTAINER MARKER_RE INTERVAL.
# Prints "mem <kB>" every INTERVAL seconds and each phase marker as the rank logs it. The
# log is followed through a FIFO so that its PID is known and killed on the way out; the
# loop ends (and the follower with it) once the head stops reading. Test seam:
# GLM53_MEMINFO names a file read instead of /proc/meminfo. One line, so that DRY_RUN
# prints it as one command.
_SAMPLER_STATEMENTS = (
    'meminfo=${GLM53_MEMINFO:-/proc/meminfo}',
    'work=$(mktemp -d) || exit 1',
    'follower=',
    """trap 'kill "$follower" 2>/dev/null; rm -rf "$work"' EXIT""",
    "trap 'exit 0' HUP INT TERM",
    'mkfifo "$work/log" || exit 1',
    'docker logs --follow "$1" >"$work/log" 2>&1 &',
    'follower=$!',
    'grep --line-buffered -o -E "$2" <"$work/log" &',
    "while awk '/^MemAvailable:/ { print \"mem\", $2; found = 1; exit } END { exit !found }' "
    '"$meminfo"; do sleep "$3"; done',
)
# A statement sent to the background ends in & already; the others need a ;.
SAMPLER_SCRIPT = " ".join(s if s.endswith("&") else s + ";" for s in _SAMPLER_STATEMENTS)[:-1]


def interval(samples_per_second: str) -> str:
    """Seconds between samples as a decimal (4 a second -> 0.250)."""
    ms = 1000 // int(samples_per_second)
    return f"{ms // 1000}.{ms % 1000:03d}"
