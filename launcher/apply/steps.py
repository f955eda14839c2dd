"""A run's steps, in run order: each a comment and the commands it runs (the running check,
the images, the pins and the drafter, the ranks, the memory guard, the readiness wait), and
their rendering one command a line (a worker's as the ssh line that runs it), which is what
DRY_RUN=1 prints. The steps that run only under a condition (building, streaming,
resolving a pin) follow a comment saying when.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field

from launcher import apikey
from launcher.plan import extra_args, gpus, image_base, plan, preflight
from launcher.apply import host_levers, memguard, node_platform
from recipekit import baselock, sm121_packages
from recipekit.text_integrity import FIELD_MAX_TOKENS
from launcher.plan.plan import UNPINNED, Launch, Plan
from launcher.apply.remote import Nodes
from launcher.plan.words import quote


@dataclass(frozen=True)
class OnNode:
    """ARGV run on node INDEX (the head: 0); INDEX -1: ARGV reaches its node itself (a node
    a record names by its address)."""
    index: int
    argv: tuple[str, ...]
    stdin: str = ""  # a file the command reads on stdin (shown as `< FILE`)


@dataclass(frozen=True)
class Pipeline:
    """Commands joined by pipes, each on its node."""
    stages: tuple[OnNode, ...]


@dataclass
class Step:
    comment: str
    commands: list = field(default_factory=list)

    def on(self, index: int, argv: list[str], stdin: str = "") -> "Step":
        self.commands.append(OnNode(index, tuple(argv), stdin))
        return self


def _each_node(launch: Launch):
    return range(len(launch.nodes.addresses))


def running_check(launch: Launch) -> Step:
    step = Step(f"refuse if a {plan.SERVE_LABEL} container is running on any node")
    for index in _each_node(launch):
        step.on(index, plan.running_ranks_argv())
    return step


def stop_steps(nodes: Nodes, comment: str | None) -> list[Step]:
    """What stop.sh (and a run, before it starts) removes on every node."""
    step = Step(comment)
    for index in range(len(nodes.addresses)):
        step.on(index, plan.serve_containers_argv())
        step.on(index, ["docker", "rm", "--force", "<listed-ids>"])
    return [step]


def gpu_count(launch: Launch) -> list[Step]:
    """Only with more than one rank a node: every node's GPUs counted (launcher/gpus.py)."""
    node_count = len(launch.nodes.addresses)
    wanted = gpus.ranks_per_node(launch["TP"], node_count)
    if wanted <= 1:
        return []
    step = Step(f"every node: count its GPUs; TP={launch['TP']} on {node_count} nodes runs "
                f"{wanted} ranks a node: refuse if one has fewer GPUs")
    for index in _each_node(launch):
        step.on(index, gpus.GPU_LIST)
    return [step]


def extra_args_parse(launch: Launch) -> list[Step]:
    """Only with EXTRA_ARGS: its words parsed by the image's vLLM parser (launcher/extra_args.py)."""
    words = launch.checked.words["EXTRA_ARGS"]
    if not words:
        return []
    step = Step("EXTRA_ARGS parsed by the image's own vLLM parser on the head, before any rank "
                "starts (refused if it rejects a flag; a parser that cannot be set up is a note)")
    return [step.on(0, extra_args.shown_argv(launch["IMAGE"], words))]


def prepare_nodes(launch: Launch) -> Step:
    token = launch["HF_TOKEN_FILE"]
    step = Step("every node: the cache directory" + (" and a readable token file" if token else ""))
    for index in _each_node(launch):
        step.on(index, ["mkdir", "-p", launch["HF_CACHE"]])
        if token:
            step.on(index, ["test", "-r", token])
    return step


def boot_memory(launch: Launch) -> list[Step]:
    if launch["MEM_PREFLIGHT"] != "1":
        return []
    force = (" (FORCE_UNSAFE_BOOT_MEMORY=1: boot anyway)" if launch["FORCE_UNSAFE_BOOT_MEMORY"] == "1"
             else "")
    step = Step("every node: report vm.swappiness, MemAvailable and other GPU containers; "
                f"refuse the boot under MEM_BOOT_FLOOR_GIB={launch['MEM_BOOT_FLOOR_GIB']} GiB{force}")
    for index in _each_node(launch):
        step.on(index, preflight.argv())
    return [step]


