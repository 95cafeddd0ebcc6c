"""Loading a causal LM + tokenizer for FastLanguageModel.from_pretrained: source, dtype, 4-bit, tokenizer fixes.

Choices:
- Sources: the embedded model's short names (see embedded.py), a `.gguf` file (dequantized with
  `GgufConfig(dequantize=True)`; tokenizer and chat template from the same file), or anything transformers'
  `from_pretrained` takes (Hub id, local folder; `gguf_file=` passes through and gets `GgufConfig(dequantize=True)`).
  A local path always wins over a short name.
- GGUF + `load_in_4bit`: dequantized to a temporary safetensors folder, then quantized to NF4 from there (the
  GGUF's own quantization is not kept; transformers cannot apply two quantization configs). The temporary folder
  is deleted after loading.
- dtype=None (or "auto") picks bfloat16 where the device computes it fast (dtypes.py), else float32, and logs which
  and why.
- Devices: with CUDA available and no `device_map`, the model goes to this process's GPU (`LOCAL_RANK`, set by
  torchrun / accelerate launch; GPU 0 in a single process), so N ranks never all load onto GPU 0; under DeepSpeed
  ZeRO-3 no map is passed (transformers refuses one; DeepSpeed places the shards). A 4-bit load on CPU passes
  `device_map="cpu"` (bitsandbytes needs it); otherwise transformers' default (CPU) stands.
- Tokenizer: a missing pad token becomes eos (or unk); a missing chat template becomes ChatML; both are logged.
  `apply_chat_template(..., tokenize=True)` returns the ids as in transformers 4.x (chat_template_ids.py).
  `model.generate` runs with the KV cache on and checkpointing off for the call, as Unsloth's (cached_generate.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
import warnings

import torch

from ..notices import notice
from ..state import model_state
from . import adapters, cached_generate, chat_template_ids, embedded, quantization
from .dtypes import choose_dtype, take_torch_dtype
from .sources import check_local_source, hub_error, looks_like_path, pickle_only_error

logger = logging.getLogger("slimrl")

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# from_pretrained keywords that also concern the tokenizer
TOKENIZER_KWARGS = ("trust_remote_code", "revision", "token", "cache_dir", "local_files_only", "subfolder")
# Unsloth keywords that have no meaning here: accepted, warned about, dropped
_IGNORED_UNSLOTH_KWARGS = (
    "fix_tokenizer",
    "use_exact_model_name",
    "float8_kv_cache",
    "unsloth_vllm_standby",
    "disable_log_stats",
    "random_state",
    "resize_model_vocab",
    "load_in_16bit",
    "fast_inference_kwargs",
    "qat_scheme",
    "offload_embedding",  # Unsloth's embedding matrix kept in host memory
    "device_map_planner_kwargs",  # options of Unsloth's device_map="unsloth" planner
)
# Weight formats slimrl has no path for: refused when asked for (False is accepted and dropped)
_REFUSED_LOADS = {
    "load_in_8bit": "load_in_8bit=True is not supported by slimrl; use load_in_4bit=True or neither.",
    "load_in_fp8": "load_in_fp8=True (FP8 weights) is not supported by slimrl; use load_in_4bit=True or neither.",
}


def target_device_type(kwargs: dict) -> str:
    device_map = kwargs.get("device_map")
    if device_map in ("cpu", torch.device("cpu")) or device_map == {"": "cpu"}:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def split_kwargs(kwargs: dict) -> tuple[dict, dict]:
    """(from_pretrained kwargs, slimrl options) after dropping Unsloth-only keywords with a warning."""
    hf_kwargs, options = dict(kwargs), {}
    for key in ("use_gradient_checkpointing", "full_finetuning", "allow_unsafe_weights"):
        if key in hf_kwargs:
            options[key] = hf_kwargs.pop(key)
    for key, refusal in _REFUSED_LOADS.items():
        if hf_kwargs.pop(key, False):
            raise NotImplementedError(refusal)
    if hf_kwargs.get("device_map") == "unsloth":  # Unsloth's multi-GPU planner; one device here
        hf_kwargs.pop("device_map")
        notice("device_map='unsloth' is Unsloth's multi-GPU planner; using slimrl's placement (device_map=None).")
    for key in _IGNORED_UNSLOTH_KWARGS:
        if key in hf_kwargs:
            warnings.warn(
                f"FastLanguageModel.from_pretrained: `{key}` is an Unsloth option with no effect in slimrl; ignored.",
                stacklevel=5,  # the caller of from_pretrained
            )
            hf_kwargs.pop(key)
    return hf_kwargs, options


def load_choices(dtype, load_in_4bit: bool, kwargs: dict) -> tuple[dict, dict, str, torch.dtype, str]:
    """(from_pretrained kwargs, slimrl options, device type, dtype, why that dtype) of a load: transformers 4.x's
    `torch_dtype` read as `dtype`, Unsloth-only keywords dropped, a 4-bit base refused for full fine-tuning."""
    dtype = take_torch_dtype(dtype, kwargs)
    hf_kwargs, options = split_kwargs(kwargs)
    if options.get("full_finetuning") and load_in_4bit:
        raise ValueError("full_finetuning=True and load_in_4bit=True: a 4-bit base cannot be fully fine-tuned.")
    device_type = target_device_type(hf_kwargs)
    return (hf_kwargs, options, device_type, *choose_dtype(dtype, device_type))


def weights_kwargs(hf_kwargs: dict, dtype, load_in_4bit: bool, device_type: str, safetensors_only: bool) -> dict:
    """from_pretrained's keywords for the weights: safetensors only unless allowed (sources.py), the dtype, this
    process's GPU, NF4 through bitsandbytes (on CPU with `device_map="cpu"`, which it needs)."""
    kwargs = dict(hf_kwargs)
    if safetensors_only:
        kwargs.setdefault("use_safetensors", True)  # never unpickle weights unless asked (sources.py)
    kwargs.setdefault("dtype", dtype)
    if device_type == "cuda" and "device_map" not in kwargs and (device_map := process_device_map()) is not None:
        kwargs["device_map"] = device_map
    if load_in_4bit:
        kwargs["quantization_config"] = quantization.bnb_4bit_config(dtype)
        if device_type != "cuda":
            kwargs.setdefault("device_map", "cpu")
    return kwargs


