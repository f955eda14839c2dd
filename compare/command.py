"""scripts/compare: the options, the refusals, the report directory and the three boots in
order, then the report and the verdict.

    scripts/compare --reference PROFILE_OR_KNOBS --candidate PROFILE_OR_KNOBS [options]
    scripts/compare --resume DIR

Exit codes: 0 the candidate passes, 1 it fails (the verdict line names what failed), 2 the
comparison could not be made (a refusal, a boot that failed, a measurement that could not
run), 130 interrupted. docs/compare.md says more.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from compare import boot as boots
from compare import platform as compare_platform
from compare import report, results, sides
from compare.rundir import (
    BOOTS,
    Options,
    RunDir,
    check_recipe_commit,
    check_same,
    reference_source,
)
from launcher import pipeline
from launcher.plan.load import ROOT
from launcher.plan.settings import Refused
from launcher.plan.words import quote

PREFIX = "compare: "


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):
        raise Refused(f"refused: scripts/compare: {message}; see scripts/compare --help")


def _concurrency(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1 or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of distinct integers of "
                                         "1 or more")
    return values


def _growing(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        values = ()
    if not values or values[0] < 256 or any(b <= a for a, b in zip(values, values[1:])):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of growing prompt sizes "
                                         "of 256 tokens or more")
    return values


def _at_least(minimum: int):
    def parse(text: str) -> int:
        if not text.isdigit() or int(text) < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer of {minimum} or more")
        return int(text)
    return parse


def build_parser() -> argparse.ArgumentParser:
    defaults = Options()
    p = OneLineParser(prog="scripts/compare", allow_abbrev=False,
                      description="Boot a reference twice and a candidate once through the "
                                  "launcher; gate, bench and receipts on each; one verdict.")
    p.add_argument("--reference", metavar="PROFILE_OR_KNOBS",
                   help="a profile or NAME=VALUE words over the environment, e.g. PROFILE=seed-pr")
    p.add_argument("--candidate", metavar="PROFILE_OR_KNOBS",
                   help="the same, e.g. 'TARGET_WEIGHT_FORMAT=nvfp4'")
    p.add_argument("--concurrency", type=_concurrency,
                   help=f"the bench's streams (default {','.join(map(str, defaults.concurrency))})")
    p.add_argument("--runs", type=_at_least(1),
                   help=f"bench waves a cell (default {defaults.runs})")
    p.add_argument("--max-tokens", type=_at_least(2),
                   help=f"bench tokens a stream (default {defaults.max_tokens})")
    p.add_argument("--check-tokens", type=_at_least(1),
                   help=f"greedy tokens a prompt of the gate and the receipts (default "
                        f"{defaults.check_tokens})")
    p.add_argument("--needle-words", type=_at_least(20),
                   help=f"the gate's long prompt in words (default {defaults.needle_words})")
    p.add_argument("--turn-tokens", type=_growing,
                   help="also run the bench's turns phase, one conversation growing to these "
                        "prompt sizes, e.g. 8192,32768,65536 (default: not run)")
    p.add_argument("--out", metavar="DIR", help="the report directory (default: "
                   "RUNS_DIR/compare-<UTC time>)")
    p.add_argument("--resume", metavar="DIR", help="continue the comparison saved in DIR, "
                   "reusing its finished boots")
    p.add_argument("--reference-from", metavar="DIR", help="reuse the two finished reference "
                   "boots of an earlier comparison with the same reference and options")
    return p


def say(message: str) -> None:
    print(f"{PREFIX}{message}", flush=True)


def options_of(opts: argparse.Namespace, saved: dict | None = None) -> Options:
    """The options given, else the saved ones (--resume), else the defaults."""
    base = Options.from_json(saved) if saved else Options()
    given = {name: getattr(opts, name) for name in ("concurrency", "runs", "max_tokens",
                                                    "check_tokens", "needle_words", "turn_tokens")
             if getattr(opts, name) is not None}
    return Options(**{**base.to_json(), "concurrency": base.concurrency, **given})


def side_doc(side: sides.Side) -> dict:
    return {"words": side.text, "assigned": side.assigned, "values": side.values,
            "lifted": side.lifted}


@dataclass
class Asked:
    """What the command line asks, every part checked; nothing written yet."""
    reference: sides.Side
    candidate: sides.Side
    options: Options
    resume: RunDir | None = None      # --resume: the saved comparison
    out: Path | None = None           # else the new report directory
    reference_from: Path | None = None


def asked(opts: argparse.Namespace) -> Asked:
    """The sides and options (given, or saved for --resume), each refused in one line when
    it cannot be run or would mix two comparisons."""
    if opts.resume:
        if opts.out or opts.reference_from:
            raise Refused("refused: scripts/compare --resume: it continues the saved comparison "
                          "in its own directory; accepted: --resume DIR without --out or "
                          "--reference-from")
        path = Path(opts.resume)
        run_dir = RunDir.resume(path)
        saved = run_dir.plan
        for role in sides.ROLES:
            given = getattr(opts, role)
            if given is not None:
                check_same("--resume", path, f"the --{role} words", saved[role]["words"], given)
        reference = sides.load("reference", saved["reference"]["words"])
        candidate = sides.load("candidate", saved["candidate"]["words"])
        options = options_of(opts, saved["options"])
        for role, side in (("reference", reference), ("candidate", candidate)):
            check_same("--resume", path, f"the {role}'s settings", saved[role]["values"],
                       side.values)
        check_same("--resume", path, "the options", saved["options"], options.to_json())
        check_recipe_commit("--resume", path, saved.get("boots", {}))
        return Asked(reference, candidate, options, resume=run_dir)
    for role in sides.ROLES:
        if getattr(opts, role) is None:
            raise Refused(f"refused: scripts/compare: --{role} is missing; accepted: --reference "
                          "PROFILE_OR_KNOBS --candidate PROFILE_OR_KNOBS, or --resume DIR")
    reference = sides.load("reference", opts.reference)
    candidate = sides.load("candidate", opts.candidate)
    options = options_of(opts)
    source = Path(opts.reference_from) if opts.reference_from else None
    if source:
        reference_source(source, reference.values, options)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = Path(opts.out) if opts.out else Path(reference.values["RUNS_DIR"]) / f"compare-{stamp}"
    RunDir.check_new(out)
    return Asked(reference, candidate, options, out=out, reference_from=source)


def check_concurrency(options: Options, *both: sides.Side) -> None:
    """Refused: a bench concurrency beyond a side's MAX_NUM_SEQS (the bench would refuse it
    after the boot; its cell would time the server's queue)."""
    for side in both:
        seqs = int(side.values["MAX_NUM_SEQS"])
        if max(options.concurrency) > seqs:
            raise Refused(f"refused: scripts/compare --concurrency "
                          f"{','.join(map(str, options.concurrency))}: beyond the {side.role}'s "
                          f"MAX_NUM_SEQS {seqs}, those streams would wait in its queue; accepted: "
                          f"concurrencies up to {seqs}, or MAX_NUM_SEQS=N in the --{side.role} "
                          "words")


