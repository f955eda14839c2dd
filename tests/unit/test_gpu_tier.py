"""The GPU tier's parts that need no GPU (tests/gpu; the tier itself runs by hand on an H200):
the margin target decides every greedy token far above bfloat16's rounding, and each server
runs the launcher's own serve argv with only the overrides the tier names."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest

from tests.gpu import models
from tests.gpu.engine import ADDED, OVERRIDES, REMAP, served_argv, served_env
from tests.gpu.glm5next_engine import STANDIN
from tests.gpu.payload import launcher_rank0


def test_margin_target_decides_far_above_bf16_rounding():
    target = models.margin_target_dir()
    found = json.loads((target / "next_token.json").read_text())
    table = found["next_token"]
    special = set(models.tiny_models.special_ids(models.tiny_models.tokenizer_dir()))
    ordinary = [t for t in range(len(table)) if t not in special]
    # nothing leads to a special token; the ordinary tokens are permuted
    assert sorted(table[t] for t in ordinary) == ordinary
    assert not special & set(table)
    assert found["min_margin_nats"] >= models.MARGIN_OVER_ROUNDING * found["bf16_rounding_nats"]
    # the float64 check itself refuses a target built without the margin
    tensors, table = models.margin_tensors(models.tiny_models.tokenizer_dir())
    tensors["lm_head.weight"] *= 0.0
    try:
        models.margins(tensors, table)
    except ValueError as error:
        assert "not its table" in str(error)
    else:
        raise AssertionError("a target whose greedy choice is not its table was accepted")


def test_servers_run_the_launchers_argv_with_only_the_named_overrides(tmp_path):
    launcher = launcher_rank0("/models/tiny")
    spec = {"method": "dflash", "model": "/d", "num_speculative_tokens": 3}
    argv = served_argv(launcher, tmp_path / "m", 1234, spec, kv_auto=False)[3:]
    original = launcher["argv"]
    assert argv[:2] == ["serve", str(tmp_path / "m")]
    changed = {flag for flag, value in zip(original[2::2], original[3::2])
               if argv[argv.index(flag) + 1] != value}
    assert changed == set(OVERRIDES) | {"--speculative-config"}
    assert argv[argv.index("--compilation-config") + 1] == \
        '{"cudagraph_capture_sizes":[1,2,4,8]}'  # the launcher's sizes at k = 3, two sequences
    for flag, (value, _) in ADDED.items():
        assert argv[argv.index(flag) + 1] == value
    undrafted = served_argv(launcher, tmp_path / "m", 1234, None, kv_auto=True)
    assert "--speculative-config" not in undrafted
    assert undrafted[undrafted.index("--kv-cache-dtype") + 1] == "auto"
    # the launcher's v13 environment passes unchanged unless a server replaces it
    env = served_env(launcher, tmp_path, None, remap=False)
    levers = {k: v for k, v in launcher["env"].items() if k.startswith("GLM53_")}
    assert levers and all(env[k] == v for k, v in levers.items())
    assert not any(k.startswith("GLM53_") for k in served_env(launcher, tmp_path, {}, False))


# ----------------------------------------------------------------------------- issue 35


def fake_payload(tmp_path):
    """A payload laid out as tests/gpu/payload.py packs it (the launcher's rank-0 argv, a
    folder per model of MODELS, the margin target's table), its models empty."""
    from tests.gpu import payload

    root = tmp_path / "payload"
    for name in payload.MODELS:
        (root / "models" / name).mkdir(parents=True)
    (root / "models" / "margin-target" / "next_token.json").write_text(
        json.dumps({"next_token": [1, 0]}))
    (root / "launcher_rank0.json").write_text(json.dumps(launcher_rank0("/models/tiny")))
    return root


def test_the_engine_servers_are_built_from_what_the_payload_packs(tmp_path):
    """engine.py's construction, up to the first server it would start: each server's model
    is a model the payload packs, its argv the launcher's (issue 35, finding 1)."""
    from tests.gpu import engine, payload

    root = fake_payload(tmp_path)
    made = engine.servers(root, tmp_path / "out")
    for name, server in made.items():
        assert server.process is None  # built, not started
        model = server.argv[server.argv.index("serve") + 1]
        assert model.startswith(str(root / "models")), (name, model)
        assert model.rsplit("/", 1)[-1] in payload.MODELS, (name, model)
    # the A/A's three boots of the tiny target are the same server three times
    tiny = [made[name] for name in engine.TINY_AA.values()]
    assert len({id(s) for s in tiny}) == 3
    assert len({tuple(a for a in s.argv if not a.isdigit()) for s in tiny}) == 1


class FakeTools:
    """engine.py's `tool` (a bench/ command) answering from fake records: each boot of the
    tiny target is a boot; the gate fails a boot listed in FAILS."""

    def __init__(self, url_of: dict[str, str], fails=()):
        self.name_of = {url: name for name, url in url_of.items()}
        self.fails, self.calls = set(fails), []

    def __call__(self, out, name, script, command, *args):
        url = args[args.index("--url") + 1]
        boot = self.name_of[url]
        self.calls.append((name, command, boot))
        overall = {"kl_mean": 4.2e-4, "top1_agreement": 1.0}
        kind = {"record": "quality-record", "aa": "quality-aa", "gate": "quality-gate"}[command]
        doc = {"kind": kind, "overall": overall, "prompts": []}
        code = 1 if command == "gate" and boot in self.fails else 0
        return {"exit": code, "doc": doc, "tail": ""}


@pytest.mark.parametrize("fails, passed", [((), True), (("gate-c",), False)])
def test_the_aa_gate_judges_a_boot_that_neither_recorded_nor_measured_the_band(
        tmp_path, monkeypatch, fails, passed):
    """A real A/A (issue 35, finding 3): the record from one boot of the tiny target, the band
    from a second, and a third boot gated against them; the old engine.py gated the band's own
    boot (KL 4.2441602e-4 on both sides: it could not fail)."""
    from tests.gpu import engine

    url = {name: f"http://127.0.0.1:{9000 + i}" for i, name in enumerate(
        ("gate-a", "gate-b", "gate-c", "gate-int8"))}
    tools = FakeTools(url, fails + ("gate-int8",))
    monkeypatch.setattr(engine, "tool", tools)
    monkeypatch.setattr(engine, "float64_prediction", lambda *a: {"per_prompt": [
        {"coarse": [1.26e-3], "full": [1.3e-3]}]})
    results, doc = [], {}
    engine.gate_quality(doc, results, url, tmp_path, tmp_path)
    by_command = {}
    for name, command, boot in tools.calls:
        by_command.setdefault(command, []).append(boot)
    recorded, band = by_command["record"], by_command["aa"]
    aa_gates = [boot for boot in by_command["gate"] if boot != "gate-int8"]
    assert len(aa_gates) == 1 and aa_gates[0] not in recorded + band, tools.calls
    check = next(r for r in results if "second boot" in r["check"] or "third boot" in r["check"])
    assert check["passed"] is passed, check


def test_a_kernel_class_other_than_the_claimed_one_fails_the_engine(tmp_path):
    """What docs/gpu-tier.md claims (Marlin FP4 for the NVFP4 drafter, GPTQ-Marlin for the
    INT8 groups) is asserted from each server's log, failing when vLLM chose another kernel
    or said nothing (issue 35, finding 8)."""
    from tests.gpu import engine

    def log(*lines):
        return [f"(EngineCore pid=1) INFO 12-03 17:18:50 [x.py:1] {line}" for line in lines]

    said = {"defaults": log("Using MarlinNvFp4LinearKernel for NVFP4 GEMM"),
            "gate-int8": log("Using MarlinLinearKernel for CompressedTensorsWNA16")}
    results = []
    engine.kernel_checks(results, said)
    assert [r["passed"] for r in results] == [True, True], results
    said["gate-int8"] = log("Using ConchLinearKernel for CompressedTensorsWNA16")
    said["defaults"] = log("Using AttentionBackendEnum.TRITON_ATTN backend.")
    results = []
    engine.kernel_checks(results, said)
    assert [r["passed"] for r in results] == [False, False], results
    assert results[1]["chosen"] == ["ConchLinearKernel"]


def test_the_gpu_tier_page_quotes_only_committed_speed_figures():
    """Every time ratio docs/gpu-tier.md states for the kernels is one in the committed
    docs/gpu-results/kernels.json (issue 35, finding 8: a "previous pass" 0.715 cited a JSON
    that was never committed)."""
    from tests.conftest import REPO_ROOT

    results = json.loads((REPO_ROOT / "docs" / "gpu-results" / "kernels.json").read_text())
    ratios = {f"{t['ratio']:.{digits}f}" for shape in results["shapes"].values()
              for fmt in shape["formats"].values() for t in fmt["timing"] for digits in (2, 3)}
    page = (REPO_ROOT / "docs" / "gpu-tier.md").read_text()
    speed = page[page.index("**Speed: where weight-only pays off"):
                 page.index("**Planted layout faults")]
    quoted = re.findall(r"(?<![\d.])0\.\d+", speed)
    assert quoted and set(quoted) <= ratios, sorted(set(quoted) - ratios)


# ----------------------------------------------------------------------------- the MoE library


def test_a_library_part_installs_into_part_a_tree_and_refuses_before_it(tmp_path):
    """Part moe (the fused MoE's library, missing from the first Glm5Next run on the H200)
    installs beside part b's into part a's tree; before part a it refuses, naming both."""
    from tests.gpu import payload

    root = tmp_path / "payload"
    library = tmp_path / "lib" / payload.PART_MOE_SO[0]
    library.parent.mkdir(parents=True)
    library.write_bytes(b"\x7fELF")
    (root / "moe").mkdir(parents=True)
    with tarfile.open(root / "moe" / "libraries.tar.xz", "w:xz") as archive:
        archive.add(library, arcname=payload.PART_MOE_SO[0])
    with pytest.raises(payload.PayloadError, match="part a is not installed.*then part moe"):
        payload.install("moe", root)
    (root / "tree" / "vllm").mkdir(parents=True)
    (root / "tree" / "vllm" / "__init__.py").write_text("")
    payload.install("moe", root)
    assert (root / "tree" / payload.PART_MOE_SO[0]).read_bytes() == b"\x7fELF"
    assert payload.PARTS[:3] == ("a", "b", "moe")


@pytest.mark.parametrize("stage", ["b", "d"])
def test_parts_b_and_d_refuse_before_the_moe_library_is_installed(tmp_path, stage):
    from tests.unit.test_launcher_support import REPO

    root = tmp_path / "payload"
    (root / "tree" / "vllm").mkdir(parents=True)
    (root / "tree" / "vllm" / "_C_stable_libtorch.abi3.so").write_bytes(b"")
    done = subprocess.run(["bash", str(REPO / "tests/gpu/run"), stage], capture_output=True,
                          text=True, timeout=60, check=False,
                          env={**os.environ, "GLM53_GPU_PAYLOAD": str(root), "OUT": str(tmp_path)})
    assert done.returncode == 2, done.stderr
    assert "part moe is not installed here: send it first" in done.stderr


# ----------------------------------------------------------------------------- issue 47


def test_part_c_passes_only_with_every_planned_check():
    """An engine run that judged nothing, or less than planned, fails: each planned check
    that did not run is recorded as failed by name (tests/gpu/engine.py, issue 47)."""
    from tests.gpu import engine

    results = []
    assert not engine.verdict(results)
    assert [r["check"] for r in results] == engine.planned_checks()
    assert all(r["missing"] and not r["passed"] for r in results)
    everything = [{"check": name, "passed": True} for name in engine.planned_checks()]
    assert engine.verdict(list(everything))
    assert not engine.verdict(everything[1:])
    assert engine.verdict(everything + [{"acceptance_length": {}}])  # a record, not a check


def test_part_c_fails_with_no_answers():
    from tests.gpu import engine

    results = []
    engine.margin_checks(results, {}, [1, 0])
    assert not engine.verdict(results)


def test_part_c_fails_when_one_server_errs():
    """answers_or_error's string (an HTTP 400) leaves the server out of `got`: its checks
    fail, and so does the run."""
    from tests.gpu import engine

    answer = {"ids": [0, 1, 0], "min_margin": 5.0, "drafts": 2, "draft_tokens": 2 * engine.K,
              "per_position": [2, 2, 0], "rates": [1.0, 1.0, 0.0]}
    got = {name: [dict(answer)] for name in engine.MARGIN if name != "tau-0.3"}
    results = []
    engine.margin_checks(results, got, [1, 0])
    failed = [r["check"] for r in results if "check" in r and not r["passed"]]
    assert "every margin server booted" in failed
    assert not engine.verdict(results)


def test_kernels_pass_only_when_every_planned_case_and_fault_was_judged():
    from tests.gpu import kernels

    shapes = dict(list(kernels.GPU_SHAPES.items())[:2])
    run = [{"m": m, "passed": True} for m in kernels.ROWS]
    planted = [{"m": m, "passed": False} for m in kernels.ROWS]
    doc = {"shapes": {name: {"formats": {label: {
        "checks": list(run), "plants": {"x1.01": list(planted)}, "passed": True}
        for label in kernels.FORMATS}} for name in shapes},
        "faults": [{"fault": f, "failed_as_it_should": True} for f in kernels.LAYOUT_FAULTS]}
    assert kernels.verdict(doc, shapes)
    assert not kernels.verdict({}, shapes)
    assert not kernels.verdict({"shapes": {}, "faults": doc["faults"]}, shapes)
    for corrupt in (
            lambda d: d["shapes"][next(iter(shapes))]["formats"].popitem(),
            lambda d: d["shapes"][next(iter(shapes))]["formats"]["int8-g64"].update(plants={}),
            lambda d: d["shapes"][next(iter(shapes))]["formats"]["int8-g64"]["checks"].pop(),
            lambda d: d["faults"].pop(),
            lambda d: d["shapes"][next(iter(shapes))]["formats"]["int8-g64"].update(
                passed=False)):
        broken = json.loads(json.dumps(doc))
        corrupt(broken)
        assert not kernels.verdict(broken, shapes)


def wheel(path, name: str) -> None:
    """A minimal pure-Python wheel that pip installs offline."""
    import zipfile

    dist = f"{name}-1.0.dist-info"
    files = {f"{name}/__init__.py": "", f"{dist}/METADATA":
             f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(path / f"{name}-1.0-py3-none-any.whl", "w") as archive:
        for name_in, text in files.items():
            archive.writestr(name_in, text)


def test_each_part_is_kept_outside_the_sent_folder(tmp_path):
    """A call that carries .gpu-payload/fi replaces the whole sent folder there: install
    copies the part into the payload folder first, so part moe sent earlier stays installed
    and a later call may install from the kept copy."""
    from tests.gpu import payload

    sent, root = tmp_path / "sent", tmp_path / "home" / "glm53-gpu"
    (root / "tree" / "vllm").mkdir(parents=True)
    (root / "tree" / "vllm" / "__init__.py").write_text("")
    library = tmp_path / "lib" / payload.PART_MOE_SO[0]
    library.parent.mkdir(parents=True)
    library.write_bytes(b"\x7fELF")
    (sent / "moe").mkdir(parents=True)
    with tarfile.open(sent / "moe" / "libraries.tar.xz", "w:xz") as archive:
        archive.add(library, arcname=payload.PART_MOE_SO[0])
    payload.install("moe", root, sent)
    shutil.rmtree(sent / "moe")  # the next call's carry replaces the whole sent folder
    (sent / "fi" / "wheels").mkdir(parents=True)
    wheel(sent / "fi" / "wheels", "fakefi")
    payload.install("fi", root, sent)
    assert (root / payload.FLASHINFER_SITE / "fakefi" / "__init__.py").is_file()
    assert (root / "tree" / payload.PART_MOE_SO[0]).read_bytes() == b"\x7fELF"
    payload.install("moe", root, sent)  # from the kept copy
    assert (root / "moe" / "libraries.tar.xz").is_file()
    assert payload.PARTS == ("a", "b", "moe", "fi")
    with pytest.raises(payload.PayloadError, match="no part b here"):
        payload.install("b", root, sent)


def test_part_fi_pins_the_flashinfer_vllm_requires(tmp_path):
    import zipfile

    from tests.gpu import payload

    pinned = payload.flashinfer_pin()
    for required, ok in ((pinned, True), ("0.6.17", False)):
        fake = tmp_path / f"vllm-{required}.whl"
        with zipfile.ZipFile(fake, "w") as archive:
            archive.writestr(f"vllm-{payload.VERSION}.dist-info/METADATA",
                             f"Name: vllm\nRequires-Dist: flashinfer-python=={required}\n")
        if ok:
            assert payload.flashinfer_pin_matches(fake) == pinned
        else:
            with pytest.raises(payload.PayloadError, match="requires 0.6.17"):
                payload.flashinfer_pin_matches(fake)


def test_part_d_refuses_without_part_fi_unless_bf16_kv_is_named(tmp_path):
    from tests.unit.test_launcher_support import REPO

    root = tmp_path / "payload"
    (root / "tree" / "vllm").mkdir(parents=True)
    for name in ("_C_stable_libtorch.abi3.so", "_moe_C_stable_libtorch.abi3.so"):
        (root / "tree" / "vllm" / name).write_bytes(b"")
    done = subprocess.run(["bash", str(REPO / "tests/gpu/run"), "d"], capture_output=True,
                          text=True, timeout=60, check=False,
                          env={**os.environ, "GLM53_GPU_PAYLOAD": str(root), "OUT": str(tmp_path)})
    assert done.returncode == 2, done.stderr
    assert "part fi is not installed here: send it first" in done.stderr


# ----------------------------------------------------------------------------- the import hook


def own_finders(source: str) -> list[str]:
    """The classes a sitecustomize defines (an import finder of its own would be one)."""
    return [node.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef)]


def test_the_stand_in_and_the_remap_share_one_import_hook():
    """tests/gpu/standin and tests/gpu/remap each install tests/gpu/edit_on_import.py's hook
    and carry no finder of their own; a sitecustomize with its own is caught."""
    for folder in (STANDIN, REMAP):
        source = (folder / "sitecustomize.py").read_text()
        assert "edit_on_import.py" in source and own_finders(source) == [], folder
    assert own_finders("import importlib.abc\n"
                       "class _Point(importlib.abc.MetaPathFinder):\n    pass\n") == ["_Point"]


def test_the_remap_points_the_weight_groups_at_qwen3_at_first_import(tmp_path):
    """tests/gpu/remap on a fake helper module: the groups and roots are Qwen3's once it is
    imported, said on stderr, and the hook has left sys.meta_path (its one edit done)."""
    loader = tmp_path / "fake" / "vllm" / "model_executor" / "model_loader"
    loader.mkdir(parents=True)
    for folder in (loader, *loader.parents):
        if folder == tmp_path / "fake":
            break
        (folder / "__init__.py").write_text("")
    (loader / "glm53_weight_groups.py").write_text(
        "GROUPS = {'kda_in': ('KimiDeltaAttention', ('in_proj',))}\n"
        "TARGET_ROOTS = ('Glm5NextForCausalLM',)\n")
    probe = ("import sys\n"
             "from vllm.model_executor.model_loader.glm53_weight_groups import (GROUPS,\n"
             "                                                                  TARGET_ROOTS)\n"
             "hooks = [type(f).__name__ for f in sys.meta_path]\n"
             "print(sorted(GROUPS), TARGET_ROOTS[0], [h for h in hooks if h == 'EditOnImport'])\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REMAP), str(tmp_path / "fake")])}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[0] == "['attn', 'lm_head', 'mlp'] Qwen3ForCausalLM []"
    assert ("gpu tier: vllm.model_executor.model_loader.glm53_weight_groups groups pointed at "
            "['attn', 'lm_head', 'mlp'] of ('Qwen3ForCausalLM',)") in done.stderr
