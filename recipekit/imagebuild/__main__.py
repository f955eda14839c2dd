"""scripts/build.sh's Python (docs/images.md); the version check runs before tomllib is needed."""
import sys
from pathlib import Path

if sys.version_info < (3, 11):
    sys.exit(f"build.sh: error: needs python3 >= 3.11 (tomllib); {sys.executable} is {sys.version.split()[0]}")
sys.path[0] = str(Path(__file__).resolve().parents[2])
from recipekit.bootstrap import require_tool_env  # noqa: E402
require_tool_env("build.sh", ("docker", "unidiff", "libcst"))
from recipekit.imagebuild.chain import main  # noqa: E402
sys.exit(main(sys.argv[1:]))
