"""`save_pretrained_gguf`: the merged model as one GGUF file, written by the `gguf` Python package (no llama.cpp).

Choices:
- Weights: `slimrl.generation.weights.engine_weights` in float32 (the active LoRA merged into new tensors, a 4-bit
  base dequantized), converted one tensor at a time and streamed to disk (tensor infos first, then the data): peak
  memory is the model plus one tensor, never a second copy of the model.
- Names and layout as llama.cpp's converter writes them: `gguf.TensorNameMap` for the names; Llama's q/k rows are
  permuted into llama.cpp's rotary layout (transformers' GGUF reader undoes exactly this); Qwen2 is written as is.
  Architectures: Llama (SmolLM2 is one) and Qwen2; others raise naming theirs. A rope scaling other than the
  default, Llama attention/MLP biases and Qwen2's sliding window raise too (the reader would drop them silently).
- Types: those the `gguf` package quantizes in Python: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1 (Unsloth's
  aliases: "not_quantized" = f16, "fast_quantized" = q8_0). 1-D tensors (norms, biases) stay F32, as in
  llama.cpp; a row length that is not a multiple of the block size falls back to F16 (llama.cpp's converter does
  the same; logged); below 8 bits the output projection (the embedding when tied) is Q8_0, where llama-quantize
  would use Q6_K, which Python cannot write. k-quants and i-quants (q4_k_m, ...) raise with the llama-quantize
  command that makes them from an f16 file.
- Metadata: the hyperparameters llama.cpp reads for the architecture, and the tokenizer (gguf_vocab.py).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np
import torch

from ..generation.weights import engine_weights
from . import gguf_vocab

logger = logging.getLogger("slimrl")

PYTHON_QUANTIZATIONS = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1")
UNSLOTH_ALIASES = {
    "not_quantized": "f16",
    "fast_quantized": "q8_0",
    "quantized": "q4_k_m",
    "q4_k": "q4_k_m",
    "q5_k": "q5_k_m",
}
LLAMA_QUANTIZE_ONLY = (
    "q2_k",
    "q2_k_l",
    "q2_k_s",
    "q3_k_s",
    "q3_k_m",
    "q3_k_l",
    "q3_k_xs",
    "q4_k_s",
    "q4_k_m",
    "q5_k_s",
    "q5_k_m",
    "q6_k",
    "iq1_s",
    "iq1_m",
    "iq2_xxs",
    "iq2_xs",
    "iq2_s",
    "iq2_m",
    "iq3_xxs",
    "iq3_xs",
    "iq3_s",
    "iq3_m",
    "iq4_nl",
    "iq4_xs",
    "tq1_0",
    "tq2_0",
)


@dataclass(frozen=True)
class Architecture:
    gguf_name: str  # gguf.MODEL_ARCH member name
    permute_qk: bool  # llama.cpp's Llama converter permutes q/k rows for its rotary layout


ARCHITECTURES = {"llama": Architecture("LLAMA", True), "qwen2": Architecture("QWEN2", False)}


def resolve_quantization(method) -> str:
    """The quantization name slimrl writes for `method` (Unsloth's aliases resolved); raises for what it cannot."""
    name = UNSLOTH_ALIASES.get(str(method).lower(), str(method).lower()) if method is not None else "q8_0"
    if name in PYTHON_QUANTIZATIONS:
        return name
    if name in LLAMA_QUANTIZE_ONLY:
        raise NotImplementedError(
            f"quantization_method={method!r} ({name}) needs llama.cpp's llama-quantize: the `gguf` Python package "
            f"only writes {', '.join(PYTHON_QUANTIZATIONS)}. Write an f16 GGUF with slimrl, then run "
            f"`llama-quantize model.F16.gguf model.{name.upper()}.gguf {name.upper()}` (llama.cpp build)."
        )
    raise ValueError(
        f"Unknown quantization_method {method!r}; slimrl writes {', '.join(PYTHON_QUANTIZATIONS)} "
        f"(aliases {sorted(UNSLOTH_ALIASES)})."
    )


def architecture_of(config) -> Architecture:
    arch = ARCHITECTURES.get(getattr(config, "model_type", None))
    if arch is None:
        raise NotImplementedError(
            f"GGUF export supports {sorted(ARCHITECTURES)}; this model is "
            f"{getattr(config, 'model_type', None)!r} ({type(config).__name__}). Save it with "
            "save_pretrained_merged and convert with llama.cpp's convert_hf_to_gguf.py."
        )
    _check_config(config)
    return arch


def _rope(config) -> dict:
    rope = dict(getattr(config, "rope_parameters", None) or {})
    rope.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    return rope


def _check_config(config) -> None:
    rope_type = _rope(config).get("rope_type", "default")
    problems = []
    if rope_type not in (None, "default"):
        problems.append(f"rope_type={rope_type!r}")
    flags = (
        ("attention_bias", "mlp_bias", "use_sliding_window")
        if config.model_type == "llama"
        else ("use_sliding_window",)
    )
    problems += [f"{flag}=True" for flag in flags if getattr(config, flag, False)]
    if problems:
        raise NotImplementedError(
            f"GGUF export of {config.model_type} with {', '.join(problems)} is not supported "
            "(transformers' GGUF reader would drop it); use save_pretrained_merged."
        )


def _add_hyperparameters(writer, config, file_type: int, n_vocab: int) -> None:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(float(_rope(config)["rope_theta"]))
    writer.add_rope_dimension_count(head_dim)
    if head_dim != config.hidden_size // config.num_attention_heads:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(file_type)


def _permute_rows(weight: torch.Tensor, n_head: int) -> torch.Tensor:
    """HF rotary layout (halves) -> llama.cpp's (interleaved pairs), per head; the inverse of transformers' reader."""
    return (
        weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def _tensor_type(gguf_name: str, shape: tuple, qtype, tied: bool):
    import gguf

    types = gguf.GGMLQuantizationType
    if len(shape) <= 1 or qtype == types.F32:
        return types.F32
    if qtype in (types.F16, types.BF16):
        return qtype
    is_output = gguf_name == "output.weight" or (tied and gguf_name == "token_embd.weight")
    if is_output and qtype != types.Q8_0:
        qtype = types.Q8_0
    if shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0]:
        return types.F16
    return qtype


def _nbytes(shape: tuple, qtype) -> int:
    import gguf

    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    return int(np.prod(shape)) // block * type_size


def _gguf_tensors(model, arch: Architecture, use_adapter: bool = True):
    """Yield (gguf name, float32 tensor) in llama.cpp's names and layout."""
    import gguf

    config = model.config
    name_map = gguf.TensorNameMap(gguf.MODEL_ARCH[arch.gguf_name], config.num_hidden_layers)
    n_head = config.num_attention_heads
    n_kv = getattr(config, "num_key_value_heads", None) or n_head
    for name, tensor in engine_weights(model, torch.float32, use_adapter=use_adapter):
        base, _, suffix = name.rpartition(".")
        gguf_base = name_map.get_name(base)
        if gguf_base is None:
            raise NotImplementedError(f"GGUF export: no llama.cpp name for tensor {name!r} ({arch.gguf_name}).")
        if arch.permute_qk and suffix == "weight" and gguf_base.endswith((".attn_q", ".attn_k")):
            tensor = _permute_rows(tensor, n_head if gguf_base.endswith(".attn_q") else n_kv)
        yield f"{gguf_base}.{suffix}", tensor


def write_gguf(
    model, tokenizer, path: str, quantization: str, pre_tokenizer: str | None = None, use_adapter: bool = True
) -> dict:
    """Write `model` (LoRA merged unless `use_adapter=False`) + `tokenizer` to the GGUF file `path`; returns a
    summary {"path", "quantization", "bytes", "tensors", "f16_fallbacks", "pre_tokenizer"}."""
    import gguf

    arch = architecture_of(model.config)
    qtype = gguf.GGMLQuantizationType[quantization.upper()]
    file_type = gguf.LlamaFileType["ALL_F32" if quantization == "f32" else f"MOSTLY_{quantization.upper()}"]
    plan = [(name, tuple(t.shape)) for name, t in _gguf_tensors(model, arch, use_adapter=False)]
    tied = "output.weight" not in {name for name, _ in plan}
    types = {name: _tensor_type(name, shape, qtype, tied) for name, shape in plan}
    fallbacks = [
        n
        for n, t in types.items()
        if t == gguf.GGMLQuantizationType.F16
        and qtype not in (gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16)
    ]
    if fallbacks:
        logger.info(
            "GGUF %s: %d tensor(s) kept in F16 (row length not a multiple of the block size): %s",
            quantization,
            len(fallbacks),
            fallbacks[:4],
        )
    n_vocab = model.get_input_embeddings().weight.shape[0]

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH[arch.gguf_name]])
    try:
        writer.add_type("model")
        writer.add_name(os.path.basename(os.path.dirname(os.path.abspath(path))) or "model")
        _add_hyperparameters(writer, model.config, int(file_type), n_vocab)
        pre = gguf_vocab.add_tokenizer(writer, tokenizer, n_vocab, pre_tokenizer)
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        for name, shape in plan:
            writer.add_tensor_info(name, shape, np.dtype(np.float32), _nbytes(shape, types[name]), types[name])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for name, tensor in _gguf_tensors(model, arch, use_adapter=use_adapter):
            array = tensor.to(device="cpu", dtype=torch.float32).contiguous().numpy()
            writer.write_tensor_data(gguf.quants.quantize(array, types[name]))
    finally:
        writer.close()
    return {
        "path": path,
        "quantization": quantization,
        "bytes": os.path.getsize(path),
        "tensors": len(plan),
        "f16_fallbacks": len(fallbacks),
        "pre_tokenizer": pre,
    }
