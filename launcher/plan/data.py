"""The plan as data: what a run of run.sh (Plan) or stop.sh (StopPlan) will do, every node's
every command, argv, file and environment, built once by launcher/plan/plan.py before
anything runs. launcher/apply/ only reads it: DRY_RUN prints it (steps.py), a run carries
it out (serve.py); neither asks launcher/plan/ for a command while it runs.

A few facts only the run can find out: the model's and the drafter's commits (resolved in
the image on the head), the image's ID (known once it is built or found). Until then each
is a hole, a word of its own kind written into the plan where the fact goes; the run fills
each once it is found (Plan.filled), and DRY_RUN prints the hole. A hole a command still
holds when it is about to run is the launcher's own fault (launcher/apply/remote.py).
A command's own holes, filled as it runs (the listed container IDs, the image's size, the
API key's env file), are filled by with_words.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from launcher.plan.checks import Checked
from launcher.plan.drafter import cksum
from launcher.plan.nodes import Nodes

Command = tuple[str, ...]
NO_COMMAND: Command = ()

# The holes. Each pin has a hole of its own (one run may resolve both); DRY_RUN prints
# either as UNPINNED.
MODEL_PIN = "<model-revision-resolved-at-run>"
DRAFTER_PIN = "<drafter-revision-resolved-at-run>"
UNPINNED = "<resolved-at-run>"
IMAGE_ID = "<image-id>"  # the image ID without sha256:, where a JIT cache directory is named
IMAGE_BYTES = "<image-bytes>"  # the image's size, for the streaming meter
LISTED_IDS = "<listed-ids>"  # the serve containers a listing found (several words, or none)
API_KEY_ENV_FILE = "<api-key-env-file>"  # rank 0's 0600 file holding the API key
HOLES = (MODEL_PIN, DRAFTER_PIN, IMAGE_ID, IMAGE_BYTES, LISTED_IDS, API_KEY_ENV_FILE)

CONTAINER_HF_HOME = "/root/.cache/huggingface"
LOG_TAIL_LINES = 40  # a rank that died: the last lines of its log, printed
SERVE_LABEL = "glm53.launcher=serve"
TOOL_LABEL = "glm53.launcher=tool"


def rank_container(rank: int) -> str:
    return f"glm53-rank{rank}"


def with_words(argv: Sequence[str], words: Mapping[str, str | Sequence[str]]) -> Command:
    """ARGV with each hole of WORDS filled: a word that is a hole given several words becomes
    those words; a hole given one word is replaced wherever it stands."""
    filled: list[str] = []
    for word in argv:
        given = words.get(word)
        if given is not None and not isinstance(given, str):
            filled.extend(given)
            continue
        for hole, value in words.items():
            if isinstance(value, str):
                word = word.replace(hole, value)
        filled.append(word)
    return tuple(filled)


def unfilled(argv: Sequence[str]) -> list[str]:
    """The holes ARGV still holds, in the order of HOLES."""
    return [hole for hole in HOLES if any(hole in word for word in argv)]


@dataclass(frozen=True)
class Launch:
    """A run's settings with its pins: each the knob's, a known pin or PINS_FILE's, else a
    hole until the run resolves it; the image ID a hole until the run knows it."""
    checked: Checked
    nodes: Nodes
    model_pin: str
    drafter_pin: str
    image_id: str = IMAGE_ID

    @property
    def recipe(self):
        return self.checked.recipe

    def __getitem__(self, name: str) -> str:
        return self.checked[name]

    @property
    def dflash2(self) -> bool:
        return self["SPEC"] == "dflash2"

    @property
    def local_model(self) -> bool:
        return self["MODEL"].startswith("/")

    @property
    def draft_snapshot(self) -> str:
        drafter = self.checked.drafter
        if drafter.local:
            return drafter.setting
        return (f"{CONTAINER_HF_HOME}/hub/models--{drafter.repo_id.replace('/', '--')}/"
                f"snapshots/{self.drafter_pin}")

    @property
    def draft_dir(self) -> str:
        drafter = self.checked.drafter
        if drafter.local:
            return f"{CONTAINER_HF_HOME}/glm53-drafters/local-{cksum(drafter.setting.encode())}"
        return f"{CONTAINER_HF_HOME}/glm53-drafters/{drafter.setting}-{self.drafter_pin}"

    @property
    def jit_dir(self) -> str:
        """The run's JIT cache on every node: JIT_CACHE keyed by the image ID, so a new image
        starts a new directory and an old one is never fed kernels it did not build."""
        return f"{self['JIT_CACHE']}/{self.image_id.removeprefix('sha256:')}"


@dataclass(frozen=True)
class RankPlan:
    """One rank: where it runs and the `docker run` that starts it, as data."""
    rank: int
    node: str
    container: str
    # ("--mount", spec) and ("--env", "NAME=VALUE") pairs, in `docker run` order.
    options: tuple[tuple[str, str], ...]
    image: str
    serve: Command
    docker_run: Command  # the whole `docker run` (rank 0's --env-file an API_KEY_ENV_FILE hole)

    @property
    def env(self) -> dict[str, str]:
        return dict(value.split("=", 1) for kind, value in self.options if kind == "--env")

    @property
    def mounts(self) -> list[str]:
        return [value for kind, value in self.options if kind == "--mount"]


@dataclass(frozen=True)
class Stream:
    """IMAGE to a worker that lacks it: its size read on the head, `docker save` on the head
    through the progress meter (an IMAGE_BYTES hole) into `docker load` on the worker."""
    size: Command
    save: Command
    meter: Command
    load: Command


@dataclass(frozen=True)
class NodePlan:
    """Every command of one node (the head is node 0), in run order; NO_COMMAND where the
    settings ask for none there."""
    index: int
    address: str
    running: Command  # the serve containers running (a run refuses over them)
    serve_containers: Command  # every serve container, exited too
    remove_containers: Command  # `docker rm --force` of what serve_containers listed
    count_gpus: Command
    make_hf_cache: Command
    read_token: Command
    memory_facts: Command  # MEM_PREFLIGHT's
    image_id: Command  # IMAGE's ID there
    stream: Stream | None  # a worker's copy of the head's image
    make_jit_cache: Command
    fetch_drafter: Command
    prepare_drafter: Command
    lock_clocks: Command
    reset_clocks: Command  # undoes lock_clocks (a start that fails)
    probe: Command  # the platform probe, its script on stdin (Plan.probe_script)
    compact_memory: Command
    rank: RankPlan
    memory_sampler: Command  # MEM_GUARD's
    rank_status: Command
    rank_log_tail: Command  # the last lines of a rank that died
    kill_rank: Command  # the memory guard's stop (the container kept for its logs)
    rank_log: Command  # a killed rank's whole log


@dataclass(frozen=True)
class StartupLine:
    """The one start-up line, with two things only the run can say: the drafter's phrase
    (prepare-drafter's; DRY_RUN's is the catalog's) and what the image's labels say its base
    provides."""
    template: str  # DRAFTER_PHRASE and IMAGE_ABOUT stand where they go
    switches: str  # the image switches at 1 ("" when none)
    catalog_phrase: str

    DRAFTER_PHRASE = "<drafter-phrase>"
    IMAGE_ABOUT = "<image-about>"

    def said(self, drafter_phrase: str, base_phrase: str) -> str:
        about = [part for part in (base_phrase, self.switches) if part]
        return (self.template.replace(self.DRAFTER_PHRASE, drafter_phrase)
                .replace(self.IMAGE_ABOUT, f" ({'; '.join(about)})" if about else ""))

    @property
    def dry_run(self) -> str:
        """What DRY_RUN prints: the catalog's phrase, the labels not read."""
        return self.said(self.catalog_phrase, "")


@dataclass(frozen=True)
class ClockReset:
    """The reset of a node's GPU clocks a record lists (launcher/plan/clock_record.py): its
    address, the range it was locked at, and the argv that reaches it."""
    address: str
    mhz: str
    argv: Command


@dataclass(frozen=True)
class Plan:
    """Every command of one run, built once from its settings (launcher/plan/plan.py)."""
    launch: Launch
    root: Path  # the checkout run.sh runs from: scripts/build.sh, launcher/count_bytes.py
    nodes: tuple[NodePlan, ...]
    startup: StartupLine
    chain_image: str  # what scripts/build.sh builds
    base_lock: Path  # recipe.lock
    base_image_id: Command
    build: Command
    image_labels: Command
    extra_args_parse: Command  # the image's vLLM parser on EXTRA_ARGS (NO_COMMAND without)
    extra_args_shown: Command  # the same as DRY_RUN shows it (the probe named, not inlined)
    scan_checkpoint: Command  # a local MODEL's scan in the image (CHECKPOINT_SCAN)
    host_scan: Command  # the same scan on this host (DRY_RUN)
    resolve: Mapping[str, Command]  # repo -> the Hub look-up of a pin not known, model first
    ranks_per_node: int
    clock_range: str  # GPU_CLOCK_MHZ as nvidia-smi's MIN,MAX ("" without)
    clock_record: Path  # the record of the nodes whose clocks are locked
    clock_resets: tuple[ClockReset, ...]  # what a start that fails resets (the record's nodes)
    probe_script: Path  # launcher/platform_probe.py, on the probe's stdin
    ready_probe: Command  # READY_CHECK's poll on the head (the key, when keyed, on stdin)
    ready_path: str
    self_check: Command

    @property
    def head(self) -> NodePlan:
        return self.nodes[0]

    @property
    def ranks(self) -> tuple[RankPlan, ...]:
        return tuple(node.rank for node in self.nodes)

    @property
    def removals(self) -> tuple[tuple[Command, Command], ...]:
        """Each node's listing of its serve containers and their removal, head first."""
        return tuple((node.serve_containers, node.remove_containers) for node in self.nodes)

    def filled(self, model_pin: str | None = None, drafter_pin: str | None = None,
               image_id: str | None = None) -> "Plan":
        """The plan with the facts given filled into their holes."""
        words = {hole: value for hole, value in ((MODEL_PIN, model_pin),
                                                  (DRAFTER_PIN, drafter_pin),
                                                  (IMAGE_ID, image_id and
                                                   image_id.removeprefix("sha256:")))
                 if value is not None}
        launch = self.launch
        launch = dataclasses.replace(
            launch, model_pin=_fill(launch.model_pin, words),
            drafter_pin=_fill(launch.drafter_pin, words),
            image_id=image_id if image_id is not None else launch.image_id)
        return dataclasses.replace(_fill(self, words, skip=("launch",)), launch=launch)

    def dry_run(self) -> "Plan":
        """The plan as DRY_RUN prints it: each pin not known as UNPINNED."""
        return self.filled(model_pin=UNPINNED, drafter_pin=UNPINNED)


@dataclass(frozen=True)
class PlatformProbe:
    """One node's platform probe, as scripts/doctor --platform runs it: in the node's rank
    container when RANK_STATUS says it runs, else in a throwaway container of the image."""
    rank_status: Command
    in_rank: Command
    rank_via: str
    in_image: Command
    image_via: str


@dataclass(frozen=True)
class StopPlan:
    """What stop.sh does: every node's serve containers listed and removed, then the GPU
    clocks the record lists reset, each from where the record says it runs."""
    nodes: Nodes
    serve_containers: Command
    remove_containers: Command
    runs_dir: str  # RUNS_DIR, where the record is
    clock_record: Path
    clock_resets: tuple[ClockReset, ...]
    record_problem: str = ""  # why the record could not be read ("" when it could)

    @property
    def removals(self) -> tuple[tuple[Command, Command], ...]:
        """Each node's listing of its serve containers and their removal, head first."""
        return ((self.serve_containers, self.remove_containers),) * len(self.nodes.addresses)


def _fill(value, words: Mapping[str, str], skip: tuple[str, ...] = ()):
    """VALUE with every hole of WORDS filled, through the plan's frozen types."""
    if isinstance(value, str):
        for hole, text in words.items():
            value = value.replace(hole, text)
        return value
    if isinstance(value, tuple):
        return tuple(_fill(item, words) for item in value)
    if isinstance(value, Mapping):
        return MappingProxyType({_fill(key, words): _fill(item, words)
                                 for key, item in value.items()})
    if dataclasses.is_dataclass(value) and not isinstance(value, (type, Launch, Nodes)):
        return dataclasses.replace(value, **{
            item.name: _fill(getattr(value, item.name), words)
            for item in dataclasses.fields(value) if item.init and item.name not in skip})
    return value

