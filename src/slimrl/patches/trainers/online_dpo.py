"""Online DPO: TRL 1.16's experimental OnlineDPOTrainer (`trl.experimental.online_dpo`), patched to never hold
`[2B, T, V]` logits.

Patched:
1. `OnlineDPOTrainer._forward` (the policy's forward with gradient and the reference's without, both called by TRL's
   `training_step`): the completion tokens' log-probs through slimrl's head (lean_logps.py); stock's left truncation
   of the prompt to `max_length` and its positions kept exactly (every completion position is scored, padding
   included, as stock's KL and entropy metrics read them). Vision inputs raise (before training: an `image` column).
2. Set-up (trainer_setup.py): `slimrl_num_chunks`, `slimrl_reward_errors` (each callable reward wrapped as GRPO's,
   rewards.py), precision, checkpointing, the `peak_memory_gb` metric (in TRL's `stats`, logged with its metrics);
   checks before any rollout: a `prompt` column, `max_length` against the model's `max_seq_length` (TRL's default
   lowered to it, a larger value the user set refused), the longest prompt plus `max_new_tokens` against it, the
   learning rate and sampling temperature.
3. `judge=` (older TRL and Unsloth's examples; TRL 1.16 has no judges) taken as
   `reward_funcs=PairwiseJudgeReward(judge)` with a notice (judges.py), and `reward_model=` as `reward_funcs=`.
4. `trl.OnlineDPOConfig` / `trl.OnlineDPOTrainer`, which Unsloth scripts import from `trl`: reversible aliases of the
   `trl.experimental.online_dpo` classes (a TRL that defines them itself is left alone).
Refused (an error naming the option): a model loaded with `fast_inference=True` (its vLLM engine is GRPO/RLOO's;
OnlineDPOTrainer rolls out with transformers or its own `use_vllm` modes), and image datasets.
TRL's own: generation (transformers, or its vLLM server/colocate modes), rewards and reward models, the
chosen/rejected split, `missing_eos_penalty`, both loss types (sigmoid, ipo), the reference (adapter disabled under
PEFT, else a frozen copy), metrics.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from ... import fields
from ..rollouts.judges import PairwiseJudgeReward, take_judge
from ..rollouts.rewards import check_policy, checked_rewards
from ..scoring.lean_logps import completion_labels, lean_head_reason, scored_logprobs, warn_stock_path
from ..seams import Patch, alias_patches
from ..setup import validation
from ..setup.data_checks import dataset_check
from ..setup.trainer_setup import Family, SetupCall, setup_patches
from .offline import check_max_length

MODULE = "trl.experimental.online_dpo"
TRAINER = f"{MODULE}.online_dpo_trainer.OnlineDPOTrainer"
CONFIG = f"{MODULE}.online_dpo_config.OnlineDPOConfig"
TRAINER_PARAMS = (
    "self",
    "model",
    "ref_model",
    "reward_funcs",
    "args",
    "data_collator",
    "train_dataset",
    "eval_dataset",
    "processing_class",
)
FORWARD_PARAMS = ("self", "model", "prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "vision_inputs")


def check_config(args) -> None:
    check_policy(args.slimrl_reward_errors)
    validation.check_learning_rate(args.learning_rate)


def wrap_rewards(call: SetupCall) -> None:
    """Each callable reward as rewards.CheckedReward, except a judge's (it scores pairs, not items)."""
    rewards = call.arguments.get("reward_funcs")
    if rewards is None:
        return
    funcs = rewards if isinstance(rewards, list) else [rewards]
    columns = getattr(call.arguments.get("train_dataset"), "column_names", None)
    policy = call.args.slimrl_reward_errors
    wrapped = [f if isinstance(f, PairwiseJudgeReward) else checked_rewards(f, columns, policy) for f in funcs]
    call.arguments["reward_funcs"] = wrapped if isinstance(rewards, list) else wrapped[0]


