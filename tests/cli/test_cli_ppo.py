"""`slimrl ppo`: every PPOConfig field is a flag, CLI defaults marked and overridable, the score is the task's
correctness reward, and a 2-step run on a tiny model leaves the adapter, metrics (TRL's PPO names), plot, eval and
run info, which `slimrl generate` reads."""

import dataclasses
import json

import pytest

from slimrl.cli import main
from slimrl.cli.ppo import PPO_CLI_DEFAULTS, build_ppo_parser, parse_ppo_args
from slimrl.state import user_fields


@pytest.fixture
def restore_trl():
    yield
    from slimrl import unpatch

    unpatch()


def test_help_lists_every_ppo_field_and_the_cli_defaults(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["ppo", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for flag in (
        "--num_ppo_epochs",
        "--kl_coef",
        "--kl_estimator",
        "--cliprange_value",
        "--response_length",
        "--model_name_or_path",
        "--lora_r",
        "--task",
        "--dataset_name",
        "--config",
        "--slimrl_num_chunks",
    ):
        assert flag in out, flag
    assert "slimrl CLI default: 0.0001 (TRL: 5e-05)" in out
    from slimrl.ppo import PPOConfig

    dests = {a.dest for a in build_ppo_parser()._actions}
    assert {f.name for f in dataclasses.fields(PPOConfig) if f.init} <= dests


def test_cli_defaults_user_values_and_output_dir():
    _, model_args, args = parse_ppo_args(["--bf16", "False"])
    for name, (value, _) in PPO_CLI_DEFAULTS.items():
        if name != "output_dir":
            assert getattr(args, name) == value or str(getattr(args, name)).endswith(str(value)), name
    assert args.output_dir == "outputs/slimrl-ppo-arithmetic" and model_args.model_name_or_path == "smollm2-135m"
    assert args.kl_coef == 0.05 and args.cliprange == 0.2  # TRL's PPO defaults where the CLI has no reason to differ
    _, _, args = parse_ppo_args(
        ["--bf16", "False", "--num_ppo_epochs", "4", "--learning_rate", "5e-5", "--output_dir", "/tmp/x"]
    )
    assert (args.num_ppo_epochs, args.learning_rate, args.output_dir) == (4, 5e-5, "/tmp/x")
    assert user_fields(args) == {"bf16", "num_ppo_epochs", "learning_rate", "output_dir"}


def test_two_step_run_leaves_adapter_metrics_plot_eval(tmp_path, restore_trl):
    from slimrl.testing import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "tiny")
    out = tmp_path / "run"
    assert (
        main(
            [
                "ppo",
                "--model_name_or_path",
                model_dir,
                "--max_steps",
                "2",
                "--response_length",
                "8",
                "--per_device_train_batch_size",
                "4",
                "--gradient_accumulation_steps",
                "1",
                "--num_train_samples",
                "16",
                "--num_eval_samples",
                "4",
                "--output_dir",
                str(out),
                "--seed",
                "1",
            ]
        )
        == 0
    )
    for name in (
        "adapter_config.json",
        "adapter_model.safetensors",
        "metrics.jsonl",
        "eval.json",
        "slimrl_run.json",
        "slimrl_ppo_value.safetensors",
    ):
        assert (out / name).is_file(), name
    assert (out / "training_curves.png").read_bytes()[:4] == b"\x89PNG"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss/policy_avg" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert {
        "objective/scores",
        "objective/kl",
        "objective/rlhf_reward",
        "policy/approxkl_avg",
        "loss/value_avg",
        "val/ratio",
        "peak_memory_gb",
        "episode",
    } <= set(steps[0])
    summary = json.loads((out / "eval.json").read_text())
    assert summary["eval_before"]["n"] == 4 and 0.0 <= summary["accuracy_after"] <= 1.0
    run_info = json.loads((out / "slimrl_run.json").read_text())
    assert run_info["algorithm"] == "ppo" and run_info["task"] == "arithmetic"

    from slimrl.cli import _small_parser
    from slimrl.cli.generate import run_generate

    args = _small_parser("generate").parse_args(["--adapter", str(out), "--max_new_tokens", "4", "What is 2 + 2?"])
    results = run_generate(args, output=lambda s: None)
    assert len(results) == 1 and set(results[0]) == {"adapter", "base"}


def test_a_bad_value_is_one_line_naming_the_field(capsys):
    assert main(["ppo", "--bf16", "False", "--cliprange", "0"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("slimrl ppo: error: PPOConfig: cliprange=0.0 is out of range (allowed: > 0)")
        and "Traceback" not in err
    )
    assert main(["ppo", "--bf16", "False", "--slimrl_num_chunks", "0"]) == 2
    assert "slimrl_num_chunks must be -1 (automatic) or an integer >= 1" in capsys.readouterr().err
