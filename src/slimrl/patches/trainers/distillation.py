"""DistillationTrainer: TRL 1.16's stable on-policy distillation trainer (`trl.DistillationTrainer`: generalized JSD
with `beta` and `temperature` on the student's own completions, HF or vLLM generation), patched.

TRL already computes this loss without the full logits: `_compute_loss` runs both backbones and hands the hidden
states to `_chunked_divergence_loss`, whose `ChunkedDivergenceFunction` projects `[4096 tokens, 32768 vocab]` tiles.
On CUDA with Triton that kernel is fused and scores only the completion tokens; slimrl leaves it in place there.
Elsewhere (CPU, or no Triton) TRL runs its torch fallback, which projects every position, padding included (a
constant shape for compilers), and allocates about ten fp32 temporaries of the tile's size per tile (transformed
copies, exponentials, products): more than one set of full logits once a step scores a few hundred tokens.

Patched: `trl.trainer.distillation_trainer._chunked_divergence_loss`, the module-level name `_compute_loss` calls:
where TRL would take its torch fallback, slimrl.ops.chunked_divergence on the completion tokens only (row chunks over
the full vocabulary, in place, `slimrl_num_chunks`), with the same reduction (sum / `num_items_in_batch`, else sum /
max(1, valid tokens)) and the same entropy sum and token count; TRL's function otherwise (Triton devices, FSDP2
DTensor heads). `_compute_loss`: makes the student's `slimrl_num_chunks` visible to that function. The set-up
(trainer_setup.py, distill_setup.py): `slimrl_num_chunks`, precision, checkpointing mode, the teacher check (a
`slimrl.base_as_teacher(model)` teacher shares the student's base), the `peak_memory_gb` metric.
TRL's own: generation (HF or vLLM, tools), `_get_last_hidden_state`, `compute_loss`, the metrics,
`_forward_redirection`.
"""

from __future__ import annotations

import functools
import inspect

import torch

from ...ops.chunked_divergence import HeadTransform, TeacherHead, chunked_divergence
from ...ops.chunking import AUTO_CHUNKS, num_chunks_of
from ...swaps import RunValue
from ..seams import Patch
from ..setup.trainer_setup import setup_patches
from .distill_setup import DISTILLATION

MODULE = "trl.trainer.distillation_trainer"
TRAINER = f"{MODULE}.DistillationTrainer"
LOSS_PARAMS = (
    "student_hidden_states",
    "teacher_hidden_states",
    "student_lm_head_weight",
    "teacher_lm_head_weight",
    "completion_mask",
    "beta",
    "num_items_in_batch",
    "student_lm_head_bias",
    "teacher_lm_head_bias",
    "student_logit_scale",
    "teacher_logit_scale",
    "student_final_logit_softcapping",
    "teacher_final_logit_softcapping",
    "temperature",
)

_STUDENT_CHUNKS = RunValue("distillation_chunks", AUTO_CHUNKS, "the student's chunk knob while GKD's loss runs")


def _trl_runs_its_kernel(hidden, *weights) -> bool:
    from trl.kernels.chunked_logprob import _use_triton

    return _use_triton(hidden.device) or any(isinstance(w, torch.distributed.tensor.DTensor) for w in weights)


def compact_divergence_loss(
    student_hidden_states,
    teacher_hidden_states,
    student_lm_head_weight,
    teacher_lm_head_weight,
    completion_mask,
    beta,
    num_items_in_batch=None,
    student_lm_head_bias=None,
    teacher_lm_head_bias=None,
    student_logit_scale=1.0,
    teacher_logit_scale=1.0,
    student_final_logit_softcapping=None,
    teacher_final_logit_softcapping=None,
    temperature=1.0,
):
    """TRL's `_chunked_divergence_loss` contract `(loss, entropy_sum, n_valid)` on the completion tokens only."""
    valid = completion_mask.reshape(-1) != 0
    n_valid = valid.sum()
    h_s = student_hidden_states.reshape(-1, student_hidden_states.size(-1))[valid]
    h_t = teacher_hidden_states.reshape(-1, teacher_hidden_states.size(-1))[valid.to(teacher_hidden_states.device)]
    teacher_transform = HeadTransform(teacher_logit_scale, teacher_final_logit_softcapping)
    per_token, entropy = chunked_divergence(
        h_s,
        student_lm_head_weight,
        student_lm_head_bias,
        h_t,
        TeacherHead(teacher_lm_head_weight, teacher_lm_head_bias, None, teacher_transform),
        beta,
        temperature,
        HeadTransform(student_logit_scale, student_final_logit_softcapping),
        _STUDENT_CHUNKS.get(),
        with_entropy=True,
    )
    return trl_reduction(per_token, entropy, n_valid, num_items_in_batch)


def trl_reduction(per_token, entropy, n_valid, num_items_in_batch):
    """`(loss, entropy_sum, n_valid)` from per-token losses and entropies as TRL's `_chunked_divergence_loss` reduces
    them: the sum over `num_items_in_batch`, else over max(1, valid tokens)."""
    loss = per_token.sum()
    if num_items_in_batch is None:
        loss = loss / n_valid.clamp(min=1)  # a fully masked batch reduces to 0, as TRL's
    else:
        if isinstance(num_items_in_batch, torch.Tensor):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss, entropy.sum(), n_valid


def lean_divergence_loss(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def _chunked_divergence_loss(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = bound.arguments
        heads = (values["student_lm_head_weight"], values["teacher_lm_head_weight"])
        if _trl_runs_its_kernel(values["student_hidden_states"], *heads):
            return original(*args, **kwargs)
        return compact_divergence_loss(**values)

    return _chunked_divergence_loss


def knob_to_loss(original):
    @functools.wraps(original)
    def _compute_loss(self, unwrapped_student, inputs, num_items_in_batch):
        with _STUDENT_CHUNKS.bound(num_chunks_of(unwrapped_student)):
            return original(self, unwrapped_student, inputs, num_items_in_batch)

    return _compute_loss


PATCHES = [
    Patch(
        MODULE,
        "_chunked_divergence_loss",
        LOSS_PARAMS,
        lean_divergence_loss,
        "completion-only divergence in row chunks off Triton devices; TRL's kernel where it runs fused",
        requires=(("trl.kernels.chunked_logprob", "_use_triton", ("device",)),),
    ),
    Patch(
        TRAINER,
        "_compute_loss",
        ("self", "unwrapped_student", "inputs", "num_items_in_batch"),
        knob_to_loss,
        "the student's slimrl_num_chunks reaches the divergence",
    ),
    *setup_patches(
        DISTILLATION,
        TRAINER,
        "trl.trainer.distillation_config.DistillationConfig",
        ("self", "model", "teacher_model", "args", "train_dataset", "eval_dataset", "processing_class"),
    ),
]
