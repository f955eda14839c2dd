"""What a user set by name is checked where a mistake would otherwise pass in silence: an
environment name one or two edits from a knob, a cluster.env name given twice, and a knob
the chosen SPEC or DRAFTER does not read. Each is refused in one line (exit 2, nothing on
stdout) naming what to set instead; the same settings spelled right, or set by a profile,
pass."""

import pytest

from launcher.plan.user_settings import edit_distance, meant_knob
from recipekit import recipe
from tests.unit.test_launcher_support import run

KNOBS = recipe.load().knobs


@pytest.mark.parametrize("a, b, distance", [
    ("NUM_SPECULATIVE_TOKEN", "NUM_SPECULATIVE_TOKENS", 1), ("SEPC", "SPEC", 1),
    ("MAX_NUM_SEQ", "MAX_NUM_SEQS", 1), ("DRAFTR", "DRAFTER", 1), ("HF_TOKEN", "HF_TOKEN_FILE", 5),
    ("", "TP", 2), ("SAME", "SAME", 0),
])
def test_edit_distance(a, b, distance):
    assert edit_distance(a, b) == distance == edit_distance(b, a)


@pytest.mark.parametrize("name, knob", [
    ("NUM_SPECULATIVE_TOKEN", "NUM_SPECULATIVE_TOKENS"), ("MAX_MODEL_LENGTH", None),
    ("MAX_MODL_LEN", "MAX_MODEL_LEN"), ("NODE", "NODES"), ("NODS", "NODES"), ("DRAFTR", "DRAFTER"),
    # names an environment holds for other reasons stay out
    ("TZ", None), ("HF_TOKEN", None), ("PATH", None), ("HOME", None), ("SHELL", None),
    ("NODES", None), ("CLUSTER_ENV", None),
])
def test_only_a_close_name_is_taken_for_a_typo(name, knob):
    assert meant_knob(name, KNOBS) == knob


def refused(tmp_path, line, **settings):
    result = run(tmp_path, **settings)
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr == f"refused: {line}\n"


def test_a_misspelled_knob_in_the_environment_is_refused(tmp_path):
    refused(tmp_path, "NUM_SPECULATIVE_TOKEN (in the environment) is not a launcher setting: did "
            "you mean NUM_SPECULATIVE_TOKENS? Set NUM_SPECULATIVE_TOKENS, or unset "
            "NUM_SPECULATIVE_TOKEN", NUM_SPECULATIVE_TOKEN=5)


def test_a_name_given_twice_in_cluster_env_is_refused(tmp_path):
    cluster = tmp_path / "cluster.env"
    cluster.write_text("# site\nNODES=192.0.2.1\nIFACE=ifx0\n\nNODES=192.0.2.9\n")
    refused(tmp_path, f"{cluster} line 5: NODES is set again (line 2 set it first); accepted: one "
            "line per name", CLUSTER_ENV=cluster, NODES=None)


INAPPLICABLE = [
    ({"SPEC": "mtp", "NUM_SPECULATIVE_TOKENS": "2"},
     "NUM_SPECULATIVE_TOKENS=2: SPEC=mtp reads MTP_NUM_SPECULATIVE_TOKENS instead; set that"),
    # out of the DFlash2 range too: refused as the wrong knob, not by DFlash2's range
    ({"SPEC": "mtp", "NUM_SPECULATIVE_TOKENS": "99"},
     "NUM_SPECULATIVE_TOKENS=99: SPEC=mtp reads MTP_NUM_SPECULATIVE_TOKENS instead; set that"),
    ({"MTP_NUM_SPECULATIVE_TOKENS": "3"},
     "MTP_NUM_SPECULATIVE_TOKENS=3: SPEC=dflash2 reads NUM_SPECULATIVE_TOKENS instead; set that"),
    ({"SPEC": "mtp", "DRAFTER": "dflash2-g"},
     "DRAFTER=dflash2-g: only SPEC=dflash2 reads it; unset DRAFTER, or set SPEC=dflash2"),
    ({"SPEC": "off", "DRAFT_WEIGHTS": "bf16"},
     "DRAFT_WEIGHTS=bf16: only SPEC=dflash2 reads it; unset DRAFT_WEIGHTS, or set SPEC=dflash2"),
    ({"PROFILE": "mtp", "ADAPTIVE_VERIFY_TAU": "0.2"},
     "ADAPTIVE_VERIFY_TAU=0.2: only SPEC=dflash2 reads it; unset ADAPTIVE_VERIFY_TAU, or set "
     "SPEC=dflash2"),
    ({"DRAFTER_WINDOW": "4096"},
     "DRAFTER_WINDOW=4096: DRAFTER=incoai has sliding-window layers and keeps its own window; "
     "only a full-attention drafter (DRAFTER=dflash2-g, or a local one) reads it; unset "
     "DRAFTER_WINDOW"),
]


@pytest.mark.parametrize("settings, line", INAPPLICABLE, ids=[line.split(":")[0] for _, line in INAPPLICABLE])
def test_a_knob_the_chosen_spec_does_not_read_is_refused(tmp_path, settings, line):
    refused(tmp_path, line, **settings)


def test_an_inapplicable_knob_in_cluster_env_is_refused_too(tmp_path):
    cluster = tmp_path / "cluster.env"
    cluster.write_text("SPEC=mtp\nDRAFTER=dflash2-g\n")
    refused(tmp_path, "DRAFTER=dflash2-g: only SPEC=dflash2 reads it; unset DRAFTER, or set "
            "SPEC=dflash2", CLUSTER_ENV=cluster)


@pytest.mark.parametrize("settings", [
    {"SPEC": "mtp", "MTP_NUM_SPECULATIVE_TOKENS": "3"}, {"PROFILE": "mtp"},
    {"PROFILE": "seed-pr"}, {"DRAFTER": "dflash2-g", "DRAFTER_WINDOW": "4096"},
    {"DRAFTER": "/srv/drafters/mine", "DRAFTER_WINDOW": "4096"}, {"HF_TOKEN": "x", "TZ": "UTC"},
])
def test_the_same_settings_where_they_apply_pass(tmp_path, settings):
    result = run(tmp_path, **settings)
    assert result.returncode == 0, result.stderr
