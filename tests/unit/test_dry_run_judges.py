"""DRY_RUN judges what the run judges (issue 46). Every refusal the real run can make is found
in the launcher's code, by walking the calls from the plan's build and Serving.serve
(launcher/plan/plan.py, launcher/apply/serve.py): each is either reached by DRY_RUN's own
path too (the settings, the plan, judge_on_this_host: the same code on the same input) or
answered only by the nodes (Docker, GPUs, memory, the images' IDs and labels), and then
DRY_RUN prints the step that asks and says it refuses. A refusal added to the run fails here
until it is one or the other.

The refusals DRY_RUN reaches because of this issue (the key file's mode, a key file that
cannot be written, the head's token file, recipe.lock's shape, a local MODEL's scan) are
then shown refusing in the real run, through the fakes, and in DRY_RUN, in the same line.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from tests.checkout import copy_checkout
from tests.unit import synthetic_checkpoints as synthetic
from tests.unit.test_launcher_lifecycle import IMAGE, make_cluster, serve, started
from tests.unit.test_launcher_support import REPO, run, sealed_bin

LAUNCHER = REPO / "launcher"
# The launcher's packages: its commands, what decides (the plan), what acts (apply).
PACKAGES = ("launcher", "launcher.plan", "launcher.apply")
CONSTRUCTORS = {"refusal", "unset_refusal", "Refused", "RefusedAbove"}
# The run: its plan built once, then carried out.
REAL_ROOTS = (("launcher.plan.plan", "build"), ("launcher.apply.serve", "Serving.serve"))
DRY_ROOTS = (("launcher.plan.load", "load"), ("launcher.plan.plan", "build"),
             ("launcher.apply.serve", "judge_on_this_host"), ("launcher.apply.steps", "run_steps"))
# The run's refusals only the nodes can answer: (module, function, what it refuses) -> (the
# settings of a DRY_RUN that prints the step, a pattern its comment matches).
ON_THE_NODES = {
    ("launcher.plan.gpus", "judge", "TP"):
        ({"TP": "4"}, r"TP=4 .*refuse if one has fewer GPUs"),
    ("launcher.apply.serve", "Serving.check_boot_memory", "MEM_BOOT_FLOOR_GIB"):
        ({}, r"refuse the boot under MEM_BOOT_FLOOR_GIB="),
    ("launcher.apply.serve", "Serving.check_base", "BASE_IMAGE"):
        ({}, r"base: refused when .*recipe\.lock records another image ID"),
    ("launcher.apply.serve", "Serving.check_base", "BASE_LOCK"):
        ({"BASE_LOCK": "strict"}, r"refused too while recipe\.lock holds none for it"),
    ("launcher.apply.serve", "Serving.build_chain_on_head", "IMAGE"):
        ({"IMAGE": "lab/glm:1"}, r"only when lab/glm:1 is missing on the head: refused \(IMAGE\)"),
    ("launcher.apply.serve", "Serving.build_chain_on_head", "RefusedAbove"):
        ({}, r"a refusal of scripts/build\.sh is the run's"),
    ("launcher.apply.serve", "Serving.ensure_images", "IMAGE"):
        ({}, r"the head's ID on every worker .*refused when a worker's differs"),
    ("launcher.plan.extra_args", "judge", "EXTRA_ARGS"):
        ({"EXTRA_ARGS": "--seed 1"}, r"EXTRA_ARGS parsed by the image's own vLLM parser .*refused"),
    ("launcher.plan.image_base", "retired_refusal", "EXTRA_ENV"):
        ({"EXTRA_ENV": "VLLM_USE_V2_MODEL_RUNNER=0"},
         r"EXTRA_ENV's VLLM_USE_V2_MODEL_RUNNER=0 refused on a base of vLLM 0\.34\.0"),
    ("launcher.plan.image_base", "b12x_refusal", "MOE_BACKEND"):
        ({"MOE_BACKEND": "b12x"}, r"MOE_BACKEND=b12x refused unless its \S+ lists b12x"),
}


class Module:
    """One launcher module's functions (by qualified name) and what its imports name."""

    def __init__(self, name: str, tree: ast.Module):
        self.name, self.functions, self.modules, self.names = name, {}, {}, {}
        self.tables = {}  # a module-level name -> the functions its value names (RULES)
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                named = [n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)]
                for target in targets:
                    if isinstance(target, ast.Name):
                        self.tables[target.id] = named
            if isinstance(node, ast.FunctionDef):
                self.functions[node.name] = node
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef):
                        self.functions[f"{node.name}.{item.name}"] = item
            elif isinstance(node, ast.ImportFrom) and node.module in PACKAGES:
                self.modules.update({a.asname or a.name: f"{node.module}.{a.name}"
                                     for a in node.names})
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("launcher."):
                self.names.update({a.asname or a.name: (node.module, a.name) for a in node.names})


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def launcher_modules() -> dict[str, Module]:
    return {module_name(path): Module(module_name(path), ast.parse(path.read_text()))
            for path in sorted(LAUNCHER.rglob("*.py")) if path.stem != "__init__"}


