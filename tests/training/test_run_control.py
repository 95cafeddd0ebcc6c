"""The training commands' run control (slimrl.cli.run_control): --resume [DIR], --max_memory_gb, the resume line,
and metrics.jsonl across a resume; the slow test stops a real `slimrl grpo` process with SIGTERM and resumes it
with the command it printed."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from slimrl.cli.args import parse_grpo_args
from slimrl.cli.run_control import resume_command

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src")


def _checkpoint(folder, step, complete=True):
    from _checkpoint_files import write_checkpoint

    path = folder / f"checkpoint-{step}"
    if complete:
        return write_checkpoint(path)
    path.mkdir(parents=True)
    return path


def test_resume_alone_takes_the_newest_complete_checkpoint_of_output_dir(tmp_path):
    out = tmp_path / "run"
    _checkpoint(out, 2)
    _checkpoint(out, 10)
    _checkpoint(out, 12, complete=False)  # killed while saving: skipped
    _, _, args = parse_grpo_args(["--bf16", "False", "--output_dir", str(out), "--resume"])
    assert args.resume_from_checkpoint == str(out / "checkpoint-10")


def test_resume_dir_moves_a_default_output_dir_but_not_a_given_one(tmp_path, capsys):
    out = tmp_path / "run"
    checkpoint = _checkpoint(out, 3)
    _, _, args = parse_grpo_args(["--bf16", "False", "--resume", str(out)])
    assert args.output_dir == str(out) and args.resume_from_checkpoint == str(checkpoint)
    assert "output_dir outputs/slimrl-grpo-arithmetic -> " in capsys.readouterr().out
    _, _, args = parse_grpo_args(
        ["--bf16", "False", "--output_dir", str(tmp_path / "new"), "--resume", str(checkpoint)]
    )
    assert args.output_dir == str(tmp_path / "new") and args.resume_from_checkpoint == str(checkpoint)


def test_resume_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no complete checkpoint-N folder"):
        parse_grpo_args(["--bf16", "False", "--output_dir", str(tmp_path), "--resume"])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        parse_grpo_args(["--bf16", "False", "--resume", str(tmp_path / "missing")])
    _checkpoint(tmp_path, 1)
    with pytest.raises(ValueError, match="--resume and --resume_from_checkpoint both given"):
        parse_grpo_args(
            [
                "--bf16",
                "False",
                "--output_dir",
                str(tmp_path),
                "--resume",
                "--resume_from_checkpoint",
                str(tmp_path / "checkpoint-1"),
            ]
        )


@pytest.mark.parametrize("command", ["ppo", "dpo"])
def test_every_training_command_resumes_under_its_own_name(command, tmp_path):
    from slimrl.cli.ppo import parse_ppo_args
    from slimrl.cli.preference_args import parse_preference_args

    out = tmp_path / "run"
    _checkpoint(out, 4)
    argv = ["--bf16", "False", "--output_dir", str(out), "--resume"]
    task, _, args = parse_ppo_args(argv) if command == "ppo" else parse_preference_args(command, argv)
    assert args.resume_from_checkpoint == str(out / "checkpoint-4")
    assert task.resume_command == f"slimrl {command} --bf16 False --output_dir {out} --resume {out}"


def test_max_memory_gb_reaches_the_config_and_is_validated():
    _, _, args = parse_grpo_args(["--bf16", "False", "--max_memory_gb", "3.5"])
    assert args.slimrl_max_memory_gb == 3.5
    with pytest.raises(ValueError, match="slimrl_max_memory_gb must be a positive number"):
        parse_grpo_args(["--bf16", "False", "--max_memory_gb", "0"])


@pytest.mark.parametrize(
    "argv",
    [
        ["--max_steps", "9", "--resume"],
        ["--max_steps", "9", "--resume", "old/run"],
        ["--resume=old", "--max_steps", "9"],
        ["--resume_from_checkpoint", "old/checkpoint-2", "--max_steps", "9"],
        ["--max_steps", "9"],
    ],
)
def test_resume_command_repeats_the_flags_with_one_resume(argv):
    command = resume_command("dpo", argv, "out dir")
    assert shlex.split(command) == ["slimrl", "dpo", "--max_steps", "9", "--resume", "out dir"]


@pytest.mark.parametrize(
    "flags, private",
    [
        ([], True),
        (["--public"], False),
        (["--hub_private_repo", "False"], False),
        (["--hub_private_repo", "True"], True),
    ],
)
def test_hub_pushes_are_private_unless_public(flags, private):
    _, _, args = parse_grpo_args(["--bf16", "False", "--push_to_hub", "True", "--hub_model_id", "me/x", *flags])
    assert args.hub_private_repo is private


def test_public_and_private_together_is_an_error():
    with pytest.raises(ValueError, match="--public and --hub_private_repo True both given"):
        parse_grpo_args(["--bf16", "False", "--public", "--hub_private_repo", "True"])


TOKEN = "hf_" + "aB3" * 12  # Hub-token shaped


@pytest.mark.parametrize(
    "secret",
    [
        ["--hub_token", TOKEN],
        [f"--hub_token={TOKEN}"],
        ["--token", "plain-looking-value"],
        ["--wandb_api_key", "0123456789abcdef"],
        ["--db-password", "hunter2"],
    ],
)
def test_resume_command_leaves_secrets_out_and_says_which(secret):
    command = resume_command("grpo", ["--max_steps", "9", *secret, "--seed", "3"], "out")
    value = secret[-1].split("=", 1)[-1]
    assert value not in command and "hf_" not in command
    flag = secret[0].split("=", 1)[0]
    assert command.endswith(
        f"# left out (secret): {flag}; pass again, or let the Hub client use HF_TOKEN / hf auth login"
    )
    words = shlex.split(command, comments=True)  # what a shell runs when the line is pasted
    assert words == ["slimrl", "grpo", "--max_steps", "9", "--seed", "3", "--resume", "out"]


def test_resume_command_redacts_credential_shaped_values_and_keeps_special_tokens():
    argv = ["--pad_token", "<pad>", "--stop_token", "eos", "--hub_model_id", "me/x", "--run_name", f"x-{TOKEN}"]
    words = shlex.split(resume_command("grpo", argv, "out"), comments=True)
    assert words[:8] == ["slimrl", "grpo", "--pad_token", "<pad>", "--stop_token", "eos", "--hub_model_id", "me/x"]
    assert words[8:10] == ["--run_name", "x-REDACTED"]  # a value shaped like a Hub token, in any flag
    assert "# left out" not in resume_command("grpo", argv, "out")  # negative control: nothing secret by name


def test_the_interrupt_line_prints_no_secret_and_survives_braces(capfd):
    from slimrl.training.interrupt import SafeInterrupt

    hint = resume_command("grpo", ["--hub_token", TOKEN, "--chat_template", "{{ messages }}"], "out")
    interrupt = SafeInterrupt(exit=False, resume_hint=hint, signals=())
    interrupt.signum, interrupt.stopped_at, interrupt.checkpoint = 15, 2, "out/checkpoint-2"
    interrupt.on_train_end(SimpleNamespace(output_dir="out"), SimpleNamespace(max_steps=9), None)
    line = capfd.readouterr().err  # written straight to file descriptor 2 (safe inside a signal handler)
    assert "stopped by SIGTERM after step 2/9" in line and TOKEN not in line
    assert "--chat_template '{{ messages }}' --resume out  # left out (secret): --hub_token" in line


def test_metrics_file_keeps_the_rows_up_to_the_resumed_step(tmp_path):
    from slimrl.cli.callbacks import JsonlMetricsCallback, read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": s / 10}) + "\n" for s in (1, 2, 3, 4)))
    callback = JsonlMetricsCallback(str(path))
    state = SimpleNamespace(is_world_process_zero=True, global_step=2, epoch=0.1)
    callback.on_train_begin(None, state, None)
    assert [r["step"] for r in read_metrics(str(path))] == [1, 2]
    callback.on_log(None, SimpleNamespace(**{**vars(state), "global_step": 3}), None, logs={"loss": 0.5})
    assert [r["step"] for r in read_metrics(str(path))] == [1, 2, 3]
    state.global_step = 0
    callback.on_train_begin(None, state, None)  # a fresh run starts a fresh file
    assert read_metrics(str(path)) == []


SLOW_REWARD = """import time

