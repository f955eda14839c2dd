"""Part d of the GPU tier (issue 38) up to what needs a GPU: the servers it would start (the
launcher's argv at k = 7, Glm5Next's attention left to vLLM, the stand-in first on
PYTHONPATH), the stand-in's install hook on a fake vllm.utils.deep_gemm, and how drafted
tokens are judged against undrafted ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.gpu import glm5next_engine as part_d
from tests.gpu.payload import LAUNCHERS, launcher_rank0


def fake_payload(tmp_path):
    root = tmp_path / "payload"
    (root / "models" / "margin-target").mkdir(parents=True)
    for name, k in LAUNCHERS.items():
        (root / name).write_text(json.dumps(launcher_rank0("/models/tiny", k)))
    return root


def test_part_d_servers_run_the_launchers_k7_argv_on_glm5next_with_the_stand_in(tmp_path):
    root = fake_payload(tmp_path)
    models = {name: tmp_path / name for name in ("unequal", "equal", "drafter")}
    made = part_d.servers(root, tmp_path / "out", models)
    assert set(made) == {"undrafted", "drafted", "ring-off", "tau-0.3", "groups",
                         "equal-undrafted"}
    for name, server in made.items():
        argv = server.argv
        assert "--attention-backend" not in argv, name  # sparse MLA is vLLM's choice
        assert argv[argv.index("--block-size") + 1] == "2304"
        assert argv[argv.index("--compilation-config") + 1] == \
            '{"cudagraph_capture_sizes":[1,2,4,8,16]}'  # the launcher's at k = 7
        assert server.env["PYTHONPATH"].split(os.pathsep)[0] == str(part_d.STANDIN)
        assert server.env["VLLM_USE_DEEP_GEMM"] == "0"
        # TileLang is absent on the GPU machine: its JIT warm-up must not import it
        assert json.loads(argv[argv.index("--kernel-config") + 1]) == {"enable_jit_warmup": False}
        spec = argv[argv.index("--speculative-config") + 1] \
            if "--speculative-config" in argv else None
        drafted = name in ("drafted", "ring-off", "tau-0.3")
        assert (spec is not None) == drafted, name
        if drafted:
            assert json.loads(spec)["num_speculative_tokens"] == 7
        ring = "0" if name == "ring-off" else "1"
        assert server.env["GLM53_KPOOL_TAIL_FIX"] == ring, name
    assert made["groups"].env["GLM53_INT8_W8A16"] == "shared,mla,kda_o,kda_in,lm_head"
    assert "GLM53_INT8_W8A16" not in made["drafted"].env


def test_the_stand_in_replaces_only_the_indexer_kernels_at_first_import(tmp_path):
    """tests/gpu/standin's sitecustomize on a fake vllm.utils.deep_gemm: a module importing
    the kernels by name after it binds the stand-in; the module's other names stay."""
    fake = tmp_path / "fake" / "vllm" / "utils"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "deep_gemm.py").write_text(textwrap.dedent("""
        def _missing(*a, **k):
            raise RuntimeError("DeepGEMM's module is not loaded")
        fp8_fp4_mqa_logits = fp8_fp4_paged_mqa_logits = get_paged_mqa_logits_metadata = _missing
        fp8_gemm_nt = _missing
        def _paged_mqa_logits_schedule_slots(num_sms, next_n):
            return num_sms
    """))
    probe = textwrap.dedent("""
        from vllm.utils.deep_gemm import fp8_fp4_paged_mqa_logits, fp8_gemm_nt
        import vllm.utils.deep_gemm as dg
        print(fp8_fp4_paged_mqa_logits.__module__, fp8_gemm_nt.__name__,
              dg.fp8_fp4_mqa_logits.__module__)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(part_d.STANDIN),
                                                        str(tmp_path / "fake")])}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["gpu_mqa_logits_reference", "_missing",
                                   "gpu_mqa_logits_reference"]
    assert "stand-in installed: tests/gpu/mqa_logits_reference.py" in done.stderr


def test_the_mhc_ops_take_vllms_own_path_without_tilelang():
    """tests/gpu/standin on the real vLLM 0.30.0 (the test venv's): every MHC op with a
    TileLang-free path has forward_cuda pointing at it, and the log says so."""
    probe = textwrap.dedent("""
        import vllm.model_executor.layers.mhc as mhc
        ops = [n for n, v in vars(mhc).items() if isinstance(v, type)
               and issubclass(v, mhc.CustomOp) and v is not mhc.CustomOp]
        print(" ".join(sorted(n for n in ops
                              if getattr(mhc, n).forward_cuda is getattr(mhc, n).forward_hip)))
    """)
    env = {**os.environ, "PYTHONPATH": str(part_d.STANDIN)}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    ops = "HCHeadOp MHCFusedPostPreOp MHCPostOp MHCPreDelayedOp MHCPreOp"
    assert done.stdout.strip().splitlines()[-1].split() == ops.split()  # vLLM may warn first
    assert f"MHC fallback installed for {ops.replace(' ', ', ')}" in done.stderr


@pytest.mark.parametrize("other, near, equal", [
    (["a", "b", "c"], [], True),
    (["a", "x", "c"], [], False),            # differs where the reference decided clearly
    (["a", "x", "c"], [1], True),            # differs at a listed near-tie
    (["a", "b", "x"], [0], True),            # a near-tie earlier: later tokens may follow it
])
def test_drafted_tokens_are_judged_against_undrafted_up_to_a_near_tie(other, near, equal):
    margins = [part_d.MARGIN_FLOOR_NATS / 2 if i in near else 5.0 for i in range(3)]
    found = part_d.compare({"tokens": ["a", "b", "c"], "margins": margins}, {"tokens": other})
    assert found["equal_or_near_tie"] is equal
    assert found["near_ties"] == near
