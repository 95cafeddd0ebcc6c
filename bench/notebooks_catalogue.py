"""Unsloth's RL scripts (python_scripts/ of github.com/unslothai/notebooks), each rewritten for slimrl and run: which
run here, plain and with vLLM, in what time, and which cannot and why (the table of docs/unsloth-notebooks.md).

    python bench/notebooks_catalogue.py NOTEBOOKS_DIR                           # plain, every *.py of the folder
    .venv-vllm/bin/python bench/notebooks_catalogue.py NOTEBOOKS_DIR --vllm     # those with fast_inference, on vLLM
    python bench/notebooks_catalogue.py NOTEBOOKS_DIR --only "Gemma3_(1B)-GRPO.py" --limit-s 600
    python bench/notebooks_catalogue.py --markdown plain.json vllm.json         # the docs table from results files

Choices:
1. Each notebook is rewritten as a user would (scripts/unsloth_notebook.py --datasets DIR --max-seq-length 384, and
   --vllm in the vLLM half), as the notebooks tier does; a notebook the rewriter refuses (exit 2: an environment
   server, FP8, gpt-oss, a Hub dataset with no stand-in) is recorded with its reason and not run.
2. The vLLM half runs only the notebooks that have `fast_inference` (the others: "no fast_inference").
3. The image-text notebooks (they load an image dataset: IMAGE_DATASETS) are not run: the embedded model is
   text-only and no image-text model is there offline.
4. A run is the rewritten script in its own process (a new session: a timeout stops its vLLM engine too) in a fresh
   temporary folder, as a user runs it: PYTHONPATH=src, HF_HUB_OFFLINE=1, patching on import (no
   SLIMRL_NO_AUTO_PATCH), torch's own thread choice (OMP_NUM_THREADS only where the caller has it); --limit-s each.
5. Its outcome: "exits 0"; "stops at `<line>`: <error>", the line being the notebook's own last frame of the
   traceback (the cell that failed; the deepest frame is kept as last_frame) and the error the exception's line;
   "timed out". `trained`: the trainer finished ('train_runtime' printed). wall_s: the run alone, model load included.
Results: bench/results/notebooks_catalogue.json, notebooks_catalogue_vllm.json with --vllm (rows: notebook, mode,
outcome, wall_s, trained, last_frame, tail), written after each notebook.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import results_path, write_results

ROOT = Path(__file__).resolve().parents[1]
REWRITER = ROOT / "scripts" / "unsloth_notebook.py"
DATASETS = ROOT / "tests" / "notebooks" / "unsloth" / "datasets"
IMAGE_DATASETS = ("AI4Math/MathVista",)
TEXT_ONLY = "not run: the embedded model is text-only (no image-text model offline)"
_RANK = re.compile(r"^\[rank\d+\]: ")
_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in ')


def row(notebook: str, mode: str, outcome: str, wall_s: float | None = None, trained: bool = False, **more) -> dict:
    return {"notebook": notebook, "mode": mode, "outcome": outcome, "wall_s": wall_s, "trained": trained, **more}


def rewrite(notebook: Path, out: Path, datasets: Path, vllm: bool) -> str | None:
    """Rewrite the notebook into `out`; None, or why it cannot run ("refused: ...", "not run: ...")."""
    command = [sys.executable, str(REWRITER), str(notebook), "--out", str(out), "--datasets", str(datasets)]
    done = subprocess.run([*command, "--max-seq-length", "384", *["--vllm"] * vllm], capture_output=True, text=True)
    if done.returncode == 0:
        return None
    said = (done.stderr.strip().splitlines() or [""])[-1]
    if done.returncode != 2:
        return f"not run: the rewriter exited {done.returncode}: {said}"
    reason = said.split(": cannot run on slimrl: ", 1)[-1].removeprefix(f"{notebook}: ")
    return "refused: " + re.sub(r": expected \S+$", "", reason)  # the stand-in's path is this machine's


def stopped_at(stderr: str, script: Path) -> tuple[str, str | None]:
    """From a failed run's stderr: (outcome, the deepest frame as "file:line: source" or None). The outcome names the
    notebook's own last frame of the last traceback and the exception's line."""
    lines = [_RANK.sub("", line) for line in stderr.rstrip().splitlines()]  # torch.distributed's "[rank0]: " prefix
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if not starts:
        return "stops: " + (lines[-1].strip() if lines else "no output")[:300], None
    frames, error = [], None
    for i in range(starts[-1] + 1, len(lines)):
        found = _FRAME.match(lines[i])
        if found:
            source = lines[i + 1].strip() if i + 1 < len(lines) and lines[i + 1].startswith("    ") else ""
            frames.append((found["file"], found["line"], source))
        elif not lines[i].startswith(" ") and lines[i].strip():
            error = lines[i].strip()
            break
    error = (error or lines[-1].strip())[:300]
    own = [f for f in frames if os.path.realpath(f[0]) == os.path.realpath(script)]
    deepest = f"{frames[-1][0]}:{frames[-1][1]}: {frames[-1][2]}" if frames else None
    return (f"stops at `{own[-1][2]}`: {error}" if own else f"stops: {error}"), deepest


def run_script(script: Path, cwd: Path, limit_s: float) -> tuple[int | None, str, str, float]:
    """Run the rewritten script as a user does (Choices 4): (exit code or None when timed out, stdout, stderr,
    wall s)."""
    env = {k: v for k, v in os.environ.items() if k != "SLIMRL_NO_AUTO_PATCH"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p)
    env["HF_HUB_OFFLINE"] = "1"
    out_path, err_path = cwd / "stdout.txt", cwd / "stderr.txt"
    start = time.monotonic()
    with open(out_path, "w") as out, open(err_path, "w") as err:
        command = [sys.executable, str(script)]
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=err, start_new_session=True)
        try:
            code = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the script and what it started (a vLLM engine)
            proc.wait()
            code = None
    wall_s = time.monotonic() - start
    return code, out_path.read_text(errors="replace"), err_path.read_text(errors="replace"), wall_s


def catalogue_one(notebook: Path, datasets: Path, vllm: bool, limit_s: float) -> dict:
    """One notebook's row (Choices 1-5)."""
    mode, text = ("vllm" if vllm else "plain"), notebook.read_text()
    if vllm and "fast_inference" not in text:
        return row(notebook.name, mode, "no fast_inference")
    if any(hub_id in text for hub_id in IMAGE_DATASETS):
        return row(notebook.name, mode, TEXT_ONLY)
    with tempfile.TemporaryDirectory(prefix="catalogue-") as scratch:
        cwd = Path(scratch)
        script = cwd / "notebook.py"
        refused = rewrite(notebook, script, datasets, vllm)
        if refused:
            return row(notebook.name, mode, refused)
        code, stdout, stderr, wall_s = run_script(script, cwd, limit_s)
        last_frame = None
        if code == 0:
            outcome = "exits 0"
        elif code is None:
            outcome = "timed out"
        else:
            outcome, last_frame = stopped_at(stderr, script)
        trained = "'train_runtime'" in stdout + stderr
        return row(notebook.name, mode, outcome, round(wall_s, 1), trained, last_frame=last_frame, tail=stderr[-3000:])