def images(the_plan: Plan, pv: bool) -> list[Step]:
    launch = the_plan.launch
    image, base, lock = launch["IMAGE"], launch["BASE_IMAGE"], plan.LOCK_FILE
    vendor = launch.recipe.knobs["BASE_IMAGE"].default
    strict = (f"; with {image} missing, refused too while {lock.name} holds none for it "
              "(BASE_LOCK=strict)" if launch["BASE_LOCK"] == baselock.STRICT and base == vendor
              else "")
    first_use = (f"; BASE_LOCK=first-use: it records its ID in {lock.name} on first use"
                 if launch["BASE_LOCK"] == baselock.FIRST_USE and base == vendor else "")
    chain = the_plan.chain_image
    if image == chain:
        build = (Step(f"only when {image} is missing on the head (scripts/build.sh pulls {base} "
                      f"through the docker SDK when it is missing too{first_use}; a refusal of "
                      "scripts/build.sh is the run's, in its one line):").on(0, the_plan.build))
    else:
        build = Step(f"only when {image} is missing on the head: refused (IMAGE), as "
                     f"scripts/build.sh builds {chain} only")
    made = f"built by scripts/build.sh from {base} when missing" if image == chain else "no build"
    steps = [Step(f"image: {image} must exist on the head ({made}) and have the head's ID on "
                  "every worker (streamed when missing; refused when a worker's differs)")
             .on(0, plan.image_id_argv(image)),
             Step(f"base: refused when {lock} records another image ID for {base} than its tag "
                  f"names here{strict}").on(0, plan.image_id_argv(base)),
             build, image_labels(launch)]
    for index in range(1, len(launch.nodes.addresses)):
        node = launch.nodes.addresses[index]
        steps.append(Step(f"{node}: {image} with the head's image ID")
                     .on(index, plan.image_id_argv(image)))
        meter = plan.meter_argv(f"{image} to {node}", "<image-bytes>", pv,
                                the_plan.root / "launcher")
        steps.append(Step(f"only when {image} is missing on {node}:", [Pipeline((
            OnNode(0, ("docker", "save", image)), OnNode(0, tuple(meter)),
            OnNode(index, ("docker", "load"))))]))
    return steps


def image_labels(launch: Launch) -> Step:
    """The image's labels read on the head (launcher/image_base.py), once it is there."""
    retired = image_base.retired_asked(launch.checked.words["EXTRA_ENV"])
    refused = "".join(f"; EXTRA_ENV's {word} refused on a base of vLLM {entry.since} or later"
                      for word, entry in retired)
    if launch["MOE_BACKEND"] == image_base.B12X and launch["FORCE_UNSAFE_MOE"] != "1":
        refused += (f"; MOE_BACKEND=b12x refused unless its {image_base.PACKAGES_LABEL} lists "
                    f"b12x (layer v8 installs it on bases of vLLM {sm121_packages.b12x_bases()})")
    return Step(f"labels of {launch['IMAGE']} on the head: its base's vLLM release "
                f"({image_base.BASE_VLLM_LABEL}) and the layers that base provides "
                f"({image_base.PROVIDED_LABEL}), for the start-up line; an image without them: "
                f"unknown{refused}").on(0, image_base.labels_argv(launch["IMAGE"]))


def jit_cache(launch: Launch) -> list[Step]:
    if not launch["JIT_CACHE"]:
        return []
    step = Step("every node: the JIT cache directory of this image (JIT_CACHE/<image ID>, kept "
                "by stop.sh)")
    for index in _each_node(launch):
        step.on(index, ["mkdir", "-p", launch.jit_dir])
    return [step]


