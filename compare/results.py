"""The boots' saved files summed up (speed, acceptance, quality against the band, first
divergence, receipts, lossless across boots) and the verdict: exit 0 when the candidate
passes, 1 when it fails (each failure named), 2 when the comparison could not be made: a
boot that did not finish, a measurement a boot owes that left no result (boot.py's list),
boots that served different images, recipes or revisions, or a band too wide to judge by.

Pure functions of the files bench/ wrote (docs/bench.md and docs/quality.md give their
contracts) and the boots' records: nothing here runs anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from compare import boot as boots
from compare import platform as compare_platform
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
    served_conflicts,
)
from compare.sides import drafting_only

HEADLINE_PHASE = "prose"
VERDICT_PREFIX = "compare: "
# The widest band the gate may judge by, in every scope: twice the widest A/A band measured so
# far, the seed's two boots of GLM-5.3-Flash on 2x Spark (mean KL 5.9e-3 nats, top-1
# agreement 0.9833, a disagreement of 0.0167: docs/quality.md). The other A/A bands measured
# are far inside it (the GPU tier's bf16 tiny target 4.2e-4 and 1.0; the CPU engine tier's 0
# and 1.0). A band wider than this lets through a candidate with as much KL or top-1 loss, so
# it ends the comparison as too noisy to judge (exit 2), never in a pass.
BAND_CAP_KL_MEAN = 0.012
BAND_FLOOR_TOP1_AGREEMENT = 0.967


@dataclass
class Verdict:
    exit: int
    line: str
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"exit": self.exit, "line": self.line, "failures": self.failures,
                "notes": self.notes}


def boot_files(folder: Path, boot: str) -> dict:
    """What BOOT's folder holds: bench, quality and receipts documents (None: absent)."""
    return {"bench": read_json(folder / "bench.json"),
            "quality": read_json(folder / QUALITY_FILES[BOOTS[boot][1]]),
            "receipts": {r: read_json(folder / f"{r}.json") for r in RECEIPTS},
            "probes": read_json(folder / PROBES_FILE)}


def integrity(files: dict[str, dict]) -> dict:
    """probe -> boot -> {status, summary} from each boot's probes.json; a boot without the
    file (or without the probe in it) has status None."""
    found = {}
    for probe in INTEGRITY_PROBES:
        found[probe] = {}
        for boot in BOOTS:
            result = ((files[boot]["probes"] or {}).get("probes") or {}).get(probe) or {}
            found[probe][boot] = {"status": result.get("status"),
                                  "summary": result.get("summary")}
    return found


def _median(cell: dict | None, key: str) -> float | None:
    value = (cell or {}).get(key) or {}
    return value.get("median")


def _cells(doc: dict | None) -> dict[tuple[str, int], dict]:
    return {(c["phase"], c["concurrency"]): c for c in (doc or {}).get("cells", [])}


def change_pct(candidate: float | None, references: list[float | None]) -> float | None:
    known = [r for r in references if r]
    if candidate is None or not known:
        return None
    return 100.0 * (candidate / (sum(known) / len(known)) - 1.0)


def spread_pct(references: list[float | None]) -> float | None:
    """How far the two reference boots are apart, in % of their mean: the speed's A/A."""
    if len(references) != 2 or not all(references):
        return None
    a, b = references
    return 100.0 * abs(a - b) / ((a + b) / 2.0)


def speed_rows(files: dict[str, dict]) -> list[dict]:
    cells = {boot: _cells(f["bench"]) for boot, f in files.items()}
    keys = list(dict.fromkeys(k for boot in BOOTS for k in cells.get(boot, {})))
    rows = []
    for phase, c in keys:
        row = {"phase": phase, "concurrency": c, "per_stream": {}, "aggregate": {},
               "acceptance_length": {}, "failed_streams": {}, "invalid": {}}
        for boot in BOOTS:
            cell = cells.get(boot, {}).get((phase, c))
            row["per_stream"][boot] = _median(cell, "per_stream_tok_s")
            row["aggregate"][boot] = _median(cell, "aggregate_tok_s")
            row["acceptance_length"][boot] = (cell or {}).get("acceptance_length")
            row["failed_streams"][boot] = (cell or {}).get("failed_streams")
            # a restart, or a wave the server queued: the bench's own reason, or None
            row["invalid"][boot] = (cell or {}).get("invalid_reason") if (cell or {}).get(
                "invalid") else None
        references = [row["per_stream"]["reference-a"], row["per_stream"]["reference-b"]]
        row["change_pct"] = change_pct(row["per_stream"]["candidate"], references)
        row["reference_spread_pct"] = spread_pct(references)
        rows.append(row)
    return rows


