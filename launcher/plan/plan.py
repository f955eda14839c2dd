"""A run as data, built once from its checked settings: the pins, each rank's container
(mounts, environment, `vllm serve` argv), the one-off tool containers, the image build and
the probes. The steps arrange it in run order (launcher/steps.py; DRY_RUN prints them) and
serving carries it out (launcher/serve.py); neither calls back here with the settings.

Order follows the seed's command; recipe.toml says which knob drives which flag and
variable. A knob this module does not build (not in BUILT_HERE) is passed as is: its one
flag with its value after the chat flags, its variables NAME=VALUE after the link's, on
every rank (a flag-typed knob: the flag alone, or NAME=1, when 1; nothing when 0).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from launcher import apikey
from launcher.plan import image_base, pins
from launcher.plan.checks import Checked, image_switches
from launcher.plan.drafter import cksum
from launcher.apply.remote import Nodes
from launcher.plan.settings import profile_default
from recipekit import baselock, recipe

# The base images the host trusted (recipekit/baselock.py), beside the recipe run.sh reads.
LOCK_FILE = baselock.lock_path(recipe.RECIPE_PATH)

SERVE_LABEL = "glm53.launcher=serve"
TOOL_LABEL = "glm53.launcher=tool"
UNPINNED = "<resolved-at-run>"
IMAGE_ID_UNKNOWN = "<image-id>"
CONTAINER_HF_HOME = "/root/.cache/huggingface"
# Where a rank sees its node's JIT cache directory (JIT_CACHE/<image id> on the host).
CONTAINER_JIT_DIR = "/var/cache/glm53-jit"
CONTAINER_TOKEN_PATH = "/run/secrets/hf_token"
IN_IMAGE_PREPARE_DRAFTER = "/opt/glm53-recipe/scripts/prepare-drafter"
IN_IMAGE_SCAN_CHECKPOINT = "/opt/glm53-recipe/scripts/scan-checkpoint"
RESOLVE_CODE = ("import sys; from huggingface_hub import HfApi; "
                "print(HfApi().model_info(sys.argv[1]).sha)")
FETCH_CODE = ("import sys; from huggingface_hub import snapshot_download; "
              "print(snapshot_download(sys.argv[1], revision=sys.argv[2]))")
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


def rank_container(rank: int) -> str:
    return f"glm53-rank{rank}"


@dataclass(frozen=True)
class RankPlan:
    """One rank: where it runs and the `docker run` that starts it, as data."""
    rank: int
    node: str
    container: str
    docker_options: tuple[str, ...]
    # ("--mount", spec) and ("--env", "NAME=VALUE") pairs, in `docker run` order.
    options: tuple[tuple[str, str], ...]
    image: str
    serve: tuple[str, ...]

    @property
    def env(self) -> dict[str, str]:
        return dict(value.split("=", 1) for kind, value in self.options if kind == "--env")

    @property
    def mounts(self) -> list[str]:
        return [value for kind, value in self.options if kind == "--mount"]

    def docker_argv(self) -> list[str]:
        argv = ["docker", "run", "--detach", "--name", self.container, "--label", SERVE_LABEL,
                "--label", f"glm53.rank={self.rank}", *self.docker_options]
        for kind, value in self.options:
            argv += [kind, value]
        return argv + ["--entrypoint", "vllm", self.image, *self.serve]


@dataclass(frozen=True)
class Launch:
    """A run's settings with its pins settled and, once known, the image ID and what its
    labels say of its base (launcher/image_base.py)."""
    checked: Checked
    nodes: Nodes
    model_pin: str
    drafter_pin: str
    image_id: str = IMAGE_ID_UNKNOWN
    base: image_base.ImageBase = image_base.UNKNOWN

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
        return jit_cache_dir(self["JIT_CACHE"], self.image_id)


def jit_cache_dir(jit_cache: str, image_id: str) -> str:
    """A run's JIT cache on every node: JIT_CACHE keyed by the image ID, so a new image
    starts a new directory and an old one is never fed kernels it did not build."""
    return f"{jit_cache}/{image_id.removeprefix('sha256:')}"


def settle(checked: Checked, nodes: Nodes, resolved: Mapping[str, str] | None = None,
           image_id: str = IMAGE_ID_UNKNOWN,
           base: image_base.ImageBase = image_base.UNKNOWN) -> Launch:
    """The launch with its model and drafter pins: the knob's, the known pin or PINS_FILE's,
    else what this run RESOLVED (repo -> commit), else the DRY_RUN placeholder."""
    resolved = resolved or {}
    model_pin, drafter_pin = "", ""
    model = checked["MODEL"]
    if not model.startswith("/"):
        given = checked["MODEL_REVISION"] or checked.recipe.pins.get(model, ("", ""))[0]
        recorded = "" if given else pins.recorded(checked["PINS_FILE"], model)
        if recorded and model in checked.recipe.checkpoints:
            pins.require_known(model, recorded, checked.recipe.checkpoints[model].revision_prefix,
                               f"{checked['PINS_FILE']} records",
                               "delete that line to resolve it again")
        model_pin = given or recorded or resolved.get(model) or UNPINNED
    drafter = checked.drafter
    if checked["SPEC"] == "dflash2":
        if drafter.local:
            drafter_pin = "local"
        else:
            drafter_pin = (pins.known(checked["PINS_FILE"], drafter.repo_id,
                                      checked["DRAFTER_REVISION"], drafter.catalog_revision)
                           or resolved.get(drafter.repo_id) or UNPINNED)
    return Launch(checked, nodes, model_pin, drafter_pin, image_id, base)


@dataclass(frozen=True)
class Plan:
    """Every command of one run that its settings decide, built once (serving builds it again
    when the run has found the image ID and resolved the pins)."""
    launch: Launch
    root: Path  # the checkout run.sh runs from: scripts/build.sh, launcher/count_bytes.py
    # With the drafter phrase DRY_RUN knows (the catalog's); a real run prints prepare-drafter's.
    startup_line: str
    chain_image: str
    build: list[str]
    # repo -> the Hub look-up of its commit, for each pin not known yet, the model first.
    resolve: dict[str, list[str]]
    fetch_snapshot: list[str]
    prepare_drafter: list[str]
    # The scan of a local MODEL on the head (CHECKPOINT_SCAN), or [] when there is none.
    scan_checkpoint: list[str]
    ranks: list[RankPlan]
    # Every node's host levers before the ranks start ([] when off): the GPU clock lock
    # (GPU_CLOCK_MHZ), the memory compaction (COMPACT_MEMORY) and the platform probe in a
    # container of IMAGE that reads the bandwidth around it (launcher/host_levers.py).
    lock_clocks: list[str] = field(default_factory=list)
    compact_memory: list[str] = field(default_factory=list)
    probe: list[str] = field(default_factory=list)


def build(checked: Checked, nodes: Nodes, root: Path, resolved: Mapping[str, str] | None = None,
          image_id: str = IMAGE_ID_UNKNOWN,
          base: image_base.ImageBase = image_base.UNKNOWN) -> Plan:
    """The run's plan; RESOLVED, IMAGE_ID and BASE (the image's labels) are what a real run
    found out (DRY_RUN: none)."""
    launch = settle(checked, nodes, resolved, image_id, base)
    drafter = checked.drafter
    repos = [(launch.model_pin, launch["MODEL"]), (launch.drafter_pin, drafter.repo_id)]
    hub_drafter = launch.dflash2 and not drafter.local
    return Plan(
        launch=launch, root=root,
        startup_line=startup_line(launch, drafter.phrase),
        chain_image=chain_image(launch),
        build=build_argv(root, launch),
        resolve={repo: resolve_revision_argv(launch, repo) for pin, repo in repos
                 if pin == UNPINNED},
        fetch_snapshot=fetch_snapshot_argv(launch) if hub_drafter else [],
        prepare_drafter=prepare_drafter_argv(launch) if launch.dflash2 else [],
        scan_checkpoint=scan_checkpoint_argv(launch) if scans_checkpoint(launch) else [],
        ranks=rank_plans(launch),
        lock_clocks=lock_clocks_argv(launch["IMAGE"], launch.checked.words["DOCKER_ARGS"],
                                     launch["GPU_CLOCK_MHZ"]) if launch["GPU_CLOCK_MHZ"] else [],
        compact_memory=compact_memory_argv(launch["IMAGE"])
        if launch["COMPACT_MEMORY"] == "1" else [],
        probe=probe_in_image_argv(launch["IMAGE"], launch.checked.words["DOCKER_ARGS"])
        if launch["COMPACT_MEMORY"] == "1" else [])


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


def hub_options(launch: Launch) -> list[tuple[str, str]]:
    """The HF cache and the token as a read-only file (its path, never its value, is in the
    environment): what every container of a run gets."""
    options = [("--mount", f"type=bind,src={launch['HF_CACHE']},dst={CONTAINER_HF_HOME}"),
               ("--env", f"HF_HOME={CONTAINER_HF_HOME}")]
    if launch["HF_TOKEN_FILE"]:
        options += [("--mount", f"type=bind,src={launch['HF_TOKEN_FILE']},"
                                f"dst={CONTAINER_TOKEN_PATH},readonly"),
                    ("--env", f"HF_TOKEN_PATH={CONTAINER_TOKEN_PATH}")]
    return options


def local_dir_options(launch: Launch) -> list[tuple[str, str]]:
    """Local model and drafter directories appear at the same path inside the container."""
    options = []
    if launch.local_model:
        model = launch["MODEL"]
        options.append(("--mount", f"type=bind,src={model},dst={model},readonly"))
    if launch.dflash2 and launch.checked.drafter.local:
        drafter = launch["DRAFTER"]
        options.append(("--mount", f"type=bind,src={drafter},dst={drafter},readonly"))
    return options


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
        # VLLM_API_KEY from a 0600 file written just before `docker run` (launcher/apikey.py)
        options.append(("--env-file", apikey.ENV_FILE_PLACEHOLDER))
    return options


def rank_plan(launch: Launch, rank: int) -> RankPlan:
    return RankPlan(rank=rank, node=launch.nodes.addresses[rank], container=rank_container(rank),
                    docker_options=(*launch.recipe.docker_options,
                                    *launch.checked.words["DOCKER_ARGS"]),
                    options=tuple(rank_options(launch, rank)), image=launch["IMAGE"],
                    serve=tuple(serve_argv(launch, rank)))


def rank_plans(launch: Launch) -> list[RankPlan]:
    return [rank_plan(launch, rank) for rank in range(len(launch.nodes.addresses))]


# ----------------------------------------------------------------------------- tools, probes


def tool_argv(launch: Launch, network: str, *args: str) -> list[str]:
    """A one-off container in the serving image (it has huggingface_hub, torch and the toolkit)."""
    argv = ["docker", "run", "--rm", "--label", TOOL_LABEL, "--network", network]
    for kind, value in hub_options(launch) + local_dir_options(launch):
        argv += [kind, value]
    return argv + ["--entrypoint", "python3", launch["IMAGE"], *args]


def resolve_revision_argv(launch: Launch, repo: str) -> list[str]:
    return tool_argv(launch, "host", "-c", RESOLVE_CODE, repo)


def fetch_snapshot_argv(launch: Launch) -> list[str]:
    return tool_argv(launch, "host", "-c", FETCH_CODE, launch.checked.drafter.repo_id,
                     launch.drafter_pin)


def prepare_drafter_argv(launch: Launch) -> list[str]:
    return tool_argv(launch, "none", IN_IMAGE_PREPARE_DRAFTER, launch.draft_snapshot,
                     "--out", launch.draft_dir, "--window", launch["DRAFTER_WINDOW"], "--json")


def scans_checkpoint(launch: Launch) -> bool:
    """A local MODEL is scanned before the ranks start (a Hub one has no snapshot here yet)."""
    return launch.local_model and launch["CHECKPOINT_SCAN"] != "off"


def scan_checkpoint_argv(launch: Launch) -> list[str]:
    """scripts/scan-checkpoint of the serving image on the local MODEL (mounted read-only at
    its own path): headers and the experts' global scales, no weights; no network."""
    return tool_argv(launch, "none", IN_IMAGE_SCAN_CHECKPOINT, launch["MODEL"], "--json")