def prepare_tokenizer(tokenizer, model=None):
    """Give the tokenizer a pad token and a chat template if it lacks them; mirror the pad id onto the model."""
    if tokenizer.pad_token is None:
        fallback = tokenizer.eos_token if tokenizer.eos_token is not None else tokenizer.unk_token
        if fallback is None:
            raise ValueError("The tokenizer has no pad, eos or unk token to pad with; set tokenizer.pad_token.")
        tokenizer.pad_token = fallback
        logger.info("Tokenizer had no pad token; using %r", fallback)
    if getattr(tokenizer, "chat_template", None) is None:
        tokenizer.chat_template = CHATML_TEMPLATE
        logger.info("Tokenizer had no chat template; using ChatML")
    if model is not None:
        for config in (model.config, getattr(model, "generation_config", None)):
            if config is not None and getattr(config, "pad_token_id", None) is None:
                config.pad_token_id = tokenizer.pad_token_id
    return tokenizer


def process_device_map() -> dict | None:
    """This process's GPU as a device map ({"": LOCAL_RANK}); None under ZeRO-3 (DeepSpeed places the weights)."""
    from transformers.integrations import is_deepspeed_zero3_enabled

    if is_deepspeed_zero3_enabled():
        return None
    return {"": int(os.environ.get("LOCAL_RANK", "0"))}


def _from_pretrained(
    path: str,
    dtype: torch.dtype,
    load_in_4bit: bool,
    device_type: str,
    hf_kwargs: dict,
    allow_unsafe_weights: bool = False,
):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    safetensors_only = "gguf_file" not in hf_kwargs and not allow_unsafe_weights
    kwargs = weights_kwargs(hf_kwargs, dtype, load_in_4bit, device_type, safetensors_only)
    if not load_in_4bit and "gguf_file" in kwargs:
        kwargs.setdefault("quantization_config", GgufConfig(dequantize=True))
    tokenizer_kwargs = {k: kwargs[k] for k in (*TOKENIZER_KWARGS, "gguf_file") if k in kwargs}
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **tokenizer_kwargs)
    except OSError as exc:
        if os.path.exists(path) or looks_like_path(path):
            raise
        raise hub_error(path, exc) from exc
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except OSError as exc:
        if "no file named model.safetensors" in str(
            exc
        ) or "does not appear to have a file named model.safetensors" in str(exc):
            raise pickle_only_error(path) from exc
        raise
    except (RuntimeError, ImportError, ValueError) as exc:
        if load_in_4bit and "bitsandbytes" in f"{type(exc).__module__} {exc}".lower():
            raise quantization.quantization_error(exc, device_type) from exc
        raise
    return model, tokenizer


