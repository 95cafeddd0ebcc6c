"""What slimrl carries on a model, a TRL config or a trainer between calls, in one typed place each.

Every piece of private state lives in one of the three dataclasses below, stored under one attribute (`_slimrl`):
  ModelState    on the transformers model (a PeftModel reaches it through `get_base_model()`), written by
                FastLanguageModel (loading, LoRA, checkpointing) and the patched trainers (the chunk knob);
  ConfigState   on a TRL config, written by the patched config `__init__` / `__post_init__` and the trainer set-up;
  TrainerState  on a TRL trainer, written by the patched trainer methods (the shared-prefix, row-group and
                padding-free counters, the rows being scored, the record of the current optimizer step's start that an
                out-of-memory stop rolls back to).
The public attributes Unsloth's API defines stay where its users look for them: `model.max_seq_length`,
`model.vllm_engine`, `model.fast_generate`, and the config fields `slimrl_num_chunks` / `vllm_sampling_params`.

Choices:
- A dataclass under one attribute rather than many `_slimrl_*` attributes: one place lists every fact, its type and
  its owner, and `copy.deepcopy(model)` copies it with the model (the PEFT owner is a weak reference, shared).
- The state is created on first write (`model_state(model)`), read without creating (`model_state(model, False)`), so
  a model slimrl never touched carries nothing.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

STATE_ATTR = "_slimrl"
AUTO_CHUNKS = -1  # the chunk knob's "automatic" value (validated in slimrl.ops.chunking)


@dataclass
class ModelState:
    """slimrl's facts about one transformers model."""

    tokenizer: Any = None  # the tokenizer from_pretrained returned (its padding side follows the mode)
    dtype: Any = None  # the torch dtype chosen at load time
    model_name: str | None = None  # what the user asked from_pretrained for (an adapter's base_model_name_or_path)
    checkpointing: bool | str | None = None  # False | True | "offload" once configured; None: never configured
    checkpoint_args: tuple = (None, 1)  # (checkpoint kwargs, every_n_layers) reused when training mode resumes
    offloader: Any = None  # slimrl.models.offload.ActivationOffloader of the "offload" mode (pool, streams, stats)
    num_chunks: int = AUTO_CHUNKS  # slimrl_num_chunks, read by the log-prob heads at call time
    tiled_mlp: Any = None  # slimrl.models.tiled_mlp.TiledMLPState while the model's MLPs are swapped
    peft_owner: Any = None  # weakref to the PeftModel FastLanguageModel.get_peft_model made around this model
    warned: set = field(default_factory=set)  # one-time warnings already given for this model

    @property
    def offload_stats(self):
        """The offloader's stats (slimrl.models.offload.OffloadStats); None before "offload" was first enabled."""
        return None if self.offloader is None else self.offloader.stats

    def __getstate__(self):  # pickling: a weak reference cannot travel
        return {**self.__dict__, "peft_owner": None}


@dataclass
class ConfigState:
    """slimrl's facts about one TRL config."""

    user_fields: frozenset | None = None  # fields the user set (None: unknown, e.g. built by dataclasses.replace)
    auto_precision: bool = False  # bf16/fp16 left to slimrl (resolved from the model at trainer set-up)
    sampling_overrides: dict = field(default_factory=dict)  # vllm_sampling_params fields that reach vLLM
    sleep_between_rollouts: bool = True  # the attached vLLM engine sleeps between rollouts (CUDA)


@dataclass
class TrainerState:
    """slimrl's facts about one TRL trainer."""

    shared_prefix_stats: Any = None  # slimrl.patches.scoring.shared_prefix.SharedPrefixStats, once a sharing seam ran
    row_group_stats: Any = None  # slimrl.patches.scoring.row_groups.RowGroupStats, once a row-group seam ran
    row_selection: Any = None  # slimrl.patches.scoring.row_groups.RowSelection while a step's rows are scored in groups
    padding_free_stats: Any = (
        None  # slimrl.patches.scoring.padding_free.PaddingFreeStats, once a padding-free forward ran
    )
    lever_choices: Any = None  # lever -> the last slimrl.models.long_context.Choice of its "auto" (patches/row_groups)
    step_start: Any = None  # slimrl.training.oom.StepStart of the optimizer step in progress
    max_prompt_length: int | None = None  # the config's, for ORPO/CPO's tokenize_row (run before TRL sets self.args)
    # a patched subclass (GKD, GOLD on SFTTrainer) is inside its set-up / training step: the patched parent's wrapper
    # runs TRL's method alone, so the set-up runs once and each step records one peak
    setting_up: bool = False
    in_step: bool = False


