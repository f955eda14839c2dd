"""scripts/compare's options and sides, before anything boots: the words of a side,
resolved and checked as run.sh does; every refusal in one line (exit 2); DRY_RUN printing
every boot's commands; --out, --resume and --reference-from refused when they would mix
comparisons or lose a user's files."""

from __future__ import annotations

import json
import os

import pytest

from compare import command, rundir, sides
from compare.rundir import Options, RunDir
from launcher.plan.settings import Refused
from recipekit import recipe
from tests.unit.test_launcher_support import HOME, NODES


@pytest.fixture
def environ(tmp_path, monkeypatch):
    """A one-node environment with no knob set but NODES (and no cluster.env)."""
    for name in recipe.load().knobs:
        monkeypatch.delenv(name, raising=False)
    settings = {"NODES": NODES[0], "HOME": HOME, "CLUSTER_ENV": str(tmp_path / "none.env"),
                "PINS_FILE": str(tmp_path / "pins.env"), "RUNS_DIR": str(tmp_path / "runs")}
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    return settings


def refusal(role: str, text: str) -> str:
    with pytest.raises(Refused) as refused:
        sides.load(role, text)
    return refused.value.line


def test_a_side_is_a_profile_or_knob_words_over_the_environment(environ):
    side = sides.load("reference", "seed-pr MAX_NUM_SEQS=8")
    assert side.assigned == {"PROFILE": "seed-pr", "MAX_NUM_SEQS": "8"}
    assert side.values["IMAGE"] == "glm53-sm121-v11"  # the profile's
    assert side.values["MAX_NUM_SEQS"] == "8"          # the word over the profile
    assert side.values["NODES"] == NODES[0]            # the environment
    quoted = sides.load("candidate", "EXTRA_ARGS='--max-num-batched-tokens 4096'")
    assert quoted.values["EXTRA_ARGS"] == "--max-num-batched-tokens 4096"


@pytest.mark.parametrize("role, text, line", [
    ("reference", "PROFILE=nope", "refused: --reference PROFILE=nope: no such profile; "
                                  "accepted: default | seed-pr | mtp | eager | field-fastest"),
    ("candidate", "fast", "refused: --candidate fast: neither a profile nor NAME=VALUE; "
                          "accepted: a profile (default | seed-pr | mtp | eager | field-fastest) or NAME=VALUE "
                          "words naming recipe.toml's knobs"),
    ("candidate", "TARGET_WEIGHT_FORMT=nvfp4",
     "refused: --candidate TARGET_WEIGHT_FORMT=nvfp4: TARGET_WEIGHT_FORMT is not a launcher "
     "setting (did you mean TARGET_WEIGHT_FORMAT?); accepted: the names in recipe.toml "
     "(docs/launcher.md, settings and defaults)"),
    ("candidate", "DRY_RUN=1", "refused: --candidate DRY_RUN=1: DRY_RUN is the whole "
                               "comparison's: set it in the environment (DRY_RUN=1 "
                               "scripts/compare ... prints every boot's commands)"),
    ("reference", "SPEC=mtp SPEC=off", "refused: --reference SPEC=off: SPEC is given twice "
                                       "(SPEC=mtp too); accepted: each name once"),
    ("candidate", "MAX_NUM_SEQS=0", "refused: --candidate: MAX_NUM_SEQS=0: accepted: an "
                                    "integer 1..64"),
    ("candidate", "EXTRA_ARGS='--oops", "refused: --candidate EXTRA_ARGS='--oops: No closing "
                                        "quotation; accepted: shell words (quote a value that "
                                        "holds spaces or JSON)"),
])
def test_refusals_are_one_line_naming_the_side(environ, role, text, line):
    assert refusal(role, text) == line


def test_the_run_sh_refusals_apply_to_each_side(environ):
    """The reference is held to run.sh's refusals whole: NVFP4 target groups need the force."""
    assert refusal("reference", "TARGET_WEIGHT_FORMAT=nvfp4").startswith(
        "refused: --reference: TARGET_WEIGHT_FORMAT=nvfp4: NVFP4 on target groups failed the "
        "seed's v13 quality gate on KL; judge it with scripts/compare --candidate "
        "TARGET_WEIGHT_FORMAT=nvfp4")
    assert refusal("candidate", "KV_CACHE_MEMORY_BYTES=5368709120").startswith(
        "refused: --candidate: KV_CACHE_MEMORY_BYTES=5368709120: ")


def test_the_candidate_gets_only_the_forces_its_gate_stands_for(environ):
    candidate = sides.load("candidate", "TARGET_WEIGHT_FORMAT=nvfp4")
    assert candidate.lifted == ["FORCE_UNSAFE_WEIGHTS"]
    assert candidate.values["FORCE_UNSAFE_WEIGHTS"] == "1"
    assert sides.load("candidate", "TARGET_WEIGHT_FORMAT=int8").lifted == []
    given = sides.load("candidate", "TARGET_WEIGHT_FORMAT=nvfp4 FORCE_UNSAFE_WEIGHTS=1")
    assert given.lifted == []


