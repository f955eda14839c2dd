"""Running run.sh / stop.sh in a sealed environment and reading back what DRY_RUN printed.

Shared by the launcher's unit and vllm tiers. Addresses are RFC 5737 documentation
addresses; interface and device names are made up. Nothing here reaches a lab.
"""

import os
import shlex
import subprocess
import sys
from pathlib import Path

from tests.timing import HANG_GUARD_S

REPO = Path(__file__).resolve().parents[2]
FAKE_SSH = REPO / "tests" / "fakes" / "fake-ssh"
NODES = ("192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4")
MODEL_PIN = "0123456789abcdef0123456789abcdef01234567"
DRAFTER_PIN = "89abcdef0123456789abcdef0123456789abcdef"
HOME = "/home/user"
# The tools the launcher needs in DRY_RUN; a PATH of only these keeps output independent
# of what the machine has installed (pv, docker, curl).
_TOOLS = ("bash", "dirname", "cksum", "sh", "mkdir", "sleep", "cat", "date", "mktemp", "rm",
          "mkfifo", "grep", "awk")


def sealed_bin(tmp_path):
    """A directory holding only the tools DRY_RUN uses, with python3 as this interpreter."""
    bin_dir = tmp_path / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        for tool in _TOOLS:
            for folder in ("/usr/bin", "/bin"):
                if Path(folder, tool).exists():
                    (bin_dir / tool).symlink_to(Path(folder, tool))
                    break
        (bin_dir / "python3").symlink_to(os.path.realpath(sys.executable))
    return bin_dir


def launcher_env(tmp_path, nodes=2, **settings):
    """The environment of a DRY_RUN over the first `nodes` documentation addresses.

    A setting given as None is removed, so its default (or refusal) applies.
    """
    env = {
        "PATH": str(sealed_bin(tmp_path)),
        "HOME": HOME,
        "CLUSTER_ENV": str(tmp_path / "no-cluster.env"),
        "PINS_FILE": str(tmp_path / "pins.env"),
        "API_KEY_FILE": str(tmp_path / "api-key"),
        "NODES": " ".join(NODES[:nodes]),
        "IFACE": "ifx0",
        "HCA": "hca0",
        "DRY_RUN": "1",
    }
    for name, value in settings.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = str(value)
    return env


def run(tmp_path, script="run.sh", nodes=2, root=REPO, **settings):
    """SCRIPT of the checkout at ROOT (this one, or a copy: tests/checkout.py) in the sealed
    environment."""
    try:
        return subprocess.run(
            [str(root / script)], env=launcher_env(tmp_path, nodes, **settings),
            capture_output=True, text=True, timeout=HANG_GUARD_S, cwd=tmp_path, check=False,
        )
    except subprocess.TimeoutExpired as hung:
        raise AssertionError(f"{script} still ran after {HANG_GUARD_S} s (hung); stderr so far: "
                             f"{hung.stderr!r}") from None


def dry_run(tmp_path, nodes=2, **settings):
    """stdout of a DRY_RUN that must succeed."""
    result = run(tmp_path, nodes=nodes, **settings)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return result.stdout


def node_commands(stdout, head=NODES[0]):
    """(node, argv) of every printed command that is not a pipeline, in order.

    The head's commands run locally; a worker's arrive as `ssh -o BatchMode=yes NODE 'CMD'`
    and are split a second time, as the remote shell would.
    """
    commands = []
    for line in stdout.splitlines():
        if line.startswith("#") or " | " in line:
            continue
        argv = shlex.split(line)
        if argv[:3] == ["ssh", "-o", "BatchMode=yes"]:
            assert len(argv) == 5, line
            commands.append((argv[3], shlex.split(argv[4])))
        else:
            commands.append((head, argv))
    return commands


def serve_commands(stdout, head=NODES[0]):
    """The `docker run --detach` argv of each rank, by rank, from DRY_RUN's output."""
    ranks = {}
    for node, argv in node_commands(stdout, head):
        if argv[:3] == ["docker", "run", "--detach"]:
            rank = int(argv[argv.index("--name") + 1].removeprefix("glm53-rank"))
            ranks[rank] = (node, argv)
    return ranks


def vllm_argv(docker_argv):
    """What the image's `vllm` entry point receives: the words after the image."""
    entrypoint_at = docker_argv.index("--entrypoint")
    assert docker_argv[entrypoint_at + 1] == "vllm"
    return docker_argv[entrypoint_at + 3:]


def startup_line(stdout):
    first = stdout.splitlines()[0]
    assert first.startswith("# glm53: "), first
    return first.removeprefix("# glm53: ")
