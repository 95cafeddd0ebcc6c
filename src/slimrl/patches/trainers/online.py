"""The online RL trainers (GRPO, RLOO): the seams they share and the patch list built from them.

Patched (beyond the shared set-up of trainer_setup.py):
1. `add_fused_lm_head`, the module-level name the trainer module calls in `__init__`: slimrl's head
   (slimrl.ops.logprob: completion-only scoring, bounded row chunks). TRL's private helpers it reads are checked seams.
2. Config: the fields `vllm_sampling_params` (rollouts on the model's vLLM engine), `slimrl_reward_errors`
   ("raise" | "skip", see rewards.py), `slimrl_shared_prefix` ("auto" | True | False, shared_prefix_rules.py) and
   the long-context fields `slimrl_rows_per_group`, `slimrl_padding_free`, `slimrl_tiled_mlp` (row_groups_rules.py,
   each validated beside its op);
   `max_new_tokens` as the older name of `max_completion_length` (compat.py), `max_prompt_length` with its TRL 0.2x
   meaning (prompt_limit.py: `_tokenize_prompts` keeps a long prompt's last tokens); config checks: every numeric
   field's range (config_ranges.py), the learning-rate warning, batch geometry fitted or refused (validation.py).
3. Trainer `__init__`: the dataset's columns and rows (data_checks.py, row_checks.py); every callable reward
   function wrapped (rewards.py: keywords by signature, a parameter no column provides refused now unless a GRPO
   `rollout_func` may provide it, failures named), a reward given as a string checked to be a loadable model; the
   model's `max_seq_length` against the completion length and the dataset's longest prompt; around TRL's
   `__init__`, the engine's rollout config (vllm_rollouts.engine_rollouts: `use_vllm` switched on for an attached
   engine, `vllm_sampling_params` checked and copied into the config, visible to the VLLMGeneration seam).
4. `_generate_single_turn`: FastLanguageModel.for_inference / for_training around every rollout (KV cache on,
   checkpointing off, left padding; the training flag stays as TRL has it, so dropout sampling matches stock), the
   max_seq_length check on the actual prompts (the first turn's: multiturn.py), each distinct prompt image
   encoded once (shared_images.py), and `models/modes.py:generating()` around it: the tiled MLP passes through.
5. `VLLMGeneration`: rollouts on the model's own vLLM engine when FastLanguageModel.from_pretrained
   (fast_inference=True) attached one; in server mode with `vllm_server_sync` "lora" (or "auto" off CUDA), TRL's
   server client with the LoRA adapter handed over through the server's LoRA endpoints (vllm_server.py); TRL's class
   otherwise (vllm_rollouts.py).
6. `_get_per_token_logps_and_entropies` (policy, old-policy and reference forwards): rows scored in groups, the
   forwards padding-free and the model's MLPs tiled (row_groups.py, padding_free.py), inside the shared-prefix
   context, each distinct prompt of a forward's rows computed once (shared_prefix.py). `compute_loss`: the
   micro-batch scored a row group at a time, each group its own backward, TRL's `_compute_loss` unchanged
   (row_groups.py).
7. `_save_checkpoint` / `_load_optimizer_and_scheduler`: the rollout buffer travels with each checkpoint, so a
   resume in the middle of a buffer repeats the uninterrupted run (rollout_buffer.py).
TRL's own: the whole GRPO/RLOO step (generation, rewards, advantages, every loss type and its normalisers, buffering,
metrics).
"""

from __future__ import annotations

import dataclasses
import functools

from ... import families, fields
from ..compat import ONLINE_REMOVED, ONLINE_RENAMED
from ..rollouts.multiturn import in_tool_turns
from ..rollouts.rewards import check_policy, checked_rewards
from ..rollouts.rollout_buffer import rollout_buffer_patches
from ..rollouts.vllm_rollouts import VLLM_GENERATION_USES, engine_rollouts, make_vllm_generation
from ..scoring.row_groups import row_group_patches
from ..scoring.shared_prefix import image_sharing
from ..seams import Patch
from ..setup import prompt_limit, row_groups_rules, shared_prefix_rules, validation
from ..setup.data_checks import dataset_check
from ..setup.row_checks import rows_check
from ..setup.trainer_setup import Family, SetupCall, fused_head_patch, setup_patches


