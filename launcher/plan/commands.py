"""Every command the launcher runs, each one's words in one place: the one-off containers of
the serving image, Docker's listings and inspections, the host levers, the probes, the
readiness poll and the scripts a node runs. launcher/plan/plan.py puts them in the plan, one
node at a time; scripts/doctor and scripts/compare ask here for the few they run on a
cluster that is up. launcher/apply/ never does: it runs the plan's.
"""

from __future__ import annotations

import json
from pathlib import Path

from launcher.plan import extra_args, memory_phases, preflight
from launcher.plan.apikey import needs_key
from launcher.plan.data import (
    CONTAINER_HF_HOME,
    LISTED_IDS,
    LOG_TAIL_LINES,
    SERVE_LABEL,
    TOOL_LABEL,
    Launch,
    PlatformProbe,
    rank_container,
)

CONTAINER_TOKEN_PATH = "/run/secrets/hf_token"
IN_IMAGE_PREPARE_DRAFTER = "/opt/glm53-recipe/scripts/prepare-drafter"
IN_IMAGE_SCAN_CHECKPOINT = "/opt/glm53-recipe/scripts/scan-checkpoint"
RESOLVE_CODE = ("import sys; from huggingface_hub import HfApi; "
                "print(HfApi().model_info(sys.argv[1]).sha)")
FETCH_CODE = ("import sys; from huggingface_hub import snapshot_download; "
              "print(snapshot_download(sys.argv[1], revision=sys.argv[2]))")
GPU_LIST = ("nvidia-smi", "--list-gpus")
LABELS_FORMAT = "{{json .Config.Labels}}"


# ----------------------------------------------------------------------------- one-off tools


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


def scan_checkpoint_argv(launch: Launch) -> list[str]:
    """scripts/scan-checkpoint of the serving image on the local MODEL (mounted read-only at
    its own path): headers and the experts' global scales, no weights; no network."""
    return tool_argv(launch, "none", IN_IMAGE_SCAN_CHECKPOINT, launch["MODEL"], "--json")


def host_scan_argv(root: Path, model: str) -> list[str]:
    """The same scan on this host, for DRY_RUN: this checkout's scripts/scan-checkpoint (it
    finds or builds the recipe's tool environment for safetensors)."""
    return ["python3", str(root / "scripts" / "scan-checkpoint"), model, "--json"]


def extra_args_argv(image: str, words: list[str]) -> list[str]:
    """EXTRA_ARGS's words parsed by IMAGE's vLLM parser (launcher/extra_args_probe.py, inline)."""
    return ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", image,
            "-c", extra_args.PROBE.read_text(), json.dumps(words)]


def extra_args_shown_argv(image: str, words: list[str]) -> list[str]:
    """What DRY_RUN prints: the probe's source named by its file, not inlined."""
    return [*extra_args_argv(image, words)[:-3], "-c", extra_args.SHOWN, json.dumps(words)]


# ----------------------------------------------------------------------------- the host levers

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


def platform_probes(node_count: int, image: str, docker_args: list[str]) -> tuple:
    """Each node's platform probe as scripts/doctor --platform runs it: in its rank's
    container when that runs, else in IMAGE."""
    return tuple(PlatformProbe(rank_status=tuple(container_status_argv(index)),
                               in_rank=tuple(probe_in_rank_argv(index)),
                               rank_via=rank_container(index),
                               in_image=tuple(probe_in_image_argv(image, docker_args)),
                               image_via=f"a container of {image}")
                 for index in range(node_count))


# ----------------------------------------------------------------------------- a node's state


def memory_facts_argv() -> list[str]:
    """A node's unified-memory facts (launcher/plan/preflight.py's script)."""
    return ["sh", "-c", preflight.SCRIPT, "memory-preflight"]


def memory_sampler_argv(container: str, samples_per_second: str) -> list[str]:
    """The memory guard's sampler on a node (launcher/plan/memory_phases.py's script)."""
    return ["sh", "-c", memory_phases.SAMPLER_SCRIPT, "memory-sampler", container,
            memory_phases.PHASE_MARKER_RE, memory_phases.interval(samples_per_second)]


