"""The docs say what the recipe says and point only at what exists: the knob tables of
README.md and docs/launcher.md are scripts/render-docs' output for today's recipe.toml, every
link from README.md (and from the pages under docs/) resolves, and no doc cites a file
outside the repository."""

import re
import subprocess
import sys
import tomllib

import pytest

from launcher.plan import render
from recipekit import recipe
from tests.timing import HANG_GUARD_S
from tests.unit.test_launcher_support import REPO

DOCS = ["README.md", *sorted(str(path.relative_to(REPO)) for path in (REPO / "docs").glob("*.md"))]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# Files a user of this repository does not have, however a doc names them.
_OUTSIDE = re.compile(r"REFERENCE\.md|DESIGN\.md|\.\./shared|/work/|seeds/0|BRIEF\.md")
_ANCHOR_CHARS = re.compile(r"[^\w\- ]")


@pytest.mark.parametrize("name", render.REGIONS)
def test_the_rendered_tables_are_fresh(name):
    text = (REPO / name).read_text()
    assert render.rendered(text, recipe.load(), render.REGIONS[name]) == text, (
        f"{name} is stale: run scripts/render-docs")


# The regions a knob's default shows in, and the one a checkpoint fact shows in.
KNOB_REGIONS = {"front-knobs", "knobs"}


def test_a_changed_default_makes_the_render_stale():
    data = tomllib.loads(recipe.RECIPE_PATH.read_text())
    data["knobs"]["MAX_NUM_SEQS"]["default"] += 1  # any other value
    changed = recipe.parse(data)
    knob_files = [name for name, regions in render.REGIONS.items() if KNOB_REGIONS & set(regions)]
    assert knob_files == ["README.md", "docs/launcher.md"]
    for name in knob_files:
        text = (REPO / name).read_text()
        assert render.rendered(text, changed, render.REGIONS[name]) != text, name


def test_a_changed_checkpoint_fact_makes_the_render_stale():
    data = tomllib.loads(recipe.RECIPE_PATH.read_text())
    data["checkpoints"]["nvidia/GLM-5.3-Flash-NVFP4"]["size"] = "190.5 GiB in 33 shards"
    changed = recipe.parse(data)
    text = (REPO / "docs/checkpoints.md").read_text()
    assert "190.4 GiB in 33 shards" in text
    assert render.rendered(text, changed, render.REGIONS["docs/checkpoints.md"]) != text


def test_render_docs_check_agrees():
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "render-docs"), "--check"],
                            capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
    assert result.returncode == 0, result.stderr


def anchors(text):
    """GitHub's anchors of the headings in TEXT."""
    found = set()
    fence = False
    for line in text.split("\n"):
        if line.startswith("```"):
            fence = not fence
        if not fence and (match := re.match(r"#{1,6} (.*)", line)):
            found.add(_ANCHOR_CHARS.sub("", match[1].strip().lower()).replace(" ", "-"))
    return found


def links(name):
    return _LINK.findall((REPO / name).read_text())


@pytest.mark.parametrize("name", DOCS)
def test_every_link_resolves(name):
    base = (REPO / name).parent
    for target in links(name):
        if target.startswith(("https://", "http://", "mailto:")):
            assert target.startswith("https://"), f"{name}: {target} is not https"
            continue
        path, _, anchor = target.partition("#")
        resolved = (base / path).resolve() if path else REPO / name
        assert resolved.exists(), f"{name}: {target} does not exist"
        assert REPO in resolved.parents or resolved == REPO, f"{name}: {target} is outside"
        if anchor:
            assert anchor in anchors(resolved.read_text()), f"{name}: no heading #{anchor}"


def test_the_front_page_links_every_page_under_docs():
    linked = {target.partition("#")[0] for target in links("README.md")}
    assert {name for name in DOCS if name.startswith("docs/")} <= linked


@pytest.mark.parametrize("name", DOCS)
def test_no_doc_cites_a_file_outside_the_repository(name):
    cited = [line for line in (REPO / name).read_text().split("\n") if _OUTSIDE.search(line)]
    assert cited == []


def test_the_front_page_is_short_and_keeps_the_test_command():
    text = (REPO / "README.md").read_text()
    assert len(text.split("\n")) <= 260
    # .ci/run finds the test command this way: the first ```bash block after this line.
    after = text.split("\nTest every tier", 1)[1]
    assert after.split("```bash\n", 1)[1].split("\n", 1)[0] == "./scripts/test"
