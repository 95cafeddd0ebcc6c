"""One set-up for every patched trainer: the config's `__init__` / `__post_init__`, the trainer's `__init__` and
`training_step`. A trainer family (online.py, offline.py) only declares which fields and checks apply (`Family`).

What the wrappers add, and nothing else (TRL's code runs unchanged inside them); the config's `__init__` and
`__post_init__` (points 1 and 2) are in config_setup.py:
3. Trainer `__init__`: first, once per process, the busy-machine thread policy (slimrl/machine.py); then
   `tokenizer=` (the name older TRL and Unsloth scripts use) taken as `processing_class=` with a notice, and keywords
   TRL 0.x took on the trainer that are config fields now (`beta=`, `max_length=`) set on the config with a notice
   (compat.py); TRL's arguments bound by name. Around TRL's `__init__`, the family's context
   (online: the vLLM engine's rollout config). Before it: the arguments adapted (no `processing_class`: the tokenizer
   FastLanguageModel returned with the model; the family's adapters, e.g. GRPO's reward functions), precision against
   the model's weights, the family's checks, the model's checkpointing mode against the config's flag, the knob on
   every model given (`precompute_ref_log_probs` runs a reference pass inside TRL's `__init__`). TRL's `__init__`
   then gets the adapted arguments. After it: the knob on the models TRL ended up with (a reference it loaded itself
   included) and the model's checkpointing mode re-applied (the HF Trainer re-enables its own); on the CPU, glibc's
   mmap threshold lowered once per process (slimrl.training.cpu_heap); last, a ThreadWatch callback
   (slimrl.training.thread_watch) that looks at the thread policy again between steps.
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

from ... import fields
from ...machine import apply_thread_policy
from ...memory import gib, measure_step
from ...models import checkpointing
from ...notices import notice
from ...ops.chunking import set_num_chunks
from ...state import AUTO_CHUNKS, model_state, trainer_state, user_set
from ...swaps import set_field
from ...training import cpu_heap, oom
from ...training.thread_watch import watch_threads
from ..compat import ARGUMENT_ALIASES, move_trainer_kwargs, take_alias
from ..family import Family, SetupCall
from ..seams import Patch
from . import precision
from .config_setup import config_default_patches, config_defaults, config_init_maker, config_post_init_maker
from .offload_checks import check_trainer_offload
from .resume_checks import resume_check_patch

logger = logging.getLogger("slimrl")


def is_model(obj) -> bool:
    return hasattr(obj, "parameters") and hasattr(obj, "config")


def reconcile_checkpointing(model, args) -> None:
    """The model's checkpointing mode (FastLanguageModel.get_peft_model) is the more specific choice and wins over the
    config's flag; a contradicting flag the user set is warned about, TRL's untouched default is just aligned."""
    decided = config_checkpointing(args, model)
    mode = decided.mode
    if decided.row != checkpointing.MARKED or bool(mode) == bool(args.gradient_checkpointing):
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
    why = "the model's checkpointing mode (FastLanguageModel.get_peft_model)"
    set_field(args, "gradient_checkpointing", bool(mode), why)
    if hasattr(args, "activation_checkpointing"):
        set_field(args, "activation_checkpointing", bool(mode), why)


def config_checkpointing(args, model=None):
    """The mode (slimrl.models.checkpointing.ROWS) of the model's mark, the config's flag and its keywords' `offload`
    (transformers' own activation offload)."""
    mark = None if model is None else checkpointing.checkpointing_mode(model)
    return checkpointing.resolve_checkpointing(mark=mark, **checkpointing.config_inputs(vars(args)))


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
        set_chunks((call.model, call.arguments.get("ref_model")), getattr(call.args, fields.NUM_CHUNKS, AUTO_CHUNKS))
        yield


def _after_init(trainer) -> None:
    cpu_heap.apply(trainer.accelerator.device)
    chunks = getattr(trainer.args, fields.NUM_CHUNKS, AUTO_CHUNKS)
    set_chunks((trainer.model, getattr(trainer, "ref_model", None)), chunks, trainer.accelerator.unwrap_model)
    output_embeddings = getattr(trainer.model, "get_output_embeddings", None)
    if chunks != AUTO_CHUNKS and output_embeddings is not None and output_embeddings() is None:
        warnings.warn(
            f"slimrl_num_chunks={chunks} has no effect: {type(trainer.model).__name__} has no LM head to chunk.",
            UserWarning,
            stacklevel=3,
        )
    decided = config_checkpointing(trainer.args, trainer.model)
    if decided.row == checkpointing.MARKED:
        checkpointing.apply_checkpointing(trainer.model, decided.mode)
    elif decided.row == checkpointing.CONFIG_OFFLOAD:
        notice(
            "gradient_checkpointing_kwargs offload=True: TRL's GRPO, RLOO, DPO and KTO re-enable checkpointing "
            "without it around their no-grad passes, which would keep every layer input on the device; slimrl keeps "
            "them offloaded (its own offload, the mode use_gradient_checkpointing='offload' gives)."
        )
        kwargs = checkpointing.checkpoint_kwargs_of(vars(trainer.args))
        checkpointing.apply_checkpointing(trainer.model, decided.mode, kwargs, kwargs.get("every_n_layers", 1))
    check_trainer_offload(trainer)  # host memory for the offloaded layer inputs, before the first step


def trainer_init_maker(family: Family):
    def make(original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def __init__(self, *args, **kwargs):
            state = trainer_state(self)
            if state.setting_up:  # a patched subclass's __init__ set this call up already
                return original(self, *args, **kwargs)
            apply_thread_policy()  # once per process: fewer torch threads beside other running jobs
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
            watch_threads(self)  # the thread policy looked at again between steps (machine.py, choice 5)

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
    from ...ops.logprob import add_fused_lm_head

    return add_fused_lm_head


def fused_head_patch(module: str) -> Patch:
    """`<module>.add_fused_lm_head = slimrl.ops.logprob.add_fused_lm_head` (TRL's private helpers it reads checked)."""
    from ...ops.logprob import TRL_SYMBOLS

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
    accepted = ", ".join(["unsloth_num_chunks", *(name for name, _ in config_defaults(family))])
    return [
        *config_default_patches(family, config_path),
        Patch(config_path, "__init__", ("self", "output_dir"), config_init_maker(family), f"accept {accepted}"),
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
