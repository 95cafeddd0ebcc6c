"""bench/notebooks_catalogue.py on notebooks of a few lines (no model): each outcome it records (exits 0, stops at a
line, timed out, refused by the rewriter, skipped), whether the trainer finished, and the docs table it renders."""

import json
import os
import sys
import textwrap
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))

import notebooks_catalogue as bench  # noqa: E402


def notebook(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def one(path: Path, vllm: bool = False, limit_s: float = 60) -> dict:
    return bench.catalogue_one(path, bench.DATASETS, vllm, limit_s)


def test_a_notebook_that_exits_0_and_whether_its_trainer_finished(tmp_path):
    trains = one(notebook(tmp_path, "A.py", "print({'train_runtime': 1.5, 'train_loss': 0.1})\n"))
    assert trains["outcome"] == "exits 0" and trains["trained"] and trains["mode"] == "plain"
    assert isinstance(trains["wall_s"], float) and trains["last_frame"] is None
    silent = one(notebook(tmp_path, "B.py", "x = 1\n"))  # negative control: nothing printed, nothing trained
    assert silent["outcome"] == "exits 0" and not silent["trained"]


def test_a_failure_names_the_notebooks_own_line_and_the_error(tmp_path):
    text = """\
    import json
    print({'train_runtime': 2.0})

    config = json.loads("{")
    print("never")
    """
    found = one(notebook(tmp_path, "C.py", text))
    error = "json.decoder.JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    assert found["outcome"] == f'stops at `config = json.loads("{{")`: {error}', found
    assert found["trained"] and "json/decoder.py:" in found["last_frame"]  # the deepest frame, in the library
    # a top-level import, as the first vLLM-only cell of a notebook run without vLLM
    found = one(notebook(tmp_path, "D.py", "from no_such_module_here import SamplingParams\n"))
    assert found["outcome"] == (
        "stops at `from no_such_module_here import SamplingParams`: "
        "ModuleNotFoundError: No module named 'no_such_module_here'"
    )
    assert not found["trained"]
    # a process with a vLLM engine (torch.distributed) prefixes each line of its traceback with its rank
    script = tmp_path / "notebook.py"
    ranked = f"""[rank0]: Traceback (most recent call last):
[rank0]:   File "{script}", line 347, in <module>
[rank0]:     import langid
[rank0]: ModuleNotFoundError: No module named 'langid'
"""
    assert bench.stopped_at(ranked, script) == (
        "stops at `import langid`: ModuleNotFoundError: No module named 'langid'",
        f"{script}:347: import langid",
    )


def test_a_run_past_its_limit_is_stopped_with_what_it_started(tmp_path):
    pid_file = tmp_path / "child.pid"
    text = f"""\
    import os, time
    if os.fork() == 0:
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        time.sleep(60)
        os._exit(0)
    time.sleep(60)
    """
    start = time.monotonic()
    found = one(notebook(tmp_path, "E.py", text), limit_s=3)
    assert found["outcome"] == "timed out" and 3 <= found["wall_s"] < 30 and time.monotonic() - start < 30
    child = int(pid_file.read_text())  # what the notebook started (a vLLM engine's process, say)
    time.sleep(0.5)
    assert _state(child) in (None, "Z"), f"{child} still runs"  # gone, or a zombie left for init to reap


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def test_refused_skipped_and_image_text_notebooks_are_not_run(tmp_path):
    refused = one(notebook(tmp_path, "F.py", 'model_name = "unsloth/gpt-oss-20b"\nprint("ran")\n'))
    assert refused["outcome"] == "refused: gpt-oss models are not supported" and refused["wall_s"] is None
    text = 'from datasets import load_dataset\nd = load_dataset("someone/not-here", split = "train")\n'
    no_stand_in = one(notebook(tmp_path, "G.py", text))
    assert no_stand_in["outcome"] == 'refused: no stand-in for load_dataset("someone/not-here")'
    plain = notebook(tmp_path, "H.py", "print({'train_runtime': 1.0})\n")
    assert one(plain, vllm=True)["outcome"] == "no fast_inference"
    assert one(plain)["outcome"] == "exits 0"  # negative control: the same notebook runs plain
    vision = notebook(tmp_path, "I.py", 'load_dataset("AI4Math/MathVista", split = "testmini")\n')
    assert one(vision)["outcome"] == bench.TEXT_ONLY and one(vision, vllm=True)["outcome"] == "no fast_inference"


def test_markdown_table_from_plain_and_vllm_rows():
    rows = [
        bench.row("B.py", "plain", "stops at `from vllm import SamplingParams`: ModuleNotFoundError: x", 120.44, True),
        bench.row("A.py", "plain", "exits 0", 300.6, True),
        bench.row("B.py", "vllm", "exits 0", 250.0, True),
        bench.row("A.py", "vllm", "no fast_inference"),
        bench.row("C.py", "plain", "refused: gpt-oss models are not supported"),
        bench.row("D.py", "plain", "stops at `a | b`: TypeError", 5.0, False),
    ]
    assert bench.markdown(rows).splitlines() == [
        "| Script | Plain | vLLM |",
        "| --- | --- | --- |",
        "| `A.py` | exits 0 (trained, 301 s) | no `fast_inference` |",
        "| `B.py` | stops at `from vllm import SamplingParams`: ModuleNotFoundError: x (trained, 120 s) "
        "| exits 0 (trained, 250 s) |",
        "| `C.py` | refused: gpt-oss models are not supported | - |",
        "| `D.py` | stops at `a \\| b`: TypeError (5 s) | - |",
    ]


def test_main_runs_only_the_named_notebooks_and_renders_its_results(tmp_path, capsys):
    folder = tmp_path / "nbs"
    folder.mkdir()
    notebook(folder, "A.py", "print({'train_runtime': 1.0})\n")
    notebook(folder, "B.py", "raise SystemExit(3)\n")
    results = tmp_path / "plain.json"
    assert bench.main([str(folder), "--only", "A.py", "--json", str(results)]) == 0
    rows = json.loads(results.read_text())["rows"]
    assert [(r["notebook"], r["outcome"], r["trained"]) for r in rows] == [("A.py", "exits 0", True)]
    capsys.readouterr()
    assert bench.main(["--markdown", str(results)]) == 0
    assert "| `A.py` | exits 0 (trained, " in capsys.readouterr().out
