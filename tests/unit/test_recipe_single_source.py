"""Each knob is data in exactly one file, recipe.toml: no other file of the repository
defines or defaults one, and the launcher reads no setting the recipe does not define.

What counts as defining or defaulting a knob elsewhere (tests/ and .ci/ set knobs for their
scenarios and are not scanned):
- Python: a name bound to the knob's default (`MAX_NUM_SEQS = 4`), a dict entry, a keyword
  or a `.get()`/`getenv()`/`setdefault()` default giving a knob its default; in launcher/,
  any constant bound to a knob that way;
- shell: an assignment (`MAX_NUM_SEQS=4`, `readonly`, `local`, `export`) or `${KNOB:-...}`;
- a Dockerfile `ARG`/`ENV`, or a settings file (`*.env*`), repeating a knob's default;
- Markdown: a table row for a knob outside a region scripts/render-docs writes.
"""

import ast
import re
import subprocess

import pytest

from launcher.plan import image_base, render
from recipekit import recipe
from tests.unit.test_launcher_support import REPO

KNOBS = recipe.load().knobs
DEFAULTS = {name: knob.default for name, knob in KNOBS.items()}
_KNOB_NAMES = "|".join(sorted(KNOBS, key=len, reverse=True))
_SHELL_ASSIGN = re.compile(rf"(?:^|[\s;])(?:(?:readonly|local|export|declare(?: -\w+)*)\s+)?"
                           rf"({_KNOB_NAMES})=")
_SHELL_DEFAULT = re.compile(rf"\$\{{({_KNOB_NAMES}):?[-=]")
_DOCKER_DEFAULT = re.compile(rf"^\s*(?:ARG|ENV)\s+({_KNOB_NAMES})=(\S*)")
_ENV_LINE = re.compile(rf"^\s*#?\s*({_KNOB_NAMES})=(.*)$")
_MD_ROW = re.compile(rf"^\|\s*`({_KNOB_NAMES})`\s*\|")
_SKIPPED = ("tests/", ".ci/")
# The Dockerfile's own build argument BASE_IMAGE (scripts/build.sh always passes it) has the
# vendor image as its default, as the launcher's BASE_IMAGE does. The image build is the
# build helper's (issue 21 part 2): it is to read the vendor image from recipe.toml.
ALLOWED = {("docker/Dockerfile.sm121-v8", "BASE_IMAGE")}


def tracked_files():
    names = subprocess.run(["git", "-C", str(REPO), "ls-files", "--cached", "--others",
                            "--exclude-standard"], capture_output=True, text=True,
                           check=True).stdout.split("\n")
    return sorted({name for name in names if name and (REPO / name).is_file()
                   and not name.startswith(_SKIPPED) and name != "recipe.toml"})


def kind_of(name, text):
    first = text.split("\n", 1)[0]
    if name.endswith(".py") or (first.startswith("#!") and "python" in first):
        return "python"
    if name.endswith(".sh") or (first.startswith("#!") and ("bash" in first or "sh" in first)):
        return "shell"
    if "Dockerfile" in name:
        return "docker"
    if name.endswith(".md"):
        return "markdown"
    if ".env" in name:
        return "env"
    return None


def _constant(node):
    return isinstance(node, ast.Constant) and node.value is not None


def _gives(knob, node, strict):
    """Whether NODE gives KNOB a value that counts: any constant (STRICT), else its default."""
    return _constant(node) and (strict or str(node.value) == DEFAULTS[knob])


