"""Decode benchmark and receipts for an OpenAI-compatible server (vLLM first)."""