def checkpoint_scan(the_plan: Plan, scanned: str | None) -> list[Step]:
    """SCANNED: what the same scan found on this host (DRY_RUN runs it before printing)."""
    if not the_plan.scan_checkpoint:
        return []
    launch = the_plan.launch
    then = {"refuse": "refused", "warn": "said loudly (CHECKPOINT_SCAN=warn), the run goes on"}
    found = f"; on this host it found: {scanned}" if scanned else ""
    step = Step(f"checkpoint: scan {launch['MODEL']} in {launch['IMAGE']} on the head (config, "
                "safetensors headers and the global scales of every group vLLM fuses; no "
                f"weights loaded) and print its summary; fused-group scales {launch['IMAGE']} "
                "does not correct, a checkpoint the scan refuses, or a directory it cannot read: "
                f"{then[launch['CHECKPOINT_SCAN']]}{found}")
    return [step.on(0, the_plan.scan_checkpoint)]


def pins_and_drafter(the_plan: Plan) -> list[Step]:
    launch, steps = the_plan.launch, []
    pins_file = launch["PINS_FILE"]
    if launch.model_pin == UNPINNED:
        known = launch.recipe.checkpoints.get(launch["MODEL"])
        prefix = known.revision_prefix if known else ""
        check = (f"; refused unless it starts with {prefix}, the latest revision recipe.toml "
                 "knows (MODEL_REVISION serves another)" if prefix else "")
        steps.append(Step(f"only once: resolve {launch['MODEL']} to a commit on the head and "
                          f"record it in {pins_file}{check}")
                     .on(0, the_plan.resolve[launch["MODEL"]]))
    if not launch.dflash2:
        return steps
    drafter = launch.checked.drafter
    if launch.drafter_pin == UNPINNED:
        steps.append(Step(f"only once: resolve {drafter.repo_id} to a commit on the head and "
                          f"record it in {pins_file}")
                     .on(0, the_plan.resolve[drafter.repo_id]))
    step = Step(f"drafter: fetch it at its pin and derive {launch.draft_dir} on every node")
    for index in _each_node(launch):
        if not drafter.local:
            step.on(index, the_plan.fetch_snapshot)
        step.on(index, the_plan.prepare_drafter)
    return [*steps, step]


PROBE_PHRASE = "its script on stdin, run by the image's python3 and torch"


def host_levers_steps(the_plan: Plan) -> list[Step]:
    """Only with GPU_CLOCK_MHZ or COMPACT_MEMORY=1: every node's clock lock, then its
    compaction between two platform probes (launcher/host_levers.py)."""
    launch, steps = the_plan.launch, []
    record = host_levers.record_path(launch["RUNS_DIR"])
    if the_plan.lock_clocks:
        step = Step(f"every node: lock the GPU clocks at {plan.clock_range(launch['GPU_CLOCK_MHZ'])} "
                    f"MHz (GPU_CLOCK_MHZ) in a privileged container of {launch['IMAGE']}, each "
                    f"node recorded in {record} first; ./stop.sh, or a start that fails, resets "
                    "every node recorded there")
        for index in _each_node(launch):
            step.on(index, the_plan.lock_clocks)
        steps.append(step)
    if the_plan.compact_memory:
        step = Step(f"every node: the platform probe ({PROBE_PHRASE}), memory "
                    "compaction (COMPACT_MEMORY=1: a privileged container writes 1 to "
                    "/proc/sys/vm/compact_memory), the probe again; the read bandwidth and the "
                    "free memory in 2 MiB blocks printed before and after")
        probe = str(node_platform.PROBE)
        for index in _each_node(launch):
            step.on(index, the_plan.probe, probe).on(index, the_plan.compact_memory)
            step.on(index, the_plan.probe, probe)
        steps.append(step)
    return steps


def clock_reset_steps(nodes: Nodes, runs_dir: str) -> list[Step]:
    """What stop.sh resets: the GPU clocks of every node the record lists (none: no step)."""
    recorded = host_levers.read_record(runs_dir)
    if not recorded:
        return []
    step = Step(f"reset the GPU clocks run.sh locked, on every node "
                f"{host_levers.record_path(runs_dir)} lists (each leaves the record once reset)")
    for address, entry in recorded.items():
        step.commands.append(OnNode(-1, tuple(host_levers.entry_argv(
            list(nodes.ssh), address, entry, host_levers.reset_argv(entry)))))
    return [step]


