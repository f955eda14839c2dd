"""The report directory of a comparison and what it keeps.

    DIR/compare.json            the sides, the options, each boot's record, results, verdict
    DIR/report.md, compare.png  the summary and its picture
    DIR/boots/<boot>/           each boot's files, each written as soon as it is measured
    DIR/boots/<boot>/boot.json  the boot's record (status, times, each measurement's exit)

A new DIR must be empty or absent. --resume DIR continues the comparison saved there (its
sides and options; the settings they resolve to now must be the saved ones) and reuses its
finished boots; a boot that did not finish is set aside as <boot>.attempt-N, never deleted.
--reference-from DIR copies the finished reference boots of another comparison whose
reference settings and options are this one's.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from launcher.settings import Refused

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


@dataclass(frozen=True)
class Options:
    """What every boot is measured with (the same on every boot, or the comparison is void)."""
    concurrency: tuple[int, ...] = (1, 2)
    runs: int = 3
    max_tokens: int = 200
    check_tokens: int = 128
    needle_words: int = 6000

    def to_json(self) -> dict:
        return dict(asdict(self), concurrency=list(self.concurrency))

    @classmethod
    def from_json(cls, doc: dict) -> Options:
        return cls(**dict(doc, concurrency=tuple(doc["concurrency"])))


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


def reference_source(path: Path, reference_values: dict, options: Options) -> None:
    """Refuses a --reference-from DIR whose reference boots cannot stand for this one's."""
    plan = RunDir.saved_plan(path, "--reference-from")
    for boot in REFERENCE_BOOTS:
        record = read_json(path / "boots" / boot / BOOT_FILE) or {}
        if record.get("status") != FINISHED:
            raise refused("--reference-from", str(path), f"its boot {boot} did not finish; "
                          f"accepted: a comparison whose two reference boots finished (or --resume "
                          f"{path})")
    check_same("--reference-from", path, "the reference's settings", plan["reference"]["values"],
               reference_values)
    check_same("--reference-from", path, "the options", plan["options"], options.to_json())