def callees(modules, module: Module, qualname: str):
    """(module, function) of each launcher function QUALNAME's body calls."""
    cls = qualname.split(".")[0] if "." in qualname else None
    for node in ast.walk(module.functions[qualname]):
        if isinstance(node, ast.Name) and node.id in module.tables:  # a call through a table
            yield from ((module.name, name) for name in module.tables[node.id]
                        if name in module.functions)
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name):
            if func.id in module.functions:
                yield module.name, func.id
            elif func.id in module.names:
                yield module.names[func.id]
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            owner = func.value.id
            if owner == "self" and cls and f"{cls}.{func.attr}" in module.functions:
                yield module.name, f"{cls}.{func.attr}"
            elif owner in module.modules:
                yield module.modules[owner], func.attr


def refusals_reached(roots) -> set[tuple[str, str, str]]:
    """(module, function, the knob it names or the constructor) of every refusal made in a
    function the ROOTS reach."""
    modules, seen, stack, found = launcher_modules(), set(), list(roots), set()
    while stack:
        key = stack.pop()
        if key in seen or key[0] not in modules or key[1] not in modules[key[0]].functions:
            continue
        seen.add(key)
        module = modules[key[0]]
        stack.extend(callees(modules, module, key[1]))
        for node in ast.walk(module.functions[key[1]]):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in CONSTRUCTORS:
                first = node.args[0] if node.args else None
                what = first.value if isinstance(first, ast.Constant) and isinstance(
                    first.value, str) and "=" not in first.value else node.func.id
                found.add((key[0], key[1], what))
    return found


def test_the_walk_finds_the_refusals_it_must():
    """The walk is not blind: it finds the run's known refusals on both paths."""
    real, dry = refusals_reached(REAL_ROOTS), refusals_reached(DRY_ROOTS)
    for site in (("launcher.apply.api_key_file", "key_of_run", "API_KEY_FILE"),
                 ("launcher.apply.serve", "scan_problem", "MODEL"),
                 ("launcher.apply.serve", "read_base_lock", "Refused"),
                 ("launcher.apply.serve", "token_refusal", "HF_TOKEN_FILE"),
                 ("launcher.plan.gpus", "judge", "TP")):
        assert site in real, site
    assert ("launcher.plan.checks", "_extra_args", "EXTRA_ARGS") in dry
    assert ("launcher.plan.gpus", "judge", "TP") not in dry


def test_every_refusal_of_the_run_is_dry_runs_or_the_nodes():
    real, dry = refusals_reached(REAL_ROOTS), refusals_reached(DRY_ROOTS)
    assert real - dry == set(ON_THE_NODES), "classify it: judge it in judge_on_this_host, " \
        "or add it to ON_THE_NODES with the DRY_RUN step that announces it"


@pytest.mark.parametrize("site", sorted(ON_THE_NODES), ids=lambda site: f"{site[1]}:{site[2]}")
def test_dry_run_prints_the_step_of_each_refusal_only_the_nodes_answer(tmp_path, site):
    settings, pattern = ON_THE_NODES[site]
    result = run(tmp_path, **settings)
    assert result.returncode == 0, result.stderr
    comments = [line for line in result.stdout.splitlines() if line.startswith("# ")]
    assert any(re.search(pattern, line) for line in comments), (pattern, comments)


# ------------------------------------------------- what DRY_RUN now refuses as the run does


def with_this_python(folder: Path) -> None:
    """python3 as this interpreter as invoked (its venv has safetensors), for the scans: the
    sealed bin's link resolves to the base interpreter, outside the venv."""
    python = sealed_bin(folder) / "python3"
    python.unlink()
    python.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)


def real_and_dry(tmp_path: Path, set_up, root: Path = REPO, **settings):
    """The refusal lines of the real run (fake docker, ssh and curl) and of DRY_RUN with
    SETTINGS, SET_UP(folder) run in each one's own folder first."""
    lines = []
    for name, dry in (("real", False), ("dry", True)):
        folder = tmp_path / name
        folder.mkdir(parents=True)
        with_this_python(folder)
        extra = set_up(folder) or {}
        if dry:
            result = run(folder, root=root, **settings, **extra)
        else:
            state = make_cluster(folder)
            result = serve(folder, state, root=root, FAKE_CURL_READY_AFTER=1, **settings,
                           **extra)
            assert not (state / "calls.jsonl").exists() or started(state) == [], result.stdout
        assert result.returncode == 2, (name, result.stdout, result.stderr)
        lines.append(result.stderr.strip().replace(str(folder), "{tmp}"))
    return lines


