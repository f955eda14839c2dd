#!/usr/bin/env bash
# Build the image chain on the docker SDK (recipekit/imagebuild/): scripts/build.sh --help for
# the flags, docs/images.md for what it builds and labels. Exit: 0 built or up to date; 3 a
# layer refused; 1 any other failure; 2 usage. Needs a Docker engine and python3 >= 3.11.
set -euo pipefail
exec "${PYTHON:-python3}" "$(dirname "${BASH_SOURCE[0]}")/../recipekit/imagebuild/__main__.py" "$@"
