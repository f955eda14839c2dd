"""Drafter preparation: read a DFlash2 drafter snapshot, bound it, and derive what vLLM serves."""
