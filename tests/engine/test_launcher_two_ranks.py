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
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.engine import dflash2_models
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


def launcher_ranks(tmp_path, model: Path) -> dict[str, tuple[list[str], dict]]:
    """rank -> (vllm argv, container env and mounts) of a two-node DRY_RUN serving `model`."""
    # the argv alone: DRY_RUN's host scan of MODEL (a step apart from the ranks) needs the
    # tool environment, which the sealed PATH's bare python3 lacks
    stdout = dry_run(tmp_path, nodes=2, MODEL=str(model), MODEL_REVISION=None,
                     CHECKPOINT_SCAN="off")
    return {str(rank): rank_launch(docker) for rank, (_, docker) in serve_commands(stdout).items()}


@contextmanager
def rank_pair(engine, models, nodes, tmp: Path, model: Path, rank1_model: Path | None = None):
    """Rank 0 (with the API) and rank 1 of run.sh's two-node launch of `model`, drafting with
    `model` as the oracle; rank 1 loads `rank1_model` instead where given (a pair whose ranks
    disagree)."""
    ranks = launcher_ranks(tmp, model)
    assert sorted(ranks) == ["0", "1"]
    (argv0, container0), (argv1, container1) = ranks["0"], ranks["1"]
    if rank1_model is not None:
        assert argv1.count(str(model)) == 1
        argv1 = [str(rank1_model) if word == str(model) else word for word in argv1]
    k = json.loads(argv0[argv0.index("--speculative-config") + 1])["num_speculative_tokens"]
    port = free_port()
    changes = overrides(models, port, k, drafter=model)
    headless = {flag: change for flag, change in changes.items() if flag not in ("--host", "--port")}
    vllm = str(engine.vllm_command)
    worker = EngineServer(engine, model, name="rank1", log_dir=tmp,
                          niceness=ENGINE_NICENESS,
                          argv=["ip", "netns", "exec", nodes[WORKER], vllm,
                                *apply_overrides(argv1, headless)],
                          env=host_env(container1, engine.compile_cache()))
    head = EngineServer(engine, model, name="rank0", log_dir=tmp, port=port,
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


@pytest.fixture(scope="module")
def bigram():
    """The target whose greedy path is known for any prompt and length: each next token is a
    float64 table's entry for the one before, no entry within 10x of float32's rounding
    (checked when the model is made, dflash2_models.bigram_target_dir), so two ranks adding
    partial sums in another order cannot flip a token (a random target did, at index 39)."""
    return dflash2_models.bigram_target_dir()


@pytest.fixture(scope="module")
def two_ranks(engine, models, nodes, bigram, tmp_path_factory):
    with rank_pair(engine, models, nodes, tmp_path_factory.mktemp("two-ranks"), bigram) as pair:
        yield pair


def first_break(ids: list[int], table: list[int]) -> int | None:
    """The agreement check: the first position whose token is not the table's entry for the
    token before it (None: the whole answer follows the table)."""
    return next((i + 1 for i, (a, b) in enumerate(zip(ids, ids[1:])) if table[a] != b), None)


PROMPT, MAX_TOKENS = "Write the numbers from one to thirty in words.", 64


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


def test_two_ranks_answer_as_the_one_rank_target_does(two_ranks, bigram):
    """Greedy tokens of the tensor-parallel pair (drafting with the oracle) follow the target's
    own next-token table (float64, from the weights; one-rank engines follow it in
    test_dflash2_engine): the ranks split the model and agree. The table's margins make this
    hold on any machine."""
    ids = greedy_ids(two_ranks["head"], PROMPT, MAX_TOKENS)
    assert len(ids) == MAX_TOKENS
    assert first_break(ids, dflash2_models.next_tokens(bigram)) is None, ids


def test_speculative_decoding_runs_across_the_two_ranks(two_ranks, tmp_path):
    assert_oracle_accepted(two_ranks["head"], two_ranks["k"], tmp_path, concurrency="1,2")


def test_ranks_that_load_different_weights_fail_the_agreement_check(
        engine, models, nodes, bigram, two_ranks, tmp_path):
    """The negative of the agreement test: rank 1 loads another model (same shape and
    tokenizer, its own weights), so the pair computes neither model, and the check that
    passes the agreeing pair reports the break. (Starts after the agreeing pair's answers:
    the module's fixtures keep one pair of the namespaces in use at a time.)"""
    two_ranks["worker"].stop()
    two_ranks["head"].stop()
    with rank_pair(engine, models, nodes, tmp_path, bigram, rank1_model=models.other) as pair:
        assert pair["argv"][1].count(str(models.other)) == 1
        ids = greedy_ids(pair["head"], PROMPT, MAX_TOKENS)
    assert len(ids) == MAX_TOKENS
    assert first_break(ids, dflash2_models.next_tokens(bigram)) is not None, ids
