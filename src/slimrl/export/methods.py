"""The export methods with Unsloth's names, arguments and defaults (attached to models by slimrl.export).

Choices:
- Arguments Unsloth accepts that mean nothing here (temporary_location, maximum_memory_usage, save_function, ...)
  are warned about and ignored, as FastLanguageModel.from_pretrained does; an unknown keyword raises TypeError.
- `tokenizer=None` uses the tokenizer FastLanguageModel.from_pretrained returned with this model (logged); without
  one, the merged folder is saved without a tokenizer (warned) and a GGUF raises (its tokenizer is part of it).
- Everything that can be checked (save method, quantization names, architecture, DoRA) is checked before any
  weight is touched.
- `load_lora` returns what `model.fast_generate(..., lora_request=...)` takes: a vLLM `LoRARequest` with a fresh id
  (vLLM caches adapters by id), on either weight hand-over of the model's engine (vLLM's LoRA path on "lora", the
  saved adapter merged on "merged": slimrl.generation.weights.requested_adapter). `load_tensors=True` first saves
  the live adapter into the folder (vLLM 0.32's LoRARequest takes a path only).
"""

from __future__ import annotations

import itertools
import logging
import os
import tempfile
import warnings

from ..state import model_state, peft_owner
from . import gguf_writer, hub, merged

logger = logging.getLogger("slimrl")

_UNSLOTH_NO_EFFECT = (
    "state_dict",
    "save_function",
    "variant",
    "save_peft_format",
    "tags",
    "temporary_location",
    "maximum_memory_usage",
    "datasets",
    "use_temp_dir",
    "first_conversion",
    "imatrix_file",
)
_lora_request_ids = itertools.count(1_000_001)  # apart from the ids the engine's own LoRA hand-over uses


def _drop_unsloth_kwargs(method: str, kwargs: dict) -> None:
    for key in list(kwargs):
        if key in _UNSLOTH_NO_EFFECT and kwargs.pop(key) is not None:
            warnings.warn(
                f"{method}: `{key}` is an Unsloth option with no effect in slimrl; ignored.", UserWarning, stacklevel=4
            )
    if kwargs:
        raise TypeError(f"{method}() got unexpected keyword argument(s) {sorted(kwargs)}")


def _tokenizer(model, tokenizer):
    if tokenizer is None:
        tokenizer = _recorded(model, "tokenizer")
        if tokenizer is not None:
            logger.info("slimrl: no tokenizer given; using the one from_pretrained returned with this model")
    return tokenizer


def _recorded(model, fact: str):
    """A fact slimrl recorded about `model` at load time (its ModelState), or None."""
    state = model_state(model, create=False)
    return None if state is None else getattr(state, fact)


def _peft_model(model):
    """The PeftModel holding `model`'s adapter (itself, or the owner get_peft_model recorded)."""
    return peft_owner(
        model,
        "This model has no LoRA adapter to save: call save_lora / save_method='lora' on the "
        "model FastLanguageModel.get_peft_model returned.",
    )


def _check_mergeable(model) -> None:
    from ..generation.weights import lora_layers

    for layer in lora_layers(model).values():
        if any(getattr(layer, "use_dora", {}).values()):
            raise NotImplementedError(
                "Merging a DoRA adapter is not supported by slimrl (its magnitude vector is not "
                "part of ΔW); save it with save_method='lora'."
            )


def save_lora(model, save_directory):
    """Save the LoRA adapter alone (PEFT format: adapter_config.json + adapter_model.safetensors); returns the folder.

    The adapter's base_model_name_or_path names the model given to FastLanguageModel.from_pretrained.
    """
    _peft_model(model).save_pretrained(os.fspath(save_directory))
    return os.fspath(save_directory)


