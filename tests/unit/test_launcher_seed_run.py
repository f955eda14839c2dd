"""DRY_RUN against the seed's verified run (PR #1 era), flag by flag and env by env.

The seed's command is written below as data from the seed's PR #1 and its repository of
that time, not from the launcher. Every way the launcher's command differs from it is
listed: in PR_ERA_DIFFERENCES for `PROFILE=seed-pr` (how the launcher runs any command),
in DIFFERENCES for the defaults (those plus the seed's later v13 setting and field
lessons), and docs/launcher.md names each one with its reason.
"""

import json
import re

from tests.unit.test_launcher_support import NODES, REPO, dry_run, serve_commands

IFACE, HCA, MASTER_PORT = "ifx0", "hca0", "29501"
SEED_MODEL = "LibertAIDAI/GLM-5.3-Flash-NVFP4"

# `docker run` options of every rank (the seed's container, every rank).
SEED_DOCKER = {"--gpus": ["all"], "--network": ["host"], "--ipc": ["host"],
               "--shm-size": ["32g"], "--device": ["/dev/infiniband"], "--cap-add": ["IPC_LOCK"],
               "--ulimit": ["memlock=-1:-1"], "--restart": ["no"]}


def seed_env(rank):
    """The container environment of RANK (the seed's, every rank)."""
    return {"TORCH_CUDA_ARCH_LIST": "12.1a", "FLASHINFER_CUDA_ARCH_LIST": "12.1a",
            "FLASHINFER_DISABLE_VERSION_CHECK": "1", "VLLM_ENGINE_READY_TIMEOUT_S": "3600",
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
            "NCCL_SOCKET_IFNAME": IFACE, "GLOO_SOCKET_IFNAME": IFACE, "TP_SOCKET_IFNAME": IFACE,
            "NCCL_IB_HCA": HCA, "NCCL_NET": "IB", "NCCL_IB_DISABLE": "0", "NCCL_CROSS_NIC": "1",
            "NCCL_NVLS_ENABLE": "0", "NCCL_CUMEM_ENABLE": "0", "NCCL_DEBUG": "WARN",
            "VLLM_HOST_IP": NODES[rank]}


def seed_serve(rank):
    """`vllm serve` flags of RANK (the seed's `vllm serve`, every rank); the capture
    sizes are the seed PR's [1,2,4,6,12,18,24]; True marks a flag without a value. Values the
    record leaves open: the master port P (the launcher's MASTER_PORT stands in) and NAME."""
    flags = {"--tensor-parallel-size": "2", "--nnodes": "2", "--node-rank": str(rank),
             "--distributed-executor-backend": "mp", "--master-addr": NODES[0],
             "--master-port": MASTER_PORT, "--max-model-len": "327680",
             "--kv-cache-dtype": "fp8_e4m3", "--kv-cache-memory": "4445787956",
             "--gpu-memory-utilization": "0.85", "--max-num-seqs": "4", "--block-size": "2304",
             "--moe-backend": "marlin",
             "--speculative-config": {"method": "dflash", "num_speculative_tokens": 5},
             "--compilation-config": {"cudagraph_capture_sizes": [1, 2, 4, 6, 12, 18, 24]},
             "--tool-call-parser": "glm47", "--enable-auto-tool-choice": True,
             "--reasoning-parser": "glm45",
             "--default-chat-template-kwargs": '{"enable_thinking": false}',
             "--served-model-name": "<NAME>", "--trust-remote-code": True}
    if rank == 0:
        flags.update({"--host": "0.0.0.0", "--port": "8000"})
    else:
        flags["--headless"] = True
    return flags


# Every difference of PROFILE=seed-pr, as (where, name) -> what the launcher has instead;
# docs/launcher.md explains each.
PR_ERA_DIFFERENCES = {
    ("docker", "--detach"): "added", ("docker", "--name"): "added",
    ("docker", "--label"): "added", ("docker", "--mount"): "added",
    ("docker", "--entrypoint"): "added",
    ("env", "HF_HOME"): "added",
    **{("env", name): "added" for name in (
        "VLLM_CACHE_ROOT", "FLASHINFER_WORKSPACE_BASE", "DG_JIT_CACHE_DIR", "TRITON_CACHE_DIR",
        "TILELANG_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH")},
    ("serve", "--revision"): "added",
    ("serve", "--kv-cache-memory"): "renamed --kv-cache-memory-bytes",
    ("serve", "--speculative-config"): "model: the prepared drafter directory",
    ("serve", "--served-model-name"): "glm-5.3-flash instead of <NAME>",
    ("serve", "--linear-backend"): "added", ("serve", "--mm-processor-cache-gb"): "added",
    ("serve", "--override-generation-config"): "added",
}
DRAFTER_DIR = "model: the prepared drafter directory"
# The defaults: the seed's measured v13 setting (k=7, 2 seqs, image v13's levers) and the
# CUDA-graph memory estimate off (a field lesson) on top of those.
DIFFERENCES = {
    **PR_ERA_DIFFERENCES,
    ("env", "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"): "added",
    ("serve", "--max-num-seqs"): "2 instead of 4",
    ("serve", "--speculative-config"): (
        "{'method': 'dflash', 'num_speculative_tokens': 7} instead of "
        f"{{'method': 'dflash', 'num_speculative_tokens': 5}}; {DRAFTER_DIR}"),
    ("serve", "--compilation-config"): ("{'cudagraph_capture_sizes': [1, 2, 4, 8, 16]} instead "
                                        "of {'cudagraph_capture_sizes': [1, 2, 4, 6, 12, 18, 24]}"),
    **{("env", name): "added" for name in (
        "GLM53_KPOOL_TAIL_FIX", "GLM53_ADAPTIVE_VERIFY", "GLM53_ADAPTIVE_VERIFY_TAU",
        "GLM53_INT8_W8A16", "GLM53_DRAFT_WEIGHTS")},
}

