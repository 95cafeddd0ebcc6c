"""The memory planner's terms against what they model, on tiny random models (fast; the end-to-end accuracy test
against measured peaks is test_plan_accuracy.py, slow tier).

- parameter and LoRA counts: equal to the real model's and PEFT's (exact);
- saved activations per token and layer, LoRA and full fine-tuning, fp32 and bf16: within 6% of the bytes autograd
  saves for a 3-layer Llama (counted with saved-tensor hooks; LoRA is within 0.2%, full fine-tuning misses the
  model's final norm, which the formula leaves out, ~4%);
- the KV cache: equal to the DynamicCache `generate` leaves (exact), the growth copy on top;
- the log-prob head's rows: the chunking slimrl's head uses (slimrl.ops.chunking);
- the combination: CPU's heap carry-over, CUDA's plain maximum, fits / suggestions, the `slimrl plan` command.
"""

import json

import pytest
import torch

from slimrl.planning import plan
from slimrl.planning import terms as T
from slimrl.planning.breakdown import suggestions
from slimrl.planning.run import run_shape
from slimrl.planning.shapes import model_shape
from slimrl.testing import save_tiny_model, tiny_llama, tiny_llama_config

SHAPE = dict(vocab_size=1000, hidden_size=64, intermediate_size=160, num_layers=3, num_heads=4, num_kv_heads=2)


@pytest.mark.parametrize("tied", [False, True])
def test_parameter_and_lora_counts_are_exact(tied):
    from slimrl import FastLanguageModel

    config = tiny_llama_config(tie_word_embeddings=tied, **SHAPE)
    model = tiny_llama(tie_word_embeddings=tied, **SHAPE)
    shape = model_shape(config, lora_rank=8)
    assert shape.num_params == sum(p.numel() for p in model.parameters())
    peft_model = FastLanguageModel.get_peft_model(model, r=8, use_gradient_checkpointing=False)
    assert shape.lora_params == sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert shape.lora_rank_sum_per_layer == 8 * 7  # q k v o gate up down
    narrow = model_shape(config, lora_rank=4, lora_targets=["q_proj", "v_proj"])
    assert narrow.lora_params == 3 * 4 * ((64 + 64) + (64 + 32))
    with pytest.raises(ValueError, match="match no Linear layer"):
        model_shape(config, lora_rank=4, lora_targets=["nope_proj"])


def _saved_bytes(model, tokens=(4, 48)) -> int:
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(5, SHAPE["vocab_size"], tokens)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    return sum(v for k, v in seen.items() if k not in params)


@pytest.mark.parametrize("lora", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_saved_activations_match_autograd(lora, dtype):
    from slimrl import FastLanguageModel

    model = tiny_llama(dtype=getattr(torch, dtype), **SHAPE)
    if lora:
        model = FastLanguageModel.get_peft_model(model, r=8, use_gradient_checkpointing=False)
    backbone = (model.get_base_model() if lora else model).model
    measured = _saved_bytes(backbone) / (4 * 48 * SHAPE["num_layers"])
    shape = model_shape(tiny_llama_config(**SHAPE), lora_rank=8 if lora else None)
    run = run_shape("grpo", {}, lora=lora, prompt_length=8, max_completion_length=8, dtype=dtype)
    planned = T.per_token_layer_bytes(shape, run)
    assert abs(planned / measured - 1) < 0.06, (planned, measured)


def test_kv_cache_formula_is_the_dynamic_cache():
    model = tiny_llama(**SHAPE).eval()
    rows, prompt, new = 6, 10, 7
    ids = torch.randint(5, 900, (rows, prompt))
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            return_dict_in_generate=True,
        )
    cache = sum(layer.keys.nbytes + layer.values.nbytes for layer in out.past_key_values.layers)
    shape = model_shape(tiny_llama_config(**SHAPE))
    # the last sampled token is never fed back, so the cache holds T - 1 positions
    run = run_shape(
        "grpo",
        {"max_completion_length": new - 1},
        prompt_length=prompt,
        lora=False,
        per_device_train_batch_size=rows,
        steps_per_generation=1,
    )
    layer = 2 * shape.num_kv_heads * shape.head_dim * rows * (prompt + new - 1) * 4
    assert T.kv_cache(shape, run).bytes - layer == cache