def open_run(ask: Asked) -> RunDir:
    """The saved comparison (--resume), or a new report directory holding the plan (and the
    reference boots --reference-from names)."""
    if ask.resume:
        return ask.resume
    reference, candidate = ask.reference, ask.candidate
    plan = {"created_at": time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()),
            "reference": side_doc(reference), "candidate": side_doc(candidate),
            "options": ask.options.to_json(), "differing": sides.differing(reference, candidate)}
    run_dir = RunDir.create(ask.out, plan)
    if ask.reference_from:
        run_dir.copy_references_from(ask.reference_from)
    return run_dir


def notes(reference: sides.Side, candidate: sides.Side) -> list[str]:
    """What a comparison says before it boots: the sides, what differs, what it sets."""
    lines = [f"reference: {reference.describe()}; candidate: {candidate.describe()}"]
    differing = sides.differing(reference, candidate)
    if not differing:
        lines.append("the candidate's settings are the reference's: this is an A/A check (it "
                     "should pass the gate at the band, its speed within the reference boots' "
                     "spread)")
    else:
        lines.append(f"settings that differ: {', '.join(differing)}")
    for force in candidate.lifted:
        lines.append(f"{force}=1 set on the candidate: run.sh refuses its setting without it "
                     "because it failed a quality gate, and the gate is what this comparison runs")
    return lines