def test_a_loose_key_file_is_refused_by_both(tmp_path):
    def loose(folder):
        key = folder / "api-key"
        key.write_text("a-key\n")
        key.chmod(0o644)

    real, dry = real_and_dry(tmp_path, loose)
    assert real == dry == ("refused: API_KEY_FILE={tmp}/api-key: has mode 0644: others can "
                           "read the API key; run chmod 600 {tmp}/api-key (or delete it, and "
                           "./run.sh writes a new key)")


def test_a_key_file_that_cannot_be_written_is_refused_by_both(tmp_path):
    for under, why in (("", "File exists"), ("/keys", "Not a directory")):
        def blocked(folder):
            (folder / "a-file").write_text("")
            return {"API_KEY_FILE": f"{folder}/a-file{under}/api-key"}

        real, dry = real_and_dry(tmp_path / why.replace(" ", "-"), blocked)
        assert real == dry == (f"refused: API_KEY_FILE={{tmp}}/a-file{under}/api-key: cannot "
                               f"write a new key there ({why}); accepted: a path this user can "
                               "create")


def test_a_token_file_the_head_cannot_read_is_refused_by_both(tmp_path):
    real, dry = real_and_dry(tmp_path, lambda folder: {"HF_TOKEN_FILE": folder / "no-token"})
    assert real == dry == ("refused: HF_TOKEN_FILE={tmp}/no-token: not a readable file on "
                           "192.0.2.1; accepted: the token file at this path on every node, or "
                           "empty")


def test_a_recipe_lock_that_is_not_toml_is_refused_by_both(tmp_path):
    root = copy_checkout(tmp_path / "checkout")
    (root / "recipe.lock").write_text("images = [\n")
    real, dry = real_and_dry(tmp_path, lambda folder: None, root=root)
    assert real == dry and real.startswith("refused: recipe.lock: Invalid value"), real


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return {name: make(root) for name, make in synthetic.MAKERS.items()}


@pytest.mark.parametrize("name", ["compressed-tensors", "not-a-checkpoint"])
def test_a_local_model_the_run_would_refuse_is_refused_by_both(tmp_path, checkpoints, name):
    model = checkpoints.get(name) or tmp_path / name
    model.mkdir(exist_ok=True)
    real, dry = real_and_dry(tmp_path, lambda folder: None, MODEL=model, MODEL_REVISION=None,
                             SPEC="off")
    # the same refusal; only where the scan ran differs
    assert dry == real.replace(f"the checkpoint scan in {IMAGE} ", "the checkpoint scan on this "
                               "host "), (real, dry)
    assert dry.startswith(f"refused: MODEL={model}: ")


def test_dry_run_says_what_the_scan_found_on_this_host(tmp_path, checkpoints):
    model = checkpoints["modelopt-unequal"]
    with_this_python(tmp_path)
    result = run(tmp_path, MODEL=model, MODEL_REVISION=None, SPEC="off")
    assert result.returncode == 0 and result.stderr == "", result.stderr
    comment, = [line for line in result.stdout.splitlines() if line.startswith("# checkpoint:")]
    assert comment.endswith("; on this host it found: ModelOpt NVFP4 (modelopt 0.45.0); modules "
                            "24 NVFP4, 20 BF16; gate/up weight_scale_2 differ in 3 of 8 routed "
                            f"experts, largest ratio 4 at model.layers.2.mlp.experts.0 (decode "
                            f"scale up/gate 0.25); no NVFP4 merged linears; {IMAGE} corrects "
                            "them (layer v8 and later apply each half's and shard's own global "
                            "scale)"), comment


def test_without_the_host_judgements_dry_run_would_miss_the_runs_local_refusals():
    """The classification fails on the gap this issue found: DRY_RUN's path without
    judge_on_this_host leaves the key file, the token file, recipe.lock and the scan to the
    run alone."""
    real = refusals_reached(REAL_ROOTS)
    without = refusals_reached(tuple(root for root in DRY_ROOTS
                                     if root[1] != "judge_on_this_host"))
    assert {site[2] for site in real - without - set(ON_THE_NODES)} == {
        "API_KEY_FILE", "HF_TOKEN_FILE", "Refused", "MODEL"}


def test_a_scan_that_cannot_run_on_this_host_ends_dry_run_without_blaming_the_model(
        tmp_path, checkpoints):
    python = sealed_bin(tmp_path) / "python3"
    python.unlink()
    python.write_text(f'#!/bin/sh\ncase "$1" in *scan-checkpoint) echo "scan-checkpoint: no '
                      f'tool environment here" >&2; exit 2;; esac\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    result = run(tmp_path, MODEL=checkpoints["nvidia-like"], MODEL_REVISION=None, SPEC="off")
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (f"glm53: DRY_RUN could not run the checkpoint scan of MODEL="
                             f"{checkpoints['nvidia-like']} on this host (scan-checkpoint: no "
                             "tool environment here); fix that, or set CHECKPOINT_SCAN=off for "
                             "the dry run\n")