def test_head_rows_follow_the_chunk_knob():
    shape = model_shape(tiny_llama_config(**{**SHAPE, "vocab_size": 50000}))
    auto = run_shape("grpo", {}, lora=True, prompt_length=8)
    # automatic: 128 MiB for two fp32 buffers of V=50,000 columns is 335 rows, so 1000 tokens take 3 chunks of 334
    assert T.head_rows(shape, auto, 1000) == 334
    fixed = run_shape("grpo", {"slimrl_num_chunks": 4}, lora=True, prompt_length=8)
    assert T.head_rows(shape, fixed, 1000) == 250
    assert T.head_forward(shape, fixed, 1000).bytes == 2 * 250 * 50000 * 4


def test_cpu_keeps_the_heap_of_an_earlier_phase_and_cuda_does_not(monkeypatch):
    config = tiny_llama_config(
        vocab_size=8192, hidden_size=256, intermediate_size=512, num_layers=8, num_heads=4, num_kv_heads=4
    )  # test_plan_accuracy's "kv" run: 0.5 GiB of cache in <32 MiB blocks
    fields = dict(
        per_device_train_batch_size=8,
        gradient_accumulation_steps=8,
        steps_per_generation=8,
        max_completion_length=448,
        gradient_checkpointing=True,
        bf16=False,
    )
    slimrl_heap = plan(config, fields, "grpo", prompt_length=64, dtype="float32", device="cpu", device_memory_gb=64)
    assert slimrl_heap.carried_heap == 0  # slimrl's 1 MiB threshold (training/cpu_heap.py) returns those blocks
    monkeypatch.setattr(T, "HEAP_LIMIT", 32 * 2**20)  # glibc's own threshold (SLIMRL_CPU_HEAP=keep)
    cpu = plan(config, fields, "grpo", prompt_length=64, dtype="float32", device="cpu", device_memory_gb=64)
    cuda = plan(config, fields, "grpo", prompt_length=64, dtype="float32", device="cuda", device_memory_gb=64)
    assert cpu.heap_phase == "rollout" and cpu.peak_phase != "rollout" and cpu.carried_heap > 0
    assert cpu.peak_bytes == cpu.resident_bytes + cpu.phase_bytes(cpu.peak_phase) + cpu.carried_heap
    assert cuda.carried_heap == 0 and cuda.peak_phase == "rollout"
    assert cuda.peak_bytes == cuda.resident_bytes + cuda.phase_bytes("rollout")


def test_config_object_dict_and_keywords_agree_and_fits_follows_the_device(tmp_path):
    from slimrl import PatchFastRL

    PatchFastRL("grpo")
    from trl import GRPOConfig

    config = tiny_llama_config(**SHAPE)
    args = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        max_completion_length=32,
        per_device_train_batch_size=4,
        num_generations=4,
    )
    by_object = plan(config, args, prompt_length=16, device="cpu", device_memory_gb=8)
    by_dict = plan(
        config,
        {
            "max_completion_length": 32,
            "per_device_train_batch_size": 4,
            "num_generations": 4,
            "gradient_checkpointing": True,
        },
        "grpo",
        prompt_length=16,
        device="cpu",
        device_memory_gb=8,
    )
    by_keywords = plan(
        config,
        None,
        "grpo",
        prompt_length=16,
        device="cpu",
        device_memory_gb=8,
        max_completion_length=32,
        per_device_train_batch_size=4,
        num_generations=4,
    )
    assert by_object.peak_bytes == by_dict.peak_bytes == by_keywords.peak_bytes and by_object.fits
    tight = plan(config, args, prompt_length=16, device="cpu", device_memory_gb=0.5)
    assert not tight.fits and "does NOT fit" in str(tight)
    with pytest.raises(ValueError, match="algorithm must be one of"):
        plan(config, {"max_completion_length": 8})


