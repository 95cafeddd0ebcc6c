"""One set-up for every patched trainer: the config's `__init__` / `__post_init__`, the trainer's `__init__` and
`training_step`. A trainer family (online.py, offline.py) only declares which fields and checks apply (`Family`).

What the wrappers add, and nothing else (TRL's code runs unchanged inside them):
1. Config `__init__`: slimrl's config fields are accepted as keywords and set before the dataclass `__init__`, so
   `__post_init__` and TRL's checks see them: `slimrl_num_chunks` (Unsloth's alias `unsloth_num_chunks`; the knob
   of slimrl.ops.chunking) and the family's own. Fields an older script passes under a name TRL 1.16 renamed are
   taken under the new name with a notice (both given and different: an error naming both); fields TRL removed get
   an error saying what replaced them. The fields the user passed are recorded (slimrl.state.ConfigState): slimrl
   may adjust a TRL default but never a value the user set.
2. Config class: each slimrl field's default as a class attribute (config_default_patches), so a config built
   before patching, by `dataclasses.replace` or a parser reads slimrl's defaults. Config `__post_init__`: precision
   flags resolved where TRL's default cannot run (precision.py), then `use_cpu` for a multi-process launch without an
   accelerator (distributed.py), every numeric field against its meaningful range (config_ranges.py), the family's
   config checks, then TRL's own (the clearer message wins).
3. Trainer `__init__`: `tokenizer=` (the name older TRL and Unsloth scripts use) taken as `processing_class=` with a
   notice, and keywords TRL 0.x took on the trainer that are config fields now (`beta=`, `max_length=`) set on the
   config with a notice (compat.py); TRL's arguments bound by name. Around TRL's `__init__`, the family's context
   (online: the vLLM engine's rollout config). Before it: the arguments adapted (no `processing_class`: the tokenizer
   FastLanguageModel returned with the model; the family's adapters, e.g. GRPO's reward functions), precision against
   the model's weights, the family's checks, the model's checkpointing mode against the config's flag, the knob on
   every model given (`precompute_ref_log_probs` runs a reference pass inside TRL's `__init__`). TRL's `__init__`
   then gets the adapted arguments. After it: the knob on the models TRL ended up with (a reference it loaded itself
   included) and the model's checkpointing mode re-applied (the HF Trainer re-enables its own).
4. `training_step`: the memory high-water mark at the step's end (CUDA max allocated, or VmHWM on CPU; read, never
   reset: slimrl.memory) as the `peak_memory_gb` metric, in the trainer's own metric store (`_metrics`, or
   `_stored_metrics` for the older ORPO/CPO trainers, `stats` for the
   experimental OnlineDPO); an out-of-memory error, or a step that raises the mark over
   `slimrl_max_memory_gb`, stops training with the last completed step's checkpoint kept (slimrl.training.oom).
5. `train(resume_from_checkpoint=...)`: the checkpoint checked whole first (resume_checks.py).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..memory import gib, measure_step
from ..models.checkpointing import apply_checkpointing, checkpointing_mode
from ..notices import notice
from ..ops.chunking import set_num_chunks, validate_num_chunks
from ..state import AUTO_CHUNKS, config_state, model_state, trainer_state, user_set
from ..training import budget, oom
from . import distributed, precision
from .compat import ARGUMENT_ALIASES, adapt_config_kwargs, move_trainer_kwargs, take_alias
from .config_ranges import check_ranges
from .resume_checks import resume_check_patch
from .seams import Patch

logger = logging.getLogger("slimrl")

SHARED_CONFIG_FIELDS = ((budget.BUDGET_FIELD, None),)  # (name, default) of every patched config, beside the knob


class SetupCall(NamedTuple):
    """A trainer's `__init__` call as slimrl's checks see it: the model, the config, every argument by name."""

    model: Any
    args: Any
    arguments: dict


@dataclass(frozen=True)
class Family:
    """What differs between trainer families; everything else in this module is shared."""

    config_fields: tuple[tuple[str, Any], ...] = ()  # (name, default) of the family's extra config fields
    renamed_fields: tuple[tuple[str, str], ...] = ()  # (old name, TRL 1.16's name) accepted with a notice
    removed_fields: tuple[tuple[str, str], ...] = ()  # (name TRL removed, what replaced it) -> error
    check_config: Callable[[Any], None] = lambda args: None  # config-time checks (args -> None, raise on error)
    adapters: tuple[Callable[[SetupCall], None], ...] = ()  # may change call.arguments before TRL's __init__
    checks: tuple[Callable[[SetupCall], None], ...] = ()  # trainer-time checks, before TRL's __init__
    around: Callable[[SetupCall], Any] | None = None  # a context manager around TRL's __init__ (entered first)


def num_chunks_from(slimrl_num_chunks, unsloth_num_chunks) -> int:
    """The knob from slimrl's field and Unsloth's alias (AUTO when neither is set; both set and different: error)."""
    if slimrl_num_chunks is not None and unsloth_num_chunks is not None and slimrl_num_chunks != unsloth_num_chunks:
        raise ValueError(
            f"slimrl_num_chunks={slimrl_num_chunks} and its alias unsloth_num_chunks={unsloth_num_chunks} disagree: "
            "set one of them."
        )
    value = slimrl_num_chunks if slimrl_num_chunks is not None else unsloth_num_chunks
    return validate_num_chunks(AUTO_CHUNKS if value is None else value)


def config_init_maker(family: Family):
    def make(original):
        @functools.wraps(original)
        def __init__(self, *args, slimrl_num_chunks=None, unsloth_num_chunks=None, **kwargs):
            adapt_config_kwargs(type(self), kwargs, family.renamed_fields, family.removed_fields)
            extras = {name: kwargs.pop(name, default) for name, default in keyword_fields(family)}
            self.slimrl_num_chunks = num_chunks_from(slimrl_num_chunks, unsloth_num_chunks)
            for name, value in extras.items():
                setattr(self, name, value)
            config_state(self).user_fields = frozenset(kwargs)
            original(self, *args, **kwargs)

        return __init__

    return make


def keyword_fields(family: Family) -> tuple[tuple[str, Any], ...]:
    """(name, default) of the slimrl fields a config of `family` takes as plain keywords (the knob has an alias)."""
    return (*SHARED_CONFIG_FIELDS, *family.config_fields)


def config_defaults(family: Family) -> tuple[tuple[str, Any], ...]:
    """(name, default) of every slimrl field a patched config of `family` has: the one place its defaults live."""
    return (("slimrl_num_chunks", AUTO_CHUNKS), *keyword_fields(family))


def config_default_patches(family: Family, config_path: str) -> list[Patch]:
    """Each slimrl field's default as a class attribute of the config: a config built before patching, through
    `dataclasses.replace` or a parser reads the default wherever slimrl reads the field (an instance value wins)."""

    def default_of(value):
        return lambda _missing: value

    return [
        Patch(config_path, name, None, default_of(default), doc=f"default {name}={default!r}", creates=True)
        for name, default in config_defaults(family)
    ]


def config_post_init_maker(family: Family):
    def make(original):
        @functools.wraps(original)
        def __post_init__(self):
            setattr(self, budget.BUDGET_FIELD, budget.validate_memory_budget(getattr(self, budget.BUDGET_FIELD)))
            precision.resolve_config_precision(self)
            distributed.resolve_config_device(self)
            check_ranges(self)  # every numeric field against its meaningful range (config_ranges.py)
            family.check_config(self)
            original(self)

        return __post_init__

    return make


def is_model(obj) -> bool:
    return hasattr(obj, "parameters") and hasattr(obj, "config")


def reconcile_checkpointing(model, args) -> None:
    """The model's checkpointing mode (FastLanguageModel.get_peft_model) is the more specific choice and wins over the
    config's flag; a contradicting flag the user set is warned about, TRL's untouched default is just aligned."""
    mode = checkpointing_mode(model)
    if mode is None or bool(mode) == bool(args.gradient_checkpointing):
        return
    if user_set(args, "gradient_checkpointing") or not args.gradient_checkpointing:
        warnings.warn(
            f"gradient_checkpointing={args.gradient_checkpointing} in the config is overridden by "
            f"use_gradient_checkpointing={mode!r} given to FastLanguageModel.get_peft_model; change it there.",
            UserWarning,
            stacklevel=5,
        )
    else:
        logger.info("slimrl: gradient_checkpointing=%s, as the model was prepared with it", bool(mode))
    # transformers 5 reads the new name, TRL 1.16 the deprecated alias: keep both in step
    args.gradient_checkpointing = bool(mode)
    if hasattr(args, "activation_checkpointing"):
        args.activation_checkpointing = bool(mode)


def set_chunks(models, num_chunks: int, unwrap=lambda m: m) -> None:
    for model in models:
        if is_model(model):
            set_num_chunks(unwrap(model), num_chunks)


def _bind(signature: inspect.Signature, self, args, kwargs) -> inspect.BoundArguments | None:
    """TRL's `__init__` arguments by name (None for a call TRL will refuse itself, with its own error)."""
    try:
        return signature.bind_partial(self, *args, **kwargs)
    except TypeError:
        return None


