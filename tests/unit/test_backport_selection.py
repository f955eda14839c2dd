"""The backport generator's selection of change groups, on synthetic releases."""

import pytest

from recipekit.backport import BackportError, generate
from recipekit.exact_patch import plan, write

OLD = "import os\n\nREGISTRY = {\n    'A': 1,\n    'B': 2,\n}\n\ndef f():\n    return 1\n"
NEW = (
    "import os\nimport sys\n\nREGISTRY = {\n    'A': 1,\n    'Wanted': 9,\n    'Other': 8,\n"
    "    'B': 2,\n}\n\ndef f():\n    return 2\n"
)


def releases(tmp_path, old=OLD, new=NEW):
    for name, text in (("old", old), ("new", new)):
        (tmp_path / name / "vllm").mkdir(parents=True)
        (tmp_path / name / "vllm" / "mod.py").write_text(text)
        (tmp_path / name / "vllm" / "__init__.py").write_text("")
    (tmp_path / "new" / "vllm" / "added.py").write_text("NEW_THING = 1\n")
    return tmp_path / "old", tmp_path / "new"


def manifest(selectors, new_files=("added.py",)):
    return {"base": "old", "source": "new", "new_files": list(new_files), "shared_files": {"mod.py": selectors}}


def test_only_selected_groups_and_slices_are_taken(tmp_path):
    old, new = releases(tmp_path)
    diff = generate(old, new, manifest([{"contains": "'Wanted'", "take_added": [0, 1]}]))
    assert "+    'Wanted': 9,\n" in diff
    assert "Other" not in diff and "import sys" not in diff and "return 2" not in diff
    assert "new file mode 100644\n--- /dev/null\n+++ b/vllm/added.py\n" in diff
    write(old, plan(old, diff))
    assert "'Wanted': 9" in (old / "vllm/mod.py").read_text()
    assert (old / "vllm/added.py").read_text() == "NEW_THING = 1\n"


def test_output_is_byte_identical_between_runs(tmp_path):
    old, new = releases(tmp_path)
    chosen = manifest([{"contains": "return 2"}, {"contains": "import sys"}])
    assert generate(old, new, chosen) == generate(old, new, chosen)


@pytest.mark.parametrize("needle, message", [
    ("nowhere", "matches 0 change groups"),
    ("+", "matches 3 change groups"),
])
def test_selector_must_match_exactly_one_group(tmp_path, needle, message):
    old, new = releases(tmp_path)
    with pytest.raises(BackportError, match=message):
        generate(old, new, manifest([{"contains": needle}]))


def test_slice_that_drops_the_selected_line_is_refused(tmp_path):
    old, new = releases(tmp_path)
    with pytest.raises(BackportError, match="take_added drops the line"):
        generate(old, new, manifest([{"contains": "'Wanted'", "take_added": [1, 2]}]))


def test_new_file_already_in_the_base_is_refused(tmp_path):
    old, new = releases(tmp_path)
    (old / "vllm" / "added.py").write_text("x = 1\n")
    with pytest.raises(BackportError, match="already has vllm/added.py"):
        generate(old, new, manifest([]))


def test_groups_of_another_base_shape_stay_out(tmp_path):
    old, new = releases(tmp_path)
    selectors = [
        {"contains": "'Wanted'", "take_added": [0, 1]},
        {"contains": "return 2", "requires": "logits-cache"},
    ]
    without = generate(old, new, manifest(selectors), "no-logits-cache")
    assert "return 2" not in without and "'Wanted': 9" in without
    # The shape's own group goes in (the old text of logits-cache files is only overridden
    # for vLLM's gumbel.py and speculator.py, which this synthetic release lacks).
    with pytest.raises(BackportError, match="gumbel.py"):
        generate(old, new, manifest(selectors), "logits-cache")


def test_recipe_insertions_go_before_their_anchor_for_their_shape_only(tmp_path):
    old, new = releases(tmp_path)
    spec = manifest([{"contains": "'Wanted'", "take_added": [0, 1]}])
    spec["recipe_insertions"] = {"mod.py": [
        {"requires": "no-logits-cache", "before": "def f():\n", "lines": ["# ours", ""]},
    ]}
    diff = generate(old, new, spec, "no-logits-cache")
    assert "+# ours\n+\n def f():\n" in diff
    spec["recipe_insertions"]["mod.py"][0]["before"] = "def g():\n"
    with pytest.raises(BackportError, match="recipe insertion anchor 'def g\\(\\):' found 0 times"):
        generate(old, new, spec, "no-logits-cache")


def test_an_unknown_shape_is_refused(tmp_path):
    old, new = releases(tmp_path)
    with pytest.raises(BackportError, match="unknown base shape 'cuda'"):
        generate(old, new, manifest([]), "cuda")


@pytest.mark.parametrize("source, shape", [
    ("def gumbel_sample(logits, logits_cache=None):\n    pass\n", "logits-cache"),
    ("def gumbel_sample(logits, output_processed_logits=None):\n    pass\n", "no-logits-cache"),
    (None, "no-logits-cache"),
])
def test_the_base_shape_probe_reads_gumbel_sample(source, shape):
    from recipekit.backport import shape_of

    assert shape_of(lambda relative: source) == shape
