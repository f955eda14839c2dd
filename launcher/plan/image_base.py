"""What the serving image says of its base, read once on the head before any rank starts.

The image chain (recipekit/imagebuild/chain.py) labels every image it builds, and the top
image inherits them: `glm53.base.vllm`, the vLLM release of the base the chain was built on
as its vllm/_version.py states it ("-" when unknown), and `glm53.provided`, the chain's
layers whose work that base does already (outcome "provided-by-base"). The start-up line
names what the base provides; an EXTRA_ENV setting that the base's vLLM release no longer
honours is refused (RETIRED_ENV). An image without the labels (built before them, or not by
the chain) is unknown: nothing is refused, nothing is claimed, and nothing fails.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from launcher.plan.settings import Refused, refusal
from recipekit import image_labels, sm121_packages

BASE_VLLM_LABEL = image_labels.BASE_VLLM
PROVIDED_LABEL = image_labels.PROVIDED
LABELS_FORMAT = "{{json .Config.Labels}}"


@dataclass(frozen=True)
class Retired:
    """An engine variable's value that vLLM stopped honouring from a release on."""
    name: str
    value: str
    since: str  # the first vLLM release that does not honour it
    removed: str  # what that release removed, as the refusal says it


# Each such fact, once: the refusal (serve), DRY_RUN's label step (steps) and the refusals of
# docs/launcher.md (rendered by scripts/render-docs) read it here.
RETIRED_ENV = (
    Retired("VLLM_USE_V2_MODEL_RUNNER", "0", "0.34.0", "the V1 model runner"),
)


@dataclass(frozen=True)
class ImageBase:
    """The labels' facts; empty where the image does not say."""
    vllm: str = ""  # the base's vLLM version, "" when unknown (no label, or "-")
    provided: tuple[str, ...] = ()  # chain layers the base provides natively
    labelled: bool = False  # the image has the chain's labels at all
    packages: tuple[tuple[str, str], ...] = ()  # (name, version) layer v8 installed


UNKNOWN = ImageBase()
PACKAGES_LABEL = image_labels.PACKAGES
# MOE_BACKEND's value that needs a package of its own in the image: v8 installs b12x where
# the base's vLLM names it (patches/v8/packages-vllm-*.txt), and the label lists it.
B12X = "b12x"


def parse(text: str | None) -> ImageBase:
    """The facts in `docker image inspect`'s labels JSON; UNKNOWN for anything else (no
    labels: `null`; a failed inspect: None)."""
    try:
        labels = json.loads(text) if text else None
    except ValueError:
        return UNKNOWN
    if not isinstance(labels, dict):
        return UNKNOWN
    vllm, provided = labels.get(BASE_VLLM_LABEL), labels.get(PROVIDED_LABEL)
    vllm = vllm.strip() if isinstance(vllm, str) and vllm.strip() != "-" else ""
    listed = labels.get(PACKAGES_LABEL)
    packages = tuple(tuple(pin.strip().split("==", 1)) for pin in listed.split(",")
                     if "==" in pin) if isinstance(listed, str) else ()
    return ImageBase(vllm, tuple(provided.split()) if isinstance(provided, str) else (),
                     BASE_VLLM_LABEL in labels, packages)


def carried(base: ImageBase, package: str) -> str:
    """The version of PACKAGE the image's v8 installed, or ""."""
    return dict(base.packages).get(package, "")


def b12x_refusal(image: str, base: ImageBase, moe_backend: str, forced: bool) -> Refused | None:
    """MOE_BACKEND=b12x on an IMAGE whose labels do not list the b12x package (the vendor
    fork's vLLM has no b12x backend, and v8 installs b12x only where the base's vLLM names
    it); an image without the chain's labels cannot say, and is refused too unless
    FORCE_UNSAFE_MOE=1 (FORCED) passes it as asked."""
    if moe_backend != B12X or carried(base, B12X) or forced:
        return None
    if not base.labelled:
        said = "has no labels of the image chain, so nothing says it carries the b12x package"
    else:
        who = f"vLLM {base.vllm}" if base.vllm else "an unknown vLLM release"
        said = (f"is built on {who}, and its layer v8 installed no b12x package (v8 installs "
                f"the release a base's vLLM names for its b12x extra, on vLLM "
                f"{sm121_packages.b12x_bases()}; the vendor fork's vLLM has no b12x backend)")
    return refusal("MOE_BACKEND", moe_backend, f"IMAGE={image} {said}; accepted: marlin, an IMAGE "
                   "the chain built on such a base, or FORCE_UNSAFE_MOE=1 to pass it as asked")


