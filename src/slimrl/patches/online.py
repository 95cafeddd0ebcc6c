"""The online RL trainers (GRPO, RLOO): the seams they share and the patch list built from them.

Patched (beyond the shared set-up of trainer_setup.py):
1. `add_fused_lm_head`, the module-level name the trainer module calls in `__init__`: slimrl's head
   (slimrl.ops.logprob: completion-only scoring, bounded row chunks). TRL's private helpers it reads are checked seams.
2. Config: the field `vllm_sampling_params` (rollouts on the model's vLLM engine); config checks: learning rate,
   sampling temperature, batch geometry (validation.py).
3. Trainer `__init__`: the model's `max_seq_length` against the completion length and the dataset's longest prompt;
   around TRL's `__init__`, the engine's rollout config (vllm_rollouts.engine_rollouts: `use_vllm` switched on for an
   attached engine, `vllm_sampling_params` checked and copied into the config, visible to the VLLMGeneration seam).
4. `_generate_single_turn`: FastLanguageModel.for_inference / for_training around every rollout (KV cache on,
   checkpointing off, left padding; the training flag stays as TRL has it, so dropout sampling matches stock), and
   the max_seq_length check on the actual prompts.
5. `VLLMGeneration`: rollouts on the model's own vLLM engine when FastLanguageModel.from_pretrained
   (fast_inference=True) attached one; in server mode with `vllm_server_sync` "adapter" (or "auto" off CUDA), TRL's
   server client with the LoRA adapter handed over through the server's LoRA endpoints (vllm_server.py); TRL's class
   otherwise (vllm_rollouts.py).
TRL's own: the whole GRPO/RLOO step (generation, rewards, advantages, every loss type, buffering, metrics).
"""

from __future__ import annotations

import functools

from . import validation
from .seams import Patch
from .trainer_setup import Family, SetupCall, fused_head_patch, setup_patches
from .vllm_rollouts import VLLM_GENERATION_USES, engine_rollouts, make_vllm_generation


def check_sequence_lengths(call: SetupCall) -> None:
    validation.check_max_seq_length(call.model, call.args, call.arguments.get("train_dataset"),
                                    call.arguments.get("processing_class"))


ONLINE = Family(
    config_fields=(("vllm_sampling_params", None), ("vllm_server_sync", "auto")),
    check_config=validation.check_config,
    checks=(check_sequence_lengths,),
    around=lambda call: engine_rollouts(call.model, call.args),
)


def make_generate_single_turn(original):
    @functools.wraps(original)
    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        from ..models.fast_language_model import FastLanguageModel

        model = self.accelerator.unwrap_model(self.model)
        validation.check_rollout_lengths(model, prompt_ids, self.max_completion_length)
        was_training = model.training
        FastLanguageModel.for_inference(model)
        if was_training:
            # Stock TRL samples in train mode: with dropout active, eval-mode rollouts would change the samples
            # (and the RNG stream after them). Cache on and checkpointing off change no numbers, so they stay.
            model.train()
        try:
            return original(self, prompt_ids, *args, **kwargs)
        finally:
            if was_training:
                FastLanguageModel.for_training(model)

    return _generate_single_turn


def online_patches(module: str, trainer: str, config_module: str, config: str) -> list[Patch]:
    """The patch list of GRPO or RLOO (their seams have the same names and shapes)."""
    trainer_path = f"{module}.{trainer}"
    return [
        fused_head_patch(module),
        *setup_patches(ONLINE, trainer_path, f"{config_module}.{config}",
                       ("self", "model", "reward_funcs", "args", "train_dataset", "eval_dataset", "processing_class"),
                       step_params=("self", "model", "inputs", "num_items_in_batch")),
        Patch(trainer_path, "_generate_single_turn", ("self", "prompt_ids"), make_generate_single_turn,
              "inference/training mode around rollouts"),
        Patch(module, "VLLMGeneration", ("model", "accelerator", "processing_class", "mode"), make_vllm_generation,
              "rollouts on the model's attached vLLM engine", uses=VLLM_GENERATION_USES),
    ]