def print_dry_run(reference: sides.Side, candidate: sides.Side, options: Options) -> None:
    """Every boot's launcher commands, measurements and stop, one a line (DRY_RUN=1)."""
    for line in notes(reference, candidate):
        print(f"# {PREFIX}{line}")
    placeholder = RunDir(Path("<report-dir>"), {})
    for index, boot in enumerate(BOOTS, 1):
        side = reference if BOOTS[boot][0] == "reference" else candidate
        print(f"# {PREFIX}boot {index} of {len(BOOTS)}, {boot}: {side.describe()}", flush=True)
        pipeline.run(side.checked, ROOT)
        print(f"# {PREFIX}{boot}'s measurements against {side.url}")
        for measurement in boots.measurements(boot, side.url, options, placeholder,
                                              boots.key_file_of(side),
                                              side.values["MAX_NUM_SEQS"]):
            print(quote(list(measurement.argv)))
        print(f"# {PREFIX}stop {boot}", flush=True)
        pipeline.stop(side.checked)


def run_boots(run_dir: RunDir, reference: sides.Side, candidate: sides.Side,
              options: Options) -> None:
    """Each boot in order, a finished one reused; the first that fails ends the run."""
    for index, boot in enumerate(BOOTS, 1):
        side = reference if BOOTS[boot][0] == "reference" else candidate
        label = f"[{index}/{len(BOOTS)}] {boot}"
        if run_dir.finished(boot):
            record = run_dir.boot_record(boot)
            source = record.get("copied_from") or str(run_dir.boot_dir(boot))
            if not (missing := boots.owed_missing(boot, record, options, run_dir)):
                say(f"{label}: reusing the finished boot of {record['started_at']} ({source})")
                continue
            say(f"{label}: not reusing the finished boot of {record['started_at']} ({source}): "
                f"{missing[0]}")
        say(f"{label}: booting {side.describe()} through the launcher")
        others = {b: run_dir.boot_record(b) for b in BOOTS if b != boot and run_dir.finished(b)}
        record = boots.Boot(boot, side, options, run_dir,
                            lambda message, label=label: say(f"{label}: {message}"), others,
                            run_dir.plan.get("differing", [])).run()
        times = ", ".join(f"{what} {boots.minutes(record[key])}" for what, key in
                          (("boot", "boot_s"), ("measurements", "measure_s"), ("in all", "wall_s"))
                          if key in record)
        say(f"{label}: {record['status']} ({times})" + (f": {record['why']}" if record.get("why")
                                                        else ""))
        if record["status"] != "finished":
            return


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        ask = asked(build_parser().parse_args(argv))
        reference, candidate = ask.reference, ask.candidate
        check_concurrency(ask.options, reference, candidate)
        if reference.values["DRY_RUN"] == "1":
            print_dry_run(reference, candidate, ask.options)
            return 0
        if why := boots.tools_missing():
            raise Refused(f"refused: scripts/compare: {why}; accepted: the bench's packages "
                          f"in the checkout's venv ({boots.BENCH_INSTALL})")
        if busy := boots.not_free(reference):
            raise Refused(f"refused: scripts/compare: {busy}; scripts/compare boots its own "
                          "ranks: run ./stop.sh first")
        run_dir = open_run(ask)
        for line in [*notes(reference, candidate), f"report directory: {run_dir.path}"]:
            say(line)
        started = time.monotonic()
        run_boots(run_dir, reference, candidate, ask.options)
    except Refused as refusal:
        print(refusal.line, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PREFIX}interrupted; every rank a boot started was stopped", file=sys.stderr)
        return 130
    except OSError as error:
        print(f"{PREFIX}could not run: {error}", file=sys.stderr)
        return 2
    summary = results.summarize(run_dir.path, run_dir.plan)
    verdict = results.decide(summary, run_dir.plan)
    for line in compare_platform.lines(summary["platform"]):
        say(line)
    for problem in report.write(run_dir, summary, verdict):
        say(problem)
    say(f"{boots.minutes(time.monotonic() - started)} in all; report "
        f"{run_dir.path / report.REPORT}")
    print(verdict.line, flush=True)
    if verdict.exit == 2:
        say(f"scripts/compare --resume {run_dir.path} reuses the finished boots")
    return verdict.exit
