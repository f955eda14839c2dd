"""The launcher is plan, then apply (issue 49): the plan is built once, as frozen data, before
any step runs, and launcher/apply/ only reads it. Held here three ways, each shown failing:
- no module of launcher/apply/ imports the plan's builder (launcher/plan/plan.py, the plan;
  launcher/plan/commands.py, each command's words), so no step can ask it for a command
  while it runs;
- no command is written anywhere else under launcher/plan/ or launcher/apply/;
- the plan is frozen: its commands are tuples, its look-ups read-only, and a fact the run
  finds goes into a hole of the plan (Plan.filled), never into a command built anew; a
  command that still holds a hole is never run.
Imports are read from the source with ast; nothing of launcher/apply/ is imported for them."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from launcher.apply import host_levers
from launcher.apply.remote import Remote
from launcher.plan import plan
from launcher.plan.data import DRAFTER_PIN, IMAGE_ID, MODEL_PIN, UNPINNED, Plan, unfilled
from launcher.plan.load import load
from launcher.plan.settings import Failed
from launcher.plan.words import quote
from tests.unit.test_import_direction import imported
from tests.unit.test_launcher_support import NODES, REPO, launcher_env

LAUNCHER = REPO / "launcher"
BUILDERS = ("launcher.plan.plan", "launcher.plan.commands")
# the programs every command starts with, as the builders write them (checked below)
PROGRAMS_AT_LEAST = {"docker", "sh", "python3", "curl", "nvidia-smi", "pv", "mkdir", "test"}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def sources(folder: str) -> dict[str, str]:
    return {module_name(path): path.read_text()
            for path in sorted((LAUNCHER / folder).glob("*.py"))}


def callbacks(modules: dict[str, str]) -> list[str]:
    """`MODULE imports BUILDER` for each import of the plan's builder in MODULES."""
    return sorted({f"{module} imports {builder}" for module, source in modules.items()
                   for name in imported(source) for builder in BUILDERS
                   if name == builder or name.startswith(builder + ".")})


def programs(modules: dict[str, str]) -> set[str]:
    """The first word of every list or tuple of words in MODULES that starts with a string
    (an option, `-...`, is no program)."""
    found = set()
    for source in modules.values():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.List, ast.Tuple)) and node.elts and isinstance(
                    node.elts[0], ast.Constant) and isinstance(node.elts[0].value, str):
                word = node.elts[0].value
                if word and not word.startswith("-") and " " not in word:
                    found.add(word)
    return found


def commands_written(modules: dict[str, str], known: set[str]) -> list[str]:
    """`MODULE:LINE writes WORD ...` for each list or tuple of words starting with a program
    of KNOWN."""
    found = []
    for module, source in modules.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.List, ast.Tuple)) and node.elts and isinstance(
                    node.elts[0], ast.Constant) and node.elts[0].value in known:
                found.append(f"{module}:{node.lineno} writes {node.elts[0].value} ...")
    return sorted(found)


def builders() -> dict[str, str]:
    return {name: source for name, source in sources("plan").items() if name in BUILDERS}


# ------------------------------------------------------------------------ the imports


def test_no_step_imports_the_plans_builder():
    applying = sources("apply")
    assert {"launcher.apply.serve", "launcher.apply.steps"} <= set(applying)
    assert callbacks(applying) == []


@pytest.mark.parametrize("planted", [
    "from launcher.plan import plan\nargv = plan.image_id_argv(image)\n",
    "from launcher.plan.plan import build\n",
    "from launcher.plan import commands as words\n",
    "import launcher.plan.commands\n",
    "def later():\n    from launcher.plan.plan import meter_argv\n",
    "import importlib\nimportlib.import_module('launcher.plan.plan')\n",
])
def test_the_check_catches_a_step_calling_back_into_the_plan(planted):
    """Today's serve.py with one call back planted (the shape the issue found: the steps
    asking the plan for docker_argv, meter_argv, self_check_argv ... as they ran)."""
    serve = (LAUNCHER / "apply" / "serve.py").read_text()
    assert callbacks({"launcher.apply.serve": serve}) == []
    builder = "launcher.plan.commands" if "commands" in planted else "launcher.plan.plan"
    assert callbacks({"launcher.apply.serve": serve + planted}) == [
        f"launcher.apply.serve imports {builder}"]


# ------------------------------------------------------------------------ the commands


def test_every_command_is_written_in_the_builder():
    known = programs(builders())
    assert known >= PROGRAMS_AT_LEAST, known
    others = {name: source for folder in ("plan", "apply")
              for name, source in sources(folder).items() if name not in BUILDERS}
    assert "launcher.apply.serve" in others and "launcher.plan.preflight" in others
    assert commands_written(others, known) == []


def test_the_check_catches_a_command_written_in_a_step():
    known = programs(builders())
    serve = (LAUNCHER / "apply" / "serve.py").read_text()
    planted = serve + '\n\ndef kill(nodes, index, container):\n' \
                      '    nodes.run(index, ["docker", "kill", container])\n'
    found = commands_written({"launcher.apply.serve": planted}, known)
    assert len(found) == 1 and found[0].endswith("writes docker ...")


