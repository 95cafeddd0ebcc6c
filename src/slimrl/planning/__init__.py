"""The memory planner: `plan(model, config)` predicts a training step's peak memory before anything is loaded,
`longest_completion(model, config)` the longest completion whose planned step fits (longest.py). plan.py: how terms
combine; terms.py: each term's formula; shapes.py / run.py: what is read from the configs."""

from .breakdown import MemoryPlan
from .longest import longest_completion
from .plan import plan

__all__ = ["MemoryPlan", "longest_completion", "plan"]
