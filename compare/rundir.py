"""The report directory of a comparison and what it keeps.

    DIR/compare.json            the sides, the options, each boot's record, results, verdict
    DIR/report.md, compare.png  the summary and its picture
    DIR/boots/<boot>/           each boot's files, each written as soon as it is measured
    DIR/boots/<boot>/boot.json  the boot's record (status, times, each measurement's exit)

A new DIR must be empty or absent. --resume DIR continues the comparison saved there (its
sides and options; the settings they resolve to now must be the saved ones) and reuses its
finished boots; a boot that did not finish is set aside as <boot>.attempt-N, never deleted.
--reference-from DIR copies the finished reference boots of another comparison whose
reference settings and options are this one's. Each boot records what it served (`served`:
the image ID, the recipe's commit, the model's and the drafter's revisions); boots that differ
in any of them, where the sides' settings do not say they should, are never compared.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from launcher.plan.load import ROOT
from launcher.plan.settings import Refused

SCHEMA = "compare/1"
PLAN_FILE = "compare.json"
BOOT_FILE = "boot.json"
# boot -> (side, quality.py command): the reference twice (record, then the A/A band), then
# the candidate (gated against both)
BOOTS = {"reference-a": ("reference", "record"), "reference-b": ("reference", "aa"),
         "candidate": ("candidate", "gate")}
REFERENCE_BOOTS = ("reference-a", "reference-b")
# in a boot's folder: the file each quality.py command writes, and each receipt's
QUALITY_FILES = {"record": "record.json", "aa": "band.json", "gate": "gate.json"}
RECEIPTS = ("solo-vs-concurrent", "resumed-vs-fresh")
# bench/probes.py's integrity probes, run on every boot into PROBES_FILE (docs/probes.md)
INTEGRITY_PROBES = ("multibyte", "tool_cycles")
PROBES_FILE = "probes.json"
FINISHED = "finished"
# what a boot served (its record's `served`) -> the knobs that may make it differ between the
# reference and the candidate; the two reference boots must agree in every one
SERVED = {"image_id": ("IMAGE",), "recipe_commit": (),
          "model_revision": ("MODEL", "MODEL_REVISION"),
          "drafter_revision": ("SPEC", "DRAFTER", "DRAFTER_REVISION")}


def recipe_commit(root: Path = ROOT) -> str:
    """The recipe's commit (launcher, bench, layers): HEAD, and where tracked files differ
    from it `-dirty-` and a hash of that difference, so two different edits never match."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                              check=False)
    try:
        head = git("rev-parse", "HEAD")
    except OSError:
        return "unknown (git is not installed)"
    if head.returncode != 0:
        return "unknown (not a git checkout)"
    commit = head.stdout.decode().strip()
    diff = git("diff", "HEAD", "--binary").stdout
    return f"{commit}-dirty-{hashlib.sha256(diff).hexdigest()[:12]}" if diff else commit


def served_conflicts(records: dict[str, dict], differing: list[str]) -> list[str]:
    """Why boots RECORDS (boot -> record) may not be compared: a boot that records nothing of
    what it served, or two boots that served another image, recipe commit or revision where
    the knobs that DIFFER between the sides do not account for it; [] when none."""
    problems = []
    for boot in BOOTS:
        if boot in records and "served" not in records[boot]:
            problems.append(f"boot {boot} records not what it served (an older scripts/compare "
                            "ran it)")
    for first, second in (("reference-a", "reference-b"), ("reference-a", "candidate"),
                          ("reference-b", "candidate")):
        if first not in records or second not in records:
            continue
        sides_differ = BOOTS[first][0] != BOOTS[second][0]
        a, b = records[first].get("served"), records[second].get("served")
        if a is None or b is None:
            continue
        for field, knobs in SERVED.items():
            if a.get(field) != b.get(field) and not (
                    sides_differ and any(knob in differing for knob in knobs)):
                settings = "the settings do not differ there" if sides_differ \
                    else "both are the reference"
                problems.append(f"boot {second} served {field} {b.get(field)} where boot "
                                f"{first} served {a.get(field)} ({settings})")
    return problems


@dataclass(frozen=True)
class Options:
    """What every boot is measured with (the same on every boot, or the comparison is void)."""
    concurrency: tuple[int, ...] = (1, 2)
    runs: int = 3
    max_tokens: int = 200
    check_tokens: int = 128
    needle_words: int = 6000
    turn_tokens: tuple[int, ...] = ()  # the bench's turns phase, its prompt sizes; () = not run

    def to_json(self) -> dict:
        return dict(asdict(self), concurrency=list(self.concurrency),
                    turn_tokens=list(self.turn_tokens))

    @classmethod
    def from_json(cls, doc: dict) -> Options:
        return cls(**dict(doc, concurrency=tuple(doc["concurrency"]),
                          turn_tokens=tuple(doc.get("turn_tokens", ()))))


def refused(option: str, value: str, why: str) -> Refused:
    return Refused(f"refused: {option} {value}: {why}")


