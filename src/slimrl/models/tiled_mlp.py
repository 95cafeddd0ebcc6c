"""The tiled-MLP swap on a model's decoder MLPs (slimrl.ops.tiled_mlp), its setting and when "auto" tiles.

`tile_mlp(model, setting)` replaces the `forward` of every tileable MLP module of `model` (an instance attribute, as
TRL's fused head is installed) by one that runs slimrl.ops.tiled_mlp when a call holds enough tokens, and records the
swap in the model's slimrl.state.ModelState (`tiled_mlp`); `untile_mlp(model)` removes it. Idempotent; a PeftModel
reaches the transformers model under it. The patched GRPO/RLOO trainers apply the config field `slimrl_tiled_mlp` to
the models their log-prob forwards run (patches/scoring/row_groups.py).

Choices, and why:
1. Setting: "auto" (default) | True | False | a positive int. True tiles every call longer than one shard, in shards
   of `hidden_size` tokens (DeepSpeed's rule: a shard's `[n, intermediate]` tensor is then the size of one MLP
   weight); an int n tiles every call longer than n tokens, in shards of n; False is the untouched MLP.
2. "auto" tiles, in shards of `hidden_size` tokens, the calls whose MLP tensors would be large: at least
   `auto_threshold_tokens` = AUTO_TILE_BYTES / (MLP_TRANSIENT_TENSORS x intermediate x bytes per activation) tokens
   (gate, up, activation and product: four `[N, intermediate]` tensors live at once in the forward, as many again as
   gradients in the backward). Why a threshold: with grad, tiling costs one more MLP forward per layer (the shards
   are recomputed in the backward), about a fifth of a checkpointed step's work by arithmetic on Qwen2.5-7B's shapes
   at 8K tokens (docs/long-context.md); it pays when that transient is the step's largest term, i.e. for long rows.
   Qwen2.5-7B in bf16 tiles from 28K tokens a call, SmolLM2-135M in fp32 from 175K. Without grad (old-policy and
   reference passes) tiling costs nothing, and the same threshold applies. "auto" does not tile while dropout is
   active inside the MLP (LoRA dropout): shards draw their masks in another order than one call, other draws of the
   same distribution (True and an int tile anyway; the backward replays the forward's draws either way).
3. Tileable modules: the `mlp` child of each decoder layer that has a `down_proj` and no `experts` (the dense gated
   MLPs of the Llama, Mistral, Qwen, Gemma and Phi-3 families: each token is mapped on its own, so any split of the
   tokens gives the same values). MoE blocks and modules whose `forward` was already replaced are left alone.
4. Parameters sharded by DeepSpeed ZeRO-3 or FSDP2: not verified with the tiled backward, so "auto" leaves those
   MLPs untiled and an explicit setting raises, naming the choice.
5. While generating (`modes.generating()`: the patched trainers' rollouts, slimrl's `model.generate`) the swap passes
   straight to the class's forward, whatever the setting: a decoding forward holds one new token per row, and the
   prompt's prefill runs as transformers runs it in stock TRL. The signal is that flag, not grad or the call's size:
   TRL's old-policy and reference passes are no-grad scoring forwards of whole rows and keep the setting.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

import torch

from .. import fields, swaps
from ..state import model_state, transformers_model
from .modes import is_generating

AUTO = "auto"
TILED_MLP_FIELD = fields.TILED_MLP  # the GRPO/RLOO config field the patched trainers pass to tile_mlp
TILED_MLP_DEFAULT = fields.default(TILED_MLP_FIELD)
AUTO_TILE_BYTES = 4 * 1024**3
MLP_TRANSIENT_TENSORS = 4
TILED = "tiled MLP (tile_mlp)"  # the why its swap records (swaps.wears finds it)


def validate_tiled_mlp(value):
    """The one validator of `slimrl_tiled_mlp`: "auto" | True | False | a positive int (shard tokens)."""
    if value is True or value is False or value == AUTO:
        return value
    if isinstance(value, int) and value >= 1:
        return value
    raise ValueError(f"{TILED_MLP_FIELD} must be 'auto', True, False or a positive number of tokens, got {value!r}.")


def auto_threshold_tokens(intermediate: int, activation_bytes: int) -> int:
    """Tokens from which "auto" tiles a call (choice 2)."""
    return max(1, AUTO_TILE_BYTES // (MLP_TRANSIENT_TENSORS * intermediate * activation_bytes))


@dataclass
class TiledMLPState:
    """The swap on one model: its setting, the model's widths, the swapped modules and what the calls did."""

    setting: bool | str | int
    hidden: int
    intermediate: int
    modules: list = field(default_factory=list)
    tiled_calls: int = 0  # calls run as slimrl.ops.tiled_mlp with grad (shards recomputed in the backward)
    sharded_calls: int = 0  # calls run shard by shard without grad
    largest_call: int = 0  # tokens of the largest scoring call (not while generating), for describe()'s reason
    activation_bytes: int = 0  # bytes per activation of that call

    def shard_tokens(self, tokens: int, activation_bytes: int) -> int | None:
        """Shard size for a call of `tokens` tokens, or None to run it untiled."""
        if self.setting is False:
            return None
        if self.setting is True:
            return self.hidden if tokens > self.hidden else None
        if self.setting == AUTO:
            threshold = max(self.hidden + 1, auto_threshold_tokens(self.intermediate, activation_bytes))
            return self.hidden if tokens >= threshold else None
        return self.setting if tokens > self.setting else None


