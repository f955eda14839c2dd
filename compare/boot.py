"""One boot of a comparison: the launcher's run (launcher/pipeline.py, settings resolved as
run.sh resolves them), then each measurement as its own bench/ command against the served
API, then stop.sh's stop, always. A rank that dies while it is measured ends the boot: its
logs are kept beside the boot's files, every rank is stopped, and the record says why.

The measurements run as commands (python3 bench/...), so the launcher imports nothing of
bench/ and needs nothing beyond the standard library; their result files are bench/'s
documented contracts (docs/bench.md, docs/quality.md). Every measurement in `measurements()`
is owed by every boot: it leaves its result (an exit its tool gives for a result, and a file
that holds that result) or the comparison is void, here as soon as it ends and again in the
verdict (results.py). Each runs under crash_guard.py, so an exception that escapes a tool is
a crash (exit 70), never the exit 1 of a failed result.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from compare.crash_guard import CRASHED
from compare.rundir import (
    BOOTS,
    FINISHED,
    INTEGRITY_PROBES,
    PROBES_FILE,
    QUALITY_FILES,
    RECEIPTS,
    Options,
    RunDir,
    read_json,
    recipe_commit,
    served_conflicts,
)
from compare.sides import Side
from launcher import pipeline
from launcher.apply.remote import Remote
from launcher.plan import commands, plan
from launcher.plan.data import rank_container
from launcher.plan.load import ROOT
from launcher.plan.settings import Failed, Refused, RefusedAbove

BENCH = ROOT / "bench"
RANK_LOG_LINES = 200
# the bench tools' own imports, checked before anything boots (matplotlib only draws the
# picture: without it the report says so)
TOOL_MODULES = ("aiohttp", "prometheus_client", "rich")
CRASH_GUARD = Path(__file__).with_name("crash_guard.py")
# the checkout's venv, where README installs the bench's packages (a system python3 under
# PEP 668 refuses them): the bench's tools run on its python when it exists
BENCH_VENV_PYTHON = ROOT / ".venv" / "bin" / "python"
BENCH_INSTALL = "python3 -m venv .venv && .venv/bin/pip install -r requirements/bench.txt"
# bench/prompts.py's PHASES: the cells `--phase all` owes at each concurrency (the launcher
# imports nothing of bench/; tests/unit/test_compare_verdict.py holds the two equal)
BENCH_PHASES = ("prose", "structured", "code")


def bench_python() -> str:
    """The python the bench's tools run on: the checkout's venv, else this one."""
    return str(BENCH_VENV_PYTHON) if BENCH_VENV_PYTHON.is_file() else sys.executable


def json_object(doc, code: int) -> str:
    """Any tool's result: a JSON object ("" when DOC is one, else why it is not)."""
    return "" if isinstance(doc, dict) else "not a JSON object"


def _verdict_agrees(doc: dict, code: int) -> str:
    """A tool that writes `passed` exits 0 when it passed and 1 when it failed."""
    if not isinstance(doc.get("passed"), bool):
        return "no passed verdict"
    if code != (0 if doc["passed"] else 1):
        return f"passed is {str(doc['passed']).lower()} but the tool exited {code}"
    return ""


def receipt_result(doc, code: int) -> str:
    """bench/receipts.py --json: its verdict, agreeing with its exit."""
    return json_object(doc, code) or _verdict_agrees(doc, code)


def bench_result(concurrency: tuple[int, ...]) -> Callable[[dict, int], str]:
    """bench/bench_decode.py --json: written after each cell, finished_at set when all ran,
    and holding a cell for every phase at every concurrency in CONCURRENCY."""
    owed = [(phase, c) for phase in BENCH_PHASES for c in concurrency]

    def check(doc, code: int) -> str:
        if why := json_object(doc, code):
            return why
        if not doc.get("finished_at"):
            return "the bench did not finish (no finished_at)"
        if not isinstance(doc.get("cells"), list) or not doc["cells"]:
            return "no cells"
        found = {(cell.get("phase"), cell.get("concurrency")) for cell in doc["cells"]
                 if isinstance(cell, dict)}
        lacking = [f"{phase} c={c}" for phase, c in owed if (phase, c) not in found]
        return f"no cell for {', '.join(lacking)}" if lacking else ""
    return check