# ------------------------------------------------------------------------ frozen data, holes


@pytest.fixture(scope="module")
def unpinned(tmp_path_factory) -> Plan:
    """A two-node DFlash2 plan with neither pin known (both resolved by the run)."""
    tmp = tmp_path_factory.mktemp("plan")
    checked = load(launcher_env(tmp, MODEL="someone/other-checkpoint", DRAFTER="dflash2-g",
                                GPU_CLOCK_MHZ="2150", COMPACT_MEMORY="1", JIT_CACHE=tmp / "jit"))
    return plan.build(checked, plan.nodes_of(checked), REPO)


def commands_of(the_plan: Plan):
    """Every command the plan holds: the head's and each node's."""
    head = [value for field in dataclasses.fields(the_plan)
            if isinstance(value := getattr(the_plan, field.name), tuple)
            and all(isinstance(word, str) for word in value)]
    head += list(the_plan.resolve.values())
    nodes = [value for node in the_plan.nodes for field in dataclasses.fields(node)
             if isinstance(value := getattr(node, field.name), tuple)
             and all(isinstance(word, str) for word in value)]
    return head + nodes + [node.rank.docker_run for node in the_plan.nodes]


def test_the_plan_is_frozen_data(unpinned):
    with pytest.raises(dataclasses.FrozenInstanceError):
        unpinned.build = ("true",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        unpinned.nodes[1].rank_status = ("true",)
    with pytest.raises(TypeError):
        unpinned.resolve["x"] = ("true",)
    assert all(isinstance(command, tuple) for command in commands_of(unpinned))
    assert len(commands_of(unpinned)) > 40


def test_a_fact_the_run_finds_fills_its_hole(unpinned):
    model, drafter = "a" * 40, "b" * 40
    head = unpinned.head
    assert MODEL_PIN in head.rank.serve and DRAFTER_PIN in " ".join(head.prepare_drafter)
    filled = unpinned.filled(model_pin=model, drafter_pin=drafter, image_id="sha256:" + "c" * 64)
    found = {hole for command in commands_of(unpinned) for hole in unfilled(command)}
    assert {MODEL_PIN, DRAFTER_PIN, IMAGE_ID} <= found
    # the plan's own holes filled; a command's own (the listed IDs, the key's file) stay
    assert {hole for command in commands_of(filled) for hole in unfilled(command)} == \
        found - {MODEL_PIN, DRAFTER_PIN, IMAGE_ID}
    assert filled.launch.model_pin == model and filled.launch.image_id == "sha256:" + "c" * 64
    assert filled.head.rank.serve[filled.head.rank.serve.index("--revision") + 1] == model
    assert f"glm53-drafters/{unpinned.launch.checked.drafter.setting}-{drafter}" in " ".join(
        filled.head.prepare_drafter)
    assert f"{unpinned.launch['JIT_CACHE']}/{'c' * 64}" in filled.head.make_jit_cache
    assert f"@{model}," in filled.startup.said("a phrase", "")
    # what the run has not found stays a hole; DRY_RUN shows each pin as UNPINNED
    assert MODEL_PIN in " ".join(unpinned.filled(drafter_pin=drafter).head.rank.serve)
    dry = unpinned.dry_run()
    assert UNPINNED in dry.head.rank.serve and not any(
        MODEL_PIN in word or DRAFTER_PIN in word for command in commands_of(dry)
        for word in command)


def test_a_command_holding_a_hole_is_never_run(unpinned):
    nodes = Remote.of(unpinned.launch.nodes)
    with pytest.raises(Failed, match="model-revision-resolved-at-run.* not found yet"):
        nodes.run(0, unpinned.head.rank.docker_run)
    with pytest.raises(Failed, match="listed-ids"):
        nodes.argv(1, unpinned.nodes[1].remove_containers)


def test_a_start_that_fails_plans_the_reset_of_every_node_the_record_lists(tmp_path):
    """A node an earlier run left locked (a crash) is reset with the record's own image and
    DOCKER_ARGS, from the record's address; this run's nodes as it locks them."""
    left = {"head": False, "mhz": "1200,1200", "image": "old-image", "docker_args": ["--gpus", "0"]}
    host_levers.write_record(str(tmp_path / "runs"), {"192.0.2.9": left})
    checked = load(launcher_env(tmp_path, GPU_CLOCK_MHZ="2150", RUNS_DIR=tmp_path / "runs"))
    resets = plan.build(checked, plan.nodes_of(checked), REPO).clock_resets
    assert [(reset.address, reset.mhz) for reset in resets] == [
        ("192.0.2.9", "1200,1200"), (NODES[0], "2150,2150"), (NODES[1], "2150,2150")]
    ssh = tuple(checked.words["SSH"])
    assert resets[0].argv == (*ssh, "192.0.2.9", quote(
        ["docker", "run", "--rm", "--label", "glm53.launcher=tool", "--privileged", "--network",
         "none", "--gpus", "0", "--entrypoint", "nvidia-smi", "old-image", "--reset-gpu-clocks"]))
    assert resets[1].argv[0] == "docker" and resets[2].argv[:len(ssh) + 1] == (*ssh, NODES[1])
