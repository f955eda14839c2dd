"""DRY_RUN=1: the plan (launcher/plan/data.py) printed as the run's steps, in run order: each
a comment and the plan's commands it runs (the running check, the images, the pins and the
drafter, the ranks, the memory guard, the readiness wait), one command a line (a worker's as
the ssh line that runs it). The steps that run only under a condition (building, streaming,
resolving a pin) follow a comment saying when. Every command is read from the plan, the one
the run carries out (serve.py); none is made here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.plan import apikey, image_base, memory_phases
from launcher.plan.data import SERVE_LABEL, Plan, StopPlan
from launcher.plan.nodes import Nodes
from launcher.plan.words import quote
from recipekit import baselock, sm121_packages
from recipekit.text_integrity import FIELD_MAX_TOKENS


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

    def on(self, index: int, argv, stdin: str = "") -> "Step":
        self.commands.append(OnNode(index, tuple(argv), stdin))
        return self


def running_check(the_plan: Plan) -> Step:
    step = Step(f"refuse if a {SERVE_LABEL} container is running on any node")
    for node in the_plan.nodes:
        step.on(node.index, node.running)
    return step


def stop_steps(removals, comment: str | None) -> list[Step]:
    """What stop.sh (and a run, before it starts) removes on every node (REMOVALS: each
    node's listing and removal, head first)."""
    step = Step(comment)
    for index, (listing, removal) in enumerate(removals):
        step.on(index, listing).on(index, removal)
    return [step]


def gpu_count(the_plan: Plan) -> list[Step]:
    """Only with more than one rank a node: every node's GPUs counted (launcher/plan/gpus.py)."""
    if not the_plan.head.count_gpus:
        return []
    launch = the_plan.launch
    step = Step(f"every node: count its GPUs; TP={launch['TP']} on {len(the_plan.nodes)} nodes "
                f"runs {the_plan.ranks_per_node} ranks a node: refuse if one has fewer GPUs")
    for node in the_plan.nodes:
        step.on(node.index, node.count_gpus)
    return [step]


def extra_args_parse(the_plan: Plan) -> list[Step]:
    """Only with EXTRA_ARGS: its words parsed by the image's vLLM parser
    (launcher/plan/extra_args.py)."""
    if not the_plan.extra_args_shown:
        return []
    step = Step("EXTRA_ARGS parsed by the image's own vLLM parser on the head, before any rank "
                "starts (refused if it rejects a flag; a parser that cannot be set up is a note)")
    return [step.on(0, the_plan.extra_args_shown)]


def prepare_nodes(the_plan: Plan) -> Step:
    token = the_plan.launch["HF_TOKEN_FILE"]
    step = Step("every node: the cache directory" + (" and a readable token file" if token else ""))
    for node in the_plan.nodes:
        step.on(node.index, node.make_hf_cache)
        if node.read_token:
            step.on(node.index, node.read_token)
    return step


def boot_memory(the_plan: Plan) -> list[Step]:
    if not the_plan.head.memory_facts:
        return []
    launch = the_plan.launch
    force = (" (FORCE_UNSAFE_BOOT_MEMORY=1: boot anyway)" if launch["FORCE_UNSAFE_BOOT_MEMORY"] == "1"
             else "")
    step = Step("every node: report vm.swappiness, MemAvailable and other GPU containers; "
                f"refuse the boot under MEM_BOOT_FLOOR_GIB={launch['MEM_BOOT_FLOOR_GIB']} GiB{force}")
    for node in the_plan.nodes:
        step.on(node.index, node.memory_facts)
    return [step]


def images(the_plan: Plan) -> list[Step]:
    launch = the_plan.launch
    image, base, lock = launch["IMAGE"], launch["BASE_IMAGE"], the_plan.base_lock
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
             .on(0, the_plan.head.image_id),
             Step(f"base: refused when {lock} records another image ID for {base} than its tag "
                  f"names here{strict}").on(0, the_plan.base_image_id),
             build, image_labels(the_plan)]
    for node in the_plan.nodes[1:]:
        steps.append(Step(f"{node.address}: {image} with the head's image ID")
                     .on(node.index, node.image_id))
        stream = node.stream
        steps.append(Step(f"only when {image} is missing on {node.address}:", [Pipeline((
            OnNode(0, stream.save), OnNode(0, stream.meter), OnNode(node.index, stream.load)))]))
    return steps


