"""What one v8 change is, and the syntax-tree lookups its edits share.

A change edits one target file. A Python edit takes the parsed module and returns it
rewritten (``applied``) or untouched because the tree already has the change's shape
(``present``); it raises Drift when its target is there in a shape it does not know. A
change whose target this base does not have at all is ``skipped`` with the reason, which
the change decides from the tree before any edit runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import libcst as cst
import libcst.matchers as m

from recipekit.tree import TreeView


class Drift(Exception):
    """The target is there but not in the shape the change knows; ``str()`` says what was found."""


@dataclass
class Finding:
    """What one change found in one file: applied, present, skipped or refused, and why."""

    change: str
    status: str
    file: str
    detail: str

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Change:
    """One change of v8: its id, where it may live, what it does, and its edit."""

    id: str
    files: tuple[str, ...]  # where the target may live, in the order releases moved it
    summary: str
    edit: Callable  # (module or text) -> (module or text, present: bool, detail: str)
    skip_when: Callable[[TreeView], str | None] | None = None  # why this base does not need it
    # which of ``files`` hold the target on this tree (default: every one that exists)
    locate: Callable[[TreeView], list[str]] | None = None


def edited(
    module: cst.Module, chain: list[cst.CSTNode], old: cst.CSTNode, new: cst.CSTNode
) -> cst.Module:
    """``module`` with ``old`` replaced by ``new``.

    ``chain`` is the top-level statement holding ``old``, then the definitions nested in it
    down to the one holding ``old``: only the innermost is searched (LibCST's deep_replace
    walks every node, seconds on FlashInfer's 4,000-line module), the rest is rebuilt.
    """
    replacement = chain[-1].deep_replace(old, new)
    for parent, child in zip(reversed(chain[:-1]), reversed(chain[1:])):
        replacement = _with_child(parent, child, replacement)
    return _with_child(module, chain[0], replacement)


def _with_child(parent: cst.CSTNode, child: cst.CSTNode, new: cst.CSTNode) -> cst.CSTNode:
    if isinstance(parent, cst.Module):
        return parent.with_changes(body=[new if node is child else node for node in parent.body])
    block = parent.body
    return parent.with_changes(
        body=block.with_changes(body=[new if n is child else n for n in block.body])
    )


def code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node).strip()


def top_function(module: cst.Module, name: str) -> cst.FunctionDef:
    found = [n for n in module.body if m.matches(n, m.FunctionDef(name=m.Name(name)))]
    if len(found) != 1:
        raise Drift(f"expected one module-level function {name}, found {len(found)}")
    return found[0]


def top_class(module: cst.Module, name: str) -> cst.ClassDef:
    found = [n for n in module.body if m.matches(n, m.ClassDef(name=m.Name(name)))]
    if len(found) != 1:
        raise Drift(f"expected one class {name}, found {len(found)}")
    return found[0]


def method(cls: cst.ClassDef, name: str) -> cst.FunctionDef:
    found = [n for n in cls.body.body if m.matches(n, m.FunctionDef(name=m.Name(name)))]
    if len(found) != 1:
        raise Drift(f"expected one method {cls.name.value}.{name}, found {len(found)}")
    return found[0]


def only(found: list, what: str) -> cst.CSTNode:
    if len(found) != 1:
        raise Drift(f"expected one {what}, found {len(found)}")
    return found[0]


def int_tuple(*values: int) -> m.Tuple:
    """A matcher of the tuple literal ``(v1, v2, ...)``, exactly."""
    return m.Tuple(elements=[m.Element(value=m.Integer(str(v))) for v in values])


def dotted(*names: str) -> m.BaseMatcherNode:
    """A matcher of the attribute chain ``a.b.c``."""
    node: m.BaseMatcherNode = m.Name(names[0])
    for name in names[1:]:
        node = m.Attribute(value=node, attr=m.Name(name))
    return node


def compare(left: m.BaseMatcherNode, operator: m.BaseMatcherNode, right: m.BaseMatcherNode):
    return m.Comparison(
        left=left, comparisons=[m.ComparisonTarget(operator=operator, comparator=right)]
    )


def class_has_member(module: cst.Module, cls_name: str, member: str) -> bool:
    """Whether class ``cls_name`` assigns ``member`` at its top level (an enum member)."""
    for cls in module.body:
        if m.matches(cls, m.ClassDef(name=m.Name(cls_name))):
            assign = m.SimpleStatementLine(
                body=[m.Assign(targets=[m.AssignTarget(target=m.Name(member))])]
            )
            return any(m.matches(line, assign) for line in cls.body.body)
    return False