def slow_reward(completions, **kwargs):
    time.sleep(0.5)  # every step takes at least this long: the signal lands while the run is going
    return [float(len(str(c)) % 5) for c in completions]
"""


@pytest.mark.slow
def test_cli_sigterm_then_the_printed_resume_command_completes_the_run(tmp_path):
    from slimrl.testing import save_tiny_model

    model = save_tiny_model(tmp_path / "tiny")
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"what is {i} plus {i}"}) + "\n" for i in range(32)))
    (tmp_path / "rewards.py").write_text(SLOW_REWARD)
    out = tmp_path / "run"
    argv = [
        "grpo",
        "--model_name_or_path",
        model,
        "--dataset_name",
        str(data),
        "--reward_funcs",
        f"{tmp_path / 'rewards.py'}:slow_reward",
        "--max_steps",
        "8",
        "--max_completion_length",
        "8",
        "--per_device_train_batch_size",
        "4",
        "--gradient_accumulation_steps",
        "1",
        "--num_generations",
        "4",
        "--num_eval_samples",
        "0",
        "--output_dir",
        str(out),
        "--seed",
        "1",
        "--disable_tqdm",
        "True",
    ]
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "slimrl.cli", *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    metrics, deadline = out / "metrics.jsonl", time.monotonic() + 600
    while not (metrics.is_file() and '"step": 1' in metrics.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 143, err[-3000:]
    line = next(x for x in err.splitlines() if "stopped by SIGTERM" in x)
    step = int(line.split("after step ")[1].split("/")[0])
    assert 1 <= step < 8 and (out / f"checkpoint-{step}" / "trainer_state.json").is_file()
    printed = shlex.split(line.split("Resume: ", 1)[1])
    assert printed[:2] == ["slimrl", "grpo"] and printed[-2:] == ["--resume", str(out)]

    resumed = subprocess.run(
        [sys.executable, "-m", "slimrl.cli", *printed[1:]], env=env, capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (out / "adapter_model.safetensors").is_file()
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 9))
