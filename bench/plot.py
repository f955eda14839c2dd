#!/usr/bin/env python3
"""Pictures of bench results and memory-guard samples, drawn with matplotlib as PNG.

    bench/plot.py RESULT.json [-o RESULT.png]              a bench_decode.py --json file
    bench/plot.py --compare A.json B.json [-o A-vs-B.png]  two of them side by side
    bench/plot.py SAMPLES.csv [-o SAMPLES.png]             a memory-guard sample file
    bench/plot.py GATE.json [-o GATE.png]                  a quality.py aa or gate file
    bench/plot.py DIR/compare.json [-o DIR/compare.png]    a scripts/compare report directory

A bench picture has four panels: per-stream and aggregate tok/s against concurrency (median
over runs, with the runs' min-max as a bar), acceptance length, and acceptance per draft
position (one line per cell); a file with the turns phase adds two: time to first token by
turn, and each turn's prompt split into cached and prefilled tokens. A memory picture draws
MemAvailable per node over time, the
boot phases shaded, each node's floor dashed and samples under it marked. A quality picture
draws KL(reference || candidate) per generated position of each prompt (log scale, top-1
disagreements marked) and each phase's mean KL against the band's limit. A comparison picture
puts the per-stream tok/s of its three boots side by side over its gate's quality panels.
Exit code 0 when
the PNG was written, 2 when an input is not what it should be (one line says which and why).
docs/bench.md, section "Plots", says more.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the `bench` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recipekit.one_line_parser import OneLineParser

if __name__ == "__main__":  # a missing package: one line naming the install command
    from bench import requires

    requires.require("bench/plot.py", requires.PLOT_MODULES, __doc__)

from matplotlib.figure import Figure

from bench import report

GIB = float(1 << 30)
# the memory guard's sample file (written by the launcher's guard; the format is fixed)
MEMORY_HEADER = ("time_unix", "elapsed_s", "node", "phase", "mem_available_bytes",
                 "floor_bytes")
PHASES = ("load", "profile", "kv_ready", "serving")
PHASE_COLOURS = {"load": "#dbe9f6", "profile": "#fde5c8", "kv_ready": "#e2f0d9",
                 "serving": "#ececec"}
SPEED_PANELS = (("per_stream_tok_s", "per-stream tok/s"), ("aggregate_tok_s", "aggregate tok/s"))
DPI = 110


class PlotError(Exception):
    """An input that cannot be drawn, phrased for the user."""


# ----------------------------------------------------------------------------- bench files


def _measured(cells: list[dict], key: str) -> list[dict]:
    return [c for c in cells if c.get(key) and c[key].get("median") is not None]


def _phases(doc: dict) -> list[str]:
    return list(dict.fromkeys(c["phase"] for c in doc["cells"]))


def _concurrency_axis(ax, doc: dict) -> None:
    values = sorted({c["concurrency"] for c in doc["cells"]})
    if len(values) > 1:
        ax.set_xscale("log", base=2)
    ax.set_xticks(values, [str(v) for v in values])
    ax.set_xlabel("concurrent streams")


def draw_speed(ax, doc: dict, key: str, label: str) -> None:
    """Median over runs per phase and concurrency, the runs' min-max as a vertical bar."""
    for phase in _phases(doc):
        cells = sorted(_measured([c for c in doc["cells"] if c["phase"] == phase], key),
                       key=lambda c: c["concurrency"])
        if not cells:
            continue
        x = [c["concurrency"] for c in cells]
        (line,) = ax.plot(x, [c[key]["median"] for c in cells], marker="o", label=phase)
        line.set_gid(f"{key}/{phase}/median")
        bars = ax.vlines(x, [c[key]["min"] for c in cells], [c[key]["max"] for c in cells],
                         colors=line.get_color(), linewidth=4, alpha=0.35)
        bars.set_gid(f"{key}/{phase}/range")
    ax.set_title(f"{label} (median, min-max over runs)")
    ax.set_ylabel("tok/s")
    ax.set_ylim(bottom=0)
    _concurrency_axis(ax, doc)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend()