# A PEP 440 version as vLLM's are written: release, pre-release, post, dev, local part.
_VERSION = re.compile(r"v?(?P<release>[0-9]+(?:\.[0-9]+)*)"
                      r"(?:[-_.]?(?P<pre>a|b|rc)(?P<pre_n>[0-9]*))?"
                      r"(?:[-_.]?post(?P<post>[0-9]*))?"
                      r"(?:[-_.]?dev(?P<dev>[0-9]*))?"
                      r"(?:\+[A-Za-z0-9]+(?:[-_.][A-Za-z0-9]+)*)?", re.IGNORECASE)
_PRE = {"a": 0, "b": 1, "rc": 2}


def version_key(text: str) -> tuple | None:
    """TEXT as a key that orders as PEP 440 orders versions (the local part ignored), or None
    when it is not a version: 0.34.0.dev3 < 0.34.0rc1 < 0.34.0 < 0.34.0.post1 < 0.34.1, and
    the vendor fork's 0.1.dev20051+g487ecf187 sorts before every 0.x release above 0.1."""
    found = _VERSION.fullmatch(text.strip())
    if not found:
        return None
    release = [int(part) for part in found["release"].split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    if found["pre"]:
        pre = (_PRE[found["pre"].lower()], int(found["pre_n"] or 0))
    elif found["dev"] is not None and found["post"] is None:
        pre = (-1, 0)  # X.devN comes before X's pre-releases
    else:
        pre = (3, 0)
    post = int(found["post"] or 0) if found["post"] is not None else -1
    dev = (0, int(found["dev"] or 0)) if found["dev"] is not None else (1, 0)
    return (tuple(release), pre, post, dev)


def at_least(version: str, release: str) -> bool:
    """Whether VERSION is RELEASE or newer; an unreadable VERSION is not."""
    have, since = version_key(version), version_key(release)
    return have is not None and since is not None and have >= since


def retired_asked(words: list[str]) -> list[tuple[str, Retired]]:
    """(word, fact) of each EXTRA_ENV word that sets a value some vLLM release retired."""
    return [(word, entry) for word in words for entry in RETIRED_ENV
            if word == f"{entry.name}={entry.value}"]


def retired_refusal(image: str, base: ImageBase, words: list[str]) -> Refused | None:
    """The refusal of the first EXTRA_ENV word (of WORDS) that IMAGE's base no longer
    honours; None when none is, or the base's release is unknown."""
    for word, entry in retired_asked(words):
        if base.vllm and at_least(base.vllm, entry.since):
            which = (", which" if version_key(base.vllm) == version_key(entry.since)
                     else f"; vLLM {entry.since}")
            return refusal("EXTRA_ENV", word, f"IMAGE={image} is built on vLLM {base.vllm}{which} "
                           f"removed {entry.removed}, so {word} is no longer honoured; accepted: "
                           f"EXTRA_ENV without it, or an IMAGE built on a base before vLLM "
                           f"{entry.since}")
    return None


def startup_phrase(base: ImageBase) -> str:
    """What the start-up line says of the base: the layers it provides natively; "" when the
    labels name none (or the image has no labels)."""
    if not base.provided:
        return ""
    who = f"base vLLM {base.vllm}" if base.vllm else "base"
    return f"{who} provides {' '.join(base.provided)}"


def retired_list() -> str:
    """docs/launcher.md's list of RETIRED_ENV (scripts/render-docs), one bullet a fact."""
    return "\n".join(f"- `{entry.name}={entry.value}` on a base of vLLM {entry.since} or later: "
                     f"that release removed {entry.removed}, so the setting is no longer "
                     "honoured." for entry in RETIRED_ENV)
