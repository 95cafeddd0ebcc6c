"""Export: Unsloth's save/push methods on the models FastLanguageModel returns (merged weights, GGUF, the Hub).

    model.save_pretrained_merged(dir, tokenizer, save_method="merged_16bit" | "merged_4bit" | "lora")
    model.push_to_hub_merged(repo_id, tokenizer, save_method=..., token=...)
    model.save_pretrained_gguf(dir, tokenizer, quantization_method="f16" | "bf16" | "q8_0" | ...)
    model.push_to_hub_gguf(repo_id, tokenizer, quantization_method=..., token=...)
    model.save_lora(dir);  model.load_lora(dir)  -> a vLLM LoRARequest for model.fast_generate

Choices:
- The methods are instance attributes (`ExportMethod` objects) set by FastLanguageModel.from_pretrained on the
  transformers model and by get_peft_model on the PeftModel: no subclass of peft or transformers, nothing patched on
  their classes. `detach_export_methods(model)` removes them. An `ExportMethod` holds the function and the model:
  `copy.deepcopy` re-binds it to the copy (TRL's reference models are deep copies), and it pickles by reference to
  the function (a bound method in an instance dict would not unpickle). A name the model's class already defines
  is never shadowed: attaching raises, naming the class.
- A PeftModel made by plain `peft.get_peft_model` still reaches the methods through peft's attribute forwarding to
  the transformers model; they work there too (the LoRA layers are found by type).
- The bodies live in methods.py (arguments as Unsloth names them), merged.py, gguf_writer.py/gguf_vocab.py and
  hub.py; `slimrl export` (slimrl.cli.export) is the command-line side.
"""

from __future__ import annotations

import inspect

from ..swaps import restore, swap

METHOD_NAMES = (
    "save_pretrained_merged",
    "push_to_hub_merged",
    "save_pretrained_gguf",
    "push_to_hub_gguf",
    "save_lora",
    "load_lora",
)


class ExportMethod:
    """`function` bound to `owner` as an instance attribute (see the module docstring)."""

    def __init__(self, function, owner):
        self.__func__ = function
        self.__self__ = owner
        self.__name__ = function.__name__
        self.__qualname__ = function.__qualname__
        self.__doc__ = function.__doc__
        parameters = list(inspect.signature(function).parameters.values())[1:]
        self.__signature__ = inspect.Signature(parameters)

    def __call__(self, *args, **kwargs):
        return self.__func__(self.__self__, *args, **kwargs)

    def __reduce__(self):
        return ExportMethod, (self.__func__, self.__self__)

    def __repr__(self) -> str:
        return f"<slimrl export method {self.__name__} of {type(self.__self__).__name__}>"


def attach_export_methods(model):
    """Set the export methods on `model` (idempotent); returns `model`."""
    from . import methods

    for name in METHOD_NAMES:
        if hasattr(type(model), name):
            raise RuntimeError(
                f"{type(model).__module__}.{type(model).__name__} now defines `{name}` itself; slimrl "
                f"will not shadow it with slimrl.export.methods.{name}. Call the slimrl function "
                "directly, or pin the library version slimrl was tested with."
            )
        if not isinstance(vars(model).get(name), ExportMethod):
            swap(model, name, ExportMethod(getattr(methods, name), model), "export method (slimrl.export.methods)")
    return model


def detach_export_methods(model):
    """Remove the export methods `attach_export_methods` set; returns `model`."""
    for name in METHOD_NAMES:
        if isinstance(vars(model).get(name), ExportMethod):
            restore(model, name)
    return model