def check_sequence_lengths(call: SetupCall) -> None:
    validation.check_max_seq_length(
        call.model, call.args, call.arguments.get("train_dataset"), call.arguments.get("processing_class")
    )


def check_config(args) -> None:
    check_policy(args.slimrl_reward_errors)
    prompt_limit.check_config(args)
    shared_prefix_rules.check_config(args)
    row_groups_rules.check_config(args)
    validation.check_config(args)


def wrap_reward_functions(call: SetupCall) -> None:
    """Each callable reward as rewards.CheckedReward (refused now if it needs a column the dataset lacks)."""
    rewards = call.arguments.get("reward_funcs")
    if rewards is None:
        return
    dataset = call.arguments.get("train_dataset")
    # GRPO's rollout_func may return extra fields, which TRL passes to the reward functions like columns
    columns = None if call.arguments.get("rollout_func") is not None else getattr(dataset, "column_names", None)
    call.arguments["reward_funcs"] = checked_rewards(rewards, columns, call.args.slimrl_reward_errors)


ONLINE = Family(
    config_fields=(*fields.declared_by(families.ONLINE), prompt_limit.FIELD),
    renamed_fields=ONLINE_RENAMED,
    removed_fields=ONLINE_REMOVED,
    check_config=check_config,
    adapters=(wrap_reward_functions,),
    checks=(check_sequence_lengths,),
    around=lambda call: engine_rollouts(call.model, call.args),
)


def make_generate_single_turn(original):
    @functools.wraps(original)
    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        from ...models import modes

        model = self.accelerator.unwrap_model(self.model)
        if not in_tool_turns():  # a later turn's prompt holds the completion so far (multiturn.py)
            validation.check_rollout_lengths(model, prompt_ids, self.max_completion_length)
        was_training = model.training
        modes.for_inference(model)
        if was_training:
            # Stock TRL samples in train mode: with dropout active, eval-mode rollouts would change the samples
            # (and the RNG stream after them). Cache on and checkpointing off change no numbers, so they stay.
            model.train()
        try:
            # each distinct prompt image encoded once in the prefill; the long-context swaps pass through
            with image_sharing(self), modes.generating():
                return original(self, prompt_ids, *args, **kwargs)
        finally:
            if was_training:
                modes.for_training(model)

    return _generate_single_turn


def online_patches(algorithm: str, module: str, trainer: str, config_module: str, config: str) -> list[Patch]:
    """The patch list of GRPO or RLOO (their seams have the same names and shapes)."""
    trainer_path = f"{module}.{trainer}"
    family = dataclasses.replace(ONLINE, checks=(dataset_check(algorithm), rows_check(algorithm), *ONLINE.checks))
    return [
        fused_head_patch(module),
        *setup_patches(
            family,
            trainer_path,
            f"{config_module}.{config}",
            ("self", "model", "reward_funcs", "args", "train_dataset", "eval_dataset", "processing_class"),
            step_params=("self", "model", "inputs", "num_items_in_batch"),
        ),
        Patch(
            trainer_path,
            "_tokenize_prompts",
            ("self", "prompts"),
            prompt_limit.make_tokenize_prompts,
            "max_prompt_length: longer prompts keep their last tokens",
        ),
        Patch(
            trainer_path,
            "_generate_single_turn",
            ("self", "prompt_ids"),
            make_generate_single_turn,
            "inference/training mode around rollouts",
        ),
        Patch(
            module,
            "VLLMGeneration",
            ("model", "accelerator", "processing_class", "mode"),
            make_vllm_generation,
            "rollouts on the model's attached vLLM engine",
            uses=VLLM_GENERATION_USES,
        ),
        *row_group_patches(trainer_path),
        *rollout_buffer_patches(trainer_path),
    ]
