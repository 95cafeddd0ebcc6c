"""After TrlParser: what every training command's arguments go through (cli/args.py for grpo and ppo,
cli/preference_args.py for dpo, orpo and kto).

- `parse_with_config`: TrlParser's parse_args_and_config, a bad flag or --config key named with the closest flag;
- `apply_slimrl_arguments`: slimrl's fields set on the config, validated by their owners;
- `resolve_eval_samples`: the before/after evaluation's size when --num_eval_samples is unset;
- `mark_user_fields`: the fields the user gave (flags or YAML), what slimrl may warn about and must not change;
- `follow_model_checkpointing`: the config's checkpointing flag follows --use_gradient_checkpointing;
- `parsed_arguments`: all of the above in order; `run_name`: the `{task}` of output_dir.
"""

from __future__ import annotations

# The before/after eval when --num_eval_samples is unset: the full one for the default 30-step run, scaled down for
# short trial runs (two 128-prompt greedy evals take ~2 min on a 2-core CPU, more than a 3-step run trains)
FULL_EVAL, FULL_EVAL_STEPS, EVAL_PER_STEP, MIN_EVAL = 128, 30, 4, 16
FLAG = "the command's flag"  # what slimrl.describe says of a slimrl field the CLI set


def apply_slimrl_arguments(training_args, slimrl_args) -> None:
    """Set slimrl's fields on the config, validated by their owners (the same checks as the config keywords)."""
    import dataclasses

    from slimrl import fields
    from slimrl.ops.chunking import validate_num_chunks
    from slimrl.patches.rollouts.rewards import check_policy
    from slimrl.swaps import set_field
    from slimrl.training.budget import validate_memory_budget

    validators = {
        fields.NUM_CHUNKS: validate_num_chunks,
        fields.MAX_MEMORY_GB: validate_memory_budget,
        fields.REWARD_ERRORS: check_policy,
    }
    for flag in dataclasses.fields(slimrl_args):
        set_field(training_args, flag.name, validators[flag.name](getattr(slimrl_args, flag.name)), FLAG)


def parse_with_config(parser, argv: list[str]):
    """TrlParser's parse_args_and_config; a flag it cannot use, or an unknown key in the --config YAML, is named with
    the closest flag, in one line (cli/flags.py)."""
    import difflib
    import re

    from slimrl.cli.flags import concise_errors, unknown_flags_error

    command = parser.prog.split()[-1]  # "slimrl grpo" -> grpo
    try:
        return concise_errors(parser, command, list(argv)).parse_args_and_config(list(argv))
    except ValueError as exc:
        if (rewritten := unknown_flags_error(parser, command, exc)) is not None:
            raise rewritten from exc
        if "Unknown arguments from config file" not in str(exc):
            note = cli_defaults_named(parser, argv, str(exc))
            if note:
                raise ValueError(f"{exc}{note}") from exc
            raise
        unknown = re.findall(r"'--([\w.-]+)'", str(exc))
        known = [action.dest for action in parser._actions]
        hints = [
            f"{key} (did you mean {', '.join(close)}?)" if (close := difflib.get_close_matches(key, known, 2)) else key
            for key in unknown
        ]
        raise ValueError(
            f"unknown key(s) in the --config file: {'; '.join(hints)}. Every key must be a flag of this "
            "command (see --help)."
        ) from exc


def cli_defaults_named(parser, argv: list[str], message: str) -> str:
    """A note for `message`: each field it names as "field (value)" that holds the command's CLI default (the user
    did not give it) is said to be that default, with TRL's and the flag that changes it ("" when none)."""
    given = given_names(argv)
    notes = [
        f"{a.dest} {a.default!r} is the `{parser.prog}` default (TRL's: {a.trl_default!r}); --{a.dest} changes it"
        for a in parser._actions
        if hasattr(a, "trl_default") and a.dest not in given and f"{a.dest} ({a.default})" in message
    ]
    return f" Note: {'; '.join(notes)}." if notes else ""


def resolve_eval_samples(task_args, max_steps: int) -> None:
    """An unset --num_eval_samples: FULL_EVAL for runs of FULL_EVAL_STEPS+ steps (or epochs), fewer for shorter runs."""
    if task_args.num_eval_samples is not None:
        return
    if 0 < max_steps < FULL_EVAL_STEPS:
        task_args.num_eval_samples = max(MIN_EVAL, min(FULL_EVAL, EVAL_PER_STEP * max_steps))
        print(
            f"[slimrl] {max_steps}-step run: eval on {task_args.num_eval_samples} held-out prompts before and after "
            f"(--num_eval_samples {FULL_EVAL} for the full eval, 0 to skip it)",
            flush=True,
        )
    else:
        task_args.num_eval_samples = FULL_EVAL


def given_names(argv: list[str]) -> set[str]:
    """The field names argv gives: its `--flags` and the keys of its --config YAML."""
    given = {a[2:].split("=", 1)[0] for a in argv if a.startswith("--")}
    if "config" in given:
        path = (
            argv[argv.index("--config") + 1]
            if "--config" in argv
            else next(a.split("=", 1)[1] for a in argv if a.startswith("--config="))
        )
        import yaml

        with open(path) as f:
            given |= set((yaml.safe_load(f) or {}).keys())
    return given


def mark_user_fields(training_args, argv: list[str]) -> None:
    """The parser passes every field to the config, so the patches would take all of them for user settings; keep
    only those given as flags or in the --config YAML (what slimrl may warn about or must not change)."""
    import dataclasses

    given = given_names(argv)
    from slimrl.state import config_state

    names = {f.name for f in dataclasses.fields(training_args)}
    config_state(training_args).user_fields = frozenset(given & names)


def follow_model_checkpointing(model_args, training_args) -> None:
    """--use_gradient_checkpointing given, --gradient_checkpointing not: the config's flag follows the model's mode
    (the patched trainers would otherwise warn about a flag the user never set)."""
    from slimrl.state import user_set
    from slimrl.swaps import adjust_default

    mode = model_args.use_gradient_checkpointing
    if mode is None or user_set(training_args, "activation_checkpointing"):
        return
    if user_set(training_args, "gradient_checkpointing"):
        return
    adjust_default(training_args, "gradient_checkpointing", bool(mode), "--use_gradient_checkpointing")
    if hasattr(training_args, "activation_checkpointing"):  # transformers 5's name of the same flag
        adjust_default(training_args, "activation_checkpointing", bool(mode), "--use_gradient_checkpointing")


def parsed_arguments(parser, argv: list[str]):
    """(task_args, model_args, training_args): parsed, slimrl's fields set, the evaluation sized, the user's fields
    marked, checkpointing followed, dtype "auto" as None."""
    task_args, model_args, slimrl_args, training_args = parse_with_config(parser, argv)
    apply_slimrl_arguments(training_args, slimrl_args)
    resolve_eval_samples(task_args, training_args.max_steps)
    mark_user_fields(training_args, list(argv))
    follow_model_checkpointing(model_args, training_args)
    if model_args.dtype == "auto":
        model_args.dtype = None
    return task_args, model_args, training_args


def run_name(task_args) -> str:
    """What `{task}` in output_dir stands for: the task, or the dataset's file or repository name."""
    if not task_args.dataset_name:
        return task_args.task
    return task_args.dataset_name.rstrip("/").replace("\\", "/").split("/")[-1].split(".")[0] or "dataset"
