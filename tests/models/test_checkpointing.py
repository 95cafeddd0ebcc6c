"""Checkpointing modes: correct LoRA gradients in each mode, and the mode survives Trainer/TRL toggling."""

import copy
import functools

import pytest
import torch

from slimrl.models import checkpointing
from slimrl.models.checkpointing import offloaded_checkpoint
from slimrl.state import model_state

from _models_helpers import batch, lora_grads, trainer_enables_checkpointing

MODES = [False, True, "offload"]


def layer_funcs(model):
    base = checkpointing.base_transformers_model(model)
    return [
        (m.gradient_checkpointing, getattr(m._gradient_checkpointing_func, "func", None)) for m in base.model.layers
    ]


def expect_mode(model, mode):
    funcs = layer_funcs(model)
    if mode is False:
        assert all(on is False for on, _ in funcs)
    else:
        expected = offloaded_checkpoint if mode == "offload" else torch.utils.checkpoint.checkpoint
        assert funcs and all(on is True and func is expected for on, func in funcs), funcs


@pytest.mark.parametrize("mode", MODES)
def test_every_lora_parameter_gets_a_gradient(tiny_peft, mode):
    model = tiny_peft(mode).train()
    grads = lora_grads(model, batch())
    assert len(grads) == 2 * 2 * 7  # A and B, 2 layers, 7 projections
    zero = [n for n, g in grads.items() if not torch.any(g != 0)]
    assert not zero, zero


def test_gradients_equal_across_modes(tiny_peft):
    grads = {mode: lora_grads(tiny_peft(mode).train(), batch()) for mode in MODES}
    for mode in (True, "offload"):
        for name, g in grads[False].items():
            torch.testing.assert_close(grads[mode][name], g, atol=1e-6, rtol=0)


def test_mode_recorded_and_readable_through_peft(tiny_peft):
    for mode, alias in ((True, True), ("offload", "offload"), ("offload", "unsloth"), (False, False)):
        model = tiny_peft(alias)
        assert model_state(model).checkpointing == mode
        assert checkpointing.checkpointing_mode(model) == mode
        expect_mode(model, mode)
    with pytest.raises(ValueError, match="use_gradient_checkpointing"):
        checkpointing.normalize_mode("sometimes")


@pytest.mark.parametrize("mode", [True, "offload"])
def test_mode_survives_trainer_style_enable_and_trl_toggles(tiny_peft, mode):
    from accelerate import Accelerator
    from trl.models.utils import disable_gradient_checkpointing, unwrap_model_for_generation

    model = tiny_peft(mode)
    trainer_enables_checkpointing(model)  # what Trainer.train does with the config's checkpointing flag on
    expect_mode(model, mode)
    with disable_gradient_checkpointing(model, {"use_reentrant": False}):
        expect_mode(model, False)
    expect_mode(model, mode)
    with unwrap_model_for_generation(model, Accelerator(cpu=True), gradient_checkpointing_kwargs=None) as unwrapped:
        expect_mode(unwrapped, False)
    expect_mode(model, mode)
    model.gradient_checkpointing_disable()
    model.gradient_checkpointing_enable({"use_reentrant": False})
    expect_mode(model, mode)
    # enables never stack input-grad hooks
    assert len(checkpointing.base_transformers_model(model)._require_grads_hooks) == 1


def test_mode_false_stays_off_when_trainer_enables(tiny_peft, caplog):
    model = tiny_peft(False)
    with caplog.at_level("WARNING", logger="slimrl"):
        trainer_enables_checkpointing(model)
    expect_mode(model, False)
    assert "use_gradient_checkpointing=False" in caplog.text


@pytest.mark.parametrize(
    "mode, pinned, after", [(False, True, False), ("offload", True, "offload"), ("offload", False, True)]
)
def test_real_trainer_train_keeps_the_mode(tiny_peft, tmp_path, mode, pinned, after):
    """`Trainer.train` enables checkpointing itself when the config's flag is on (by the installed transformers' own
    name); the model's mode stays. Negative control: without slimrl's pin the same train turns "offload" into plain
    checkpointing."""
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    from slimrl.swaps import restore

    model = tiny_peft(mode)
    if not pinned:
        restore(checkpointing.base_transformers_model(model), "gradient_checkpointing_enable")
    args = TrainingArguments(
        output_dir=str(tmp_path),
        gradient_checkpointing=True,
        use_cpu=True,
        report_to=[],
        max_steps=1,
        per_device_train_batch_size=2,
        save_strategy="no",
        disable_tqdm=True,
    )
    rows = Dataset.from_list([{"input_ids": list(range(4, 12)), "labels": list(range(4, 12))}] * 2)
    Trainer(model=model, args=args, train_dataset=rows).train()
    expect_mode(model, after)


def test_offload_hook_sees_the_checkpointed_inputs(tiny_peft):
    model = tiny_peft("offload").train()
    stats = model_state(checkpointing.base_transformers_model(model)).offload_stats
    lora_grads(model, batch())
    # each checkpointed layer saves at least its hidden-state input through the hook; on CPU nothing moves
    assert stats.tensors_seen >= 2
    assert stats.tensors_moved == 0 and stats.bytes_moved == 0
    before = stats.tensors_seen
    checkpointing.apply_checkpointing(model, True)
    lora_grads(model, batch())
    assert stats.tensors_seen == before


def test_deepcopy_rebinds_the_guard(tiny_peft):
    model = tiny_peft("offload")
    clone = copy.deepcopy(model)
    base, clone_base = (checkpointing.base_transformers_model(m) for m in (model, clone))
    assert clone_base.gradient_checkpointing_enable.__self__ is clone_base
    model_state(clone_base).checkpointing = True
    clone.gradient_checkpointing_enable()
    expect_mode(clone, True)
    expect_mode(model, "offload")
    assert model_state(base).checkpointing == "offload"