def _setup_call(bound: inspect.BoundArguments | None) -> SetupCall | None:
    """The call slimrl prepares, or None when it has nothing to check (a model given by name: TRL loads it)."""
    if bound is None:
        return None
    call = SetupCall(bound.arguments.get("model"), bound.arguments.get("args"), bound.arguments)
    return call if call.args is not None and is_model(call.model) else None


def default_processing_class(call: SetupCall) -> None:
    """No `processing_class`: the tokenizer FastLanguageModel.from_pretrained returned with the model (TRL would
    reload one by the model's name, which fails for GGUF files, the embedded model and offline machines)."""
    if call.arguments.get("processing_class") is not None:
        return
    state = model_state(call.model, create=False)
    if state is not None and state.tokenizer is not None:
        call.arguments["processing_class"] = state.tokenizer
        notice("no processing_class given: using the tokenizer FastLanguageModel.from_pretrained returned.")


def check_tokenizer(call: SetupCall) -> None:
    """TRL pads with the tokenizer's pad token (eos when there is none) and stops generation at eos: a tokenizer with
    neither would fail mid-step."""
    processing_class = call.arguments.get("processing_class")
    tokenizer = getattr(processing_class, "tokenizer", processing_class)  # processors wrap one
    if hasattr(tokenizer, "pad_token") and tokenizer.pad_token is None and getattr(tokenizer, "eos_token", 1) is None:
        raise ValueError(
            f"processing_class {type(tokenizer).__name__} has neither a pad token nor an eos token: TRL "
            "pads with pad (or eos) and ends completions at eos. Set tokenizer.pad_token and "
            "tokenizer.eos_token, or load it with FastLanguageModel.from_pretrained, which fills them."
        )