def draw_acceptance(ax, doc: dict) -> None:
    for phase in _phases(doc):
        cells = sorted((c for c in doc["cells"] if c["phase"] == phase
                        and c.get("acceptance_length") is not None),
                       key=lambda c: c["concurrency"])
        if cells:
            (line,) = ax.plot([c["concurrency"] for c in cells],
                              [c["acceptance_length"] for c in cells], marker="o", label=phase)
            line.set_gid(f"acceptance_length/{phase}")
    ax.set_title("acceptance length (1 + accepted / drafts)")
    _concurrency_axis(ax, doc)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.set_ylim(bottom=1)
        ax.legend()
    else:
        _nothing(ax, "no acceptance measured (no speculative decoding, or every cell invalid)")


def draw_per_position(ax, doc: dict) -> None:
    for cell in doc["cells"]:
        rates = cell.get("per_position_acceptance")
        if rates:
            (line,) = ax.plot(range(len(rates)), rates, marker=".",
                              label=f"{cell['phase']} c={cell['concurrency']}")
            line.set_gid(f"per_position/{cell['phase']}/c{cell['concurrency']}")
    ax.set_title("acceptance per draft position (accepted at p / drafts)")
    ax.set_xlabel("draft position (0 = first drafted token)")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize="small", ncol=2)
    else:
        _nothing(ax, "no per-position acceptance in this file")


def _cached(turn: dict) -> float | None:
    return turn["cached_tokens"] if turn["cached_tokens"] is not None else turn["metrics_hits"]


def _name_bars(bars, gid: str) -> None:
    for index, bar in enumerate(bars):
        bar.set_gid(f"{gid}/{index}")


def draw_turns(ttft_ax, tokens_ax, doc: dict) -> None:
    """The turns phase: TTFT by turn; each turn's prompt as cached + prefilled tokens."""
    rows = doc["turns"]["turns"]
    labels = [f"turn {t['turn']}\n{t['prompt_tokens'] or 0:,} tok" for t in rows]
    x = list(range(len(rows)))
    _name_bars(ttft_ax.bar(x, [t["ttft_s"] or 0.0 for t in rows], color="#4c72b0"), "turns/ttft_s")
    ttft_ax.set_xticks(x, labels)
    ttft_ax.set_title("turns: time to first token by turn")
    ttft_ax.set_ylabel("s")
    ttft_ax.grid(alpha=0.3, axis="y")
    cached = [_cached(t) or 0 for t in rows]
    prefilled = [(t["prompt_tokens"] or 0) - c for t, c in zip(rows, cached)]
    _name_bars(tokens_ax.bar(x, cached, color="#55a868", label="cached"), "turns/cached")
    _name_bars(tokens_ax.bar(x, prefilled, bottom=cached, color="#c44e52", label="prefilled"),
               "turns/prefilled")
    tokens_ax.set_xticks(x, labels)
    tokens_ax.set_title("turns: prompt tokens, cached and prefilled")
    tokens_ax.set_ylabel("tokens")
    tokens_ax.legend()


