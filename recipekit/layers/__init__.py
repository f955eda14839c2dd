"""Image layers: the chain's order (LAYERS) and each layer's patcher, by name."""

from __future__ import annotations

import importlib

from recipekit.layer import EXIT_CODES, Layer, LayerResult, LayerSetupError, run_layer

__all__ = ["EXIT_CODES", "LAYERS", "Layer", "LayerResult", "LayerSetupError", "load_layer", "run_layer"]

LAYERS = ("v8", "v9", "v10", "v11")


def load_layer(name: str, **options) -> Layer:
    if name not in LAYERS:
        raise LayerSetupError(f"unknown layer {name!r}; layers: {', '.join(LAYERS)}")
    module = importlib.import_module(f"recipekit.layers.{name}")
    return module.build(**options)