def host_scan_argv(root: Path, model: str) -> list[str]:
    """The same scan on this host, for DRY_RUN: this checkout's scripts/scan-checkpoint (it
    finds or builds the recipe's tool environment for safetensors)."""
    return ["python3", str(root / "scripts" / "scan-checkpoint"), model, "--json"]


# A throwaway container of the serving image, allowed to write the host's kernel settings and
# to set the GPU's clocks: the docker group run.sh needs is root-equivalent already, so no
# sudo is asked of a node (docs/launcher.md, host levers).
PRIVILEGED = ("docker", "run", "--rm", "--label", TOOL_LABEL, "--privileged", "--network", "none")
COMPACT_MEMORY_SCRIPT = "echo 1 > /proc/sys/vm/compact_memory"


def compact_memory_argv(image: str) -> list[str]:
    """The kernel compacts every zone's free memory into large blocks (vm.compact_memory)."""
    return [*PRIVILEGED, "--entrypoint", "sh", image, "-c", COMPACT_MEMORY_SCRIPT]


def clock_range(mhz: str) -> str:
    """GPU_CLOCK_MHZ as nvidia-smi's MIN,MAX: N locks at N (N,N)."""
    return mhz if "," in mhz else f"{mhz},{mhz}"


def lock_clocks_argv(image: str, docker_args: list[str], mhz: str) -> list[str]:
    """nvidia-smi locks every GPU of the node in the range (DOCKER_ARGS gives the GPU)."""
    return [*PRIVILEGED, *docker_args, "--entrypoint", "nvidia-smi", image,
            f"--lock-gpu-clocks={clock_range(mhz)}"]


