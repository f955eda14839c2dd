"""A run as data, built once from its checked settings before anything runs
(launcher/apply/ carries it out; DRY_RUN prints it): the pins, every node's commands in run
order (the checks, the image, the drafter, the host levers, its rank's `docker run` with its
mounts, environment and `vllm serve` argv, the memory guard, the readiness wait), the head's
own (the build, the scans, the pin look-ups, the self-check), and stop.sh's. The types are
launcher/plan/data.py's, the tool commands' words launcher/plan/commands.py's.

Order follows the seed's command; recipe.toml says which knob drives which flag and
variable. A knob this module does not build (not in BUILT_HERE) is passed as is: its one
flag with its value after the chat flags, its variables NAME=VALUE after the link's, on
every rank (a flag-typed knob: the flag alone, or NAME=1, when 1; nothing when 0).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import MappingProxyType

from launcher.plan import apikey, clock_record, gpus, node_platform, pins
from launcher.plan.checks import Checked, image_switches
from launcher.plan.commands import (
    GPU_LIST,
    READY_PATHS,
    api_probe_argv,
    build_argv,
    clock_range,
    compact_memory_argv,
    container_status_argv,
    extra_args_argv,
    extra_args_shown_argv,
    fetch_snapshot_argv,
    host_scan_argv,
    hub_options,
    image_id_argv,
    image_size_argv,
    kill_argv,
    labels_argv,
    load_argv,
    local_dir_options,
    lock_clocks_argv,
    log_argv,
    log_tail_argv,
    make_dir_argv,
    memory_facts_argv,
    memory_sampler_argv,
    meter_argv,
    prepare_drafter_argv,
    probe_in_image_argv,
    readable_argv,
    remove_containers_argv,
    reset_clocks_argv,
    resolve_revision_argv,
    running_ranks_argv,
    save_argv,
    scan_checkpoint_argv,
    self_check_argv,
    serve_containers_argv,
)
from launcher.plan.data import (
    API_KEY_ENV_FILE,
    DRAFTER_PIN,
    IMAGE_BYTES,
    MODEL_PIN,
    NO_COMMAND,
    SERVE_LABEL,
    ClockReset,
    Launch,
    NodePlan,
    Plan,
    RankPlan,
    StartupLine,
    StopPlan,
    Stream,
    rank_container,
)
from launcher.plan.nodes import Nodes
from launcher.plan.settings import Failed, profile_default
from launcher.plan.words import quote
from recipekit import baselock, recipe

# The base images the host trusted (recipekit/baselock.py), beside the recipe run.sh reads.
LOCK_FILE = baselock.lock_path(recipe.RECIPE_PATH)
# Where a rank sees its node's JIT cache directory (JIT_CACHE/<image id> on the host).
CONTAINER_JIT_DIR = "/var/cache/glm53-jit"
# Each engine's JIT cache variable (JIT_CACHE's `env` in recipe.toml) and its directory
# under CONTAINER_JIT_DIR (names checked in vLLM 0.30.0, flashinfer-python 0.6.18, triton
# 3.7, tilelang 0.1.12, torch 2.13; CUDA_CACHE_PATH is the CUDA driver's PTX JIT cache).
JIT_SUBDIRS = {"VLLM_CACHE_ROOT": "vllm", "FLASHINFER_WORKSPACE_BASE": "flashinfer",
               "DG_JIT_CACHE_DIR": "deep_gemm", "TRITON_CACHE_DIR": "triton",
               "TILELANG_CACHE_DIR": "tilelang", "TORCHINDUCTOR_CACHE_DIR": "inductor",
               "CUDA_CACHE_PATH": "cuda"}
# The knobs whose flags and variables this module writes itself, in the seed's order.
BUILT_HERE = frozenset({
    "SPEC", "DRAFTER", "NUM_SPECULATIVE_TOKENS", "MTP_NUM_SPECULATIVE_TOKENS", "MAX_NUM_SEQS",
    "KV_CACHE_DTYPE", "KV_CACHE_MEMORY_BYTES", "MAX_MODEL_LEN", "BLOCK_SIZE",
    "GPU_MEMORY_UTILIZATION", "MM_PROCESSOR_CACHE_GB", "ENFORCE_EAGER", "MOE_BACKEND",
    "LINEAR_BACKEND", "TOOL_CALL_PARSER", "REASONING_PARSER", "THINKING", "SERVED_MODEL_NAME",
    "MAX_NEW_TOKENS", "GENERATION_CONFIG", "MODEL_REVISION", "NODES", "TP", "PORT",
    "MASTER_PORT", "IFACE", "HCA", "NCCL_DEBUG_LEVEL", "CUDA_ARCH_LIST", "ENGINE_READY_TIMEOUT",
    "HF_CACHE", "HF_TOKEN_FILE", "JIT_CACHE",
})


def nodes_of(checked: Checked) -> Nodes:
    return Nodes(tuple(checked.nodes), tuple(checked.words["SSH"]))


def settle(checked: Checked, nodes: Nodes) -> Launch:
    """The launch with its model and drafter pins: the knob's, the known pin or PINS_FILE's,
    else a hole the run fills once it has resolved it (DRY_RUN prints the hole)."""
    model_pin, drafter_pin = "", ""
    model = checked["MODEL"]
    if not model.startswith("/"):
        given = checked["MODEL_REVISION"] or checked.recipe.pins.get(model, ("", ""))[0]
        recorded = "" if given else pins.recorded(checked["PINS_FILE"], model)
        if recorded and model in checked.recipe.checkpoints:
            pins.require_known(model, recorded, checked.recipe.checkpoints[model].revision_prefix,
                               f"{checked['PINS_FILE']} records",
                               "delete that line to resolve it again")
        model_pin = given or recorded or MODEL_PIN
    drafter = checked.drafter
    if checked["SPEC"] == "dflash2":
        if drafter.local:
            drafter_pin = "local"
        else:
            drafter_pin = (pins.known(checked["PINS_FILE"], drafter.repo_id,
                                      checked["DRAFTER_REVISION"], drafter.catalog_revision)
                           or DRAFTER_PIN)
    return Launch(checked, nodes, model_pin, drafter_pin)


def build(checked: Checked, nodes: Nodes, root: Path) -> Plan:
    """The run's plan: every command of every node, before any of them runs."""
    launch = settle(checked, nodes)
    words = checked.words
    image = launch["IMAGE"]
    holes = [(launch.model_pin, MODEL_PIN, launch["MODEL"]),
             (launch.drafter_pin, DRAFTER_PIN, checked.drafter.repo_id)]
    scans = scans_checkpoint(launch)
    mhz = launch["GPU_CLOCK_MHZ"]
    keyed = apikey.keyed(checked)
    return Plan(
        launch=launch, root=root,
        nodes=tuple(node_plan(launch, root, index) for index in range(len(nodes.addresses))),
        startup=startup_line(launch),
        chain_image=chain_image(launch),
        base_lock=LOCK_FILE,
        base_image_id=tuple(image_id_argv(launch["BASE_IMAGE"])),
        build=tuple(build_argv(root, launch["BASE_IMAGE"], chain_layer(launch),
                               launch["BASE_LOCK"])),
        image_labels=tuple(labels_argv(image)),
        extra_args_parse=tuple(extra_args_argv(image, words["EXTRA_ARGS"]))
        if words["EXTRA_ARGS"] else NO_COMMAND,
        extra_args_shown=tuple(extra_args_shown_argv(image, words["EXTRA_ARGS"]))
        if words["EXTRA_ARGS"] else NO_COMMAND,
        scan_checkpoint=tuple(scan_checkpoint_argv(launch)) if scans else NO_COMMAND,
        host_scan=tuple(host_scan_argv(root, launch["MODEL"])) if scans else NO_COMMAND,
        resolve=MappingProxyType({repo: tuple(resolve_revision_argv(launch, repo))
                                  for pin, hole, repo in holes if pin == hole}),
        ranks_per_node=gpus.ranks_per_node(launch["TP"], len(nodes.addresses)),
        clock_range=clock_range(mhz) if mhz else "",
        clock_record=clock_record.record_path(launch["RUNS_DIR"]),
        clock_resets=clock_resets(launch) if mhz else (),
        probe_script=node_platform.PROBE,
        ready_probe=tuple(api_probe_argv(launch["PORT"], launch["READY_CHECK"], keyed)),
        ready_path=READY_PATHS[launch["READY_CHECK"]],
        self_check=tuple(self_check_argv(root, launch["PORT"],
                                         launch["API_KEY_FILE"] if keyed else None))
        if launch["SELF_CHECK"] == "1" else NO_COMMAND)