def test_suggestions_lower_the_peak_and_name_the_knobs():
    config = tiny_llama_config(**{**SHAPE, "vocab_size": 128000})
    p = plan(
        config,
        {
            "max_completion_length": 512,
            "per_device_train_batch_size": 8,
            "gradient_checkpointing": False,
            "slimrl_num_chunks": 1,
        },
        "grpo",
        prompt_length=64,
        device="cpu",
        device_memory_gb=1.5,
    )
    options = dict(suggestions(p))
    assert options and all(q.peak_bytes < p.peak_bytes for q in options.values())
    assert any(k.startswith("slimrl_num_chunks=") for k in options)
    assert "max_completion_length=256" in options
    assert "settings that fit, each alone" in str(p)


def test_plan_command_exit_status_says_whether_it_fits(tmp_path, capsys):
    from slimrl.cli import main

    model_dir = save_tiny_model(tmp_path / "tiny")
    argv = [
        "plan",
        "grpo",
        "--model_name_or_path",
        model_dir,
        "--bf16",
        "False",
        "--prompt_length",
        "32",
        "--dtype",
        "float32",
        "--device",
        "cpu",
    ]
    assert main([*argv, "--device_memory_gb", "64"]) == 0
    out = capsys.readouterr().out
    assert "GRPO step on" in out and "peak" in out and "fits" in out
    assert main([*argv, "--device_memory_gb", "0.1", "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["fits"] is False and result["peak_bytes"] > 0.1 * 2**30
    assert main(["plan", "nope"]) == 2


@pytest.mark.parametrize(
    "given, mode",
    [
        ("false", False),
        ("False", False),
        ("none", False),
        ("true", True),
        ("Unsloth", "offload"),
        ("OFFLOAD", "offload"),
    ],
)
def test_checkpointing_spellings_follow_the_one_alias_rule(given, mode):
    """The plan reads a checkpointing value through slimrl.models.checkpointing.normalize_mode, the rule
    get_peft_model applies: "false" is no checkpointing and "Unsloth" is offload (truthiness says True for both)."""
    from slimrl.models.checkpointing import normalize_mode

    assert run_shape("grpo", {}, use_gradient_checkpointing=given).checkpointing == mode == normalize_mode(given)
    assert run_shape("grpo", {"gradient_checkpointing": given}).checkpointing == mode


def test_checkpointing_value_outside_the_rule_is_refused():
    with pytest.raises(ValueError, match="use_gradient_checkpointing must be"):
        run_shape("grpo", {}, use_gradient_checkpointing="sometimes")


@pytest.mark.parametrize(
    "algorithm, config, asked, mode, row",
    [
        ("dpo", {"activation_offloading": True}, "offload", True, "TRL_OFFLOADS"),  # TRL's offload; recompute only
        ("dpo", {}, "offload", "offload", "MARKED"),
        (
            "grpo",
            {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"offload": True}},
            None,
            "offload",
            "CONFIG_OFFLOAD",
        ),
        (
            "dpo",
            {"gradient_checkpointing": True, "activation_checkpointing_kwargs": {"offload": True}},
            None,
            "offload",
            "CONFIG_OFFLOAD",
        ),
        (
            "grpo",
            {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"offload": True}},
            False,
            False,
            "MARKED",
        ),
        ("grpo", {"gradient_checkpointing": True}, None, True, "CONFIG_FLAG"),
    ],
)
def test_the_plan_resolves_checkpointing_by_every_row_the_trainer_uses(algorithm, config, asked, mode, row):
    """run_shape gives resolve_checkpointing what the trainer's set-up will: get_peft_model's mode as the model's
    mark, TRL's activation_offloading (offline configs), the config's flag and its keywords' offload."""
    from slimrl.models import checkpointing

    inputs = dict(
        mark=None if asked is None else checkpointing.normalize_mode(asked), **checkpointing.config_inputs(config)
    )
    assert checkpointing.resolve_checkpointing(
        trl_offloading=bool(config.get("activation_offloading")), **inputs
    ).row == getattr(checkpointing, row)
    assert run_shape(algorithm, config, use_gradient_checkpointing=asked).checkpointing == mode