def reset_clocks_argv(image: str, docker_args: list[str]) -> list[str]:
    """nvidia-smi gives the clocks back to the driver (what stop.sh runs)."""
    return [*PRIVILEGED, *docker_args, "--entrypoint", "nvidia-smi", image,
            "--reset-gpu-clocks"]


def probe_in_image_argv(image: str, docker_args: list[str]) -> list[str]:
    """The platform probe (launcher/platform_probe.py, on stdin) in a throwaway container of
    IMAGE; DOCKER_ARGS gives it the GPU."""
    return ["docker", "run", "--rm", "-i", "--label", TOOL_LABEL, "--network", "none",
            *docker_args, "--entrypoint", "python3", image, "-"]


def probe_in_rank_argv(rank: int) -> list[str]:
    """The platform probe (on stdin) in RANK's running container."""
    return ["docker", "exec", "-i", rank_container(rank), "python3", "-"]


def image_id_argv(image: str) -> list[str]:
    return ["docker", "image", "inspect", "--format", "{{.Id}}", image]


def container_status_argv(rank: int) -> list[str]:
    return ["docker", "inspect", "--format", "{{.State.Status}}", rank_container(rank)]


def running_ranks_argv() -> list[str]:
    return ["docker", "ps", "--filter", f"label={SERVE_LABEL}", "--format", "{{.Names}}"]