def test_differing_knobs_and_what_counts_as_drafting_only(environ):
    reference = sides.load("reference", "")
    assert sides.differing(reference, sides.load("candidate", "")) == []
    assert sides.differing(reference, sides.load("candidate", "default")) == []
    k5 = sides.load("candidate", "NUM_SPECULATIVE_TOKENS=5 ADAPTIVE_VERIFY=0")
    assert sides.differing(reference, k5) == ["NUM_SPECULATIVE_TOKENS", "ADAPTIVE_VERIFY"]
    assert sides.drafting_only(sides.differing(reference, k5))
    assert not sides.drafting_only(["NUM_SPECULATIVE_TOKENS", "TARGET_WEIGHT_FORMAT"])
    assert sides.drafting_only([])


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    code = command.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_dry_run_prints_each_boot_its_measurements_and_its_stop(environ, monkeypatch, capsys):
    monkeypatch.setenv("DRY_RUN", "1")
    code, out, err = run_main(capsys, "--reference", "seed-pr", "--candidate",
                              "TARGET_WEIGHT_FORMAT=nvfp4", "--runs", "1")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[:3] == [
        "# compare: reference: seed-pr; candidate: TARGET_WEIGHT_FORMAT=nvfp4",
        lines[1], "# compare: FORCE_UNSAFE_WEIGHTS=1 set on the candidate: run.sh refuses its "
        "setting without it because it failed a quality gate, and the gate is what this "
        "comparison runs"]
    assert lines[1].startswith("# compare: settings that differ: NUM_SPECULATIVE_TOKENS, ")
    boots = [line for line in lines if line.startswith("# compare: boot ")]
    assert boots == ["# compare: boot 1 of 3, reference-a: seed-pr",
                     "# compare: boot 2 of 3, reference-b: seed-pr",
                     "# compare: boot 3 of 3, candidate: TARGET_WEIGHT_FORMAT=nvfp4"]
    starts = [line for line in lines if line.startswith("docker run --detach")]
    assert len(starts) == 3
    assert "glm53-sm121-v11" in starts[0] and "GLM53_TARGET_WEIGHT_FORMAT=nvfp4" in starts[2]
    assert "GLM53_FORCE_UNSAFE_WEIGHTS=1" in starts[2]
    assert sum("bench/quality.py record" in line for line in lines) == 1
    assert sum("bench/quality.py gate" in line for line in lines) == 1
    assert sum("--runs 1" in line for line in lines) == 3
    assert not (environ["RUNS_DIR"] and os.path.exists(environ["RUNS_DIR"]))  # wrote nothing


@pytest.mark.parametrize("argv, line", [
    (("--candidate", ""), "refused: scripts/compare: --reference is missing; accepted: "
                          "--reference PROFILE_OR_KNOBS --candidate PROFILE_OR_KNOBS, or "
                          "--resume DIR"),
    (("--reference", "", "--candidate", "", "--runs", "0"),
     "refused: scripts/compare: argument --runs: '0' is not an integer of 1 or more; see "
     "scripts/compare --help"),
    (("--reference", "", "--candidate", "", "--concurrency", "1,1"),
     "refused: scripts/compare: argument --concurrency: '1,1' is not a comma list of distinct "
     "integers of 1 or more; see scripts/compare --help"),
    (("--reference", "", "--candidate", "", "--phase", "prose"),
     "refused: scripts/compare: unrecognized arguments: --phase prose; see scripts/compare --help"),
])
def test_option_refusals(environ, capsys, argv, line):
    code, out, err = run_main(capsys, *argv)
    assert (code, out, err) == (2, "", line + "\n")


def test_a_bench_concurrency_beyond_a_sides_max_num_seqs_is_refused_before_any_boot(
        environ, capsys):
    """Not booted, then refused by the bench (or, before, measured as the server's queue)."""
    code, out, err = run_main(capsys, "--reference", "", "--candidate", "MAX_NUM_SEQS=4",
                              "--concurrency", "1,2,4")
    assert (code, out, err) == (2, "", "refused: scripts/compare --concurrency 1,2,4: beyond the "
                                "reference's MAX_NUM_SEQS 2, those streams would wait in its "
                                "queue; accepted: concurrencies up to 2, or MAX_NUM_SEQS=N in "
                                "the --reference words\n")


def test_the_bench_is_told_each_sides_max_num_seqs(environ, monkeypatch, capsys):
    monkeypatch.setenv("DRY_RUN", "1")
    code, out, err = run_main(capsys, "--reference", "MAX_NUM_SEQS=4", "--candidate",
                              "MAX_NUM_SEQS=4 NUM_SPECULATIVE_TOKENS=5", "--concurrency", "1,4")
    assert code == 0, err
    benches = [line for line in out.splitlines() if "bench/bench_decode.py" in line]
    assert len(benches) == 3 and all(" --concurrency 1,4 " in line and " --max-num-seqs 4" in line
                                     for line in benches), benches