def make_dir_argv(path: str) -> list[str]:
    return ["mkdir", "-p", path]


def readable_argv(path: str) -> list[str]:
    return ["test", "-r", path]


def image_id_argv(image: str) -> list[str]:
    return ["docker", "image", "inspect", "--format", "{{.Id}}", image]


def image_size_argv(image: str) -> list[str]:
    return ["docker", "image", "inspect", "--format", "{{.Size}}", image]


def labels_argv(image: str) -> list[str]:
    """IMAGE's labels as JSON (launcher/plan/image_base.py reads them)."""
    return ["docker", "image", "inspect", "--format", LABELS_FORMAT, image]


def save_argv(image: str) -> list[str]:
    return ["docker", "save", image]


def load_argv() -> list[str]:
    return ["docker", "load"]


def container_status_argv(rank: int) -> list[str]:
    return ["docker", "inspect", "--format", "{{.State.Status}}", rank_container(rank)]


def running_ranks_argv() -> list[str]:
    return ["docker", "ps", "--filter", f"label={SERVE_LABEL}", "--format", "{{.Names}}"]


def serve_containers_argv() -> list[str]:
    return ["docker", "ps", "--all", "--quiet", "--filter", f"label={SERVE_LABEL}"]


def remove_containers_argv() -> list[str]:
    """`docker rm --force` of the containers a listing found (the LISTED_IDS hole)."""
    return ["docker", "rm", "--force", LISTED_IDS]


def log_tail_argv(rank: int) -> list[str]:
    return ["docker", "logs", "--tail", str(LOG_TAIL_LINES), rank_container(rank)]


def log_argv(rank: int) -> list[str]:
    return ["docker", "logs", rank_container(rank)]


def kill_argv(rank: int) -> list[str]:
    return ["docker", "kill", rank_container(rank)]


# One JSON object, so that the argv and the environment (lists of words) parse apart.
RANK_FACTS_FORMAT = ('{"status":{{json .State.Status}},"image":{{json .Image}},'
                     '"env":{{json .Config.Env}},"args":{{json .Args}}}')


def rank_facts_argv(rank: int) -> list[str]:
    """What scripts/doctor reads of a rank container: status, image ID, environment, argv."""
    return ["docker", "inspect", "--format", RANK_FACTS_FORMAT, rank_container(rank)]


# ----------------------------------------------------------------------------- the API

# What READY_CHECK polls: vLLM's /health turns 503 as soon as the engine dies, while
# /v1/models (the PR-era wait) goes on answering 200 for seconds.
READY_PATHS = {"health": "/health", "models": "/v1/models"}


def keyed_path(path: str) -> bool:
    """Whether the launcher sends the API key to PATH (launcher/plan/apikey.py: /health is
    open)."""
    return needs_key(path)


def key_from_stdin(keyed: bool) -> list[str]:
    """curl reads its config, the Authorization header, from stdin: never from its argv."""
    return ["--config", "-"] if keyed else []


def api_probe_argv(port: str, check: str = "models", keyed: bool = False) -> list[str]:
    path = READY_PATHS[check]
    return ["curl", "--silent", "--fail", *key_from_stdin(keyed and keyed_path(path)),
            "--output", "/dev/null", "--max-time", "5", f"http://127.0.0.1:{port}{path}"]


def self_check_argv(root: Path, port: str, key_file: str | None = None) -> list[str]:
    """The start-up self-check on the head, after ready (launcher/apply/selfcheck.py);
    KEY_FILE: the API key's file it reads (the key itself on no argv)."""
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


# ----------------------------------------------------------------------------- the image


def build_argv(root: Path, base_image: str, layer: str, base_lock: str) -> list[str]:
    """scripts/build.sh building the chain from BASE_IMAGE up to LAYER."""
    return [str(root / "scripts" / "build.sh"), "--base", base_image, "--to", layer,
            "--base-lock", base_lock]


def meter_argv(label: str, size: str, pv: bool, launcher_dir: Path) -> list[str]:
    """The progress meter between `docker save` and the worker: pv when installed, else ours."""
    if pv:
        return ["pv", "--size", size, "--name", label]
    return ["python3", str(launcher_dir / "count_bytes.py"), label, size]

