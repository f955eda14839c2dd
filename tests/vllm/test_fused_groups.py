"""recipekit/fused_groups.py (the checkpoint scan's table of the groups vLLM fuses) against the
pinned vLLM 0.30.0 tree (and 0.33.0's), read as source text with ast (no torch, no import of
vLLM).

Glm5Next (0.30.0: vllm/models/glm5next/nvidia/; 0.33.0: .../common/) fuses what
`stacked_params_mapping` in `Glm5NextModel.load_weights` lists, the MTP head
(`Glm5NextMTP.load_weights`) a subset of it, and the routed experts' halves named in
`fused_moe_make_expert_params_mapping`; none of its classes defines a `packed_modules_mapping` (Glm5NextForConditionalGeneration inherits
Glm4v's, which names the vision tower's qkv, built with quant_config=None). The test fails
when any of these differs from the table, and is shown failing on planted changes.
"""

import ast

import pytest

from recipekit.fused_groups import KINDS, merged_linears

# The pinned trees and where each keeps Glm5Next (0.33.0 moved it to common/).
GLM5NEXT = {"0.30.0": "vllm/models/glm5next/nvidia", "0.33.0": "vllm/models/glm5next/common"}
FILES = {"model": "model.py", "mtp": "mtp.py", "attention": "attention.py"}
EXPERTS = next(kind for kind in KINDS if kind.routed_experts)


def _method(tree: ast.Module, cls: str, method: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    return item
    raise AssertionError(f"no {cls}.{method} in the tree")


def stacked_mapping(tree: ast.Module, cls: str) -> dict[str, list[str]]:
    """{fused: [shards in shard-id order]} of CLS.load_weights' stacked_params_mapping."""
    for node in ast.walk(_method(tree, cls, "load_weights")):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "stacked_params_mapping"):
            fused: dict[str, dict[int, str]] = {}
            for param, weight, shard_id in ast.literal_eval(node.value):
                fused.setdefault(param.strip("."), {})[shard_id] = weight.strip(".")
            return {name: [shards[at] for at in sorted(shards)] for name, shards in fused.items()}
    raise AssertionError(f"no stacked_params_mapping in {cls}.load_weights")


def expert_halves(tree: ast.Module, cls: str) -> tuple[str, str]:
    """(gate, up) checkpoint names CLS.load_weights hands fused_moe_make_expert_params_mapping."""
    for node in ast.walk(_method(tree, cls, "load_weights")):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "fused_moe_make_expert_params_mapping"):
            names = {keyword.arg: ast.literal_eval(keyword.value) for keyword in node.keywords
                     if keyword.arg in ("ckpt_gate_proj_name", "ckpt_up_proj_name")}
            return names["ckpt_gate_proj_name"], names["ckpt_up_proj_name"]
    raise AssertionError(f"{cls}.load_weights maps no routed experts")


