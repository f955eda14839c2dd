"""The weight-only knobs (layer v13) reach every rank as GLM53_* variables, identically, and
the start-up line names them; off (the default) they leave DRY_RUN as it was."""

from tests.unit.launcher_fixtures import PINNED
from tests.unit.test_launcher_support import dry_run, serve_commands, startup_line

GROUPS = "shared,mla,kda_o,kda_in,lm_head"


def rank_env(stdout) -> list[dict]:
    out = []
    for _, argv in sorted(serve_commands(stdout).values()):
        pairs = [argv[i + 1] for i, word in enumerate(argv) if word == "--env"]
        out.append(dict(p.split("=", 1) for p in pairs if p.startswith("GLM53_")))
    return out


def test_the_seeds_setting_reaches_every_rank_and_the_startup_line(tmp_path):
    stdout = dry_run(tmp_path, TARGET_WEIGHT_GROUPS_INT8=GROUPS, INT_GROUP_SIZE="64",
                     DRAFT_WEIGHTS="nvfp4", **PINNED)
    envs = rank_env(stdout)
    assert len(envs) == 2 and envs[0] == envs[1] == {
        "GLM53_INT8_W8A16": GROUPS, "GLM53_INT_GROUP_SIZE": "64", "GLM53_DRAFT_WEIGHTS": "nvfp4"}
    assert f"weight-only target int8 g64 {GROUPS}, drafter nvfp4," in startup_line(stdout)


def test_off_by_default_and_none_leaves_the_variables_out(tmp_path):
    for settings in ({}, {"TARGET_WEIGHT_GROUPS_INT8": "none", "DRAFT_WEIGHTS": "bf16"}):
        stdout = dry_run(tmp_path, **settings, **PINNED)
        envs = rank_env(stdout)
        assert "GLM53_INT8_W8A16" not in envs[0] and "weight-only target" not in stdout
    assert envs == [{"GLM53_DRAFT_WEIGHTS": "bf16"}] * 2


def test_a_forced_target_format_is_passed_and_named(tmp_path):
    stdout = dry_run(tmp_path, TARGET_WEIGHT_GROUPS_INT8="mla", TARGET_WEIGHT_FORMAT="nvfp4",
                     FORCE_UNSAFE_WEIGHTS=1, **PINNED)
    assert rank_env(stdout)[1] == {"GLM53_INT8_W8A16": "mla",
                                   "GLM53_TARGET_WEIGHT_FORMAT": "nvfp4",
                                   "GLM53_FORCE_UNSAFE_WEIGHTS": "1"}
    assert "weight-only target nvfp4 g128 mla," in startup_line(stdout)
