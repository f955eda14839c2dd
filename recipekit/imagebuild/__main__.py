"""scripts/build.sh: build the image chain, v8 to v13, on the vendor image (the docker SDK).

    scripts/build.sh [--check] [--from LAYER] [--to LAYER] [--base REF] [--accept-base]
                     [--base-lock first-use|strict] [--verbose] [--tag-prefix PREFIX]
                     [--recipe PATH]

docs/images.md says what each option does; scripts/build.sh's header, its exit codes. (Its
Python; the version check runs before tomllib is needed.)
"""
import sys
from pathlib import Path

if sys.version_info < (3, 11):
    sys.exit(f"build.sh: error: needs python3 >= 3.11 (tomllib); {sys.executable} is {sys.version.split()[0]}")
sys.path[0] = str(Path(__file__).resolve().parents[2])
from recipekit.bootstrap import require_tool_env  # noqa: E402
require_tool_env("build.sh", ("docker", "unidiff", "libcst"))
from recipekit.imagebuild.chain import main  # noqa: E402
sys.exit(main(sys.argv[1:]))
