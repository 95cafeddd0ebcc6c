"""What every training command (`slimrl grpo | dpo | orpo | kto`, and any later one) does around `trainer.train()`:
`--resume [DIR]`, Ctrl-C / SIGTERM, and out-of-memory stops (the budget `--max_memory_gb` is slimrl's config field
`slimrl_max_memory_gb`, set by cli/args.py like the other slimrl fields).

    task_args, model_args, training_args = parse_...(argv)     # calls apply_run_flags(command, argv, ...)
    ...
    train(trainer, training_args, task_args)                    # instead of trainer.train(...)

Choices:
- `--resume` alone resumes the newest complete checkpoint in output_dir; `--resume DIR` takes a checkpoint folder or
  a run folder (its newest complete checkpoint). When DIR is given and --output_dir is not, output_dir follows DIR's
  run folder (a one-line notice says so), so the resumed run continues where the first one writes.
  `--resume_from_checkpoint PATH` (TrainingArguments' own field) still works; giving both is an error.
- The interrupt line repeats the command as run, with `--resume <output_dir>` in place of any resume flag, so it
  can be pasted as is; secret flags (`--hub_token`, `--api_key`, ...) are left out and credential-shaped values
  replaced (cli/redaction.py), so the line can go to logs.
- Hub pushes (`--push_to_hub`) create a private repository unless `--public` is given: TRL's `hub_private_repo`
  left unset becomes True; `--public` sets it False; `--public` with `--hub_private_repo True` is an error.
- An out-of-memory stop (slimrl.training.oom) ends the command with its message (exit status 1), no traceback:
  everything the user needs (peak, knobs, checkpoint) is in the message.
"""

from __future__ import annotations

import shlex

from ..state import user_set
from ..swaps import adjust_default, set_field
from ..training.checkpoints import resolve_resume, run_dir_of
from ..training.interrupt import SafeInterrupt
from ..training.oom import TrainingOutOfMemory
from .redaction import left_out_note, redact_argv

RESUME_LATEST = "latest"  # the value of a bare `--resume` (argparse const)
_RESUME_FLAGS = ("--resume", "--resume_from_checkpoint")


def _without_resume(argv: list[str]) -> list[str]:
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in _RESUME_FLAGS:
            has_value = "=" in arg or (i + 1 < len(argv) and not argv[i + 1].startswith("--"))
            skip = "=" not in arg and has_value
            continue
        out.append(arg)
    return out


def resume_command(command: str, argv: list[str], output_dir: str) -> str:
    """The command that resumes this run, with no secret in it (a `str.format` template: braces doubled)."""
    kept, left_out = redact_argv(_without_resume(argv))
    line = shlex.join(["slimrl", command, *kept, "--resume", str(output_dir)]) + left_out_note(left_out)
    return line.replace("{", "{{").replace("}", "}}")


def apply_hub_visibility(task_args, training_args) -> None:
    """A repository the run pushes to is private unless --public (hub_private_repo set by the user is kept)."""
    if task_args.public:
        if user_set(training_args, "hub_private_repo") and training_args.hub_private_repo:
            raise ValueError("--public and --hub_private_repo True both given: pass one of them.")
        set_field(training_args, "hub_private_repo", False, "--public")
    else:
        adjust_default(training_args, "hub_private_repo", True, "a new Hub repository is private unless --public")


def apply_run_flags(command: str, argv: list[str], task_args, training_args) -> None:
    """--resume into the TRL config; the Hub visibility; the resume command for the interrupt line."""
    apply_hub_visibility(task_args, training_args)
    resume = task_args.resume
    if resume is not None:
        if training_args.resume_from_checkpoint:
            raise ValueError("--resume and --resume_from_checkpoint both given: pass one of them.")
        folder = training_args.output_dir if resume in (RESUME_LATEST, "True", "true") else resume
        checkpoint = resolve_resume(str(folder))
        before = training_args.output_dir
        why = "--resume: the checkpoint's run folder"
        if folder != before and adjust_default(training_args, "output_dir", run_dir_of(checkpoint), why):
            print(f"[slimrl] resuming {checkpoint}: output_dir {before} -> {run_dir_of(checkpoint)}", flush=True)
        set_field(training_args, "resume_from_checkpoint", checkpoint, "--resume")
    task_args.resume_command = resume_command(command, argv, training_args.output_dir)


def train(trainer, training_args, task_args) -> None:
    """`trainer.train(resume_from_checkpoint=...)` with SafeInterrupt; exits 130/143 after an interrupt."""
    hint = task_args.resume_command or 'trainer.train(resume_from_checkpoint="{checkpoint}")'
    interrupt = SafeInterrupt(exit=False, resume_hint=hint)
    trainer.add_callback(interrupt)
    try:
        trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    except TrainingOutOfMemory as exc:
        raise SystemExit(f"[slimrl] {exc}") from None
    finally:
        interrupt.restore()
    if interrupt.interrupted:
        raise SystemExit(interrupt.exit_code)
