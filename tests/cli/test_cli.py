"""The `slimrl` CLI: help and defaults, TrlParser-style YAML config, early errors, a 2-step run on a tiny model,
generate against the saved adapter, doctor."""

import io
import json
import os

import pytest

from slimrl.cli import main
from slimrl.cli.args import CLI_DEFAULTS, build_grpo_parser, parse_grpo_args
from slimrl.state import config_state


@pytest.fixture
def restore_trl():
    yield
    try:
        from slimrl import unpatch

        unpatch()
    except ImportError:
        pass


def test_top_level_help_lists_commands(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("grpo", "generate", "chat", "doctor"):
        assert f"  {command}" in out
    assert main(["nope"]) == 2


@pytest.mark.parametrize("command", ["ppo", "online-dpo"])
def test_every_training_command_reaches_its_parser_through_main(command, capsys, restore_trl):
    from slimrl.cli import TRAINING_COMMANDS

    assert set(TRAINING_COMMANDS) == {"grpo", "ppo", "gkd", "online-dpo"}  # dpo/orpo/kto: one parser for the three
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"slimrl {command}" in out and "--config run.yaml sets defaults" in out and "[slimrl CLI default" in out


def test_grpo_help_shows_every_flag_with_its_default(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["grpo", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for flag in (
        "--learning_rate",
        "--num_generations",
        "--beta",
        "--model_name_or_path",
        "--lora_r",
        "--load_in_4bit",
        "--task",
        "--num_train_samples",
        "--seed",
        "--reward_funcs",
        "--config",
    ):
        assert flag in out, flag
    assert "slimrl CLI default: 0.0004 (TRL: 1e-06)" in out
    assert "(default: smollm2-135m)" in out
    import dataclasses

    from trl import GRPOConfig

    dests = {a.dest for a in build_grpo_parser()._actions}
    assert {f.name for f in dataclasses.fields(GRPOConfig) if f.init} <= dests


def test_cli_defaults_and_user_values_win():
    _, model_args, args = parse_grpo_args(["--bf16", "False"])
    for name, (value, _) in CLI_DEFAULTS.items():
        if name != "output_dir":
            got = getattr(args, name)
            assert got == value or str(got).endswith(str(value)), name
    assert args.output_dir == "outputs/slimrl-grpo-arithmetic"
    assert model_args.model_name_or_path == "smollm2-135m" and model_args.lora_r == 16
    # a value equal to TRL's own default is still the user's choice
    _, _, args = parse_grpo_args(
        [
            "--bf16",
            "False",
            "--learning_rate",
            "1e-6",
            "--beta",
            "0.0",
            "--gradient_checkpointing",
            "True",
            "--output_dir",
            "/tmp/x",
        ]
    )
    assert (args.learning_rate, args.beta, args.gradient_checkpointing, args.output_dir) == (1e-6, 0.0, True, "/tmp/x")
    task_args, _, args = parse_grpo_args(
        ["--bf16", "False", "--dataset_name", "data/my_set.jsonl", "--reward_funcs", "a.b", "c.py:d"]
    )
    assert args.output_dir == "outputs/slimrl-grpo-my_set" and task_args.reward_funcs == ["a.b", "c.py:d"]


def test_yaml_config_then_cli_override(tmp_path, monkeypatch):
    monkeypatch.delenv("SLIMRL_TEST_ENV", raising=False)
    config = tmp_path / "run.yaml"
    config.write_text(
        "learning_rate: 3.0e-4\nmax_steps: 7\nlora_r: 4\ntask: arithmetic\nbf16: false\n"
        "num_eval_samples: 5\nenv:\n  SLIMRL_TEST_ENV: hello\n"
    )
    task_args, model_args, args = parse_grpo_args(["--config", str(config), "--max_steps", "9", "--lora_r", "8"])
    assert args.learning_rate == 3e-4 and args.max_steps == 9 and model_args.lora_r == 8
    assert task_args.num_eval_samples == 5 and os.environ["SLIMRL_TEST_ENV"] == "hello"
    assert args.max_completion_length == CLI_DEFAULTS["max_completion_length"][0]  # untouched by the YAML
    bad = tmp_path / "bad.yaml"
    bad.write_text("not_a_flag: 1\nbf16: false\n")
    with pytest.raises(ValueError, match="not_a_flag"):
        parse_grpo_args(["--config", str(bad)])


@pytest.mark.parametrize(
    "flags, mode, config_flag",
    [
        (["--use_gradient_checkpointing", "offload"], "offload", True),
        (["--use_gradient_checkpointing", "Unsloth"], "offload", True),
        (["--use_gradient_checkpointing"], True, True),
        (["--use_gradient_checkpointing", "false"], False, False),
        ([], None, False),  # unset: follows --gradient_checkpointing (CLI default False)
        (["--use_gradient_checkpointing", "offload", "--gradient_checkpointing", "False"], "offload", False),
    ],
)
def test_use_gradient_checkpointing_flag(flags, mode, config_flag):
    """true/false/offload/unsloth through the models' one alias rule; the config's flag follows unless given."""
    _, model_args, args = parse_grpo_args(["--bf16", "False", *flags])
    assert model_args.use_gradient_checkpointing == mode and type(model_args.use_gradient_checkpointing) is type(mode)
    assert args.gradient_checkpointing is config_flag


def test_use_gradient_checkpointing_bad_value_and_yaml(tmp_path, capsys):
    assert main(["grpo", "--bf16", "False", "--use_gradient_checkpointing", "sometimes"]) == 2
    assert "use_gradient_checkpointing must be True, False, 'offload' or 'unsloth'" in capsys.readouterr().err
    config = tmp_path / "run.yaml"
    config.write_text("use_gradient_checkpointing: unsloth\nbf16: false\n")
    _, model_args, args = parse_grpo_args(["--config", str(config)])
    assert model_args.use_gradient_checkpointing == "offload" and args.gradient_checkpointing is True


def test_grpo_run_with_offload_checkpointing(tmp_path, restore_trl, recwarn):
    from slimrl.testing import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "tiny")
    flags = ["--max_steps", "1", "--max_completion_length", "6", "--per_device_train_batch_size", "4"]
    flags += ["--gradient_accumulation_steps", "1", "--num_generations", "4", "--num_train_samples", "8"]
    flags += ["--num_eval_samples", "0", "--plot", "False", "--output_dir", str(tmp_path / "run")]
    assert main(["grpo", "--model_name_or_path", model_dir, "--use_gradient_checkpointing", "offload", *flags]) == 0
    assert (tmp_path / "run" / "adapter_model.safetensors").is_file()
    assert not [w for w in recwarn if "overridden by" in str(w.message)]  # the config's flag followed the mode


def test_dataset_errors_come_before_model_loading(tmp_path, restore_trl, capsys):
    """Each fails on its data (one line, exit 2) before the (nonexistent) model is looked at."""
    cases = [
        (["--dataset_name", str(tmp_path / "missing.jsonl"), "--reward_funcs", "format_reward"], "not found"),
        (["--dataset_name", str(tmp_path / "x.jsonl"), "--reward_funcs", "no_such_pkg_q.reward"], "Could not import"),
        (["--reward_funcs", "format_reward"], "--dataset_name"),
    ]
    for flags, message in cases:
        assert main(["grpo", "--bf16", "False", *flags, "--model_name_or_path", "/nonexistent/model"]) == 2
        err = capsys.readouterr().err
        assert message in err and "No model folder" not in err, err


def test_two_step_run_leaves_adapter_metrics_plot_and_generate_works(tmp_path, restore_trl):
    from slimrl.testing import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "tiny")
    out = tmp_path / "run"
    assert (
        main(
            [
                "grpo",
                "--model_name_or_path",
                model_dir,
                "--max_steps",
                "2",
                "--max_completion_length",
                "8",
                "--per_device_train_batch_size",
                "4",
                "--gradient_accumulation_steps",
                "1",
                "--num_generations",
                "4",
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
    for name in ("adapter_config.json", "adapter_model.safetensors", "metrics.jsonl", "eval.json", "slimrl_run.json"):
        assert (out / name).is_file(), name
    png = out / "training_curves.png"
    assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step_rows = [r for r in rows if "reward" in r]
    assert [r["step"] for r in step_rows] == [1, 2]
    assert {"rewards/format_reward/mean", "rewards/correctness_reward/mean", "completions/mean_length"} <= set(
        step_rows[0]
    )
    assert "kl" not in step_rows[0]  # TRL's beta 0: no KL term, no reference forward
    summary = json.loads((out / "eval.json").read_text())
    assert summary["eval_before"]["n"] == 4 and 0.0 <= summary["accuracy_after"] <= 1.0

    from slimrl.cli import _small_parser
    from slimrl.cli.generate import run_generate

    args = _small_parser("generate").parse_args(["--adapter", str(out), "--max_new_tokens", "4", "What is 2 + 2?"])
    printed = []
    results = run_generate(args, output=printed.append)
    assert len(results) == 1 and set(results[0]) == {"adapter", "base"}
    assert printed[0] == ">>> What is 2 + 2?" and printed[1].startswith("[base]")
    chat = _small_parser("chat").parse_args(["--adapter", str(out), "--max_new_tokens", "2", "--no_base"])
    results = run_generate(chat, input_stream=io.StringIO("hello\nworld\n\n"), output=lambda s: None)
    assert len(results) == 2 and all(set(r) == {"adapter"} for r in results)


def test_doctor_reports_versions_and_optional_parts(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    for key in (
        "python",
        "torch",
        "transformers",
        "trl",
        "peft",
        "accelerate",
        "datasets",
        "slimrl",
        "device",
        "dtype",
        "vLLM",
        "bitsandbytes",
        "gguf",
        "embedded model",
        "sandbox for model-written code",
        "landlock",
        "model code",
    ):
        assert key in out, key


def test_only_given_flags_and_yaml_keys_count_as_user_settings(tmp_path):
    from slimrl.cli.args import parse_grpo_args

    config = tmp_path / "run.yaml"
    config.write_text("beta: 0.1\n")
    _, _, args = parse_grpo_args(["--bf16", "False", "--use_vllm=False", "--config", str(config)])
    assert config_state(args).user_fields == {"bf16", "use_vllm", "beta"}
