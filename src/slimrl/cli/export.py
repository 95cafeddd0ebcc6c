"""`slimrl export`: a trained adapter folder -> a merged transformers folder or a GGUF file, optionally on the Hub.

Choices made: the adapter and its base load as `slimrl generate` loads them (base and dtype from the run's
`slimrl_run.json`, else the adapter's base_model_name_or_path), then the model's own export methods do the work
(slimrl.export), so the CLI and the API write the same files. Output goes next to the adapter (`DIR-merged`,
`DIR-gguf`) unless `--output_dir` says otherwise. Flag values are checked before the model loads.
"""

from __future__ import annotations

import argparse
import os

FORMATS = ("merged", "gguf")


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--adapter", required=True, help="Adapter folder (the output_dir of a slimrl training run).")
    parser.add_argument(
        "--format",
        default="merged",
        choices=FORMATS,
        help="merged: transformers safetensors folder (vLLM, TGI); gguf: llama.cpp / Ollama file.",
    )
    parser.add_argument(
        "--quantization",
        nargs="+",
        default=["q8_0"],
        help="GGUF type(s): f16, bf16, f32, q8_0, q4_0, q4_1, q5_0, q5_1 (one file each).",
    )
    parser.add_argument(
        "--save_method",
        default="merged_16bit",
        choices=["merged_16bit", "merged_4bit"],
        help="--format merged: 16-bit weights, or bitsandbytes NF4.",
    )
    parser.add_argument(
        "--dtype",
        default=None,
        choices=["bfloat16", "float16", "float32"],
        help="dtype the base loads in (default: the training run's) and merged_16bit saves (default: float16).",
    )
    parser.add_argument(
        "--output_dir", default=None, help="Where to write; default: <adapter>-merged or <adapter>-gguf."
    )
    parser.add_argument(
        "--model_name_or_path", default=None, help="Base model; default: the one recorded in the adapter folder."
    )
    from slimrl.export.merged import MAX_SHARD_SIZE

    parser.add_argument("--max_shard_size", default=MAX_SHARD_SIZE, help="--format merged: safetensors shard size.")
    parser.add_argument(
        "--push_to_hub", default=None, metavar="REPO", help="Also upload the result to this Hub repository (user/name)."
    )
    parser.add_argument("--token", default=None, help="Hub token; default: huggingface_hub's login / HF_TOKEN.")
    visibility = parser.add_mutually_exclusive_group()
    visibility.add_argument(
        "--public", action="store_true", default=False, help="Create the Hub repository public (default: private)."
    )
    visibility.add_argument("--private", action="store_true", default=False, help="The default; kept for old scripts.")


def check_export_args(args) -> None:
    """Cheap checks before any loading."""
    from slimrl.export.gguf_writer import resolve_quantization

    if not os.path.isfile(os.path.join(args.adapter, "adapter_config.json")):
        raise SystemExit(f"slimrl export: {args.adapter!r} holds no adapter (adapter_config.json missing)")
    if args.format == "gguf":
        for method in args.quantization:
            try:
                resolve_quantization(method)
            except (ValueError, NotImplementedError) as exc:
                raise SystemExit(f"slimrl export: {exc}") from exc
    if args.push_to_hub is not None and args.push_to_hub.count("/") != 1:
        raise SystemExit(
            f"slimrl export: --push_to_hub takes a repository id such as user/my-model; got {args.push_to_hub!r}"
        )


def default_output_dir(adapter: str, fmt: str) -> str:
    return f"{os.path.normpath(adapter)}-{fmt}"


def run_export(args) -> dict:
    from slimrl.cli.modeling import load_adapter

    check_export_args(args)
    model, tokenizer, _ = load_adapter(args.adapter, args.model_name_or_path, args.dtype)
    from slimrl.export import methods

    out = args.output_dir or default_output_dir(args.adapter, args.format)
    if args.format == "merged":
        methods.save_pretrained_merged(
            model, out, tokenizer, save_method=args.save_method, max_shard_size=args.max_shard_size, dtype=args.dtype
        )
        files = sorted(os.listdir(out))
    else:
        paths = methods.save_pretrained_gguf(model, out, tokenizer, quantization_method=list(args.quantization))
        files = [os.path.basename(p) for p in paths] + ["Modelfile"]
    sizes = {name: os.path.getsize(os.path.join(out, name)) for name in files}
    print(
        f"[slimrl] exported {args.adapter} -> {out} ({args.format}): "
        + ", ".join(f"{name} {size / 1e6:.1f} MB" for name, size in sizes.items() if size > 1e5),
        flush=True,
    )
    result = {"output_dir": out, "files": sizes}
    if args.push_to_hub:
        from slimrl.export import hub
        from slimrl.state import model_state

        hub.write_model_card(out, model_state(model).model_name, "transformers" if args.format == "merged" else "gguf")
        result["commit_url"] = hub.upload_folder(out, args.push_to_hub, token=args.token, private=not args.public)
        shown = "public" if args.public else "a new repository is private; --public publishes"
        print(f"[slimrl] pushed to {args.push_to_hub} ({shown}): {result['commit_url']}", flush=True)
    _print_next_steps(args.format, out, files)
    return result


def _print_next_steps(fmt: str, out: str, files: list[str]) -> None:
    if fmt == "merged":
        print(f"[slimrl] serve it: vllm serve {out}   |   load it: AutoModelForCausalLM.from_pretrained({out!r})")
    else:
        print(
            f"[slimrl] run it: llama-cli -m {os.path.join(out, files[0])} -cnv   |   "
            f"ollama create my-model -f {os.path.join(out, 'Modelfile')}"
        )


def export_hint(output_dir: str) -> str:
    """The one line training commands end with."""
    return (
        f"[slimrl] export: slimrl export --adapter {output_dir} --format gguf (llama.cpp/Ollama) or "
        "--format merged (vLLM/transformers); add --push_to_hub USER/REPO to share"
    )