def packed_mappings(tree: ast.Module) -> dict[str, dict]:
    """{class: its packed_modules_mapping} for every class that assigns one."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if (isinstance(item, (ast.Assign, ast.AnnAssign))
                        and "packed_modules_mapping" in [
                            target.id for target in (item.targets if isinstance(item, ast.Assign)
                                                     else [item.target])
                            if isinstance(target, ast.Name)]):
                    found[node.name] = ast.literal_eval(item.value)
    return found


def built_only_with(tree: ast.Module, cls: str, fused: str) -> set[str]:
    """The config attributes `self.X is not None` that guard CLS.__init__'s assignment of
    self.FUSED ({} when it is built unconditionally)."""
    guards = set()
    for node in ast.walk(_method(tree, cls, "__init__")):
        if isinstance(node, ast.If):
            assigns = [target for child in node.body if isinstance(child, ast.Assign)
                       for target in child.targets]
            if any(isinstance(target, ast.Attribute) and target.attr == fused
                   for target in assigns):
                test = node.test
                if (isinstance(test, ast.Compare) and isinstance(test.ops[0], ast.IsNot)
                        and isinstance(test.left, ast.Attribute)):
                    guards.add(test.left.attr)
    return guards


def differences(sources: dict[str, str]) -> list[str]:
    """How the tree's fused groups differ from recipekit/fused_groups.py; [] when they agree."""
    trees = {name: ast.parse(text) for name, text in sources.items()}
    table = {fused: list(shards) for fused, shards in merged_linears().items()}
    said = []
    main = stacked_mapping(trees["model"], "Glm5NextModel")
    if main != table:
        said.append(f"Glm5NextModel fuses {main}, the table says {table}")
    for fused, shards in stacked_mapping(trees["mtp"], "Glm5NextMTP").items():
        if table.get(fused) != shards:
            said.append(f"Glm5NextMTP fuses {fused} from {shards}, the table says "
                        f"{table.get(fused)}")
    for name, cls in (("model", "Glm5NextModel"), ("mtp", "Glm5NextMTP")):
        halves = expert_halves(trees[name], cls)
        if halves != EXPERTS.shards:
            said.append(f"{cls} fuses the routed experts' {halves} into w13, the table says "
                        f"{EXPERTS.shards}")
    for name, tree in trees.items():
        for cls, mapping in packed_mappings(tree).items():
            for fused, shards in mapping.items():
                if table.get(fused) != list(shards):
                    said.append(f"{cls}.packed_modules_mapping packs {fused} from {shards}, the "
                                f"table says {table.get(fused)}")
    for kind in KINDS:
        if kind.fused == "fused_qkv_a_proj":
            guards = built_only_with(trees["attention"], "Glm5NextMLAAttention", kind.fused)
            if guards != ({kind.needs_config} if kind.needs_config else set()):
                said.append(f"Glm5NextMLAAttention builds {kind.fused} only with {guards}, the "
                            f"table says {kind.needs_config!r}")
    return said


def read_sources(root, version: str) -> dict[str, str]:
    return {name: (root / GLM5NEXT[version] / file).read_text() for name, file in FILES.items()}


@pytest.fixture(scope="module")
def sources(release):
    return read_sources(release("0.30.0"), "0.30.0")


def test_the_table_is_what_the_pinned_tree_fuses(sources, release):
    assert differences(sources) == []
    assert differences(read_sources(release("0.33.0"), "0.33.0")) == []


def _replace(old: str, new: str):
    def plant(text: str) -> str:
        assert old in text, old
        return text.replace(old, new, 1)
    return plant


def _packed_in_causal_lm(text: str) -> str:
    """A packed_modules_mapping in Glm5NextForCausalLM that packs o_proj with kv_b_proj."""
    at = text.index("):\n", text.index("class Glm5NextForCausalLM(")) + len("):\n")
    return (text[:at] + '    packed_modules_mapping = {"o_kv_proj": ["o_proj", "kv_b_proj"]}\n'
            + text[at:])


@pytest.mark.parametrize("file, plant, says", [
    # a seventh KDA shard
    ("model", _replace('(".in_proj_qkvbfg_a", ".g_a_proj", 5),',
                       '(".in_proj_qkvbfg_a", ".g_a_proj", 5), '
                       '(".in_proj_qkvbfg_a", ".h_proj", 6),'),
     "Glm5NextModel fuses"),
    # q, k and v fused as a qkv_proj of their own
    ("model", _replace('(".in_proj_qkvbfg_a", ".q_proj", 0),', '(".qkv_proj", ".q_proj", 0),'),
     "Glm5NextModel fuses"),
    # the MTP fusing its gate/up under another name
    ("mtp", _replace('("gate_up_proj", "up_proj", 1),', '("gate_up_fused", "up_proj", 1),'),
     "Glm5NextMTP fuses gate_up_fused"),
    # the routed experts' up half under another checkpoint name
    ("model", _replace('ckpt_up_proj_name="up_proj"', 'ckpt_up_proj_name="w3"'),
     "Glm5NextModel fuses the routed experts' ('gate_proj', 'w3')"),
    ("model", _packed_in_causal_lm, "Glm5NextForCausalLM.packed_modules_mapping packs o_kv_proj"),
    # fused_qkv_a_proj built whatever the q_lora_rank
    ("attention", _replace("if self.q_lora_rank is not None:\n            self.fused_qkv_a_proj",
                           "if True:\n            self.fused_qkv_a_proj"),
     "Glm5NextMLAAttention builds fused_qkv_a_proj only with set()"),
])
def test_a_planted_change_in_the_tree_fails(sources, file, plant, says):
    planted = {**sources, file: plant(sources[file])}
    found = differences(planted)
    assert any(said.startswith(says) for said in found), found