def _nothing(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", wrap=True)


def _bench_title(doc: dict, name: str) -> str:
    s = doc.get("settings") or {}
    version = (doc.get("server") or {}).get("vllm_version")
    return (f"{name}: {s.get('model', '?')}" + (f", vLLM {version}" if version else "")
            + f"\n{s.get('runs', '?')} runs x {s.get('max_tokens', '?')} tokens, "
              f"started {doc.get('started_at', '?')}")


def draw_bench(axes: list, doc: dict) -> None:
    """axes: four Axes, in the order speed per stream, aggregate, acceptance, per position."""
    for ax, (key, label) in zip(axes, SPEED_PANELS):
        draw_speed(ax, doc, key, label)
    draw_acceptance(axes[2], doc)
    draw_per_position(axes[3], doc)


def bench_figure(doc: dict, name: str = "bench") -> Figure:
    with_turns = bool((doc.get("turns") or {}).get("turns"))
    fig = Figure(figsize=(13, 14 if with_turns else 9.5), layout="constrained")
    axes = fig.subplots(3 if with_turns else 2, 2).flatten()
    draw_bench(list(axes[:4]), doc)
    if with_turns:
        draw_turns(axes[4], axes[5], doc)
    fig.suptitle(_bench_title(doc, name))
    return fig


def compare_figure(a: dict, b: dict, names: tuple[str, str] = ("A", "B")) -> Figure:
    """The two files' panels side by side, A left and B right, each row on one y scale."""
    fig = Figure(figsize=(14, 18), layout="constrained")
    grid = fig.subplots(4, 2, sharey="row")
    for column, (doc, name) in enumerate(zip((a, b), names)):
        draw_bench([grid[row][column] for row in range(4)], doc)
        grid[0][column].annotate(_bench_title(doc, name), (0.5, 1.18), xycoords="axes fraction",
                                 ha="center", va="bottom", fontsize="large")
    return fig


# ----------------------------------------------------------------------------- memory samples


@dataclass
class MemorySample:
    time_unix: float
    elapsed_s: float
    node: str
    phase: str
    mem_available_bytes: int
    floor_bytes: int


def _field(path: str, line: int, name: str, value: str, kind):
    try:
        number = kind(value)
    except (TypeError, ValueError):
        number = None
    if number is None or (isinstance(number, float) and not math.isfinite(number)) or number < 0:
        raise PlotError(f"{path}:{line}: {name} {value!r} is not a number >= 0; the memory "
                        f"guard writes {','.join(MEMORY_HEADER)}")
    return number


def load_memory_samples(path: str) -> list[MemorySample]:
    """Every row of a memory-guard sample file, checked, in file order."""
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError) as exc:
        raise PlotError(f"{path}: cannot read it ({exc})") from exc
    if not rows or tuple(rows[0]) != MEMORY_HEADER:
        raise PlotError(f"{path}: the first line must be {','.join(MEMORY_HEADER)} (a memory "
                        f"guard sample file), got {','.join(rows[0]) if rows else 'nothing'!r}")
    samples = []
    for line, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != len(MEMORY_HEADER):
            raise PlotError(f"{path}:{line}: {len(row)} fields, the header has "
                            f"{len(MEMORY_HEADER)}")
        when, elapsed, node, phase, available, floor = row
        if phase not in PHASES:
            raise PlotError(f"{path}:{line}: phase {phase!r} is not one of {', '.join(PHASES)}")
        if not node:
            raise PlotError(f"{path}:{line}: the node is empty")
        samples.append(MemorySample(_field(path, line, "time_unix", when, float),
                                    _field(path, line, "elapsed_s", elapsed, float), node, phase,
                                    _field(path, line, "mem_available_bytes", available, int),
                                    _field(path, line, "floor_bytes", floor, int)))
    if not samples:
        raise PlotError(f"{path}: no samples after the header")
    return samples


def phase_spans(samples: list[MemorySample]) -> list[tuple[str, float, float]]:
    """(phase, start, end): a phase runs from its first sample on any node to the first sample
    of the next phase seen (the last to the last sample)."""
    starts = {}
    for s in samples:
        starts[s.phase] = min(starts.get(s.phase, s.elapsed_s), s.elapsed_s)
    ordered = sorted(starts.items(), key=lambda item: (item[1], PHASES.index(item[0])))
    end = max(s.elapsed_s for s in samples)
    return [(phase, start, ordered[i + 1][1] if i + 1 < len(ordered) else end)
            for i, (phase, start) in enumerate(ordered)]


def memory_figure(samples: list[MemorySample], name: str = "memory guard") -> Figure:
    fig = Figure(figsize=(13, 6.5), layout="constrained")
    ax = fig.subplots()
    for phase, start, end in phase_spans(samples):
        span = ax.axvspan(start, end, color=PHASE_COLOURS[phase], alpha=0.8, zorder=0)
        span.set_gid(f"phase/{phase}")
        ax.text((start + end) / 2, 1.0, phase, transform=ax.get_xaxis_transform(),
                ha="center", va="bottom", fontsize="small")
    lowest = []
    for node in dict.fromkeys(s.node for s in samples):
        rows = [s for s in samples if s.node == node]
        x = [s.elapsed_s for s in rows]
        (line,) = ax.plot(x, [s.mem_available_bytes / GIB for s in rows], label=node)
        line.set_gid(f"mem_available/{node}")
        (floor,) = ax.step(x, [s.floor_bytes / GIB for s in rows], where="post", linestyle="--",
                           color=line.get_color(), linewidth=1, label=f"{node} floor")
        floor.set_gid(f"floor/{node}")
        under = [s for s in rows if s.mem_available_bytes < s.floor_bytes]
        if under:
            marks = ax.scatter([s.elapsed_s for s in under],
                               [s.mem_available_bytes / GIB for s in under], marker="x",
                               color="red", zorder=3, label=f"{node} under floor")
            marks.set_gid(f"under_floor/{node}")
        tight = min(rows, key=lambda s: s.mem_available_bytes - s.floor_bytes)
        lowest.append(f"{node} {tight.mem_available_bytes / GIB:.2f} GiB in {tight.phase} at "
                      f"{tight.elapsed_s:g} s (floor {tight.floor_bytes / GIB:.2f})")
    ax.set_xlabel("seconds since the guard started")
    ax.set_ylabel("MemAvailable (GiB)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", ncol=2, loc="best")
    fig.suptitle(f"{name}: MemAvailable per node during start-up\nclosest to the floor: "
                 + "; ".join(lowest))
    return fig


