"""What a comparison leaves to read: compare.json (the plan, the boots, the results and the
verdict), report.md (one short table per question) and compare.png (bench/plot.py draws
it from compare.json, as a command: the launcher imports nothing of bench/)."""

from __future__ import annotations

import subprocess
import sys

from compare import platform as compare_platform
from compare.boot import BENCH, minutes
from compare.results import Verdict
from compare.rundir import BOOTS, RunDir

PICTURE = "compare.png"
REPORT = "report.md"
NAMES = {"reference-a": "reference A", "reference-b": "reference B", "candidate": "candidate"}


def _num(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value) -> str:
    return "-" if value is None else f"{value:+.1f}%"


def _passed(value) -> str:
    return {True: "PASS", False: "FAIL"}.get(value, "-")


def _code(text: str) -> str:
    return f"`{text}`" if text else "(the environment's settings)"


def boots_table(plan: dict) -> list[str]:
    lines = ["| boot | settings | status | boot | measurements | wall |",
             "|---|---|---|---|---|---|"]
    for boot in BOOTS:
        record = plan["boots"].get(boot) or {}
        status = record.get("status", "not run")
        if record.get("copied_from"):
            status += f" (from {record['copied_from']})"
        if record.get("why"):
            status += f": {record['why']}"
        times = [minutes(record[key]) if key in record else "-"
                 for key in ("boot_s", "measure_s", "wall_s")]
        lines.append(f"| {NAMES[boot]} | {_code(record.get('settings', ''))} | "
                     f"{status.replace('|', '/')} | {' | '.join(times)} |")
    return lines


def speed_table(summary: dict, options: dict) -> list[str]:
    lines = [f"Per-stream tok/s, median of {options['runs']} runs x {options['max_tokens']} "
             "tokens (aggregate in brackets); change: the candidate against the reference "
             "boots' mean; A/A: how far the two reference boots are apart.", "",
             "| phase | c | reference A | reference B | candidate | change | A/A | acceptance "
             "length A / B / candidate |", "|---|---|---|---|---|---|---|---|"]
    for row in summary["speed"]:
        # a cell the bench voided (a restart, a wave the server queued) says so beside its figures
        speeds = [f"{_num(row['per_stream'][b])} ({_num(row['aggregate'][b])})"
                  + (" invalid" if row.get("invalid", {}).get(b) else "") for b in BOOTS]
        acceptance = " / ".join(_num(row["acceptance_length"][b], 2) for b in BOOTS)
        spread = ("-" if row["reference_spread_pct"] is None
                  else f"{row['reference_spread_pct']:.1f}%")
        lines.append(f"| {row['phase']} | {row['concurrency']} | {' | '.join(speeds)} | "
                     f"{_pct(row['change_pct'])} | {spread} | {acceptance} |")
    return lines


def quality_table(summary: dict) -> list[str]:
    quality = summary["quality"]
    band, gate = quality["band"], quality["gate"]
    if not band or not gate:
        return ["Not measured (a boot did not finish)."]
    checks = {(c["scope"], c["metric"]): c for c in quality["checks"] or []}
    lines = ["| scope | band mean KL | candidate mean KL | band top-1 | candidate top-1 | "
             "gate |", "|---|---|---|---|---|---|"]
    scopes = [("overall", band["overall"], gate["overall"])]
    scopes += [(p, band["phases"].get(p, {}), t) for p, t in gate["phases"].items()]
    for scope, b, g in scopes:
        passed = all(checks[(scope, m)]["passed"] for m in ("kl_mean", "top1_agreement")
                     if (scope, m) in checks)
        lines.append(f"| {scope} | {b.get('kl_mean', 0):.3g} | {g['kl_mean']:.3g} | "
                     f"{b.get('top1_agreement', 0):.4f} | {g['top1_agreement']:.4f} | "
                     f"{_passed(passed)} |")
    return lines


def divergence_table(summary: dict) -> list[str]:
    lines = ["| prompt | reference B (the A/A) | candidate |", "|---|---|---|"]
    for row in summary["divergence"]:
        cells = [(row[b] or {}).get("text", "-").replace("|", "/")
                 for b in ("reference-b", "candidate")]
        lines.append(f"| {row['phase']} | {cells[0]} | {cells[1]} |")
    loss = summary["lossless"]
    verdict = f"{_passed(loss['passed'])}: " if loss["judged"] else "not judged: "
    return lines + ["", f"Lossless across boots: {verdict}{loss['why']}."]