def refuse_unsupported(call: SetupCall) -> None:
    """Options slimrl's OnlineDPO cannot honour, refused before any rollout."""
    trainer = type(call.arguments["self"]).__name__
    if getattr(call.model, "vllm_engine", None) is not None:
        raise ValueError(
            f"{trainer}: the model was loaded with fast_inference=True, but its vLLM engine only serves GRPO/RLOO "
            "rollouts; OnlineDPOTrainer generates with transformers (or TRL's own use_vllm modes). Load the model "
            "with fast_inference=False."
        )
    for role in ("train_dataset", "eval_dataset"):
        columns = getattr(call.arguments.get(role), "column_names", None)
        if isinstance(columns, list) and "image" in columns:
            raise NotImplementedError(
                f"{trainer}: {role} has an 'image' column; slimrl's lean log-prob head covers text models only. "
                "Drop the column, or train this vision dataset with stock TRL (slimrl.unpatch('online_dpo'))."
            )


def check_generation_lengths(call: SetupCall) -> None:
    validation.check_max_seq_length(
        call.model,
        call.args,
        call.arguments.get("train_dataset"),
        call.arguments.get("processing_class"),
        completion_field="max_new_tokens",
    )


ONLINE_DPO = Family(
    config_fields=fields.declared_by(("online_dpo",)),
    check_config=check_config,
    adapters=(wrap_rewards,),
    checks=(dataset_check("online_dpo"), refuse_unsupported, check_max_length, check_generation_lengths),
)


def make_forward(original):
    @functools.wraps(original)
    def _forward(self, model, prompt_ids, prompt_mask, completion_ids, completion_mask, vision_inputs=None):
        if vision_inputs is not None:
            raise NotImplementedError("slimrl's OnlineDPOTrainer._forward covers text models only (vision inputs).")
        reason = lean_head_reason(self, model)
        if reason is not None:
            warn_stock_path("OnlineDPOTrainer._forward", reason)
            return original(self, model, prompt_ids, prompt_mask, completion_ids, completion_mask, vision_inputs)
        cut = max(prompt_ids.size(1) + completion_ids.size(1) - self.max_length, 0)  # stock's left truncation
        prompt_ids, prompt_mask = prompt_ids[:, cut:], prompt_mask[:, cut:]
        input_ids = torch.cat((prompt_ids, completion_ids), dim=1)
        attention_mask = torch.cat((prompt_mask, completion_mask), dim=1)
        start = max(prompt_ids.size(1) - 1, 0)  # the position whose logits stock reads first
        labels = completion_labels(input_ids, start, completion_ids)
        log_probs = scored_logprobs(self, model, input_ids, attention_mask, labels)
        return log_probs[:, start : start + completion_ids.size(1)]

    return _forward


def with_judge(make_init):
    """The set-up's `__init__` maker, preceded by `judge=` / `reward_model=` taken as `reward_funcs=`."""

    def make(original):
        init = make_init(original)

        @functools.wraps(original)
        def __init__(self, *args, **kwargs):
            take_judge(kwargs, type(self).__name__)
            init(self, *args, **kwargs)

        return __init__

    return make


def _setup() -> list[Patch]:
    patches = setup_patches(
        ONLINE_DPO, TRAINER, CONFIG, TRAINER_PARAMS, step_params=("self", "model", "inputs", "num_items_in_batch")
    )
    return [
        dataclasses.replace(p, make=with_judge(p.make), doc=f"{p.doc}; judge= as a reward")
        if p.owner == TRAINER and p.name == "__init__"
        else p
        for p in patches
    ]


PATCHES = [
    Patch(
        TRAINER,
        "_forward",
        FORWARD_PARAMS,
        make_forward,
        "completion log-probs through slimrl's head; no [2B, T, V] logits",
    ),
    *_setup(),
    *alias_patches(MODULE, ("OnlineDPOConfig", "OnlineDPOTrainer")),
]
