"""Rollouts through the model's own vLLM engine (FastLanguageModel.from_pretrained(fast_inference=True)).

The seam is the `VLLMGeneration` name TRL's GRPO and RLOO trainer modules call in `__init__`: it is replaced by a
factory that returns TRL's own class unless the model carries a slimrl engine; then it returns a subclass of TRL's
class whose engine is the attached one. (In server mode it may return vllm_server.py's subclass instead: the LoRA
adapter handed over through the server's LoRA endpoints.) TRL's `generate` (prompt handling, SamplingParams built
from the config, log-prob extraction for the importance-sampling correction, structured outputs) runs unchanged;
only three things differ:
- no second engine: the attached one is used, built once from the same weights;
- `sync_weights` hands the current weights over in memory (merged LoRA reloaded in place on CPU, a LoRARequest with
  a fresh id on CUDA: see slimrl.generation.vllm_engine), and every `generate` checks again that the engine holds
  the current adapter, so a rollout can never silently come from the base model;
- the engine sleeps between rollouts (CUDA: KV cache released, weights parked in CPU memory), instead of TRL's
  level-2 sleep and full re-push.

`vllm_sampling_params` (Unsloth's config field: a vllm.SamplingParams or a dict): every field that differs from
SamplingParams' defaults reaches vLLM, scalars included. A field the trainer also reads (temperature, top_p, top_k,
min_p, repetition_penalty, max_tokens) is copied into the config so the loss sees the sampler it came from; if the
user set that config field to something else, it raises, naming both. A `seed` becomes seed + i per request: one
seed for all requests would make the num_generations completions of a prompt identical (zero advantage).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import warnings

from ... import fields
from ...generation.vllm_engine import engine_of, warn_unused
from ...state import config_state, user_set
from ...swaps import RunValue, adjust_default
from . import vllm_server

logger = logging.getLogger("slimrl")

# vllm_sampling_params field -> config field the trainer (and its loss) also reads
_SHARED_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_tokens": "max_completion_length",
}
_REFUSED_FIELDS = {
    "n": "the trainer samples num_generations completions per prompt itself; set num_generations",
    "logprobs": "the trainer asks for the sampled tokens' log-probs (importance-sampling correction)",
    "prompt_logprobs": "not used by the trainer",
}
# what EngineVLLMGeneration overrides or calls on TRL's class (checked at patch time)
VLLM_GENERATION_USES = (
    ("_init_vllm", ("self",)),
    ("sync_weights", ("self",)),
    ("generate", ("self", "prompts", "images", "num_generations", "profiler")),
)
# config fields that configure TRL's own engine, not the attached one
_ENGINE_FIELDS = ("vllm_gpu_memory_utilization", "vllm_max_model_length", "vllm_tensor_parallel_size")


def sampling_overrides(vllm_sampling_params) -> dict:
    """The fields of a SamplingParams (or dict) that differ from SamplingParams() defaults, scalars included."""
    if vllm_sampling_params is None:
        return {}
    if isinstance(vllm_sampling_params, dict):
        return dict(vllm_sampling_params)
    from vllm import SamplingParams

    default = SamplingParams()
    names = [n for n in getattr(type(vllm_sampling_params), "__struct_fields__", ()) if not n.startswith("_")]
    return {
        n: getattr(vllm_sampling_params, n) for n in names if getattr(vllm_sampling_params, n) != getattr(default, n)
    }


def _same(field: str, a, b) -> bool:
    if field == "top_k":  # vLLM's -1 and TRL's 0 both mean "off"
        a, b = (0 if a in (-1, None) else a), (0 if b in (-1, None) else b)
    if field == "min_p":
        a, b = a or 0.0, b or 0.0
    return a == b


def apply_sampling_params(args) -> dict:
    """Check `args.vllm_sampling_params` against the config and copy the shared fields into it; returns the
    overrides for vLLM (without `seed`, applied per request)."""
    overrides = sampling_overrides(getattr(args, fields.VLLM_SAMPLING_PARAMS, None))
    for field, why in _REFUSED_FIELDS.items():
        if field in overrides and not (field == "n" and overrides[field] == 1):
            raise ValueError(f"vllm_sampling_params.{field}={overrides[field]!r} is not accepted: {why}.")
    overrides.pop("n", None)
    for field, config_field in _SHARED_FIELDS.items():
        if field not in overrides or not hasattr(args, config_field):
            continue
        value, current = overrides[field], getattr(args, config_field)
        if _same(field, value, current):
            continue
        taken = 0 if field == "top_k" and value == -1 else value
        if not adjust_default(args, config_field, taken, f"vllm_sampling_params.{field}"):  # the user set it
            raise ValueError(
                f"vllm_sampling_params.{field}={value!r} and {type(args).__name__}.{config_field}="
                f"{current!r} disagree; the loss uses the config's value: set one of them."
            )
        logger.info(
            "slimrl: %s=%r from vllm_sampling_params.%s (config default was %r)", config_field, taken, field, current
        )
    return overrides


# The trainer config while TRL's __init__ runs: VLLMGeneration is called without it, and the model may still be a
# name (server mode), so nothing can carry it but a value bound for the duration of __init__
TRAINER_ARGS = RunValue("vllm_trainer_args", None, "the trainer config while TRL's __init__ builds VLLMGeneration")


@contextlib.contextmanager
def engine_rollouts(model, args):
    """Around TRL's trainer __init__: config prepared for the model's engine, visible to the VLLMGeneration seam."""
    _prepare_config(model, args)
    with TRAINER_ARGS.bound(args):
        yield


def _prepare_config(model, args) -> None:
    """Before TRL's __init__: use the engine when there is one (use_vllm), and say what does not apply."""
    engine = engine_of(model)
    vllm_server.check_server_sync(args)
    if engine is None:
        if getattr(args, fields.VLLM_SAMPLING_PARAMS, None) is not None and not args.use_vllm:
            warnings.warn(
                "vllm_sampling_params is set but use_vllm=False: it has no effect.", UserWarning, stacklevel=4
            )
        return
    if not args.use_vllm:
        if not adjust_default(args, "use_vllm", True, "the model has a vLLM engine (fast_inference=True)"):
            warn_unused("use_vllm", False)
            return
        logger.info("slimrl: use_vllm=True, since the model has a vLLM engine (fast_inference=True)")
    if args.vllm_mode != "colocate":
        warn_unused("vllm_mode", args.vllm_mode)
        return
    for field in _ENGINE_FIELDS:
        if user_set(args, field):
            warnings.warn(
                f"{field} configures TRL's own vLLM engine; the model's engine was built by "
                "FastLanguageModel.from_pretrained (set gpu_memory_utilization / vllm_engine_kwargs there).",
                UserWarning,
                stacklevel=4,
            )
    state = config_state(args)
    state.sampling_overrides = apply_sampling_params(args)
    # TRL's default (False) leaves the choice to slimrl: sleep between rollouts; an explicit False keeps it awake
    state.sleep_between_rollouts = args.vllm_enable_sleep_mode or not user_set(args, "vllm_enable_sleep_mode")


