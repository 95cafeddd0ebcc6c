"""The meaningful range of every numeric config field slimrl's trainers read, in one table, checked by one validator
when a config is built (patches/setup/trainer_setup.py's `__post_init__`, before TRL's own and before any model loads).

TRL 1.16 accepts most out-of-range values silently (top_p=0, beta=-1, num_iterations=0, epsilon=0, ...) and a run
then trains on nonsense or fails deep inside a step. A value outside its range raises `ValueError` naming the config,
the field, the value, the allowed range and what the field means. `None` (unset: TRL's own default applies) and
non-numbers (TRL's type checks) are left alone.

The table: one `Rule` per field; `configs` limits a rule to the config classes where the field means that (the same
name means different things in different trainers: GRPO's `beta` weighs a KL penalty, DPO's is an inverse
temperature). The first rule that applies to a config's field decides. Fields a validator elsewhere owns are not
repeated here: `slimrl_num_chunks` (ops/chunking.py), `slimrl_max_memory_gb` (training/budget.py), the long-context
fields `slimrl_rows_per_group` (ops/row_groups.py) / `slimrl_tiled_mlp` (models/tiled_mlp.py), and the batch
geometry (validation.py), which needs several fields at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

INF = math.inf


@dataclass(frozen=True)
class Range:
    """[low, high] with either end open; `low=-INF` / `high=INF` for no bound."""

    low: float = -INF
    high: float = INF
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        if self.high == INF:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.low == -INF:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"


POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
AT_LEAST_1 = Range(1)
FRACTION = Range(0, 1)  # [0, 1]
PROBABILITY_MASS = Range(0, 1, low_open=True)  # (0, 1]
PORT = Range(1, 65535)


@dataclass(frozen=True)
class Rule:
    field: str
    allowed: Range
    why: str
    configs: tuple[str, ...] = ()  # config class names (or base class names) it applies to; () = every config


ONLINE = ("GRPOConfig", "RLOOConfig")
SIGMOID_PREFERENCE = ("DPOConfig", "KTOConfig", "CPOConfig")

RULES: tuple[Rule, ...] = (
    # --- every trainer (TrainingArguments) ---
    Rule(
        "learning_rate", Range(0, 1, low_open=True), "the optimizer's step size (LoRA 1e-5 to 2e-4, full 1e-7 to 1e-5)"
    ),
    Rule("per_device_train_batch_size", AT_LEAST_1, "rows per micro-batch"),
    Rule("per_device_eval_batch_size", AT_LEAST_1, "rows per evaluation batch"),
    Rule("gradient_accumulation_steps", AT_LEAST_1, "micro-batches per optimizer step"),
    Rule("num_train_epochs", POSITIVE, "passes over the training set (max_steps > 0 decides instead)"),
    Rule("weight_decay", NON_NEGATIVE, "AdamW's decoupled weight decay (0: none)"),
    Rule("adam_beta1", Range(0, 1, high_open=True), "Adam's first-moment decay"),
    Rule("adam_beta2", Range(0, 1, high_open=True), "Adam's second-moment decay"),
    Rule("adam_epsilon", NON_NEGATIVE, "Adam's denominator floor"),
    Rule("warmup_steps", NON_NEGATIVE, "steps (or, below 1, the fraction of steps) of learning-rate warmup"),
    # --- rollouts (GRPO, RLOO; PPO's temperature too) ---
    Rule("num_generations", Range(2), "group-relative advantages need at least 2 completions per prompt", ONLINE),
    Rule("max_completion_length", AT_LEAST_1, "the most tokens generated (or kept) per completion"),
    Rule("generation_batch_size", AT_LEAST_1, "completions generated per generation round"),
    Rule("steps_per_generation", AT_LEAST_1, "optimizer micro-steps trained on each generation round"),
    Rule(
        "temperature",
        POSITIVE,
        "rollouts sample with temperature > 0 (1.0 is TRL's default; use a small value such as 0.1 for near-greedy "
        "sampling)",
    ),
    Rule("top_p", PROBABILITY_MASS, "nucleus sampling keeps the tokens whose probabilities add up to top_p (1: all)"),
    Rule("top_k", NON_NEGATIVE, "top-k sampling keeps the k likeliest tokens (0: no top-k filtering)"),
    Rule("min_p", FRACTION, "min-p sampling drops tokens below min_p times the likeliest one's probability"),
    Rule("repetition_penalty", POSITIVE, "divides the logits of tokens already generated (1: no penalty)"),
    Rule("num_iterations", AT_LEAST_1, "optimisation passes over each generation batch", ONLINE),
    Rule("epsilon", POSITIVE, "the policy ratio's clip range (lower side)", ONLINE),
    Rule("epsilon_high", POSITIVE, "the policy ratio's upper clip range", ONLINE),
    Rule("delta", POSITIVE, "the upper bound of two-sided clipping", ONLINE),
    Rule("beta", NON_NEGATIVE, "the weight of the KL penalty against the reference (0: no reference model)", ONLINE),
    Rule("top_entropy_quantile", FRACTION, "the share of highest-entropy tokens that get a loss (1: all)", ONLINE),
    Rule("sapo_temperature_neg", POSITIVE, "SAPO's gate temperature for negative advantages", ONLINE),
    Rule("sapo_temperature_pos", POSITIVE, "SAPO's gate temperature for positive advantages", ONLINE),
    Rule("vllm_importance_sampling_clip_max", POSITIVE, "the cap of vLLM's importance-sampling weights", ONLINE),
    Rule("vllm_importance_sampling_cap", POSITIVE, "the cap of vLLM's importance-sampling weights", ONLINE),
    Rule("vllm_importance_sampling_clip_min", NON_NEGATIVE, "the floor of vLLM's importance-sampling weights", ONLINE),
    Rule("off_policy_mask_threshold", NON_NEGATIVE, "the KL above which off-policy sequences are masked", ONLINE),
    Rule("vllm_gpu_memory_utilization", PROBABILITY_MASS, "the share of GPU memory vLLM may take"),
    Rule("vllm_tensor_parallel_size", AT_LEAST_1, "GPUs per vLLM engine"),
    Rule("vllm_server_port", PORT, "the TCP port of `trl vllm-serve`"),
    Rule("vllm_group_port", PORT, "the TCP port of vLLM's weight-update group"),
    Rule("vllm_server_timeout", POSITIVE, "seconds to wait for the vLLM server"),
    Rule("num_completions_to_print", NON_NEGATIVE, "completions printed per logging step"),
    Rule("num_generations_eval", AT_LEAST_1, "completions per prompt at evaluation", ONLINE),
    Rule("vllm_max_model_length", AT_LEAST_1, "the longest sequence vLLM serves"),
    Rule("max_tool_calling_iterations", NON_NEGATIVE, "tool-calling turns per rollout"),
    Rule("router_aux_loss_coef", NON_NEGATIVE, "the weight of a mixture-of-experts router's balancing loss"),
    Rule("pad_to_multiple_of", AT_LEAST_1, "sequence lengths are padded to a multiple of this"),
    # --- reference models ---
    Rule("ref_model_mixup_alpha", FRACTION, "the policy's share when the reference is synced to it (TR-DPO)"),
    Rule("ref_model_sync_steps", AT_LEAST_1, "steps between reference-model syncs"),
    # --- preference trainers (DPO, KTO, ORPO, CPO), SFT, reward ---
    Rule(
        "beta",
        POSITIVE,
        "the preference loss's inverse temperature (0 gives every pair the same loss)",
        SIGMOID_PREFERENCE,
    ),
    Rule("beta", NON_NEGATIVE, "ORPO's weight of the odds-ratio term (0: the SFT loss alone)", ("ORPOConfig",)),
    Rule(
        "label_smoothing", Range(0, 0.5, high_open=True), "the assumed probability that a preference label is flipped"
    ),
    Rule("discopop_tau", POSITIVE, "DiscoPOP's temperature"),
    Rule("ld_alpha", FRACTION, "LD-DPO's weight of the verbose part of a response"),
    Rule("precompute_ref_batch_size", AT_LEAST_1, "rows per batch when precomputing reference log-probs"),
    Rule("desirable_weight", POSITIVE, "KTO's weight of desirable rows"),
    Rule("undesirable_weight", POSITIVE, "KTO's weight of undesirable rows"),
    Rule("cpo_alpha", NON_NEGATIVE, "CPO's weight of the behaviour-cloning (NLL) term"),
    Rule("simpo_gamma", NON_NEGATIVE, "SimPO's target reward margin"),
    Rule("max_length", AT_LEAST_1, "the most tokens per row (prompt and completion together)"),
    Rule("dataset_num_proc", AT_LEAST_1, "processes for dataset preprocessing"),
    Rule("center_rewards_coefficient", NON_NEGATIVE, "the weight of the reward-centering term"),
    # --- slimrl's PPOTrainer ---
    Rule("num_ppo_epochs", AT_LEAST_1, "passes over each rollout batch"),
    Rule("num_mini_batches", AT_LEAST_1, "mini-batches (optimizer steps) per rollout"),
    Rule("response_length", AT_LEAST_1, "the most tokens generated per response"),
    Rule("local_rollout_forward_batch_size", AT_LEAST_1, "rows per generation call and no-grad forward in a rollout"),
    Rule("total_episodes", AT_LEAST_1, "rollout rows to train on"),
    Rule("kl_coef", NON_NEGATIVE, "the weight of the per-token KL penalty in the reward"),
    Rule("cliprange", POSITIVE, "the policy ratio's clip range"),
    Rule("cliprange_value", POSITIVE, "the value predictions' clip range"),
    Rule("vf_coef", NON_NEGATIVE, "the weight of the value loss"),
    Rule("gamma", FRACTION, "the discount factor"),
    Rule("lam", FRACTION, "GAE's lambda"),
    Rule("missing_eos_penalty", NON_NEGATIVE, "subtracted from the score of responses without an EOS token"),
    Rule("stop_token_id", NON_NEGATIVE, "the token id that ends a response"),
)


# The numeric fields of TRL 1.16's configs (beyond TrainingArguments') with no range to check here, and why
UNCHECKED = {
    "reward_weights": "a list: its length is TRL's check, any real weight is meaningful",
    "loss_weights": "a list: its length is TRL's check, any real weight is meaningful",
    "reward_clip_range": "a (low, high) pair",
    "entropy_coef": "any real (a negative coefficient penalises entropy)",
    "entropy_coef_min": "any real, like entropy_coef",
    "entropy_coef_max": "any real, like entropy_coef",
    "entropy_coef_delta": "the adaptive coefficient's step, any real",
    "entropy_target": "the adaptive coefficient's entropy target, any real",
    "vespo_k_pos": "a VESPO shape parameter, any real",
    "vespo_lambda_pos": "a VESPO shape parameter, any real",
    "vespo_k_neg": "a VESPO shape parameter, any real",
    "vespo_lambda_neg": "a VESPO shape parameter, any real",
    "f_alpha_divergence_coef": "the alpha of an alpha-divergence, any real",
    "alpha": "AlphaPO's alpha, any real (0: SimPO)",
    "padding_value": "a token id or label value, negative ones included",
}


def _applies(rule: Rule, class_names: set[str]) -> bool:
    return not rule.configs or bool(class_names.intersection(rule.configs))


def rules_for(config_cls) -> dict[str, Rule]:
    """field -> the rule that decides it for `config_cls` (fields the class has; the first applicable rule wins)."""
    class_names = {c.__name__ for c in config_cls.__mro__}
    fields = getattr(config_cls, "__dataclass_fields__", {})
    decided: dict[str, Rule] = {}
    for rule in RULES:
        if rule.field in fields and rule.field not in decided and _applies(rule, class_names):
            decided[rule.field] = rule
    return decided


def config_rules(config=None) -> tuple[Rule, ...]:
    """`slimrl.config_rules()`: every range rule; with a config (class or instance), the rules deciding its fields."""
    if config is None:
        return RULES
    return tuple(rules_for(config if isinstance(config, type) else type(config)).values())


def check_ranges(args) -> None:
    """Raise ValueError for the first numeric field of config `args` outside its range (field, value, range, why)."""
    for field, rule in rules_for(type(args)).items():
        value = getattr(args, field, None)
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isnan(value) or value not in rule.allowed:
            raise ValueError(
                f"{type(args).__name__}: {field}={value!r} is out of range (allowed: {rule.allowed}): {rule.why}."
            )
