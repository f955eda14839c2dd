"""A read-only view of a vLLM source tree, optionally with planned edits laid over it.

Probes and verification read through this view, so a layer can be checked against
the files it would write without writing them (``--check``), and a refusal leaves
the tree untouched.
"""

from __future__ import annotations

from pathlib import Path


class TreeView:
    """Files under ``root`` (the directory holding ``vllm/``), overlaid by ``overlay``."""

    def __init__(self, root: Path, overlay: dict[str, bytes | None] | None = None) -> None:
        self.root = Path(root)
        self.overlay = dict(overlay or {})

    def with_overlay(self, edits: dict[str, bytes | None]) -> TreeView:
        merged = dict(self.overlay)
        merged.update(edits)
        return TreeView(self.root, merged)

    def exists(self, relative: str) -> bool:
        if relative in self.overlay:
            return self.overlay[relative] is not None
        return (self.root / relative).is_file()

    def is_package(self, relative_dir: str) -> bool:
        return self.exists(f"{relative_dir}/__init__.py")

    def read_text(self, relative: str) -> str | None:
        if relative in self.overlay:
            content = self.overlay[relative]
            return None if content is None else content.decode("utf-8")
        try:
            return (self.root / relative).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def module_file(self, dotted: str) -> str | None:
        """The file defining module ``dotted`` (``vllm.a.b``), or None."""
        base = dotted.replace(".", "/")
        for candidate in (f"{base}.py", f"{base}/__init__.py"):
            if self.exists(candidate):
                return candidate
        return None