def memory_guard(launch: Launch) -> list[Step]:
    if launch["MEM_GUARD"] != "1":
        return []
    floors = ", ".join(f"{phase} {launch[knob]}" for phase, knob in
                       zip(memguard.PHASES, memguard.FLOOR_KNOBS))
    step = Step(f"while waiting, on every node: MemAvailable every "
                f"{memguard.interval(launch['MEM_SAMPLES_PER_SECOND'])} s and the rank log's "
                f"phase markers; under the phase's floor ({floors} GiB) "
                f"every rank is killed; samples to {launch['RUNS_DIR']}/<UTC time>/memory.csv")
    for index in _each_node(launch):
        step.on(index, memguard.sampler_argv(plan.rank_container(index),
                                             launch["MEM_SAMPLES_PER_SECOND"]))
    return [step]


def ranks(the_plan: Plan) -> list[Step]:
    launch = the_plan.launch
    leftovers = stop_steps(launch.nodes, "remove the exited serve containers an earlier run left "
                                         "(kept for their logs until nothing can refuse)")
    key = ([Step(apikey.dry_run_comment(launch.checked))] if apikey.keyed(launch.checked)
           else [])
    start = Step("start one rank per node, head first")
    for rank in the_plan.ranks:
        start.on(rank.rank, rank.docker_argv())
    if launch["READY_CHECK"] == "health":
        wait = Step(f"wait: poll /health every {launch['POLL_SECONDS']} s (up to "
                    f"{launch['READY_TIMEOUT']} s) until it answers 200 twice in a row, while "
                    "every rank is running; a dead rank stops all")
    else:
        wait = Step(f"wait: poll the API every {launch['POLL_SECONDS']} s (up to "
                    f"{launch['READY_TIMEOUT']} s) while every rank is running; a dead rank stops all")
    probe = plan.api_probe_argv(launch["PORT"], launch["READY_CHECK"], apikey.keyed(launch.checked))
    if "--config" in probe:
        wait.comment += f"; curl reads the Authorization header on stdin, from {launch['API_KEY_FILE']}"
    wait.on(0, probe)
    for index in _each_node(launch):
        wait.on(index, plan.container_status_argv(index))
    return [*leftovers, *key, start, *memory_guard(launch), wait, *self_check(the_plan)]


def self_check(the_plan: Plan) -> list[Step]:
    if the_plan.launch["SELF_CHECK"] != "1":
        return []
    return [Step(f"once ready, on the head: one Korean answer to the field's prompt "
                 f"({FIELD_MAX_TOKENS} tokens, greedy), its U+FFFD, lone surrogate, control "
                 "character and invalid token-byte counts in one line; a fault warns, naming "
                 "the likely cause, and the ranks keep running (SELF_CHECK=0: no check)")
            .on(0, plan.self_check_argv(
                the_plan.root, the_plan.launch["PORT"],
                the_plan.launch["API_KEY_FILE"] if apikey.keyed(the_plan.launch.checked) else None))]


def run_steps(the_plan: Plan, scanned: str | None = None) -> list[Step]:
    """Every step of a run, in order; the first is the start-up line. SCANNED: the local
    MODEL's scan summary as DRY_RUN found it on this host."""
    launch, pv = the_plan.launch, shutil.which("pv") is not None
    return [Step("glm53: " + the_plan.startup_line), running_check(launch), *gpu_count(launch),
            prepare_nodes(launch), *boot_memory(launch), *images(the_plan, pv),
            *extra_args_parse(launch), *jit_cache(launch), *checkpoint_scan(the_plan, scanned),
            *pins_and_drafter(the_plan), *host_levers_steps(the_plan), *ranks(the_plan)]


def render(nodes: Nodes, steps: list[Step]) -> str:
    lines = []
    for step in steps:
        if step.comment is not None:
            lines.append(f"# {step.comment}")
        for command in step.commands:
            if isinstance(command, Pipeline):
                lines.append(" | ".join(quote(nodes.argv(stage.index, list(stage.argv)))
                                        for stage in command.stages))
            else:
                argv = list(command.argv) if command.index < 0 else nodes.argv(
                    command.index, list(command.argv))  # -1: the argv reaches its node itself
                stdin = f" < {quote([command.stdin])}" if command.stdin else ""
                lines.append(quote(argv) + stdin)
    return "".join(line + "\n" for line in lines)
