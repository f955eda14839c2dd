"""Layer v10: Glm5Next hands an EAGLE3-style drafter (DFlash) its auxiliary hidden states.

Adds vLLM's EAGLE3 aux-hidden-state interface to Glm5Next: ``EagleModelMixin`` on
``Glm5NextModel``, ``SupportsEagle3`` on both outer classes, and a capture in
``Glm5NextModel.forward`` before every tapped layer and after the last one. The
capture itself (materialise the deferred ``hc_post``, contract the streams, gather
under sequence parallelism) lives in our helper module ``mhc_aux_capture``.
"""

from __future__ import annotations

import ast

import libcst as cst

from recipekit.codepatch import (
    PATCHES_DIR,
    StepLog,
    code_of,
    dotted,
    ensure_base,
    ensure_import_names,
    ensure_relative_import,
    find_class,
    find_method,
    replace_top_level,
    statement,
)
from recipekit.exact_patch import PatchRefused
from recipekit.layers.glm5next import PACKAGE, Glm5NextPatchLayer
from recipekit.tree import TreeView

TARGET = f"{PACKAGE}/nvidia/model.py"
HELPER = f"{PACKAGE}/nvidia/mhc_aux_capture.py"

_CAPTURE = (
    "capture_aux_hidden_state(self, {idx}, hidden_states, residual, post, comb, full_num_tokens)"
)
_LOOP = (
    "for idx, layer in enumerate(self._active_layers, start=self.start_layer):\n"
    "    if idx in self.aux_hidden_state_layers:\n"
    f"        aux_hidden_states.append({_CAPTURE.format(idx='idx')})\n"
    "    pass\n"
)
_FINAL_CAPTURE = (
    "if self.end_layer in self.aux_hidden_state_layers:\n"
    f"    aux_hidden_states.append({_CAPTURE.format(idx='self.end_layer')})\n"
)
_AUX_RETURN = "if aux_hidden_states:\n    return hidden_states, aux_hidden_states\n"


def _is_layer_loop(node: cst.CSTNode) -> bool:
    """``for layer in self._active_layers: hidden_states, residual, post, comb = layer(...)``."""
    if not (isinstance(node, cst.For) and isinstance(node.target, cst.Name)):
        return False
    body = node.body.body
    call_assign = body[-1] if body else None
    return (
        node.target.value == "layer"
        and dotted(node.iter) == "self._active_layers"
        and isinstance(call_assign, cst.SimpleStatementLine)
        and isinstance(call_assign.body[0], cst.Assign)
        and "hidden_states, residual, post, comb = layer(" in code_of(call_assign)
    )


def _is_patched_loop(node: cst.CSTNode) -> bool:
    return (
        isinstance(node, cst.For)
        and isinstance(node.iter, cst.Call)
        and dotted(node.iter.func) == "enumerate"
        and "capture_aux_hidden_state(" in code_of(node)
    )


def _is_pp_early_return(node: cst.CSTNode) -> bool:
    return (
        isinstance(node, cst.If)
        and code_of(node.test).strip() == "not get_pp_group().is_last_rank"
        and "return IntermediateTensors(" in code_of(node)
    )


def _rewrite_forward(forward: cst.FunctionDef, log: StepLog) -> cst.FunctionDef:
    body = list(forward.body.body)
    where = f"{TARGET}: Glm5NextModel.forward"
    if not any("full_num_tokens = positions.shape[0]" in code_of(s) for s in body):
        raise PatchRefused(f"{where}: `full_num_tokens = positions.shape[0]` not found; the base drifted")

    loops = [i for i, s in enumerate(body) if _is_layer_loop(s) or _is_patched_loop(s)]
    if len(loops) != 1:
        raise PatchRefused(f"{where}: expected one `for layer in self._active_layers` loop, found {len(loops)}")
    at = loops[0]
    patched = _is_patched_loop(body[at])
    log.record("capture before tapped layers", patched)
    if not patched:
        template = statement(_LOOP)
        assert isinstance(template, cst.For)
        call_assign = body[at].body.body[-1]
        new_body = list(template.body.body[:-1]) + [call_assign]
        loop = template.with_changes(body=template.body.with_changes(body=new_body))
        declare = statement("aux_hidden_states: list[torch.Tensor] = []\n")
        declare = declare.with_changes(leading_lines=body[at].leading_lines)
        body[at : at + 1] = [declare, loop]

    early = [i for i, s in enumerate(body) if _is_pp_early_return(s)]
    if len(early) != 1:
        raise PatchRefused(f"{where}: the `if not get_pp_group().is_last_rank` return not found")
    final_capture = statement(_FINAL_CAPTURE)
    present = early[0] + 1 < len(body) and body[early[0] + 1].deep_equals(final_capture)
    log.record("capture after the last layer", present)
    if not present:
        body.insert(early[0] + 1, final_capture)

    last = body[-1]
    if not (isinstance(last, cst.SimpleStatementLine) and code_of(last).strip() == "return hidden_states"):
        raise PatchRefused(f"{where}: does not end with `return hidden_states`; the base drifted")
    aux_return = statement(_AUX_RETURN)
    present = len(body) > 1 and body[-2].deep_equals(aux_return)
    log.record("return aux hidden states", present)
    if not present:
        body.insert(len(body) - 1, aux_return)
    return forward.with_changes(body=forward.body.with_changes(body=body))


