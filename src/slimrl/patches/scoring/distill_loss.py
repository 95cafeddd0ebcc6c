"""GKD and GOLD (TRL 1.16 experimental, both SFTTrainer subclasses): `compute_loss` from the two models' hidden
states, never either model's `[B, T, V]` logits; each trainer only declares how its call differs (`DistillLoss`).

Stock `compute_loss` (GKDTrainer; GOLDTrainer's JSD path): the student forward keeps `logits` [B, T, V] for the
backward, the teacher forward (no grad) another; both are sliced `[:, :-1]` against `labels[:, 1:]` and
`generalized_jsd_loss` builds, over all B x (T-1) x V entries, temperature-scaled copies, two log-softmaxes, (JSD) the
stacked mixture and two KL tensors, keeps the rows with `labels != -100` (another copy) and reduces: sum /
`num_items_in_batch` when given, else sum / max(1, labelled positions). GKD passes no temperature (1.0: its
`temperature` is only the sampling one); GOLD passes its `temperature` and the batch's extra model inputs
(multimodal fields) to both models.

Patched: the teacher runs first (no grad, as stock: `eval()`, `torch.no_grad()`) with its lm_head swapped for a
function that keeps the hidden states and returns a 4-column probe; then the student runs as stock calls it (through
`model.__call__`: PEFT / DDP / autocast hooks) with its lm_head swapped for one that computes the per-token divergence
of the labelled positions (slimrl.ops.chunked_divergence: row chunks, full vocabulary, in place) and returns the
probe carrying it as a graph input (DDP's unused-parameter search starts from the forward's outputs, see
slimrl.ops.chunked_preference). The same reduction follows, in the dtype stock's logits would have had. Each model's
logit post-processing (softcap, scale) is read from its config and checked against what the model does to the probe.
The order of the two forwards does not change any number (the teacher draws no random numbers in eval mode).

Stock's `compute_loss` runs instead when the caller wants the outputs (`return_outputs=True`: evaluation that keeps
the logits, `prediction_loss_only=False`), and, with a warning naming the reason, when the student's output layer is
not a plain `nn.Linear` (LoRA on lm_head, a quantized head): the numbers are stock's either way.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ...ops.chunked_divergence import HeadTransform, TeacherHead, chunked_divergence
from ...ops.chunked_preference import (
    GraphCarrier,
    capture_lm_head,
    lean_head_or_reason,
    probe_columns,
    transformed_probe_matches,
)
from ...ops.chunking import num_chunks_of
from ...ops.logprob import logit_postprocessing

COMPUTE_LOSS_PARAMS = ("self", "model", "inputs", "return_outputs", "num_items_in_batch")


@dataclass(frozen=True)
class DistillLoss:
    """How one trainer's `compute_loss` calls the models and the loss (read from the trainer as stock reads it)."""

    name: str  # the trainer class, for messages
    temperature: Callable[[Any], float]  # what stock passes to `generalized_jsd_loss`
    forward_kwargs: Callable[[Any, dict], dict]  # extra model inputs, passed to both models as stock does


def transform_of(causal_lm) -> HeadTransform:
    softcap, logit_scale = logit_postprocessing(causal_lm.config.get_text_config())
    return HeadTransform(logit_scale, softcap)


def _probe(head_forward, lm_head, hidden) -> torch.Tensor:
    """A few columns of the head's output [B, T, k] (no gradient): all positions for a plain Linear, the first one
    (the rest zeros, which any post-processing keeps at zero) for any other head."""
    with torch.no_grad():
        if type(lm_head) is torch.nn.Linear:
            cols = probe_columns(lm_head.weight.shape[0], lm_head.weight.device)
            bias = None if lm_head.bias is None else lm_head.bias[cols]
            return torch.nn.functional.linear(hidden, lm_head.weight[cols], bias)
        first = head_forward(hidden[:1, :1])
        cols = probe_columns(first.shape[-1], first.device)
        probe = first.new_zeros((*hidden.shape[:2], len(cols)))
        probe[:1, :1] = first[..., cols]
        return probe


