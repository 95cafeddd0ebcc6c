"""bench/gpu_memory.py and scripts/gpu_bench.sh without a GPU: the longest-fit search and its guess (fake probes), the
presets, the pinned GRPO config (TRL's defaults), each arm's set-up on a CPU toy model, the plan beside each arm
(against the committed GPU runs' peaks), the report's ratios and target verdicts, the script's argument checks, and
(slow tier) the --smoke run end to end and the script's CPU run."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "bench")
sys.path.insert(0, BENCH)

import gpu_memory  # noqa: E402

import _gpu_arms as arms  # noqa: E402
import _gpu_measure as measure  # noqa: E402
import _gpu_report as report  # noqa: E402
import _gpu_search as search  # noqa: E402

GiB = 1024**3


@pytest.fixture
def unpatched():
    """Stock TRL before and after (the slimrl arms patch it)."""
    from slimrl.patches import registry

    registry.unpatch()
    yield
    registry.unpatch()


def _probe(limit, seen):
    def probe(length):
        seen.append(length)
        return length <= limit

    return probe


def test_longest_fit_gallops_then_bisects():
    seen = []
    found = search.longest_fit(_probe(20000, seen), start=8192, resolution=1024, maximum=65536)
    assert found["longest"] == 19456 and found["first_failure"] == 20480
    assert seen == [8192, 16384, 32768, 24576, 20480, 18432, 19456]
    assert found["probes"] == [(n, n <= 20000) for n in seen]


def test_longest_fit_from_a_good_guess_takes_few_probes():
    seen = []
    found = search.longest_fit(_probe(20000, seen), start=18432, resolution=1024, maximum=65536, step=1024)
    assert found["longest"] == 19456 and found["first_failure"] == 20480 and len(seen) == 4


@pytest.mark.parametrize("limit, longest, failure", [(3000, 2048, 3072), (100, None, 1024), (10**6, 65536, None)])
def test_longest_fit_below_start_nothing_and_everything(limit, longest, failure):
    found = search.longest_fit(_probe(limit, []), start=8192, resolution=1024, maximum=65536)
    assert (found["longest"], found["first_failure"]) == (longest, failure)


def test_longest_fit_stops_with_the_bracket_when_the_prober_has_no_time_left():
    answers = iter([True, True, False, None])  # 8192 fits, 16384 fits, 32768 fails, then the deadline
    found = search.longest_fit(lambda n: next(answers), start=8192, resolution=1024, maximum=65536)
    assert found["stopped"] and (found["longest"], found["first_failure"]) == (16384, 32768)
    assert [n for n, _ in found["probes"]] == [8192, 16384, 32768]


def test_clock_starts_no_child_after_the_deadline():
    assert gpu_memory.Clock(0).run(["--child", "grpo"], threads=1, timeout=10) is None


def test_guess_from_a_linear_fit_of_the_reserved_peak():
    rows = [
        {"kind": "grpo", "model": "8b", "arm": "stock", "length": n, "reserved": 10 * GiB + n * 2**20}
        for n in (2048, 8192)
    ]
    rows[0]["device_total"] = 80 * GiB
    assert search.guess_longest(rows, "8b", "stock", 1024) == 70 * 1024  # (80 - 10) GiB at 1 MiB per token
    assert search.guess_longest(rows[:1], "8b", "stock", 1024) is None
    assert search.guess_longest(rows, "8b", "slimrl", 1024) is None


def test_presets_fill_what_the_command_line_does_not_give():
    quick = gpu_memory.parse(["--preset", "quick"])
    assert quick.only == ["grpo"] and quick.lengths == [8192] and quick.models == ["8b", "1.5b"]
    assert quick.arms == gpu_memory.GRPO_ARMS and "unsloth" in quick.arms
    given = gpu_memory.parse(["--preset", "quick", "--models", "1.5b", "--steps", "5"])
    assert given.models == ["1.5b"] and given.steps == 5 and given.lengths == [8192]
    smoke = gpu_memory.parse(["--smoke"])
    assert smoke.device == "cpu" and smoke.models == ["smoke"] and smoke.preset == "smoke"


def test_pinned_grpo_fields_are_trl_defaults_and_every_arm_gets_them():
    from trl import GRPOConfig

    defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig) if f.default is not dataclasses.MISSING}
    assert {k: defaults[k] for k in measure.GRPO_PINNED} == measure.GRPO_PINNED
    whole, sliced = measure.grpo_fields(8192, 8, 2, "cuda"), measure.grpo_fields(8192, 8, 2, "cuda", 8)
    assert (whole["per_device_train_batch_size"], whole["gradient_accumulation_steps"]) == (8, 1)
    assert (sliced["per_device_train_batch_size"], sliced["gradient_accumulation_steps"]) == (1, 8)
    assert whole["num_generations"] == sliced["num_generations"] == 8  # the same rows per optimizer step


@pytest.mark.parametrize("arm", arms.ARMS)
def test_each_arm_sets_up_what_it_names(arm, unpatched):
    from peft import PeftModel

    from slimrl.models.checkpointing import checkpointing_mode
    from slimrl.models.lora_speed import levers_on
    from slimrl.patches.registry import is_patched

    model, extra = arms.prepare_arm(arm, "grpo", arms.build_model("smoke", "cpu", 64))
    config = extra.get("config", {})
    assert (config == arms.STOCK_OFFLOAD) == (arm == "stock-offload")
    if arm.startswith("stock"):
        assert not isinstance(model, PeftModel) and "peft_config" in extra["trainer"] and not is_patched("grpo")
        assert sorted(extra["trainer"]["peft_config"].target_modules) == sorted(measure.LORA_TARGETS)
    else:  # slimrl's defaults: its own LoRA targets (the same seven projections) and checkpointing mode
        assert isinstance(model, PeftModel) and is_patched("grpo")
        assert sorted(model.peft_config["default"].target_modules) == sorted(measure.LORA_TARGETS)
        assert checkpointing_mode(model) == ("offload" if arm == "slimrl-offload" else True)
        levers = levers_on(model)  # CPU: "auto" leaves the fused forward off; the arm turns both levers off
        assert levers == {"fused_forward": 0, "input_cast_skipped": 0 if arm == "slimrl-no-lora-levers" else 14}
    with pytest.raises(ValueError, match="arm must be one of"):
        arms.prepare_arm("stock-unknown", "grpo", model)


# The committed GPU runs (H200, torch 2.11, transformers 5.17, trl 1.16): every measured GRPO row the plan models
H200_RESULTS = ("gpu_memory_h200.json", "gpu_memory_h200_1p5b.json")


def _measured_rows() -> list[dict]:
    rows = []
    for name in H200_RESULTS:
        with open(os.path.join(BENCH, "results", "committed", name)) as f:
            rows += [r for r in json.load(f)["rows"] if r["kind"] == "grpo" and r.get("peak") and r["arm"] != "unsloth"]
    return rows


MEASURED = _measured_rows()


def _plan_error(row: dict) -> float:
    from _gpu_plan import planned

    return planned(row, row["device_total"])["planned"] / row["peak"] - 1


def test_the_committed_runs_hold_every_trl_arm_of_both_models():
    assert sorted((r["model"], r["arm"]) for r in MEASURED) == sorted(
        (model, arm)
        for model in ("8b", "1.5b")
        for arm in ("stock", "stock-offload", "stock-ga8", "slimrl", "slimrl-offload")
    )


@pytest.mark.parametrize("row", MEASURED, ids=lambda r: f"{r['model']}-{r['length']}-{r['arm']}")
def test_plan_beside_each_arm_is_within_15_percent_of_the_measured_gpu_peaks(row):
    error = _plan_error(row)
    assert abs(error) <= report.PLAN_TOLERANCE, error


def test_planning_stock_offload_as_offloading_misses_its_peak(monkeypatch):  # the negative control
    import _gpu_plan

    monkeypatch.setitem(_gpu_plan.STOCK_CHECKPOINTING, "stock-offload", "offload")
    rows = [r for r in MEASURED if r["arm"] == "stock-offload"]
    assert rows and all(_plan_error(r) < -report.PLAN_TOLERANCE for r in rows)  # TRL dropped the offload


def test_plan_follows_each_arm():
    from _gpu_plan import planned

    base = {"kind": "grpo", "model": "8b", "length": 8192, "rows": 8}
    peaks = {arm: planned({**base, "arm": arm}, 80 * GiB)["planned"] for arm in ("stock", "stock-offload", "stock-ga8")}
    assert peaks["stock-ga8"] < peaks["stock-offload"] == peaks["stock"]  # a slice of rows at a time holds least
    slimrl = planned({**base, "arm": "slimrl-offload", "settings": {"checkpointing_mode": "offload"}}, 80 * GiB)
    assert slimrl["planned"] < peaks["stock"]
    assert planned({**base, "arm": "unsloth"}, 80 * GiB) == {}  # not modelled


def _run(arm, peak, seconds, planned=None, **extra):
    row = {"kind": "grpo", "arm": arm, "model": "8b", "length": 8192, "rows": 8, "device": "NVIDIA H100"}
    row.update({"oom": False, "peak": peak * GiB, "reserved": peak * GiB, "s_per_step": seconds, "losses": [0.5]})
    row.update(extra)
    return {**row, "planned": planned * GiB} if planned else row


def _fit(arm, longest, failure):
    row = {"kind": "bisect", "arm": arm, "model": "8b", "rows": 8, "longest": longest, "first_failure": failure}
    return dict(row, failure_reason="OOM", probes=[(longest, True), (failure, False)], device="NVIDIA H100")


def test_report_ratios_and_target_verdicts():
    rows = [
        _run("stock", 50, 10.0, planned=51),
        _run("stock-offload", 40, 10.4, planned=39),
        _run("stock-ga8", 30, 12.0),
        _run("slimrl", 18, 10.3, planned=19),
        _run("unsloth", 20, 11.0, unsloth="2026.10.9", trainer_class="UnslothGRPOTrainer", unsloth_changed={}),
        _fit("stock", 14336, 16384),
        _fit("stock-ga8", 90112, 92160),
        _fit("slimrl", 204800, 206848),
    ]
    text = report.render(rows, [{"commit": "abc123"}])
    assert text.startswith("# GRPO on one GPU") and "slimrl commit abc123" in text
    assert "| 8b | 8 x 8192 | slimrl | 18.00 | 18.00 | n/a | 19.00 | 1.06 | 10.30 | 0.36 | 0.60 | 1.03 | 0.5 |" in text
    assert "| 8b | slimrl | 204800 | 206848 (OOM) | 2.27 |" in text  # against the best stock arm (ga8)
    assert "UnslothGRPOTrainer" in text.split("## What Unsloth chose")[1]
    verdicts = [line.split("|")[-2].strip() for line in text.split("## Targets")[1].strip().splitlines()[2:]]
    # 0.36 <= 0.40, 0.45 <= 0.50, 1.03 <= 1.05, 0.90 <= 1, 0.94 <= 1, 2.27 >= 2, 1.02 >= 1, plan within 0.06
    assert verdicts == ["met"] * 8


def test_report_marks_out_of_memory_missing_rows_and_unmet_targets():
    rows = [_run("stock", 0, 0.0, oom=True), _run("slimrl", 27, 11.0, planned=20)]
    text = report.render(rows)
    assert "| stock | 0.00 | 0.00 | n/a | n/a | n/a | OOM | OOM | OOM | OOM |" in text
    assert "| slimrl | 27.00 | 27.00 | n/a | 20.00 | 0.74 | 11.00 | n/a | n/a | n/a |" in text  # no stock to divide by
    targets = text.split("## Targets")[1]
    assert targets.count("not measured") == 7 and "| 0.26 | NOT met |" in targets  # the plan 26% off


def _script(*args, **env):
    return subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "gpu_bench.sh"), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, **env),
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--preset", "fast", "--out", "x"], "--preset must be quick or full"),
        (["--preset", "quick"], "--out DIR is required"),
        (["--out", "x", "--budget", "ten"], "--budget and --tier-seconds take seconds"),
        (["--bogus"], "unknown argument: --bogus"),
    ],
)
def test_script_refuses_bad_arguments_before_any_work(args, message):
    proc = _script(*args)
    assert proc.returncode == 2 and message in proc.stderr


@pytest.mark.slow
def test_script_runs_the_tier_then_the_bench_on_cpu(tmp_path):
    """No CUDA: the tier is collected and skipped (ALLOW_NO_GPU=1), then the bench's CPU smoke for two arms, both run by
    this test's interpreter ($PYTHON; the system python3 may have no torch)."""
    empty = tmp_path / "wheels"
    empty.mkdir()
    out = tmp_path / "out"
    proc = _script(
        "--out", str(out), "--budget", "500", "--", "--smoke", "--only", "grpo", "--arms", "stock", "slimrl",
        ALLOW_NO_GPU="1", WHEEL_DIR=str(empty), OMP_NUM_THREADS="1", PYTHON=sys.executable,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "gpu_tier.status").read_text().strip() == "0"
    results = json.loads((out / "bench" / "gpu_memory.json").read_text())
    assert [r["arm"] for r in results["rows"]] == ["stock", "slimrl"] and results["meta"]["commit"]
    assert all("error" not in r for r in results["rows"])
    assert "## Targets" in (out / "bench" / "gpu_memory.md").read_text()


