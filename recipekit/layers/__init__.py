"""Image layers: the chain's order (LAYERS) and each layer's patcher, by name."""

from __future__ import annotations

import importlib

from recipekit.layer import EXIT_CODES, Layer, LayerResult, LayerSetupError, run_layer

__all__ = ["EXIT_CODES", "LAYERS", "PATCHERS", "Layer", "LayerResult", "LayerSetupError", "load_layer", "run_layer"]

LAYERS = ("v8", "v9", "v10", "v11", "v13")
# Patchers that run inside an image layer after the layer's own, named LAYER_*: its
# Dockerfile lists them (docker/Dockerfile.sm121-v8 runs v8, then v8_moe_scales,
# v8_linear_scales and v8_api_key; -v11 runs v11, then v11_dflash_block_drop; -v13 runs v13,
# then v13_weights).
PATCHERS = (*LAYERS, "v8_moe_scales", "v8_linear_scales", "v8_api_key", "v11_dflash_block_drop",
            "v13_weights")


def load_layer(name: str, **options) -> Layer:
    if name not in PATCHERS:
        raise LayerSetupError(f"unknown layer {name!r}; layers: {', '.join(PATCHERS)}")
    module = importlib.import_module(f"recipekit.layers.{name}")
    return module.build(**options)
