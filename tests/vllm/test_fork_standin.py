"""The fork-shaped stand-in tree: built once from pinned releases, and shaped as the record says."""

import ast

from recipekit import forkshape
from recipekit.tree import TreeView
from recipekit.verify import static_problems
from tests.vllm.conftest import published_state, run_script


def read(root, relative):
    return (root / relative).read_text()


def signature(root, relative, name):
    for node in ast.parse(read(root, relative)).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return [a.arg for a in node.args.args]
    return None


def test_vllm_src_fork_prints_the_cached_tree_without_rebuilding_it(release):
    tree = release("fork")
    before = published_state(tree)
    result = run_script("scripts/vllm-src", "fork", env={"PIP_INDEX_URL": "http://127.0.0.1:9/none"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tree)
    assert published_state(tree) == before
    assert tree.name.startswith("fork-") and (tree / "vllm/__init__.py").is_file()


def test_docstring_says_it_is_a_reconstruction_and_lists_its_facts():
    doc = forkshape.__doc__
    assert "RECONSTRUCTION" in doc and "none of it is copied" in doc
    assert "Facts it encodes" in doc and "Not encoded" in doc


def test_files_the_record_proves_equal_0_27_1(release):
    fork, base = release("fork"), release("0.27.1")
    for relative in (
        "vllm/model_executor/layers/logits_processor.py",
        "vllm/model_executor/models/qwen3_dflash.py",
        "vllm/v1/worker/gpu/spec_decode/__init__.py",
        "vllm/v1/worker/gpu/spec_decode/dflash/speculator.py",
        "vllm/config/vllm.py",
    ):
        assert (fork / relative).read_bytes() == (base / relative).read_bytes(), relative


def test_the_pre_temperature_logits_cache_without_dflash2(release):
    fork, new = release("fork"), release("0.28.0")
    gumbel = read(fork, forkshape.GUMBEL)
    assert "logits_cache_ptr" in gumbel and "gumbel_noised_argmax" not in gumbel
    body = gumbel[gumbel.index("def gumbel_block_argmax("):gumbel.index("def _gumbel_sample_kernel(")]
    assert body.index("tl.store(") < body.index("logits = logits / temp"), "temperature after the store"
    # Outside gumbel_block_argmax, the file is 0.28.0's minus gumbel_noised_argmax.
    assert gumbel[gumbel.index("def _gumbel_sample_kernel("):] == read(new, forkshape.GUMBEL).split(
        "def _gumbel_sample_kernel(")[1].join(["def _gumbel_sample_kernel(", ""])
    speculator = read(fork, forkshape.SPECULATOR)
    assert "dtype=vllm_config.model_config.head_dtype," in speculator
    assert "logits_cache=draft_logits," in speculator
    assert "draft_logits_spec" not in speculator


def test_glm5next_without_mixture_of_experts_and_registered(release):
    fork = release("fork")
    model = ast.parse(read(fork, forkshape.GLM5NEXT_MODEL))
    bases = {n.name: [ast.unparse(b) for b in n.bases] for n in model.body if isinstance(n, ast.ClassDef)}
    assert "MixtureOfExperts" not in bases["Glm5NextForConditionalGeneration"]
    assert "Glm5NextModel" in bases
    registry = read(fork, forkshape.REGISTRY)
    assert '"Glm5NextForCausalLM": ("vllm.models.glm5next", "Glm5NextForCausalLM"),' in registry
    assert '"Glm5NextForConditionalGeneration": (' in registry


def test_kv_planner_has_0_30_0s_seams_and_0_27_1s_tensor_form(release):
    fork, new = release("fork"), release("0.30.0")
    interface = ast.parse(read(fork, forkshape.KV_INTERFACE))
    tensor = next(n for n in interface.body if isinstance(n, ast.ClassDef) and n.name == "KVCacheTensor")
    fields = [n.target.id for n in tensor.body if isinstance(n, ast.AnnAssign)]
    assert fields == ["size", "shared_by", "offset", "block_stride"]
    for name in ("_get_kv_cache_groups_glm5_next", "_glm5_next_tensor_layout",
                 "get_kv_cache_config_from_groups", "_max_memory_usage_bytes_from_groups"):
        assert signature(fork, forkshape.KV_UTILS, name) == signature(new, forkshape.KV_UTILS, name), name
    planner = read(fork, forkshape.KV_UTILS)
    assert "idx_pages.pop(),\n        tail_names,\n        tail_page," in planner
    assert "KVCacheTensor(size=mla_page * num_blocks, shared_by=shared_by)" in planner


def test_every_vllm_import_of_glm5next_resolves_in_the_stand_in(release):
    fork = release("fork")
    files = sorted(str(p.relative_to(fork)) for p in (fork / forkshape.GLM5NEXT).rglob("*.py"))
    assert len(files) > 10
    problems = static_problems(TreeView(fork), files + [forkshape.KV_UTILS, forkshape.SPECULATOR])
    # Compiled extensions (vllm._flashkda_C, ...) ship as .so files, never in a .py tree.
    assert [p for p in problems if not p.endswith("_C is not in the tree")] == []


def test_sm90_sparse_backend_is_present_and_registered_as_v8_expects(release):
    """Fact 8: the backend module (0.30.0's), its enum member and its FlashInfer probe;
    the capability-12 priority list stays the one D1 edits (0.27.1's, verbatim)."""
    fork, base, new = release("fork"), release("0.27.1"), release("0.30.0")
    assert read(fork, forkshape.SM90_BACKEND) == read(new, forkshape.SM90_BACKEND)
    registry = read(fork, forkshape.ATTENTION_REGISTRY)
    assert registry.index("FLASHINFER_MLA_SPARSE_SM120 = (") < registry.index(
        "FLASHINFER_MLA_SPARSE_SM90 = (\n        \"vllm.v1.attention.backends.mla.flashinfer_mla_sparse_sm90.\"")
    utils = ast.parse(read(fork, forkshape.FLASHINFER_UTILS))
    probe = next(n for n in utils.body if isinstance(n, ast.FunctionDef)
                 and n.name == "has_flashinfer_sm90_nope_mla")
    assert [ast.unparse(d) for d in probe.decorator_list] == ["functools.cache"]
    cuda = "vllm/platforms/cuda.py"
    assert read(fork, cuda) == read(base, cuda)
    problems = static_problems(TreeView(fork), [forkshape.SM90_BACKEND, forkshape.FLASHINFER_UTILS,
                                                forkshape.ATTENTION_REGISTRY])
    assert problems == []
