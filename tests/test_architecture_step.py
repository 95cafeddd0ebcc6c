"""docs/architecture.md stays true: the files one GRPO step enters, and the layer order imports follow.

1. One tiny GRPO optimizer step (set-up excluded), in a fresh process, runs under `sys.setprofile`; the slimrl files
   it enters must be exactly the list marked `step-files` on the page, each there with a line on what it does in the
   step, and each named (by its path under slimrl/) in the narrative marked `step-narrative`.
2. Imports go downwards only: each module's folder (or, at the package root, the module) sits on one line of the
   page's `layers` block, top to bottom, one folder a line, and imports only from its own line or the lines below
   (function-level imports counted; cycles among modules are forbidden by test_architecture.py).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from datasets import Dataset
from test_architecture import PACKAGE, import_graph

from slimrl.testing import tiny_llama, tiny_tokenizer

PAGE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def _marked(name: str) -> str:
    """The text between `<!-- name -->` and `<!-- /name -->` on the page."""
    match = re.search(rf"<!-- {name} -->(.*?)<!-- /{name} -->", PAGE.read_text(), re.S)
    assert match, f"docs/architecture.md has no <!-- {name} --> block"
    return match.group(1)


def step_entries(block: str) -> dict[str, str]:
    """The `- `path`: what it does` lines of a step-files block; a line of another shape fails."""
    lines = [line for line in block.splitlines() if line.strip()]
    entries = {}
    for line in lines:
        match = re.fullmatch(r"- `([\w/]+\.py)`:(.*)", line.strip())
        assert match, f"step-files: not a `- `path`: what it does` line: {line!r}"
        entries[match.group(1)] = match.group(2).strip()
    return entries


def named_in(text: str) -> set[str]:
    """The files a text names by their path under slimrl/ (in code spans, optionally with `:name`)."""
    return set(re.findall(r"`((?:\w+/)*\w+\.py)(?::[\w.]+(?:\([^`]*\))?)?`", text))


def step_page_problems(traced: set[str], entries: dict[str, str], narrative: str) -> list[str]:
    """Where the page's account of a step falls short of the trace."""
    return (
        [f"the step enters but the list omits {f}" for f in sorted(traced - set(entries))]
        + [f"the list names but the step never enters {f}" for f in sorted(set(entries) - traced)]
        + [f"no line on what it does: {f}" for f, what in sorted(entries.items()) if len(what.split()) < 3]
        + [f"the narrative does not name {f}" for f in sorted(traced - named_in(narrative))]
    )


def page_layers() -> list[list[str]]:
    lines = [line.split("#")[0].split() for line in _marked("layers").splitlines()]
    return [line for line in lines if line and not line[0].startswith("```")]


def _reward(completions, **kwargs):
    return [float(len(str(c))) for c in completions]


def traced_step_files(tmp_path) -> set[str]:
    """The slimrl files (relative to the package) one step of an already patched GRPO run enters."""
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=4,
        max_steps=1,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
    )
    dataset = Dataset.from_dict({"prompt": ["what is 1 + 2 ?", "hello world"]})
    trainer = GRPOTrainer(
        model=tiny_llama(), reward_funcs=_reward, args=args, train_dataset=dataset, processing_class=tiny_tokenizer()
    )
    root, entered = str(PACKAGE) + "/", set()

    def record(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(root):
            entered.add(frame.f_code.co_filename[len(root) :])

    sys.setprofile(record)
    try:
        trainer.train()
    finally:
        sys.setprofile(None)
    return entered


_TRACE = """
import json, sys, tempfile
import torch
import slimrl
from test_architecture_step import traced_step_files
torch.set_num_threads(1)
slimrl.PatchFastRL("grpo")
print("TRACED " + json.dumps(sorted(traced_step_files(tempfile.mkdtemp()))))
"""


def test_the_page_lists_the_files_one_grpo_step_enters():
    """In a fresh process, as a user's script runs (in-process, earlier tests' RNG use changes the rollouts, and so
    whether the shared-prefix rule packs them)."""
    tests = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PACKAGE.parent), str(tests)]), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", _TRACE], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    traced = set(json.loads(out.stdout.split("TRACED ", 1)[1]))
    assert "patches/setup/trainer_setup.py" in traced and "ops/lean_logprob.py" in traced, (
        "the trace saw no patched step"
    )
    assert step_page_problems(traced, step_entries(_marked("step-files")), _marked("step-narrative")) == []


def test_step_page_check_has_teeth():
    entries, narrative = step_entries(_marked("step-files")), _marked("step-narrative")
    listed = set(entries)
    assert len(listed) > 20 and step_page_problems(listed, entries, narrative) == []
    planted = listed | {"ops/planted.py"}
    assert step_page_problems(planted, entries, narrative) == [
        "the step enters but the list omits ops/planted.py",
        "the narrative does not name ops/planted.py",
    ]
    assert step_page_problems(listed - {"memory.py"}, entries, narrative) == [
        "the list names but the step never enters memory.py"
    ]
    terse = {**entries, "memory.py": "read"}
    assert step_page_problems(listed, terse, narrative) == ["no line on what it does: memory.py"]
    assert step_page_problems(listed, entries, narrative.replace("`memory.py`", "memory")) == [
        "the narrative does not name memory.py"
    ]
    assert named_in("`ops/logprob.py:add_fused_lm_head._fused_forward` `state.py:ModelState.num_chunks` `x.py`") == {
        "ops/logprob.py",
        "state.py",
        "x.py",
    }
    assert named_in("`validation.py:check_config`") == {"validation.py"} != {"patches/setup/validation.py"}


def unit_of(module: str) -> str:
    """The unit the layer order places: a folder under slimrl/, or a module at the package root (`slimrl`: its
    `__init__`)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "slimrl"


def arrows_up(graph: dict[str, set[str]], layers: list[list[str]]) -> list[str]:
    """Imports from a unit to a unit on a line above it, and units the layers do not place."""
    line_of = {unit: i for i, line in enumerate(layers) for unit in line}
    found = []
    for module, imported in sorted(graph.items()):
        source = unit_of(module)
        if source not in line_of:
            found.append(f"{module}: its unit `{source}` is on no line of the layers")
            continue
        for target in sorted(imported):
            if line_of.get(unit_of(target), len(layers)) < line_of[source]:
                found.append(f"{module} -> {target}")
    return found


def test_imports_go_downwards_only():
    layers = page_layers()
    assert len(layers) >= 5 and ["ops"] in layers and ["patches"] in layers, layers
    assert shared_folder_lines(layers) == []
    assert arrows_up(import_graph(), layers) == []


def shared_folder_lines(layers: list[list[str]]) -> list[list[str]]:
    """Lines that hold more than one folder of slimrl/ (one folder a line: no loop hidden on a shared line)."""
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    return [line for line in layers if len(folders & set(line)) > 1]


def test_arrow_up_detection_has_teeth():
    graph = {"slimrl.models.lora": {"slimrl.export.methods"}, "slimrl.export.methods": {"slimrl.models.loading"}}
    assert arrows_up(graph, [["export"], ["models"]]) == ["slimrl.models.lora -> slimrl.export.methods"]
    assert arrows_up(graph, [["models"]]) == ["slimrl.export.methods: its unit `export` is on no line of the layers"]
    assert shared_folder_lines([["patches", "training"], ["state", "swaps"], ["ops"]]) == [["patches", "training"]]