def write_json(path: Path, doc: dict) -> None:
    """Through a temporary file: an interrupted write leaves the previous file whole."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    os.replace(partial, path)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


class RunDir:
    def __init__(self, path: Path, plan: dict):
        self.path, self.plan = path, plan

    # -- opening ---------------------------------------------------------------------------
    @staticmethod
    def check_new(path: Path) -> None:
        """A new report directory must not hold anything (a user's files stay theirs)."""
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise refused("--out", str(path), "it exists and is not an empty directory; accepted: "
                          "a new directory, or --resume DIR to continue the comparison saved there")

    @classmethod
    def create(cls, path: Path, plan: dict) -> RunDir:
        cls.check_new(path)
        (path / "boots").mkdir(parents=True, exist_ok=True)
        run_dir = cls(path, dict(plan, schema=SCHEMA, boots={}))
        run_dir.save()
        return run_dir

    @classmethod
    def saved_plan(cls, path: Path, option: str) -> dict:
        plan = read_json(path / PLAN_FILE)
        if not plan or plan.get("schema") != SCHEMA:
            raise refused(option, str(path), f"no {PLAN_FILE} of scripts/compare ({SCHEMA}) in it; "
                          "accepted: a report directory scripts/compare wrote")
        return plan

    @classmethod
    def resume(cls, path: Path) -> RunDir:
        return cls(path, cls.saved_plan(path, "--resume"))

    # -- boots -----------------------------------------------------------------------------
    def boot_dir(self, boot: str) -> Path:
        return self.path / "boots" / boot

    def boot_record(self, boot: str) -> dict | None:
        return read_json(self.boot_dir(boot) / BOOT_FILE)

    def finished(self, boot: str) -> bool:
        return (self.boot_record(boot) or {}).get("status") == FINISHED

    def fresh_boot_dir(self, boot: str) -> Path:
        """An empty folder for BOOT; an earlier attempt's files are set aside, not lost."""
        folder = self.boot_dir(boot)
        if folder.exists():
            attempt = 1
            while folder.with_name(f"{boot}.attempt-{attempt}").exists():
                attempt += 1
            folder.rename(folder.with_name(f"{boot}.attempt-{attempt}"))
        folder.mkdir(parents=True)
        return folder

    def save_boot(self, boot: str, record: dict) -> None:
        write_json(self.boot_dir(boot) / BOOT_FILE, record)
        self.plan["boots"][boot] = record
        self.save()

    def copy_references_from(self, other: Path) -> None:
        for boot in REFERENCE_BOOTS:
            shutil.copytree(other / "boots" / boot, self.boot_dir(boot))
            record = dict(self.boot_record(boot), copied_from=str(other / "boots" / boot))
            self.save_boot(boot, record)

    # -- the plan --------------------------------------------------------------------------
    def save(self) -> None:
        write_json(self.path / PLAN_FILE, self.plan)


def check_same(option: str, path: Path, what: str, saved, now) -> None:
    """SAVED and NOW must be equal; else one line naming the first difference."""
    if saved == now:
        return
    if isinstance(saved, dict) and isinstance(now, dict):
        names = [name for name in dict.fromkeys([*saved, *now]) if saved.get(name) != now.get(name)]
        shown = ", ".join(f"{name}={now.get(name, '')!s} (saved: {saved.get(name, '')!s})"
                          for name in names[:3])
    else:
        shown = f"{now} (saved: {saved})"
    raise refused(option, str(path), f"{what} differ from the saved ones: {shown}; accepted: the "
                  "same settings and options, or a new comparison")


def check_recipe_commit(option: str, path: Path, records: dict[str, dict]) -> None:
    """Finished boots of RECORDS measured on another commit of the recipe are refused, before
    anything boots (what they served otherwise is checked once the next boot is up)."""
    now = recipe_commit()
    for boot, record in records.items():
        then = (record.get("served") or {}).get("recipe_commit")
        if record.get("status") == FINISHED and then != now:
            raise refused(option, str(path), f"boot {boot} was measured on recipe commit {then}, "
                          f"this checkout is {now}; accepted: boots of this commit (check it "
                          "out, or start a new comparison)")


def reference_source(path: Path, reference_values: dict, options: Options) -> None:
    """Refuses a --reference-from DIR whose reference boots cannot stand for this one's."""
    plan = RunDir.saved_plan(path, "--reference-from")
    records = {}
    for boot in REFERENCE_BOOTS:
        record = records[boot] = read_json(path / "boots" / boot / BOOT_FILE) or {}
        if record.get("status") != FINISHED:
            raise refused("--reference-from", str(path), f"its boot {boot} did not finish; "
                          f"accepted: a comparison whose two reference boots finished (or --resume "
                          f"{path})")
    check_same("--reference-from", path, "the reference's settings", plan["reference"]["values"],
               reference_values)
    check_same("--reference-from", path, "the options", plan["options"], options.to_json())
    check_recipe_commit("--reference-from", path, records)
