"""Shared logic of the GLM-5.3-Flash DGX Spark recipe: sources, patches, layers, drafters."""
