"""The command's face (slimrl.cli.face): a user error is one line naming the fix and exit code 2, the traceback only
under a bare --debug; known library noise stays off the screen; a short run's eval is scaled down and says so;
`slimrl doctor` names the training dtype and the machine's load."""

import types
import warnings

import pytest

from slimrl.cli import face, main
from slimrl.cli.parsing import resolve_eval_samples


def test_user_error_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "run.yaml"
    bad.write_text("lerning_rate: 2e-4\nmax_steps: 1\n")
    assert main(["grpo", "--config", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == (
        "slimrl grpo: error: unknown key(s) in the --config file: lerning_rate (did you mean "
        "learning_rate, logging_strategy?). Every key must be a flag of this command (see --help)."
    )
    assert err[1] == "(run with --debug for the traceback)" and len(err) == 2


@pytest.mark.parametrize("command", ["dpo", "grpo", "ppo"])
def test_missing_model_path_is_a_user_error(command, tmp_path, capsys):
    code = main(
        [
            command,
            "--model_name_or_path",
            str(tmp_path / "nowhere"),
            "--max_steps",
            "1",
            "--num_eval_samples",
            "0",
            "--output_dir",
            str(tmp_path / "out"),
        ]
    )
    assert code == 2 and "No model folder or file at" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing is written before the inputs check


def test_the_output_folder_is_made_once_the_model_loaded(tmp_path, monkeypatch, capsys):
    """The control of the test above: the same command, the model loading (stubbed), makes the folder."""
    import slimrl.cli.modeling as modeling
    import slimrl.cli.training_run as training_run

    monkeypatch.setattr(modeling, "load_base", lambda *args, **kwargs: (object(), object()))
    monkeypatch.setattr(modeling, "add_lora", lambda model, *args: model)

    def stop(*args, **kwargs):
        raise ValueError("stopped after loading")

    monkeypatch.setattr(training_run, "evaluate_task", stop)
    argv = ["dpo", "--max_steps", "1", "--num_eval_samples", "0", "--output_dir", str(tmp_path / "out")]
    assert main(argv) == 2 and "stopped after loading" in capsys.readouterr().err
    assert (tmp_path / "out").is_dir()


def test_unsupported_versions_stop_the_command_in_one_line(monkeypatch, capsys):
    from slimrl import versions

    monkeypatch.setattr(versions, "problems", lambda table: ["trl 0.9.0 is installed; slimrl supports trl>=1.16,<2"])
    assert main(["grpo", "--max_steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("slimrl grpo: error: slimrl cannot run on these library versions: trl 0.9.0")


@pytest.mark.parametrize("error", [ValueError, OSError, ImportError, NotImplementedError])
def test_every_user_error_kind_is_one_line(error, monkeypatch, capsys):
    import slimrl.cli as cli

    def fail(command, rest):
        raise error("load_in_8bit=True is not supported by slimrl; use load_in_4bit=True or neither.")

    monkeypatch.setattr(cli, "_dispatch", fail)
    assert main(["generate", "--adapter", "x", "hi"]) == 2
    assert "error: load_in_8bit=True is not supported" in capsys.readouterr().err
    monkeypatch.setattr(cli, "_dispatch", lambda command, rest: 1 / 0)  # a bug, not a user error: the traceback
    with pytest.raises(ZeroDivisionError):
        main(["generate", "--adapter", "x", "hi"])


def test_debug_shows_the_traceback(tmp_path):
    bad = tmp_path / "run.yaml"
    bad.write_text("lerning_rate: 2e-4\n")
    with pytest.raises(ValueError, match="unknown key"):
        main(["grpo", "--debug", "--config", str(bad)])


def test_bare_debug_is_slimrls_but_a_debug_mode_is_trainings(monkeypatch):
    monkeypatch.delenv("SLIMRL_DEBUG", raising=False)
    argv = ["grpo", "--debug", "--max_steps", "1"]
    assert face.take_debug_flag(argv) and argv == ["grpo", "--max_steps", "1"]
    argv = ["grpo", "--debug", "underflow_overflow"]
    assert not face.take_debug_flag(argv) and argv == ["grpo", "--debug", "underflow_overflow"]


def test_known_noise_is_silenced_and_restored():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with face.quiet_known_noise():
            warnings.warn(
                "`gradient_checkpointing` is deprecated, use `activation_checkpointing`", FutureWarning, stacklevel=1
            )
            warnings.warn("'pin_memory' argument is set as true but no accelerator is found", UserWarning, stacklevel=1)
            warnings.warn("something else", UserWarning, stacklevel=1)  # negative control: other warnings show
        warnings.warn("`gradient_checkpointing` is deprecated, outside", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["something else", "`gradient_checkpointing` is deprecated, outside"]


@pytest.mark.parametrize(
    "given, max_steps, expected",
    [(None, 3, 16), (None, 10, 40), (None, 30, 128), (None, -1, 128), (128, 3, 128), (0, 3, 0)],
)
def test_short_runs_evaluate_fewer_prompts_unless_told(given, max_steps, expected, capsys):
    task = types.SimpleNamespace(num_eval_samples=given)
    resolve_eval_samples(task, max_steps)
    assert task.num_eval_samples == expected
    said = capsys.readouterr().out
    assert ("--num_eval_samples 128 for the full eval, 0 to skip it" in said) == (given is None and 0 < max_steps < 30)


def test_doctor_names_dtype_and_load(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "dtype" in out and ("weights (" in out or "autocast" in out)
    assert "load average" in out or "cuda" in out


def test_slimrl_fields_are_flags_validated_by_their_owners():
    from slimrl.cli.args import parse_grpo_args
    from slimrl.cli.grpo import apply_patches
    from slimrl.cli.preference_args import parse_preference_args

    apply_patches()
    _, _, args = parse_grpo_args(["--slimrl_num_chunks", "3", "--slimrl_reward_errors", "skip", "--bf16", "False"])
    assert (args.slimrl_num_chunks, args.slimrl_reward_errors) == (3, "skip")
    with pytest.raises(ValueError, match=r"slimrl_num_chunks must be -1 \(automatic\) or an integer >= 1, got 0"):
        parse_grpo_args(["--slimrl_num_chunks", "0", "--bf16", "False"])
    with pytest.raises(ValueError, match="invalid choice: 'ignore'"):  # argparse's own choices check
        parse_grpo_args(["--slimrl_reward_errors", "ignore", "--bf16", "False"])
    from slimrl.cli.preference import apply_patches as apply_preference_patches

    apply_preference_patches("dpo")
    _, _, args = parse_preference_args("dpo", ["--slimrl_num_chunks", "2", "--bf16", "False"])
    assert args.slimrl_num_chunks == 2 and not hasattr(args, "slimrl_reward_errors")


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["grpo", "--lerning_rate", "1e-4"], "unknown flag(s): --lerning_rate (did you mean --learning_rate?)"),
        (["grpo", "--num_generation", "4"], "ambiguous option: --num_generation could match --num_generations"),
        (["grpo", "--learning_rate", "abc"], "invalid float value: 'abc'"),
        (["generate", "--adaptr", "x"], "--adaptr (did you mean --adapter?)"),
    ],
)
def test_a_bad_flag_is_one_line_with_the_closest_flag_and_no_usage(argv, expected, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 2 and expected in err[0] and "usage:" not in captured.err + captured.out
    assert err[0].endswith(f"`slimrl {argv[0]} --help` lists every flag with its default.")


def test_the_corrected_flag_parses():
    from slimrl.cli.args import parse_grpo_args

    _, _, args = parse_grpo_args(["--learning_rate", "1e-4", "--num_generations", "4", "--bf16", "False"])
    assert (args.learning_rate, args.num_generations) == (1e-4, 4)


def test_batch_geometry_error_says_where_the_generation_batch_comes_from(capsys):
    argv = ["grpo", "--num_generations", "3", "--per_device_train_batch_size", "8", "--bf16", "False"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "per_device_train_batch_size (8) × gradient_accumulation_steps (2) × world size (1) = 16" in err
    assert "steps_per_generation 3 (generation batch 24" in err and "per_device_train_batch_size in [3, 6" in err
    assert "gradient_accumulation_steps 2 is the `slimrl grpo` default (TRL's: 1); --gradient_accumulation_steps" in err
    # the user's own accumulation is not called a default
    assert main([*argv, "--gradient_accumulation_steps", "2"]) == 2
    err = capsys.readouterr().err
    assert "= 16, is not divisible by num_generations (3)" in err and "default" not in err


def test_the_evaluation_says_it_starts_on_stderr(monkeypatch, capsys):
    import slimrl.cli.evaluate as evaluate
    import slimrl.cli.modeling as modeling
    from slimrl.cli.training_run import evaluate_task

    monkeypatch.setattr(modeling, "set_inference", lambda model, on: None)
    monkeypatch.setattr(evaluate, "evaluate_accuracy", lambda *args: {"accuracy": 0.5, "n": 3})
    task = types.SimpleNamespace(eval_dataset=[0, 1, 2], accuracy_reward=len)
    task_args = types.SimpleNamespace(num_eval_samples=3, eval_batch_size=32)
    assert evaluate_task(None, None, task, task_args, 16, "before")["accuracy"] == 0.5
    captured = capsys.readouterr()
    assert captured.err == "[slimrl] evaluating before: 3 held-out prompts, greedy, up to 16 new tokens each ...\n"
    assert captured.out.startswith("[slimrl] eval accuracy before: 0.500 on 3 held-out prompts")
    task_args.num_eval_samples = 0  # control: no evaluation, no line
    assert evaluate_task(None, None, task, task_args, 16, "before") is None and capsys.readouterr().err == ""
