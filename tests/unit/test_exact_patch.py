"""The exact-context applier on small synthetic trees."""

import os
from pathlib import Path

import pytest

from recipekit import exact_patch
from recipekit.exact_patch import PatchRefused, plan, write

BASE = "".join(f"line {n}\n" for n in range(1, 21))


def make_tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


MODIFY = """\
diff --git a/pkg/a.py b/pkg/a.py
--- a/pkg/a.py
+++ b/pkg/a.py
@@ -4,7 +4,8 @@
 line 4
 line 5
 line 6
-line 7
+line seven
+line seven and a half
 line 8
 line 9
 line 10
"""

CREATE = """\
diff --git a/pkg/new.py b/pkg/new.py
new file mode 100644
--- /dev/null
+++ b/pkg/new.py
@@ -0,0 +1,2 @@
+first
+second
"""


def apply(root: Path, diff: str) -> str:
    patch_plan = plan(root, diff)
    if patch_plan.outcome == "apply":
        write(root, patch_plan)
    return patch_plan.outcome


def test_applies_then_reports_already_applied(tmp_path):
    root = make_tree(tmp_path, {"pkg/a.py": BASE})
    assert apply(root, MODIFY + CREATE) == "apply"
    text = (root / "pkg/a.py").read_text()
    assert "line seven\nline seven and a half\nline 8\n" in text and "line 7\n" not in text
    assert (root / "pkg/new.py").read_text() == "first\nsecond\n"
    before = snapshot(root)
    assert apply(root, MODIFY + CREATE) == "already-applied"
    assert snapshot(root) == before


def test_new_file_that_exists_is_refused(tmp_path):
    root = make_tree(tmp_path, {"pkg/a.py": BASE, "pkg/new.py": "mine\n"})
    with pytest.raises(PatchRefused, match="pkg/new.py: the diff creates this file but it already exists"):
        plan(root, CREATE)


def test_refusal_names_file_hunk_expected_lines_and_closest_place(tmp_path):
    root = make_tree(tmp_path, {"pkg/a.py": BASE.replace("line 6\n", "line six\n")})
    with pytest.raises(PatchRefused) as caught:
        plan(root, MODIFY)
    message = str(caught.value)
    assert message.startswith("pkg/a.py: hunk #1 (@@ -4,7 +4,8 @@) does not match")
    assert "  | line 6\n" in message
    assert "-line 6" in message and "+line six" in message
    assert "found at line 4" in message


def test_one_bad_file_leaves_every_file_untouched(tmp_path):
    root = make_tree(tmp_path, {"pkg/a.py": BASE, "pkg/b.py": "other\n"})
    bad = MODIFY.replace("pkg/a.py", "pkg/b.py")
    before = snapshot(root)
    with pytest.raises(PatchRefused, match="pkg/b.py"):
        plan(root, MODIFY + CREATE + bad)
    assert snapshot(root) == before


AMBIGUOUS_TEXT = "a\nb\nc\nX\nd\n" + "a\nb\nc\nY\nd\n" + "a\nb\nc\n"


def hunk_at(start: int) -> str:
    return f"""\
--- a/f.py
+++ b/f.py
@@ -{start},3 +{start},4 @@
 a
 b
+inserted
 c
"""


def test_context_found_twice_is_refused_as_ambiguous(tmp_path):
    root = make_tree(tmp_path, {"f.py": AMBIGUOUS_TEXT})
    with pytest.raises(PatchRefused, match=r"hunk #1 .* is ambiguous: its context matches at lines 1, 6, 11"):
        plan(root, hunk_at(3))


def test_header_line_may_choose_only_an_exact_match(tmp_path):
    root = make_tree(tmp_path, {"f.py": AMBIGUOUS_TEXT})
    assert apply(root, hunk_at(6)) == "apply"
    assert (root / "f.py").read_text().splitlines()[5:9] == ["a", "b", "inserted", "c"]


def test_binary_stanza_is_refused_by_name(tmp_path):
    root = make_tree(tmp_path, {"pkg/a.py": BASE})
    binary = (
        "diff --git a/pkg/__pycache__/a.cpython-312.pyc b/pkg/__pycache__/a.cpython-312.pyc\n"
        "index 1111111..2222222 100644\n"
        "Binary files a/pkg/__pycache__/a.cpython-312.pyc and b/pkg/__pycache__/a.cpython-312.pyc differ\n"
    )
    with pytest.raises(PatchRefused, match=r"pkg/__pycache__/a.cpython-312.pyc: binary stanza"):
        plan(root, MODIFY + binary)


def test_mode_line_of_a_new_file_is_honoured(tmp_path):
    root = make_tree(tmp_path, {"pkg/a.py": BASE})
    apply(root, CREATE.replace("new file mode 100644", "new file mode 100755"))
    assert os.stat(root / "pkg/new.py").st_mode & 0o777 == 0o755


def test_symlink_mode_is_refused(tmp_path):
    root = make_tree(tmp_path, {"pkg/a.py": BASE})
    with pytest.raises(PatchRefused, match="is not a regular file"):
        plan(root, CREATE.replace("new file mode 100644", "new file mode 120000"))


def test_half_applied_diff_is_refused_not_skipped(tmp_path):
    root = make_tree(tmp_path, {"pkg/a.py": BASE, "pkg/other.py": BASE})
    apply(root, MODIFY)
    before = snapshot(root)
    with pytest.raises(PatchRefused) as caught:
        plan(root, MODIFY + MODIFY.replace("pkg/a.py", "pkg/other.py"))
    assert "pkg/a.py: hunk #1" in str(caught.value)
    assert "partly patched: 1 of 2 files already carry their change (pkg/a.py)" in str(caught.value)
    assert snapshot(root) == before


def test_deleting_a_file(tmp_path):
    root = make_tree(tmp_path, {"gone.py": "x\ny\n"})
    delete = "--- a/gone.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-x\n-y\n"
    assert apply(root, delete) == "apply"
    assert not (root / "gone.py").exists()
    assert apply(root, delete) == "already-applied"


def test_failed_write_restores_the_tree(tmp_path, monkeypatch):
    root = make_tree(tmp_path, {"pkg/a.py": BASE})
    before = snapshot(root)
    patch_plan = plan(root, MODIFY + CREATE)
    real_replace = os.replace
    calls = []

    def failing_replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(28, "No space left on device", str(dst))
        return real_replace(src, dst)

    monkeypatch.setattr(exact_patch.os, "replace", failing_replace)
    with pytest.raises(PatchRefused, match="the tree was restored"):
        write(root, patch_plan)
    monkeypatch.setattr(exact_patch.os, "replace", real_replace)
    leftovers = {k: v for k, v in snapshot(root).items() if ".patch-tmp" not in k}
    assert leftovers == before
    assert not (root / "pkg/new.py").exists()


def test_unparseable_or_empty_diff_is_refused(tmp_path):
    with pytest.raises(PatchRefused, match="holds no file changes"):
        plan(tmp_path, "just words\n")
