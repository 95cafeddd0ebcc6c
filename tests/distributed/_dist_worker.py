"""One training run of the distributed tier: 2 processes under torchrun (gloo), or 1 process inside pytest.

    torchrun --nproc_per_node 2 tests/distributed/_dist_worker.py ALGO SIDE BATCH OUT [--zero STAGE]

Choices, and why:
- The run is TRL's own `trainer.train()` (DDP wrapping, DistributedSampler / accelerate's batch sharding, gathered
  rewards and advantages, all-reduced gradients, process-averaged logged loss): what a user's `torchrun` runs. The
  config leaves `use_cpu` unset, so the 2-process run also exercises slimrl's use_cpu resolution (per-device batch 2,
  num_generations 4: stock TRL fails there with its generation_batch_size error).
- Plain SGD (`optim="sgd"`, constant learning rate): Adam's first step is lr x sign(g), which turns a rounding-sized
  difference of a near-zero gradient component into a full-size update; SGD keeps tiny differences tiny.
- GRPO samples with each rank's own RNG stream (TRL seeds seed + rank), so a 1-process run cannot draw the same
  completions. The 2-process run records what `_generate_single_turn` returned on each rank (gathered in rank
  order, which is the order TRL gathers rewards in); the 1-process runs replay them (`replay_rollouts`) after
  checking that they were asked for the very same prompt ids. The 2-process run thus generates for real.
- What is recorded: the logged loss of every step (and each rank's own loss: the logged one is their float32
  average), the step gradient right before each optimizer step (after DDP's
  all-reduce), the final trainable weights, and where every call of slimrl's log-prob head ran: inside the root
  module's forward (the wrapper DDP / FSDP / ZeRO-3 hook into) and with which kind of head weight.
- `--zero 2|3`: the same run under DeepSpeed ZeRO (its CPU accelerator, gloo), the model built before the config (no
  `zero.Init`); ZeRO-3 with `stage3_param_persistence_threshold: 0`, so even this tiny model's head is partitioned
  and must be gathered. Gradients and weights are read whole with `deepspeed.utils.safe_get_full_grad/_fp32_param`.
"""

from __future__ import annotations

import argparse
import os

import torch
from transformers import TrainerCallback

import _parity as P
import _pref_parity as PP
import _rl_parity as R
import _tiny as T
from _launch import end_process_group, leave_without_interpreter_teardown

# What each algorithm's run sets (per-device batch, steps and the learning rate; everything else is TRL's default
# or the harness's small CPU config)
RUNS = {
    "grpo": dict(num_generations=4, max_completion_length=7, beta=0.04, max_steps=3, learning_rate=0.1),
    "dpo": dict(max_steps=3, learning_rate=0.05),
}
# No gradient clipping: DeepSpeed clips inside its step, after the callback reads the gradients
COMMON = dict(
    optim="sgd",
    lr_scheduler_type="constant",
    warmup_steps=0,
    weight_decay=0.0,
    max_grad_norm=0.0,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    seed=0,
    disable_dropout=True,
)


def zero_config(stage: int) -> dict:
    return {
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_allow_untested_optimizer": True,
    }


def full_grad(param, zero: bool):
    """The whole reduced gradient of a parameter (ZeRO keeps it partitioned in its optimizer); None without one."""
    if zero:
        from deepspeed.utils import safe_get_full_grad

        return safe_get_full_grad(param)
    return param.grad


def full_param(param, zero: bool) -> torch.Tensor:
    if zero:
        from deepspeed.utils import safe_get_full_fp32_param

        return safe_get_full_fp32_param(param).detach().clone()
    return param.detach().clone()


class StepGradients(TrainerCallback):
    """Clones every trainable gradient right before each optimizer step (after DDP's all-reduce). Under DeepSpeed the
    step runs inside accelerate's backward (`engine.step()`), so the gradients are read in a wrapper of it."""

    def __init__(self, trainer, zero: bool = False):
        self.trainer, self.grads, self.zero = trainer, [], zero

    def _read(self, model) -> None:
        grads = {n: full_grad(p, self.zero) for n, p in P.trainable(model).items()}
        self.grads.append({n: g.detach().clone() for n, g in grads.items() if g is not None})

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.zero:
            engine = self.trainer.model_wrapped
            step = engine.step

            def read_then_step(*a, **k):
                self._read(model)
                return step(*a, **k)

            engine.step = read_then_step

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if not self.zero:
            self._read(model)


class HeadCalls(TrainerCallback):
    """Where slimrl's head ran: for each call, (grad enabled, inside the root wrapper's forward, inside the model's
    forward, type of the head weight, its shape). Hooks go on once `train()` has wrapped the model."""

    def __init__(self, trainer):
        self.trainer, self.calls, self.depth = trainer, [], {"root": 0, "model": 0}

    def _track(self, module, key):
        def enter(*_):
            self.depth[key] += 1

        def leave(*_):
            self.depth[key] -= 1

        module.register_forward_pre_hook(enter)
        module.register_forward_hook(leave)

    def on_train_begin(self, args, state, control, **kwargs):
        from slimrl.ops import logprob

        self._track(self.trainer.model_wrapped, "root")
        if self.trainer.model_wrapped is not self.trainer.model:
            self._track(self.trainer.model, "model")
        else:
            self.depth["model"] = None
        original = logprob.fused_logprobs

        def recorded(hidden, weight, *rest, **kwargs):
            inside_model = self.depth["root"] > 0 if self.depth["model"] is None else self.depth["model"] > 0
            self.calls.append(
                (
                    torch.is_grad_enabled(),
                    self.depth["root"] > 0,
                    inside_model,
                    type(weight).__name__,
                    tuple(weight.shape),
                )
            )
            return original(hidden, weight, *rest, **kwargs)

        logprob.fused_logprobs = recorded


