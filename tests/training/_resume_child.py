"""What the interrupt/resume tests run in forked child processes: a tiny GRPO or DPO training with SafeInterrupt.

`train_child(kind, out, results, max_steps, resume=None, pause_at=None, marker=None)` trains, then writes the
logged losses and the final adapter into `results`. With `pause_at=k` the step that becomes step k first writes
`marker` and waits (up to a minute) for a signal, so the parent's real SIGINT/SIGTERM lands inside that step
whatever the machine's speed; `pause_forever=True` keeps waiting after the signal (a step that does not end).
"""

from __future__ import annotations

import json
import os
import time

import torch

GRPO_ARGS = dict(
    per_device_train_batch_size=4,
    num_generations=4,
    gradient_accumulation_steps=1,
    steps_per_generation=2,
    num_iterations=2,
    max_completion_length=8,
    beta=0.04,
)
DPO_ARGS = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, max_length=48)
# slimrl's PPO: one rollout of 4 prompts serves 2 optimizer steps (2 PPO epochs), so step 3 of 6 is mid-rollout
PPO_ARGS = dict(
    per_device_train_batch_size=4,
    gradient_accumulation_steps=1,
    num_ppo_epochs=2,
    response_length=4,
    lr_scheduler_type="constant",
    temperature=1.0,
    gradient_checkpointing=False,
)


def _reward(completions, **kwargs):
    return [float(len(c) % 5) for c in completions]


class PauseInStep:
    """on_step_begin of the step that becomes step `pause_at`: write the marker, wait for the signal."""

    def __init__(self, interrupt, pause_at, marker, forever=False):
        from transformers import TrainerCallback

        self.callback = type("Pause", (TrainerCallback,), {"on_step_begin": self.on_step_begin})()
        self.interrupt, self.pause_at, self.marker, self.forever = interrupt, pause_at, marker, forever

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 != self.pause_at:
            return
        with open(self.marker, "w") as f:
            f.write(str(os.getpid()))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (self.forever or self.interrupt.signum is None):
            time.sleep(0.01)


def _dataset(kind: str):
    from datasets import Dataset

    import _tiny as T

    prompts = [T.PROMPTS[i % len(T.PROMPTS)] for i in range(24)]
    if kind in ("grpo", "rloo", "ppo"):
        return Dataset.from_dict({"prompt": prompts})
    return Dataset.from_dict(
        {
            "prompt": prompts,
            "chosen": [f" the answer is {i}" for i in range(24)],
            "rejected": [f" no {i % 7} maybe" for i in range(24)],
        }
    )


def _ppo_trainer(out, common, callbacks):
    from peft import LoraConfig

    from slimrl.ppo import PPOConfig, PPOTrainer

    import _tiny as T

    return PPOTrainer(
        args=PPOConfig(**common, **PPO_ARGS),
        processing_class=T.tokenizer(),
        model=T.tiny_model(0),
        reward_funcs=_reward,
        train_dataset=_dataset("ppo"),
        callbacks=list(callbacks),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"),
    )


def build_trainer(kind: str, out: str, max_steps: int, callbacks=()):
    from slimrl import FastLanguageModel, PatchFastRL

    import _tiny as T

    PatchFastRL(kind)
    torch.manual_seed(0)
    common = dict(
        output_dir=out,
        max_steps=max_steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        learning_rate=1e-2,
        seed=3,
        disable_tqdm=True,
    )
    if kind == "ppo":  # slimrl's own trainer; its LoRA from peft_config
        return _ppo_trainer(out, common, callbacks)
    model = FastLanguageModel.get_peft_model(
        T.tiny_model(0), r=4, lora_alpha=8, random_state=0, use_gradient_checkpointing=False
    )
    if kind in ("grpo", "rloo"):
        from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

        config, trainer = (GRPOConfig, GRPOTrainer) if kind == "grpo" else (RLOOConfig, RLOOTrainer)
        return trainer(
            model=model,
            reward_funcs=_reward,
            args=config(**common, **GRPO_ARGS),
            train_dataset=_dataset(kind),
            processing_class=T.tokenizer(),
            callbacks=list(callbacks),
        )
    from trl import DPOConfig, DPOTrainer

    return DPOTrainer(
        model=model,
        args=DPOConfig(**common, **DPO_ARGS),
        train_dataset=_dataset(kind),
        processing_class=T.tokenizer(),
        callbacks=list(callbacks),
    )


def train_child(kind, out, results, max_steps, resume=None, pause_at=None, marker=None, pause_forever=False):
    torch.set_num_threads(1)  # the same kernels in every child: bitwise-comparable runs
    from safetensors.torch import save_file

    from slimrl import SafeInterrupt

    interrupt = SafeInterrupt()
    callbacks = [interrupt]
    if pause_at is not None:
        callbacks.append(PauseInStep(interrupt, pause_at, marker, pause_forever).callback)
    trainer = build_trainer(kind, out, max_steps, callbacks)
    trainer.train(resume_from_checkpoint=resume)
    losses = [(h["step"], h["loss"]) for h in trainer.state.log_history if "loss" in h]
    with open(os.path.join(results, "losses.json"), "w") as f:
        json.dump(losses, f)
    weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    save_file(weights, os.path.join(results, "adapter.safetensors"))
