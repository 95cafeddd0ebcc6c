"""`slimrl.describe(obj)`: what slimrl has changed on a model, a trainer, a config or a tokenizer, in one list.

Two kinds of change reach an object slimrl does not own: the registry's class-level patches (slimrl.patches.registry:
methods of TRL's classes, reversed by `unpatch()`) and the instance-level changes recorded by slimrl.swaps (methods
swapped on this object, attributes added, config fields written). A PeftModel is described with the transformers
model under it, where FastLanguageModel's changes live (the swaps on its submodules counted per kind: "forward on 14
submodules"); a trainer with its config and models. The functions of Python modules slimrl swapped (Liger-Kernel's
RoPE dispatcher, process-wide) and the module-level values slimrl has set at run time (slimrl.swaps.run_values: the
import hook, a bound trainer config, ...) come last.

`counters` says what the memory levers did, read from the slimrl state (slimrl.state) of the object described: on a
trainer, `row_groups`, `padding_free` and `shared_prefix` (its TrainerState) and `tiled_mlp` and `activation_offload`
(its model's ModelState); on a model, the last two. Each is a plain dict of the lever's counts, or None while the
lever has not run on that object; the dict is a copy, taken when `describe` was called.

`levers` says, for each long-context lever, whether it is on or off and why: on a GRPO/RLOO trainer row groups and
padding-free forwards as "auto" last decided them (slimrl.models.long_context, recorded by the patched trainer at
each forward) and the tiled MLP for the largest call its model has scored; on a model with the tiled MLP, that lever.
Each is a line such as "off (auto: off on CPU, a forward of 8 rows x 130 tokens = 1,040 below 4,096)".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields

from . import fields
from .state import model_state, trainer_state, transformers_model
from .swaps import run_values, swapped, swapped_modules


@dataclass
class Description:
    """What slimrl changed on one object: class-level patches and instance-level swaps, each name -> why."""

    name: str
    class_level: dict = field(default_factory=dict)
    instance_level: dict = field(default_factory=dict)
    parts: list = field(default_factory=list)  # Descriptions of the objects it holds (a trainer's config, models)
    counters: dict = field(default_factory=dict)  # lever name -> its counts (a plain dict) or None (module docstring)
    levers: dict = field(default_factory=dict)  # long-context lever -> "on (why)" / "off (why)" (module docstring)

    def __str__(self) -> str:
        lines = [f"{self.name}:"]
        lines += [f"  class    {name}: {why}" for name, why in self.class_level.items()]
        lines += [f"  instance {name}: {why}" for name, why in self.instance_level.items()]
        lines += [f"  counter  {name}: {values}" for name, values in self.counters.items() if values is not None]
        lines += [f"  lever    {name}: {why}" for name, why in self.levers.items()]
        if len(lines) == 1:
            lines.append("  nothing changed by slimrl")
        return "\n".join(lines + [str(part) for part in self.parts])


def _submodule_swaps(model) -> dict:
    """ "<name> on N submodules" -> why, for the swaps recorded on a model's submodules (LoRA layers, MLPs)."""
    counts: dict = {}
    for path, module in model.named_modules() if hasattr(model, "named_modules") else ():
        for name, why in swapped(module).items() if path else ():
            counts[name, why] = counts.get((name, why), 0) + 1
    return {f"{name} on {count} submodule{'s' * (count > 1)}": why for (name, why), count in counts.items()}


def _snapshot(stats) -> dict | None:
    """A lever's counter object as a plain dict (a Counter as a dict, a list of swapped modules as its length)."""
    if stats is None:
        return None
    values = {f.name: getattr(stats, f.name) for f in dataclass_fields(stats)}
    return {k: len(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v for k, v in values.items()}


def _model_counters(model) -> dict:
    if not hasattr(model, "named_modules"):  # a config, a tokenizer: no lever runs on it
        return {}
    state = model_state(model, create=False)
    tiled, offload = (None, None) if state is None else (state.tiled_mlp, state.offload_stats)
    return {"tiled_mlp": _snapshot(tiled), "activation_offload": _snapshot(offload)}


def _trainer_counters(trainer) -> dict:
    state = trainer_state(trainer, create=False)
    names = {
        "row_groups": "row_group_stats",
        "padding_free": "padding_free_stats",
        "shared_prefix": "shared_prefix_stats",
    }
    counters = {name: _snapshot(None if state is None else getattr(state, key)) for name, key in names.items()}
    return counters | _model_counters(getattr(trainer, "model", None))


def _tiled_lever(model) -> dict:
    from .models import long_context
    from .models.tiled_mlp import tiled_mlp_state

    state = tiled_mlp_state(model) if hasattr(model, "named_modules") else None
    if state is None:
        return {}
    if not state.largest_call:
        return {"tiled_mlp": str(long_context.before_a_forward(fields.TILED_MLP, state.setting))}
    choice = long_context.tiled_mlp_choice(
        state.setting, state.hidden, state.intermediate, state.largest_call, state.activation_bytes
    )
    return {"tiled_mlp": str(choice)}


def _trainer_levers(trainer) -> dict:
    """Each long-context lever of a GRPO/RLOO trainer: on or off and why, as last decided (models/long_context.py)."""
    from .models import long_context

    args = trainer.args
    if not hasattr(args, fields.ROWS_PER_GROUP):
        return {}
    state = trainer_state(trainer, create=False)
    chosen = (None if state is None else state.lever_choices) or {}
    levers = {
        lever: str(chosen.get(lever) or long_context.before_a_forward(name, getattr(args, name)))
        for lever, name in (("row_groups", fields.ROWS_PER_GROUP), ("padding_free", fields.PADDING_FREE))
    }
    tiled = _tiled_lever(getattr(trainer, "model", None))
    unscored = long_context.before_a_forward(fields.TILED_MLP, getattr(args, fields.TILED_MLP))
    return levers | (tiled or {"tiled_mlp": str(unscored)})


def _one(obj, label: str) -> Description:
    from .patches.registry import class_patches

    instance = dict(swapped(obj))
    inner = transformers_model(obj)
    if inner is not obj:
        instance.update({f"{type(inner).__name__}.{k}": why for k, why in swapped(inner).items()})
    instance.update(_submodule_swaps(inner))
    return Description(f"{label} ({type(obj).__name__})", class_patches(obj), instance)


def describe(obj) -> Description:
    """What slimrl changed on `obj`; `print(slimrl.describe(trainer))` lists it, the trainer's config and models too."""
    description = _one(obj, "object")
    is_trainer = hasattr(obj, "accelerator") and hasattr(obj, "args")
    description.counters = _trainer_counters(obj) if is_trainer else _model_counters(obj)
    description.levers = _trainer_levers(obj) if is_trainer else _tiled_lever(obj)
    if is_trainer:
        for attribute in ("args", "model", "ref_model", "processing_class"):
            if getattr(obj, attribute, None) is not None:
                description.parts.append(_one(getattr(obj, attribute), attribute))
    modules = swapped_modules()
    if modules:
        description.parts.append(Description("module-level functions (slimrl.swaps)", instance_level=modules))
    values = run_values(changed_only=True)
    if values:
        instance = {name: f"{why}: {value!r}" for name, (why, value) in values.items()}
        description.parts.append(Description("run-time values (slimrl.swaps)", instance_level=instance))
    return description
