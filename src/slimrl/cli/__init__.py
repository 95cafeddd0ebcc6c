"""The `slimrl` command: `grpo`, `ppo`, `dpo`, `orpo`, `kto`, `gkd` (train), `generate` / `chat` (try an adapter),
`export` (merged / GGUF / Hub), `doctor` (environment report).

Choices made: the executable is `slimrl.cli:run` (the busy-machine thread settings, then `main`);
`main(argv=None) -> int` is callable in-process (tests run `main([...])`) and leaves the environment alone.
Subcommands are dispatched on the first word so `slimrl grpo` can use TRL's own TrlParser (GRPOConfig flags and
`--config run.yaml`), while the small subcommands use argparse; every parser shows each flag's default in --help.
Heavy imports (torch, trl) happen inside the subcommand that needs them: `slimrl --help` is instant.
"""

from __future__ import annotations

import argparse
import os
import sys

from slimrl.cli.face import print_user_error, quiet_known_noise, take_debug_flag, user_errors
from slimrl.families import CLI_PREFERENCE

COMMANDS = {
    "grpo": "Train with GRPO (every GRPOConfig field is a flag; bare `slimrl grpo` trains the embedded SmolLM2-135M "
    "on the arithmetic task in ~10-15 min on a 2-core CPU).",
    "dpo": "Train with DPO on preference pairs (every DPOConfig field is a flag; bare `slimrl dpo` uses the built-in "
    "arithmetic pairs: correct answer chosen, a wrong one rejected).",
    "orpo": "Train with ORPO (reference-free; TRL's experimental ORPOTrainer on slimrl's chunked loss).",
    "kto": "Train with KTO on rows labelled desirable / undesirable (built-in: the arithmetic set, unpaired).",
    "gkd": "Distil a teacher (--teacher_adapter DIR from `slimrl grpo`, or --teacher_model) into a LoRA student "
    "with GKD on the arithmetic task.",
    "ppo": "Train with PPO (a learned critic; every PPOConfig field is a flag; bare `slimrl ppo` trains the embedded "
    "SmolLM2-135M on the arithmetic task, its correctness reward as the score).",
    "online-dpo": "Train with online DPO: two completions per prompt, the better by reward (or --judge) chosen (TRL's "
    "experimental OnlineDPOTrainer on slimrl's head; bare: the arithmetic task's rewards).",
    "generate": "Answer prompt(s) with a trained adapter and with the base model (adapter disabled).",
    "chat": "Interactive `generate`: one prompt per line, empty line or EOF to quit.",
    "export": "Merge an adapter into its base (--format merged) or write a GGUF (--format gguf); --push_to_hub REPO.",
    "doctor": "Print versions, device, dtype choice and which optional parts are usable.",
    "plan": "Predict a training step's peak memory before loading anything (slimrl plan grpo [grpo's flags]).",
}


def _top_help() -> str:
    lines = [
        "usage: slimrl <command> [flags]   (slimrl <command> --help lists every flag with its default)",
        "",
        "commands:",
    ]
    lines += [f"  {name:<9} {text}" for name, text in COMMANDS.items()]
    lines += [
        "",
        "example: slimrl grpo --max_steps 50 --learning_rate 5e-5 --output_dir outputs/run1",
        '         slimrl generate --adapter outputs/run1 "What is 7 + 5?"',
        "         slimrl export --adapter outputs/run1 --format gguf --quantization q8_0",
    ]
    return "\n".join(lines)


def _small_parser(command: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"slimrl {command}", description=COMMANDS[command], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    if command in ("generate", "chat"):
        from slimrl.cli.generate import add_generate_arguments

        add_generate_arguments(parser, interactive_default=command == "chat")
    if command == "export":
        from slimrl.cli.export import add_export_arguments

        add_export_arguments(parser)
    return parser


def run() -> int:
    """The `slimrl` executable: a training command on a machine other jobs share gets the thread settings that
    degrade least, before torch is imported (slimrl/machine.py); then `main`."""
    argv = sys.argv[1:]
    if argv and (argv[0] in TRAINING_COMMANDS or argv[0] in CLI_PREFERENCE):
        from slimrl.machine import apply_thread_policy

        apply_thread_policy()  # torch not loaded yet: the environment, PASSIVE included; one notice
    return main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    debug = take_debug_flag(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_top_help())
        return 0
    if argv[0] in ("-V", "--version"):
        from slimrl import __version__

        print(f"slimrl {__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"slimrl: unknown command {command!r}\n\n{_top_help()}", file=sys.stderr)
        return 2
    with quiet_known_noise():
        try:
            if command != "doctor":  # doctor reports versions; every other command needs supported ones
                from slimrl.versions import check as check_versions

                check_versions()
            return _dispatch(command, rest)
        except user_errors() as exc:
            if debug:
                raise
            print_user_error(command, exc)
            return 2


# `slimrl <command>` -> (its module under slimrl.cli, the parse function, the run function); the module's
# apply_patches() runs before parsing: the patched config resolves bf16/fp16 for this device
TRAINING_COMMANDS = {
    "grpo": ("grpo", "slimrl.cli.args:parse_grpo_args", "run_grpo"),
    "ppo": ("ppo", "parse_ppo_args", "run_ppo"),
    "gkd": ("gkd", "parse_gkd_args", "run_gkd"),
    "online-dpo": ("online_dpo", "parse_args", "run_online_dpo"),
}


def _train(command: str, rest: list[str]) -> None:
    import importlib

    module_name, parse_name, run_name = TRAINING_COMMANDS[command]
    module = importlib.import_module(f"slimrl.cli.{module_name}")
    parse_module, _, parse_name = parse_name.rpartition(":")
    parse = getattr(importlib.import_module(parse_module) if parse_module else module, parse_name)
    module.apply_patches()
    getattr(module, run_name)(*parse(rest))


def _dispatch(command: str, rest: list[str]) -> int:
    if command in TRAINING_COMMANDS:
        _train(command, rest)
        return 0
    if command == "plan":
        from slimrl.cli.plan import run_plan

        return run_plan(rest)
    if command in CLI_PREFERENCE:
        from slimrl.cli.preference import apply_patches as apply_preference_patches
        from slimrl.cli.preference import run_preference
        from slimrl.cli.preference_args import parse_preference_args

        apply_preference_patches(command)
        task_args, model_args, training_args = parse_preference_args(command, rest)
        run_preference(command, task_args, model_args, training_args)
        return 0
    from slimrl.cli.flags import concise_errors

    args = concise_errors(_small_parser(command), command, rest).parse_args(rest)
    if command == "doctor":
        from slimrl.doctor import print_report

        print_report()
        return 0
    if command == "export":
        from slimrl.cli.export import run_export

        run_export(args)
        return 0
    from slimrl.cli.generate import run_generate

    run_generate(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