def image_labels(the_plan: Plan) -> Step:
    """The image's labels read on the head (launcher/plan/image_base.py), once it is there."""
    launch = the_plan.launch
    retired = image_base.retired_asked(launch.checked.words["EXTRA_ENV"])
    refused = "".join(f"; EXTRA_ENV's {word} refused on a base of vLLM {entry.since} or later"
                      for word, entry in retired)
    if launch["MOE_BACKEND"] == image_base.B12X and launch["FORCE_UNSAFE_MOE"] != "1":
        refused += (f"; MOE_BACKEND=b12x refused unless its {image_base.PACKAGES_LABEL} lists "
                    f"b12x (layer v8 installs it on bases of vLLM {sm121_packages.b12x_bases()})")
    return Step(f"labels of {launch['IMAGE']} on the head: its base's vLLM release "
                f"({image_base.BASE_VLLM_LABEL}) and the layers that base provides "
                f"({image_base.PROVIDED_LABEL}), for the start-up line; an image without them: "
                f"unknown{refused}").on(0, the_plan.image_labels)


def jit_cache(the_plan: Plan) -> list[Step]:
    if not the_plan.head.make_jit_cache:
        return []
    step = Step("every node: the JIT cache directory of this image (JIT_CACHE/<image ID>, kept "
                "by stop.sh)")
    for node in the_plan.nodes:
        step.on(node.index, node.make_jit_cache)
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
    if launch["MODEL"] in the_plan.resolve:
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
    if drafter.repo_id in the_plan.resolve:
        steps.append(Step(f"only once: resolve {drafter.repo_id} to a commit on the head and "
                          f"record it in {pins_file}")
                     .on(0, the_plan.resolve[drafter.repo_id]))
    step = Step(f"drafter: fetch it at its pin and derive {launch.draft_dir} on every node")
    for node in the_plan.nodes:
        if node.fetch_drafter:
            step.on(node.index, node.fetch_drafter)
        step.on(node.index, node.prepare_drafter)
    return [*steps, step]


PROBE_PHRASE = "its script on stdin, run by the image's python3 and torch"


def host_levers_steps(the_plan: Plan) -> list[Step]:
    """Only with GPU_CLOCK_MHZ or COMPACT_MEMORY=1: every node's clock lock, then its
    compaction between two platform probes (launcher/apply/host_levers.py)."""
    launch, steps = the_plan.launch, []
    if the_plan.head.lock_clocks:
        step = Step(f"every node: lock the GPU clocks at {the_plan.clock_range} "
                    f"MHz (GPU_CLOCK_MHZ) in a privileged container of {launch['IMAGE']}, each "
                    f"node recorded in {the_plan.clock_record} first; ./stop.sh, or a start "
                    "that fails, resets every node recorded there")
        for node in the_plan.nodes:
            step.on(node.index, node.lock_clocks)
        steps.append(step)
    if the_plan.head.compact_memory:
        step = Step(f"every node: the platform probe ({PROBE_PHRASE}), memory "
                    "compaction (COMPACT_MEMORY=1: a privileged container writes 1 to "
                    "/proc/sys/vm/compact_memory), the probe again; the read bandwidth and the "
                    "free memory in 2 MiB blocks printed before and after")
        probe = str(the_plan.probe_script)
        for node in the_plan.nodes:
            step.on(node.index, node.probe, probe).on(node.index, node.compact_memory)
            step.on(node.index, node.probe, probe)
        steps.append(step)
    return steps


