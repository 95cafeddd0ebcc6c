"""`slimrl gkd`: help and defaults, the teacher and dataset errors before any model loads, a 2-step run on tiny models
(a wider random teacher of the same vocabulary, and a teacher given as an adapter folder) that leaves the adapter,
metrics, plot and the teacher's accuracy."""

import json

import pytest

from slimrl.cli import main
from slimrl.cli.gkd import GKD_CLI_DEFAULTS, parse_gkd_args


@pytest.fixture
def restore_trl():
    yield
    from slimrl import unpatch

    unpatch()


def test_help_lists_config_fields_teacher_flags_and_cli_defaults(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["gkd", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for flag in ("--beta", "--lmbda", "--temperature", "--teacher_adapter", "--teacher_model", "--lora_r", "--config"):
        assert flag in out, flag
    assert "slimrl CLI default: 0.0002" in out


def test_defaults_and_user_values():
    _, model_args, args = parse_gkd_args(["--bf16", "False", "--teacher_model", "smollm2-135m"])
    for name, (value, _) in GKD_CLI_DEFAULTS.items():
        if name != "output_dir":
            got = getattr(args, name)
            assert got == value or str(got).endswith(str(value)), name
    assert args.output_dir == "outputs/slimrl-gkd-arithmetic" and model_args.model_name_or_path == "smollm2-135m"
    assert (args.beta, args.lmbda) == (0.5, 0.5)  # TRL's own defaults kept
    _, _, args = parse_gkd_args(["--bf16", "False", "--teacher_model", "x", "--lmbda", "0", "--max_steps", "3"])
    assert (args.lmbda, args.max_steps) == (0.0, 3)


@pytest.mark.parametrize(
    "flags, says",
    [
        ([], "neither"),
        (["--teacher_model", "a", "--teacher_adapter", "b"], "both"),
        (["--teacher_adapter", "/nonexistent/adapter"], "holds no adapter"),
        (["--teacher_model", "a", "--dataset_name", "x.jsonl"], "--dataset_name"),
        (["--teacher_model", "a", "--fast_inference"], "--fast_inference"),
    ],
)
def test_bad_teacher_or_options_fail_before_loading(flags, says, restore_trl, capsys):
    assert main(["gkd", "--bf16", "False", "--model_name_or_path", "/nonexistent/model", *flags]) == 2
    err = capsys.readouterr().err
    assert says in err and "No model folder" not in err


def _run(tmp_path, teacher_flags):
    from slimrl.testing import save_tiny_model

    out = tmp_path / "run"
    argv = ["gkd", "--model_name_or_path", save_tiny_model(tmp_path / "student"), *teacher_flags]
    argv += ["--max_steps", "2", "--per_device_train_batch_size", "2", "--num_train_samples", "8"]
    argv += ["--num_eval_samples", "2", "--max_new_tokens", "4", "--output_dir", str(out), "--seed", "1"]
    assert main([*argv, "--disable_tqdm", "True"]) == 0
    return out


def test_two_step_run_with_a_wider_teacher_leaves_adapter_metrics_plot(tmp_path, restore_trl):
    from slimrl.testing import save_tiny_model

    teacher = save_tiny_model(tmp_path / "teacher", seed=3, hidden_size=48)
    out = _run(tmp_path, ["--teacher_model", teacher, "--lmbda", "0.5"])
    for name in ("adapter_config.json", "adapter_model.safetensors", "metrics.jsonl", "eval.json", "slimrl_run.json"):
        assert (out / name).is_file(), name
    assert (out / "training_curves.png").read_bytes()[:4] == b"\x89PNG"
    steps = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2] and "peak_memory_gb" in steps[0]  # slimrl's paths ran
    summary = json.loads((out / "eval.json").read_text())
    assert summary["eval_before"]["n"] == summary["eval_teacher"]["n"] == 2
    run_info = json.loads((out / "slimrl_run.json").read_text())
    assert run_info["algorithm"] == "gkd" and run_info["teacher"] == teacher


def test_teacher_given_as_an_adapter_folder(tmp_path, restore_trl):
    """An adapter folder (as `slimrl grpo` writes) on a base of the student's vocabulary is merged into the teacher."""
    from peft import get_peft_model

    from slimrl.testing import save_tiny_model

    import _tiny as T

    base = save_tiny_model(tmp_path / "teacher_base", seed=5)
    from transformers import AutoModelForCausalLM

    adapter = tmp_path / "teacher_adapter"
    get_peft_model(AutoModelForCausalLM.from_pretrained(base), T.lora_config()).save_pretrained(adapter)
    out = _run(tmp_path, ["--teacher_adapter", str(adapter), "--lmbda", "0"])
    run_info = json.loads((out / "slimrl_run.json").read_text())
    assert run_info["teacher"].endswith(f"+ {adapter}")
