"""The float64 sides of the parity tests: stock TRL run in float64 with a naive float64 log-prob head, and the same
with float32-sized rounding noise (Monte Carlo arithmetic, drawn three times).

1. Reference. TRL's own fused head computes in float32 whatever the weights (fp32 accumulators in its tiles), so a
   float64 model alone would still round like float32 there. The reference model gets instead, through the same
   module-level `add_fused_lm_head` symbol TRL's trainers call in `__init__`, the readable full-logits head below:
   every logit, the log-softmax, entropy and the other outputs in float64, nothing chunked. Everything else is stock
   TRL, unpatched, on a float64 copy of the same weights, with the same seeds, so its rollouts, batches and
   shuffles are the stock run's.
2. Perturbed reference. The reference again, with float32-sized random noise where float32 rounds (a private
   generator per side: the global RNG stream, and so the rollouts, stay the reference's): every linear layer's
   output y = x W^T gets u32 * (|x| @ |W|^T) * s' at every call, s' = +-1 fresh each time (the first-order rounding
   of a dot product is u32 times the size of its summands, not of its result, which is how cancelling dot products
   lose digits), and the output layer's weights are multiplied once by (1 + u32 * s). How far each compared quantity
   moves in response is its conditioning with respect to float32 rounding, measured on the run itself: a cancelling
   loss or metric moves far more than its size suggests. _parity uses it as the floor of its rule.
3. Why fresh noise at every call, in every layer: a difference of two passes over the same rows (GRPO's log-ratio of
   the training pass to the old-log-prob pass, DPO/KTO's policy minus precomputed reference log-probs) cancels any
   noise that is the same in both passes. Float32 does not round two passes alike: TRL shuffles rows between those
   passes and batches the precompute differently, BLAS kernels round a row by where it lands in the block (MKL's
   AVX2 path does; AMX does not), and slimrl's shared-prefix forward packs other rows into the backbone.
4. One draw of a scalar is a coin toss (it lands below a tenth of its typical size one time in ten), so _parity
   draws three times (three perturbed sides, other seeds) and takes the largest error: all three land that low one
   time in a thousand. Two draws left the MKL AVX2 emulation's tightest loss at 0.68 of its bound.
5. Discrete decisions TRL takes on float32 values are taken on float32 values on the float64 sides too. GRPO's
   entropy mask (`top_entropy_quantile`) rounds the entropies to float32 for its quantile (`.float()`) and compares
   the unrounded entropies with that threshold: in float64 the two sit on different grids, and where duplicate
   completions tie at the threshold the reference dropped the tied tokens that every float32 side keeps (3 tokens
   of 18, then 1: every side then differed from the reference by 3.8e-3 in the final weights, and the case could
   not see a change below 3e-4). The float64 sides' mask is TRL's own function on their entropies rounded to float32.
6. The log-probability's own rounding. A float32 head returns log p = z_t - log Z: it rounds log Z (u |log Z|) and the
   difference (u |log p|), fresh in every pass, and a float64 head rounds neither. Two passes over the same rows that
   round alike (stock TRL forwards its old-log-prob pass and its training pass at the same width) cancel it in a
   log-ratio; two that do not (slimrl's padding-free forward drops the columns that are padding for every row of a
   forward, so the old-log-prob pass and the training pass, which TRL batches with other rows, run at other widths)
   leave it in the ratio, and RLOO's sequence-level ratio sums it over a completion's tokens. Measured (RLOO, full
   fine-tuning, temperature 0.7, tests/patches/trainers/test_rloo_parity.py [full-beta0-ga2-masktrunc-temp-auto]) on
   MKL's
   Intel path: the two passes' log-probs differ by one ulp (4.8e-7 at |log p| ~ 6) on some tokens, the patched
   gradient of the LM head moves by 9.7e-6 (stock 1.0e-6, the perturbed draws without this term 1.1e-6 to 2.9e-6).
   So the perturbed sides add u (|log Z| s1 + |log p| s2), fresh signs, to every scored log-prob of every pass.
"""

from __future__ import annotations

import functools
import types
from contextlib import contextmanager

import torch

# Trainer modules that import `add_fused_lm_head` by name and call it in `__init__`
HEAD_MODULES = (
    "trl.trainer.grpo_trainer",
    "trl.trainer.rloo_trainer",
    "trl.trainer.dpo_trainer",
    "trl.trainer.kto_trainer",
    "trl.trainer.sft_trainer",
)