def clock_reset_steps(stop: StopPlan) -> list[Step]:
    """What stop.sh resets: the GPU clocks of every node the record lists (none: no step)."""
    if not stop.clock_resets:
        return []
    step = Step(f"reset the GPU clocks run.sh locked, on every node {stop.clock_record} lists "
                "(each leaves the record once reset)")
    for reset in stop.clock_resets:
        step.commands.append(OnNode(-1, reset.argv))
    return [step]


def memory_guard(the_plan: Plan) -> list[Step]:
    if not the_plan.head.memory_sampler:
        return []
    launch = the_plan.launch
    floors = ", ".join(f"{phase} {launch[knob]}" for phase, knob in
                       zip(memory_phases.PHASES, memory_phases.FLOOR_KNOBS))
    step = Step(f"while waiting, on every node: MemAvailable every "
                f"{memory_phases.interval(launch['MEM_SAMPLES_PER_SECOND'])} s and the rank "
                f"log's phase markers; under the phase's floor ({floors} GiB) "
                f"every rank is killed; samples to {launch['RUNS_DIR']}/<UTC time>/memory.csv")
    for node in the_plan.nodes:
        step.on(node.index, node.memory_sampler)
    return [step]


def ranks(the_plan: Plan) -> list[Step]:
    launch = the_plan.launch
    leftovers = stop_steps(the_plan.removals, "remove the exited serve containers an earlier "
                                              "run left (kept for their logs until nothing can "
                                              "refuse)")
    key = ([Step(apikey.dry_run_comment(launch.checked))] if apikey.keyed(launch.checked)
           else [])
    start = Step("start one rank per node, head first")
    for node in the_plan.nodes:
        start.on(node.index, node.rank.docker_run)
    if launch["READY_CHECK"] == "health":
        wait = Step(f"wait: poll /health every {launch['POLL_SECONDS']} s (up to "
                    f"{launch['READY_TIMEOUT']} s) until it answers 200 twice in a row, while "
                    "every rank is running; a dead rank stops all")
    else:
        wait = Step(f"wait: poll the API every {launch['POLL_SECONDS']} s (up to "
                    f"{launch['READY_TIMEOUT']} s) while every rank is running; a dead rank stops all")
    if "--config" in the_plan.ready_probe:
        wait.comment += f"; curl reads the Authorization header on stdin, from {launch['API_KEY_FILE']}"
    wait.on(0, the_plan.ready_probe)
    for node in the_plan.nodes:
        wait.on(node.index, node.rank_status)
    return [*leftovers, *key, start, *memory_guard(the_plan), wait, *self_check(the_plan)]


def self_check(the_plan: Plan) -> list[Step]:
    if not the_plan.self_check:
        return []
    return [Step(f"once ready, on the head: one Korean answer to the field's prompt "
                 f"({FIELD_MAX_TOKENS} tokens, greedy), its U+FFFD, lone surrogate, control "
                 "character and invalid token-byte counts in one line; a fault warns, naming "
                 "the likely cause, and the ranks keep running (SELF_CHECK=0: no check)")
            .on(0, the_plan.self_check)]


def run_steps(the_plan: Plan, scanned: str | None = None) -> list[Step]:
    """Every step of a run, in order; the first is the start-up line. Each pin not known is
    shown as UNPINNED (Plan.dry_run); SCANNED: the local MODEL's scan summary as DRY_RUN found
    it on this host."""
    the_plan = the_plan.dry_run()
    return [Step("glm53: " + the_plan.startup.dry_run), running_check(the_plan),
            *gpu_count(the_plan), prepare_nodes(the_plan), *boot_memory(the_plan),
            *images(the_plan), *extra_args_parse(the_plan), *jit_cache(the_plan),
            *checkpoint_scan(the_plan, scanned), *pins_and_drafter(the_plan),
            *host_levers_steps(the_plan), *ranks(the_plan)]


def stop_run_steps(stop: StopPlan) -> list[Step]:
    """Every step of stop.sh, in order."""
    return [*stop_steps(stop.removals, "remove the serve containers listed on each node"),
            *clock_reset_steps(stop)]


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