class _EngineLLM:
    """Stands in for TRL's `self.llm`: generation goes to the attached engine with the current weights."""

    def __init__(self, owner):
        self._owner = owner

    def generate(self, prompts, sampling_params=None, use_tqdm=False, **kwargs):
        owner = self._owner
        seed = getattr(sampling_params, "seed", None)
        if seed is not None and not isinstance(sampling_params, list) and len(prompts) > 1:
            sampling_params = [sampling_params.clone() for _ in prompts]
            for i, params in enumerate(sampling_params):
                params.seed = seed + i  # distinct, reproducible completions per request
        model = owner.accelerator.unwrap_model(owner.model)
        return owner.engine.generate(prompts, sampling_params, model=model, use_tqdm=use_tqdm)

    def __getattr__(self, name):  # llm_engine.model_config etc. for TRL's tool loop
        return getattr(self._owner.engine.llm, name)


def make_vllm_generation(original):
    class EngineVLLMGeneration(original):
        __doc__ = f"TRL's {original.__name__} on the model's attached vLLM engine (slimrl)."

        def __init__(self, engine, sleep_between: bool, sampling_overrides: dict, **kwargs):
            self.engine = engine
            self.sleep_between = sleep_between
            # one engine per process, slimrl sleeps/wakes it itself (TRL's level-2 sleep would drop the weights)
            kwargs.update(mode="colocate", enable_sleep_mode=False, tensor_parallel_size=1)
            generation_kwargs = dict(kwargs.get("generation_kwargs") or {})
            generation_kwargs.update({k: v for k, v in sampling_overrides.items() if k not in _SHARED_FIELDS})
            kwargs["generation_kwargs"] = generation_kwargs
            super().__init__(**kwargs)

        def _init_vllm(self):
            self.llm = _EngineLLM(self)

        def sync_weights(self):
            self.engine.sync(self.accelerator.unwrap_model(self.model))

        def generate(self, *args, **kwargs):
            self.engine.wake()
            try:
                return super().generate(*args, **kwargs)
            finally:
                if self.sleep_between:
                    self.engine.sleep()

    server_class = vllm_server.make_server_adapter_class(original)

    @functools.wraps(original)
    def VLLMGeneration(*args, model=None, **kwargs):  # noqa: N802 (stands in for TRL's class)
        engine = engine_of(model) if model is not None else None
        trainer_args = TRAINER_ARGS.get()
        if kwargs.get("mode") == "server" and vllm_server.uses_adapter_sync(
            trainer_args, model, kwargs.get("accelerator")
        ):
            root = os.path.join(getattr(trainer_args, "output_dir", None) or ".", vllm_server.ADAPTER_FOLDER)
            return server_class(root, *args, model=model, **kwargs)
        if engine is None or kwargs.get("mode", "colocate") != "colocate":
            return original(*args, model=model, **kwargs)
        state = config_state(trainer_args, create=False)
        sleep, overrides = (True, {}) if state is None else (state.sleep_between_rollouts, state.sampling_overrides)
        return EngineVLLMGeneration(engine, sleep, overrides, model=model, **kwargs)

    VLLMGeneration.engine_class = EngineVLLMGeneration
    VLLMGeneration.server_class = server_class
    return VLLMGeneration