def naive_outputs(z: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every field of TRL's `FusedCausalLMOutput` from full (transformed) logits z [B, T, V]; zeros where label=-100."""
    mask = labels != -100
    logp_all = torch.log_softmax(z, -1)
    log_probs = logp_all.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    p = logp_all.exp()
    zero = torch.zeros_like(log_probs)
    return {
        "log_probs": torch.where(mask, log_probs, zero),
        "entropy": torch.where(mask, -(p * logp_all).sum(-1), zero),
        "log_sum_sq_probs": torch.where(mask, torch.logsumexp(2 * logp_all, -1), zero),
        "mean_logits": torch.where(mask, z.mean(-1), zero).detach(),
        "is_top1": mask & (z.argmax(-1) == labels),  # the first maximum, as TRL
        "label_mask": mask,
    }


def logit_scale_of(text_config) -> float:
    """The multiplier TRL's head applies to the logits, read from the config fields TRL reads (same order)."""
    for name in ("logit_scale", "output_multiplier", "lm_head_multiplier"):
        if getattr(text_config, name, None) is not None:
            return getattr(text_config, name)
    scaling = getattr(text_config, "logits_scaling", None)
    if scaling is not None:
        return scaling if text_config.model_type == "hyperclovax" else 1 / scaling
    return 1.0


def naive_fused_lm_head(
    model, temperature: float = 1.0, cast_lm_head_to_fp32: bool = False, outputs: tuple[str, ...] = ("log_probs",)
) -> None:
    """TRL's `add_fused_lm_head` contract with materialised logits in the model's dtype (float64 here)."""
    from trl.trainer.utils import FusedCausalLMOutput

    original_forward = model.forward
    text_config = model.config.get_text_config()
    softcap = getattr(text_config, "final_logit_softcapping", None)
    logit_scale = logit_scale_of(text_config)

    @functools.wraps(type(model).forward)
    def forward(self, *args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None, **kwargs):
        if not fused_lm_head:
            extra = {
                k: v
                for k, v in (
                    ("labels", labels),
                    ("shift_labels", shift_labels),
                    ("num_items_in_batch", num_items_in_batch),
                )
                if v is not None
            }
            return original_forward(*args, **kwargs, **extra)
        kwargs["use_cache"] = False
        hidden = self.base_model(*args, **kwargs).last_hidden_state
        if shift_labels is None:
            hidden, labels = hidden[:, :-1], labels[:, 1:]
        else:
            labels = shift_labels
        z = self.get_output_embeddings()(hidden) * logit_scale
        if softcap is not None:
            z = softcap * torch.tanh(z / softcap)
        fields = naive_outputs(z / temperature, labels)
        round_log_probs_like_float32(self, fields, z / temperature)
        mask = fields["label_mask"]
        loss = -fields["log_probs"].sum() / (
            mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
        )
        kept = {k: (v if k in outputs or k in ("log_probs", "label_mask") else None) for k, v in fields.items()}
        return FusedCausalLMOutput(loss=loss, **kept)

    model.forward = types.MethodType(forward, model)


@contextmanager
def float64_head():
    """While active, TRL's trainers install `naive_fused_lm_head` instead of their own (restored exactly after)."""
    import importlib

    modules = [importlib.import_module(name) for name in HEAD_MODULES]
    saved = [m.__dict__["add_fused_lm_head"] for m in modules]
    for m in modules:
        m.add_fused_lm_head = naive_fused_lm_head
    try:
        yield
    finally:
        for m, original in zip(modules, saved):
            m.add_fused_lm_head = original


U32 = 2.0**-24  # float32 unit roundoff


def output_layer(model):
    """The layer producing the logits (LM head) or scores (sequence classification) of a model, PEFT unwrapped."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layer = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    layer = layer if layer is not None else getattr(base, "score", None)
    return getattr(layer, "base_layer", layer)  # a LoRA-wrapped head: its frozen weight


LOG_PROB_ROUNDING = "_slimrl_log_prob_rounding"  # the perturbed model's generator for its log-probs' own rounding


def round_log_probs_like_float32(model, fields: dict, z: torch.Tensor) -> None:
    """On a perturbed model, the rounding a float32 head adds to each log-prob it returns, fresh at every call:
    log p = z_t - log Z rounds log Z (u |log Z|) and the difference (u |log p|) (point 6 of the docstring)."""
    generator = getattr(model, LOG_PROB_ROUNDING, None)
    if generator is None:
        return
    with torch.no_grad():
        log_z = torch.logsumexp(z, -1).abs()
        log_p = fields["log_probs"].abs()
        noise = U32 * (
            log_z * _random_signs(log_z.shape, generator, log_z) + log_p * _random_signs(log_p.shape, generator, log_p)
        )
    fields["log_probs"] = torch.where(fields["label_mask"], fields["log_probs"] + noise, fields["log_probs"])


def _random_signs(shape, generator: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    return torch.randint(0, 2, shape, generator=generator).to(like) * 2 - 1


@torch.no_grad()
def perturb_rounding(model, seed: int) -> None:
    """Multiply every weight of the model's output layer by (1 + u32 * s), s = +-1, and add to every linear layer's
    output, at every call, u32 * (|x| @ |W|^T) * s' with fresh signs s' (the module docstring, points 2 and 3); its
    float64 head rounds every scored log-prob like a float32 head, fresh at every call (point 6)."""
    layer = output_layer(model)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    setattr(base, LOG_PROB_ROUNDING, generator)
    layer.weight.mul_(1 + U32 * _random_signs(layer.weight.shape, generator, layer.weight))

    def round_like_float32(module, inputs, output):
        with torch.no_grad():  # a constant offset: the backward pass stays the reference's
            summands = torch.nn.functional.linear(inputs[0].abs(), module.weight.abs())
            noise = U32 * summands * _random_signs(output.shape, generator, output)
        return output + noise

    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(round_like_float32)


def float32_entropy_decisions(trainer) -> None:
    """A float64 side's GRPO entropy mask decided on its entropies rounded to float32 (point 5 of the docstring)."""
    decide = type(trainer).get_high_entropy_mask

    def get_high_entropy_mask(entropies, mask, threshold):
        return decide(trainer, entropies.float().to(entropies.dtype), mask, threshold)

    trainer.get_high_entropy_mask = get_high_entropy_mask