def test_apply_checkpointing_on_plain_model():
    from slimrl.testing import tiny_llama

    model = tiny_llama(hidden_size=32, num_layers=2)
    assert checkpointing.checkpointing_mode(model) is None
    assert checkpointing.apply_checkpointing(model, "offload") is model
    expect_mode(model, "offload")
    checkpointing.apply_checkpointing(model, False)
    expect_mode(model, False)


@pytest.mark.parametrize("mode", MODES)
def test_slimrls_own_calls_use_no_deprecated_checkpointing_name(tiny_peft, mode):
    """transformers 5.24 deprecates gradient_checkpointing_enable/_disable and is_gradient_checkpointing with a
    FutureWarning; slimrl's own switching (not TRL's or peft's calls) must not use them."""
    import warnings

    from slimrl.models import modes

    model = tiny_peft(mode)  # built before: peft's own __init__ reads is_gradient_checkpointing
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        checkpointing.apply_checkpointing(model, mode)
        checkpointing.set_checkpointing_active(model, False)
        checkpointing.set_checkpointing_active(model, True)
        assert checkpointing.is_checkpointing_active(model) is bool(mode)
        modes.for_inference(model)
        modes.for_training(model)
        base = checkpointing.base_transformers_model(model)
        if hasattr(base, "is_activation_checkpointing"):  # transformers >= 5.24 (the new names, the deprecations)
            base.activation_checkpointing_enable()  # what transformers' Trainer calls: routed to slimrl's guard
            with pytest.raises(FutureWarning, match="is_gradient_checkpointing"):  # the negative control
                base.is_gradient_checkpointing  # noqa: B018
    expect_mode(model, mode)


def test_stock_grpo_trainer_keeps_offload_through_rollouts(tiny_model_dir, tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from slimrl import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained(tiny_model_dir, dtype="float32", max_seq_length=128)
    model = FastLanguageModel.get_peft_model(model, r=4, use_gradient_checkpointing="offload")
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "what is 1 plus 2"}]}] * 8)
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        max_steps=2,
        use_cpu=True,
        bf16=False,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    expect_mode(trainer.model, "offload")
    trainer.train()  # two generate → train cycles through unwrap_model_for_generation
    expect_mode(trainer.model, "offload")
    stats = model_state(checkpointing.base_transformers_model(trainer.model)).offload_stats
    assert stats.tensors_seen == 2 * 2  # the hidden-state input of 2 layers, in 2 training forwards


def _hidden(name):
    def absent(self):
        raise AttributeError(f"{name} (transformers 5.23 and later only)")

    return property(absent)


def _old_enable(self, gradient_checkpointing_kwargs=None, every_n_layers=1, offload=False):
    """transformers 5.17-5.22's `gradient_checkpointing_enable`, reduced to what it does to the layers."""
    kwargs = gradient_checkpointing_kwargs or {"use_reentrant": False}
    func = functools.partial(torch.utils.checkpoint.checkpoint, **kwargs)
    self._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=func, every_n_layers=every_n_layers)


def old_names_peft(mode):
    """A tiny LoRA model whose transformers class has only the checkpointing names of transformers 5.17-5.22 (no
    `activation_checkpointing_*`, no deprecation warnings), set up by slimrl with `mode`."""
    from slimrl import FastLanguageModel
    from slimrl.testing import tiny_llama

    model = tiny_llama(seed=0, hidden_size=32, num_layers=2)
    names = {f"activation_checkpointing_{n}": _hidden(f"activation_checkpointing_{n}") for n in ("enable", "disable")}
    model.__class__ = type(
        "OldNamesLlama",
        (type(model),),
        {
            **names,
            "is_activation_checkpointing": _hidden("is_activation_checkpointing"),
            "gradient_checkpointing_enable": _old_enable,
            "gradient_checkpointing_disable": lambda self: self._set_gradient_checkpointing(enable=False),
            "is_gradient_checkpointing": property(lambda self: checkpointing.is_checkpointing_active(self)),
        },
    )
    return FastLanguageModel.get_peft_model(model, r=4, use_gradient_checkpointing=mode, random_state=1)


@pytest.mark.parametrize("mode", MODES)
def test_mode_survives_the_calls_of_transformers_before_5_23(mode):
    """transformers 5.17-5.22's Trainer, TRL's toggles and peft call only `gradient_checkpointing_enable`: the pin
    (an instance override of that name) holds without transformers' routing of the 5.23 name through it."""
    from accelerate import Accelerator
    from trl.models.utils import disable_gradient_checkpointing, unwrap_model_for_generation

    model = old_names_peft(mode)
    assert not hasattr(model, "activation_checkpointing_enable")
    trainer_enables_checkpointing(model, {"use_reentrant": False}, offload=True)  # the old Trainer's call
    expect_mode(model, mode)
    with disable_gradient_checkpointing(model, {"use_reentrant": False}):
        expect_mode(model, False)
    with unwrap_model_for_generation(model, Accelerator(cpu=True), gradient_checkpointing_kwargs=None):
        pass
    expect_mode(model, mode)


def test_without_the_pin_the_old_trainer_call_changes_the_mode():
    from slimrl.swaps import restore

    for mode, changed_to in (("offload", True), (False, True)):
        model = old_names_peft(mode)
        restore(checkpointing.base_transformers_model(model), "gradient_checkpointing_enable")  # negative control
        trainer_enables_checkpointing(model)
        expect_mode(model, changed_to)
