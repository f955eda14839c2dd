#!/usr/bin/env bash
# Build the image chain on the docker SDK (recipekit/imagebuild/; flags: --help; docs/images.md).
# Exit: 0 built or up to date; 3 a layer refused; 4 the base refused; 1 another failure; 2 usage. Needs python3 >= 3.11.
set -euo pipefail
exec "${PYTHON:-python3}" "$(dirname "${BASH_SOURCE[0]}")/../recipekit/imagebuild/__main__.py" "$@"
