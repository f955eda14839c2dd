"""The weight-only knobs (layer v13) reach every rank as GLM53_* variables, identically, and
the start-up line names them; on by default (the seed's v13 setting), off they leave the
variables out."""

from tests.unit.launcher_fixtures import PINNED
from tests.unit.test_launcher_support import dry_run, serve_commands, startup_line

GROUPS = "shared,mla,kda_o,kda_in,lm_head"


def rank_env(stdout) -> list[dict]:
    out = []
    for _, argv in sorted(serve_commands(stdout).values()):
        pairs = [argv[i + 1] for i, word in enumerate(argv) if word == "--env"]
        out.append(dict(p.split("=", 1) for p in pairs if p.startswith("GLM53_")))
    return out


def weight_env(stdout) -> list[dict]:
    """Each rank's GLM53_* variables but the kpool and adaptive-verify switches
    (tests/unit/test_launcher_dry_run.py)."""
    return [{name: value for name, value in env.items()
             if name != "GLM53_KPOOL_TAIL_FIX" and not name.startswith("GLM53_ADAPTIVE_VERIFY")}
            for env in rank_env(stdout)]


def test_the_defaults_are_the_seeds_v13_setting_on_every_rank(tmp_path):
    stdout = dry_run(tmp_path, **PINNED)
    envs = weight_env(stdout)
    assert len(envs) == 2 and envs[0] == envs[1] == {
        "GLM53_INT8_W8A16": GROUPS, "GLM53_DRAFT_WEIGHTS": "nvfp4"}  # group 128: the runtime's
    assert f"weight-only target int8 g128 {GROUPS}, drafter nvfp4," in startup_line(stdout)


def test_a_group_size_reaches_every_rank_and_the_startup_line(tmp_path):
    stdout = dry_run(tmp_path, TARGET_WEIGHT_GROUPS_INT8=GROUPS, INT_GROUP_SIZE="64",
                     DRAFT_WEIGHTS="nvfp4", **PINNED)
    envs = weight_env(stdout)
    assert len(envs) == 2 and envs[0] == envs[1] == {
        "GLM53_INT8_W8A16": GROUPS, "GLM53_INT_GROUP_SIZE": "64", "GLM53_DRAFT_WEIGHTS": "nvfp4"}
    assert f"weight-only target int8 g64 {GROUPS}, drafter nvfp4," in startup_line(stdout)


def test_none_and_bf16_leave_the_target_variable_out(tmp_path):
    stdout = dry_run(tmp_path, TARGET_WEIGHT_GROUPS_INT8="none", DRAFT_WEIGHTS="bf16", **PINNED)
    assert weight_env(stdout) == [{"GLM53_DRAFT_WEIGHTS": "bf16"}] * 2
    assert "weight-only" not in stdout


def test_the_seed_pr_profile_sets_no_weight_variable(tmp_path):
    stdout = dry_run(tmp_path, PROFILE="seed-pr", **PINNED)
    assert rank_env(stdout) == [{}, {}]
    assert "weight-only" not in stdout


def test_a_forced_target_format_is_passed_and_named(tmp_path):
    stdout = dry_run(tmp_path, TARGET_WEIGHT_GROUPS_INT8="mla", TARGET_WEIGHT_FORMAT="nvfp4",
                     FORCE_UNSAFE_WEIGHTS=1, DRAFT_WEIGHTS="bf16", **PINNED)
    assert weight_env(stdout)[1] == {"GLM53_INT8_W8A16": "mla",
                                     "GLM53_TARGET_WEIGHT_FORMAT": "nvfp4",
                                     "GLM53_DRAFT_WEIGHTS": "bf16",
                                     "GLM53_FORCE_UNSAFE_WEIGHTS": "1"}
    assert "weight-only target nvfp4 g128 mla," in startup_line(stdout)
