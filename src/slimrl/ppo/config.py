"""`PPOConfig`: TRL's last PPO configuration (`trl.experimental.ppo`, TRL <= 1.12), on TRL 1.16's `_BaseConfig`.

Choices:
1. Field names and defaults are TRL's PPO ones (num_ppo_epochs 4, num_mini_batches 1, kl_coef 0.05, kl_estimator
   "k1", cliprange 0.2, cliprange_value 0.2, vf_coef 0.1, gamma 1.0, lam 0.95, response_length 53, temperature 0.7,
   stop_token None, ...), so TRL scripts and `TrlParser` flags carry over. Fields TRL's trainer filled in itself
   (batch_size, local_batch_size, mini_batch_size, ...) are read-only properties here, not flags.
2. Batch sizes follow the HF Trainer: one optimizer step = `per_device_train_batch_size` x
   `gradient_accumulation_steps` rows (a mini-batch), a rollout = `num_mini_batches` mini-batches, trained for
   `num_ppo_epochs` passes. With TRL's default `num_mini_batches=1` the sizes are TRL's (rollout = batch x
   accumulation). TRL's loop stepped the optimizer once per accumulation cycle whatever `num_mini_batches` was;
   here every mini-batch is one optimizer step, as in the PPO papers.
3. `total_episodes` (TRL's run length) becomes `max_steps` = rollouts x num_ppo_epochs x num_mini_batches; setting
   both to different lengths raises. The lr scheduler, logging and saving count optimizer steps (HF convention).
4. Extras: `reward_weights` (GRPO's field, for several reward functions) and `remove_unused_columns=False` by
   default (reward functions read the dataset's other columns, as in GRPO).
5. The set-up every patched TRL config gets (patches/setup/trainer_setup.py), applied to this class as it is defined:
   `slimrl_num_chunks` (alias `unsloth_num_chunks`, the lean log-prob head's chunking) accepted as a keyword, the
   fields the user passed recorded (slimrl.state.ConfigState), an unset `bf16` resolved for the device before TRL's
   default would refuse a CPU (precision.py), then PPO's own checks (`check_ppo_fields`) and TRL's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from trl.trainer.base_config import _BaseConfig

from ..patches.family import Family
from ..patches.setup import validation
from ..patches.setup.config_setup import config_init_maker, config_post_init_maker


def check_ppo_fields(args) -> None:
    """Errors for values PPO cannot run with, naming the field (before any model is loaded); the numeric fields'
    ranges are patches/setup/config_ranges.py's, checked first for every config."""
    validation.check_learning_rate(args.learning_rate)
    if args.kl_estimator not in ("k1", "k3"):
        raise ValueError(f"kl_estimator must be 'k1' or 'k3', got {args.kl_estimator!r}.")
    if args.stop_token not in (None, "eos"):
        raise ValueError(f"stop_token must be 'eos' or None, got {args.stop_token!r} (use stop_token_id for an id).")
    if args.stop_token is not None and args.stop_token_id is not None:
        raise ValueError("stop_token and stop_token_id were both set: set one of them.")
    eval_strategy = str(getattr(args.eval_strategy, "value", args.eval_strategy))
    if eval_strategy != "no":
        raise ValueError(
            f"eval_strategy={eval_strategy!r}: slimrl's PPOTrainer has no evaluation loop (TRL's PPO "
            "only printed sample completions); set eval_strategy='no'."
        )


PPO_CONFIG = Family(check_config=check_ppo_fields)


def with_config_setup(family: Family):
    """Class decorator: the config `__init__` / `__post_init__` wrappers of the patched TRL configs, on slimrl's own."""

    def decorate(cls):
        cls.__init__ = config_init_maker(family)(cls.__init__)
        cls.__post_init__ = config_post_init_maker(family)(cls.__post_init__)
        return cls

    return decorate