def forward_through_head(model, lm_head, causal_lm, call: dict, head_fn, what: str):
    """`model(**call, use_cache=False)` with `lm_head` swapped for `head_fn(hidden)`; returns `(outputs, result)`.

    The head returns the probe, carrying `result`'s tensors that need a gradient as graph inputs; the model's
    post-processing of the probe must be the one `transform_of(causal_lm)` reproduces, else RuntimeError."""
    head_forward = lm_head.__dict__.get("_old_forward", lm_head.forward)  # the unswapped one, for `_probe`
    box = {}

    def head(hidden):
        if "result" in box:
            raise RuntimeError(f"slimrl's lean distillation head ({what}): the model called lm_head twice")
        if tuple(hidden.shape[:2]) != tuple(call["input_ids"].shape):
            raise RuntimeError(
                f"slimrl's lean distillation head ({what}): lm_head got hidden states {tuple(hidden.shape)} for "
                f"input ids {tuple(call['input_ids'].shape)} (the model does not score every position)"
            )
        box["result"] = head_fn(hidden)
        box["probe"] = _probe(head_forward, lm_head, hidden.detach())
        carried = [x for x in box["result"] if isinstance(x, torch.Tensor) and x.requires_grad]
        return GraphCarrier.apply(box["probe"], *carried)

    with capture_lm_head(lm_head, head):
        outputs = model(**call, use_cache=False)
    if "result" not in box:
        raise RuntimeError(f"slimrl's lean distillation head ({what}): the model never called its lm_head")
    transform = transform_of(causal_lm)
    if not transformed_probe_matches(box["probe"], outputs.logits, transform.softcap, transform.logit_scale):
        raise RuntimeError(
            f"slimrl's lean distillation head: the {what} ({type(causal_lm).__name__}) post-processes its lm_head "
            f"output in a way slimrl does not reproduce (softcap={transform.softcap}, "
            f"logit_scale={transform.logit_scale} from its config). Use stock TRL for it: slimrl.unpatch('gkd') / "
            "unpatch('gold')."
        )
    return outputs, box["result"]


def teacher_hidden_states(trainer, call: dict):
    """The teacher's last hidden states [B, T, H_t] (no grad, eval mode as stock) and its `TeacherHead`."""
    teacher = trainer.teacher_model
    unwrapped = trainer.accelerator.unwrap_model(teacher)
    causal_lm = unwrapped.get_base_model() if hasattr(unwrapped, "get_base_model") else unwrapped
    lm_head = causal_lm.get_output_embeddings()
    teacher.eval()
    with torch.no_grad():
        _, (hidden,) = forward_through_head(teacher, lm_head, causal_lm, call, lambda h: (h,), "teacher")
    return hidden, TeacherHead.of(lm_head, transform_of(causal_lm))


def lean_loss(trainer, spec: DistillLoss, model, lm_head, causal_lm, inputs, num_items_in_batch):
    """Stock's loss value (see the module docstring) without either model's logits."""
    call = dict(
        input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], **spec.forward_kwargs(trainer, inputs)
    )
    scored = inputs["labels"][:, 1:] != -100
    t_hidden, teacher = teacher_hidden_states(trainer, call)
    t_rows = t_hidden[:, :-1][scored.to(t_hidden.device)]

    def divergence(hidden):
        rows = hidden[:, :-1][scored.to(hidden.device)]
        per_token, _ = chunked_divergence(
            rows,
            lm_head.weight,
            lm_head.bias,
            t_rows,
            teacher,
            trainer.beta,
            spec.temperature(trainer),
            transform_of(causal_lm),
            num_chunks_of(causal_lm),
        )
        return (per_token,)

    outputs, (per_token,) = forward_through_head(model, lm_head, causal_lm, call, divergence, "student")
    total = per_token.sum()
    if num_items_in_batch is not None:
        if isinstance(num_items_in_batch, torch.Tensor):
            num_items_in_batch = num_items_in_batch.to(total.device)
        loss = total / num_items_in_batch
    else:
        loss = total / scored.sum().clamp_min(1).to(total.device)
    return loss.to(outputs.logits.dtype)


def compute_loss_maker(spec: DistillLoss):
    """The `make` of the `compute_loss` patch of the trainer `spec` declares."""

    def make(original):
        @functools.wraps(original)
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if return_outputs:  # the caller reads the student's logits
                return original(self, model, inputs, return_outputs, num_items_in_batch)
            lm_head, causal_lm = lean_head_or_reason(model, self.accelerator.unwrap_model)
            if lm_head is None:
                warnings.warn(
                    f"slimrl: {spec.name}.compute_loss runs stock TRL's full-logits path because of the student "
                    f"model: {causal_lm}; memory and numbers are stock's.",
                    UserWarning,
                    stacklevel=2,
                )
                return original(self, model, inputs, return_outputs, num_items_in_batch)
            loss = lean_loss(self, spec, model, lm_head, causal_lm, inputs, num_items_in_batch)
            from trl.experimental.utils import empty_cache

            empty_cache()  # as stock does after every loss
            return loss

        return compute_loss

    return make
