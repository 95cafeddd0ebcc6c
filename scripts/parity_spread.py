"""How far float32 lands from the float64 reference, per rollout seed: stock TRL, slimrl with the shared-prefix forward
and slimrl without it, on one GRPO case of the parity suite (LoRA, beta 0.04, num_iterations 2, batch 4 of 2
generations, 7 completion tokens). A loss is one number: its error is one draw of the rounding, so one seed's
patched / stock ratio says little; the spread over seeds says whether a path is systematically worse.

    OMP_NUM_THREADS=1 python3 scripts/parity_spread.py vespo 12 [--json FILE]
    OMP_NUM_THREADS=1 python3 scripts/parity_spread.py ipo-shared 8 [--json FILE]

Prints per seed |loss - ref| of both micro-steps and the largest relative error of the second step's gradients,
then the geometric mean of each column over the seeds; `--json FILE` also writes them as a results file (with
the commit, machine and versions: bench/_common.write_results).

`ipo-shared`: the IPO case of tests/patches/trainers/test_implicit_prompt_parity.py (`dpo-conversational-shared`) with
the
tiny model's weights drawn from each seed (the suite uses seed 0), sharing on and off: per seed and path, the largest
e(patched) / bound of _parity's rule over the second step's gradients (above 1 fails), and the geometric mean of
e(patched) / e(stock) over them.
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests/patches")]

import torch  # noqa: E402

from slimrl.patches import registry  # noqa: E402
from slimrl.patches.setup.shared_prefix_rules import CONFIG_FIELD  # noqa: E402

import _parity as P  # noqa: E402
import _rl_parity as R  # noqa: E402
import _tiny as T  # noqa: E402

RUNS = {  # name: (harness side, slimrl's config fields)
    "stock": ("stock", {}),
    "shared": ("patched", {CONFIG_FIELD: True}),
    "per-row": ("patched", {CONFIG_FIELD: False}),
    "reference": ("reference", {}),
}


def one_seed(loss_type: str, seed: int, output_dir: str) -> dict[str, tuple[float, float, float]]:
    """Per run: (|loss_0 - ref|, |loss_1 - ref|, largest relative error of a second-step gradient)."""
    config = dict(loss_type=loss_type, beta=0.04, num_iterations=2, per_device_train_batch_size=4, num_generations=2)
    trainers, traces = {}, {}
    for name, (side, fields) in RUNS.items():
        with P.side_state(side, "grpo"):
            args = R.make_config("grpo", output_dir, **R.side_config(side, config, 3, fields))
            model = P.side_model(side, lambda: T.tiny_model(0))
            trainers[name] = P.finish_side(side, R.build_trainer("grpo", model, args, T.lora_config()))
        traces[name] = P.Trace()
    generation_batch = R.generation_batch(trainers["stock"].args)
    for step in range(2):
        for name, (side, _) in RUNS.items():
            with P.side_state(side, "grpo"):
                R.micro_step(trainers[name], generation_batch, seed + 100 * step, traces[name])
        for trainer in trainers.values():
            P.sgd_step(trainer, R.SGD_LR)
    ref = traces["reference"]
    out = {}
    for name in ("stock", "shared", "per-row"):
        trace = traces[name]
        grad_err = max(P.rel_err(trace.grads[1][n], ref.grads[1][n]) for n in ref.grads[1])
        out[name] = (abs(trace.losses[0] - ref.losses[0]), abs(trace.losses[1] - ref.losses[1]), grad_err)
    return out


def geomean(values) -> float:
    """The geometric mean (a value of 0 counts as 1e-30)."""
    values = list(values)
    return math.exp(sum(math.log(max(v, 1e-30)) for v in values) / len(values))


def ipo_seed(seed: int, shared: bool, output_dir: str) -> tuple[float, float]:
    """(largest e(patched) / bound, geometric mean of e(patched) / e(stock)) over the second step's gradients of the
    IPO implicit-prompt case, the model's weights from `seed`; the checks are _parity's own, recorded to a file."""
    import json
    import os

    import _formats as F
    import _pref_parity as H

    report = Path(output_dir) / f"report-{seed}-{shared}.jsonl"
    before = {k: os.environ.get(k) for k in (P.REPORT_ENV, P.SURVEY_ENV)}
    os.environ.update({P.REPORT_ENV: str(report), P.SURVEY_ENV: "1"})
    try:
        trainers = H.build_sides(
            "dpo",
            lambda: T.tiny_model(seed),
            dict(loss_type=["ipo"]),
            output_dir,
            T.lora_config(),
            patched_config={CONFIG_FIELD: shared},
            data=lambda: F.dataset("conversational_implicit_preference"),
        )
        H.assert_traces_match(H.run_sides("dpo", trainers))
    finally:  # the caller's own settings back as they were
        for key, value in before.items():
            if value is None:
                os.environ.pop(key)
            else:
                os.environ[key] = value
    checks = [json.loads(line) for line in report.read_text().splitlines()]
    grads = [c for c in checks if c["what"].startswith("micro-step 1: grad") and c["e_stock"] > 0]
    ratio = max(c["e_patched"] / c["bound"] for c in grads)
    return ratio, geomean(c["e_patched"] / c["e_stock"] for c in grads)


def main_ipo(seeds: int) -> dict:
    print("| seed | shared: max e/bound | shared: e(patched)/e(stock) | per-row: max e/bound | per-row: ratio |")
    print("|---|---|---|---|---|")
    per_seed = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(seeds):
            row = {name: ipo_seed(seed, shared, tmp) for name, shared in (("shared", True), ("per-row", False))}
            per_seed.append(row)
            print(f"| {seed} | " + " | ".join(f"{x:.2f}" for r in row.values() for x in r) + " |", flush=True)
    means = {n: geomean(r[n][1] for r in per_seed) for n in ("shared", "per-row")}
    print(f"| geometric mean | | {means['shared']:.2f} | | {means['per-row']:.2f} |")
    return {"case": "ipo-shared", "seeds": seeds, "per_seed": per_seed}


def main(argv: list[str]) -> int:
    json_path = argv[argv.index("--json") + 1] if "--json" in argv else None
    if json_path:
        sys.path.insert(0, str(ROOT))
        from bench._common import keep_stdout, write_results

        keep_stdout()
        argv = [a for a in argv if a not in ("--json", json_path)]
    loss_type, seeds = (argv + ["vespo"])[0], int((argv + ["vespo", "12"])[1])
    registry.unpatch()
    torch.set_num_threads(1)
    if loss_type == "ipo-shared":
        result = main_ipo(seeds)
        if json_path:
            write_results(json_path, result)
        return 0
    rows = []
    names = ("stock", "shared", "per-row")
    print("| seed | " + " | ".join(f"{n} loss 0 | {n} loss 1 | {n} grad 1" for n in names) + " |")
    print("|---" * 10 + "|")
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(seeds):
            result = one_seed(loss_type, seed, tmp)
            rows.append(result)
            cells = " | ".join(f"{x:.1e}" for name in ("stock", "shared", "per-row") for x in result[name])
            print(f"| {seed} | {cells} |", flush=True)

    means = " | ".join(
        f"{geomean([r[name][i] for r in rows]):.1e}" for name in ("stock", "shared", "per-row") for i in range(3)
    )
    print(f"| geometric mean | {means} |")
    if json_path:
        columns = ("loss 0", "loss 1", "grad 1")
        per_seed = [{name: dict(zip(columns, r[name])) for name in names} for r in rows]
        write_results(json_path, {"loss_type": loss_type, "seeds": seeds, "per_seed": per_seed})
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