def node_plan(launch: Launch, root: Path, index: int) -> NodePlan:
    """Every command of node INDEX, in run order."""
    address, image = launch.nodes.addresses[index], launch["IMAGE"]
    docker_args = launch.checked.words["DOCKER_ARGS"]
    mhz, compact = launch["GPU_CLOCK_MHZ"], launch["COMPACT_MEMORY"] == "1"
    token = launch["HF_TOKEN_FILE"]
    hub_drafter = launch.dflash2 and not launch.checked.drafter.local
    stream = None
    if index > 0:
        meter = meter_argv(f"{image} to {address}", IMAGE_BYTES, shutil.which("pv") is not None,
                           root / "launcher")
        stream = Stream(size=tuple(image_size_argv(image)), save=tuple(save_argv(image)),
                        meter=tuple(meter), load=tuple(load_argv()))

    def when(condition, argv) -> tuple[str, ...]:
        return tuple(argv) if condition else NO_COMMAND

    return NodePlan(
        index=index, address=address,
        running=tuple(running_ranks_argv()),
        serve_containers=tuple(serve_containers_argv()),
        remove_containers=tuple(remove_containers_argv()),
        count_gpus=when(gpus.ranks_per_node(launch["TP"], len(launch.nodes.addresses)) > 1,
                        GPU_LIST),
        make_hf_cache=tuple(make_dir_argv(launch["HF_CACHE"])),
        read_token=when(token, readable_argv(token)),
        memory_facts=when(launch["MEM_PREFLIGHT"] == "1", memory_facts_argv()),
        image_id=tuple(image_id_argv(image)),
        stream=stream,
        make_jit_cache=when(launch["JIT_CACHE"], make_dir_argv(launch.jit_dir)),
        fetch_drafter=when(hub_drafter, fetch_snapshot_argv(launch)),
        prepare_drafter=when(launch.dflash2, prepare_drafter_argv(launch)),
        lock_clocks=when(mhz, lock_clocks_argv(image, docker_args, mhz)),
        reset_clocks=when(mhz, reset_clocks_argv(image, docker_args)),
        probe=when(compact, probe_in_image_argv(image, docker_args)),
        compact_memory=when(compact, compact_memory_argv(image)),
        rank=rank_plan(launch, index),
        memory_sampler=when(launch["MEM_GUARD"] == "1", memory_sampler_argv(
            rank_container(index), launch["MEM_SAMPLES_PER_SECOND"])),
        rank_status=tuple(container_status_argv(index)),
        rank_log_tail=tuple(log_tail_argv(index)),
        kill_rank=tuple(kill_argv(index)),
        rank_log=tuple(log_argv(index)))


