"""run.sh's two-node argv on two real engine ranks: tensor parallel 2 over gloo.

`DRY_RUN=1 ./run.sh` for two nodes gives each rank's `vllm serve` argv and container
environment. Two network namespaces stand in for the two nodes, joined by a veth pair named
as run.sh's IFACE on both ends (node 1: 192.0.2.1, rank 0 and its API; node 2: 192.0.2.2,
rank 1, headless), so `--nnodes`, `--node-rank`, `--master-addr`, `--master-port`,
`--distributed-executor-backend`, `--headless`, `VLLM_HOST_IP` and `GLOO_SOCKET_IFNAME` run
exactly as run.sh wrote them. Only the one-node test's overrides apply (rank 1 has no
--host or --port). The API reaches the tests through socat over a Unix socket (this
sandbox's root namespace answers no ARP on a veth, so it cannot be a node itself). Needs
root, iproute2 and socat, which .ci/run installs.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.engine.conftest import ENGINE_NICENESS
from tests.engine.engine_client import greedy_ids
from tests.engine.engine_server import EngineServer, free_port
from tests.engine.test_launcher_engine import (
    apply_overrides,
    assert_oracle_accepted,
    host_env,
    overrides,
    rank_launch,
)
from tests.unit.test_launcher_support import dry_run, serve_commands

# the addresses and interface DRY_RUN is given by tests/unit/test_launcher_support.py
HEAD, WORKER, IFACE = "192.0.2.1", "192.0.2.2", "ifx0"


def ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        pytest.fail(f"`ip {' '.join(args)}` failed ({result.stderr.strip()}): the two-rank test "
                    "needs root and iproute2")


@pytest.fixture(scope="module")
def nodes():
    """{address: network namespace} of the two stand-in nodes, IFACE joining them."""
    tag = os.getpid()
    namespaces = {HEAD: f"glm53-node1-{tag}", WORKER: f"glm53-node2-{tag}"}
    try:
        for namespace in namespaces.values():
            ip("netns", "add", namespace)
        ip("link", "add", "glm53-veth", "netns", namespaces[HEAD], "type", "veth",
           "peer", "name", IFACE, "netns", namespaces[WORKER])
        ip("-n", namespaces[HEAD], "link", "set", "glm53-veth", "name", IFACE)
        for address, namespace in namespaces.items():
            ip("-n", namespace, "addr", "add", f"{address}/24", "dev", IFACE)
            ip("-n", namespace, "link", "set", IFACE, "up")
            ip("-n", namespace, "link", "set", "lo", "up")
        yield namespaces
    finally:
        # deleting a namespace destroys its end of the pair, and with it the other
        for namespace in namespaces.values():
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)


class ApiBridge:
    """127.0.0.1:port here -> a Unix socket -> 127.0.0.1:port inside `namespace`."""

    def __init__(self, namespace: str, port: int, socket_path: Path):
        self.processes = [
            subprocess.Popen(["ip", "netns", "exec", namespace, "socat",
                              f"UNIX-LISTEN:{socket_path},fork", f"TCP:127.0.0.1:{port}"]),
            subprocess.Popen(["socat", f"TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr",
                              f"UNIX-CONNECT:{socket_path}"]),
        ]

    def close(self) -> None:
        for process in self.processes:
            process.terminate()
            process.wait(timeout=10)


def launcher_ranks(tmp_path, models) -> dict[str, tuple[list[str], dict]]:
    """rank -> (vllm argv, container env and mounts) of a two-node DRY_RUN of the tiny target."""
    stdout = dry_run(tmp_path, nodes=2, MODEL=str(models.target), MODEL_REVISION=None)
    return {str(rank): rank_launch(docker) for rank, (_, docker) in serve_commands(stdout).items()}


@pytest.fixture(scope="module")
def two_ranks(engine, models, nodes, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("two-ranks")
    ranks = launcher_ranks(tmp, models)
    assert sorted(ranks) == ["0", "1"]
    (argv0, container0), (argv1, container1) = ranks["0"], ranks["1"]
    k = json.loads(argv0[argv0.index("--speculative-config") + 1])["num_speculative_tokens"]
    port = free_port()
    changes = overrides(models, port, k)
    headless = {flag: change for flag, change in changes.items() if flag not in ("--host", "--port")}
    vllm = str(engine.vllm_command)
    worker = EngineServer(engine, models.target, name="rank1", log_dir=tmp,
                          niceness=ENGINE_NICENESS,
                          argv=["ip", "netns", "exec", nodes[WORKER], vllm,
                                *apply_overrides(argv1, headless)],
                          env=host_env(container1, engine.compile_cache()))
    head = EngineServer(engine, models.target, name="rank0", log_dir=tmp, port=port,
                        niceness=ENGINE_NICENESS,
                        argv=["ip", "netns", "exec", nodes[HEAD], vllm,
                              *apply_overrides(argv0, changes)],
                        env=host_env(container0, engine.compile_cache()))
    bridge = ApiBridge(nodes[HEAD], port, tmp / "api.sock")
    worker.start()
    try:
        with head:
            yield {"head": head, "worker": worker, "argv": (argv0, argv1), "k": k,
                   "env": (container0["env"], container1["env"])}
    finally:
        worker.stop()
        bridge.close()


def test_run_sh_wrote_a_two_node_launch_and_it_runs_unchanged(two_ranks):
    """The multi-node flags and addresses reach both ranks as run.sh wrote them."""
    (argv0, argv1), (env0, env1) = two_ranks["argv"], two_ranks["env"]
    for argv, rank in ((argv0, "0"), (argv1, "1")):
        assert argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--node-rank") + 1] == rank
        assert argv[argv.index("--master-addr") + 1] == HEAD
        assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert "--headless" in argv1 and "--headless" not in argv0
    assert (env0["VLLM_HOST_IP"], env1["VLLM_HOST_IP"]) == (HEAD, WORKER)
    assert env0["GLOO_SOCKET_IFNAME"] == env1["GLOO_SOCKET_IFNAME"] == IFACE
    worker_log = two_ranks["worker"].log_path.read_text(errors="replace")
    assert "rank 1 in world size 2" in worker_log and "TP rank 1" in worker_log


def test_two_ranks_answer_as_the_one_rank_target_does(two_ranks, server_plain):
    """Greedy tokens of the tensor-parallel pair (drafting with the oracle) equal the undrafted
    one-rank server's: the ranks split the model and agree."""
    prompt = "Write the numbers from one to thirty in words."
    assert greedy_ids(two_ranks["head"], prompt, 64) == greedy_ids(server_plain, prompt, 64)


def test_speculative_decoding_runs_across_the_two_ranks(two_ranks, tmp_path):
    assert_oracle_accepted(two_ranks["head"], two_ranks["k"], tmp_path, concurrency="1,2")