def load_lora(model, save_directory, load_tensors: bool = False):
    """A vLLM `LoRARequest` for `model.fast_generate(prompts, params, lora_request=...)`.

    load_tensors: True = save the model's current adapter into `save_directory` first (then request it).
    """
    if getattr(model, "vllm_engine", None) is None:
        raise ValueError(
            "load_lora returns a vLLM LoRARequest for model.fast_generate, and this model has no vLLM "
            "engine (FastLanguageModel.from_pretrained(..., fast_inference=True)). To put a saved adapter "
            "on a model, use FastLanguageModel.from_pretrained(adapter_folder)."
        )
    save_directory = os.fspath(save_directory)
    if load_tensors:
        save_lora(model, save_directory)
    elif not os.path.isfile(os.path.join(save_directory, "adapter_config.json")):
        raise FileNotFoundError(
            f"load_lora: {save_directory} holds no adapter (adapter_config.json missing); save "
            "one with model.save_lora(dir) or pass load_tensors=True."
        )
    from vllm.lora.request import LoRARequest

    request_id = next(_lora_request_ids)
    return LoRARequest(f"slimrl-lora-{request_id}", request_id, save_directory)


def save_pretrained_merged(
    model,
    save_directory,
    tokenizer=None,
    save_method: str = "merged_16bit",
    push_to_hub: bool = False,
    token=None,
    is_main_process: bool = True,
    max_shard_size=merged.MAX_SHARD_SIZE,
    safe_serialization: bool = True,
    private=None,
    dtype=None,
    **unsloth_kwargs,
):
    """Save the model with its LoRA merged (a new copy; the model is untouched) as a transformers folder.

    save_method: "merged_16bit" (float16 safetensors: vLLM, TGI, llama.cpp's converter),
        "merged_4bit" (bitsandbytes NF4; "merged_4bit_forced" too) or "lora" (the adapter alone).
    push_to_hub: treat `save_directory` as a Hub repo id and upload there (see push_to_hub_merged; private unless
        private=False).
    max_shard_size: safetensors shard size ("5GB", "500MB" or bytes).
    dtype: slimrl only; merged_16bit's dtype (default float16; torch.bfloat16 or torch.float32 to choose).
    """
    _drop_unsloth_kwargs("save_pretrained_merged", unsloth_kwargs)
    if push_to_hub:
        return push_to_hub_merged(
            model,
            save_directory,
            tokenizer,
            save_method=save_method,
            token=token,
            private=private,
            max_shard_size=max_shard_size,
            dtype=dtype,
        )
    method = merged.resolve_save_method(save_method)
    if method != "lora":
        _check_mergeable(model)
    if not safe_serialization:
        warnings.warn("safe_serialization=False: slimrl always writes safetensors.", UserWarning, stacklevel=3)
    if not is_main_process:
        return None
    save_directory = os.fspath(save_directory)
    tokenizer = _tokenizer(model, tokenizer)
    if method == "lora":
        save_lora(model, save_directory)
        merged.save_tokenizer(tokenizer, save_directory)
        return save_directory
    if method == "merged_4bit":
        return merged.save_merged_4bit(model, save_directory, tokenizer, max_shard_size)
    return merged.save_merged_16bit(
        model, save_directory, tokenizer, merged.merged_16bit_dtype(model, dtype), max_shard_size
    )


def push_to_hub_merged(
    model,
    repo_id: str,
    tokenizer=None,
    save_method: str = "merged_16bit",
    commit_message: str | None = "Trained with slimrl",
    private=None,
    token=None,
    max_shard_size=merged.MAX_SHARD_SIZE,
    create_pr: bool = False,
    safe_serialization: bool = True,
    revision: str | None = None,
    commit_description: str | None = None,
    dtype=None,
    **unsloth_kwargs,
):
    """save_pretrained_merged into a temporary folder, then create the Hub repo (if needed) and upload it.

    token: a Hub token (default: huggingface_hub's login / HF_TOKEN). Returns the commit's URL.
    private: None (default) or True: a new repository is private; False: public. (Unsloth's None means the Hub's
        default, public: slimrl keeps a fresh fine-tune private unless told.) An existing repository keeps its
        visibility.
    """
    _drop_unsloth_kwargs("push_to_hub_merged", unsloth_kwargs)
    merged.resolve_save_method(save_method)

    def save(folder):
        save_pretrained_merged(
            model,
            folder,
            tokenizer,
            save_method=save_method,
            max_shard_size=max_shard_size,
            safe_serialization=safe_serialization,
            dtype=dtype,
        )

    upload = (token, private, commit_message, commit_description, create_pr, revision)
    return _save_and_upload(model, repo_id, save, "transformers", *upload)


