"""What "auto" decides for each long-context lever, from the device and the sizes at hand, and why: the one owner of
that decision, asked by the patched trainers at run time (patches/scoring/row_groups.py) and by the memory planner
(planning/levers.py), so `slimrl plan` and a step agree. Each answer is a `Choice`: on or off, and a short reason
that `slimrl.describe(trainer)` and the plan print.

Choices, and why:
1. Sizes: a forward of `rows` rows padded to `width` tokens holds `rows x width` tokens, what TRL's one forward over
   those rows would hold. The levers avoid tensors that grow with it.
2. Row groups (`slimrl_rows_per_group="auto"`) on a CPU: on only for forwards of at least `CPU_MIN_FORWARD_TOKENS`
   tokens. Below that a forward fits one group of the token budget (slimrl.ops.row_groups.AUTO_GROUP_TOKENS) and
   groups could only come from the free-memory cap, which splits the rows into forwards too small to use the
   cores, with nothing saved. Measured at the main job's size (bare `slimrl grpo`: micro-batches of 8 rows of 130
   tokens, one thread, bench/cpu_levers.py, bench/results/committed/cpu_levers.json): with 512 MiB of free memory
   read, "auto" scored each micro-batch in 2 groups and the policy forwards of a step took 9.8 s against 5.1 s
   with the levers off (medians of 4 interleaved pairs, each pair the same way), at the same working memory
   (932 MiB both); with ample free memory it formed one group, as off. At 8 rows of 1088 tokens groups took the
   working memory to 0.58x and the step from 87 to 63 s (bench/long_context_cpu.py). On CUDA: the rule of
   slimrl.ops.row_groups unchanged (the budget, capped by free memory), not measured otherwise.
3. Padding-free forwards (`slimrl_padding_free="auto"`) on a CPU: on from the same `CPU_MIN_FORWARD_TOKENS`, or
   where the rows are scored in groups (an explicit number of rows): a group of similar rows is where most padding
   is whole columns. Below it, ungrouped, the columns they could drop are a few hundred tokens' worth, and TRL's
   forward runs as stock. On CUDA: on, as before (the dropout rule of patches/setup/row_groups_rules.py applies on every
   device).
4. Tiled MLP (`slimrl_tiled_mlp="auto"`): slimrl.models.tiled_mlp's size rule on every device (it already waits for
   calls whose MLP tensors reach 4 GiB: 175K tokens for SmolLM2-135M in fp32); this module gives its reason.
5. An explicit setting (a number of rows, True, a shard size) is on and False is off, whatever the sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

AUTO = "auto"
CPU_MIN_FORWARD_TOKENS = 4096  # choices 2 and 3: a CPU forward below this runs as TRL's under "auto"
STATES = {True: "on", False: "off", None: "undecided"}


@dataclass(frozen=True)
class Choice:
    """One lever's decision: `on`, and why (a short line for describe() and the plan)."""

    on: bool | None  # None: "auto" before any forward (decided per forward)
    reason: str

    def __str__(self) -> str:
        return f"{STATES[self.on]} ({self.reason})"


def before_a_forward(field: str, setting) -> Choice:
    """What a lever set to `setting` is before any forward has been decided on."""
    if setting is False:
        return Choice(False, f"{field}=False")
    if setting == AUTO:
        return Choice(None, "auto: decided per forward from the device and the forward's size; none yet")
    return Choice(True, f"{field}={setting!r}")


def _forward(rows: int, width: int) -> str:
    return f"a forward of {rows} rows x {width:,} tokens = {rows * width:,}"


def row_groups_choice(setting, device: str, rows: int, width: int) -> Choice:
    """Row groups for a forward of `rows` rows of `width` tokens on `device` ("cpu", "cuda", ...) (choice 2)."""
    from ..ops.row_groups import AUTO_GROUP_TOKENS, ROWS_FIELD

    if setting is False:
        return Choice(False, f"{ROWS_FIELD}=False: TRL's one forward")
    if setting != AUTO:
        return Choice(True, f"{ROWS_FIELD}={setting}: {setting} rows a group")
    if device == "cpu" and rows * width < CPU_MIN_FORWARD_TOKENS:
        return Choice(False, f"auto: off on CPU, {_forward(rows, width)} below {CPU_MIN_FORWARD_TOKENS:,}")
    return Choice(True, f"auto: groups of up to {AUTO_GROUP_TOKENS:,} tokens, fewer where free memory is short")


def padding_free_choice(setting, device: str, rows: int, width: int, rows_setting=False) -> Choice:
    """Padding-free forwards for a forward of `rows` rows of `width` tokens on `device`, whose rows are grouped by
    `rows_setting` (choice 3)."""
    from ..ops.row_groups import PADDING_FREE_FIELD

    if setting is False or setting is True:
        return Choice(setting, f"{PADDING_FREE_FIELD}={setting}")
    if device == "cpu" and rows * width < CPU_MIN_FORWARD_TOKENS:
        groups = row_groups_choice(rows_setting, device, rows, width)
        if not groups.on:
            return Choice(False, f"auto: off on CPU, {_forward(rows, width)} below {CPU_MIN_FORWARD_TOKENS:,}")
        return Choice(True, f"auto: on, the rows are scored in groups ({groups.reason})")
    return Choice(True, "auto: all-padding columns skipped unless dropout is active")


def tiled_mlp_choice(setting, hidden: int, intermediate: int, tokens: int, activation_bytes: int) -> Choice:
    """The tiled MLP for a call of `tokens` tokens (choice 4): slimrl.models.tiled_mlp's rule, with its reason."""
    from .tiled_mlp import TILED_MLP_FIELD, TiledMLPState, auto_threshold_tokens

    if setting is False:
        return Choice(False, f"{TILED_MLP_FIELD}=False")
    shard = TiledMLPState(setting, hidden, intermediate).shard_tokens(tokens, activation_bytes)
    if setting != AUTO:
        done = f"shards of {shard:,} tokens" if shard else f"a call of {tokens:,} tokens is one shard"
        return Choice(bool(shard), f"{TILED_MLP_FIELD}={setting}: {done}")
    start = max(hidden + 1, auto_threshold_tokens(intermediate, activation_bytes))
    if shard:
        return Choice(True, f"auto: shards of {shard:,} tokens, calls of {tokens:,} tokens reach {start:,}")
    return Choice(False, f"auto: tiles calls of {start:,} tokens or more, the largest holds {tokens:,}")