def python_findings(text, strict=False):
    """(line, what) of every knob defined or defaulted in Python source TEXT."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if (isinstance(target, ast.Name) and target.id in KNOBS
                        and _gives(target.id, node.value, strict)):
                    found.append((node.lineno, f"{target.id} = a constant"))
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if _constant(key) and key.value in KNOBS and _gives(key.value, value, strict):
                    found.append((node.lineno, f"{{{key.value!r}: a constant}}"))
        elif isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg in KNOBS and _gives(keyword.arg, keyword.value, strict):
                    found.append((node.lineno, f"{keyword.arg}= a constant"))
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if (name in ("get", "getenv", "setdefault", "pop") and len(node.args) >= 2
                    and _constant(node.args[0]) and node.args[0].value in KNOBS
                    and _gives(node.args[0].value, node.args[1], strict)):
                found.append((node.lineno, f"{name}({node.args[0].value!r}, a default)"))
    return found


def shell_findings(text):
    found = []
    for number, line in enumerate(text.split("\n"), start=1):
        code = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
        for pattern in (_SHELL_ASSIGN, _SHELL_DEFAULT):
            for match in pattern.finditer(code):
                found.append((number, f"{match[1]} given a value"))
    return found


def repeated_default_findings(text, pattern):
    found = []
    for number, line in enumerate(text.split("\n"), start=1):
        match = pattern.match(line)
        if match and DEFAULTS[match[1]] and match[2].strip().strip("\"'") == DEFAULTS[match[1]]:
            found.append((number, f"{match[1]}={match[2]}, its default"))
    return found


def markdown_findings(text):
    for name in {region for regions in render.REGIONS.values() for region in regions}:
        text = render.region_pattern(name).sub("", text)
    return [(number, f"a table row for {match[1]}")
            for number, line in enumerate(text.split("\n"), start=1)
            if (match := _MD_ROW.match(line))]


def findings(name, text):
    kind = kind_of(name, text)
    if kind == "python":
        return python_findings(text, strict=name.startswith("launcher/"))
    if kind == "shell":
        return shell_findings(text)
    if kind == "docker":
        return repeated_default_findings(text, _DOCKER_DEFAULT)
    if kind == "env":
        return repeated_default_findings(text, _ENV_LINE)
    if kind == "markdown":
        return markdown_findings(text)
    return []


def test_no_file_but_recipe_toml_defines_or_defaults_a_knob():
    found = []
    for name in tracked_files():
        for line, what in findings(name, (REPO / name).read_text(errors="replace")):
            if (name, re.match(r"\W*(\w+)", what)[1]) not in ALLOWED:
                found.append(f"{name}:{line}: {what}")
    assert found == []


# What the launcher reads of its environment that is not a knob: the settings file's name,
# the home directory a leading ~/ stands for; the API key the self-check may read from the
# environment (a secret: a knob's value is printed by DRY_RUN and the docs); VLLM_API_KEY:
# rank 0's API key, from API_AUTH and API_KEY_FILE through `docker run --env-file`
# (launcher/apply/api_key_file.py), never an `--env` a knob declares; the engine variables
# whose EXTRA_ENV value a base vLLM release no longer honours (launcher/plan/image_base.py's
# RETIRED_ENV: refused there, never read or set).
NOT_KNOBS = {"CLUSTER_ENV", "HOME", "OPENAI_API_KEY", "VLLM_API_KEY",
             *(entry.name for entry in image_base.RETIRED_ENV),
             # the platform probe's test seams, read inside a container (launcher/platform_probe.py)
             "GLM53_PROC", "GLM53_NVIDIA_SMI", "GLM53_NVIDIA_DEVICE"}


def test_the_launcher_reads_no_setting_the_recipe_does_not_define():
    """Every name of a setting in the launcher's code (a string such as "MAX_NUM_SEQS") is a
    knob of the recipe, or a container variable the recipe says the launcher sets."""
    the_recipe = recipe.load()
    known = set(KNOBS) | set(the_recipe.env_owners()) | NOT_KNOBS
    named = set()
    for path in sorted((REPO / "launcher").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and re.fullmatch(r"[A-Z][A-Z0-9]*(_[A-Z0-9]+)+|[A-Z]{3,}", node.value)):
                named.add(node.value)
    assert "MAX_NUM_SEQS" in named, "the scan found nothing: it is not looking where it should"
    assert named - known == set()


@pytest.mark.parametrize("kind, text", [
    ("launcher/x.py", "MAX_NUM_SEQS = 4\n"),
    ("bench/x.py", "DEFAULTS = {'PORT': 8000}\n"),
    ("bench/x.py", "import os\nport = os.environ.get('PORT', '8000')\n"),
    ("bench/x.py", "run(SPEC='dflash2')\n"),
    ("launcher/x.py", "run(SPEC='mtp')\n"),
    ("scripts/x.sh", "#!/usr/bin/env bash\nreadonly MAX_MODEL_LEN=327680\n"),
    ("scripts/x.sh", "#!/usr/bin/env bash\necho \"${PORT:-8000}\"\n"),
    ("docker/Dockerfile.x", "ARG IMAGE=glm53-sm121-v13\n"),
    ("cluster.env.example", "#HF_CACHE=~/.cache/huggingface\n"),
    ("docs/x.md", "| `MAX_NUM_SEQS` | `4` | seqs |\n"),
])
def test_a_planted_definition_is_found(kind, text):
    assert findings(kind, text), f"{kind}: {text!r} was not found"


@pytest.mark.parametrize("kind, text", [
    ("bench/x.py", "JIT_CACHE = 'flashinfer-jit-cache'\n"),  # another thing of that name
    ("bench/x.py", "serve(SPEC='off')\n"),  # a setting for a purpose, not a default
    ("scripts/x.sh", "#!/usr/bin/env bash\n# MAX_NUM_SEQS=4 in a comment\n"),
    ("docker/Dockerfile.x", "ARG BASE_IMAGE=glm53-sm121-v9\n"),
    ("cluster.env.example", "NODES=<head-address> <worker-address>\n"),
    ("docs/x.md", "<!-- recipe:knobs -->\n| `MAX_NUM_SEQS` | `4` |\n<!-- /recipe:knobs -->\n"),
])
def test_what_is_not_a_definition_is_not_found(kind, text):
    assert findings(kind, text) == []
