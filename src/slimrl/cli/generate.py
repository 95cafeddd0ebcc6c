"""`slimrl generate` / `slimrl chat`: answer prompts with a trained adapter and with the base model side by side.

Choices made: one model in memory; the base answer is generated under PEFT's `disable_adapter()`. When the run that
wrote the adapter used a built-in task, the prompt is wrapped the way training prompts were (same worked examples)
unless `--raw`; decoding is greedy unless `--do_sample`.
"""

from __future__ import annotations

import argparse


def add_generate_arguments(parser: argparse.ArgumentParser, interactive_default: bool = False) -> None:
    parser.add_argument("prompts", nargs="*", help="Prompt(s) to answer (none with --interactive).")
    parser.add_argument("--adapter", required=True, help="Adapter folder written by `slimrl grpo` (its output_dir).")
    parser.add_argument(
        "--model_name_or_path", default=None, help="Base model; default: the one recorded in the adapter folder."
    )
    parser.add_argument(
        "--dtype",
        default=None,
        choices=["bfloat16", "float16", "float32"],
        help="Weight dtype; default: the training run's.",
    )
    parser.add_argument("--max_new_tokens", type=int, default=128, help="Tokens to generate per answer.")
    parser.add_argument("--do_sample", action="store_true", default=False, help="Sample instead of greedy decoding.")
    parser.add_argument("--temperature", type=float, default=1.0, help="Sampling temperature (with --do_sample).")
    parser.add_argument(
        "--raw",
        action="store_true",
        default=False,
        help="Send the prompt as a single user message, without the task's prompt template.",
    )
    parser.add_argument("--no_base", action="store_true", default=False, help="Only print the adapter's answer.")
    parser.add_argument(
        "--interactive",
        action="store_true",
        default=interactive_default,
        help="Read prompts from stdin until EOF or an empty line.",
    )


def _wrap(text: str, info: dict, raw: bool):
    if not raw and info.get("task"):
        from slimrl.tasks import BUILTIN_TASKS  # noqa: F401  (task module must exist)

        if info["task"] == "arithmetic":
            from slimrl.tasks.arithmetic import DEFAULTS, format_user_prompt

            options = {k: v for k, v in (info.get("task_info") or {}).items() if k in DEFAULTS}
            return format_user_prompt(text, seed=info.get("seed", 0), **options)
    return [{"role": "user", "content": text}]


def answer(model, tokenizer, text: str, args, info: dict) -> dict:
    from slimrl.cli.evaluate import generate_texts

    prompt = [_wrap(text, info, args.raw)]
    kwargs = dict(
        max_new_tokens=args.max_new_tokens, batch_size=1, do_sample=args.do_sample, temperature=args.temperature
    )
    result = {"adapter": generate_texts(model, tokenizer, prompt, **kwargs)[0]}
    if not args.no_base:
        with model.disable_adapter():
            result["base"] = generate_texts(model, tokenizer, prompt, **kwargs)[0]
    return result


def run_generate(args, input_stream=None, output=print) -> list[dict]:
    import sys

    from slimrl.cli.modeling import load_adapter

    if not args.prompts and not args.interactive:
        raise SystemExit("slimrl generate: give a prompt, or --interactive (or use `slimrl chat`)")
    model, tokenizer, info = load_adapter(args.adapter, args.model_name_or_path, args.dtype)
    results = []

    def show(text):
        res = answer(model, tokenizer, text, args, info)
        results.append(res)
        output(f">>> {text}")
        if "base" in res:
            output(f"[base]    {res['base'].strip()}")
        output(f"[adapter] {res['adapter'].strip()}")

    for text in args.prompts:
        show(text)
    if args.interactive:
        stream = input_stream or sys.stdin
        while True:
            if stream is sys.stdin and sys.stdin.isatty():
                print("prompt> ", end="", flush=True)
            line = stream.readline()
            if not line or not line.strip():
                break
            show(line.strip())
    return results
