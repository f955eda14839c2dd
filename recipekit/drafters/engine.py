"""The vLLM that will serve the drafter, and the causality rule its DFlash code applies.

prepare-drafter runs where the engine runs (the launcher starts it in the serving
image), so the rule is read from that engine's own source, not assumed: vLLM 0.28.0
and later, and every base the v9 layer patches, read a top-level ``is_causal`` first
in ``_dflash_layer_causal``; older code reads only ``dflash_config.causal``. The
vLLM package is found without importing it (no torch needed).
"""

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from .errors import Refused, UsageError

DFLASH = Path("vllm/model_executor/models/qwen3_dflash.py")


@dataclass(frozen=True)
class CausalityRule:
    reads_is_causal: bool
    source: str  # where the rule was read, or why it is assumed

    def describe(self):
        order = "top-level is_causal, then " if self.reads_is_causal else ""
        return f"{order}dflash_config.causal, then sliding layers causal ({self.source})"


def find_vllm_root(explicit=None):
    """The directory holding vllm/: ``explicit`` (that directory or vllm/ itself), else the
    vllm package this Python would import, else None."""
    if explicit is not None:
        root = Path(explicit)
        if (root / "__init__.py").is_file() and root.name == "vllm":
            root = root.parent
        if not (root / "vllm" / "__init__.py").is_file():
            raise UsageError(f"--vllm-root {explicit}: no vllm/__init__.py there; pass the directory holding vllm/")
        return root
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def causality_rule(root):
    """The rule the engine at ``root`` applies; without an engine, the rule of vLLM with DFlash2."""
    if root is None:
        return CausalityRule(True, "no vLLM here: as vLLM with DFlash2 (0.28.0+, or layer v9) resolves it")
    path = root / DFLASH
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise Refused(path, "qwen3_dflash.py", "missing", "the serving vLLM must have DFlash",
                      "serve from the recipe's image (layer v9 and later)") from None
    function = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_dflash_layer_causal"), None)
    if function is None:
        raise Refused(path, "_dflash_layer_causal", "missing", "the serving vLLM must resolve DFlash causality",
                      "serve from the recipe's image (layer v9 and later)")
    reads = any(
        isinstance(node, ast.Call) and ast.unparse(node.func) == "getattr" and len(node.args) > 1
        and getattr(node.args[1], "value", None) == "is_causal"
        for node in ast.walk(function)
    )
    return CausalityRule(reads, f"read from {path}")