def _totals(doc: dict | None) -> dict | None:
    if not doc or "overall" not in doc or "phases" not in doc:
        return None
    return {"overall": doc["overall"], "phases": doc["phases"]}


def _divergences(doc: dict | None) -> dict[str, dict]:
    return {p["phase"]: p["first_divergence"] for p in (doc or {}).get("prompts", [])}


def lossless(differing: list[str], band: dict | None, gate: dict | None) -> dict:
    """Lossless across boots: judged when the sides differ only in how tokens are drafted.
    A greedy path of the candidate that leaves reference A's (not at a near-tie) fails it,
    unless reference B left it at that prompt too (then boots differ by themselves)."""
    if not drafting_only(differing):
        names = ", ".join(n for n in differing if n not in ("",))
        return {"judged": False, "passed": None, "why": (
            f"the candidate changes {names}, not only how tokens are drafted: its tokens may "
            "differ, and the gate judges by how much")}
    if gate is None or band is None:
        return {"judged": False, "passed": None, "why": "no gate or band was measured"}
    aa, cand = _divergences(band), _divergences(gate)
    broken = []
    for phase, first in cand.items():
        if first["verdict"] == "differs" and aa.get(phase, {}).get("verdict") != "differs":
            broken.append({"phase": phase, **first})
    why = ("the sides differ only in how tokens are drafted" if differing
           else "the sides are the same settings (an A/A check)")
    return {"judged": True, "passed": not broken, "why": why, "broken": broken}


def owed(run_dir_path: Path, plan: dict) -> list[str]:
    """Every finished boot's owed measurements that left no result: 'boot B: WHY' lines."""
    run_dir, options = RunDir(run_dir_path, plan), Options.from_json(plan["options"])
    missing = []
    for boot in BOOTS:
        record = run_dir.boot_record(boot) or {}
        if record.get("status") == FINISHED:
            missing += [f"boot {boot}: {why}"
                        for why in boots.owed_missing(boot, record, options, run_dir)]
    return missing


def too_noisy(checks: list[dict] | None) -> list[str]:
    """The gate's limits (the band times its scale) beyond the caps, one phrase each."""
    wide = []
    for check in checks or []:
        if check["metric"] == "kl_mean" and check["limit"] > BAND_CAP_KL_MEAN:
            wide.append(f"{check['scope']} mean KL limit {check['limit']:.3g} is over the cap "
                        f"{BAND_CAP_KL_MEAN:.3g}")
        elif check["metric"] == "top1_agreement" and check["limit"] < BAND_FLOOR_TOP1_AGREEMENT:
            wide.append(f"{check['scope']} top-1 agreement limit {check['limit']:.4f} is under "
                        f"the cap {BAND_FLOOR_TOP1_AGREEMENT:.4f}")
    return wide


def summarize(run_dir_path: Path, plan: dict) -> dict:
    files = {boot: boot_files(run_dir_path / "boots" / boot, boot) for boot in BOOTS}
    band, gate = files["reference-b"]["quality"], files["candidate"]["quality"]
    divergence = []
    aa_first, gate_first = _divergences(band), _divergences(gate)
    for phase in dict.fromkeys([*aa_first, *gate_first]):
        divergence.append({"phase": phase, "reference-b": aa_first.get(phase),
                           "candidate": gate_first.get(phase)})
    receipts = {r: {boot: (files[boot]["receipts"][r] or {}).get("passed") for boot in BOOTS}
                for r in RECEIPTS}
    return {
        "speed": speed_rows(files),
        "quality": {"band": _totals(band), "gate": _totals(gate),
                    "checks": (gate or {}).get("checks"), "passed": (gate or {}).get("passed")},
        "divergence": divergence,
        "receipts": receipts,
        "lossless": lossless(plan.get("differing", []), band, gate),
        "owed_missing": owed(run_dir_path, plan),
        "served_conflicts": served_conflicts(
            {b: r for b, r in plan.get("boots", {}).items() if r.get("status") == FINISHED},
            plan.get("differing", [])),
        "too_noisy": too_noisy((gate or {}).get("checks")),
        "integrity": integrity(files),
        "platform": compare_platform.summarize({boot: files[boot]["bench"] for boot in BOOTS}),
    }


def headline(rows: list[dict], concurrency: list[int]) -> dict | None:
    """The cell the verdict names: prose at the lowest concurrency asked."""
    lowest = min(concurrency)
    for row in rows:
        if row["phase"] == HEADLINE_PHASE and row["concurrency"] == lowest:
            return row
    return None


