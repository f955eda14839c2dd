"""The platform each boot was measured on, and whether the two sides' were alike.

Each boot's bench result carries the platform probe of every node at the bench's start and
end (bench/platform_state.py: scripts/doctor --platform --json), so the readings bracket the
speed they stand beside. This module sums them up per boot and judges the read bandwidth:

- A node's reference readings are the read bandwidth of both reference boots at the start
  and at the end of their bench: four readings of one setting on one node. Their spread
  (highest minus lowest, in % of their mean) is the A/A band: how far the platform wanders
  by itself between boots of the same setting.
- The candidate's readings on that node (start and end) have a mean; its difference from
  the reference readings' mean, in %, is the candidate's change.
- A change beyond the band means the candidate ran on another platform than the reference
  (memory more fragmented, clocks in another state): the verdict warns that its speed is
  not comparable. The warning does not change the exit: the gate, the receipts and the
  probes judge the output; the warning says the speed was measured on unlike platforms.

A reading that is missing (the probe could not run, no GPU, a boot without the block) leaves
that node's bandwidth uncompared, with the reason as a note; it is never guessed.
Pure functions of the boots' bench documents.
"""

from __future__ import annotations

from compare.rundir import BOOTS, REFERENCE_BOOTS

WHEN = ("start", "end")


def _gb_s(node: dict) -> float | None:
    value = (node.get("bandwidth") or {}).get("gb_s")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def _nodes(block: dict | None) -> list[dict]:
    nodes = (block or {}).get("nodes")
    return nodes if isinstance(nodes, list) else []


def boot_readings(bench: dict | None) -> dict:
    """One boot's platform: {"start"|"end": {"nodes": {node: line}, "gb_s": {node: value|None},
    "why": ...}} from its bench document."""
    found = {}
    platform = (bench or {}).get("platform")
    for when in WHEN:
        block = (platform or {}).get(when) if isinstance(platform, dict) else None
        if not _nodes(block):
            why = (block or {}).get("why") if isinstance(block, dict) else None
            found[when] = {"nodes": {}, "gb_s": {},
                           "why": why or "the bench result has no platform block"}
            continue
        found[when] = {"nodes": {n.get("node"): n.get("line") or n.get("why", "")
                                 for n in _nodes(block)},
                       "gb_s": {n.get("node"): _gb_s(n) for n in _nodes(block)}}
    return found


def _spread_pct(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return 100.0 * (max(values) - min(values)) / mean


def summarize(benches: dict[str, dict | None]) -> dict:
    """BENCHES: boot -> its bench document. The per-boot readings and, per node, the
    bandwidth judgement."""
    boots = {boot: boot_readings(benches.get(boot)) for boot in BOOTS}
    nodes = list(dict.fromkeys(node for boot in BOOTS for when in WHEN
                               for node in boots[boot][when]["gb_s"]))
    judged = {}
    for node in nodes:
        reference = [boots[b][w]["gb_s"].get(node) for b in REFERENCE_BOOTS for w in WHEN]
        candidate = [boots["candidate"][w]["gb_s"].get(node) for w in WHEN]
        if None in reference or None in candidate:
            missing = [f"{boot} at the {when}" for boot in BOOTS for when in WHEN
                       if boots[boot][when]["gb_s"].get(node) is None]
            judged[node] = {"compared": False, "why": f"no read bandwidth of {node} for "
                                                      f"{', '.join(missing)}"}
            continue
        ref_mean = sum(reference) / len(reference)
        cand_mean = sum(candidate) / len(candidate)
        band = _spread_pct(reference)
        change = 100.0 * (cand_mean / ref_mean - 1.0)
        judged[node] = {"compared": True, "reference_gb_s": reference, "candidate_gb_s": candidate,
                        "reference_mean": ref_mean, "candidate_mean": cand_mean,
                        "band_pct": band, "change_pct": change, "outside": abs(change) > band}
    return {"boots": boots, "bandwidth": judged}


def warnings(summary: dict) -> list[str]:
    """One phrase per node whose candidate bandwidth is outside the reference's band."""
    return [f"{node}'s read bandwidth was {j['candidate_mean']:.1f} GB/s on the candidate's boot "
            f"against {j['reference_mean']:.1f} on the reference's ({j['change_pct']:+.1f}%, "
            f"beyond the reference boots' own spread of {j['band_pct']:.1f}%): the platform "
            "differed, so the speed is not comparable"
            for node, j in (summary or {}).get("bandwidth", {}).items()
            if j.get("compared") and j["outside"]]


def notes(summary: dict) -> list[str]:
    """Why a node's bandwidth was not compared."""
    return [f"platform: {j['why']}; bandwidth not compared"
            for j in (summary or {}).get("bandwidth", {}).values() if not j.get("compared")] or (
        ["platform: no boot's bench recorded a node; bandwidth not compared"]
        if summary is not None and not summary.get("bandwidth") else [])


def lines(summary: dict) -> list[str]:
    """What compare prints of the platform: a line per boot, node and time."""
    shown = []
    for boot, readings in (summary or {}).get("boots", {}).items():
        for when in WHEN:
            reading = readings[when]
            if not reading["nodes"]:
                shown.append(f"platform, {boot} at the {when}: not measured: {reading['why']}")
            for node, line in reading["nodes"].items():
                shown.append(f"platform, {boot} at the {when}, {node}: {line}")
    return shown


def table(summary: dict) -> list[str]:
    """report.md's bandwidth table: a row per node."""
    rows = ["| node | reference A start / end | reference B start / end | candidate start / end "
            "| A/A band | change |", "|---|---|---|---|---|---|"]
    for node, j in (summary or {}).get("bandwidth", {}).items():
        if not j.get("compared"):
            rows.append(f"| {node} | - | - | - | - | not compared: {j['why']} |")
            continue
        ref, cand = j["reference_gb_s"], j["candidate_gb_s"]
        flag = " (beyond the band)" if j["outside"] else ""
        rows.append(f"| {node} | {ref[0]:.1f} / {ref[1]:.1f} | {ref[2]:.1f} / {ref[3]:.1f} | "
                    f"{cand[0]:.1f} / {cand[1]:.1f} | {j['band_pct']:.1f}% | "
                    f"{j['change_pct']:+.1f}%{flag} |")
    return rows