@pytest.mark.slow
def test_smoke_run_end_to_end(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.path.join(ROOT, "src"))
    proc = subprocess.run(
        [sys.executable, os.path.join(BENCH, "gpu_memory.py"), "--smoke", "--out", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((tmp_path / "gpu_memory.json").read_text())["rows"]
    runs = [r for r in rows if r["kind"] in ("grpo", "pref")]
    assert len(runs) == 4 + 2 * 3 and all(not r["oom"] and "error" not in r for r in runs)
    assert all(r["mean_length"] == [16.0, 16.0] for r in runs if r["kind"] == "grpo")  # the forced length
    assert all(r["peak"] >= r["resident"] > 0 for r in runs)
    for kind, trainer in (("grpo", None), ("pref", "dpo"), ("pref", "orpo")):  # the same first step in every arm
        first = [r["losses"][0] for r in runs if r["kind"] == kind and r.get("trainer") == trainer]
        assert all(loss == pytest.approx(first[0], rel=1e-5, abs=1e-7) for loss in first)
    assert all("planned" in r for r in runs if r["kind"] == "grpo")
    assert [r["longest"] for r in rows if r["kind"] == "bisect"] == [16] * 4
    assert len(os.listdir(tmp_path / "logs")) == len([r for r in rows if r["kind"] != "bisect"])
    assert "## Targets" in proc.stdout