def speed_phrase(row: dict | None) -> str:
    if row is None or row["change_pct"] is None:
        return "its speed at prose was not measured"
    change, cell = row["change_pct"], f"prose c={row['concurrency']}"
    references = [v for v in (row["per_stream"]["reference-a"], row["per_stream"]["reference-b"])
                  if v]
    mean = sum(references) / len(references)
    figures = f"{row['per_stream']['candidate']:.1f} against {mean:.1f} tok/s per stream"
    spread = row["reference_spread_pct"]
    if spread is not None:
        within = ", within that" if abs(change) <= spread else ""
        figures += f"; the reference's two boots differ by {spread:.1f}%{within}"
    direction = "faster" if change >= 0 else "slower"
    return f"is {abs(change):.1f}% {direction} at {cell} ({figures})"


def gate_failures(summary: dict) -> list[str]:
    checks = [c for c in summary["quality"]["checks"] or [] if not c["passed"]]
    shown = []
    for c in checks:
        if c["metric"] == "kl_mean":
            shown.append(f"{c['scope']} mean KL {c['value']:.3g} beyond the band's "
                         f"{c['limit']:.3g}")
        else:
            shown.append(f"{c['scope']} top-1 agreement {c['value']:.4f} under the band's "
                         f"{c['limit']:.4f}")
    if len(shown) > 4:
        shown = shown[:4] + [f"{len(checks) - 4} more checks"]
    return [f"the quality gate ({'; '.join(shown)})"] if shown else []


def _clip(text: str | None, limit: int = 160) -> str:
    text = text or ""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def decide(summary: dict, plan: dict) -> Verdict:
    records = plan.get("boots", {})
    for boot in BOOTS:
        record = records.get(boot) or {}
        if record.get("status") != FINISHED:
            why = record.get("why") or "it did not run"
            return Verdict(2, f"{VERDICT_PREFIX}could not run: boot {boot} "
                              f"{'failed' if record else 'is missing'}: {why}")
    for void in ("owed_missing", "served_conflicts"):
        if summary[void]:
            return Verdict(2, f"{VERDICT_PREFIX}could not run: {'; '.join(summary[void])}")
    failures, notes = [], []
    if summary["quality"]["passed"] is None:
        return Verdict(2, f"{VERDICT_PREFIX}could not run: the candidate has no gate result")
    if summary["too_noisy"]:
        return Verdict(2, f"{VERDICT_PREFIX}could not run: the reference is too noisy to judge: "
                          f"{'; '.join(summary['too_noisy'])} (its two boots differ by more than "
                          "a healthy reference's: boot it again, or find why it is noisy)")
    if not summary["quality"]["passed"]:
        failures += gate_failures(summary)
    loss = summary["lossless"]
    for broken in loss.get("broken", []):
        failures.append(f"lossless across boots ({broken['phase']}: {broken['text']})")
    for receipt, by_boot in summary["receipts"].items():
        if by_boot["candidate"] is False:
            if by_boot["reference-a"] is False or by_boot["reference-b"] is False:
                notes.append(f"{receipt} fails on the candidate and on a reference boot too")
            else:
                failures.append(f"the {receipt} receipt")
    # the integrity probes: a candidate that serves corrupted text fails, whatever the
    # reference does (the same checkpoint may corrupt on both sides); a reference is reported
    for probe, by_boot in summary.get("integrity", {}).items():
        for boot, result in by_boot.items():
            if result["status"] == "pass":
                continue
            what = (f"{result['status']}: {_clip(result['summary'])}" if result["status"]
                    else "no result")
            (failures.append(f"the {probe} probe ({what})") if boot == "candidate"
             else notes.append(f"{boot}'s {probe} probe: {what}"))
    for row in summary["speed"]:
        for boot, count in row["failed_streams"].items():
            if count:
                where = f"{count} failed stream(s) at {row['phase']} c={row['concurrency']}"
                (failures.append(f"the bench ({where})") if boot == "candidate"
                 else notes.append(f"{boot}'s bench: {where}"))
        for boot, why in row.get("invalid", {}).items():
            if why:
                where = f"{row['phase']} c={row['concurrency']} invalid: {_clip(why)}"
                (failures.append(f"the bench ({where})") if boot == "candidate"
                 else notes.append(f"{boot}'s bench: {where}"))
    speed = speed_phrase(headline(summary["speed"], plan["options"]["concurrency"]))
    # the platform each side ran on (compare/platform.py): a warning, not a failure
    unlike = compare_platform.warnings(summary.get("platform"))
    notes += compare_platform.notes(summary.get("platform")) + [f"WARNING: {w}" for w in unlike]
    warning = f"; WARNING: {'; '.join(unlike)}" if unlike else ""
    if failures:
        return Verdict(1, f"{VERDICT_PREFIX}candidate fails: {'; '.join(failures)}; it {speed}"
                          f"{warning}", failures, notes)
    return Verdict(0, f"{VERDICT_PREFIX}candidate passes the gate and {speed}{warning}", [],
                   notes)
