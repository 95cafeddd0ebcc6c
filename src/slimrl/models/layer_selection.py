"""Unsloth's `finetune_*_layers` / `finetune_*_modules` switches of FastModel.get_peft_model, as LoRA target_modules.

Follows unsloth_zoo's get_peft_regex: a Linear layer inside a decoder block is an attention module when a part of its
path is one of ATTENTION_TAGS, an MLP module when one is in MLP_TAGS ("mixer" counts as both); the candidates are the
given target_modules, or every Linear in the decoder blocks. Where Unsloth matches silently, slimrl says so:
- slimrl trains text-only models, whose layers are all language layers: `finetune_vision_layers=True` (or
  `finetune_audio_layers=True`) given explicitly has nothing to target, said in a notice; `finetune_language_layers=
  False` would leave nothing to train and raises (Unsloth falls back to training the language layers anyway).
- a switch combination that selects no Linear raises, naming the model's projections.
The result is a list of module names (leaf names where that is unambiguous, full names otherwise), so the adapter
config reads like FastLanguageModel's.
"""

from __future__ import annotations

from ..notices import notice
from .lora import decoder_layers, is_linear

ATTENTION_TAGS = ("self_attn", "attention", "attn", "mixer")
MLP_TAGS = ("mlp", "feed_forward", "ffn", "dense", "mixer")


def _block_linears(model) -> dict[str, str]:
    """Full name -> path inside its decoder block, for every Linear in the decoder blocks."""
    block_names = {id(layer) for layer in decoder_layers(model)}
    found = {}
    for block_name, block in model.named_modules():
        if id(block) not in block_names:
            continue
        for name, module in block.named_modules():
            if name and is_linear(module) and not name.endswith("lm_head"):
                found[f"{block_name}.{name}"] = name
    return found


def _check_switches(model, language, attention, mlp, **other_parts) -> None:
    arch = type(model).__name__
    if not (attention or mlp):
        raise ValueError(
            "get_peft_model: finetune_attention_modules and finetune_mlp_modules are both False: no modules to train."
        )
    for part, value in other_parts.items():
        if value is True:
            notice(
                f"get_peft_model: finetune_{part}_layers=True, but {arch} is a text-only model with no {part} "
                "layers; LoRA goes on its language layers only."
            )
    if not language:
        raise ValueError(
            f"get_peft_model: finetune_language_layers=False, but {arch} is a text-only model: its language layers "
            "are all it has to train. Leave finetune_language_layers=True."
        )


def select_target_modules(model, target_modules, *, vision, language, attention, mlp, audio=None):
    """target_modules for peft given Unsloth's switches (None/True = on, as Unsloth's defaults for text models)."""
    _check_switches(model, language, attention, mlp, vision=vision, audio=audio)
    if attention and mlp:
        return target_modules  # every switch on: FastLanguageModel's own choice (slimrl's default or the given list)
    if isinstance(target_modules, str):
        raise ValueError(
            "get_peft_model: a target_modules regex cannot be combined with finetune_attention_modules/"
            "finetune_mlp_modules=False; pass a list of module names."
        )
    tags = ATTENTION_TAGS if attention else MLP_TAGS
    linears = _block_linears(model)
    wanted = set(target_modules) if target_modules is not None else None
    chosen = {
        full: inner
        for full, inner in linears.items()
        if (wanted is None or inner.rsplit(".", 1)[-1] in wanted or inner in wanted)
        and any(part in tags for part in inner.split(".")[:-1])
    }
    if not chosen:
        kinds = "attention" if attention else "MLP"
        raise ValueError(
            f"get_peft_model: no {kinds} Linear layer of {type(model).__name__} matches (a path part in {tags}); its "
            f"decoder blocks hold {sorted(set(linears.values()))}. Pass target_modules explicitly."
        )
    return _names(chosen, linears)


def _names(chosen: dict[str, str], linears: dict[str, str]) -> list[str]:
    """Leaf names where every Linear with that leaf is chosen, full names for the rest."""
    leaves = {}
    for full, inner in linears.items():
        leaves.setdefault(inner.rsplit(".", 1)[-1], []).append(full)
    names = set()
    for leaf, fulls in leaves.items():
        picked = [f for f in fulls if f in chosen]
        names.update([leaf] if picked and len(picked) == len(fulls) else picked)
    return sorted(names)
