"""The rollout seam without vLLM: which backend a trainer gets, and how vllm_sampling_params meets the config."""

import warnings

import pytest

import slimrl
from slimrl.generation.vllm_engine import VLLMEngine
from slimrl.patches import registry
from slimrl.patches.rollouts import vllm_rollouts
from slimrl.patches.rollouts.vllm_rollouts import apply_sampling_params, make_vllm_generation
from slimrl.state import config_state


class _Config:
    """The fields apply_sampling_params reads, with TRL's defaults; `user` = the fields the user set."""

    def __init__(self, user=(), vllm_sampling_params=None, **fields):
        self.temperature, self.top_p, self.top_k, self.min_p = 1.0, 1.0, 0, None
        self.repetition_penalty, self.max_completion_length = 1.0, 256
        self.use_vllm, self.vllm_mode, self.vllm_enable_sleep_mode = False, "colocate", False
        self.__dict__.update(fields)
        self.vllm_sampling_params = vllm_sampling_params
        config_state(self).user_fields = frozenset(user) | frozenset(fields)


def test_scalar_sampling_fields_reach_vllm_and_shared_ones_go_to_the_config():
    args = _Config(
        vllm_sampling_params={
            "min_p": 0.1,
            "top_k": -1,
            "stop": ["</answer>"],
            "temperature": 0.7,
            "n": 1,
            "max_tokens": 64,
            "seed": 3,
        }
    )
    overrides = apply_sampling_params(args)
    assert overrides == {
        "min_p": 0.1,
        "top_k": -1,
        "stop": ["</answer>"],
        "temperature": 0.7,
        "max_tokens": 64,
        "seed": 3,
    }
    # the loss must see the sampler the completions came from
    assert (args.min_p, args.temperature, args.max_completion_length, args.top_k) == (0.1, 0.7, 64, 0)


def test_a_sampling_field_that_contradicts_a_user_setting_raises_naming_both():
    args = _Config(temperature=0.9, vllm_sampling_params={"temperature": 0.7})
    with pytest.raises(ValueError, match=r"vllm_sampling_params.temperature=0.7 and _Config.temperature=0.9"):
        apply_sampling_params(args)
    # the same value, or vLLM's -1 for TRL's 0, is no contradiction
    apply_sampling_params(_Config(temperature=0.7, top_k=0, vllm_sampling_params={"temperature": 0.7, "top_k": -1}))


@pytest.mark.parametrize("field, value", [("n", 4), ("logprobs", 5), ("prompt_logprobs", 1)])
def test_fields_the_trainer_owns_are_refused(field, value):
    with pytest.raises(ValueError, match=f"vllm_sampling_params.{field}={value}"):
        apply_sampling_params(_Config(vllm_sampling_params={field: value}))


class _Stock:
    """Stands in for TRL's VLLMGeneration."""

    def __init__(self, model=None, **kwargs):
        self.model, self.kwargs = model, kwargs


def _engine():
    return object.__new__(VLLMEngine)  # an attached engine, never started


def test_backend_selection_engine_only_when_the_model_has_one(monkeypatch):
    factory = make_vllm_generation(_Stock)
    plain = type("M", (), {})()
    assert isinstance(factory(model=plain, mode="colocate"), _Stock)  # no engine: TRL's own class
    with_engine = type("M", (), {"vllm_engine": _engine()})()
    assert isinstance(factory(model=with_engine, mode="server"), _Stock)  # server mode: TRL's client
    monkeypatch.setattr(_Stock, "_init_vllm", lambda self: None, raising=False)
    built = []
    monkeypatch.setattr(factory.engine_class, "__init__", lambda self, *a, **k: built.append(a))
    assert isinstance(factory(model=with_engine, mode="colocate"), factory.engine_class) and built


def test_config_turns_use_vllm_on_for_an_engine_unless_the_user_said_no(caplog):
    model = type("M", (), {"vllm_engine": _engine()})()
    args = _Config()
    with vllm_rollouts.engine_rollouts(model, args):
        assert vllm_rollouts.TRAINER_ARGS.get() is args
    assert args.use_vllm and config_state(args).sleep_between_rollouts and config_state(args).sampling_overrides == {}
    args = _Config(use_vllm=False)
    with pytest.warns(UserWarning, match="use_vllm=False: the model's vLLM engine"):
        with vllm_rollouts.engine_rollouts(model, args):
            pass
    assert not args.use_vllm
    args = _Config(vllm_enable_sleep_mode=False, vllm_gpu_memory_utilization=0.9)
    with pytest.warns(UserWarning, match="vllm_gpu_memory_utilization configures TRL's own"):
        vllm_rollouts._prepare_config(model, args)
    assert config_state(args).sleep_between_rollouts is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vllm_rollouts._prepare_config(type("M", (), {})(), _Config())  # no engine, nothing to say


def test_the_seam_and_what_the_subclass_relies_on_are_checked(monkeypatch, unpatched):
    import trl.trainer.grpo_trainer as grpo_mod
    from trl.generation.vllm_generation import VLLMGeneration

    slimrl.PatchFastRL("grpo")
    assert grpo_mod.VLLMGeneration is not VLLMGeneration
    assert grpo_mod.VLLMGeneration.engine_class.__mro__[1] is VLLMGeneration
    registry.unpatch()
    assert grpo_mod.VLLMGeneration is VLLMGeneration
    monkeypatch.setattr(VLLMGeneration, "generate", lambda self, prompts, images, n: None)
    with pytest.raises(slimrl.PatchError, match=r"VLLMGeneration` \(TRL .*\) \(its `generate`\): expected parameters"):
        slimrl.PatchFastRL("grpo")
    assert not slimrl.is_patched()