def scans_checkpoint(launch: Launch) -> bool:
    """A local MODEL is scanned before the ranks start (a Hub one has no snapshot here yet)."""
    return launch.local_model and launch["CHECKPOINT_SCAN"] != "off"


def recorded_resets(nodes: Nodes, runs_dir: str) -> tuple[dict[str, ClockReset], str]:
    """(address -> the reset of every node the GPU clock record lists, each from where the
    record says it runs, in the record's order; why the record cannot be read, or "")."""
    try:
        recorded = clock_record.read_record(runs_dir)
    except Failed as failed:
        return {}, str(failed)
    return {address: ClockReset(address, entry["mhz"], tuple(entry_argv(
        nodes.ssh, address, entry, reset_clocks_argv(entry["image"], entry["docker_args"]))))
        for address, entry in recorded.items()}, ""


def clock_resets(launch: Launch) -> tuple[ClockReset, ...]:
    """What a start that fails after locking resets: every node the record lists, the ones
    this run locks as it locks them (a record that cannot be read now: those alone; the
    lock reads it again and stops there)."""
    nodes, mhz = launch.nodes, clock_range(launch["GPU_CLOCK_MHZ"])
    resets, _ = recorded_resets(nodes, launch["RUNS_DIR"])
    docker_args = launch.checked.words["DOCKER_ARGS"]
    for index, address in enumerate(nodes.addresses):
        resets[address] = ClockReset(address, mhz, tuple(nodes.argv(
            index, reset_clocks_argv(launch["IMAGE"], docker_args))))
    return tuple(resets.values())


