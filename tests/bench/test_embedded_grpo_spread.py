"""bench/embedded_grpo.py --spread (no training: the command is replaced by one that writes an output folder): one
row of `runs` per (precision, threads, seed) with the fields the main job's spread is judged by, the worst accuracy
taken over every run, and a failed run counted (not dropped) and failing the command; --merge joins parts into
one file whose summary is taken over every part."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))

import embedded_grpo  # noqa: E402

ROW_FIELDS = {"seed", "precision", "threads", "cpu", "accuracy_before", "accuracy_after", "wall_s"}


def fake_cli(tmp_path, fail_seed=None):
    """A stand-in for run_cli: writes eval.json and metrics.jsonl; the accuracy after depends on the seed."""

    def run(command, threads):
        out = tmp_path / command[command.index("--output_dir") + 1]
        seed = int(command[command.index("--seed") + 1])
        if seed == fail_seed:
            return 1, 2.0
        out.mkdir(parents=True)
        summary = {"accuracy_before": 0.3, "accuracy_after": 0.6 + seed / 100, "train_seconds": 5.0}
        (out / "eval.json").write_text(json.dumps(summary))
        (out / "metrics.jsonl").write_text(json.dumps({"reward": 1.0}) + "\n")
        return 0, 10.0 * threads

    return run


def test_one_row_per_precision_threads_and_seed(tmp_path, monkeypatch):
    monkeypatch.setattr(embedded_grpo, "ROOT", str(tmp_path))
    monkeypatch.setattr(embedded_grpo, "run_cli", fake_cli(tmp_path))
    results = tmp_path / "spread.json"
    argv = ["--spread", "--seeds", "1", "2", "--output_dir", "runs", "--json", str(results)]
    assert embedded_grpo.spread(argv) == 0
    data = json.loads(results.read_text())
    runs = data["runs"]
    assert len(runs) == 8 and all(ROW_FIELDS <= set(r) for r in runs)
    combos = {(r["precision"], r["threads"], r["seed"]) for r in runs}
    assert combos == {(p, t, s) for p in ("float32", "bfloat16") for t in (1, 2) for s in (1, 2)}
    assert runs[0]["command"].endswith("--dtype float32 --seed 1")
    assert data["worst_accuracy_after"] == 0.61 and data["best_accuracy_after"] == 0.62
    assert data["longest_wall_s"] == 20.0 and data["failed"] == 0


def test_a_failed_run_is_kept_and_fails_the_command(tmp_path, monkeypatch):
    monkeypatch.setattr(embedded_grpo, "ROOT", str(tmp_path))
    monkeypatch.setattr(embedded_grpo, "run_cli", fake_cli(tmp_path, fail_seed=2))
    results = tmp_path / "spread.json"
    argv = ["--spread", "--seeds", "1", "2", "--precisions", "float32", "--thread_counts", "1", "--json", str(results)]
    assert embedded_grpo.spread(argv + ["--output_dir", "runs"]) == 1
    data = json.loads(results.read_text())
    assert data["failed"] == 1 and [r["returncode"] for r in data["runs"]] == [0, 1]
    assert data["worst_accuracy_after"] == 0.61  # over the runs that finished


def test_merge_joins_the_parts_and_takes_the_worst_over_all(tmp_path, monkeypatch):
    monkeypatch.setattr(embedded_grpo, "ROOT", str(tmp_path))
    monkeypatch.setattr(embedded_grpo, "run_cli", fake_cli(tmp_path))
    common = ["--spread", "--thread_counts", "1", "--output_dir", "runs"]
    for precision, seed in (("float32", "3"), ("bfloat16", "1")):
        argv = common + ["--precisions", precision, "--seeds", seed, "--json", str(tmp_path / f"{precision}.json")]
        assert embedded_grpo.spread(argv) == 0
    parts = [str(tmp_path / "float32.json"), str(tmp_path / "bfloat16.json")]
    joined = tmp_path / "joined.json"
    assert embedded_grpo.merge(["--merge", *parts, "--json", str(joined), "--note", "one core each"]) == 0
    data = json.loads(joined.read_text())
    assert [(r["precision"], r["seed"]) for r in data["runs"]] == [("float32", 3), ("bfloat16", 1)]
    assert data["worst_accuracy_after"] == 0.61 and data["best_accuracy_after"] == 0.63  # across the two parts
    assert [p["file"] for p in data["parts"]] == ["float32.json", "bfloat16.json"] and data["note"] == "one core each"
    assert all("commit" in p["provenance"] for p in data["parts"])


def test_merge_fails_when_a_part_holds_a_failed_run(tmp_path, monkeypatch):
    monkeypatch.setattr(embedded_grpo, "ROOT", str(tmp_path))
    monkeypatch.setattr(embedded_grpo, "run_cli", fake_cli(tmp_path, fail_seed=2))
    part = tmp_path / "part.json"
    argv = ["--spread", "--seeds", "1", "2", "--precisions", "float32", "--thread_counts", "1", "--json", str(part)]
    assert embedded_grpo.spread(argv + ["--output_dir", "runs"]) == 1
    assert embedded_grpo.merge(["--merge", str(part), "--json", str(tmp_path / "joined.json")]) == 1