_DOCKER_SWITCHES = {"--detach"}


def split_docker_run(argv):
    """(docker options, env, model, serve flags) of one rank's `docker run` argv."""
    assert argv[:2] == ["docker", "run"]
    options, env, at = {}, {}, 2
    while argv[at] != "--entrypoint":
        name = argv[at]
        if name in _DOCKER_SWITCHES:
            options[name] = [True]
            at += 1
            continue
        value = argv[at + 1]
        if name == "--env":
            key, _, env[key] = value.partition("=")
        else:
            options.setdefault(name, []).append(value)
        at += 2
    options["--entrypoint"] = [argv[at + 1]]
    serve = argv[at + 3:]
    assert serve[0] == "serve"
    model, flags, words = serve[1], {}, serve[2:]
    index = 0
    while index < len(words):
        flag = words[index]
        if index + 1 < len(words) and not words[index + 1].startswith("--"):
            flags[flag] = words[index + 1]
            index += 2
        else:
            flags[flag] = True
            index += 1
    return options, env, model, flags


def serve_value(flag, value):
    """A flag's value as the comparison sees it (JSON parsed where the seed gives JSON)."""
    if flag == "--compilation-config":
        return json.loads(value)
    if flag == "--speculative-config":
        spec = json.loads(value)
        return {key: spec[key] for key in ("method", "num_speculative_tokens")}
    return value


def compare(where, ours, seed, found):
    """Adds to FOUND every name of OURS or SEED whose value differs (or is only in OURS)."""
    for name in sorted(set(ours) | set(seed)):
        if name not in seed:
            found[(where, name)] = "added"
        elif ours.get(name) != seed[name]:
            found[(where, name)] = f"{ours.get(name)} instead of {seed[name]}"


def differences(rank, argv):
    options, env, model, flags = split_docker_run(argv)
    found = {}
    assert model == SEED_MODEL
    compare("docker", options, SEED_DOCKER, found)
    compare("env", env, seed_env(rank), found)
    seed = seed_serve(rank)
    # The seed's --kv-cache-memory is an argparse prefix of --kv-cache-memory-bytes.
    ours = {flag: serve_value(flag, value) for flag, value in flags.items()}
    if "--kv-cache-memory-bytes" in ours and "--kv-cache-memory" not in ours:
        renamed = ours.pop("--kv-cache-memory-bytes")
        if renamed == seed["--kv-cache-memory"]:
            found[("serve", "--kv-cache-memory")] = "renamed --kv-cache-memory-bytes"
            ours["--kv-cache-memory"] = renamed
    compare("serve", ours, seed, found)
    spec = json.loads(flags["--speculative-config"])
    if spec["model"].startswith("/root/.cache/huggingface/glm53-drafters/incoai-"):
        key = ("serve", "--speculative-config")
        # kept beside a method or k difference, never in its place
        found[key] = f"{found[key]}; {DRAFTER_DIR}" if key in found else DRAFTER_DIR
    return found


# rank 0 alone serves the API: its key (VLLM_API_KEY) comes from a 0600 file, never from argv
RANK0_DIFFERENCES = {("docker", "--env-file"): "added"}


def listed(rank: int, differences_of_every_rank: dict) -> dict:
    return {**differences_of_every_rank, **(RANK0_DIFFERENCES if rank == 0 else {})}


def test_each_rank_is_the_seeds_command_but_for_the_listed_differences(tmp_path):
    ranks = serve_commands(dry_run(tmp_path))
    assert sorted(ranks) == [0, 1]
    for rank, (_, argv) in ranks.items():
        assert differences(rank, argv) == listed(rank, DIFFERENCES), f"rank {rank}"


def test_the_seed_pr_profile_is_the_seeds_command_but_for_how_the_launcher_runs_it(tmp_path):
    ranks = serve_commands(dry_run(tmp_path, PROFILE="seed-pr"))
    assert sorted(ranks) == [0, 1]
    for rank, (_, argv) in ranks.items():
        assert differences(rank, argv) == listed(rank, PR_ERA_DIFFERENCES), f"rank {rank}"


def test_a_changed_setting_shows_up_as_a_difference(tmp_path):
    # The comparison can fail: a knob moved off the seed's value is caught.
    _, argv = serve_commands(dry_run(tmp_path, GPU_MEMORY_UTILIZATION="0.8", NCCL_DEBUG_LEVEL="INFO"))[1]
    found = differences(1, argv)
    assert found[("serve", "--gpu-memory-utilization")] == "0.8 instead of 0.85"
    assert found[("env", "NCCL_DEBUG")] == "INFO instead of WARN"


def test_the_launcher_page_explains_every_difference():
    text = (REPO / "docs" / "launcher.md").read_text()
    listed = text.split("## Where the defaults differ from the seed's run", 1)[1].split("\n## ", 1)[0]
    for _, name in [*DIFFERENCES, *RANK0_DIFFERENCES]:
        assert re.search(rf"`{re.escape(name)}[` =]", listed), f"docs/launcher.md: no {name}"
