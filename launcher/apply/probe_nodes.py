"""The platform probe run on every node (what it read: launcher/plan/node_platform.py), by
the commands planned for each node (launcher/plan/commands.py, platform_probes):
in the node's rank container when it runs, else in a throwaway container of the image."""

from __future__ import annotations

import datetime
import json
import subprocess

from launcher.apply.remote import Remote
from launcher.plan.data import PlatformProbe
from launcher.plan.node_platform import PARTS, PROBE, SCHEMA, describe

# torch's import and CUDA context take seconds on a GB10; the read kernel under one
PROBE_TIMEOUT_S = 180


def _last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def run_probe(nodes: Remote, index: int, argv, via: str) -> dict:
    """The probe's document for node INDEX, labelled with where it ran; a probe that could
    not run is {"node", "via", "why"}, its own last line of error as the reason."""
    where = {"node": nodes.addresses[index], "role": "head" if index == 0 else f"worker {index}",
             "via": via}
    try:
        with PROBE.open("rb") as script:
            done = subprocess.run(nodes.argv(index, argv), stdin=script, capture_output=True,
                                  timeout=PROBE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return {**where, "why": f"the probe did not finish within {PROBE_TIMEOUT_S} s"}
    except OSError as error:
        return {**where, "why": f"cannot run {argv[0]}: {error.strerror}"}
    stdout = done.stdout.decode(errors="replace")
    if done.returncode != 0:
        why = _last_line(done.stderr.decode(errors="replace")) or f"exit {done.returncode}"
        return {**where, "why": f"the probe failed ({why})"}
    try:
        doc = json.loads(_last_line(stdout))
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not all(isinstance(doc.get(part), dict) for part in PARTS):
        return {**where, "why": f"the probe printed no report: {_last_line(stdout)[:160]!r}"}
    return {**where, **doc}


def read_node(nodes: Remote, index: int, probe: PlatformProbe) -> dict:
    """Node INDEX's probe: in its rank's container when that runs, else in the image."""
    if nodes.output(index, probe.rank_status) == "running":
        return run_probe(nodes, index, probe.in_rank, probe.rank_via)
    return run_probe(nodes, index, probe.in_image, probe.image_via)


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def read_cluster(nodes: Remote, probes: tuple[PlatformProbe, ...]) -> dict:
    """Every node's probe (PROBES: each node's commands, head first), each with its one-line
    description ("line")."""
    read = [read_node(nodes, index, probe) for index, probe in enumerate(probes)]
    return {"schema": SCHEMA, "at": now(),
            "nodes": [{**doc, "line": describe(doc)} for doc in read]}
