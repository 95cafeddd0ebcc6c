"""The longest completion a plan fits (slimrl.planning.longest): the scan's answer against the planner itself, called
once per length (brute force), on a shape whose planned peak is not monotonic in the length (auto row groups), and
the case where nothing fits."""

import json

import pytest

import slimrl
from slimrl.planning import levers, longest_completion, plan
from slimrl.planning.breakdown import GiB
from slimrl.testing import save_tiny_model, tiny_llama_config

needs_levers = pytest.mark.skipif(
    not levers.available(), reason="this slimrl has no row groups (slimrl.patches.setup.row_groups_rules)"
)
FIELDS = dict(per_device_train_batch_size=8, num_generations=8, max_completion_length=128)
KWARGS = dict(device="cuda", prompt_length=64, dtype="bfloat16", use_gradient_checkpointing=True)
# 0.5 GiB of CUDA context plus 115 MB: on this shape every length up to 384 fits, 512 does not, longer ones with fewer
# rows a group fit again, up to 3712 (see test_the_scan_finds_what_planning_every_length_finds)
DEVICE_GB = (2**29 + 115_000_000) / GiB
RESOLUTION, MAXIMUM = 128, 4096


def _config():
    return tiny_llama_config(hidden_size=256, intermediate_size=1024, num_layers=4, vocab_size=512)


def _brute_force(device_gb: float) -> list[int]:
    """Every length whose plan, made from scratch by slimrl.plan at that max_completion_length, fits."""
    config = _config()
    lengths = range(RESOLUTION, MAXIMUM + 1, RESOLUTION)
    return [
        c
        for c in lengths
        if plan(config, {**FIELDS, "max_completion_length": c}, "grpo", device_memory_gb=device_gb, **KWARGS).fits
    ]


@needs_levers
def test_the_scan_finds_what_planning_every_length_finds():
    fitting = _brute_force(DEVICE_GB)
    result = longest_completion(
        _config(), FIELDS, "grpo", resolution=RESOLUTION, maximum=MAXIMUM, device_memory_gb=DEVICE_GB, **KWARGS
    )
    assert result["longest_completion"] == max(fitting) == 3712
    # not monotonic: 512 needs 7 rows a group and does not fit, 640 (5 rows) does; a bisection would stop at 384
    assert 512 not in fitting and 640 in fitting
    assert result["contiguous"] == 384 < result["longest_completion"]
    assert result["group_rows"] == 1 and result["rows"] == 8 and result["prompt_length"] == 64
    assert result["peak_bytes"] <= result["device_bytes"] == int(DEVICE_GB * GiB)
    assert result["field"] == "max_completion_length" and result["value"] == 3712
    assert result["lengths_planned"] == MAXIMUM // RESOLUTION and not result["at_maximum"]
    assert "3,840 tokens plan" in result["reason"]


def test_a_device_that_holds_exactly_a_lengths_peak_fits_it_and_a_byte_less_does_not():
    config = _config()
    at = plan(config, {**FIELDS, "max_completion_length": 1024}, "grpo", device_memory_gb=1.0, **KWARGS).peak_bytes
    common = dict(resolution=1024, maximum=1024, **KWARGS)
    assert longest_completion(config, FIELDS, "grpo", device_memory_gb=at / GiB, **common)["longest_completion"] == 1024
    short = longest_completion(config, FIELDS, "grpo", device_memory_gb=(at - 1) / GiB, **common)
    assert short["longest_completion"] == 0


def test_a_device_too_small_for_one_step_says_so():
    """Negative control: 0.4 GiB is under the CUDA context alone."""
    result = longest_completion(_config(), FIELDS, "grpo", resolution=RESOLUTION, device_memory_gb=0.4, **KWARGS)
    assert result["longest_completion"] == 0 and result["contiguous"] == 0 and result["value"] == 0
    assert "no completion length fits" in result["reason"] and "0.40 GiB" in result["reason"]


def test_leaving_the_rollout_out_fits_longer_completions():
    """Qwen2.5-7B's shapes, 8 rows, 80 GiB: generating the rows (its KV cache) binds before the training phases do."""
    qwen = tiny_llama_config(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28, num_heads=28, num_kv_heads=4
    )
    common = dict(resolution=4096, maximum=1_048_576, device_memory_gb=80, **{**KWARGS, "prompt_length": 512})
    generated = longest_completion(qwen, FIELDS, "grpo", **common)
    given = longest_completion(qwen, FIELDS, "grpo", rollout=False, **common)
    assert given["longest_completion"] > generated["longest_completion"] > 0
    assert generated["peak_phase"] == "rollout" and given["rollout"] is False and given["peak_phase"] != "rollout"


@pytest.mark.parametrize("bad", [dict(resolution=0), dict(resolution=True), dict(resolution=4096, maximum=1024)])
def test_bad_scan_arguments_are_refused_before_planning(bad):
    with pytest.raises(ValueError, match="longest_completion: "):
        longest_completion("no such model", FIELDS, "grpo", **bad)


def test_slimrl_exports_it():
    assert slimrl.longest_completion is longest_completion


def test_plan_command_longest_prints_it_and_puts_it_in_the_json(tmp_path, capsys):
    from slimrl.cli import main

    model_dir = save_tiny_model(tmp_path / "tiny")
    argv = ["plan", "grpo", "--model_name_or_path", model_dir, "--bf16", "False", "--prompt_length", "32"]
    argv += ["--dtype", "float32", "--device", "cpu", "--longest", "--longest_resolution", "512"]
    assert main([*argv, "--longest_maximum", "4096", "--device_memory_gb", "64"]) == 0
    out = capsys.readouterr().out
    assert "longest completion that fits: 4,096 tokens" in out and "long-context levers" in out
    assert main([*argv, "--device_memory_gb", "0.1", "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["longest_completion"]["longest_completion"] == 0 and result["fits"] is False


def test_offline_algorithms_scan_max_length_minus_the_prompt():
    """DPO: the completion part of `max_length`; the answer is the field's value, prompt included."""
    config, prompt = _config(), 256
    common = dict(device="cuda", prompt_length=prompt, dtype="bfloat16", use_gradient_checkpointing=True)
    at = plan(config, {"max_length": prompt + 2048}, "dpo", device_memory_gb=1.0, **common).peak_bytes
    fits = [
        c
        for c in range(512, 8193, 512)
        if plan(config, {"max_length": prompt + c}, "dpo", device_memory_gb=at / GiB, **common).fits
    ]
    result = longest_completion(config, {}, "dpo", resolution=512, maximum=8192, device_memory_gb=at / GiB, **common)
    assert result["longest_completion"] == max(fits) >= 2048 and max(fits) < 8192
    assert result["field"] == "max_length" and result["value"] == prompt + max(fits)