def cell(found: dict | None) -> str:
    """One row's markdown cell: the outcome, and whether it trained and its time where it ran."""
    if found is None:
        return "-"
    text = found["outcome"].replace("|", "\\|")
    if found["outcome"] == "no fast_inference":
        return "no `fast_inference`"
    if found.get("wall_s") is None:
        return text
    return f"{text} ({'trained, ' if found['trained'] else ''}{found['wall_s']:.0f} s)"


def markdown(rows: list[dict]) -> str:
    """The docs table: one line per notebook, its plain and its vLLM outcome."""
    by_name: dict[str, dict[str, dict]] = {}
    for found in rows:
        by_name.setdefault(found["notebook"], {})[found["mode"]] = found
    lines = ["| Script | Plain | vLLM |", "| --- | --- | --- |"]
    for name in sorted(by_name):
        modes = by_name[name]
        lines.append(f"| `{name}` | {cell(modes.get('plain'))} | {cell(modes.get('vllm'))} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("notebooks", nargs="?", type=Path, help="a folder of Unsloth's python_scripts/*.py")
    parser.add_argument("--datasets", type=Path, default=DATASETS, help="the rewriter's stand-ins")
    parser.add_argument("--only", nargs="+", help="these notebooks of the folder (file names)")
    parser.add_argument("--vllm", action="store_true", help="the vLLM half (run this in .venv-vllm)")
    parser.add_argument("--limit-s", type=float, default=900, help="the most seconds one notebook may run")
    parser.add_argument("--json", help="results file (default bench/results/notebooks_catalogue[_vllm].json)")
    parser.add_argument("--markdown", nargs="+", metavar="JSON", help="print the table of these results files")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown([r for path in args.markdown for r in json.loads(Path(path).read_text())["rows"]]))
        return 0
    if args.notebooks is None or not args.notebooks.is_dir():
        parser.error("NOTEBOOKS_DIR: a folder of notebooks is needed (or --markdown JSON ...)")
    paths = sorted(args.notebooks.glob("*.py"))
    missing = set(args.only or []) - {p.name for p in paths}
    if missing:
        parser.error(f"not in {args.notebooks}: {', '.join(sorted(missing))}")
    paths = [p for p in paths if not args.only or p.name in args.only]
    out = args.json or results_path("notebooks_catalogue_vllm" if args.vllm else "notebooks_catalogue")
    rows = []
    for path in paths:
        rows.append(catalogue_one(path, args.datasets, args.vllm, args.limit_s))
        found = rows[-1]
        took = "" if found["wall_s"] is None else f" in {found['wall_s']} s" + (", trained" if found["trained"] else "")
        print(f"{found['mode']:>5}  {found['notebook']}: {found['outcome']}{took}", flush=True)
        write_results(out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
