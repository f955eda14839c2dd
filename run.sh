#!/usr/bin/env bash
# Serves GLM-5.3-Flash NVFP4 across the nodes in NODES (head first), one vLLM rank per
# node, from the image chain's last tag. Run it on the head. Every knob, its default and
# what is refused: recipe.toml and docs/launcher.md. DRY_RUN=1 prints every command, one
# per line, and runs none. The launcher itself is Python (launcher/, python3 3.11 or newer).
set -euo pipefail
exec python3 "$(dirname "${BASH_SOURCE[0]}")/launcher/entry.py" run "$@"