def test_a_report_directory_that_holds_anything_is_refused(environ, tmp_path, capsys):
    out_dir = tmp_path / "mine"
    out_dir.mkdir()
    (out_dir / "notes.txt").write_text("a user's file\n")
    code, _, err = run_main(capsys, "--reference", "", "--candidate", "", "--out", str(out_dir))
    assert code == 2
    assert err == (f"refused: --out {out_dir}: it exists and is not an empty directory; accepted: "
                   "a new directory, or --resume DIR to continue the comparison saved there\n")
    assert [p.name for p in out_dir.iterdir()] == ["notes.txt"]


def saved(tmp_path, reference="", candidate="SPEC=off", **options) -> RunDir:
    ref, cand = sides.load("reference", reference), sides.load("candidate", candidate)
    return RunDir.create(tmp_path / "saved", {
        "reference": command.side_doc(ref), "candidate": command.side_doc(cand),
        "options": Options(**options).to_json(), "differing": sides.differing(ref, cand)})


def test_resume_refuses_other_words_settings_or_options(environ, tmp_path, monkeypatch, capsys):
    path = saved(tmp_path).path
    code, _, err = run_main(capsys, "--resume", str(path), "--candidate", "SPEC=mtp")
    assert code == 2 and err == (f"refused: --resume {path}: the --candidate words differ from "
                                 "the saved ones: SPEC=mtp (saved: SPEC=off); accepted: the same "
                                 "settings and options, or a new comparison\n")
    code, _, err = run_main(capsys, "--resume", str(path), "--runs", "5")
    assert code == 2 and "the options differ from the saved ones: " in err
    assert "runs=5 (saved: 3)" in err
    monkeypatch.setenv("MAX_NUM_SEQS", "4")  # the environment moved since
    code, _, err = run_main(capsys, "--resume", str(path))
    assert code == 2 and err == (f"refused: --resume {path}: the reference's settings differ from "
                                 "the saved ones: MAX_NUM_SEQS=4 (saved: 2); accepted: the same "
                                 "settings and options, or a new comparison\n")
    code, _, err = run_main(capsys, "--resume", str(tmp_path))
    assert code == 2 and err.startswith(f"refused: --resume {tmp_path}: no compare.json of "
                                        "scripts/compare (compare/1) in it")
    code, _, err = run_main(capsys, "--resume", str(path), "--out", str(tmp_path / "x"))
    assert code == 2 and "--resume DIR without --out or --reference-from" in err


def test_reference_from_needs_finished_boots_of_the_same_reference_and_options(
        environ, tmp_path, capsys):
    earlier = saved(tmp_path, runs=1)
    args = ["--candidate", "SPEC=off", "--reference-from", str(earlier.path), "--runs", "1"]
    code, _, err = run_main(capsys, "--reference", "", *args)
    assert code == 2 and err == (f"refused: --reference-from {earlier.path}: its boot reference-a "
                                 "did not finish; accepted: a comparison whose two reference boots "
                                 f"finished (or --resume {earlier.path})\n")
    for boot in ("reference-a", "reference-b"):
        earlier.boot_dir(boot).mkdir()
        earlier.save_boot(boot, {"boot": boot, "status": "finished"})
    code, _, err = run_main(capsys, "--reference", "MAX_NUM_SEQS=1", *args)
    assert code == 2 and "the reference's settings differ from the saved ones: MAX_NUM_SEQS=1 " \
                         "(saved: 2)" in err
    code, _, err = run_main(capsys, "--reference", "", *args[:-2])
    assert code == 2 and "the options differ from the saved ones: runs=3 (saved: 1)" in err
    assert json.loads((earlier.path / "compare.json").read_text())["boots"]["reference-a"] == \
        {"boot": "reference-a", "status": "finished"}


def test_resume_and_reference_from_refuse_boots_of_another_recipe_commit(
        environ, tmp_path, monkeypatch, capsys):
    """Boots measured on another commit of the recipe (its launcher, bench and layers) are
    not mixed with boots of this one (issue 35, finding 6); what each boot served (image,
    model and drafter revisions) is checked once it is up, and again by the verdict."""
    monkeypatch.setattr(command.boots, "tools_missing", lambda: None)
    monkeypatch.setattr(command.boots, "not_free", lambda side: "(the refusal came too late)")
    earlier = saved(tmp_path)
    for boot in ("reference-a", "reference-b"):
        earlier.boot_dir(boot).mkdir()
        earlier.save_boot(boot, {"boot": boot, "status": "finished",
                                 "served": {"recipe_commit": "0" * 40}})
    code, _, err = run_main(capsys, "--resume", str(earlier.path))
    stale = f"boot reference-a was measured on recipe commit {'0' * 40}, this checkout is "
    assert code == 2 and err.startswith(f"refused: --resume {earlier.path}: {stale}"), err
    assert err == (f"refused: --resume {earlier.path}: {stale}{rundir.recipe_commit()}; "
                   "accepted: boots of this commit (check it out, or start a new comparison)\n")
    code, _, err = run_main(capsys, "--reference", "", "--candidate", "SPEC=off",
                            "--reference-from", str(earlier.path))
    assert code == 2 and err.startswith(f"refused: --reference-from {earlier.path}: {stale}"), err
