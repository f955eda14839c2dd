"""Edit a module right after it is imported, before any other module binds its names: the
one import hook of the GPU tier's servers. tests/gpu/standin (Glm5Next's kernel stand-ins and
the hooks) and tests/gpu/remap (layer v13's weight groups on the tiny Qwen3 target) each
install it from their sitecustomize, which a server's PYTHONPATH names.

Each module named in the edits is imported as usual (its own finder and loader), then
handed to its edit; each edit runs once, and the hook leaves sys.meta_path once none is
left. Standard library only: it runs before anything else of the server.
"""

import importlib.abc
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def beside(file_name: str):
    """A module of tests/gpu/ loaded from its file (as gpu_<name>), without putting the folder
    on sys.path, where its files would stand in for packages of the same names."""
    spec = importlib.util.spec_from_file_location("gpu_" + file_name.removesuffix(".py"),
                                                  os.path.join(HERE, file_name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class EditOnImport(importlib.abc.MetaPathFinder):
    """EDITS: module name -> the function that edits that module once it is imported."""

    def __init__(self, edits: dict):
        self.pending = dict(edits)

    def find_spec(self, name, path, target=None):
        if name not in self.pending:
            return None
        edit = self.pending.pop(name)
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            if self.pending:
                sys.meta_path.insert(0, self)
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            edit(module)

        spec.loader.exec_module = exec_module
        return spec


def install(edits: dict) -> EditOnImport:
    """The hook, first on sys.meta_path, for EDITS (module name -> edit)."""
    finder = EditOnImport(edits)
    sys.meta_path.insert(0, finder)
    return finder
