"""Explicit, reversible overrides of TRL seams. Every patch is listed in `registry.py`.

The root holds what every patch goes through (registry, seams, auto, on_import, compat, family); the rooms hold one
kind of module each, with its rule in its own docstring: trainers/ (what each trainer gets), setup/ (when a config or
trainer is built), scoring/ (inside a step's forwards), rollouts/ (generation and rewards).
"""
