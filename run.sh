#!/usr/bin/env bash
# Serves GLM-5.3-Flash NVFP4 across the nodes in NODES (head first), one vLLM rank per
# node, from the image chain's last tag. Run it on the head. Every knob, its default and
# what is refused: README.md (launcher section) and launcher/defaults.env.
# DRY_RUN=1 prints every command, one per line, and runs none.
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
# shellcheck source=launcher/lib/pins.sh
source "${LAUNCHER_DIR}/lib/pins.sh"
# shellcheck source=launcher/lib/drafter.sh
source "${LAUNCHER_DIR}/lib/drafter.sh"
# shellcheck source=launcher/lib/images.sh
source "${LAUNCHER_DIR}/lib/images.sh"
# shellcheck source=launcher/lib/ranks.sh
source "${LAUNCHER_DIR}/lib/ranks.sh"
# shellcheck source=launcher/lib/memguard.sh
source "${LAUNCHER_DIR}/lib/memguard.sh"

dry_run() {
  settle_pins 0
  startup_line "${DRAFTER_PHRASE}"
  printf '# glm53: %s\n' "${REPLY}"
  show_running_check
  show_prepare_nodes
  show_images
  show_jit_cache
  show_pins_and_drafter
  show_ranks
}

serve() {
  command -v docker >/dev/null || die "docker is not installed on the head"
  command -v curl >/dev/null || die "curl is not installed on the head (the readiness wait polls the API with it)"
  check_no_running_ranks
  prepare_nodes
  ensure_images
  prepare_jit_cache
  settle_pins 1
  prepare_drafter_everywhere
  startup_line "${DRAFTER_PHRASE}"
  say "${REPLY}"
  trap stop_if_half_started EXIT
  trap 'exit 130' INT TERM
  start_ranks
  start_memory_guard
  wait_until_ready
  stop_memory_guard
}

main() {
  load_settings "${LAUNCHER_DIR}/defaults.env" "${CLUSTER_ENV:-${ROOT_DIR}/cluster.env}"
  validate_settings
  if [[ ${DRY_RUN} == 1 ]]; then
    dry_run
  else
    serve
  fi
}

main "$@"
