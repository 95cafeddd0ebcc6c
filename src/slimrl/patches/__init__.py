"""Explicit, reversible overrides of TRL seams. Every patch is listed in `registry.py`."""
