"""The algorithm families by name, written once (every "is this algorithm one of ..." test imports from here).

Choices:
1. Names are the `PatchFastRL` / CLI spellings (lower case). A family is a tuple, in the order help texts list it.
2. Only families that more than one module asks about live here; a module with a one-off test of one name
   (`algorithm == "rloo"`) keeps it where it is read.
"""

from __future__ import annotations

ONLINE = ("grpo", "rloo")  # generate their rows each step (G completions per prompt), grouped-row levers apply
PAIRED = ("dpo", "orpo", "cpo")  # a chosen and a rejected row per example
UNPAIRED = ("kto",)  # one labelled row per example
NO_REFERENCE = ("orpo", "cpo")  # no reference model at all
SHARED_PREFIX = (*ONLINE, "dpo")  # slimrl's shared-prefix forwards apply
PLANNED = (*ONLINE, "dpo", "kto", "orpo", "cpo")  # `slimrl.plan` / `slimrl plan` and the longest-completion search
REWARD_FUNCTIONS = (*ONLINE, "online_dpo", "a2po")  # call reward functions on their own completions
CLI_PREFERENCE = ("dpo", "orpo", "kto")  # the `slimrl` preference commands (built-in preference data)
CLI_PLANNED = ("grpo", "dpo", "orpo", "kto")  # the training commands `slimrl plan` plans