def stop_plan(checked: Checked) -> StopPlan:
    """stop.sh's plan: every node's serve containers, and a reset of every node the GPU clock
    record lists (a record that cannot be read is said once the containers are gone)."""
    nodes = nodes_of(checked)
    resets, problem = recorded_resets(nodes, checked["RUNS_DIR"])
    return StopPlan(nodes, tuple(serve_containers_argv()), tuple(remove_containers_argv()),
                    checked["RUNS_DIR"], clock_record.record_path(checked["RUNS_DIR"]),
                    tuple(resets.values()), problem)


def entry_argv(ssh, address: str, entry: dict, argv: list[str]) -> list[str]:
    """ARGV on the node a clock record's ENTRY was recorded for: the head locally, a worker
    through SSH."""
    return list(argv) if entry.get("head") else [*ssh, address, quote(argv)]


# ----------------------------------------------------------------------------- speculation


def speculative_tokens(launch: Launch) -> int:
    """k drafted per step: what the capture sizes and the start-up line are built from."""
    return {"dflash2": int(launch["NUM_SPECULATIVE_TOKENS"]),
            "mtp": int(launch["MTP_NUM_SPECULATIVE_TOKENS"])}.get(launch["SPEC"], 0)


def speculative_method(launch: Launch) -> str:
    """vLLM's speculative_config.method for SPEC (DFlash2 keeps "dflash"); "" for off."""
    return {"dflash2": "dflash", "mtp": "mtp"}.get(launch["SPEC"], "")


def capture_sizes(launch: Launch) -> list[int]:
    """1, 2, 4 and (k + 1) x {1..MAX_NUM_SEQS}, sorted and de-duplicated."""
    k = speculative_tokens(launch)
    sizes = {1, 2, 4} | {(k + 1) * seqs for seqs in range(1, int(launch["MAX_NUM_SEQS"]) + 1)}
    return sorted(sizes)


def speculative_config(launch: Launch) -> str:
    config = {"method": speculative_method(launch)}
    if launch.dflash2:
        config["model"] = launch.draft_dir
    elif launch["SPEC"] != "mtp":
        return ""
    config["num_speculative_tokens"] = speculative_tokens(launch)
    return json.dumps(config, separators=(",", ":"))


# ----------------------------------------------------------------------------- ranks


def _value_flag(launch: Launch, flag: str, name: str) -> list[str]:
    return [flag, launch[name]] if launch[name] else []


def _passed_as_is(launch: Launch):
    """The knobs not built here, in recipe order."""
    return [knob for knob in launch.recipe.knobs.values()
            if knob.name not in BUILT_HERE and (knob.flags or knob.env)]


def serve_argv(launch: Launch, rank: int) -> list[str]:
    """What the image's `vllm` entry point gets on RANK."""
    nodes, fixed = launch.nodes.addresses, launch.recipe.fixed_flags
    argv = ["serve", launch["MODEL"]]
    if not launch.local_model:
        argv += ["--revision", launch.model_pin]
    if rank == 0:
        argv += ["--host", fixed["--host"].value, "--port", launch["PORT"]]
    argv += ["--tensor-parallel-size", launch["TP"], "--max-model-len", launch["MAX_MODEL_LEN"],
             "--kv-cache-dtype", launch["KV_CACHE_DTYPE"],
             "--kv-cache-memory-bytes", launch["KV_CACHE_MEMORY_BYTES"],
             "--gpu-memory-utilization", launch["GPU_MEMORY_UTILIZATION"],
             "--max-num-seqs", launch["MAX_NUM_SEQS"]]
    argv += _value_flag(launch, "--block-size", "BLOCK_SIZE")
    argv += _value_flag(launch, "--moe-backend", "MOE_BACKEND")
    argv += _value_flag(launch, "--linear-backend", "LINEAR_BACKEND")
    spec = speculative_config(launch)
    argv += ["--speculative-config", spec] if spec else []
    if launch["ENFORCE_EAGER"] == "1":
        argv.append("--enforce-eager")
    else:
        sizes = ",".join(map(str, capture_sizes(launch)))
        argv += ["--compilation-config", f'{{"cudagraph_capture_sizes":[{sizes}]}}']
    if launch["TOOL_CALL_PARSER"]:
        argv += ["--tool-call-parser", launch["TOOL_CALL_PARSER"], "--enable-auto-tool-choice"]
    argv += _value_flag(launch, "--reasoning-parser", "REASONING_PARSER")
    thinking = "true" if launch["THINKING"] == "1" else "false"
    argv += ["--default-chat-template-kwargs", f'{{"enable_thinking": {thinking}}}']
    argv += _value_flag(launch, "--served-model-name", "SERVED_MODEL_NAME")
    argv.append("--trust-remote-code")
    argv += _value_flag(launch, "--mm-processor-cache-gb", "MM_PROCESSOR_CACHE_GB")
    if launch.checked.generation_json:
        argv += ["--override-generation-config", launch.checked.generation_json]
    for knob in _passed_as_is(launch):
        if knob.flags and (knob.when != "multi-node" or len(nodes) > 1):
            value = launch[knob.name]
            if knob.type == "flag":
                argv += [knob.flags[0]] if value == "1" else []
            elif value:
                argv += [knob.flags[0], value]
    if len(nodes) > 1:
        argv += ["--nnodes", str(len(nodes)), "--node-rank", str(rank), "--master-addr", nodes[0],
                 "--master-port", launch["MASTER_PORT"],
                 "--distributed-executor-backend", fixed["--distributed-executor-backend"].value]
        if rank > 0:
            argv.append("--headless")
    return argv + launch.checked.words["EXTRA_ARGS"]