@contextlib.contextmanager
def _weights_source(name: str, load_in_4bit: bool, local_folder: bool, hf_kwargs: dict):
    """The path transformers loads from: the embedded model's cached folder, a GGUF's folder (cached for a local
    folder, temporary for 4-bit, else the file itself through `gguf_file=`, set in hf_kwargs), or `name` as given."""
    if embedded.is_embedded_name(name) and not os.path.exists(name):
        yield embedded.embedded_model_path()
        return
    check_local_source(name)
    if not name.lower().endswith(".gguf"):
        yield name
    elif load_in_4bit and not local_folder:
        logger.info("GGUF + load_in_4bit: dequantizing %s, then quantizing to NF4", name)
        temp_folder = tempfile.mkdtemp(prefix="slimrl-gguf-")
        try:
            embedded.convert_gguf_to_folder(name, temp_folder)
            yield temp_folder
        finally:
            shutil.rmtree(temp_folder, ignore_errors=True)
    elif local_folder:
        yield embedded.gguf_cached_folder(name)
    else:
        path, hf_kwargs["gguf_file"] = os.path.split(os.path.abspath(name))
        yield path


def load_model_and_tokenizer(
    model_name, max_seq_length: int = 2048, dtype=None, load_in_4bit: bool = False, local_folder: bool = False, **kwargs
):
    """Load (model, tokenizer) with slimrl's conventions; returns them plus the slimrl-only options.

    local_folder: a GGUF file goes through a cached safetensors folder (what vLLM loads); the folder (or the Hub id)
    the weights came from is returned as options["source_path"].
    """
    hf_kwargs, options, device_type, chosen, reason = load_choices(dtype, load_in_4bit, kwargs)
    logger.info(
        "slimrl: loading %s in %s (%s)%s",
        model_name,
        str(chosen).removeprefix("torch."),
        reason,
        " with 4-bit NF4 weights" if load_in_4bit else "",
    )

    start = time.perf_counter()
    with _weights_source(os.fspath(model_name), load_in_4bit, local_folder, hf_kwargs) as path:
        model, tokenizer = _from_pretrained(
            path, chosen, load_in_4bit, device_type, hf_kwargs, options.get("allow_unsafe_weights", False)
        )
        options["source_path"] = path

    if load_in_4bit and device_type == "cpu":
        count = quantization.disable_cpu_repacking(model)
        logger.info("bitsandbytes CPU repack path disabled on %d Linear4bit layers (it drops gradients)", count)
    prepare_tokenizer(tokenizer, model)
    chat_template_ids.swap_in(tokenizer)  # apply_chat_template(tokenize=True) -> ids, as in transformers 4.x
    cached_generate.swap_in(model)  # model.generate: KV cache on, checkpointing off for the call (as Unsloth's)

    max_positions = getattr(model.config, "max_position_embeddings", None)
    if max_positions is not None and max_seq_length > max_positions:
        logger.warning(
            "max_seq_length=%d exceeds the model's max_position_embeddings=%d; quality beyond %d tokens "
            "is not guaranteed",
            max_seq_length,
            max_positions,
            max_positions,
        )
    record_load(model, max_seq_length, tokenizer, chosen, model_name)
    logger.info("slimrl: loaded in %.2f s", time.perf_counter() - start)
    return model, tokenizer, options


def set_max_seq_length(model, max_seq_length: int) -> None:
    """`model.max_seq_length`, Unsloth's attribute (the trainers check `max_length` against it): its one writer."""
    model.max_seq_length = max_seq_length


def record_load(model, max_seq_length: int, tokenizer, dtype, model_name) -> None:
    """What a load leaves on the model (text or image-text): its max_seq_length, and in its ModelState the tokenizer
    (or processor), the weights' dtype and the name the user asked for."""
    set_max_seq_length(model, max_seq_length)
    state = model_state(model)
    state.tokenizer, state.dtype, state.model_name = tokenizer, dtype, adapters.requested_model_name(model_name)
