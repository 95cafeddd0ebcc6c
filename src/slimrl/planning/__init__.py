"""The memory planner: `plan(model, config)` predicts a training step's peak memory before anything is loaded
(plan.py: how terms combine; terms.py: each term's formula; shapes.py / run.py: what is read from the configs)."""

from .breakdown import MemoryPlan
from .plan import plan

__all__ = ["MemoryPlan", "plan"]
