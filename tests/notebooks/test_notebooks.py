"""The notebooks tier (`bash scripts/test_notebooks.sh`): each script of examples/notebooks/, written in the shape of
one of Unsloth's RL notebooks, runs to its end as a user runs it: its own process, patching on import (no
SLIMRL_NO_AUTO_PATCH), two training steps on the embedded model, the inference and save cells included. "plain"
generates through transformers; "vllm" passes --fast_inference and needs vLLM in this interpreter (.venv-vllm)."""

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.notebooks

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "examples" / "notebooks").glob("*.py"))
# what each script must leave behind: its save cells ran
SAVED = {
    "grpo_reasoning.py": ["grpo_saved_lora/adapter_model.safetensors", "model/adapter_config.json", "model_merged"],
    "dpo.py": ["dpo_model/adapter_model.safetensors"],
    "orpo.py": ["lora_model/adapter_model.safetensors", "model_gguf"],
    "game_2048.py": ["game_lora/adapter_model.safetensors"],
}


def test_every_script_is_checked():
    assert {path.name for path in SCRIPTS} == set(SAVED)


@pytest.mark.parametrize("mode", ["plain", "vllm"])
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.stem)
def test_notebook_runs_to_its_end(script, mode, tmp_path):
    if mode == "vllm" and importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed in this interpreter (bash scripts/install_vllm.sh, then .venv-vllm)")
    env = {k: v for k, v in os.environ.items() if k != "SLIMRL_NO_AUTO_PATCH"}  # a user's environment
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))
    if script.name == "game_2048.py":
        from _layers_here import missing_here

        if missing_here():  # there the sandbox refuses model code by default: this run accepts the weaker one
            env["SLIMRL_SANDBOX_ALLOW_WEAKER"] = "1"
    command = [sys.executable, str(script)] + (["--fast_inference"] if mode == "vllm" else [])
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{script.name} ({mode}) exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    for saved in SAVED[script.name]:
        assert (tmp_path / saved).exists(), f"{script.name} ({mode}) did not save {saved}"