def save_pretrained_gguf(
    model,
    save_directory,
    tokenizer=None,
    quantization_method="fast_quantized",
    push_to_hub: bool = False,
    token=None,
    is_main_process: bool = True,
    save_method: str | None = None,
    gguf_pre_tokenizer: str | None = None,
    **unsloth_kwargs,
):
    """Write the merged model as GGUF file(s) `<save_directory>/model.<TYPE>.gguf` (+ an Ollama `Modelfile`).

    quantization_method: "f16", "bf16", "f32", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", or Unsloth's aliases
        "not_quantized" (f16) and "fast_quantized" (q8_0, the default); a list writes one file each. k-quants
        ("q4_k_m", "quantized", ...) raise with the llama-quantize command that makes them.
    gguf_pre_tokenizer: slimrl only; llama.cpp's pre-tokenizer name, when slimrl cannot tell it.
    Returns the path written (a list of paths for a list of methods).
    """
    _drop_unsloth_kwargs("save_pretrained_gguf", unsloth_kwargs)
    if push_to_hub:
        raise ValueError("save_pretrained_gguf(push_to_hub=True): use model.push_to_hub_gguf(repo_id, tokenizer, ...).")
    if save_method is not None and str(save_method).lower() == "lora":
        raise NotImplementedError(
            "GGUF LoRA adapters are not written by slimrl; save the adapter (save_lora) and "
            "convert it with llama.cpp's convert_lora_to_gguf.py, or export the merged model."
        )
    methods = list(quantization_method) if isinstance(quantization_method, (list, tuple)) else [quantization_method]
    quantizations = [gguf_writer.resolve_quantization(m) for m in methods]
    gguf_writer.architecture_of(model.config)
    _check_mergeable(model)
    tokenizer = _tokenizer(model, tokenizer)
    if tokenizer is None:
        raise ValueError("save_pretrained_gguf needs the tokenizer (it is written into the GGUF file).")
    if not is_main_process:
        return None
    paths = []
    for quantization in quantizations:
        path = os.path.join(os.fspath(save_directory), f"model.{quantization.upper()}.gguf")
        info = gguf_writer.write_gguf(model, tokenizer, path, quantization, pre_tokenizer=gguf_pre_tokenizer)
        logger.info("slimrl: wrote %s (%.1f MB)", path, info["bytes"] / 1e6)
        paths.append(path)
    hub.write_modelfile(os.fspath(save_directory), os.path.basename(paths[0]), tokenizer)
    return paths if isinstance(quantization_method, (list, tuple)) else paths[0]


def push_to_hub_gguf(
    model,
    repo_id: str,
    tokenizer=None,
    quantization_method="fast_quantized",
    commit_message: str | None = "Trained with slimrl",
    private=None,
    token=None,
    create_pr: bool = False,
    revision: str | None = None,
    commit_description: str | None = None,
    gguf_pre_tokenizer: str | None = None,
    **unsloth_kwargs,
):
    """save_pretrained_gguf into a temporary folder, then create the Hub repo (if needed) and upload it.

    private: as push_to_hub_merged's (None or True: a new repository is private; False: public).
    """
    _drop_unsloth_kwargs("push_to_hub_gguf", unsloth_kwargs)

    def save(folder):
        save_pretrained_gguf(model, folder, tokenizer, quantization_method, gguf_pre_tokenizer=gguf_pre_tokenizer)

    upload = (token, private, commit_message, commit_description, create_pr, revision)
    return _save_and_upload(model, repo_id, save, "gguf", *upload)


def _save_and_upload(
    model, repo_id, save, card_kind, token, private, commit_message, commit_description, create_pr, revision
):
    """`save(folder)` into a temporary folder, its model card written, then the Hub repo created (if needed) and the
    folder uploaded; the commit's URL."""
    with tempfile.TemporaryDirectory(prefix="slimrl-push-") as folder:
        save(folder)
        hub.write_model_card(folder, _recorded(model, "model_name"), card_kind)
        return hub.upload_folder(
            folder,
            repo_id,
            token=token,
            private=private,
            commit_message=commit_message,
            commit_description=commit_description,
            create_pr=create_pr,
            revision=revision,
        )
