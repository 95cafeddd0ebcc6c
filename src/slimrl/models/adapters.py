"""Adapters that travel: the base model an adapter names, and loading an adapter folder by its path.

Choices:
- The model's state (slimrl.state.ModelState.model_name) records what the user asked `from_pretrained` for: a Hub id
  or folder as given, the embedded model's short name ("smollm2-135m"), or a `.gguf` file as an absolute path (a
  relative one would only resolve from the directory it was typed in). `model.config._name_or_path` is left alone:
  for the embedded model it is slimrl's cache folder, which TRL reloads full fine-tuning references from.
- The adapter's `base_model_name_or_path` is set once, on the PEFT config, when get_peft_model wraps the model.
  Every way an adapter is written (`trainer.save_model`, `model.save_pretrained`, `save_lora`, TRL checkpoints,
  `push_to_hub`) serialises that config, so one assignment covers them all; peft only fills the field when empty.
- At every save, peft looks for `<base>/config.json` locally, then on the Hub, to see whether the vocabulary was
  resized; for "smollm2-135m" or a `.gguf` path it finds none, warns twice and assumes the vocabulary unchanged,
  which is right (slimrl never resizes it). Those two warnings, for that name only, are filtered (registered once
  in Python's warnings filters); peft's Hub lookup itself still runs where the network is up (HF_HUB_OFFLINE=1
  skips it).
- peft's model card (README.md beside the adapter) names `model.config._name_or_path` as `base_model`; the
  adapter's card names the Hub id instead (the embedded model's, or the Hub id given) or no base_model for a local
  folder, so `push_to_hub` never publishes a path of the machine it was trained on.
- `FastLanguageModel.from_pretrained(adapter_folder)` (as in Unsloth) reads the base the adapter names
  (`adapter_base_name`), loads it through slimrl's loader (so "smollm2-135m" and `.gguf` bases resolve) and puts the
  adapter on it (`put_adapter_on`), trainable, so training can go on; the tokenizer is the base's.
"""

from __future__ import annotations

import functools
import json
import os
import re
import warnings

from ..state import model_state, set_peft_owner
from . import embedded
from .embedded import hub_base_model

ADAPTER_CONFIG = "adapter_config.json"


def requested_model_name(model_name) -> str:
    """The name an adapter should record for the base `model_name` given to from_pretrained."""
    name = os.fspath(model_name)
    if name.lower().endswith(".gguf") and os.path.isfile(name):
        return os.path.abspath(name)
    return name


def set_base_model_name(peft_model, model) -> None:
    """Point every adapter config of `peft_model` at the model the user asked for (when slimrl loaded it)."""
    state = model_state(model, create=False)
    name = None if state is None else state.model_name
    if name is None:
        return
    for config in getattr(peft_model, "peft_config", {}).values():
        config.base_model_name_or_path = name
    if hasattr(peft_model, "create_or_update_model_card") and "create_or_update_model_card" not in vars(peft_model):
        from ..swaps import swap

        method = functools.partial(_card_naming_requested_base, peft_model)  # deepcopies and pickles with the model
        swap(peft_model, "create_or_update_model_card", method, "the card's base_model: a Hub id, not a local path")
    if embedded.is_embedded_name(name) or name.lower().endswith(".gguf"):
        _quiet_peft_vocabulary_check(name)


def _card_naming_requested_base(self, output_dir: str) -> None:
    """peft's model card (README.md), its `base_model` the adapter's base as a Hub id (embedded.py's
    hub_base_model: the embedded model's Hub id, a Hub id as given) or left out (a local folder or file), never
    `model.config._name_or_path`, which for the embedded model is slimrl's cache folder on this machine."""
    type(self).create_or_update_model_card(self, output_dir)
    names = {c.base_model_name_or_path for c in self.peft_config.values()}
    card_base_model(os.path.join(output_dir, "README.md"), names.pop() if len(names) == 1 else None)


def card_base_model(card_path: str, name: str | None) -> None:
    """Set the `base_model` of the model card at `card_path` to `name`'s Hub id, or remove it when there is none."""
    from huggingface_hub import ModelCard

    if not os.path.isfile(card_path):
        return
    card = ModelCard.load(card_path)
    base, old = hub_base_model(name), card.data.get("base_model")
    if old == base:
        return
    if base is None:
        card.data.pop("base_model", None)
    else:
        card.data["base_model"] = base
    if old and card.data.get("tags"):  # peft also tags the card "base_model:adapter:<its base_model>"
        tags = [t[: -len(old)] + base if base and t.endswith(":" + old) else t for t in card.data["tags"]]
        card.data["tags"] = [t for t in tags if not t.endswith(":" + old)]
    card.save(card_path)


def _quiet_peft_vocabulary_check(name: str) -> None:
    """Filter peft's two save-time warnings about finding no config.json for `name` (see the module docstring)."""
    pattern = (
        rf"(Unable to fetch remote file .* config\.json in {re.escape(name)}\.|Could not find a config file in "
        rf"{re.escape(name)} - )"
    )
    if not any(f[1] is not None and f[1].pattern == pattern for f in warnings.filters):
        warnings.filterwarnings("ignore", message=pattern, category=UserWarning)


def is_adapter_folder(model_name) -> bool:
    """A local folder holding a PEFT adapter and no full model (config.json absent)."""
    path = os.fspath(model_name)
    return (
        os.path.isdir(path)
        and os.path.isfile(os.path.join(path, ADAPTER_CONFIG))
        and not os.path.isfile(os.path.join(path, "config.json"))
    )


def adapter_base_name(folder: str) -> str:
    """The base model the adapter in `folder` was trained on (its adapter_config.json's base_model_name_or_path)."""
    with open(os.path.join(folder, ADAPTER_CONFIG)) as f:
        name = json.load(f).get("base_model_name_or_path")
    if not name:
        raise ValueError(
            f"{folder}/{ADAPTER_CONFIG} names no base model (base_model_name_or_path is empty); load the "
            "base with FastLanguageModel.from_pretrained(base) and the adapter with "
            "peft.PeftModel.from_pretrained(model, folder)."
        )
    if not embedded.is_embedded_name(name) and os.path.isabs(name) and not os.path.exists(name):
        raise FileNotFoundError(
            f"The adapter in {folder} was trained on {name}, which is not on this machine; pass "
            "the base yourself: PeftModel.from_pretrained(FastLanguageModel.from_pretrained(base)"
            "[0], folder)."
        )
    return name


def put_adapter_on(model, folder: str):
    """The PeftModel of the adapter in `folder` on `model` (its base, already loaded), trainable."""
    from peft import PeftModel

    peft_model = PeftModel.from_pretrained(model, folder, is_trainable=True)
    set_peft_owner(model, peft_model)
    if getattr(model, "vllm_engine", None) is not None:
        model.vllm_engine.check_rank(peft_model)
    return peft_model