def serve_containers_argv() -> list[str]:
    return ["docker", "ps", "--all", "--quiet", "--filter", f"label={SERVE_LABEL}"]


# What READY_CHECK polls: vLLM's /health turns 503 as soon as the engine dies, while
# /v1/models (the PR-era wait) goes on answering 200 for seconds.
READY_PATHS = {"health": "/health", "models": "/v1/models"}


def keyed_path(path: str) -> bool:
    """Whether the launcher sends the API key to PATH (launcher/apikey.py: /health is open)."""
    return apikey.needs_key(path)


def key_from_stdin(keyed: bool) -> list[str]:
    """curl reads its config, the Authorization header, from stdin: never from its argv."""
    return ["--config", "-"] if keyed else []


def api_probe_argv(port: str, check: str = "models", keyed: bool = False) -> list[str]:
    path = READY_PATHS[check]
    return ["curl", "--silent", "--fail", *key_from_stdin(keyed and keyed_path(path)),
            "--output", "/dev/null", "--max-time", "5", f"http://127.0.0.1:{port}{path}"]


def self_check_argv(root: Path, port: str, key_file: str | None = None) -> list[str]:
    """The start-up self-check on the head, after ready (launcher/selfcheck.py); KEY_FILE:
    the API key's file it reads (the key itself on no argv)."""
    return ["python3", str(root / "launcher" / "entry.py"), "self-check",
            f"http://127.0.0.1:{port}", *(("--api-key-file", key_file) if key_file else ())]


