"""The results file every bench script writes (bench/_common.py's write_results): provenance, what the script printed
and its data; every script writes through it; git keeps bench/results/committed/ and the JSON files directly in
bench/results/."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import _common  # noqa: E402

# json.dump( outside write_results: only files that are not results (a competitor's rate handed to its parent)
NOT_RESULTS = {"busy_machine.py": 1}


def test_a_results_file_holds_provenance_what_was_printed_and_the_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stdout", _common._KeptStdout(sys.stdout))
    monkeypatch.setattr(sys, "argv", [str(ROOT / "bench" / "x.py"), "--steps", "2"])
    print("| arm | peak GiB |\n| slimrl | 1.29 |")
    written = json.loads(Path(_common.write_results(str(tmp_path / "r" / "x.json"), [{"peak": 1.2866}])).read_text())
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    provenance = written["provenance"]
    assert provenance["commit"] == head and isinstance(provenance["uncommitted_changes"], bool)
    assert provenance["command"] == "python bench/x.py --steps 2"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", provenance["date"])
    assert provenance["machine"]["cores"] == os.cpu_count() and provenance["machine"]["cpu"]
    assert {"python", "torch", "transformers", "trl", "peft", "slimrl"} <= set(provenance["versions"])
    assert "| slimrl | 1.29 |" in written["stdout"] and written["rows"] == [{"peak": 1.2866}]


def test_uncommitted_changes_means_the_code_not_the_results_file_written(tmp_path, monkeypatch):
    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True)

    results = tmp_path / "bench" / "results" / "committed" / "x.json"
    results.parent.mkdir(parents=True)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "code.py").write_text("A = 1\n")
    results.write_text("{}")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "x")
    monkeypatch.setattr(_common, "ROOT", str(tmp_path))
    written = json.loads(Path(_common.write_results(str(results), {"peak": 1.0})).read_text())
    assert written["provenance"]["uncommitted_changes"] is False  # the results file it replaces is not code
    (tmp_path / "src" / "code.py").write_text("A = 2\n")
    written = json.loads(Path(_common.write_results(str(results), {"peak": 1.0})).read_text())
    assert written["provenance"]["uncommitted_changes"] is True


def test_only_a_bench_script_run_as_such_keeps_its_output():
    assert _common.is_bench_script(str(ROOT / "bench" / "grpo_memory.py"))
    assert not _common.is_bench_script(str(ROOT / "tests" / "bench" / "test_results_file.py"))
    assert not _common.is_bench_script(None)
    assert not isinstance(sys.stdout, _common._KeptStdout)  # importing _common in a test changed nothing


def test_every_bench_script_writes_its_results_through_the_one_helper():
    scripts = sorted(p for p in (ROOT / "bench").glob("*.py") if not p.name.startswith("_"))
    assert len(scripts) >= 15
    for script in scripts:
        text = script.read_text()
        assert "write_results(" in text, f"{script.name} writes no results file (bench/_common.py's write_results)"
        assert text.count("json.dump(") == NOT_RESULTS.get(script.name, 0), f"{script.name} writes JSON itself"


def test_committed_results_are_kept_by_git_and_scratch_results_are_not():
    def ignored(path: str) -> bool:
        return subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0

    assert not ignored("bench/results/committed/grpo_memory.json") and not ignored("bench/results/grpo_memory.json")
    assert ignored("bench/results/gpu_memory/logs/001-grpo.log")  # a run's other output stays scratch