def receipts_table(summary: dict) -> list[str]:
    lines = ["| receipt | reference A | reference B | candidate |", "|---|---|---|---|"]
    for receipt, by_boot in summary["receipts"].items():
        lines.append(f"| {receipt} | {' | '.join(_passed(by_boot[b]) for b in BOOTS)} |")
    return lines


def integrity_table(summary: dict) -> list[str]:
    lines = ["| probe | reference A | reference B | candidate |", "|---|---|---|---|"]
    for probe, by_boot in summary.get("integrity", {}).items():
        cells = [(by_boot[b]["status"] or "no result").upper() for b in BOOTS]
        lines.append(f"| {probe} | {' | '.join(cells)} |")
    failing = [(probe, b, r["summary"]) for probe, by_boot in summary.get("integrity", {}).items()
               for b, r in by_boot.items() if r["status"] not in ("pass", None)]
    return lines + [""] + [f"- {NAMES[b]}, {probe}: {text}" for probe, b, text in failing]


def platform_section(summary: dict) -> list[str]:
    """The platform of each boot (its bench's probe at start and end) and the read bandwidth
    against the reference's A/A band (compare/platform.py)."""
    found = summary.get("platform")
    if found is None:
        return []
    return ["## Platform (scripts/doctor --platform at each bench's start and end)", "",
            "Read bandwidth in GB/s; A/A band: the spread of the reference boots' four readings "
            "of a node, in % of their mean; change: the candidate's mean against theirs.", "",
            *compare_platform.table(found), "",
            *[f"- {line}" for line in compare_platform.lines(found)], ""]


def markdown(plan: dict, summary: dict, verdict: Verdict, picture: bool) -> str:
    differing = plan.get("differing", [])
    reference, candidate = plan["reference"], plan["candidate"]
    changed = ", ".join(f"`{n}` {reference['values'].get(n) or '(empty)'} -> "
                        f"{candidate['values'].get(n) or '(empty)'}" for n in differing)
    lines = [f"# Compare: {_code(candidate['words'])} against {_code(reference['words'])}", "",
             f"**{verdict.line}**", "",
             f"Settings that differ: {changed or 'none (an A/A check)'}."]
    if candidate.get("lifted"):
        lines.append(f"Set on the candidate by scripts/compare (its gate is the check they stand "
                     f"for): {', '.join(f'`{f}=1`' for f in candidate['lifted'])}.")
    lines += [*[f"- {note}" for note in verdict.notes], "", "## Boots", "", *boots_table(plan),
              "", "## Speed (bench/bench_decode.py)", "", *speed_table(summary, plan["options"]),
              "", "## Quality against the A/A band (bench/quality.py)", "",
              *quality_table(summary), "", "## First divergence of the greedy path from "
              "reference A", "", *divergence_table(summary), "", "## Receipts "
              "(bench/receipts.py)", "", *receipts_table(summary), "",
              "## Integrity probes (bench/probes.py --only multibyte,tool_cycles)", "",
              *integrity_table(summary), "", *platform_section(summary)]
    if picture:
        lines += [f"![speed and quality]({PICTURE})", ""]
    return "\n".join(lines)


def draw(run_dir: RunDir) -> str | None:
    """compare.png by bench/plot.py; None when drawn, else why not (one line)."""
    drawn = subprocess.run([sys.executable, str(BENCH / "plot.py"),
                            str(run_dir.path / "compare.json"), "-o", str(run_dir.path / PICTURE)],
                           capture_output=True, text=True, check=False)
    if drawn.returncode == 0:
        return None
    return (drawn.stderr.strip().splitlines() or [f"bench/plot.py exited {drawn.returncode}"])[-1]


def write(run_dir: RunDir, summary: dict, verdict: Verdict) -> list[str]:
    """Writes the three files; returns what could not be drawn (notes)."""
    run_dir.plan.update(results=summary, verdict=verdict.to_json())
    run_dir.save()
    problems = []
    why = draw(run_dir)
    if why:
        problems.append(f"no picture: {why}")
    (run_dir.path / REPORT).write_text(markdown(run_dir.plan, summary, verdict, why is None),
                                       encoding="utf-8")
    return problems
