"""How far float32 results land from a float64 run of stock TRL, stock vs slimrl with shared-prefix forwards.

    PYTHONPATH=src OMP_NUM_THREADS=1 python bench/shared_prefix_accuracy.py

Three parity cases whose quantities cancel most of their terms (a GRPO VESPO second step, dr_grpo with an entropy
bonus and accumulation, RLOO with a "ref" adapter and 2 iterations) run three trainers in lock-step with the parity
harness's seeds (tests/patches/_parity.py): stock float32, slimrl float32 with `slimrl_shared_prefix=True`, and stock
on a float64 copy of the weights (same rollouts, checked). Printed per micro-step: |loss - float64 loss| of each
float32 side, the largest relative gradient error, and the relative error of the per-token log-probs computed with
no grad (old-policy / reference). Sharing changes the rounding; this shows by how much next to stock's own.
"""

from __future__ import annotations

import copy
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "patches"))

import _parity as P  # noqa: E402
import torch  # noqa: E402


def _peft_model(dtype=torch.float32):
    from peft import get_peft_model

    model = P.tiny_model(0).to(dtype)
    torch.manual_seed(7)
    return get_peft_model(model, P.lora_config())


CASES = {
    "grpo-vespo": ("grpo", lambda dtype=torch.float32: P.tiny_model(0).to(dtype), True, dict(
        loss_type="vespo", beta=0.04, num_iterations=2, per_device_train_batch_size=4, num_generations=2,
        max_completion_length=7)),
    "grpo-dr_grpo-entropybonus-ga2": ("grpo", lambda dtype=torch.float32: P.tiny_model(0).to(dtype), True, dict(
        loss_type="dr_grpo", beta=0.0, entropy_coef=0.01, gradient_accumulation_steps=2, num_iterations=2,
        per_device_train_batch_size=3, num_generations=3, max_completion_length=5)),
    "rloo-refadapter-iters2": ("rloo", _peft_model, False, dict(
        epsilon_high=0.28, num_iterations=2, per_device_train_batch_size=4, num_generations=4,
        max_completion_length=6)),
}


def run_case(name: str) -> None:
    algorithm, factory, lora, config = CASES[name]
    peft = P.lora_config() if lora else None
    out = tempfile.mkdtemp(prefix="slimrl-sp-acc-")
    stock, shared = P.build_pair(algorithm, factory, config, out, peft_config=peft,
                                 patched_config={"slimrl_shared_prefix": True})
    with P.stock_state():
        ref = P.build_trainer(algorithm, factory(torch.float64), P.make_config(algorithm, out, **config),
                              copy.deepcopy(peft))
        ref.model.double()
    s, p = P.run_pair(algorithm, stock, shared)
    r = P.Trace()
    lr = P.SGD_LR if hasattr(stock.model, "peft_config") else P.FULL_FT_SGD_LR
    for step in range(2):
        for micro in range(ref.args.gradient_accumulation_steps):
            with P.stock_state():
                P.micro_step(ref, P.generation_batch(ref.args), 1234 + 100 * step + micro, r)
        P.sgd_step(ref, lr)
    print(f"# {name}")
    for i, (si, pi, ri) in enumerate(zip(s.inputs, p.inputs, r.inputs)):
        assert torch.equal(si["completion_ids"], ri["completion_ids"]), "the float64 run sampled other completions"
        grad = {side: max(P.rel_err(t.grads[i][n], r.grads[i][n]) for n in r.grads[i]) for side, t in (("s", s),
                                                                                                     ("p", p))}
        line = (f"micro {i}: loss err stock {abs(s.losses[i] - r.losses[i]):.2e} shared "
                f"{abs(p.losses[i] - r.losses[i]):.2e}; grad rel err stock {grad['s']:.2e} shared {grad['p']:.2e}")
        for key in ("old_per_token_logps", "ref_per_token_logps"):
            if key in ri:
                line += (f"; {key} stock {P.rel_err(si[key], ri[key].double()):.2e} "
                         f"shared {P.rel_err(pi[key], ri[key].double()):.2e}")
        print(line, flush=True)


if __name__ == "__main__":
    for case in sys.argv[1:] or list(CASES):
        run_case(case)
