"""`slimrl dpo | orpo | kto`: help and defaults, user values win, early dataset errors, a 2-step run per trainer on a
tiny model that leaves the adapter, metrics and plot."""

import json

import pytest

from slimrl.cli import main
from slimrl.cli.preference_args import PREFERENCE_CLI_DEFAULTS, build_preference_parser, parse_preference_args


@pytest.fixture
def restore_trl():
    yield
    from slimrl import unpatch

    unpatch()


@pytest.mark.parametrize("algorithm", ["dpo", "orpo", "kto"])
def test_help_lists_config_fields_and_cli_defaults(algorithm, capsys):
    with pytest.raises(SystemExit) as exc:
        main([algorithm, "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for flag in (
        "--beta",
        "--learning_rate",
        "--max_length",
        "--model_name_or_path",
        "--lora_r",
        "--dataset_name",
        "--chosen_column" if algorithm != "kto" else "--label_column",
        "--config",
    ):
        assert flag in out, flag
    assert "slimrl CLI default: 5e-05 (TRL: 1e-06)" in out


def test_preference_defaults_user_values_and_output_dir():
    _, model_args, args = parse_preference_args("dpo", ["--bf16", "False"])
    for name, (value, _) in PREFERENCE_CLI_DEFAULTS.items():
        if name != "output_dir":
            got = getattr(args, name)
            assert got == value or str(got).endswith(str(value)), name
    assert args.output_dir == "outputs/slimrl-dpo-arithmetic" and model_args.model_name_or_path == "smollm2-135m"
    assert args.beta == 0.1  # TRL's own default is kept where the CLI has no reason to differ
    task_args, _, args = parse_preference_args(
        "kto", ["--bf16", "False", "--learning_rate", "1e-6", "--dataset_name", "data/prefs.jsonl"]
    )
    assert args.learning_rate == 1e-6 and args.output_dir == "outputs/slimrl-kto-prefs"
    with pytest.raises(ValueError, match="--max_operand"):
        parse_preference_args("dpo", ["--bf16", "False", "--dataset_name", "x.jsonl", "--max_operand", "5"])
    assert {a.dest for a in build_preference_parser("orpo")._actions} >= {"beta", "max_length", "num_examples"}


def test_dataset_errors_come_before_model_loading(tmp_path, restore_trl, capsys):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "hi", "chosen": "a"}) + "\n")
    assert (
        main(["dpo", "--bf16", "False", "--dataset_name", str(path), "--model_name_or_path", "/nonexistent/model"]) == 2
    )
    err = capsys.readouterr().err
    assert "--rejected_column" in err and "No model folder" not in err


@pytest.mark.parametrize("algorithm", ["dpo", "orpo", "kto"])
def test_two_step_run_leaves_adapter_metrics_plot(algorithm, tmp_path, restore_trl):
    from slimrl.testing import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "tiny")
    out = tmp_path / "run"
    assert (
        main(
            [
                algorithm,
                "--model_name_or_path",
                model_dir,
                "--max_steps",
                "2",
                "--per_device_train_batch_size",
                "2",
                "--num_train_samples",
                "8",
                "--num_eval_samples",
                "2",
                "--output_dir",
                str(out),
                "--seed",
                "1",
                "--disable_tqdm",
                "True",
            ]
        )
        == 0
    )
    for name in ("adapter_config.json", "adapter_model.safetensors", "metrics.jsonl", "eval.json", "slimrl_run.json"):
        assert (out / name).is_file(), name
    assert (out / "training_curves.png").read_bytes()[:4] == b"\x89PNG"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert "rewards/chosen" in steps[0] or "rewards/chosen_sum" in steps[0], sorted(steps[0])
    assert "peak_memory_gb" in steps[0]  # the patched trainer's metric: the run went through slimrl's paths
    summary = json.loads((out / "eval.json").read_text())
    run_info = json.loads((out / "slimrl_run.json").read_text())
    assert summary["eval_before"]["n"] == 2 and run_info["algorithm"] == algorithm


def test_fast_inference_is_refused_for_preference_commands():
    with pytest.raises(ValueError, match="--fast_inference.*slimrl grpo"):
        parse_preference_args("dpo", ["--bf16", "False", "--fast_inference"])