def _env(name: str, value: str) -> tuple[str, str]:
    return ("--env", f"{name}={value}")


def _fixed(fixed, name: str) -> tuple[str, str]:
    return _env(name, fixed[name].value)


def rank_options(launch: Launch, rank: int) -> list[tuple[str, str]]:
    """Mounts and environment of RANK's container, in `docker run` order."""
    fixed = launch.recipe.fixed_env
    multi_node = len(launch.nodes.addresses) > 1
    options = hub_options(launch) + local_dir_options(launch)
    options += [_env("TORCH_CUDA_ARCH_LIST", launch["CUDA_ARCH_LIST"]),
                _env("FLASHINFER_CUDA_ARCH_LIST", launch["CUDA_ARCH_LIST"]),
                _fixed(fixed, "FLASHINFER_DISABLE_VERSION_CHECK"),
                _env("VLLM_ENGINE_READY_TIMEOUT_S", launch["ENGINE_READY_TIMEOUT"]),
                _fixed(fixed, "PYTORCH_CUDA_ALLOC_CONF")]
    if launch["JIT_CACHE"]:
        options.append(("--mount", f"type=bind,src={launch.jit_dir},dst={CONTAINER_JIT_DIR}"))
        options += [_env(name, f"{CONTAINER_JIT_DIR}/{subdir}")
                    for name, subdir in JIT_SUBDIRS.items()]
    if multi_node:
        iface, link = launch["IFACE"], launch.nodes.addresses[rank]
        options += [_env("VLLM_HOST_IP", link), _env("NCCL_SOCKET_IFNAME", iface),
                    _env("GLOO_SOCKET_IFNAME", iface), _env("TP_SOCKET_IFNAME", iface),
                    _env("NCCL_IB_HCA", launch["HCA"])]
        options += [_fixed(fixed, name) for name in ("NCCL_NET", "NCCL_IB_DISABLE",
                                                      "NCCL_CROSS_NIC", "NCCL_NVLS_ENABLE",
                                                      "NCCL_CUMEM_ENABLE")]
        options.append(_env("NCCL_DEBUG", launch["NCCL_DEBUG_LEVEL"]))
    for knob in _passed_as_is(launch):
        value = launch[knob.name]
        if knob.type == "flag" and value == "0":
            continue  # off: the variable is not set at all, as an image layer's lever expects
        if knob.only_with and launch[knob.only_with] != "1":
            continue  # a setting of a lever that is off
        if knob.env and value and (knob.when != "multi-node" or multi_node):
            options += [_env(name, value) for name in knob.env]
    placed = {value.split("=", 1)[0] for kind, value in options if kind == "--env"}
    for name, entry in fixed.items():
        if name not in placed and (entry.when != "multi-node" or multi_node):
            options.append(_env(name, entry.value))
    options += [("--env", word) for word in launch.checked.words["EXTRA_ENV"]]
    if rank == 0 and apikey.keyed(launch.checked):
        # VLLM_API_KEY from a 0600 file written just before `docker run`
        # (launcher/apply/api_key_file.py)
        options.append(("--env-file", API_KEY_ENV_FILE))
    return options


