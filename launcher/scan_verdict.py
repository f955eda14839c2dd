"""The checkpoint scan's report (scripts/scan-checkpoint --json, run in the serving image)
judged for the run's image: a local MODEL whose routed experts' gate/up global scales differ
is served right only by an image that corrects them (the chain from the layer the scan
names); any other image would decode each such expert's up half off by the ratio, silently.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.checks import chain_layer_number
from recipekit.recipe import Recipe


class BadReport(Exception):
    """The scan printed something that is not its report."""


@dataclass(frozen=True)
class Verdict:
    summary: str  # the scan's one line and what this image does about it
    problem: str  # why this image would serve the checkpoint wrong; "" when it would not
    accepted: str  # what would serve it right, for the refusal


def failure(image: str, returncode: int, stderr: str, where: str = "") -> tuple[str, str]:
    """(why, what is accepted) when the scan WHERE (default: in IMAGE) did not give its report:
    an image built before scripts/scan-checkpoint existed lacks it (and the layers that came
    with it)."""
    where = where or f"in {image}"
    said = (stderr.strip().splitlines() or ["no output"])[-1]
    if "can't open file" in said and "scan-checkpoint" in said:
        return (f"IMAGE={image} has no scripts/scan-checkpoint: it was built before the scan "
                "(and may lack the layers that came with it)",
                "the chain rebuilt (scripts/build.sh rebuilds the layers whose inputs changed), "
                "or CHECKPOINT_SCAN=off to boot without the scan")
    return (f"the checkpoint scan {where} failed (it exited {returncode}: {said})",
            "a checkpoint directory the scan reads, or CHECKPOINT_SCAN=off to boot without the "
            "scan")


def judge(report: object, image: str, recipe: Recipe, chain_image: str) -> Verdict:
    """REPORT (the scan's JSON) for IMAGE; CHAIN_IMAGE is the image scripts/build.sh builds."""
    try:
        summary, fix = report["summary"], report["fix"]
        experts = report["routed_experts"]
        needed, from_layer = bool(fix["needed"]), fix["from_layer"]
        differ, pairs, largest = experts["differ"], experts["pairs"], experts["largest_ratio"]
    except (TypeError, KeyError):
        raise BadReport("the scan's JSON lacks summary, fix or routed_experts") from None
    if not needed:
        return Verdict(f"{summary}; {fix['says']}", "", "")
    mismatch = (f"{differ} of {pairs} routed experts' gate/up global scales differ (largest "
                f"ratio {largest:.4g})")
    if from_layer is None:
        return Verdict(f"{summary}; no image of this recipe corrects them", f"{mismatch}: "
                       f"{fix['says']}", "a checkpoint whose gate and up scales are equal")
    layer = chain_layer_number(recipe, image)
    if layer is not None and layer >= from_layer:
        return Verdict(f"{summary}; {image} corrects them (layer v{from_layer} and later fold "
                       "each half's global scale into its block scales)", "", "")
    what = (f"is chain layer v{layer}, before v{from_layer}" if layer is not None
            else f"is not a chain image from layer v{from_layer} on")
    return Verdict(f"{summary}; {image} does not correct them", f"{mismatch}, and IMAGE={image} "
                   f"{what}, whose fold corrects them: it would serve each such expert's up half "
                   "off by its ratio (corrupt multibyte text, broken tool calls)",
                   f"IMAGE={chain_image}")
