"""scripts/doctor tells a node it cannot read from a node without a rank: Docker out of reach
on a node ("cannot reach Docker on NODE (WHY)") and a worker SSH cannot reach are `down`
(exit 6), each with its fix, never `missing` (which would send the user to ./run.sh over a
cluster that may be serving)."""

import json

from launcher.doctor import DOCKER_FIX
from tests.unit.test_doctor import cluster, doctor, started_cluster  # noqa: F401 (fixtures)
from tests.unit.test_launcher_lifecycle import HEAD, WORKER
from tests.unit.test_launcher_support import REPO, sealed_bin

NO_DAEMON = "Cannot connect to the Docker daemon at unix:///nonexistent. Is the docker daemon running?"
NO_PERMISSION = ("permission denied while trying to connect to the Docker daemon socket at "
                 "unix:///var/run/docker.sock: connect: permission denied")


def docker_failing_on(tmp_path, node: str, message: str) -> None:
    """The fake docker, but on NODE ("head" or a worker's address) it fails as a Docker out
    of reach does: MESSAGE on stderr, exit 1."""
    docker = sealed_bin(tmp_path) / "docker"
    docker.unlink()
    docker.write_text(f'#!/bin/sh\nif [ "${{FAKE_SSH_HOST:-head}}" = "{node}" ]; then\n'
                      f'  echo "{message}" >&2; exit 1\nfi\n'
                      f'exec {REPO}/tests/fakes/fake-docker "$@"\n')
    docker.chmod(0o755)


def empty_containers(state) -> None:
    for node in ("head", WORKER):
        path = state / f"{node}.json"
        node_state = json.loads(path.read_text())
        node_state["containers"] = {}
        path.write_text(json.dumps(node_state))


def test_docker_out_of_reach_on_the_head_is_down_not_missing(tmp_path, cluster):  # noqa: F811
    docker_failing_on(tmp_path, "head", NO_DAEMON)
    empty_containers(cluster)
    result = doctor(tmp_path, cluster)
    assert result.returncode == 6
    assert result.stdout.splitlines() == [
        f"doctor: cannot reach Docker on {HEAD} ({NO_DAEMON}); {DOCKER_FIX}",
        f"doctor: {WORKER} (worker 1): no glm53-rank1 container",
        "doctor: state down (exit 6)"]


def test_a_user_outside_the_docker_group_on_a_worker_is_told_so(tmp_path, cluster):  # noqa: F811
    docker_failing_on(tmp_path, WORKER, NO_PERMISSION)
    result = doctor(tmp_path, cluster)
    assert result.returncode == 6
    assert f"doctor: cannot reach Docker on {WORKER} ({NO_PERMISSION}); {DOCKER_FIX}" in \
        result.stdout.splitlines()
    assert "missing" not in result.stdout


def test_an_unreachable_worker_is_down_even_with_no_head_rank(tmp_path, cluster):  # noqa: F811
    empty_containers(cluster)
    unreachable = tmp_path / "unreachable-ssh"
    unreachable.write_text("#!/bin/sh\nexit 255\n")
    unreachable.chmod(0o755)
    result = doctor(tmp_path, cluster, SSH=unreachable)
    assert result.returncode == 6
    assert result.stdout.splitlines() == [
        f"doctor: {HEAD} (head): no glm53-rank0 container",
        f"doctor: {WORKER} (worker 1): cannot reach it over SSH ({unreachable}); "
        f"`{unreachable} {WORKER} true` must work from the head without a password (README's "
        "Prerequisites)",
        "doctor: state down (exit 6)"]
