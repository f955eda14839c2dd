"""README's "Where to go next" has one entry per page under docs/, each linking a page that
exists, so a new page cannot go unlisted and a moved one cannot leave a dead link."""

from __future__ import annotations

import re

from tests.unit.test_launcher_support import REPO

SECTION = "## Where to go next"
ENTRY = re.compile(r"- \[[^]]+\]\((docs/[^)#]+\.md)\)")


def entries(text: str) -> list[str]:
    """The docs page each list entry of the section links first."""
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    items = [line for line in section.splitlines() if line.startswith("- ")]
    linked = [ENTRY.match(item) for item in items]
    assert all(linked), [item for item, match in zip(items, linked) if not match]
    return [match[1] for match in linked]


def test_every_docs_page_has_one_entry_and_every_entry_a_page():
    listed = entries((REPO / "README.md").read_text())
    pages = sorted(f"docs/{path.name}" for path in (REPO / "docs").glob("*.md"))
    assert sorted(listed) == pages
    assert len(listed) == len(set(listed))


def test_the_check_catches_a_missing_and_a_doubled_entry():
    text = (REPO / "README.md").read_text()
    first = re.search(r"^- \[.*$", text.split(SECTION, 1)[1], re.MULTILINE)[0]
    assert len(entries(text.replace(first, first + "\n" + first, 1))) == len(entries(text)) + 1
    assert len(entries(text.replace(first, "", 1))) == len(entries(text)) - 1
