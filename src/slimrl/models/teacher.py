"""The base of a LoRA model as the teacher of its own student: one copy of the base weights in memory.

`base_as_teacher(model)` returns a `BaseTeacher` to pass as `teacher_model=` to TRL's GKD, GOLD and Distillation
trainers while `model` (the PEFT model) is the student. Every forward and generate of the teacher runs the PEFT model
with its adapters disabled (`PeftModel.disable_adapter`) and every module in eval mode (no dropout, as a separate
teacher in `eval()` runs), each module's mode restored afterwards. Nothing else is copied: the teacher costs no
memory beyond its activations.

Choices:
- The PEFT model is held by reference, not registered as a submodule: the trainer's `teacher.eval()`, `.to()`,
  `parameters()` walks and accelerate's preparation leave the student alone.
- TRL reads from a teacher `config`, `generation_config`, `get_output_embeddings()`, `base_model` (DistillationTrainer
  runs the backbone directly) and, in GOLD, `resize_token_embeddings`: each is the base model's, the backbone runs
  with the adapters disabled as the forward does, and a resize to another size is refused (the base is shared).
- A student whose output layer carries an adapter (LoRA on `lm_head`, `modules_to_save`) is refused: the teacher's
  head would be the adapted one wherever TRL reads `get_output_embeddings()`.
Works the same with slimrl's patches on or off, so stock TRL with a `BaseTeacher` is the parity baseline.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from ..state import transformers_model


def _is_adapted(module) -> bool:
    return hasattr(module, "base_layer") or hasattr(module, "original_module")


class BaseTeacher(torch.nn.Module):
    """The adapter-disabled base of a PEFT model, as a teacher model (see the module docstring)."""

    def __init__(self, peft_model):
        super().__init__()
        if not (hasattr(peft_model, "disable_adapter") and hasattr(peft_model, "peft_config")):
            raise TypeError(
                f"base_as_teacher needs a PEFT model (FastLanguageModel.get_peft_model or peft.get_peft_model), got "
                f"{type(peft_model).__name__}: a model without an adapter is its own base; pass it as teacher_model."
            )
        head = transformers_model(peft_model).get_output_embeddings()
        if head is not None and _is_adapted(head):
            raise ValueError(
                "base_as_teacher: the student's lm_head carries an adapter (lm_head in target_modules or "
                "modules_to_save), so the shared head would not be the base's. Leave lm_head out of the adapter, or "
                "load a separate teacher model."
            )
        object.__setattr__(self, "peft_model", peft_model)  # a plain attribute: not a submodule

    @contextmanager
    def as_base(self):
        """The PEFT model with its adapters disabled and every module in eval mode, restored on exit."""
        modes = [(module, module.training) for module in self.peft_model.modules()]
        self.peft_model.train(False)
        try:
            with self.peft_model.disable_adapter():
                yield self.peft_model
        finally:
            for module, training in modes:
                module.training = training

    def forward(self, *args, **kwargs):
        with self.as_base() as model:
            return model(*args, **kwargs)

    def generate(self, *args, **kwargs):
        with self.as_base() as model:
            return model.generate(*args, **kwargs)

    @property
    def base_model(self):
        """The backbone (no LM head), run with the adapters disabled: DistillationTrainer calls it directly."""
        return _Backbone(self)

    @property
    def config(self):
        return transformers_model(self.peft_model).config

    @property
    def generation_config(self):
        return transformers_model(self.peft_model).generation_config

    @property
    def device(self):
        return transformers_model(self.peft_model).device

    @property
    def dtype(self):
        return transformers_model(self.peft_model).dtype

    def get_output_embeddings(self):
        return transformers_model(self.peft_model).get_output_embeddings()

    def get_input_embeddings(self):
        return transformers_model(self.peft_model).get_input_embeddings()

    def resize_token_embeddings(self, new_num_tokens=None, *args, **kwargs):
        embeddings = self.get_input_embeddings()
        if new_num_tokens is not None and new_num_tokens != embeddings.num_embeddings:
            raise ValueError(
                f"base_as_teacher: cannot resize the shared base's embeddings from {embeddings.num_embeddings} to "
                f"{new_num_tokens} tokens; student and teacher share one vocabulary."
            )
        return embeddings


class _Backbone(torch.nn.Module):
    def __init__(self, teacher: BaseTeacher):
        super().__init__()
        object.__setattr__(self, "teacher", teacher)

    def forward(self, *args, **kwargs):
        with self.teacher.as_base() as model:
            return transformers_model(model).base_model(*args, **kwargs)


def base_as_teacher(model) -> BaseTeacher:
    """The adapter-disabled base of the PEFT model `model`, to pass as `teacher_model=` while `model` is the student
    (one base in memory). See slimrl.models.teacher."""
    return BaseTeacher(model)
