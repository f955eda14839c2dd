#!/usr/bin/env bash
# Stops every rank run.sh started: removes the serve containers (label glm53.launcher=serve)
# on every node in NODES, head first. Reads the same settings as run.sh (environment,
# cluster.env, launcher/defaults.env). DRY_RUN=1 prints the commands instead. The JIT
# cache directories (JIT_CACHE) and the run evidence (RUNS_DIR) are left for the next run.
set -euo pipefail

ROOT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LAUNCHER_DIR=${ROOT_DIR}/launcher
readonly ROOT_DIR LAUNCHER_DIR

# shellcheck source=launcher/lib/settings.sh
source "${LAUNCHER_DIR}/lib/settings.sh"
# shellcheck source=launcher/lib/validate.sh
source "${LAUNCHER_DIR}/lib/validate.sh"
# shellcheck source=launcher/lib/remote.sh
source "${LAUNCHER_DIR}/lib/remote.sh"
# shellcheck source=launcher/lib/plan.sh
source "${LAUNCHER_DIR}/lib/plan.sh"
# shellcheck source=launcher/lib/ranks.sh
source "${LAUNCHER_DIR}/lib/ranks.sh"

main() {
  load_settings "${LAUNCHER_DIR}/defaults.env" "${CLUSTER_ENV:-${ROOT_DIR}/cluster.env}"
  require_flag DRY_RUN
  validate_nodes
  split_words SSH SSH_WORDS
  if [[ ${DRY_RUN} == 1 ]]; then
    printf '# remove the serve containers listed on each node\n'
    show_stop_all_ranks
    return 0
  fi
  stop_all_ranks
  ((STOP_FAILURES == 0)) || die "${STOP_FAILURES} node(s) could not be cleaned; see above"
  say "stopped every rank on ${NODE_LIST[*]}"
}

main "$@"