# ----------------------------------------------------------------------------- command line


# ----------------------------------------------------------------------------- quality files

QUALITY_KINDS = ("quality-aa", "quality-gate")


def quality_kind(path: str) -> str | None:
    """The kind of a quality.py result, None for any other file."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    kind = doc.get("kind") if isinstance(doc, dict) else None
    return kind if isinstance(kind, str) and kind.startswith("quality-") else None


def quality_figure(doc: dict, name: str = "quality") -> Figure:
    fig = Figure(figsize=(12, 4.5), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=(2, 1))
    draw_quality(left, right, doc)
    fig.suptitle(_quality_title(doc, name))
    return fig


def _quality_title(doc: dict, name: str) -> str:
    verdict = {True: "PASS", False: "FAIL"}.get(doc.get("passed"), "A/A band")
    return (f"{name}: {doc['kind']} {verdict}, overall mean KL "
            f"{doc['overall']['kl_mean']:.3g}, top-1 {doc['overall']['top1_agreement']:.4f}")


def draw_quality(left, right, doc: dict) -> None:
    """Per-position KL of each prompt (left) and each phase's mean KL against the band's
    limit (right)."""
    floor = 1e-12  # a position with KL 0 is drawn at the axis floor
    for prompt in doc["prompts"]:
        kls = [max(k, floor) for k in prompt["kl"]]
        line, = left.semilogy(range(len(kls)), kls, label=prompt["phase"], linewidth=1)
        flips = prompt["top1_disagree_at"]
        left.semilogy(flips, [kls[i] for i in flips], "x", color=line.get_color())
    left.set_xlabel("generated position")
    left.set_ylabel("KL(reference || candidate), nats")
    left.set_title("per position (x: top-1 differs)")
    left.legend(fontsize=8)
    phases = list(doc["phases"])
    means = [max(doc["phases"][p]["kl_mean"], floor) for p in phases]
    right.bar(phases, means, color="#6a8fbf")
    right.set_yscale("log")
    for i, p in enumerate(phases):
        right.annotate(f"top-1 {doc['phases'][p]['top1_agreement']:.3f}", (i, means[i]),
                       ha="center", va="bottom", fontsize=8)
    limits = {c["scope"]: c for c in doc.get("checks", []) if c["metric"] == "kl_mean"}
    if limits:
        right.scatter(phases, [max(limits[p]["limit"], floor) for p in phases], marker="_",
                      s=600, color="#c0392b", label="band limit", zorder=3)
        right.legend(fontsize=8)
    right.set_title("mean KL per phase")


# ----------------------------------------------------------------------------- comparisons

COMPARE_SCHEMA = "compare/1"
COMPARE_BOOTS = ("reference-a", "reference-b", "candidate")


def compare_kind(path: str) -> bool:
    """Whether PATH is a scripts/compare report (compare.json)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(doc, dict) and doc.get("schema") == COMPARE_SCHEMA


