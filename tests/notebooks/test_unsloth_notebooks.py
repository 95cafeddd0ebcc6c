"""The notebooks tier, Unsloth's own notebooks (`bash scripts/test_notebooks.sh`). Each notebook of
tests/notebooks/unsloth/ (vendored unmodified from github.com/unslothai/notebooks, LGPL-3.0: README.md there) is
rewritten by scripts/unsloth_notebook.py as a user would rewrite it (imports, model, device, 2 training steps,
`fast_inference = False`; --datasets: its Hub datasets served from the stand-ins of tests/notebooks/unsloth/datasets;
--max-seq-length 384) and run in its own process, patching on import. Plain: generation through transformers; a
notebook must get as far as its row of ENDS says: to its end (exit 0) or, where a later cell needs vLLM, to that
cell, which must then be the one that fails, for want of vLLM, after the notebook's training. With vLLM (the
rewriter's --vllm: `fast_inference = True`, on a CPU the engine's share of RAM 0.1 and an eager engine; run in
.venv-vllm by the tier's vLLM half): each notebook that has `fast_inference` runs to its end (VLLM_ENDS). Each run's
wall time is printed (`pytest -rP` shows it); with SLIMRL_NOTEBOOKS_RESULTS=PATH it is also written to that results
file (bench/_common.py's provenance, one row per notebook). A notebook gets OMP_NUM_THREADS = the usable cores
unless the caller set it; SLIMRL_NOTEBOOKS_THREADS=torch leaves it unset, as in a user's notebook (torch's own choice
and slimrl's busy-machine policy: bench/notebooks_unsloth.py)."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

pytestmark = pytest.mark.notebooks

ROOT = pathlib.Path(__file__).resolve().parents[2]
VENDORED = ROOT / "tests" / "notebooks" / "unsloth"
REWRITE = ["--datasets", str(VENDORED / "datasets"), "--max-seq-length", "384"]
NO_VLLM = "ModuleNotFoundError: No module named 'vllm'"


@dataclass(frozen=True)
class Ends:
    saved: tuple[str, ...] = ()  # files its cells must have written
    printed: tuple[str, ...] = ("'train_runtime'",)  # in its output: the trainer finished
    vllm_cell: str | None = None  # None: exits 0; else the source line of its first vLLM-only cell


ENDS = {
    "Gemma3_(1B)-GRPO.py": Ends(saved=("gemma_3_lora/adapter_model.safetensors", "gemma_3_lora/tokenizer.json")),
    "Llama3_(8B)-ORPO.py": Ends(saved=("llama_lora/adapter_model.safetensors", "llama_lora/tokenizer.json")),
    # the SFT warm-up, its generate cell and the GRPO dataset cells run; GRPO's config imports vllm.SamplingParams
    "Qwen3_(4B)-GRPO.py": Ends(vllm_cell="from vllm import SamplingParams"),
}


# fast_inference = True: training with vLLM rollouts, fast_generate before and after save_lora / load_lora
VLLM_ENDS = {"Qwen3_(4B)-GRPO.py": Ends(saved=("grpo_saved_lora/adapter_model.safetensors",))}


def test_every_vendored_notebook_is_checked():
    assert {p.name for p in VENDORED.glob("*.py")} == set(ENDS)
    has_engine = {p.name for p in VENDORED.glob("*.py") if "fast_inference" in p.read_text()}
    assert has_engine == set(VLLM_ENDS)
    assert (VENDORED / "LICENSE").is_file() and "bdda2efc" in (VENDORED / "README.md").read_text()


def _run(notebook: pathlib.Path, cwd: pathlib.Path, vllm: bool = False) -> tuple[subprocess.CompletedProcess, float]:
    script = cwd / "notebook.py"
    rewrite = [sys.executable, str(ROOT / "scripts" / "unsloth_notebook.py"), str(notebook), "--out", str(script)]
    subprocess.run(rewrite + REWRITE + ["--vllm"] * vllm, check=True, capture_output=True, text=True)
    env = {k: v for k, v in os.environ.items() if k != "SLIMRL_NO_AUTO_PATCH"}  # a user's environment
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    if os.environ.get("SLIMRL_NOTEBOOKS_THREADS") != "torch":
        env.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    return proc, time.monotonic() - start


def _record(name: str, ends: str, wall_s: float) -> None:
    print(f"{name}: {ends} in {wall_s:.0f} s wall")
    path = os.environ.get("SLIMRL_NOTEBOOKS_RESULTS")
    if not path:
        return
    sys.path.insert(0, str(ROOT / "bench"))
    from _common import write_results

    rows = json.loads(pathlib.Path(path).read_text())["rows"] if os.path.exists(path) else []
    rows = [r for r in rows if r["notebook"] != name] + [{"notebook": name, "ends": ends, "wall_s": round(wall_s, 1)}]
    write_results(path, sorted(rows, key=lambda r: r["notebook"]))


@pytest.mark.parametrize("name", sorted(ENDS))
def test_unsloth_notebook_runs_to_where_it_must(name, tmp_path):
    ends = ENDS[name]
    if ends.vllm_cell and importlib.util.find_spec("vllm") is not None:
        pytest.skip("its vLLM cells have not been verified on slimrl: this row expects an interpreter without vLLM")
    proc, wall_s = _run(VENDORED / name, tmp_path)
    out = proc.stdout + proc.stderr
    if ends.vllm_cell is None:
        assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    else:  # the traceback's last frame is that cell, and nothing but the missing vLLM stopped it
        last_frame = proc.stderr.rstrip().splitlines()[-2:]
        assert proc.returncode == 1 and last_frame == [f"    {ends.vllm_cell}", NO_VLLM], proc.stderr[-4000:]
    for text in ends.printed:
        assert text in out, f"{name}: {text} not printed"
    for saved in ends.saved:
        assert (tmp_path / saved).is_file(), f"{name} did not save {saved}"
    _record(name, "exits 0" if ends.vllm_cell is None else f"stops at `{ends.vllm_cell}`", wall_s)


@pytest.mark.parametrize("name", sorted(VLLM_ENDS))
def test_unsloth_notebook_runs_to_its_end_with_vllm(name, tmp_path):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed in this interpreter (bash scripts/install_vllm.sh, then .venv-vllm)")
    ends = VLLM_ENDS[name]
    proc, wall_s = _run(VENDORED / name, tmp_path, vllm=True)
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    for text in ends.printed:
        assert text in proc.stdout + proc.stderr, f"{name}: {text} not printed"
    for saved in ends.saved:
        assert (tmp_path / saved).is_file(), f"{name} did not save {saved}"
    _record(f"{name} (vLLM)", "exits 0", wall_s)
