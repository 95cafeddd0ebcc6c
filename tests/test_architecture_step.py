"""docs/architecture.md stays true: the files one GRPO step enters, and the layer order imports follow.

1. One tiny GRPO optimizer step (set-up excluded), in a fresh process, runs under `sys.setprofile`; the slimrl files
   it enters must be exactly the list marked `step-files` on the page.
2. Imports go downwards only: each module's folder (or, at the package root, the module) sits on one line of the
   page's `layers` block, top to bottom, and imports only from its own line or the lines below (function-level
   imports counted; cycles among modules are forbidden by test_architecture.py).
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


def page_step_files() -> set[str]:
    return set(re.findall(r"`([\w/]+\.py)`", _marked("step-files")))


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
    assert "patches/trainer_setup.py" in traced and "ops/lean_logprob.py" in traced, "the trace saw no patched step"
    listed = page_step_files()
    assert traced == listed, f"step enters but the page omits {sorted(traced - listed)}; page lists but the step " + (
        f"never enters {sorted(listed - traced)}"
    )


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
    assert len(layers) >= 5 and ["ops", "tasks"] in layers, layers
    assert arrows_up(import_graph(), layers) == []


def test_arrow_up_detection_has_teeth():
    graph = {"slimrl.models.lora": {"slimrl.export.methods"}, "slimrl.export.methods": {"slimrl.models.loading"}}
    assert arrows_up(graph, [["export"], ["models"]]) == ["slimrl.models.lora -> slimrl.export.methods"]
    assert arrows_up(graph, [["models"]]) == ["slimrl.export.methods: its unit `export` is on no line of the layers"]
