"""How far float32 results land from a float64 run of stock TRL, stock vs slimrl with shared-prefix forwards.

    PYTHONPATH=src OMP_NUM_THREADS=1 python bench/shared_prefix_accuracy.py [CASE ...]

Parity cases whose quantities cancel most of their terms (a GRPO VESPO second step, dr_grpo with an entropy bonus and
accumulation, RLOO with a "ref" adapter and 2 iterations, RLOO with accumulation over shuffled micro-batches) run the
sides of the parity harness (tests/patches/_parity.py) in lock-step: stock float32, slimrl float32 with
`slimrl_shared_prefix=True`, stock on a float64 copy of the weights (same rollouts, checked) and two copies with
float32-sized rounding noise. Printed per micro-step: |loss - float64 loss| of stock, shared and perturbed (the larger
draw), the largest relative gradient error of stock and shared, and the relative error of the per-token log-probs
computed with no grad (old-policy / reference). Sharing changes the rounding; this shows by how much next to stock's
own.
"""

from __future__ import annotations

import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "patches"))

import torch  # noqa: E402

import _parity as P  # noqa: E402
import _rl_parity as R  # noqa: E402
import _tiny as T  # noqa: E402

CASES = {
    "grpo-vespo": (
        "grpo",
        lambda: T.tiny_model(0),
        True,
        dict(
            loss_type="vespo",
            beta=0.04,
            num_iterations=2,
            per_device_train_batch_size=4,
            num_generations=2,
            max_completion_length=7,
        ),
    ),
    "grpo-dr_grpo-entropybonus-ga2": (
        "grpo",
        lambda: T.tiny_model(0),
        True,
        dict(
            loss_type="dr_grpo",
            beta=0.0,
            entropy_coef=0.01,
            gradient_accumulation_steps=2,
            num_iterations=2,
            per_device_train_batch_size=3,
            num_generations=3,
            max_completion_length=5,
        ),
    ),
    "rloo-refadapter-iters2": (
        "rloo",
        T.peft_model,
        False,
        dict(
            epsilon_high=0.28,
            num_iterations=2,
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=6,
        ),
    ),
    "rloo-full-iters2-ga2": (
        "rloo",
        "saved",
        False,
        dict(num_iterations=2, gradient_accumulation_steps=2, per_device_train_batch_size=3, num_generations=3),
    ),
}


def run_case(name: str) -> None:
    algorithm, factory, lora, config = CASES[name]
    out = tempfile.mkdtemp(prefix="slimrl-sp-acc-")
    if factory == "saved":  # full fine-tuning: TRL reloads the reference from the model's folder
        saved = T.save_tiny(os.path.join(out, "model"))
        factory = lambda: T.load_tiny(saved)  # noqa: E731
    trainers = R.build_sides(
        algorithm,
        factory,
        config,
        out,
        peft_config=T.lora_config() if lora else None,
        patched_config={"slimrl_shared_prefix": True},
    )
    s, p, r, *xs = R.run_sides(algorithm, trainers)
    print(f"# {name}")
    for i, (si, pi, ri) in enumerate(zip(s.inputs, p.inputs, r.inputs)):
        assert torch.equal(si["completion_ids"], ri["completion_ids"]), "the float64 run sampled other completions"
        grad = {
            side: max(P.rel_err(t.grads[i][n], r.grads[i][n]) for n in r.grads[i]) for side, t in (("s", s), ("p", p))
        }
        perturbed = max(abs(x.losses[i] - r.losses[i]) for x in xs)
        line = (
            f"micro {i}: loss err stock {abs(s.losses[i] - r.losses[i]):.2e} shared "
            f"{abs(p.losses[i] - r.losses[i]):.2e} perturbed {perturbed:.2e}; "
            f"grad rel err stock {grad['s']:.2e} shared {grad['p']:.2e}"
        )
        for key in ("old_per_token_logps", "ref_per_token_logps"):
            if key in ri:
                line += f"; {key} stock {P.rel_err(si[key], ri[key]):.2e} shared {P.rel_err(pi[key], ri[key]):.2e}"
        print(line, flush=True)


if __name__ == "__main__":
    from _common import results_path, write_results

    cases = sys.argv[1:] or list(CASES)
    for case in cases:
        run_case(case)
    write_results(results_path("shared_prefix_accuracy"), {"cases": cases})
