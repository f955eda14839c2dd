"""The Docker engine, through the docker SDK: pulls and classic-builder builds with their
progress streams, throwaway containers (the base's probe, a layer's record), labels and tags."""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
from pathlib import Path

import docker
from docker.errors import APIError, ContainerError, DockerException, ImageNotFound
from docker.utils import parse_repository_tag

from recipekit.imagebuild.inputs import BuildError
from recipekit.sm121_packages import VERSION_PATTERN

# Where docker/apply-layer.py records each layer's result inside the image.
RECORD_DIR = "/opt/glm53-recipe/build-record"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# The base's Python, machine, glibc and vLLM release (its vllm/_version.py, read without
# importing vllm; "-" where it states none): the release picks v8's package set.
PROBE = f"""
import importlib.util, os, platform, re, sys
spec = importlib.util.find_spec("vllm")
where = list(spec.submodule_search_locations or []) if spec else []
path = os.path.join(where[0], "_version.py") if where else ""
text = open(path, encoding="utf-8").read() if path and os.path.isfile(path) else ""
found = re.search({VERSION_PATTERN.pattern!r}, text, re.M)
print("%d.%d" % sys.version_info[:2], platform.machine(),
      os.confstr("CS_GNU_LIBC_VERSION").split()[-1], found.group(1) if found else "-")
"""


class Engine:
    def __init__(self) -> None:
        try:
            self.client = docker.from_env(timeout=600)
            self.client.ping()
        except DockerException as error:
            raise BuildError(f"no Docker engine answers ({str(error)[:160]}); start dockerd or "
                             "check DOCKER_HOST") from None
        self.api = self.client.api

    def inspect(self, ref: str) -> dict | None:
        try:
            return self.api.inspect_image(ref)
        except APIError as error:  # not found, or an invalid reference: no image either
            if isinstance(error, ImageNotFound) or error.status_code == 400:
                return None
            raise

    def image_id(self, ref: str) -> str:
        return (self.inspect(ref) or {}).get("Id", "")

    def digest(self, ref: str) -> str:
        """REF's registry digest in its own repository (sha256:...), or "" (a loaded or built image)."""
        repository = parse_repository_tag(ref)[0]
        for entry in (self.inspect(ref) or {}).get("RepoDigests") or []:
            name, _, digest = entry.rpartition("@")
            if name == repository:
                return digest
        return ""

    def pull(self, ref: str, show, digest: str = "") -> str:
        """REF pulled from its registry (exactly DIGEST, then tagged REF, when given), every
        progress event handed to SHOW: its image ID. PullFailed says why it could not be."""
        repository, tag = parse_repository_tag(ref)
        try:
            for event in self.api.pull(repository, tag=digest or tag or "latest", stream=True, decode=True):
                if "error" in event:
                    raise PullFailed(event["error"])
                show(event)
            if digest:
                self.api.tag(f"{repository}@{digest}", repository, tag or "latest")
        except DockerException as error:
            raise PullFailed(getattr(error, "explanation", None) or str(error)) from None
        if not (found := self.image_id(ref)):
            raise PullFailed("the engine reported no error, but the image is not there after the pull")
        return found

    def labels(self, ref: str) -> dict[str, str]:
        return (self.inspect(ref) or {"Config": {}})["Config"].get("Labels") or {}

    def output(self, image: str, entrypoint: str, *args: str) -> str:
        """The stdout of ENTRYPOINT ARGS in a throwaway container of IMAGE, without network."""
        try:
            out = self.client.containers.run(image, list(args), entrypoint=[entrypoint], network_mode="none", remove=True)
        except ContainerError as error:
            why = (error.stderr or b"").decode(errors="replace").strip()[:300]
            raise BuildError(f"{image[7:19]}: {entrypoint} {' '.join(args)[:60]} failed in a container: {why}") from None
        return out.decode(errors="replace")

    def probe(self, base_id: str) -> str:
        return self.output(base_id, "python3", "-c", PROBE).strip()

    def record(self, image: str, layer: str) -> dict:
        return json.loads(self.output(image, "cat", f"{RECORD_DIR}/{layer}.json"))

    def build(self, dockerfile: Path, context: Path, base_id: str, log: Path, verbose: bool) -> str:
        """DOCKERFILE built on BASE_ID from CONTEXT, its progress in LOG: the image ID."""
        # The SDK adds DOCKERFILE as .dockerfile.<random>; the context's .dockerignore keeps it out of COPY.
        with log.open("w") as sink:
            return _follow(self.api.build(path=str(context), dockerfile=str(dockerfile), buildargs={"BASE_IMAGE": base_id},
                                          network_mode="none", rm=True, forcerm=True, decode=True), sink, verbose)

    def label(self, image: str, labels: dict[str, str], tag: str, log: Path) -> None:
        """IMAGE plus one LABEL step (each --label would be a step: an image copy on vfs), as TAG."""
        pairs = "".join(f' \\\n  {json.dumps(key)}={_quoted(value)}' for key, value in labels.items())
        dockerfile = f"FROM {image}\nLABEL{pairs}\n".encode()
        with log.open("a") as sink:
            _follow(self.api.build(fileobj=io.BytesIO(dockerfile), tag=tag, network_mode="none",
                                   rm=True, decode=True), sink, False)

    def tag(self, image: str, ref: str) -> None:
        repository, _, tag = ref.rpartition(":") if ":" in ref.rsplit("/", 1)[-1] else (ref, "", "latest")
        self.api.tag(image, repository, tag)

    def untag(self, ref: str) -> None:
        with contextlib.suppress(APIError):
            self.api.remove_image(ref)


