"""scripts/build.sh: the image chain in recipekit.layers.LAYERS order, each layer FROM the
previous one's image, labelled with what its build step recorded. docs/images.md."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import re
import sys
import time
from pathlib import Path

from recipekit.one_line_parser import OneLineParser
from recipekit import recipe as recipe_file
from recipekit import baselock, image_labels
from recipekit.baselock import BaseLock, LockError, lock_path, shown
from recipekit.imagebuild import inputs
from recipekit.imagebuild.engine import BuildFailed, Engine, PullFailed, PullProgress
from recipekit.imagebuild.heartbeat import Heartbeat
from recipekit.imagebuild.inputs import BUILD_DIR, BuildError, Context, relative
from recipekit.layers import LAYERS

OK = ("applied", "already-applied", "provided-by-base")
RECORD_FIELDS = ("layer", "outcome", "files", "reason", "vllm_root", "python", "packages")  # the labelled ones


class Refused(BuildError):  # a layer refused (its reason is in the log): exit 3
    pass


class BaseRefused(BuildError):
    """The base refused before anything was built or tagged (not here and not pullable, moved
    since recipe.lock recorded it, not recorded under BASE_LOCK=strict): one line, exit 4."""


def say(message: str) -> None:
    print(f"build.sh: {message}", file=sys.stderr, flush=True)


def row(layer: str, outcome: str, tag: str, image: str = "", note: str = "") -> str:
    return f"  {layer:<4} {outcome:<17} {tag:<40} {image:<13} {note}"


def arguments(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(prog="build.sh", description=__doc__)
    add = parser.add_argument
    add("--base", help="the first layer's base (default: recipe.toml's BASE_IMAGE for the first layer, "
        "else the previous layer's tag)")
    add("--from", dest="first", choices=LAYERS, default=LAYERS[0])
    add("--to", dest="last", choices=LAYERS, default=LAYERS[-1])
    add("--check", action="store_true", help="print what would be built; build and tag nothing")
    add("--tag-prefix", default=os.environ.get("GLM53_TAG_PREFIX", ""), help="put every tag under PREFIX "
        "(also $GLM53_TAG_PREFIX), e.g. test-1- gives test-1-glm53-sm121-v9; tests use it")
    add("--verbose", action="store_true", help="stream the builder's output (always in build/logs/LAYER.log)")
    add("--accept-base", action="store_true", help="record the base's current image ID in recipe.lock "
        "(beside --recipe), replacing the one it held")
    add("--base-lock", choices=(baselock.FIRST_USE, baselock.STRICT), help="first-use: the first build "
        "records the vendor image in recipe.lock; strict: it is refused until recorded (default: "
        "$BASE_LOCK, else recipe.toml's BASE_LOCK; run.sh passes its setting)")
    add("--recipe", type=Path, default=recipe_file.RECIPE_PATH, help="the recipe (default: recipe.toml)")
    args = parser.parse_args(argv)
    if LAYERS.index(args.first) > LAYERS.index(args.last):
        parser.error(f"--from {args.first} comes after --to {args.last}")
    if args.tag_prefix and not re.fullmatch(r"[a-z0-9][a-z0-9._/-]*", args.tag_prefix):
        raise BuildError(f"--tag-prefix '{args.tag_prefix}' is not a valid image-name prefix "
                         "(lowercase, digits, . _ - /)")
    return args


class Chain:
    def __init__(self, args: argparse.Namespace, engine: Engine | None = None) -> None:
        self.args = args
        self.recipe = recipe_file.load(args.recipe)
        self.layers = LAYERS[LAYERS.index(args.first):LAYERS.index(args.last) + 1]
        self.vendor = self.recipe.knobs["BASE_IMAGE"].default
        lock_knob = self.recipe.knobs["BASE_LOCK"]
        self.lock_mode = args.base_lock or os.environ.get("BASE_LOCK") or lock_knob.default
        if self.lock_mode not in lock_knob.choices:
            raise BuildError(f"BASE_LOCK={self.lock_mode}: accepted: {' | '.join(lock_knob.choices)}")
        try:
            self.lock = BaseLock.read(lock_path(args.recipe))
        except LockError as error:
            raise BaseRefused(str(error)) from None
        packages = [layer for layer in self.layers if inputs.packages_file(layer).is_file()]
        self.steps, self.step = 4 + len(self.layers) + len(packages), 0
        self.engine = engine or Engine()
        self.base_vllm = "-"  # the probe of the first base says (prepare)

    def tag(self, layer: str) -> str:
        return f"{self.args.tag_prefix}{self.recipe.chain_prefix}{layer}"

    def progress(self, message: str, new_step: bool = True) -> None:
        self.step += new_step
        print(f"build.sh [{self.step}/{self.steps}] {message}", flush=True)

    def base(self) -> tuple[str, str]:
        """The first layer's base, checked against recipe.lock: (reference, image ID). The vendor
        image is pulled when missing; on its first use its ID is recorded in the lock."""
        index = LAYERS.index(self.args.first)
        ref = self.args.base or (self.tag(LAYERS[index - 1]) if index else self.vendor)
        if found := self.engine.image_id(ref):
            return ref, self.trust(ref, found)
        if ref == self.vendor:
            return ref, self.trust(ref, self.pull(ref), pulled=True)
        if index == 0:
            why = f"pass an image this host has with --base (default: the vendor image {self.vendor})"
        else:
            why = f"build it first (scripts/build.sh --to {LAYERS[index - 1]}) or pass --base IMAGE"
        raise BaseRefused(f"base image {ref} not found; {why}")

    def pull(self, ref: str) -> str:
        """REF (the vendor image) pulled through the docker SDK, layer by layer: its image ID.
        Refused before the pull when the lock may not record it; exactly the recorded digest
        when the lock has one."""
        if not self.args.accept_base and (why := self.lock.unrecorded(ref, "", self.lock_mode, self.vendor)):
            raise BaseRefused(f"{ref}: {why}")
        if self.args.check:
            raise BaseRefused(f"base image {ref} is not on this host; scripts/build.sh without --check "
                              "pulls it")
        trusted = self.lock.images.get(ref)
        digest = trusted.digest if trusted and not self.args.accept_base else ""
        self.steps += 1
        self.progress(f"base: {ref} is not on this host: pulling it" + (f" at {digest} (recipe.lock)" if digest else ""))
        started, progress = time.monotonic(), PullProgress(lambda line: print(f"  {line}", flush=True))
        try:
            image_id = self.engine.pull(ref, progress, digest)
        except PullFailed as error:
            raise BaseRefused(f"{ref} is not on this host and pulling it failed ({error}); where its "
                              "registry cannot be reached, docker load it from an archive (docker save "
                              "on a host that has it), then run this again") from None
        self.progress(f"base: pulled {ref} ({image_id[7:19]}): {progress.summary()} in "
                      f"{time.monotonic() - started:.0f} s", False)
        return image_id

    def trust(self, ref: str, image_id: str, pulled: bool = False) -> str:
        """IMAGE_ID, once recipe.lock trusts it for REF: --accept-base records it; a moved tag is
        refused (an image this run pulled is removed again, so the host keeps what it had);
        the vendor image's first use is recorded (BASE_LOCK=strict: refused)."""
        where = shown(self.lock.path)
        if self.args.accept_base and self.args.check:  # --check builds, tags and records nothing
            self.progress(f"base: would accept {ref} as {image_id} in {where}", False)
            return image_id
        if self.args.accept_base:
            self.lock.record(ref, image_id, self.engine.digest(ref), baselock.HOW_ACCEPTED)
            say(f"accepted {ref} as {image_id} in {where}; later builds and ./run.sh hold the tag to it")
            return image_id
        vendor = ref == self.vendor
        why = self.lock.moved(ref, image_id, self.vendor) or (
            self.lock.unrecorded(ref, image_id, self.lock_mode, self.vendor) if vendor else "")
        if why:
            if pulled:
                self.engine.untag(ref)
            raise BaseRefused(f"{ref}: {why}")
        if vendor and ref not in self.lock.images:
            if self.args.check:
                self.progress(f"base: would record {ref} as {image_id} in {where} (first use)", False)
            else:
                digest = self.engine.digest(ref)
                self.lock.record(ref, image_id, digest, baselock.HOW_FIRST_USE)
                say(f"recorded {ref} as {image_id}{f' (digest {digest})' if digest else ''} in {where} on "
                    "first use; a later build or ./run.sh refuses the tag once it names another image")
        return image_id

    def facts(self, ref: str, base_id: str) -> inputs.BaseFacts:
        cache = BUILD_DIR / "probe" / base_id.removeprefix("sha256:")
        probe = cache.read_text().strip() if cache.is_file() else self.engine.probe(base_id)
        if re.fullmatch(r"3\.\d+ \S+ 2\.\d+", probe):  # cached before the vLLM field existed
            probe = self.engine.probe(base_id).strip()
        if not re.fullmatch(r"3\.\d+ \S+ 2\.\d+ \S+", probe):
            raise BuildError(f"{ref}: unexpected probe result '{probe}' (want 'X.Y MACHINE GLIBC "
                             f"VLLM'); delete {relative(cache)}")
        facts = inputs.BaseFacts(*probe.split())
        self.base_vllm = facts.vllm
        if int(facts.python.split(".")[1]) < 10:
            raise BuildError(f"{ref} has Python {facts.python}; the layer tool needs >= 3.10")
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(probe + "\n")
        self.progress(f"base: {ref} ({base_id[7:19]}): Python {facts.python}, {facts.machine}, "
                      f"glibc {facts.glibc}, vLLM {facts.vllm}")
        return facts

    def prepare(self, ref: str, base_id: str) -> dict[str, Context]:
        """Every layer's context, staged: the backport, the wheelhouses, build/context(-LAYER)."""
        backport, self.backport_sha, note = inputs.prepare_backport(sys.executable)
        self.progress(f"backport: {relative(backport)} ({note})")
        facts = self.facts(ref, base_id)
        wheelhouse, note = inputs.tool_wheelhouse(sys.executable, facts)
        self.progress(f"wheelhouse: {wheelhouse} ({note})")
        shared = inputs.stage_context(wheelhouse, backport)
        self.progress(f"context: build/context (sha256 {shared.sha256[:16]})")
        contexts = {layer: shared for layer in self.layers}
        for layer in [name for name in self.layers if inputs.packages_file(name).is_file()]:
            wheels, note = inputs.packages_wheelhouse(sys.executable, facts, layer)
            self.progress(f"sm121 packages: {relative(facts.packages(layer))} for vLLM {facts.vllm}: "
                          f"{wheels} ({note}, {len(list(wheels.glob('*.whl')))} wheels)")
            contexts[layer] = inputs.stage_packages_context(shared, layer, wheels)
            self.progress(f"context: {relative(contexts[layer].path)} (sha256 {contexts[layer].sha256[:16]})", False)
        return contexts

    def build_layer(self, layer: str, base_id: str, base_ref: str, context: Context) -> tuple[str, str]:
        """Build, read back, label and tag LAYER: (outcome, image ID)."""
        log = BUILD_DIR / "logs" / f"{layer}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        try:
            beating = contextlib.nullcontext() if self.args.verbose else Heartbeat(layer, log, say, relative(log))
            with beating:
                built = self.engine.build(inputs.dockerfile_of(layer), context.path, base_id, log, self.args.verbose)
        except BuildFailed as error:
            lines = log.read_text(errors="replace").splitlines()
            refusal = [line[max(line.find("glm53 layer:"), 0):] for line in lines if "REFUSED" in line]
            print("\n".join(f"  {line}" for line in refusal or lines[-15:]), file=sys.stderr)
            if refusal:
                raise Refused(f"refused by scripts/patch-layer (full output: {relative(log)})") from None
            raise BuildError(f"docker build failed: {error} (full output: {relative(log)})") from None
        # Until it is labelled, the built image holds a tag of its own, so that whatever prunes
        # untagged images meanwhile (docker image prune, a concurrent test session) leaves it.
        hold = f"{self.tag(layer)}:unlabelled-{os.getpid()}"
        self.engine.tag(built, hold)
        try:
            record = self.engine.record(built, layer)
            field = {key: ",".join(value) if isinstance(value, list) else str(value).split("\n")[0]
                     for key, value in ((name, record.get(name, "")) for name in RECORD_FIELDS)}
            if field.get("layer") != layer or field.get("outcome") not in OK:
                raise BuildError(f"the built image records layer '{field.get('layer')}' outcome "
                                 f"'{field.get('outcome')}'; not tagged")
            labels = self.labels(layer, field, base_id, base_ref, context)
            self.engine.label(built, labels, self.tag(layer), log)
        finally:
            self.engine.untag(hold)
        if self.engine.labels(self.tag(layer)).get("glm53.inputs") != labels["glm53.inputs"]:
            raise BuildError(f"{self.tag(layer)} does not carry this build's inputs label after tagging")
        return field["outcome"], self.engine.image_id(self.tag(layer))

    def labels(self, layer: str, field: dict, base_id: str, base_ref: str, context: Context) -> dict:
        """What the image says about itself: the record's fields, the inputs, the base."""
        base, index, commit = self.engine.inspect(base_id), LAYERS.index(layer), inputs.recipe_commit()
        below = base["Config"].get("Labels") or {}
        # glm53.chain lists every layer's outcome, when the base is this chain's previous layer.
        chained = bool(index) and below.get("glm53.layer") == LAYERS[index - 1]
        earlier = below.get("glm53.chain", "") + " " if chained else ""
        # glm53.provided: the layers whose work the base does already (for the launcher's line)
        provided = (below.get(image_labels.PROVIDED, "").split() if chained else []) + (
            [layer] if field["outcome"] == "provided-by-base" else [])
        labels = {
            "glm53.scheme": inputs.SCHEME, "glm53.layer": layer, "glm53.outcome": field["outcome"],
            "glm53.files": field.get("files", ""), "glm53.reason": field.get("reason", ""),
            "glm53.chain": f"{earlier}{layer}={field['outcome']}",
            "glm53.inputs": inputs.inputs_hash(layer, base_id, context),
            "glm53.commit": commit, "org.opencontainers.image.revision": commit,
            "glm53.patch.sha256": inputs.patch_hash(layer), "glm53.backport.sha256": self.backport_sha,
            "glm53.wheelhouse.sha256": context.wheelhouse_sha256, "glm53.base.id": base_id,
            "glm53.base.ref": base_ref, "glm53.base.digest": " ".join(base.get("RepoDigests") or []) or "none",
            "glm53.vllm.root": field.get("vllm_root", ""), "glm53.python": field.get("python", ""),
            image_labels.BASE_VLLM: self.base_vllm, image_labels.PROVIDED: " ".join(provided),
        }
        if context.packages_sha256:
            labels.update({image_labels.PACKAGES: field.get("packages", ""),
                           "glm53.packages.wheelhouse.sha256": context.packages_sha256})
        return labels

    def move_aside_from(self, layer: str) -> None:
        """LAYER's and every later layer's tags go to :stale: no earlier build passes for this one."""
        for later in LAYERS[LAYERS.index(layer):]:
            tag = self.tag(later)
            if self.engine.image_id(tag):
                self.engine.tag(tag, f"{tag}:stale")
                self.engine.untag(tag)
                say(f"moved the earlier {tag} aside to {tag}:stale; it is not the result of this build")

    def run(self) -> int:
        ref, base_id = self.base()
        contexts = self.prepare(ref, base_id)
        summary, pending, base_ref = [], "", ref
        for layer in self.layers:
            tag, wanted = self.tag(layer), inputs.inputs_hash(layer, base_id, contexts[layer])
            existing, labels = self.engine.image_id(tag), self.engine.labels(tag)
            if pending:
                self.progress(f"{layer}: would build {tag} after {pending} (its base changes)")
            elif existing and labels.get("glm53.inputs") == wanted and labels.get("glm53.outcome") in OK:
                outcome = labels["glm53.outcome"]
                self.progress(f"{layer}: up to date: {tag} ({existing[7:19]}, {outcome}, inputs {wanted[:12]})")
                summary.append(row(layer, outcome, tag, existing[7:19], "up-to-date"))
                base_id, base_ref = existing, tag
                continue
            elif self.args.check:
                replaces = f"; replaces {existing[7:19]}" if existing else ""
                self.progress(f"{layer}: would build {tag} on {base_ref} ({base_id[7:19]}, inputs {wanted[:12]}{replaces})")
                pending = layer
            else:
                self.progress(f"{layer}: building {tag} on {base_ref} ({base_id[7:19]}) ...")
                started = time.monotonic()
                try:
                    outcome, existing = self.build_layer(layer, base_id, base_ref, contexts[layer])
                except BuildError as error:
                    say(f"{layer}: {error}")
                    status = 3 if isinstance(error, Refused) else 1
                    took = f"{time.monotonic() - started:.0f} s"
                    summary.append(row(layer, "refused" if status == 3 else "failed", "(not tagged)", "-", took))
                    self.move_aside_from(layer)
                    return self.finish(summary, layer, status)
                took = f"{time.monotonic() - started:.0f} s"
                self.progress(f"{layer}: {outcome}: tagged {tag} ({existing[7:19]}, {took})", False)
                summary.append(row(layer, outcome, tag, existing[7:19], f"built in {took}"))
                base_id, base_ref = existing, tag
                continue
            summary.append(row(layer, "would-build", tag))
        return self.finish(summary)

    def finish(self, summary: list[str], failed: str = "", status: int = 0) -> int:
        print(f"build.sh: summary{' (--check: nothing was built)' if self.args.check else ''}:")
        print("\n".join(summary))
        if failed:
            print(f"build.sh: FAILED at {failed}; no tag was applied for {failed} or any later layer")
        elif not self.args.check:
            self.note_stale_later_layers()
        return status

    def note_stale_later_layers(self) -> None:
        for index in range(LAYERS.index(self.layers[-1]) + 1, len(LAYERS)):
            later, below = self.tag(LAYERS[index]), self.engine.image_id(self.tag(LAYERS[index - 1]))
            if self.engine.image_id(later) and self.engine.labels(later).get("glm53.base.id") != below:
                say(f"note: {later} was built on another {self.tag(LAYERS[index - 1])}; rebuild it "
                    f"with --to {LAYERS[index]}")


def main(argv: list[str]) -> int:
    try:
        args = arguments(argv)
        BUILD_DIR.mkdir(parents=True, exist_ok=True)
        with (BUILD_DIR / ".lock").open("w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                say(f"waiting for another scripts/build.sh in this checkout ({relative(BUILD_DIR / '.lock')})")
                fcntl.flock(lock, fcntl.LOCK_EX)
            return Chain(args).run()
    except BaseRefused as refused:
        print(f"build.sh: refused: {refused}", file=sys.stderr)
        return baselock.BASE_REFUSED_EXIT
    except (BuildError, LockError, recipe_file.RecipeError) as error:
        print(f"build.sh: error: {error}", file=sys.stderr)
        return 1