def quality_result(kind: str) -> Callable[[dict, int], str]:
    """bench/quality.py --out: a document of KIND (the gate's with its verdict)."""
    def check(doc, code: int) -> str:
        if why := json_object(doc, code):
            return why
        if doc.get("kind") != kind:
            return f"kind {doc.get('kind')!r}, not {kind!r}"
        return _verdict_agrees(doc, code) if kind == "quality-gate" else ""
    return check


def probes_result(doc, code: int) -> str:
    """bench/probes.py --json: every integrity probe's result, the verdict agreeing with its
    exit."""
    if why := json_object(doc, code) or _verdict_agrees(doc, code):
        return why
    ran = doc.get("probes") if isinstance(doc.get("probes"), dict) else {}
    absent = [p for p in INTEGRITY_PROBES if p not in ran]
    return f"no result for {', '.join(absent)}" if absent else ""


QUALITY_KINDS = {"record": "quality-record", "aa": "quality-aa", "gate": "quality-gate"}


@dataclass(frozen=True)
class Measurement:
    key: str                 # its name in the boot's record
    title: str               # what progress says
    argv: tuple[str, ...]
    output: str              # the file it writes in the boot's folder
    results: tuple[int, ...]  # exit codes that are results (others: could not measure)
    # why OUTPUT's document (read as JSON) with that exit is not the tool's result ("": it is)
    contract: Callable[[dict, int], str] = json_object
    # run with the side's settings in its environment: the bench's platform probe
    # (scripts/doctor --platform) reads them as run.sh would
    side_settings: bool = False

    def missing(self, entry: dict | None, folder: Path) -> str:
        """Why this measurement left no result in FOLDER, ENTRY being its boot record's line
        (None: it did not run); "" when it did. The one rule of what counts as a result."""
        if entry is None:
            return f"the {self.title} did not run (its boot record has no {self.key})"
        code = entry.get("exit")
        if code == CRASHED:
            return (f"the {self.title} crashed (exit {code}: an exception escaped it; its "
                    f"traceback is in {self.key}.log with the boot's files)")
        if code not in self.results:
            return (f"the {self.title} could not run (exit {code}; its output is {self.key}.log "
                    "with the boot's files)")
        doc = read_json(folder / self.output)
        if doc is None:
            return f"the {self.title} left no result ({self.output} is missing or not JSON)"
        if why := self.contract(doc, code):
            return f"the {self.title} left no result ({self.output}: {why})"
        return ""


class BootEnded(Exception):
    """The boot could not be measured to the end (its record says why)."""


def key_file_of(side: Side) -> str | None:
    """The API key file SIDE's server was started with (API_AUTH=key), which every
    measurement reads; None when it serves open."""
    return side.values["API_KEY_FILE"] if side.values["API_AUTH"] == "key" else None


def measurements(boot: str, url: str, options: Options, run_dir: RunDir,
                 key_file: str | None = None, max_num_seqs: str | None = None
                 ) -> list[Measurement]:
    """What BOOT is measured with, in order: the quality gate's step, the receipts, the bench,
    the integrity probes (each told KEY_FILE, the server's API key file, by its path: the key
    is on no argv; the bench told MAX_NUM_SEQS, the MAX_NUM_SEQS the boot's server runs)."""
    found = _measurements(boot, url, options, run_dir)
    if max_num_seqs is not None:
        found = [replace(m, argv=(*m.argv, "--max-num-seqs", max_num_seqs))
                 if m.key == "bench" else m for m in found]
    if key_file is None:
        return found
    return [replace(m, argv=(*m.argv, "--api-key-file", key_file)) for m in found]