def api_health_argv(port: str) -> list[str]:
    """GET /health printing only the HTTP status (000: no answer); what the doctor reads."""
    return ["curl", "--silent", "--output", "/dev/null", "--write-out", "%{http_code}",
            "--max-time", "5", f"http://127.0.0.1:{port}/health"]


def api_models_argv(port: str, keyed: bool = False) -> list[str]:
    """GET /v1/models printing the model list, then a line with the HTTP status (a 401 is
    told apart); KEYED: the key comes on stdin."""
    return ["curl", "--silent", *key_from_stdin(keyed), "--write-out", "\n%{http_code}",
            "--max-time", "5", f"http://127.0.0.1:{port}/v1/models"]


# One JSON object, so that the argv and the environment (lists of words) parse apart.
RANK_FACTS_FORMAT = ('{"status":{{json .State.Status}},"image":{{json .Image}},'
                     '"env":{{json .Config.Env}},"args":{{json .Args}}}')


def rank_facts_argv(rank: int) -> list[str]:
    """What scripts/doctor reads of a rank container: status, image ID, environment, argv."""
    return ["docker", "inspect", "--format", RANK_FACTS_FORMAT, rank_container(rank)]


def image_levers(env: dict[str, str]) -> dict[str, str]:
    """The image layers' GLM53_* variables of a rank's environment (what its levers are)."""
    return {name: value for name, value in env.items() if name.startswith("GLM53_")}


def chain_image(launch: Launch) -> str:
    """The image scripts/build.sh builds: IMAGE's default under the run's profile."""
    return profile_default(launch.recipe, launch.checked.values, "IMAGE")


def chain_layer(launch: Launch) -> str:
    """The layer scripts/build.sh builds up to (the chain's tags are <prefix><layer>)."""
    return chain_image(launch).removeprefix(launch.recipe.chain_prefix)


def build_argv(root: Path, launch: Launch) -> list[str]:
    return [str(root / "scripts" / "build.sh"), "--base", launch["BASE_IMAGE"],
            "--to", chain_layer(launch), "--base-lock", launch["BASE_LOCK"]]


def meter_argv(label: str, size: str, pv: bool, launcher_dir: Path) -> list[str]:
    """The progress meter between `docker save` and the worker: pv when installed, else ours."""
    if pv:
        return ["pv", "--size", size, "--name", label]
    return ["python3", str(launcher_dir / "count_bytes.py"), label, size]


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


def startup_line(launch: Launch, drafter_phrase: str) -> str:
    """The one start-up line: model, drafter and licence, k, context, graphs, KV pin, image
    (what its base provides natively, as its labels say; the image switches on), nodes."""
    model = launch["MODEL"] if launch.local_model else f"{launch['MODEL']}@{launch.model_pin}"
    k = speculative_tokens(launch)
    if launch.dflash2:
        drafter = f"drafter {drafter_phrase}, revision {launch.drafter_pin}, k={k}"
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
    about = [part for part in (image_base.startup_phrase(launch.base),
                               f"{' '.join(switches)} on{verify}" if switches else "") if part]
    image = f"image {launch['IMAGE']}" + (f" ({'; '.join(about)})" if about else "")
    return (f"model {model}, {drafter}, context {launch['MAX_MODEL_LEN']}, "
            f"{launch['MAX_NUM_SEQS']} seqs, {mode}, KV pin {kv} bytes ({gib(int(kv))} GiB "
            f"{launch['KV_CACHE_DTYPE']}){weights_phrase(launch)}, {image}, nodes "
            f"{' '.join(launch.nodes.addresses)} (TP={launch['TP']}); "
            f"{apikey.startup_phrase(launch.checked)}")


def image_switches_on(launch: Launch) -> list[str]:
    """The image switches at 1 (checks.image_switches), for the start-up line."""
    return [knob.name for knob in image_switches(launch.recipe) if launch[knob.name] == "1"]