# slimrl.swaps' record of what it changed on one object (any object: a tokenizer or an lm_head has no state above),
# named as the registry marks its functions (`__slimrl_original__`)
SWAPS_ATTR = "__slimrl_swaps__"


def swap_records(obj, create: bool = True) -> dict | None:
    """slimrl.swaps' record on `obj` (name -> [Swap, ...]); created empty on first write unless `create=False`."""
    records = vars(obj).get(SWAPS_ATTR) if hasattr(obj, "__dict__") else None
    if records is None and create:
        records = {}
        object.__setattr__(obj, SWAPS_ATTR, records)  # plain attribute: no nn.Module registration
    return records


def transformers_model(model):
    """The transformers model under a PeftModel (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def model_state(model, create: bool = True) -> ModelState | None:
    """The ModelState of `model` (PEFT unwrapped); created empty when missing unless `create=False`."""
    target = transformers_model(model)
    state = target.__dict__.get(STATE_ATTR)
    if state is None and create:
        state = ModelState()
        target.__dict__[STATE_ATTR] = state  # plain attribute: no nn.Module registration
    return state


def config_state(args, create: bool = True) -> ConfigState | None:
    """The ConfigState of a TRL config; created empty when missing unless `create=False`."""
    state = getattr(args, STATE_ATTR, None)
    if state is None and create:
        state = ConfigState()
        object.__setattr__(args, STATE_ATTR, state)
    return state


def trainer_state(trainer, create: bool = True) -> TrainerState | None:
    """The TrainerState of a TRL trainer; created empty when missing unless `create=False`."""
    state = trainer.__dict__.get(STATE_ATTR)
    if state is None and create:
        state = TrainerState()
        trainer.__dict__[STATE_ATTR] = state
    return state


def user_fields(args) -> frozenset:
    """The config fields the user set (empty when unknown)."""
    state = config_state(args, create=False)
    return frozenset() if state is None or state.user_fields is None else state.user_fields


def user_set(args, name: str) -> bool:
    """Whether the user set the config field `name`, the one test slimrl asks before changing a config value: the
    fields recorded by the patched `__init__`; where none are recorded (a config built before patching, or by
    `dataclasses.replace`), whether the value differs from the field's default."""
    state = config_state(args, create=False)
    if state is not None and state.user_fields is not None:
        return name in state.user_fields
    default = field_default(type(args), name)
    return default is not _NO_DEFAULT and getattr(args, name, default) != default


_NO_DEFAULT = object()


def field_default(config_cls, name: str):
    """The value a config field has when nobody set it (dataclass default, or slimrl's class-level default)."""
    import dataclasses

    if not dataclasses.is_dataclass(config_cls):
        return _NO_DEFAULT
    for f in dataclasses.fields(config_cls):
        if f.name == name:
            return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return getattr(config_cls, name, _NO_DEFAULT)


def set_peft_owner(model, peft_model) -> None:
    """Record the PeftModel wrapped around `model` (a weak reference: an attribute Module would become a submodule)."""
    model_state(model).peft_owner = weakref.ref(peft_model)


def peft_owner(model, missing: str):
    """The PeftModel holding `model`'s LoRA layers: `model` itself, or the one recorded by `set_peft_owner`;
    raises ValueError(`missing`) when there is none."""
    if hasattr(model, "peft_config") and hasattr(model, "get_base_model"):
        return model
    state = model_state(model, create=False)
    owner = state.peft_owner() if state is not None and state.peft_owner is not None else None
    if owner is None:
        raise ValueError(missing)
    return owner
