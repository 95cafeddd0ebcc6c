"""The plan's "long-context levers" block (slimrl.planning.levers.describe): each lever on or off as the settings and
the lengths make it, with the reason."""

import pytest

from slimrl.planning import levers, plan
from slimrl.testing import tiny_llama_config

needs_levers = pytest.mark.skipif(
    not levers.available(), reason="this slimrl has no row groups or tiled MLP (slimrl.patches.setup.row_groups_rules)"
)
FIELDS = dict(per_device_train_batch_size=8, num_generations=8, max_completion_length=8192)
COMMON = dict(device="cuda", device_memory_gb=80, prompt_length=512, dtype="bfloat16")


def _block(fields=(), algorithm="grpo", **kwargs) -> dict[str, str]:
    text = str(plan(tiny_llama_config(), {**FIELDS, **dict(fields)}, algorithm, **{**COMMON, **kwargs}))
    lines = text.split("  long-context levers\n", 1)[1].splitlines()
    return {line[4:18].strip(): line[18:] for line in lines if line.startswith("    ") and line[4] != " "}


@needs_levers
def test_defaults_say_what_auto_chose_at_these_lengths():
    block = _block(use_gradient_checkpointing=True)
    assert block["row groups"].startswith("on: 1 of 8 rows") and "8,704" in block["row groups"]
    assert block["tiled MLP"].startswith("off: auto: tiles calls of")  # a 32-wide MLP is never large
    assert block["offload"].startswith("off: opt-in")
    assert block["padding-free"].startswith("on (auto")


@needs_levers
def test_settings_switch_them_and_the_block_follows():
    fields = dict(slimrl_rows_per_group=False, slimrl_tiled_mlp=True, slimrl_padding_free=False)
    block = _block(fields, use_gradient_checkpointing="offload")
    assert block["row groups"] == "off: slimrl_rows_per_group=False: TRL's one forward"
    assert block["tiled MLP"].startswith("on: slimrl_tiled_mlp=True: shards of 32 tokens")
    assert block["offload"].startswith("on: block inputs in host memory")
    assert block["padding-free"] == "off: slimrl_padding_free=False"
    # one row a group: 8,704 tokens x 32 x 2 B = 0.53 MiB a block input, under the offloader's 1 MiB: nothing moves
    assert _block(use_gradient_checkpointing="offload")["offload"].startswith("on, moving nothing")


@needs_levers
def test_the_block_says_what_a_step_on_that_device_decides():
    """One owner of the decision: the plan's lines are slimrl.models.long_context's reasons for its device and sizes;
    the main job's size on a CPU plans row groups and padding-free off, long rows on a CPU plan them on."""
    from slimrl.models import long_context

    short = dict(per_device_train_batch_size=8, num_generations=8, max_completion_length=16)
    block = _block(short, device="cpu", prompt_length=114, dtype="float32", use_gradient_checkpointing=False)
    choice = long_context.row_groups_choice("auto", "cpu", 8, 130)
    assert not choice.on and block["row groups"] == f"off: {choice.reason}"
    assert block["row groups"] == "off: auto: off on CPU, a forward of 8 rows x 130 tokens = 1,040 below 4,096"
    assert block["padding-free"].startswith("off: auto: off on CPU")
    assert plan(tiny_llama_config(), {**FIELDS, **short}, "grpo", device="cpu", prompt_length=114).run.policy_rows == 8
    long = _block(device="cpu", dtype="float32", use_gradient_checkpointing=True)
    assert long["row groups"].startswith("on: 1 of 8 rows") and long["padding-free"].startswith("on (auto")


def test_offline_algorithms_have_no_row_groups():
    block = _block({"max_length": 1024}, "dpo", use_gradient_checkpointing=False)
    assert block["row groups"].startswith("off: TRL's one forward") and block["tiled MLP"] == "off"
    assert block["offload"] == "off: no gradient checkpointing (nothing saved to offload)"