def rank_plan(launch: Launch, rank: int) -> RankPlan:
    container = rank_container(rank)
    options = tuple(rank_options(launch, rank))
    serve = tuple(serve_argv(launch, rank))
    docker_run = ["docker", "run", "--detach", "--name", container, "--label", SERVE_LABEL,
                  "--label", f"glm53.rank={rank}", *launch.recipe.docker_options,
                  *launch.checked.words["DOCKER_ARGS"]]
    for kind, value in options:
        docker_run += [kind, value]
    docker_run += ["--entrypoint", "vllm", launch["IMAGE"], *serve]
    return RankPlan(rank=rank, node=launch.nodes.addresses[rank], container=container,
                    options=options, image=launch["IMAGE"], serve=serve,
                    docker_run=tuple(docker_run))


def image_levers(env: dict[str, str]) -> dict[str, str]:
    """The image layers' GLM53_* variables of a rank's environment (what its levers are)."""
    return {name: value for name, value in env.items() if name.startswith("GLM53_")}


def chain_image(launch: Launch) -> str:
    """The image scripts/build.sh builds: IMAGE's default under the run's profile."""
    return profile_default(launch.recipe, launch.checked.values, "IMAGE")


def chain_layer(launch: Launch) -> str:
    """The layer scripts/build.sh builds up to (the chain's tags are <prefix><layer>)."""
    return chain_image(launch).removeprefix(launch.recipe.chain_prefix)


# ----------------------------------------------------------------------------- start-up line


def gib(count: int) -> str:
    """Bytes as GiB with two decimals, truncated (4445787956 -> 4.14)."""
    hundredths = count * 100 // 1073741824
    return f"{hundredths // 100}.{hundredths % 100:02d}"


def weights_phrase(launch: Launch) -> str:
    """The weight-only groups (layer v13) a run asks for; empty when none."""
    parts = []
    if launch["TARGET_WEIGHT_GROUPS_INT8"]:
        parts.append(f"target {launch['TARGET_WEIGHT_FORMAT'] or 'int8'} "
                     f"g{launch['INT_GROUP_SIZE'] or '128'} {launch['TARGET_WEIGHT_GROUPS_INT8']}")
    if launch["DRAFT_WEIGHTS"] == "nvfp4" and launch.dflash2:  # only a DFlash2 drafter swaps
        parts.append("drafter nvfp4")
    return f", weight-only {', '.join(parts)}" if parts else ""


def startup_line(launch: Launch) -> StartupLine:
    """The one start-up line: model, drafter and licence, k, context, graphs, KV pin, image
    (what its base provides natively, as its labels say; the image switches on), nodes; the
    drafter's phrase and the base's part left for the run to say."""
    model = launch["MODEL"] if launch.local_model else f"{launch['MODEL']}@{launch.model_pin}"
    k = speculative_tokens(launch)
    if launch.dflash2:
        drafter = (f"drafter {StartupLine.DRAFTER_PHRASE}, revision {launch.drafter_pin}, "
                   f"k={k}")
    elif launch["SPEC"] == "mtp":
        drafter = f"drafter the checkpoint's MTP head, k={k}"
    else:
        drafter = "no drafter (SPEC=off)"
    if launch["ENFORCE_EAGER"] == "1":
        mode = "eager"
    else:
        mode = f"CUDA graphs (capture {','.join(map(str, capture_sizes(launch)))})"
    kv = launch["KV_CACHE_MEMORY_BYTES"]
    switches = image_switches_on(launch)
    verify = (f"; verify tau {launch['ADAPTIVE_VERIFY_TAU']}, max {launch['ADAPTIVE_VERIFY_MAX'] or k}"
              if launch["ADAPTIVE_VERIFY"] == "1" else "")
    template = (f"model {model}, {drafter}, context {launch['MAX_MODEL_LEN']}, "
                f"{launch['MAX_NUM_SEQS']} seqs, {mode}, KV pin {kv} bytes ({gib(int(kv))} GiB "
                f"{launch['KV_CACHE_DTYPE']}){weights_phrase(launch)}, image {launch['IMAGE']}"
                f"{StartupLine.IMAGE_ABOUT}, nodes {' '.join(launch.nodes.addresses)} "
                f"(TP={launch['TP']}); {apikey.startup_phrase(launch.checked)}")
    return StartupLine(template, f"{' '.join(switches)} on{verify}" if switches else "",
                       launch.checked.drafter.phrase)


def image_switches_on(launch: Launch) -> list[str]:
    """The image switches at 1 (checks.image_switches), for the start-up line."""
    return [knob.name for knob in image_switches(launch.recipe) if launch[knob.name] == "1"]
