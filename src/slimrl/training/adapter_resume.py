"""Resuming a LoRA run whose checkpoint holds more than one adapter: the trained adapter is read back on every
supported transformers.

A PeftModel with a second adapter (TRL's frozen "ref" copy, which GRPO, RLOO, DPO and KTO add when given a PeftModel, as
`FastLanguageModel.get_peft_model` returns, and a reference is needed: GRPO with beta != 0, for one; slimrl PPO's
"value" adapter) saves its "default" adapter at the checkpoint's root and each other adapter in a folder of its own
name. transformers before 5.23 (`Trainer._load_from_checkpoint`) then loads only those folders: the trained "default"
adapter is left as the model was built, and the resumed run silently trains on from the initial weights. transformers
5.23 loads the root adapter too. slimrl loads it before transformers' `train` reads the checkpoint, the same call 5.23
makes (`load_adapter(folder, "default", is_trainable=...)`), and only where transformers does not.
"""

from __future__ import annotations

import os

ADAPTER_FILES = ("adapter_model.safetensors", "adapter_model.bin")  # peft's SAFETENSORS_WEIGHTS_NAME, WEIGHTS_NAME
ROOT_ADAPTER_LOADED_FROM = "5.23"  # the first transformers whose Trainer loads the root adapter beside the others


def transformers_loads_root_adapter() -> bool:
    """Whether the installed transformers' Trainer reads the root "default" adapter of a multi-adapter checkpoint."""
    import transformers
    from packaging.version import Version

    return Version(transformers.__version__).release >= Version(ROOT_ADAPTER_LOADED_FROM).release


def _has_adapter(folder: str) -> bool:
    return any(os.path.isfile(os.path.join(folder, name)) for name in ADAPTER_FILES)


def adapter_folders(checkpoint: str) -> list[str]:
    """The adapters saved in folders of their own (transformers' `adapter_subdirs`)."""
    return sorted(
        name
        for name in os.listdir(checkpoint)
        if os.path.isdir(os.path.join(checkpoint, name)) and _has_adapter(os.path.join(checkpoint, name))
    )


def load_root_adapter(model, checkpoint: str) -> bool:
    """Load the "default" adapter saved at `checkpoint`'s root into the PeftModel `model` when the checkpoint also
    holds adapters in folders (the case transformers < 5.23 skips); True when it was loaded."""
    peft_config = getattr(model, "peft_config", None)
    if not isinstance(peft_config, dict) or "default" not in peft_config or not hasattr(model, "load_adapter"):
        return False
    if not os.path.isdir(checkpoint) or not _has_adapter(checkpoint) or not adapter_folders(checkpoint):
        return False
    active = model.active_adapters[0]
    model.load_adapter(checkpoint, "default", is_trainable=active == "default")
    return True


def restore_root_adapter(model, checkpoint: str | None) -> bool:
    """Before `train(resume_from_checkpoint=checkpoint)`: the root adapter loaded where transformers would skip it."""
    if checkpoint is None or transformers_loads_root_adapter():
        return False
    return load_root_adapter(model, checkpoint)
