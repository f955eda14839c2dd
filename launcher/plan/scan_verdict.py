"""The checkpoint scan's report (scripts/scan-checkpoint --json, run in the serving image)
judged for the run's image: a local MODEL with a fused group (a routed expert's gate/up
halves, a merged linear's shards) whose global scales differ is served right only by an
image that corrects that kind (the chain from the layer the scan names); any other image
would decode such halves off by their ratio, silently. A checkpoint the scan refuses (a
fused half without its global scale, or one that is NaN, infinite, zero or negative) is
served wrong by every image.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.plan.checks import chain_layer_number
from recipekit.recipe import Recipe

# scripts/scan-checkpoint's exit status for a checkpoint it read and refuses
REFUSED = 4


class BadReport(Exception):
    """The scan printed something that is not its report."""


@dataclass(frozen=True)
class Verdict:
    summary: str  # the scan's one line and what this image does about it
    problem: str  # why this image would serve the checkpoint wrong; "" when it would not
    accepted: str  # what would serve it right, for the refusal


def failure(image: str, returncode: int, stderr: str, where: str = "") -> tuple[str, str]:
    """(why, what is accepted) when the scan WHERE (default: in IMAGE) did not give its report:
    it refused the checkpoint, or an image built before scripts/scan-checkpoint existed lacks
    it (and the layers that came with it), or it could not read the directory."""
    where = where or f"in {image}"
    said = (stderr.strip().splitlines() or ["no output"])[-1]
    if returncode == REFUSED:
        return (f"the checkpoint scan {where} refuses it ({said}), whatever the image",
                "a checkpoint whose fused halves each have a finite, positive global scale "
                "(re-download it, or use one exported with them)")
    if "can't open file" in said and "scan-checkpoint" in said:
        return (f"IMAGE={image} has no scripts/scan-checkpoint: it was built before the scan "
                "(and may lack the layers that came with it)",
                "the chain rebuilt (scripts/build.sh rebuilds the layers whose inputs changed), "
                "or CHECKPOINT_SCAN=off to boot without the scan")
    return (f"the checkpoint scan {where} failed (it exited {returncode}: {said})",
            "a checkpoint directory the scan reads, or CHECKPOINT_SCAN=off to boot without the "
            "scan")


def mismatch(kinds: list[dict]) -> str:
    """What differs, per kind: '3 of 8 routed experts' gate/up global scales differ (largest
    ratio 4)', '1 of 2 shared experts gate_up groups' global scales differ (...)'."""
    said = []
    for kind in kinds:
        if kind["kind"] == "experts":
            what = "routed experts' gate/up"
        else:
            what = f"{kind['label']} groups'"
        said.append(f"{kind['differ']} of {kind['groups']} {what} global scales differ (largest "
                    f"ratio {kind['largest_ratio']:.4g})")
    return ", and ".join(said)


def judge(report: object, image: str, recipe: Recipe, chain_image: str) -> Verdict:
    """REPORT (the scan's JSON) for IMAGE; CHAIN_IMAGE is the image scripts/build.sh builds."""
    try:
        summary, fix = report["summary"], report["fix"]
        needed, from_layer = bool(fix["needed"]), fix["from_layer"]
        unequal = [kind for kind in report["fused_groups"] if kind["differ"]]
        differ = mismatch(unequal)
    except (TypeError, KeyError):
        raise BadReport("the scan's JSON lacks summary, fix or fused_groups; an image built "
                        "before the scan judged every fused group lacks fused_groups: rebuild "
                        "the chain (scripts/build.sh)") from None
    if not needed:
        return Verdict(f"{summary}; {fix['says']}", "", "")
    if not unequal:
        raise BadReport("the scan's JSON says a fix is needed but no fused group differs")
    if from_layer is None:
        return Verdict(f"{summary}; no image of this recipe corrects them", f"{differ}: "
                       f"{fix['says']}", "a checkpoint whose fused halves' global scales are "
                       "equal")
    layer = chain_layer_number(recipe, image)
    if layer is not None and layer >= from_layer:
        return Verdict(f"{summary}; {image} corrects them (layer v{from_layer} and later apply "
                       "each half's and shard's own global scale)", "", "")
    what = (f"is chain layer v{layer}, before v{from_layer}" if layer is not None
            else f"is not a chain image from layer v{from_layer} on")
    return Verdict(f"{summary}; {image} does not correct them", f"{differ}, and IMAGE={image} "
                   f"{what}, which corrects them: it would serve each such half or shard off by its "
                   "ratio (corrupt multibyte text, broken tool calls)",
                   f"IMAGE={chain_image}")