class Glm5NextAuxHiddenStates(Glm5NextPatchLayer):
    name = "v10"
    target = TARGET
    helper_source = PATCHES_DIR / "v10" / "mhc_aux_capture.py"
    helper_target = HELPER

    def rewrite(self, module: cst.Module, log: StepLog) -> cst.Module:
        module = ensure_import_names(
            module, "vllm.model_executor.models.interfaces",
            ["EagleModelMixin", "SupportsEagle3"], log, "import the EAGLE3 interface", TARGET,
        )
        module = ensure_relative_import(
            module, "attention", "from .mhc_aux_capture import capture_aux_hidden_state\n",
            log, "import the capture helper", TARGET,
        )
        model = find_class(module, "Glm5NextModel", TARGET)
        forward = find_method(model, "forward", TARGET)
        new_model = ensure_base(model, "EagleModelMixin", log, "Glm5NextModel is an EagleModelMixin")
        new_model = new_model.deep_replace(
            find_method(new_model, "forward", TARGET), _rewrite_forward(forward, log)
        )
        module = replace_top_level(module, model, new_model)
        for outer in ("Glm5NextForCausalLM", "Glm5NextForConditionalGeneration"):
            cls = find_class(module, outer, TARGET)
            module = replace_top_level(
                module,
                cls, ensure_base(cls, "SupportsEagle3", log, f"{outer} supports EAGLE3")
            )
        return module

    def missing_capability(self, view: TreeView) -> list[str]:
        return _eagle3_problems(view, TARGET)

    def provided_by_base(self, view: TreeView) -> str | None:
        if not view.exists(f"{PACKAGE}/__init__.py"):
            return None
        for candidate in sorted(_model_files(view)):
            if candidate != TARGET and not _eagle3_problems(view, candidate):
                return (
                    f"the base's own Glm5Next ({candidate}) already implements EAGLE3 aux "
                    "hidden states (EagleModelMixin, SupportsEagle3, capture in forward)"
                )
        return None


def _model_files(view: TreeView) -> list[str]:
    root = view.root / PACKAGE
    return [str(p.relative_to(view.root)) for p in root.glob("*/model.py")] if root.is_dir() else []


def _eagle3_problems(view: TreeView, relative: str) -> list[str]:
    """What the file at ``relative`` lacks of the EAGLE3 aux interface on Glm5Next."""
    source = view.read_text(relative)
    if source is None:
        return [f"{relative} is missing"]
    classes = {n.name: n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)}
    problems = []
    wanted = {
        "Glm5NextModel": "EagleModelMixin",
        "Glm5NextForCausalLM": "SupportsEagle3",
        "Glm5NextForConditionalGeneration": "SupportsEagle3",
    }
    for cls, base in wanted.items():
        node = classes.get(cls)
        if node is None or base not in {ast.unparse(b) for b in node.bases}:
            problems.append(f"{relative}: {cls} does not derive from {base}")
    model = classes.get("Glm5NextModel")
    forward = next((f for f in model.body if getattr(f, "name", "") == "forward"), None) if model else None
    if forward is None or "aux_hidden_state_layers" not in ast.unparse(forward):
        problems.append(f"{relative}: Glm5NextModel.forward captures no aux hidden states")
    return problems


def build(**_: object) -> Glm5NextAuxHiddenStates:
    return Glm5NextAuxHiddenStates()