def tileable_mlps(model) -> list:
    """(name, module) of the tileable MLPs (choice 3)."""
    found = []
    for name, module in transformers_model(model).named_modules():
        if name.rsplit(".", 1)[-1] != "mlp" or not hasattr(module, "down_proj") or hasattr(module, "experts"):
            continue
        current = module.__dict__.get("forward")
        if current is None or swaps.wears(module, "forward", TILED):
            found.append((name, module))
    return found


def _has_active_dropout(module) -> bool:
    return module.training and any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in module.modules())


def _has_sharded_parameters(module) -> bool:
    """Parameters DeepSpeed ZeRO-3 partitions or FSDP2 shards: the tiled backward is not verified with them."""
    from torch.distributed.tensor import DTensor

    return any(hasattr(p, "ds_id") or isinstance(p, DTensor) for p in module.parameters())


def _tiled_forward(state: TiledMLPState):
    from ..ops.tiled_mlp import tiled_mlp

    def forward(self, x, *args, **kwargs):
        original = type(self).forward
        if is_generating():
            return original(self, x, *args, **kwargs)
        tokens = x.shape[:-1].numel()
        if tokens > state.largest_call:
            state.largest_call, state.activation_bytes = tokens, x.element_size()
        shard = None if args or kwargs else state.shard_tokens(tokens, x.element_size())
        if shard is not None and state.setting == AUTO and _has_active_dropout(self):
            shard = None
        if shard is not None and _has_sharded_parameters(self):
            if state.setting != AUTO:
                raise ValueError(
                    f"{TILED_MLP_FIELD}={state.setting!r}: the tiled MLP is not verified with parameters sharded by "
                    f"DeepSpeed ZeRO-3 or FSDP2; use {TILED_MLP_FIELD}='auto' (it leaves them untiled) or False."
                )
            shard = None
        if shard is None:
            return original(self, x, *args, **kwargs)
        params = [p for p in self.parameters() if p.requires_grad]
        if torch.is_grad_enabled() and (x.requires_grad or params):
            state.tiled_calls += 1
        else:
            state.sharded_calls += 1
        return tiled_mlp(lambda t: original(self, t), x, params, shard)

    return forward


def tiled_mlp_state(model) -> TiledMLPState | None:
    state = model_state(model, create=False)
    return None if state is None else state.tiled_mlp


def untile_mlp(model):
    """Remove the swap (the modules' class forward again); returns `model`."""
    state = model_state(model, create=False)
    if state is None or state.tiled_mlp is None:
        return model
    for module in state.tiled_mlp.modules:
        if swaps.wears(module, "forward", TILED):
            swaps.restore(module, "forward")
    state.tiled_mlp = None
    return model


def tile_mlp(model, setting=AUTO):
    """Swap the forward of `model`'s tileable MLPs for the tiled one under `setting` (False: remove); returns
    `model`. Calling it again with another setting only changes the setting."""
    if validate_tiled_mlp(setting) is False:
        return untile_mlp(model)
    state = model_state(model)
    if state.tiled_mlp is not None:
        state.tiled_mlp.setting = setting
        return model
    config = transformers_model(model).config.get_text_config()
    hidden = config.hidden_size
    tiled = TiledMLPState(setting, hidden, getattr(config, "intermediate_size", None) or 4 * hidden)
    for _, module in tileable_mlps(model):
        swaps.swap(module, "forward", types.MethodType(_tiled_forward(tiled), module), TILED)
        tiled.modules.append(module)
    state.tiled_mlp = tiled
    return model
