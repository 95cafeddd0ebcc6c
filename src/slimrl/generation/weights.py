"""What the vLLM engine receives from the training model: checkpoint-named weights, merged LoRA, adapter folders.

- Names: vLLM's `load_weights` takes checkpoint names ("model.layers.0.self_attn.q_proj.weight"), so PEFT's wrappers
  come off ("base_model.model.", ".base_layer", "modules_to_save.<adapter>.").
- Merged LoRA is computed next to the training weights (W + ΔW in a new tensor), never by merge_adapter() /
  unmerge_adapter() on the model: an in-place merge and unmerge rounds the base weights, so training would drift
  from what stock TRL computes.
- Which weights go: all of them (see engine_weights): a partial push of a packed q/k/v tensor left its other
  shards as garbage in a test on this machine.
- A bitsandbytes 4-bit base weight (`Params4bit`, packed bytes) is dequantized before ΔW is added: packed bytes plus
  a delta would be garbage (slimrl.export merges 4-bit bases through this function too).
- The state key says when the engine is stale: a checksum of the trainable weights (cheap for LoRA: a few MB),
  plus which adapter is active, so `fast_generate` after an optimizer step, a `load_state_dict`, or an adapter
  switch re-syncs, and two calls with nothing changed do not.
- A saved adapter asked for by a `LoRARequest` on an engine that takes merged weights (requested_adapter): PEFT's
  own `load_adapter` puts it next to the model's adapter, frozen and inactive, under a name of its own; its ΔW is
  merged like the live adapter's, then PEFT's `delete_adapter` removes it. The model's own adapter, its trainable
  parameters and which adapter is active are left as they were.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
import weakref

import torch

_PEFT_PREFIX = "base_model.model."
_request_names = itertools.count(1)


def lora_layers(model) -> dict:
    """{module name: peft LoraLayer} for every LoRA-wrapped module. Found by type, so the PeftModel and the
    transformers model inside it (where peft injects the layers) give the same answer."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:
        return {}
    return {name: module for name, module in model.named_modules() if isinstance(module, LoraLayer)}


def has_lora(model) -> bool:
    return bool(lora_layers(model))


def checkpoint_name(name: str) -> str:
    """A (PEFT-wrapped) module or parameter name as the checkpoint spells it."""
    name = name.removeprefix(_PEFT_PREFIX).replace(".base_layer", "")
    if ".modules_to_save." in name:
        head, _, tail = name.partition(".modules_to_save.")
        name = f"{head}.{tail.partition('.')[2]}"
    return name


def adapters_disabled(model) -> bool:
    """True inside `model.disable_adapter()` (peft flips `disable_adapters` on every LoRA layer)."""
    return any(getattr(layer, "disable_adapters", False) for layer in lora_layers(model).values())


def active_adapters(model) -> tuple[str, ...]:
    for layer in lora_layers(model).values():
        return tuple(layer.active_adapters)
    return ()


@torch.no_grad()
def state_key(model, use_adapter: bool) -> tuple:
    """Changes whenever the weights generation should use change (see the module docstring)."""
    lora = has_lora(model)
    if lora and not use_adapter:
        return ("base",)
    sums = []
    for _, p in model.named_parameters():
        if p.requires_grad:
            d = p.detach().double()
            sums += [d.sum().item(), d.square().sum().item()]
    return ("adapter" if lora else "full", active_adapters(model), tuple(sums))


def dense_weight(param) -> torch.Tensor:
    """The parameter's values as a dense tensor: a bitsandbytes `Params4bit` dequantized, anything else as is."""
    quant_state = getattr(param, "quant_state", None)
    if type(param).__name__ == "Params4bit" and quant_state is not None:
        from bitsandbytes.functional import dequantize_4bit

        return dequantize_4bit(param.data, quant_state)
    return param.detach()


def dense_numel(param) -> int:
    """How many values the parameter holds once dense (a 4-bit `Params4bit` stores two per byte)."""
    quant_state = getattr(param, "quant_state", None)
    if type(param).__name__ == "Params4bit" and quant_state is not None:
        return int(torch.Size(quant_state.shape).numel())
    return param.numel()


