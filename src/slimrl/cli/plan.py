"""`slimrl plan <grpo|dpo|orpo|kto> [that command's flags]`: the memory a training step will need, before anything
is loaded (slimrl.planning), and whether it fits.

Choices:
- The training command's own parser reads the flags, so `slimrl plan grpo --max_completion_length 256` plans
  exactly what `slimrl grpo --max_completion_length 256` would run (its CLI defaults included).
- Flags of the plan itself: --prompt_length (default: max_seq_length - max_completion_length for GRPO, half of
  max_length for the others: worst cases), --device_memory_gb (default: the GPU's memory, else this machine's RAM),
  --device cpu|cuda (default: CUDA when available), --json (the plan as JSON).
- --longest: also the longest completion whose planned step fits (slimrl.planning.longest: every multiple of
  --longest_resolution tokens, default 4096, up to --longest_maximum, default 1,048,576, is planned with the same
  rows, prompt and settings); printed after the plan, and under `longest_completion` in the JSON.
- Exit status 0 when the plan fits, 1 when it does not (usable in scripts); with --longest, 0 when some length fits.
- Only the model's config.json is read: a Hub that cannot be reached fails in about a second, saying that a local
  folder or HF_HUB_OFFLINE=1 works (slimrl/planning/hub.py).
"""

from __future__ import annotations

import argparse
import json

from slimrl.families import CLI_PLANNED

ALGORITHMS = CLI_PLANNED
USAGE = (
    "usage: slimrl plan {grpo,dpo,orpo,kto} [the command's flags] [--prompt_length N] [--device_memory_gb G] "
    "[--device cpu|cuda] [--json] [--longest [--longest_resolution N] [--longest_maximum N]]"
)


def _own_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--prompt_length", type=int, default=None)
    parser.add_argument("--device_memory_gb", type=float, default=None)
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--longest", action="store_true")
    parser.add_argument("--longest_resolution", type=int, default=4096)
    parser.add_argument("--longest_maximum", type=int, default=1_048_576)
    return parser


def _parse(algorithm: str, rest: list[str]):
    if algorithm == "grpo":
        from slimrl.cli.args import parse_grpo_args
        from slimrl.cli.grpo import apply_patches

        apply_patches()
        return parse_grpo_args(rest)
    from slimrl.cli.preference import apply_patches as apply_preference_patches
    from slimrl.cli.preference_args import parse_preference_args

    apply_preference_patches(algorithm)
    return parse_preference_args(algorithm, rest)


def plan_arguments(algorithm: str, model_args, training_args, own) -> tuple[tuple, dict]:
    """The positional and keyword arguments of `slimrl.plan` for the parsed flags."""
    import torch

    from slimrl.models.checkpointing import resolve_checkpointing
    from slimrl.models.dtypes import choose_dtype

    device = own.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype, _ = choose_dtype(model_args.dtype, device)
    asked, flag = model_args.use_gradient_checkpointing, training_args.gradient_checkpointing
    return (model_args.model_name_or_path, training_args, algorithm), dict(
        prompt_length=own.prompt_length,
        max_seq_length=model_args.max_seq_length,
        lora_r=model_args.lora_r,
        lora_target_modules=model_args.lora_target_modules,
        dtype=str(dtype),
        load_in_4bit=model_args.load_in_4bit,
        use_gradient_checkpointing=resolve_checkpointing(asked=asked, flag=flag).mode,
        fast_inference=model_args.fast_inference,
        gpu_memory_utilization=model_args.gpu_memory_utilization,
        device=device,
        device_memory_gb=own.device_memory_gb,
    )


def plan_from_args(algorithm: str, model_args, training_args, own):
    from slimrl.planning import plan

    args, kwargs = plan_arguments(algorithm, model_args, training_args, own)
    return plan(*args, **kwargs)


def _longest(algorithm: str, model_args, training_args, own) -> dict:
    from slimrl.planning.longest import longest_completion

    args, kwargs = plan_arguments(algorithm, model_args, training_args, own)
    return longest_completion(*args, resolution=own.longest_resolution, maximum=own.longest_maximum, **kwargs)


def run_plan(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in ALGORITHMS:
        print(USAGE)
        print(__doc__.split("\n\n", 1)[0])
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    from slimrl.cli.flags import concise_errors

    own, rest = concise_errors(_own_parser(), "plan", argv[1:]).parse_known_args(argv[1:])
    _, model_args, training_args = _parse(argv[0], rest)
    result = plan_from_args(argv[0], model_args, training_args, own)
    longest = _longest(argv[0], model_args, training_args, own) if own.longest else None
    if own.json:
        data = result.to_dict() | ({"longest_completion": longest} if longest is not None else {})
        print(json.dumps(data, indent=2), flush=True)
    else:
        from slimrl.planning.longest import render_longest

        print(result if longest is None else f"{result}\n{render_longest(longest)}", flush=True)
    if longest is not None:
        return 0 if longest["longest_completion"] else 1
    return 0 if result.fits else 1