def _measurements(boot: str, url: str, options: Options, run_dir: RunDir) -> list[Measurement]:
    folder, python = run_dir.boot_dir(boot), bench_python()
    command = BOOTS[boot][1]
    quality = [python, str(BENCH / "quality.py"), command, "--url", url,
               "--out", str(folder / QUALITY_FILES[command])]
    if command == "record":
        quality += ["--max-tokens", str(options.check_tokens),
                    "--needle-words", str(options.needle_words)]
    else:
        quality += ["--reference", str(run_dir.boot_dir("reference-a") / QUALITY_FILES["record"])]
    if command == "gate":
        quality += ["--band", str(run_dir.boot_dir("reference-b") / QUALITY_FILES["aa"])]
    found = [Measurement("quality", f"quality {command}", tuple(quality), QUALITY_FILES[command],
                         (0, 1) if command == "gate" else (0,),
                         quality_result(QUALITY_KINDS[command]))]
    for receipt in RECEIPTS:
        found.append(Measurement(receipt, f"receipt {receipt}", (
            python, str(BENCH / "receipts.py"), receipt, "--url", url,
            "--max-tokens", str(options.check_tokens), "--json", str(folder / f"{receipt}.json")),
            f"{receipt}.json", (0, 1), receipt_result))
    found.append(Measurement("bench", (
        f"bench: every phase at c={','.join(map(str, options.concurrency))}, {options.runs} runs x "
        f"{options.max_tokens} tokens"), (
        python, str(BENCH / "bench_decode.py"), "--url", url,
        *(("--phase", "all,turns", "--turn-tokens", ",".join(map(str, options.turn_tokens)))
          if options.turn_tokens else ("--phase", "all")),
        "--concurrency", ",".join(map(str, options.concurrency)), "--runs", str(options.runs),
        "--max-tokens", str(options.max_tokens), "--json", str(folder / "bench.json")),
        "bench.json", (0, 1), bench_result(options.concurrency), side_settings=True))
    found.append(Measurement("probes", f"integrity probes: {', '.join(INTEGRITY_PROBES)}", (
        python, str(BENCH / "probes.py"), "--url", url, "--only", ",".join(INTEGRITY_PROBES),
        "--json", str(folder / PROBES_FILE)), PROBES_FILE, (0, 1), probes_result))
    return found


def owed_missing(boot: str, record: dict, options: Options, run_dir: RunDir) -> list[str]:
    """What BOOT (its RECORD) owes and did not leave: one line per measurement, naming it."""
    measured = record.get("measurements") or {}
    folder = run_dir.boot_dir(boot)
    return [why for m in measurements(boot, "", options, run_dir)
            if (why := m.missing(measured.get(m.key), folder))]


def guarded(argv: tuple[str, ...]) -> list[str]:
    """A python tool's argv run through crash_guard.py (other commands as they are)."""
    if len(argv) > 1 and argv[1].endswith(".py"):
        return [argv[0], str(CRASH_GUARD), *argv[1:]]
    return list(argv)


def tools_missing() -> str | None:
    """The bench's packages the bench's python lacks, as one line, or None."""
    python = bench_python()
    probe = subprocess.run([python, "-c", f"import {', '.join(TOOL_MODULES)}"],
                           capture_output=True, text=True, check=False)
    if probe.returncode == 0:
        return None
    return (f"{python} cannot import the bench's packages ({', '.join(TOOL_MODULES)}): "
            f"{probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else 'import failed'}")


