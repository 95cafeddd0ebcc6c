"""`slimrl online-dpo`: every OnlineDPOConfig field is a flag, CLI defaults marked and overridable, rewards from the
arithmetic task or a pairwise judge (`--judge arithmetic`, or a user class), and a 2-step run on a tiny model leaves
the adapter, metrics (TRL's online DPO names, slimrl's peak memory), plot, eval and run info."""

import dataclasses
import json

import pytest

from slimrl.cli import main
from slimrl.cli.online_dpo import ONLINE_DPO_CLI_DEFAULTS, build_parser, parse_args
from slimrl.state import user_fields
from slimrl.tasks.judges import ArithmeticJudge, load_judge, question_result

FLAGS = ["--bf16", "False"]


@pytest.fixture
def restore_trl():
    yield
    from slimrl import unpatch

    unpatch()


def test_help_lists_every_online_dpo_field_and_the_cli_defaults(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["online-dpo", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for flag in ("--max_new_tokens", "--missing_eos_penalty", "--loss_type", "--judge", "--reward_funcs", "--lora_r"):
        assert flag in out, flag
    assert "slimrl CLI default: 16 (TRL: 64)" in out
    from trl.experimental.online_dpo import OnlineDPOConfig

    dests = {a.dest for a in build_parser()._actions}
    assert {f.name for f in dataclasses.fields(OnlineDPOConfig) if f.init} <= dests


def test_cli_defaults_user_values_and_refusals(restore_trl):
    from slimrl.cli.online_dpo import apply_patches

    apply_patches()  # as the command does: the patched config resolves bf16 for this device
    task_args, _, args = parse_args(FLAGS)
    for name, (value, _) in ONLINE_DPO_CLI_DEFAULTS.items():
        if name != "output_dir":
            assert getattr(args, name) == value, name
    assert args.output_dir == "outputs/slimrl-online-dpo-arithmetic" and task_args.judge is None
    _, _, args = parse_args([*FLAGS, "--beta", "0.2", "--max_steps", "5", "--output_dir", "/tmp/x"])
    assert (args.beta, args.max_steps) == (0.2, 5)
    assert user_fields(args) == {"bf16", "beta", "max_steps", "output_dir"}
    with pytest.raises(ValueError, match="--judge and --reward_funcs"):
        parse_args([*FLAGS, "--judge", "arithmetic", "--reward_funcs", "format_reward"])
    with pytest.raises(ValueError, match="--fast_inference"):
        parse_args([*FLAGS, "--fast_inference"])


def test_arithmetic_judge_prefers_the_right_then_the_well_formed_answer():
    prompt = "system: answer\nuser: What is 2 + 2?\nassistant: <answer>4</answer>\nuser: What is 7 + 5?"
    assert question_result(prompt) == 12 and question_result("hello") is None
    judge = ArithmeticJudge()
    pairs = [
        ["<answer>11</answer>", "<answer>12</answer>"],  # right answer second
        ["<answer>12</answer>", "12"],  # right first
        ["twelve", "<answer>3</answer>"],  # neither right: the well-formed one
        ["<answer>1</answer>", "<answer>2</answer>"],  # tie: the first
    ]
    assert judge.judge([prompt] * 4, pairs) == [1, 0, 1, 0]
    assert isinstance(load_judge("arithmetic"), ArithmeticJudge)
    with pytest.raises(ValueError, match="built-in judges: arithmetic"):
        load_judge("nope")


def _run(tmp_path, *extra):
    from slimrl.testing import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "tiny")
    out = tmp_path / "run"
    argv = ["online-dpo", "--model_name_or_path", str(model_dir), "--max_steps", "2", "--max_new_tokens", "8"]
    argv += ["--per_device_train_batch_size", "2", "--num_train_samples", "8", "--num_eval_samples", "4"]
    argv += ["--output_dir", str(out), "--seed", "1", *extra]
    assert main(argv) == 0
    return out


@pytest.mark.parametrize("ranked_by", ["rewards", "judge"])
def test_two_step_run_leaves_adapter_metrics_plot_eval(tmp_path, restore_trl, ranked_by):
    out = _run(tmp_path, *(["--judge", "arithmetic"] if ranked_by == "judge" else []))
    for name in ("adapter_config.json", "adapter_model.safetensors", "metrics.jsonl", "eval.json", "slimrl_run.json"):
        assert (out / name).is_file(), name
    assert (out / "training_curves.png").read_bytes()[:4] == b"\x89PNG"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "objective/kl" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert {"objective/scores", "rewards/margins", "rewards/accuracies", "logps/chosen", "peak_memory_gb"} <= set(
        steps[0]
    )
    if ranked_by == "judge":  # one of each pair scores 1, the other 0
        assert all(r["objective/scores"] == 0.5 for r in steps)
    summary = json.loads((out / "eval.json").read_text())
    assert summary["eval_before"]["n"] == 4 and 0.0 <= summary["accuracy_after"] <= 1.0
    run_info = json.loads((out / "slimrl_run.json").read_text())
    assert run_info["algorithm"] == "online_dpo" and run_info["ranked_by"].startswith(ranked_by[:-1])
