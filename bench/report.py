"""Markdown views of bench results: the table of one run and the comparison of two."""

from __future__ import annotations

import json
from pathlib import Path

SCHEMA = "bench_decode/1"
# (cell key, label, +1 when higher is better / -1 when lower is)
COMPARED = (("per_stream_tok_s", "per-stream tok/s", +1),
            ("aggregate_tok_s", "aggregate tok/s", +1),
            ("ttft_s", "TTFT s", -1))


def _num(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _spread(s: dict | None, digits: int = 1) -> str:
    if not s:
        return "-"
    return f"{_num(s['median'], digits)} ({_num(s['min'], digits)}-{_num(s['max'], digits)})"


def markdown_table(cells: list[dict]) -> str:
    """Medians with (min-max) over runs; acceptance from /metrics deltas of the cell."""
    header = ("| phase | c | per-stream tok/s | aggregate tok/s | TTFT s | accept len | "
              "draft accept | failed | method |")
    lines = [header, "|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        accept = _num(c["acceptance_length"], 2)
        if c.get("invalid"):
            accept = "invalid"
        elif c["acceptance_length"] is None:
            accept = {"absent": "no spec", "no_drafts": "no drafts"}.get(c["spec_decode"], "-")
        lines.append(
            f"| {c['phase']} | {c['concurrency']} | {_spread(c['per_stream_tok_s'])} | "
            f"{_spread(c['aggregate_tok_s'])} | {_spread(c['ttft_s'], 3)} | {accept} | "
            f"{_num(c['draft_acceptance_rate'], 3)} | {c['failed_streams']}/{c['streams']} | "
            f"{c['method'] or '-'} |")
    return "\n".join(lines)


def load_result(path: str) -> dict:
    """Read a bench JSON file, refusing anything that is not one."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read bench result ({exc}); pass a file written by "
                         f"bench_decode.py --json") from exc
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(
            doc.get("cells"), list):
        raise ValueError(f"{path}: not a {SCHEMA} result (schema={doc.get('schema')!r} if "
                         f"dict); pass a file written by bench_decode.py --json")
    return doc


def _verdict(a: dict | None, b: dict | None, better: int) -> tuple[str, str]:
    """Change of medians; inside the runs' spread (the min-max ranges overlap) is noise."""
    if not a or not b or not a["median"]:
        return "-", "not comparable"
    change = (b["median"] - a["median"]) / a["median"] * 100.0
    if b["min"] <= a["max"] and a["min"] <= b["max"]:
        return f"{change:+.1f}%", "noise"
    return f"{change:+.1f}%", "better" if change * better > 0 else "worse"


def compare(a_doc: dict, b_doc: dict) -> str:
    """Per cell (phase, concurrency) present in both files: A, B, change and its verdict."""
    b_cells = {(c["phase"], c["concurrency"]): c for c in b_doc["cells"]}
    lines = ["| phase | c | metric | A | B | change | verdict |", "|---|---|---|---|---|---|---|"]
    for a in a_doc["cells"]:
        b = b_cells.get((a["phase"], a["concurrency"]))
        if b is None:
            lines.append(f"| {a['phase']} | {a['concurrency']} | (only in A) | | | | |")
            continue
        void = [side for side, cell in (("A", a), ("B", b)) if cell.get("invalid")]
        for key, label, better in COMPARED:
            change, verdict = _verdict(a[key], b[key], better)
            if void:  # a restart, or a wave the server queued: not the speed of c streams
                verdict = f"not comparable (invalid in {' and '.join(void)})"
            digits = 3 if key == "ttft_s" else 1
            lines.append(f"| {a['phase']} | {a['concurrency']} | {label} | "
                         f"{_spread(a[key], digits)} | {_spread(b[key], digits)} | {change} | "
                         f"{verdict} |")
        la, lb = a["acceptance_length"], b["acceptance_length"]
        change = f"{(lb - la) / la * 100.0:+.1f}%" if la and lb else "-"
        lines.append(f"| {a['phase']} | {a['concurrency']} | accept len | {_num(la, 2)} | "
                     f"{_num(lb, 2)} | {change} | {'' if la and lb else 'not comparable'} |")
    a_keys = {(c["phase"], c["concurrency"]) for c in a_doc["cells"]}
    for key in sorted(set(b_cells) - a_keys):
        lines.append(f"| {key[0]} | {key[1]} | (only in B) | | | | |")
    return "\n".join(lines)