class BuildFailed(BuildError):
    """The builder's error (the log holds the rest)."""


class PullFailed(Exception):
    """Why the engine could not pull an image (its message, first line)."""

    def __init__(self, why: str):
        super().__init__(" ".join(str(why).split())[:240])


class PullProgress:
    """A pull's progress, layer by layer, as lines for SAY: a layer already here, each quarter
    of a layer's download, a layer downloaded, a layer extracted; then totals (summary())."""

    QUARTERS = (25, 50, 75)

    def __init__(self, say) -> None:
        # Per layer to pull: its size, the last quarter shown; the layers extracted, and the
        # layers the engine already had (those are never pulled).
        self.say, self.sizes, self.shown, self.done, self.here = say, {}, {}, set(), set()

    def __call__(self, event: dict) -> None:
        layer, status = event.get("id", ""), event.get("status", "")
        detail = event.get("progressDetail") or {}
        if not layer or status.startswith("Pulling from"):
            return
        if status == "Pulling fs layer":
            self.sizes.setdefault(layer, 0)
        elif status == "Already exists":
            self.here.add(layer)
            self.say(f"layer {layer}: already here")
        elif status == "Downloading" and detail.get("total"):
            self.sizes[layer] = total = detail["total"]
            percent = 100 * detail.get("current", 0) // total
            crossed = [mark for mark in self.QUARTERS if percent >= mark > self.shown.get(layer, 0)]
            if crossed:
                self.shown[layer] = crossed[-1]
                self.say(f"layer {layer}: downloading, {_mb(detail.get('current', 0))} of {_mb(total)} MB")
        elif status == "Download complete":
            self.say(f"layer {layer}: downloaded ({_mb(self.sizes.get(layer, 0))} MB)")
        elif status == "Pull complete":
            self.done.add(layer)
            self.say(f"layer {layer}: extracted ({len(self.done)} of {len(self.sizes)} layers to pull)")

    def summary(self) -> str:
        return (f"{len(self.sizes)} layers pulled ({_mb(sum(self.sizes.values()))} MB), "
                f"{len(self.here)} already here")


def _mb(count: int) -> str:
    return f"{count / 1e6:.1f}"


def _quoted(value: str) -> str:
    """VALUE as a Dockerfile string: JSON's escapes, and no variable expansion."""
    return json.dumps(value, ensure_ascii=False).replace("$", "\\$")


def _follow(stream, sink, verbose: bool) -> str:
    image = ""
    for chunk in stream:
        # The builder colours a step's stderr; the log is plain text.
        text = ANSI.sub("", chunk.get("stream", ""))
        if "error" in chunk:
            text += f"{chunk['error']}\n"
        sink.write(text)
        sink.flush()
        if verbose:
            sys.stderr.write(text)
        if "error" in chunk:
            raise BuildFailed(chunk["error"].strip())
        image = chunk.get("aux", {}).get("ID", image)
    if not image:
        raise BuildFailed("the builder reported no image ID")
    return image
