"""What "auto" decides for each long-context lever (slimrl.models.long_context), from the device and the sizes at
hand: the main job's size on a CPU keeps TRL's forward, long rows on a CPU and any size on CUDA turn the levers on, an
explicit setting applies whatever the size."""

import pytest

from slimrl.models import long_context as LC

MAIN_JOB = (8, 130)  # bare `slimrl grpo`: 8 rows a micro-batch, prompt + 16 new tokens of about 130 tokens
LONG = (8, 1088)  # bench/long_context_cpu.py's rows: groups took the working memory to 0.58x on a CPU

ROW_GROUPS = [  # setting, device, (rows, width), on, reason
    ("auto", "cpu", MAIN_JOB, False, "auto: off on CPU, a forward of 8 rows x 130 tokens = 1,040 below 4,096"),
    ("auto", "cpu", LONG, True, "auto: groups of up to 4,096 tokens, fewer where free memory is short"),
    ("auto", "cpu", (1, 4096), True, "auto: groups of up to 4,096 tokens, fewer where free memory is short"),
    ("auto", "cpu", (1, 4095), False, "auto: off on CPU, a forward of 1 rows x 4,095 tokens = 4,095 below 4,096"),
    ("auto", "cuda", MAIN_JOB, True, "auto: groups of up to 4,096 tokens, fewer where free memory is short"),
    (False, "cuda", LONG, False, "slimrl_rows_per_group=False: TRL's one forward"),
    (2, "cpu", MAIN_JOB, True, "slimrl_rows_per_group=2: 2 rows a group"),
]


@pytest.mark.parametrize("setting, device, size, on, reason", ROW_GROUPS)
def test_row_groups(setting, device, size, on, reason):
    assert LC.row_groups_choice(setting, device, *size) == LC.Choice(on, reason)


PADDING_FREE = [  # setting, device, (rows, width), rows setting, on, reason starts with
    ("auto", "cpu", MAIN_JOB, "auto", False, "auto: off on CPU, a forward of 8 rows x 130 tokens = 1,040 below"),
    ("auto", "cpu", MAIN_JOB, 1, True, "auto: on, the rows are scored in groups (slimrl_rows_per_group=1"),
    ("auto", "cpu", LONG, "auto", True, "auto: all-padding columns skipped"),
    ("auto", "cuda", MAIN_JOB, False, True, "auto: all-padding columns skipped"),
    (True, "cpu", MAIN_JOB, False, True, "slimrl_padding_free=True"),
    (False, "cuda", LONG, "auto", False, "slimrl_padding_free=False"),
]


@pytest.mark.parametrize("setting, device, size, rows_setting, on, reason", PADDING_FREE)
def test_padding_free(setting, device, size, rows_setting, on, reason):
    choice = LC.padding_free_choice(setting, device, *size, rows_setting)
    assert choice.on is on and choice.reason.startswith(reason), choice


SMOLLM2 = (576, 1536)  # hidden, intermediate: "auto" tiles fp32 calls from 4 GiB / (4 x 1536 x 4 B) = 174,762 tokens
TILED = [  # setting, tokens, on, reason
    ("auto", 1040, False, "auto: tiles calls of 174,762 tokens or more, the largest holds 1,040"),
    ("auto", 200_000, True, "auto: shards of 576 tokens, calls of 200,000 tokens reach 174,762"),
    (True, 1040, True, "slimrl_tiled_mlp=True: shards of 576 tokens"),
    (2048, 1040, False, "slimrl_tiled_mlp=2048: a call of 1,040 tokens is one shard"),
    (False, 200_000, False, "slimrl_tiled_mlp=False"),
]


@pytest.mark.parametrize("setting, tokens, on, reason", TILED)
def test_tiled_mlp(setting, tokens, on, reason):
    assert LC.tiled_mlp_choice(setting, *SMOLLM2, tokens, 4) == LC.Choice(on, reason)


def test_the_threshold_is_the_row_group_budget():
    """Below the budget a forward is one group unless free memory splits it: the case measured slower on a CPU."""
    from slimrl.ops.row_groups import AUTO_GROUP_TOKENS

    assert LC.CPU_MIN_FORWARD_TOKENS == AUTO_GROUP_TOKENS
    assert str(LC.Choice(False, "why")) == "off (why)" and str(LC.before_a_forward("f", "auto")).startswith("undecided")