def compare_report_figure(doc: dict, folder: Path) -> Figure:
    """Per-stream tok/s of each boot (one y scale), then the candidate's gate."""
    fig = Figure(figsize=(15, 9), layout="constrained")
    axes = fig.subplot_mosaic([list(COMPARE_BOOTS), ["kl", "kl", "means"]])
    for boot in COMPARE_BOOTS:
        ax, path = axes[boot], folder / "boots" / boot / "bench.json"
        if path.is_file():
            draw_speed(ax, _load_bench(str(path)), "per_stream_tok_s", f"{boot}, per-stream tok/s")
        else:
            ax.set_title(f"{boot}: per-stream tok/s")
            _nothing(ax, "not measured")
    top = max((ax.get_ylim()[1] for b in COMPARE_BOOTS if (ax := axes[b]).lines), default=1.0)
    for boot in COMPARE_BOOTS:
        axes[boot].set_ylim(0, top)
    gate = folder / "boots" / "candidate" / "gate.json"
    if gate.is_file():
        quality = _load_quality(str(gate))
        draw_quality(axes["kl"], axes["means"], quality)
        axes["kl"].set_title(f"{_quality_title(quality, 'candidate')}\n"
                             f"{axes['kl'].get_title()}")
    else:
        _nothing(axes["kl"], "no gate: the candidate was not measured")
        axes["means"].set_axis_off()
    verdict = textwrap.fill((doc.get("verdict") or {}).get("line", "no verdict yet"), 160)
    fig.suptitle(f"{doc['candidate']['words'] or 'the environment'} against "
                 f"{doc['reference']['words'] or 'the environment'}\n{verdict}")
    return fig


def _load_quality(path: str) -> dict:
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    if doc["kind"] not in QUALITY_KINDS:
        raise PlotError(f"{path}: a {doc['kind']} file has nothing to compare; plot the aa or "
                        f"gate file made from it")
    return doc


def is_memory_file(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.readline().strip() == ",".join(MEMORY_HEADER)
    except (OSError, UnicodeDecodeError):
        return False


def save_png(fig: Figure, out: Path) -> None:
    """Write through a temporary file, so an interrupted run leaves no half PNG."""
    partial = out.with_name(out.name + ".partial")
    fig.savefig(partial, format="png", dpi=DPI)
    os.replace(partial, out)


def _load_bench(path: str) -> dict:
    try:
        return report.load_result(path)
    except ValueError as exc:
        raise PlotError(str(exc)) from exc


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="plot.py", description=__doc__.split("\n\n")[0],
                      allow_abbrev=False)
    p.add_argument("input", nargs="?", help="a bench_decode.py --json file or a memory-guard "
                                            "sample CSV")
    p.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"),
                   help="draw two bench files side by side")
    p.add_argument("-o", "--output", help="the PNG to write (default: beside the input, .png)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    opts = parser.parse_args(argv)
    if bool(opts.input) == bool(opts.compare):
        parser.error("give one input file, or --compare A.json B.json")
    sources = opts.compare or [opts.input]
    try:
        if opts.compare:
            a, b = (Path(p) for p in opts.compare)
            out = Path(opts.output or a.with_name(f"{a.stem}-vs-{b.stem}.png"))
            fig = compare_figure(_load_bench(str(a)), _load_bench(str(b)), (a.name, b.name))
        elif compare_kind(opts.input):
            out = Path(opts.output or Path(opts.input).with_suffix(".png"))
            fig = compare_report_figure(json.loads(Path(opts.input).read_text(encoding="utf-8")),
                                        Path(opts.input).resolve().parent)
        elif quality_kind(opts.input):
            out = Path(opts.output or Path(opts.input).with_suffix(".png"))
            fig = quality_figure(_load_quality(opts.input), Path(opts.input).name)
        elif is_memory_file(opts.input) or opts.input.lower().endswith(".csv"):
            out = Path(opts.output or Path(opts.input).with_suffix(".png"))
            fig = memory_figure(load_memory_samples(opts.input), Path(opts.input).name)
        else:
            out = Path(opts.output or Path(opts.input).with_suffix(".png"))
            fig = bench_figure(_load_bench(opts.input), Path(opts.input).name)
        if any(out.resolve() == Path(s).resolve() for s in sources):
            raise PlotError(f"{out}: the output would overwrite an input; pass -o OUT.png")
        if out.suffix.lower() != ".png":
            raise PlotError(f"{out}: the output must end in .png")
        save_png(fig, out)
    except PlotError as exc:
        print(f"plot: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"plot: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    print(f"plot: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