def record_rollouts(trainer, records: list) -> None:
    """Keep (prompt_ids, completion_ids) of every rollout call of this process."""
    original = trainer._generate_single_turn

    def generate(prompt_ids, *args, **kwargs):
        completion_ids, logprobs = original(prompt_ids, *args, **kwargs)
        records.append(([list(p) for p in prompt_ids], [list(c) for c in completion_ids]))
        return completion_ids, logprobs

    trainer._generate_single_turn = generate


def replay_rollouts(trainer, records: list) -> None:
    """Serve recorded completions instead of sampling; the prompts asked for must be the recorded ones."""
    queue = list(records)

    def generate(prompt_ids, *args, **kwargs):
        recorded_prompts, completion_ids = queue.pop(0)
        assert [list(p) for p in prompt_ids] == recorded_prompts, "the 1-process run was asked for other prompts"
        return [list(c) for c in completion_ids], None

    trainer._generate_single_turn = generate


def build(algorithm: str, side: str, batch: int, output_dir: str, zero: int | None = None):
    """The trainer of one side (one of _parity.Sides), built in the current state."""
    config = {**COMMON, **RUNS[algorithm], "per_device_train_batch_size": batch}
    if zero is not None:
        config["deepspeed"] = zero_config(zero)
    model = P.side_model(side, lambda: T.tiny_model(0))
    if algorithm == "grpo":
        args = R.make_config(algorithm, output_dir, **config)
        trainer = R.build_trainer(algorithm, model, args, T.lora_config(), train_dataset=R.dataset(6))
    else:
        config.pop("disable_dropout")
        args = PP.make_config(algorithm, output_dir, **config)
        trainer = PP.build_trainer(algorithm, model, args, T.lora_config(), PP.dataset("preference", n=12))
    return P.finish_side(side, trainer)


def run(
    algorithm: str, side: str, batch: int, output_dir: str, replay: list | None = None, zero: int | None = None
) -> dict:
    """Train one side in its patch state; returns what it recorded (rollouts: this process's own)."""
    with P.side_state(side, algorithm):
        trainer = build(algorithm, side, batch, output_dir, zero)
        grads, heads, rollouts = StepGradients(trainer, zero is not None), HeadCalls(trainer), []
        trainer.add_callback(grads)
        if side == "patched":
            trainer.add_callback(heads)
        if algorithm == "grpo":
            (replay_rollouts(trainer, replay) if replay is not None else record_rollouts(trainer, rollouts))
        micro_losses, step = [], trainer.training_step
        trainer.training_step = lambda *a, **k: micro_losses.append(float(out := step(*a, **k))) or out
        from slimrl.ops import logprob

        original_head = logprob.fused_logprobs
        try:
            trainer.train()
        finally:
            logprob.fused_logprobs = original_head
    return dict(
        losses=T.logged(trainer, "loss"),
        micro_losses=micro_losses,
        grads=grads.grads,
        head_calls=heads.calls,
        rollouts=rollouts,
        params={n: full_param(p, zero is not None) for n, p in P.trainable(trainer.model).items()},
        world_size=trainer.args.world_size,
        use_cpu=trainer.args.use_cpu,
    )


def _merge_rollouts(per_rank: list[list]) -> list:
    """Per rollout call: the ranks' prompt and completion lists concatenated in rank order."""
    return [
        (sum((r[i][0] for r in per_rank), []), sum((r[i][1] for r in per_rank), [])) for i in range(len(per_rank[0]))
    ]


def main() -> None:
    import torch.distributed as dist

    parser = argparse.ArgumentParser()
    parser.add_argument("algorithm", choices=sorted(RUNS))
    parser.add_argument("side", choices=P.Sides._fields)
    parser.add_argument("batch", type=int)
    parser.add_argument("out")
    parser.add_argument("--zero", type=int, choices=(2, 3))
    cli = parser.parse_args()
    torch.set_num_threads(1)
    result = run(cli.algorithm, cli.side, cli.batch, os.path.dirname(cli.out) or ".", zero=cli.zero)
    per_rank = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, {k: result[k] for k in ("params", "rollouts", "head_calls", "micro_losses")})
    if dist.get_rank() == 0:
        for key in ("params", "head_calls", "micro_losses"):
            result[f"rank_{key}"] = [r[key] for r in per_rank]
        result["rollouts"] = _merge_rollouts([r["rollouts"] for r in per_rank]) if result["rollouts"] else []
        torch.save(result, cli.out)
    dist.barrier()
    end_process_group()  # the trainer is gone with run()'s frame


if __name__ == "__main__":
    main()
    leave_without_interpreter_teardown()
