"""`PPOTrainer`: classic PPO with a learned critic, on TRL 1.16's `_BaseTrainer` (the HF Trainer loop).

The algorithm, one rollout at a time (choices, said once):
1. Rollout: `local_batch_size` prompts per process, one sampled response each (HF generate in inference mode, or the
   model's vLLM engine), ended by the stop token or `response_length` (rollout.py).
2. Score: a reward model and/or reward functions with GRPO's signature, at the response's last token; responses
   without EOS lose `missing_eos_penalty`.
3. No-grad forwards through the lean head (no `[B, T, V]` logits): the policy's log-probs, the reference's (the
   adapter-disabled base under LoRA, a frozen copy otherwise), and the critic's values (models.py, value.py).
4. Per-token reward `-kl_coef * KL` (k1 or k3 estimator) plus the score; optional reward whitening; GAE with
   `gamma`, `lam`; advantages whitened over real tokens (core.py).
5. `num_ppo_epochs` passes, each a fresh permutation (seeded by run seed, rollout and epoch, so resuming needs no
   extra RNG state) cut into `num_mini_batches` optimizer steps of `gradient_accumulation_steps` micro-batches.
   Per micro-batch: the critic's forward and backward (clipped value loss x vf_coef, inside its adapter), then the
   policy's (clipped surrogate), each scaled by 1/accumulation like the HF Trainer's own loss.
6. The HF Trainer loop drives steps, the optimizer (the critic's head, and anything else of the critic outside the
   policy module, join it as one more parameter group; gradient clipping covers them too, and their gradients are
   cleared at the start of each accumulation cycle, as the loop clears the model's), scheduler, logging,
   callbacks, `report_to` and checkpoints. A checkpoint also holds the critic's weights and the PPO state (step
   counter, episode count, the current rollout and unlogged metrics), so resuming mid-rollout continues exactly.
Metrics keep TRL's PPO names (objective/kl, objective/entropy, objective/non_score_reward, objective/rlhf_reward,
objective/scores, policy/approxkl_avg, policy/clipfrac_avg, loss/policy_avg, loss/value_avg, val/clipfrac_avg,
policy/entropy_avg, val/ratio, val/ratio_var, val/num_eos_tokens, lr, episode, eps) plus completions/mean_length
and peak_memory_gb; they are averaged over the logging window (episode and eps: their latest value).
Set-up: the one every patched TRL trainer gets (patches/setup/trainer_setup.py) with PPO's family (setup.py).
Single process only for now (see `_check_supported`).
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections import defaultdict

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint
from trl.trainer.base_trainer import _BaseTrainer
from trl.trainer.utils import identity

from ..patches.setup.trainer_setup import make_training_step, trainer_init_maker
from ..training.adapter_resume import restore_root_adapter
from . import core
from .checkpoint import load_ppo_state, load_value_weights, save_ppo_state, save_value_weights
from .config import PPOConfig
from .models import build_models, reward_sources
from .rollout import EpochSampler
from .rollout_phase import RolloutPhase
from .setup import PPO_SETUP, current_arguments

logger = logging.getLogger("slimrl")

LATEST_VALUE = ("episode", "eps")  # counters: logged as their latest value, not a window mean


class PPOTrainer(RolloutPhase, _BaseTrainer):
    """PPO on one base model (LoRA) with TRL's PPO call signature; see the module docstring."""

    _tag_names = ["trl", "ppo", "slimrl"]  # noqa: RUF012  (TRL's _BaseTrainer declares it a list)
    _name = "PPO"

    def __init__(
        self,
        args=None,
        processing_class=None,
        model=None,
        ref_model=None,
        reward_model=None,
        train_dataset=None,
        value_model=None,
        data_collator=None,
        eval_dataset=None,
        optimizers=(None, None),
        callbacks=None,
        peft_config=None,
        *,
        reward_funcs=None,
        config=None,
        tokenizer=None,
    ):
        args, processing_class = current_arguments(args, processing_class, config, tokenizer)
        if model is None:
            raise ValueError(
                "PPOTrainer needs model= (the policy: a causal LM, a PeftModel, or a model with peft_config=)."
            )
        args = PPOConfig(output_dir="trainer_output") if args is None else args
        if not isinstance(args, PPOConfig):
            raise TypeError(
                f"args must be slimrl's PPOConfig (from slimrl import PPOConfig), not {type(args).__name__}."
            )
        self._set_up(
            model=model,
            args=args,
            processing_class=processing_class,
            ref_model=ref_model,
            reward_funcs=reward_sources(reward_model, reward_funcs),
            train_dataset=train_dataset,
            value_model=value_model,
            data_collator=data_collator,
            eval_dataset=eval_dataset,
            optimizers=optimizers,
            callbacks=callbacks,
            peft_config=peft_config,
        )

    def _build(
        self,
        model,
        args,
        processing_class,
        ref_model,
        reward_funcs,
        train_dataset,
        value_model,
        data_collator,
        eval_dataset,
        optimizers,
        callbacks,
        peft_config,
    ):
        """The models (models.py), then TRL's `_BaseTrainer.__init__`; run inside the shared set-up (`_set_up`)."""
        self._user_optimizer = optimizers[0] is not None
        self.ppo = build_models(model, ref_model, value_model, reward_funcs, peft_config, args.temperature)
        self.ref_model = None if self.ppo.reference is self.ppo.policy else self.ppo.reference  # TRL's PPO name
        super().__init__(
            model=self.ppo.policy,
            args=args,
            data_collator=data_collator or identity,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
        )
        self._check_supported()
        for module in (self.ppo.critic, *[s for s in self.ppo.reward_funcs if isinstance(s, torch.nn.Module)]):
            module.to(self.accelerator.device)
        self._step, self._episode, self._buffer = 0, 0, None
        self._metrics = {"train": defaultdict(list)}
        self._train_start = time.time()

    # precision, checks, checkpointing mode and the chunk knob on policy and reference (setup.py, trainer_setup.py)
    _set_up = trainer_init_maker(PPO_SETUP)(_build)

    def _check_supported(self) -> None:
        if self.accelerator.num_processes > 1:
            raise NotImplementedError(
                "slimrl's PPOTrainer runs in one process for now: the critic's forward does "
                "not go through the DDP-wrapped model, so its gradients would not be synced."
            )

    # --- data ---
    def get_train_dataloader(self):
        return self._get_dataloader(
            dataset=self.train_dataset,
            description="Training",
            batch_size=self.args.local_batch_size,
            sampler_fn=self._get_train_sampler,
            is_training=True,
        )

    def _get_train_sampler(self, dataset=None):
        micro_steps = self.args.steps_per_rollout * self.args.gradient_accumulation_steps
        return EpochSampler(
            dataset if dataset is not None else self.train_dataset, self.args.batch_size, micro_steps, self.args.seed
        )

    def _check_ready(self) -> None:
        """What train() needs, checked before any heavy work; each message says how to pass it."""
        missing = []
        if not self.ppo.reward_funcs:
            missing.append(
                "a reward source: reward_model= (a sequence-classification model) or reward_funcs= "
                "(functions f(prompts, completions, completion_ids, **kwargs) -> list[float])"
            )
        if self.train_dataset is None:
            missing.append("train_dataset= (rows with a 'prompt' or an 'input_ids' column)")
        if missing:
            raise ValueError("PPOTrainer.train() needs " + " and ".join(missing) + ". Pass them to PPOTrainer(...).")
        if hasattr(self.train_dataset, "__len__") and len(self.train_dataset) < self.args.batch_size:
            raise ValueError(
                f"train_dataset has {len(self.train_dataset)} rows, fewer than one rollout "
                f"({self.args.batch_size} = per_device_train_batch_size x gradient_accumulation_steps x "
                "num_mini_batches x processes): add rows or lower those sizes."
            )

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        self._check_ready()
        if resume_from_checkpoint is True:
            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(f"No checkpoint found in output_dir {self.args.output_dir!r} to resume from.")
        if resume_from_checkpoint:
            self._step, self._episode, self._buffer, metrics = load_ppo_state(
                resume_from_checkpoint, self.accelerator.device
            )
            self._metrics["train"] = defaultdict(list, metrics)
            restore_root_adapter(self.model, resume_from_checkpoint)  # the policy's, beside the value adapter
        self._train_start = time.time()
        return super().train(
            resume_from_checkpoint=resume_from_checkpoint or None,
            trial=trial,
            ignore_keys_for_eval=ignore_keys_for_eval,
            **kwargs,
        )

    # --- one micro-batch (the shared training_step wrapper records peak_memory_gb) ---
    def _ppo_step(self, model, inputs, num_items_in_batch=None):
        if self._step % self.args.gradient_accumulation_steps == 0:
            for p in self.ppo.extra_trainable():  # the HF loop zeroes the model's gradients only
                p.grad = None
        batch = self._micro_batch(inputs)
        model.train()
        scale = 1.0 / self.current_gradient_accumulation_steps
        with self.compute_loss_context_manager():
            value_loss = self._critic_step(batch, scale)
            policy_loss = self._policy_step(model, batch, scale)
        self._step += 1
        return ((policy_loss + self.args.vf_coef * value_loss) * scale).detach()

    training_step = make_training_step(_ppo_step)

    def _micro_batch(self, rows):
        args = self.args
        per_epoch = args.gradient_accumulation_steps * args.num_mini_batches
        rollout_index, position = divmod(self._step, per_epoch * args.num_ppo_epochs)
        if position == 0:
            self._buffer = self.rollout(rows)
        elif self._buffer is None:
            raise RuntimeError("No rollout to train on mid-rollout: resume from a checkpoint written by this trainer.")
        epoch, slot = divmod(position, per_epoch)
        generator = torch.Generator().manual_seed(args.seed * 1_000_003 + rollout_index * 1009 + epoch)
        order = torch.randperm(args.local_batch_size, generator=generator)
        size = args.per_device_train_batch_size
        return self._buffer.select(order[slot * size : (slot + 1) * size])

    def _critic_step(self, batch, scale: float) -> torch.Tensor:
        from .models import response_values

        with self.ppo.critic.active():
            values = response_values(self.ppo.critic, batch.input_ids, batch.attention_mask, batch.context_length)
            loss, clipfrac = core.value_loss(
                values, batch.values, batch.returns, batch.response_mask, self.args.cliprange_value
            )
            self.accelerator.backward(loss * (self.args.vf_coef * scale))
        self._record({"loss/value_avg": loss, "val/clipfrac_avg": clipfrac})
        return loss.detach()

    def _policy_step(self, model, batch, scale: float) -> torch.Tensor:
        from .models import response_logprobs

        logprobs, entropy = response_logprobs(
            model, batch.input_ids, batch.attention_mask, batch.context_length, entropy=True
        )
        loss, stats = core.policy_loss(
            logprobs, batch.logprobs, batch.advantages, batch.response_mask, self.args.cliprange
        )
        self.accelerator.backward(loss * scale)
        self._record(
            {
                "loss/policy_avg": loss,
                "policy/approxkl_avg": stats["approxkl"],
                "policy/clipfrac_avg": stats["clipfrac"],
                "val/ratio": stats["ratio"],
                "policy/entropy_avg": core.masked_mean(entropy.detach(), batch.response_mask),
            }
        )
        return loss.detach()

    def _record(self, values: dict) -> None:
        for name, value in values.items():
            self._metrics["train"][name].append(float(value.detach() if torch.is_tensor(value) else value))

    # --- optimizer: the critic's parameters outside the policy module join it ---
    def create_optimizer(self, model=None):
        optimizer = super().create_optimizer(model)
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        extra = [p for p in self.ppo.extra_trainable() if id(p) not in held]
        if extra:
            if self._user_optimizer:
                logger.warning("slimrl: adding the critic's %d parameters to the optimizer you passed", len(extra))
            optimizer.add_param_group({"params": extra, "weight_decay": self.args.weight_decay})
        return optimizer

    def _all_trainable(self, model):
        return itertools.chain(model.parameters(), self.ppo.extra_trainable())

    def _clip_grad_norm(self, model):
        return self.accelerator.clip_grad_norm_(self._all_trainable(model), self.args.max_grad_norm)

    def _get_grad_norm(self, model, grad_norm=None):
        if grad_norm is None:
            grad_norm = self.accelerator.clip_grad_norm_(self._all_trainable(model), float("inf"))
        return grad_norm

    # --- logging ---
    def log(self, logs: dict, start_time: float | None = None) -> None:
        window = self._metrics["train"]  # PPO has no evaluation loop (see _check_supported)
        metrics = {
            name: values[-1] if name in LATEST_VALUE else sum(values) / len(values)
            for name, values in window.items()
            if values
        }
        ratios = window.get("val/ratio", [])
        if ratios:
            metrics["val/ratio_var"] = float(torch.tensor(ratios).var()) if len(ratios) > 1 else 0.0
        if "learning_rate" in logs:
            metrics["lr"] = logs["learning_rate"]
        window.clear()
        super().log({**logs, **metrics}, start_time)

    # --- checkpoints: the critic's weights with every save, the PPO state with every checkpoint ---
    def _save(self, output_dir=None, state_dict=None):
        super()._save(output_dir, state_dict)
        if self.args.should_save:
            save_value_weights(output_dir or self.args.output_dir, self.ppo.critic)

    def _save_checkpoint(self, model, trial):
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        if self.args.should_save:
            save_ppo_state(folder, self._step, self._episode, self._buffer, self._metrics["train"])
        super()._save_checkpoint(model, trial)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        load_value_weights(resume_from_checkpoint, self.ppo.critic)
        self.ppo.critic.restore_trainable()  # peft loads a second adapter frozen
