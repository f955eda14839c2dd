"""The adaptive-verify knobs (layer v13) reach every rank as GLM53_* variables, identically:
on by default with DFlash2 at tau 0.3, off (nothing set) with a drafter that reports no
confidence; tau and max are set only while the switch is on; the start-up line names them."""

from tests.unit.launcher_fixtures import PINNED
from tests.unit.test_launcher_support import dry_run, startup_line
from tests.unit.test_launcher_weight_groups import rank_env


def verify_env(stdout) -> list[dict]:
    return [{name: value for name, value in env.items() if name.startswith("GLM53_ADAPTIVE_VERIFY")}
            for env in rank_env(stdout)]


def test_on_by_default_with_dflash2_at_tau_0_3_and_every_draft(tmp_path):
    stdout = dry_run(tmp_path, **PINNED)
    envs = verify_env(stdout)
    assert len(envs) == 2 and envs[0] == envs[1] == {
        "GLM53_ADAPTIVE_VERIFY": "1", "GLM53_ADAPTIVE_VERIFY_TAU": "0.3"}  # max unset: k
    assert "(KPOOL_TAIL_FIX ADAPTIVE_VERIFY on; verify tau 0.3, max 7)" in startup_line(stdout)


def test_tau_and_max_reach_every_rank(tmp_path):
    stdout = dry_run(tmp_path, ADAPTIVE_VERIFY_TAU="1.0", ADAPTIVE_VERIFY_MAX="3", **PINNED)
    assert verify_env(stdout) == [{"GLM53_ADAPTIVE_VERIFY": "1", "GLM53_ADAPTIVE_VERIFY_TAU": "1.0",
                                   "GLM53_ADAPTIVE_VERIFY_MAX": "3"}] * 2
    assert "verify tau 1.0, max 3)" in startup_line(stdout)


def test_off_leaves_every_adaptive_variable_out_even_with_tau_set(tmp_path):
    stdout = dry_run(tmp_path, ADAPTIVE_VERIFY="0", ADAPTIVE_VERIFY_TAU="0.5", ADAPTIVE_VERIFY_MAX="2",
                     **PINNED)
    assert verify_env(stdout) == [{}, {}]
    assert "ADAPTIVE_VERIFY" not in startup_line(stdout) and "verify tau" not in startup_line(stdout)


def test_the_default_follows_the_drafter(tmp_path):
    for spec in ("mtp", "off"):
        stdout = dry_run(tmp_path, SPEC=spec, **PINNED)
        assert verify_env(stdout) == [{}, {}], spec
