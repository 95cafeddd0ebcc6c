"""How far float32 lands from the float64 reference, per rollout seed: stock TRL, slimrl with the shared-prefix forward
and slimrl without it, on one GRPO case of the parity suite (LoRA, beta 0.04, num_iterations 2, batch 4 of 2
generations, 7 completion tokens). A loss is one number: its error is one draw of the rounding, so one seed's
patched / stock ratio says little; the spread over seeds says whether a path is systematically worse.

    OMP_NUM_THREADS=1 python3 scripts/parity_spread.py vespo 12 [--json FILE]

Prints per seed |loss - ref| of both micro-steps and the largest relative error of the second step's gradients,
then the geometric mean of each column over the seeds; `--json FILE` also writes them as a results file (with
the commit, machine and versions: bench/_common.write_results).
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
from slimrl.patches.shared_prefix_rules import CONFIG_FIELD  # noqa: E402

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

    def geomean(values):
        return math.exp(sum(math.log(max(v, 1e-30)) for v in values) / len(values))

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
