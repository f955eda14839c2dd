"""exact_patch.plan_text: a one-file exact-context edit on text (what v8's F1 uses)."""

import pytest

from recipekit.exact_patch import PatchRefused, plan_text

DIFF = """\
--- a/f.h
+++ b/f.h
@@ -2,3 +2,3 @@
 before
-  x = 32;
+  x = 16;
 after
"""


def test_applies_once_then_reports_already_applied():
    text = "top\nbefore\n  x = 32;\nafter\nend\n"
    present, patched = plan_text("f.h", text, DIFF)
    assert (present, patched) == (False, "top\nbefore\n  x = 16;\nafter\nend\n")
    assert plan_text("f.h", patched, DIFF) == (True, patched)


def test_no_match_is_refused_never_fuzzed():
    with pytest.raises(PatchRefused, match="does not match"):
        plan_text("f.h", "before\n  x = 64;\nafter\n", DIFF)


def test_two_matches_away_from_the_hinted_line_are_refused_as_ambiguous():
    block = "before\n  x = 32;\nafter\n"
    with pytest.raises(PatchRefused, match="ambiguous"):
        plan_text("f.h", "a\nb\nc\nd\n" + block + block, DIFF)


def test_a_diff_of_two_files_is_refused():
    two = DIFF + DIFF.replace("f.h", "g.h")
    with pytest.raises(PatchRefused, match="one text file"):
        plan_text("f.h", "before\n  x = 32;\nafter\n", two)