@contextlib.contextmanager
def _prepared(call: SetupCall | None, family: Family):
    """Everything before TRL's `__init__`, and the family's context around it."""
    if call is None:
        yield
        return
    with family.around(call) if family.around is not None else contextlib.nullcontext():
        for adapt in (default_processing_class, *family.adapters):
            adapt(call)
        check_tokenizer(call)
        precision.resolve_trainer_precision(call.args, call.model)
        for check in family.checks:
            check(call)
        reconcile_checkpointing(call.model, call.args)
        set_chunks((call.model, call.arguments.get("ref_model")), getattr(call.args, "slimrl_num_chunks", AUTO_CHUNKS))
        yield


def _after_init(trainer) -> None:
    chunks = getattr(trainer.args, "slimrl_num_chunks", AUTO_CHUNKS)
    set_chunks((trainer.model, getattr(trainer, "ref_model", None)), chunks, trainer.accelerator.unwrap_model)
    output_embeddings = getattr(trainer.model, "get_output_embeddings", None)
    if chunks != AUTO_CHUNKS and output_embeddings is not None and output_embeddings() is None:
        warnings.warn(
            f"slimrl_num_chunks={chunks} has no effect: {type(trainer.model).__name__} has no LM head to chunk.",
            UserWarning,
            stacklevel=3,
        )
    mode = checkpointing_mode(trainer.model)
    if mode is not None:
        apply_checkpointing(trainer.model, mode)