@torch.no_grad()
def engine_weights(model, dtype: torch.dtype, use_adapter: bool = True, adapters: tuple[str, ...] | None = None):
    """Yield (checkpoint name, tensor) for every weight of the model, the active LoRA merged in unless
    `use_adapter=False` (or the named `adapters` instead of the active ones). The whole set goes each time: vLLM's
    in-place reload re-initialises packed tensors (q/k/v, gate/up) whole, and in-process the unchanged tensors cost
    a reference (a cast where the dtypes differ)."""
    layers = lora_layers(model)
    if adapters is None:
        adapters = active_adapters(model) if use_adapter else ()
    for name, p in model.named_parameters(remove_duplicate=True):
        if ".lora_" in name or ".original_module." in name:
            continue
        tensor = dense_weight(p)
        owner, _, leaf = name.rpartition(".")
        layer = layers.get(owner.removesuffix(".base_layer")) if owner.endswith(".base_layer") else None
        if layer is not None and leaf == "weight" and adapters and not getattr(layer, "merged", False):
            tensor = tensor.to(torch.promote_types(tensor.dtype, dtype))  # a float32 export adds in float32
            for adapter in adapters:
                if adapter in layer.lora_A or adapter in getattr(layer, "lora_embedding_A", {}):
                    tensor = tensor + layer.get_delta_weight(adapter).to(tensor.dtype)
        yield checkpoint_name(name), tensor.to(dtype)


def check_mergeable(model) -> None:
    """DoRA's magnitude vector is not part of get_delta_weight, and vLLM has no DoRA: refuse rather than drift."""
    for layer in lora_layers(model).values():
        if any(getattr(layer, "use_dora", {}).values()):
            raise NotImplementedError(
                "fast_inference=True with use_dora=True: vLLM has no DoRA, and a merged DoRA "
                "would not match training. Use fast_inference=False or plain LoRA."
            )


def _request_config(path: str):
    """The saved adapter's PEFT config, checked for what a merged hand-over can serve."""
    from peft import PeftConfig, PeftType

    if not os.path.isfile(os.path.join(path, "adapter_config.json")):
        raise FileNotFoundError(f"lora_request: {path} holds no adapter (adapter_config.json missing).")
    config = PeftConfig.from_pretrained(path)
    if config.peft_type != PeftType.LORA:
        raise NotImplementedError(f"lora_request: {path} holds a {config.peft_type} adapter; only LoRA is served.")
    if getattr(config, "use_dora", False):
        raise NotImplementedError(f"lora_request: {path} holds a DoRA adapter; vLLM has no DoRA.")
    if getattr(config, "modules_to_save", None):
        raise NotImplementedError(
            f"lora_request: {path} also saves whole modules ({config.modules_to_save}); fast_generate serves "
            "LoRA-only adapters."
        )
    return config


@contextlib.contextmanager
def requested_adapter(peft_model, path: str):
    """The adapter saved at `path`, loaded next to the model's own (frozen, inactive) while the block runs; yields
    its adapter name for `engine_weights(..., adapters=(name,))` and removes it afterwards (module docstring)."""
    _request_config(path)
    name = f"slimrl_request_{next(_request_names)}"
    modes = {module: module.training for module in peft_model.modules()}  # PEFT's load_adapter calls eval()
    peft_model.load_adapter(path, adapter_name=name, is_trainable=False)
    try:
        yield name
    finally:
        peft_model.delete_adapter(name)
        for module, training in modes.items():
            module.training = training


class AdapterFolders:
    """Adapters saved for vLLM's LoRA path in a RAM-backed folder (/dev/shm where it exists), one per update.

    vLLM 0.32's LoRARequest only takes a path; /dev/shm keeps the write in memory. Only the newest folder is kept.
    The folder is removed by `cleanup()` (the engine's `close()`), else when this object is garbage-collected or, at
    the latest, when the interpreter exits (a `weakref.finalize`): RAM in /dev/shm outlives the process otherwise.
    """

    def __init__(self):
        root = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self.root = tempfile.mkdtemp(prefix="slimrl-lora-", dir=root)
        self.current = None
        self._remove = weakref.finalize(self, shutil.rmtree, self.root, ignore_errors=True)

    def save(self, peft_model, adapter_id: int) -> str:
        path = os.path.join(self.root, f"update-{adapter_id}")
        adapter = active_adapters(peft_model)[0]
        peft_model.save_pretrained(path, selected_adapters=[adapter], safe_serialization=True)
        saved = os.path.join(path, adapter) if adapter != "default" else path
        if self.current is not None:
            shutil.rmtree(self.current, ignore_errors=True)
        self.current = path
        return saved

    def cleanup(self) -> None:
        self._remove()  # runs once: later calls, and the finalizer at exit, do nothing
