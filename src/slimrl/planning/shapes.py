"""A model's shape for the memory planner, read from its config alone (no weights are loaded).

Choices:
1. Parameter counts and Linear shapes come from the model built on the meta device
   (`accelerate.init_empty_weights`): exact for any architecture transformers knows (tied embeddings, biases, MoE
   experts), and free: meta tensors hold no storage.
2. LoRA targets default to slimrl's own default (slimrl.models.lora.default_target_modules: every Linear inside the
   decoder blocks), so a plan matches what `FastLanguageModel.get_peft_model(model)` builds.
3. A model is given as a transformers config, a config dict, a config.json path or folder, a `.gguf` file (its
   metadata), the embedded model's short name, or a Hub id (planning/hub.py: read from the local cache when offline
   or when the Hub cannot be reached).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelShape:
    """What the planner needs to know about a decoder model."""

    name: str
    model_type: str
    num_layers: int
    hidden: int
    intermediate: int
    vocab: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tied_embeddings: bool
    num_params: int  # every parameter once (tied embeddings counted once)
    decoder_linear_params: int  # weights of the Linear layers inside the decoder blocks (what 4-bit quantizes)
    largest_param: int  # elements of the largest single parameter (the optimizer's per-tensor temporaries)
    param_sizes: tuple[int, ...] = ()  # elements of every parameter (gradients are allocated one per parameter)
    lora_params: int = 0  # LoRA A + B elements for the requested rank and targets (0: none asked)
    lora_targets: tuple[str, ...] = ()
    lora_rank: int = 0  # r
    lora_rank_sum_per_layer: int = 0  # r x number of LoRA modules in one decoder block (their A outputs are saved)
    lora_inputs_per_layer: int = 0  # in_features summed over one block's LoRA modules
    lora_shared_inputs_per_layer: int = 0  # the same, counting an input read by several of them once (SHARED_INPUTS)
    extras: dict = field(default_factory=dict)


def _config_from_path(path: str):
    from transformers import AutoConfig

    if path.lower().endswith(".gguf"):
        folder, filename = os.path.split(os.path.abspath(path))
        return AutoConfig.from_pretrained(folder, gguf_file=filename)
    if os.path.isfile(path):
        with open(path) as f:
            return _config_from_dict(json.load(f))
    if os.path.isdir(path):
        return AutoConfig.from_pretrained(path)
    from ..models.sources import check_local_source

    check_local_source(path)  # a path that does not exist: said as such, not as a Hub id
    from .hub import hub_config

    return hub_config(path)


def _config_from_dict(values: dict):
    from transformers import AutoConfig

    values = dict(values)
    model_type = values.pop("model_type", None)
    if model_type is None:
        raise ValueError('A model config given as a dict or JSON file needs its `model_type` (e.g. "llama").')
    return AutoConfig.for_model(model_type, **values)


def resolve_config(model):
    """A transformers config for any accepted form of `model` (see the module docstring)."""
    from ..models import embedded

    if hasattr(model, "to_dict") and hasattr(model, "model_type"):
        return model
    if hasattr(model, "config") and hasattr(model.config, "model_type"):  # a model object: its config
        return model.config
    if isinstance(model, dict):
        return _config_from_dict(model)
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(
            f"plan(model=...) takes a transformers config, a dict, a path or a model name; got {type(model).__name__}"
        )
    name = str(model)
    if embedded.is_embedded_name(name):
        return _config_from_path(embedded.embedded_gguf_path())
    return _config_from_path(name)


def _meta_model(config):
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    model.tie_weights()  # init_empty_weights skips the tying from_config does on real weights
    return model


# Linear layers of a block that read the same tensor (Llama-style names); the attention output projection reads
# the attention's own output, which autograd keeps anyway
SHARED_INPUTS = ({"q_proj", "k_proj", "v_proj"}, {"gate_proj", "up_proj"}, {"o_proj"})


def _lora_counts(model, targets, rank: int) -> dict:
    """LoRA sizes for `targets` (None: slimrl's default): elements in the whole model, and per block r x modules,
    their inputs' widths, and those widths with a shared input counted once."""
    from ..models.lora import decoder_layers, default_target_modules, is_linear

    names = tuple(sorted(default_target_modules(model) if targets is None else targets))
    total, first = 0, {}
    for index, layer in enumerate(decoder_layers(model)):
        for name, module in layer.named_modules():
            short = name.rsplit(".", 1)[-1]
            if name and is_linear(module) and short in names:
                in_f, out_f = _linear_dims(module)
                total += rank * (in_f + out_f)
                if index == 0:
                    first[short] = in_f
    if total == 0:
        raise ValueError(
            f"LoRA targets {list(names)} match no Linear layer inside the decoder blocks of {type(model).__name__}."
        )
    grouped = {n for group in SHARED_INPUTS for n in group}
    shared = sum(v for n, v in first.items() if n not in grouped)
    shared += sum(max((first[n] for n in group if n in first), default=0) for group in SHARED_INPUTS[:2])
    return dict(
        lora_params=total,
        lora_targets=names,
        lora_rank=rank,
        lora_rank_sum_per_layer=rank * len(first),
        lora_inputs_per_layer=sum(first.values()),
        lora_shared_inputs_per_layer=shared,
    )


def _linear_dims(module) -> tuple[int, int]:
    if hasattr(module, "in_features"):
        return module.in_features, module.out_features
    rows, cols = module.weight.shape  # transformers' Conv1D keeps the weight as (in, out)
    return rows, cols


def model_shape(model, lora_rank: int | None = None, lora_targets=None) -> ModelShape:
    """The ModelShape of `model`; with `lora_rank`, the LoRA adapter's size for `lora_targets` (None: slimrl's
    default targets)."""
    from ..models.lora import decoder_layers, is_linear

    config = resolve_config(model)
    text = config.get_text_config()
    meta = _meta_model(config)
    params = list(meta.parameters())
    linear = sum(m.weight.numel() for layer in decoder_layers(meta) for m in layer.modules() if is_linear(m))
    heads = text.num_attention_heads
    lora = _lora_counts(meta, lora_targets, lora_rank) if lora_rank else {}
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    name = str(model) if isinstance(model, (str, os.PathLike)) else getattr(config, "_name_or_path", "")
    return ModelShape(
        name=name or config.model_type,
        model_type=config.model_type,
        num_layers=text.num_hidden_layers,
        hidden=text.hidden_size,
        intermediate=getattr(text, "intermediate_size", None) or 4 * text.hidden_size,
        vocab=text.vocab_size,
        num_heads=heads,
        num_kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        num_params=sum(p.numel() for p in params),
        decoder_linear_params=linear,
        largest_param=max((p.numel() for p in params), default=0),
        param_sizes=tuple(sorted(p.numel() for p in params)),
        **lora,
    )
