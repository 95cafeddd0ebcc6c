"""Rewrite an Unsloth notebook (python_scripts/*.py or .ipynb) to run on slimrl.

Usage: python scripts/unsloth_notebook.py NOTEBOOK.py|.ipynb --out OUT.py [--steps 2] [--model smollm2-135m]
       [--device cpu] [--vllm] [--datasets DIR] [--max-seq-length N]
Each change is listed in the output's header comment. A notebook slimrl cannot run is reported with the reason
and exit status 2; so is a `load_dataset("<hub id>", ...)` with no stand-in in --datasets DIR.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

# (pattern, reason): a notebook matching one of these cannot run here
REFUSALS = (
    (r"openenv|OpenEnv", "needs an external OpenEnv game/environment server"),
    (r"nemo_gym|NeMo-Gym|nemo-gym", "needs an external NeMo-Gym environment server"),
    (r"gpt-oss|gpt_oss", "gpt-oss models are not supported"),
    (r"load_in_fp8\s*=\s*True|['\"][^'\"\n]*(?:fp8|FP8)[^'\"\n]*['\"]", "FP8 training needs FP8 hardware kernels"),
    (r"[Dd]iffusion|dLLM|LLaDA", "diffusion language models are not supported"),
)
EMBEDDED = "smollm2-135m"  # a Llama-architecture model
_MODULES = (("unsloth_zoo", "slimrl"), ("unsloth", "slimrl"))
# load_dataset("<id>"[, "<config>"]: the Hub id, then the rest of the call up to its closing parenthesis
_LOAD = re.compile(r"""load_dataset\(\s*(['"])([^'"]+)\1(?:\s*,\s*(['"])[^'"]*\3)?([^()]*)\)""")
_SPLIT = re.compile(r"""split\s*=\s*['"]([\w-]+)['"]""")
_BUILDERS = {"json", "csv", "parquet", "text", "arrow", "webdataset", "imagefolder", "audiofolder"}


class MissingStandIn(ValueError):
    """A load_dataset call whose Hub id has no stand-in file in the --datasets folder."""


def _source(path: Path) -> str:
    if path.suffix != ".ipynb":
        return path.read_text()
    cells = json.loads(path.read_text()).get("cells", [])
    return "\n\n".join("".join(c["source"]) for c in cells if c.get("cell_type") == "code")


def refusal(text: str) -> str | None:
    """The reason a notebook cannot run here, or None (comments, pip and install lines are not read)."""
    code = re.sub(r"^\s*(?:#|!|%).*$|^.*pip install.*$", "", text, flags=re.M)
    for pattern, reason in REFUSALS:
        if re.search(pattern, code):
            return reason
    return None


def _sub(text: str, pattern: str, repl, note: str, changes: list[str], flags: int = 0) -> str:
    new, n = re.subn(pattern, repl, text, flags=flags)
    if n:
        changes.append(f"{note} ({n}x)")
    return new


def stand_in(directory: Path, hub_id: str) -> Path:
    """The local stand-in of a Hub dataset: DIR/<id, "/" replaced by "__">.jsonl."""
    return directory / (hub_id.replace("/", "__") + ".jsonl")


def redirect_datasets(text: str, directory: Path, changes: list[str]) -> str:
    """Each load_dataset("<hub id>"[, "<config>"], ...) loads DIR's stand-in through the json builder instead: its
    rows under the split the call names ("train" if none), the config dropped, the other arguments kept. Raises
    MissingStandIn naming the first id without a file; a call whose id is not a literal is left alone."""
    directory = directory.resolve()

    def repl(m: re.Match) -> str:
        hub_id, rest = m.group(2), m.group(4)
        if hub_id in _BUILDERS or hub_id.startswith((".", "/")):
            return m.group(0)
        path = stand_in(directory, hub_id)
        if not path.is_file():
            raise MissingStandIn(f'no stand-in for load_dataset("{hub_id}"): expected {path}')
        split = _SPLIT.search(rest)
        changes.append(f'dataset "{hub_id}" -> {path.name} (local stand-in)')
        return f'load_dataset("json", data_files = {{"{split.group(1) if split else "train"}": "{path}"}}{rest})'

    text = _LOAD.sub(repl, text)
    if re.search(r"load_dataset\(\s*[A-Za-z_]", text):  # an id held in a variable: resolved when the call runs
        changes.append("load_dataset(<variable id>) -> its stand-in when it runs")
        text = RUNTIME_STAND_INS.format(directory=str(directory), builders=sorted(_BUILDERS)) + text
    return text


# Prepended for load_dataset calls whose Hub id is not a literal (Zephyr's dataset mixer): the same rule at run time
RUNTIME_STAND_INS = """import datasets as _datasets


def _stand_in(path, *args, _load=_datasets.load_dataset, **kwargs):  # added by scripts/unsloth_notebook.py
    if not isinstance(path, str) or path in {builders} or path.startswith((".", "/")):
        return _load(path, *args, **kwargs)
    file = "{directory}/" + path.replace("/", "__") + ".jsonl"
    import os

    if not os.path.isfile(file):
        raise FileNotFoundError(f"no stand-in for load_dataset({{path!r}}): expected {{file}}")
    kwargs.pop("name", None)
    return _load("json", data_files={{kwargs.get("split") or "train": file}}, **kwargs)


_datasets.load_dataset = _stand_in
"""


def cap_seq_length(text: str, cap: int, changes: list[str]) -> str:
    """Each literal `max_seq_length = N` and `max_length = N` above cap becomes cap (a model swap: the embedded model
    trains and generates on a CPU, where the notebooks' 1024-4096 tokens of completions take minutes a step)."""

    capped = []

    def repl(m: re.Match) -> str:
        capped.extend([m.group(2)] if int(m.group(2)) > cap else [])
        return m.group(1) + str(min(int(m.group(2)), cap))

    # a trainer's max_length above the model's max_seq_length is refused: it gets the same cap
    for name in ("max_seq_length", "max_length"):
        capped.clear()
        text = re.sub(rf"^(\s*{name}\s*=\s*)(\d+)", repl, text, flags=re.M)
        changes.extend([f"{name} capped at {cap} ({len(capped)}x)"] if capped else [])
    return text


def transform(text: str, steps: int = 2, model: str = EMBEDDED, device: str = "cpu", vllm: bool = False):
    """(rewritten text, list of changes)."""
    changes: list[str] = []
    text = _sub(text, r"^\s*[!%].*$", "", "removed pip/magic lines", changes, re.M)
    text = _sub(text, r"^\s*(?:import\s+subprocess.*|.*pip install.*)$", "", "removed install lines", changes, re.M)
    for old, new in _MODULES:
        text = _sub(text, rf"\b(from|import)\s+{old}\b", rf"\1 {new}", f"{old} imports -> {new}", changes)
    text = _sub(text, r"^\s*assert\s+[\w.]+\.__version__\b.*$", "", "removed release asserts", changes, re.M)
    pattern = r"\b(model_name)\s*=\s*['\"][^'\"]+['\"]"
    text = _sub(text, pattern, rf'\1 = "{model}"', f"model -> {model}", changes, re.I)
    if model == EMBEDDED:
        text = llama_targets(text, changes)
        text = _sub(text, r"^reasoning_(start|end) = None$", reasoning_tag, REASONING_NOTE, changes, re.M)
    text = _sub(text, r"['\"]cuda(?::\d+)?['\"]", f'"{device}"', f'"cuda" -> "{device}"', changes)
    text = _sub(text, r"max_steps\s*=\s*\d+", f"max_steps = {steps}", f"max_steps capped at {steps}", changes)
    text = _sub(text, r"fast_inference\s*=\s*\w+", f"fast_inference = {vllm}", f"fast_inference = {vllm}", changes)
    if vllm and device == "cpu":
        text = engine_on_cpu(text, changes)
    return text, changes


# LoRA targets of the notebooks' other architectures -> the Llama projection in the same role (None: no such layer)
LLAMA_ROLES = {"out_proj": "o_proj", "w1": "gate_proj", "w3": "up_proj", "w2": "down_proj", "in_proj": None}
_TARGETS = re.compile(r"(target_modules\s*=\s*)\[([^\]]*)\]")


def llama_targets(text: str, changes: list[str]) -> str:
    """Each literal `target_modules = [...]` naming another architecture's layers (LFM2's out_proj, in_proj, w1-w3)
    names the embedded Llama model's layers in the same roles instead; a list of Llama names is left as it is."""

    def repl(m: re.Match) -> str:
        names = re.findall(r"['\"](\w+)['\"]", m.group(2))
        if not any(name in LLAMA_ROLES for name in names):
            return m.group(0)
        mapped = dict.fromkeys(LLAMA_ROLES.get(name, name) for name in names)
        kept = [name for name in mapped if name is not None]
        changes.append(f"target_modules {names} -> {kept} (the embedded Llama model's layers)")
        return m.group(1) + "[" + ", ".join(f'"{name}"' for name in kept) + "]"

    return _TARGETS.sub(repl, text)


REASONING_NOTE = "reasoning tags as text: <think> / </think> (the embedded model has no such added tokens)"


def reasoning_tag(m: re.Match) -> str:
    """DeepSeek-R1's notebook finds its reasoning tags among the model's added tokens and leaves them None when there
    are none (the embedded model), which its reward functions then count: they start as the text tags instead."""
    return f'reasoning_{m.group(1)} = "{"<think>" if m.group(1) == "start" else "</think>"}"'


CPU_ENGINE_SHARE = 0.1  # of the machine's RAM: a 135M model's engine needs far less than a GPU notebook's 0.5-0.9


def engine_on_cpu(text: str, changes: list[str]) -> str:
    """The vLLM engine of a `fast_inference=True` notebook on a CPU: `gpu_memory_utilization` is there the share of
    RAM the engine takes up front (a notebook's 0.9 would claim nearly all of it), and an eager engine starts in
    seconds (no graph capture)."""
    eager = "" if "vllm_engine_kwargs" in text else ', vllm_engine_kwargs = {"enforce_eager": True}'
    note = f"gpu_memory_utilization = {CPU_ENGINE_SHARE} (the share of RAM on a CPU)"
    note += ", an eager engine" if eager else ""
    pattern = r"gpu_memory_utilization\s*=\s*[\d.]+"
    return _sub(text, pattern, f"gpu_memory_utilization = {CPU_ENGINE_SHARE}{eager}", note, changes)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("notebook", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--model", default=EMBEDDED)
    p.add_argument("--device", default="cpu")
    p.add_argument("--vllm", action="store_true")
    p.add_argument("--datasets", type=Path, help="folder of stand-ins: <hub id with / as __>.jsonl")
    p.add_argument("--max-seq-length", type=int, help="cap on each literal max_seq_length")
    a = p.parse_args(argv)
    text = _source(a.notebook)
    reason = refusal(text)
    if reason:
        print(f"{a.notebook}: cannot run on slimrl: {reason}", file=sys.stderr)
        return 2
    out, changes = transform(text, a.steps, a.model, a.device, a.vllm)
    if a.max_seq_length:
        out = cap_seq_length(out, a.max_seq_length, changes)
    try:
        out = redirect_datasets(out, a.datasets, changes) if a.datasets else out
    except MissingStandIn as e:
        print(f"{a.notebook}: {e}", file=sys.stderr)
        return 2
    header = "".join(f"# - {c}\n" for c in changes)
    a.out.write_text(f"# Rewritten from {a.notebook.name} by scripts/unsloth_notebook.py:\n{header}\n{out}")
    print("\n".join(changes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
