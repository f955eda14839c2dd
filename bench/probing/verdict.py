"""A probe's result and the verdicts built from results: the one place that says what passes.

A probe ends in one of four statuses: pass; fail (judged and wrong); inconclusive (nothing
wrong found, but too little to judge: a check that was planned and did not run is this,
never a pass); error (no answer to judge). Only pass passes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.bench_decode import BenchError

EXCERPT = 160
STATUSES = ("pass", "fail", "inconclusive", "error")


class ProbesCannotRun(BenchError):
    """A reason no probe result would mean anything (exit 2), phrased for the user."""


class ProbeError(Exception):
    """A probe got no answer it could judge; the message says what came back instead."""


@dataclass
class ProbeResult:
    name: str
    status: str                   # pass, fail (judged and wrong), inconclusive (nothing wrong
    #                               found, but not enough to judge) or error (nothing to judge)
    summary: str                  # one line: what was found, or what came back instead
    seconds: float = 0.0
    details: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"probe {self.name}: status {self.status!r} is none of {STATUSES}")

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def to_json(self) -> dict:
        return {"passed": self.passed, "status": self.status, "summary": self.summary,
                "seconds": round(self.seconds, 3), "details": self.details}


def excerpt(text: str | None, limit: int = EXCERPT) -> str:
    """The start and end of a long text, so a failure line shows what came back."""
    text = text or ""
    if len(text) <= limit:
        return text
    return text[:limit * 2 // 3] + " ... " + text[-limit // 3:]


def status_of(faulty: bool, unjudged: bool) -> str:
    """A probe's status from its parts: fail when any part was judged wrong; else
    inconclusive when any part could not be judged (a planned check that did not run among
    them); else pass."""
    return "fail" if faulty else "inconclusive" if unjudged else "pass"


def result_line(name: str, result: dict) -> str:
    word = {"pass": "PASS", "inconclusive": "INCONCLUSIVE"}.get(result["status"], "FAIL")
    return f"{word} {name}: {result['summary']}"


def failed_probes(results: dict[str, dict]) -> list[str]:
    """The probes (by name, in run order) whose result is not a pass."""
    return [name for name, result in results.items() if not result["passed"]]


def verdict_line(doc: dict) -> str:
    """The run's last line: PASS when every probe run passed, else which did not."""
    total = len(doc["probes"])
    if doc["passed"]:
        return f"probes: PASS ({total} of {total})"
    return (f"probes: FAIL ({total - len(doc['failed'])} of {total} passed; failed: "
            f"{', '.join(doc['failed'])})")
