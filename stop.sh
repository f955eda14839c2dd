#!/usr/bin/env bash
# Stops every rank run.sh started: removes the serve containers (label glm53.launcher=serve)
# on every node in NODES, head first. Reads the same settings as run.sh (environment,
# cluster.env, recipe.toml). DRY_RUN=1 prints the commands instead. The JIT cache
# directories (JIT_CACHE) and the run evidence (RUNS_DIR) are left for the next run.
set -euo pipefail
exec python3 "$(dirname "${BASH_SOURCE[0]}")/launcher/entry.py" stop "$@"
