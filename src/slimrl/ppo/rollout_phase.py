"""The rollout phase of `PPOTrainer` (a mixin): generate, score, no-grad forwards, rewards, GAE, rollout metrics.

Choices:
1. The whole phase runs with the policy in inference mode (FastLanguageModel.for_inference: KV cache on for
   generation, checkpointing off for the no-grad forwards) and always ends in training mode (for_training), also
   when the model arrived in eval mode (peft puts it there when a checkpoint's second adapter is loaded).
2. The no-grad forwards (policy log-probs, reference log-probs, critic values) run in chunks of
   `local_rollout_forward_batch_size` rows, under the trainer's autocast, through the lean head (models.py).
3. Rollout metrics use TRL's PPO names: `objective/kl` and `objective/non_score_reward` are per-response sums
   averaged over responses, `objective/entropy` is the mean summed negative log-prob of the sampled response,
   `objective/scores` the mean score (missing-EOS penalty included), `objective/rlhf_reward` their sum,
   `val/num_eos_tokens` the EOS tokens in the responses, `episode` the rollout rows so far (all processes).
"""

from __future__ import annotations

import time

import torch

from ..models.modes import for_inference, for_training
from . import core
from .models import response_logprobs, response_values
from .rollout import (
    RolloutBatch,
    completions_of,
    generate_hf,
    generate_vllm,
    generation_config,
    pad,
    prompt_token_ids,
    score_completions,
    stop_token_ids,
)


class RolloutPhase:
    """Mixin for PPOTrainer: `rollout(rows)` turns one batch of dataset rows into a trained-on `RolloutBatch`."""

    def rollout(self, rows) -> RolloutBatch:
        from ..patches.setup.validation import check_rollout_lengths

        device, pad_id = self.accelerator.device, self.processing_class.pad_token_id
        prompt_lists, prompts = prompt_token_ids(rows, self.processing_class)
        policy = self.accelerator.unwrap_model(self.model)
        check_rollout_lengths(policy, prompt_lists, self.args.response_length)
        prompt_ids, prompt_mask = pad(prompt_lists, pad_id, "left", device)
        for_inference(policy)
        try:
            responses = self._generate(policy, prompt_ids, prompt_mask, prompt_lists)
            response_ids, response_mask = pad(responses, pad_id, "right", device)
            input_ids = torch.cat([prompt_ids, response_ids], dim=1)
            attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
            scores = self._scores(rows, prompts, responses).to(device)
            logprobs, ref_logprobs, values = self._rollout_forwards(input_ids, attention_mask, prompt_ids.shape[1])
        finally:
            for_training(policy)
        mask = response_mask.float()
        return self._finish_rollout(
            input_ids,
            attention_mask,
            prompt_ids.shape[1],
            mask,
            response_ids,
            scores,
            logprobs * mask,
            ref_logprobs * mask,
            values * mask,
        )

    def _generate(self, policy, prompt_ids, prompt_mask, prompt_lists) -> list[list[int]]:
        from ..generation.vllm_engine import engine_of

        stop_ids = stop_token_ids(self.args, self.processing_class)
        engine = engine_of(policy)
        if engine is not None:
            return generate_vllm(engine, policy, prompt_lists, self.args, stop_ids)
        config = generation_config(self.args, stop_ids, self.processing_class.pad_token_id)
        return generate_hf(
            policy, prompt_ids, prompt_mask, config, self.args.local_rollout_forward_batch_size, stop_ids
        )

    def _scores(self, rows, prompts, responses) -> torch.Tensor:
        texts = self.processing_class.batch_decode(responses, skip_special_tokens=True)
        columns = {}
        if isinstance(rows, list):
            columns = {
                key: [row[key] for row in rows]
                for key in rows[0]
                if key not in ("prompt", "completion", "completion_ids")
            }
        return score_completions(
            self.ppo.reward_funcs,
            self.args.reward_weights,
            self.processing_class,
            prompts,
            completions_of(prompts, texts),
            responses,
            columns,
            self.state,
            self.args.local_rollout_forward_batch_size,
        )

    @torch.no_grad()
    def _rollout_forwards(self, input_ids, attention_mask, context_length: int):
        """(policy log-probs, reference log-probs, values), `[R, C]`, chunk by chunk."""
        chunk, ppo = self.args.local_rollout_forward_batch_size, self.ppo
        outputs = ([], [], [])
        with self.compute_loss_context_manager():
            for start in range(0, input_ids.shape[0], chunk):
                ids, mask = input_ids[start : start + chunk], attention_mask[start : start + chunk]
                outputs[0].append(response_logprobs(self.model, ids, mask, context_length)[0].float())
                with ppo.reference_context():
                    outputs[1].append(response_logprobs(ppo.reference, ids, mask, context_length)[0].float())
                with ppo.critic.active():
                    outputs[2].append(response_values(ppo.critic, ids, mask, context_length).float())
        return tuple(torch.cat(parts) for parts in outputs)

    def _finish_rollout(
        self, input_ids, attention_mask, context_length, mask, response_ids, scores, logprobs, ref_logprobs, values
    ) -> RolloutBatch:
        args = self.args
        eos_id = self.processing_class.eos_token_id
        eos_tokens = (response_ids == eos_id) & (mask > 0) if eos_id is not None else torch.zeros_like(mask).bool()
        has_eos = eos_tokens.any(1)
        if args.missing_eos_penalty is not None:
            scores = scores - args.missing_eos_penalty * (~has_eos.bool()).float()
        kl = core.kl_estimate(logprobs, ref_logprobs, args.kl_estimator) * mask
        rewards, non_score_reward = core.token_rewards(kl, scores, mask, args.kl_coef)
        if args.whiten_rewards:
            rewards = core.masked_whiten(rewards, mask, shift_mean=False)
        advantages, returns = core.gae(rewards, values, mask, args.gamma, args.lam)
        advantages = core.masked_whiten(advantages, mask)
        self._episode += args.batch_size
        self._record_rollout(kl, non_score_reward, scores, logprobs, mask, eos_tokens)
        return RolloutBatch(input_ids, attention_mask, context_length, mask, logprobs, values, advantages, returns)

    def _record_rollout(self, kl, non_score_reward, scores, logprobs, mask, eos_tokens) -> None:
        gather = self.accelerator.gather_for_metrics
        non_score = non_score_reward.sum(1).mean()
        self._record(
            {
                "objective/kl": gather(kl.sum(1).mean()).mean(),
                "objective/entropy": gather((-logprobs * mask).sum(1).mean()).mean(),
                "objective/non_score_reward": gather(non_score).mean(),
                "objective/rlhf_reward": gather(non_score + scores.mean()).mean(),
                "objective/scores": gather(scores.mean()).mean(),
                "val/num_eos_tokens": gather(eos_tokens.float().sum()).sum(),
                "completions/mean_length": gather(mask.sum(1).mean()).mean(),
                "episode": self._episode,
                "eps": self._episode / max(time.time() - self._train_start, 1e-9),
            }
        )