@with_config_setup(PPO_CONFIG)
@dataclass
class PPOConfig(_BaseConfig):
    """Configuration of `slimrl.PPOTrainer` (TRL's PPO fields; see the module docstring for the choices)."""

    remove_unused_columns: bool | None = field(
        default=False,
        metadata={
            "help": "Keep only the columns the model's forward takes. False (default): every dataset column "
            "reaches the reward functions as a keyword argument."
        },
    )
    dataset_num_proc: int | None = field(default=None, metadata={"help": "Processes for dataset preprocessing."})
    num_mini_batches: int = field(
        default=1,
        metadata={
            "help": "Mini-batches per rollout; each is one optimizer step of per_device_train_batch_size x "
            "gradient_accumulation_steps rows."
        },
    )
    total_episodes: int | None = field(
        default=None,
        metadata={
            "help": "Total rollout rows to train on (sets max_steps); unset: num_train_epochs or max_steps decide."
        },
    )
    local_rollout_forward_batch_size: int = field(
        default=64,
        metadata={
            "help": "Rows per generation call and per no-grad forward (reference, old log-probs, values, reward model) "
            "in the rollout phase."
        },
    )
    response_length: int = field(default=53, metadata={"help": "Largest number of generated tokens per response."})
    stop_token: Literal["eos"] | None = field(
        default=None,
        metadata={
            "help": "'eos': responses end at the tokenizer's EOS. None (TRL's default): no stop token unless "
            "stop_token_id is set, every response runs to response_length."
        },
    )
    stop_token_id: int | None = field(
        default=None, metadata={"help": "Token id that ends a response (exclusive with stop_token)."}
    )
    temperature: float = field(
        default=0.7, metadata={"help": "Sampling temperature of the rollouts and of the log-probs."}
    )
    missing_eos_penalty: float | None = field(
        default=None, metadata={"help": "Subtracted from the score of responses without an EOS token (must be >= 0)."}
    )
    num_ppo_epochs: int = field(default=4, metadata={"help": "Passes over each rollout batch."})
    whiten_rewards: bool = field(default=False, metadata={"help": "Whiten the per-token rewards before GAE."})
    kl_coef: float = field(default=0.05, metadata={"help": "Weight of the per-token KL penalty in the reward."})
    kl_estimator: Literal["k1", "k3"] = field(
        default="k1",
        metadata={
            "help": "KL estimator of the penalty: 'k1' (log-ratio) or 'k3' (lower variance); see "
            "http://joschu.net/blog/kl-approx.html."
        },
    )
    cliprange: float = field(default=0.2, metadata={"help": "Clip range of the policy ratio."})
    vf_coef: float = field(default=0.1, metadata={"help": "Weight of the value loss."})
    cliprange_value: float = field(default=0.2, metadata={"help": "Clip range of the value predictions."})
    gamma: float = field(default=1.0, metadata={"help": "Discount factor."})
    lam: float = field(default=0.95, metadata={"help": "GAE lambda."})
    reward_weights: list[float] | None = field(
        default=None,
        metadata={"help": "Weights of the reward functions/models when there are several (default: all 1)."},
    )

    def __post_init__(self):  # after slimrl's set-up (precision, check_ppo_fields): see with_config_setup
        super().__post_init__()
        self._apply_total_episodes()

    # --- sizes (TRL's names; read-only, derived from the fields above) ---
    @property
    def local_mini_batch_size(self) -> int:
        """Rows per optimizer step on this process."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

    @property
    def local_batch_size(self) -> int:
        """Rows per rollout on this process."""
        return self.local_mini_batch_size * self.num_mini_batches

    @property
    def mini_batch_size(self) -> int:
        return self.local_mini_batch_size * self.world_size

    @property
    def batch_size(self) -> int:
        """Rows per rollout over all processes (one `episode` each)."""
        return self.local_batch_size * self.world_size

    @property
    def steps_per_rollout(self) -> int:
        """Optimizer steps trained on each rollout."""
        return self.num_ppo_epochs * self.num_mini_batches

    @property
    def max_completion_length(self) -> int:
        """`response_length` under the name slimrl's shared length checks read."""
        return self.response_length

    def _apply_total_episodes(self) -> None:
        if self.total_episodes is None:
            return
        steps = math.ceil(self.total_episodes / self.batch_size) * self.steps_per_rollout
        if self.max_steps > 0 and self.max_steps != steps:
            raise ValueError(
                f"total_episodes={self.total_episodes} means {steps} optimizer steps (rollouts of {self.batch_size} "
                f"rows x {self.steps_per_rollout} steps each), but max_steps={self.max_steps}: set one of them."
            )
        self.max_steps = steps