@contextmanager
def own_signals():
    """The launcher's run sets SIGINT and SIGTERM for a process that ends with it; a
    comparison goes on, so its handlers come back after each launcher call."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def minutes(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def why_dead(side: Side) -> str | None:
    """What shows a boot is gone: a rank container not running, or /health not 200."""
    nodes = Remote.of(plan.nodes_of(side.checked))
    for index, node in enumerate(nodes.addresses):
        status = nodes.output(index, commands.container_status_argv(index)) or "missing"
        if status != "running":
            return f"rank {index} ({rank_container(index)} on {node}) is {status}"
    probe = subprocess.run(commands.api_probe_argv(side.values["PORT"], "health"), check=False)
    if probe.returncode != 0:
        return f"{side.url}/health does not answer 200"
    return None


def not_free(side: Side) -> str | None:
    """Why a boot may not start on SIDE's nodes (serve containers already running there, which
    a boot must neither boot over nor stop, or a node whose Docker does not answer), or None."""
    nodes = Remote.of(plan.nodes_of(side.checked))
    for index, node in enumerate(nodes.addresses):
        names = nodes.output(index, commands.running_ranks_argv())
        if names is None:
            return f"cannot reach Docker on {node}"
        if names.split():
            return f"already running: {' '.join(names.split())} on {node}"
    return None


def keep_rank_logs(side: Side, folder: Path) -> None:
    nodes = Remote.of(plan.nodes_of(side.checked))
    for index in range(len(nodes.addresses)):
        container = rank_container(index)
        with (folder / f"{container}.log").open("w") as log:
            subprocess.run(nodes.argv(index, ["docker", "logs", "--tail", str(RANK_LOG_LINES),
                                              container]),
                           stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                           check=False)


class Boot:
    def __init__(self, boot: str, side: Side, options: Options, run_dir: RunDir, say,
                 others: dict[str, dict] | None = None, differing: list[str] | None = None):
        """OTHERS: the finished boots of this comparison (boot -> record), whose served image,
        recipe commit and revisions this boot must match where DIFFERING knobs do not say
        otherwise."""
        self.boot, self.side, self.options, self.run_dir, self.say = (boot, side, options,
                                                                     run_dir, say)
        self.others, self.differing = others or {}, differing or []
        self.folder = run_dir.fresh_boot_dir(boot)
        self.record = {"boot": boot, "role": side.role, "settings": side.text,
                       "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "status": "booting", "measurements": {}}

    def save(self) -> None:
        self.run_dir.save_boot(self.boot, self.record)

    def run(self) -> dict:
        started = time.monotonic()
        self.save()
        if busy := not_free(self.side):
            # someone else's ranks: neither boot over them nor stop them
            self.record.update(status="failed", why=f"{busy}; run ./stop.sh first", wall_s=0.0)
            self.save()
            return self.record
        try:
            served: dict = {}
            try:
                with own_signals():
                    pipeline.run(self.side.checked, ROOT, served)
            except (Failed, Refused, RefusedAbove) as failure:
                line = getattr(failure, "line", None) or str(failure) or "refused (see above)"
                raise BootEnded(f"the launcher did not bring it up: {line}") from None
            self.record["served"] = {**served, "recipe_commit": recipe_commit()}
            if mixed := served_conflicts({**self.others, self.boot: self.record},
                                         self.differing):
                raise BootEnded(f"{mixed[0]}; start a new comparison")
            self.record["boot_s"] = round(time.monotonic() - started, 1)
            self.record["status"] = "measuring"
            self.say(f"ready after {minutes(self.record['boot_s'])}")
            self.save()
            for measurement in measurements(self.boot, self.side.url, self.options, self.run_dir,
                                            key_file_of(self.side),
                                            self.side.values["MAX_NUM_SEQS"]):
                self.measure(measurement)
            self.record["status"] = FINISHED
        except BootEnded as ended:
            self.record.update(status="failed", why=str(ended))
        # anything else is recorded too: the ranks are stopped and the run reports it
        except Exception as error:  # noqa: BLE001
            self.record.update(status="failed", why=f"{type(error).__name__}: {error}")
        except KeyboardInterrupt:
            self.record.update(status="interrupted", why="interrupted (Ctrl-C or SIGTERM)")
            raise
        finally:
            self.stop()
            self.record["wall_s"] = round(time.monotonic() - started, 1)
            if "boot_s" in self.record:
                self.record["measure_s"] = round(self.record["wall_s"] - self.record["boot_s"], 1)
            self.save()
        return self.record

    def measure(self, measurement: Measurement) -> None:
        self.say(measurement.title)
        started = time.monotonic()
        env = ({**os.environ, **self.side.assigned, **{f: "1" for f in self.side.lifted}}
               if measurement.side_settings else None)
        with (self.folder / f"{measurement.key}.log").open("w") as log:
            code = subprocess.run(guarded(measurement.argv), stdout=log, env=env,
                                  stdin=subprocess.DEVNULL, check=False).returncode
        entry = {"exit": code, "file": measurement.output,
                 "seconds": round(time.monotonic() - started, 1)}
        self.record["measurements"][measurement.key] = entry
        self.save()
        if code != 0 and (dead := why_dead(self.side)):
            keep_rank_logs(self.side, self.folder)
            self.record["failed_during"] = measurement.title
            raise BootEnded(f"{dead} during the {measurement.title} (its rank logs are kept "
                            "with the boot's files); every rank was stopped")
        if why := measurement.missing(entry, self.folder):
            self.record["failed_during"] = measurement.title
            raise BootEnded(why)

    def stop(self) -> None:
        """stop.sh's stop; a failure to stop is said and recorded, never hidden."""
        interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            pipeline.stop(self.side.checked)
            self.record["stopped"] = True
        except Failed as failure:
            self.record["stopped"] = False
            self.say(f"could not stop every rank: {failure}; run ./stop.sh")
        finally:
            signal.signal(signal.SIGINT, interrupt)