def trainer_init_maker(family: Family):
    def make(original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def __init__(self, *args, **kwargs):
            state = trainer_state(self)
            if state.setting_up:  # a patched subclass's __init__ set this call up already
                return original(self, *args, **kwargs)
            for old, new in ARGUMENT_ALIASES:
                if old not in signature.parameters:
                    take_alias(kwargs, old, new, type(self).__name__)
            move_trainer_kwargs(signature, args, kwargs, type(self).__name__, family)
            bound = _bind(signature, self, args, kwargs)
            state.setting_up = True
            try:
                with _prepared(_setup_call(bound), family):
                    if bound is None:
                        original(self, *args, **kwargs)
                    else:  # the arguments as slimrl adapted them
                        original(*bound.args, **bound.kwargs)
            finally:
                state.setting_up = False
            _after_init(self)

        return __init__

    return make


def record_metric(trainer, name: str, value: float) -> None:
    metrics = getattr(trainer, "_metrics", None)
    if isinstance(metrics, dict) and "train" in metrics:
        metrics["train"][name].append(value)
    elif hasattr(trainer, "_stored_metrics"):  # ORPO/CPO: averaged in their `log`
        trainer._stored_metrics["train"][name].append(value)
    elif isinstance(getattr(trainer, "stats", None), dict):  # experimental OnlineDPO: averaged when it logs
        trainer.stats.setdefault(name, []).append(value)


def make_training_step(original):
    @functools.wraps(original)
    def training_step(self, *args, **kwargs):
        state = trainer_state(self)
        if state.in_step:  # a patched subclass's training_step measures this step
            return original(self, *args, **kwargs)
        state.in_step = True
        try:
            output, peak = measure_step(
                lambda: oom.guarded_step(self, lambda: original(self, *args, **kwargs)), self.accelerator.device
            )
        finally:
            state.in_step = False
        record_metric(self, "peak_memory_gb", round(gib(peak.after), 4))
        oom.check_budget(self, peak)
        return output

    return training_step


FUSED_HEAD_PARAMS = ("model", "temperature", "cast_lm_head_to_fp32", "outputs")


def fused_head_symbol(_original):
    from ..ops.logprob import add_fused_lm_head

    return add_fused_lm_head


def fused_head_patch(module: str) -> Patch:
    """`<module>.add_fused_lm_head = slimrl.ops.logprob.add_fused_lm_head` (TRL's private helpers it reads checked)."""
    from ..ops.logprob import TRL_SYMBOLS

    return Patch(
        module,
        "add_fused_lm_head",
        FUSED_HEAD_PARAMS,
        fused_head_symbol,
        "completion-only, bounded-chunk log-prob head",
        requires=TRL_SYMBOLS,
    )


def setup_patches(
    family: Family,
    trainer_path: str,
    config_path: str,
    trainer_params: tuple[str, ...],
    step_params: tuple[str, ...] = ("self",),
    train_params: tuple[str, ...] = ("self", "resume_from_checkpoint"),
) -> list[Patch]:
    """The set-up patches of one trainer: slimrl's config defaults, config `__init__` and `__post_init__`, trainer
    `__init__`, `training_step` (trainer_params / step_params: the leading parameters TRL's methods must have), and
    `train`'s check of a checkpoint to resume from (resume_checks.py)."""
    fields = ", ".join(["unsloth_num_chunks", *(name for name, _ in config_defaults(family))])
    return [
        *config_default_patches(family, config_path),
        Patch(config_path, "__init__", ("self", "output_dir"), config_init_maker(family), f"accept {fields}"),
        Patch(
            config_path,
            "__post_init__",
            ("self",),
            config_post_init_maker(family),
            "precision resolution and config checks",
        ),
        Patch(
            trainer_path,
            "__init__",
            trainer_params,
            trainer_init_maker(family),
            "model checks, chunking, checkpointing mode",
        ),
        Patch(trainer_path, "training_step", step_params, make_training_step, "peak memory metric, out-of-memory stop"),
        resume_check_patch(trainer_path, train_params),
    ]
