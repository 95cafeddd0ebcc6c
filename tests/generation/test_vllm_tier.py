"""The vLLM tier (needs vLLM: `bash scripts/test_vllm.sh`): rollouts come from the current adapter, never silently
from the base model; fast_generate means what it means in Unsloth (base model unless a lora_request); the trainers
generate with the attached engine; vllm_sampling_params reaches vLLM; 4-bit training weights run on a CPU engine.

Exact-text comparisons run in float32 (bf16 greedy can flip numerical near-ties). Engines are in-process and
eager (`enforce_eager=True`: a 5 s start instead of a 2-minute compile).
"""

import pytest
import torch

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/install_vllm.sh)")

from slimrl import FastLanguageModel  # noqa: E402
from slimrl.patches import registry  # noqa: E402
from slimrl.testing import save_tiny_model  # noqa: E402

EAGER = {"enforce_eager": True}
QUESTIONS = ["What is 7 + 5?", "Name a colour.", "Say hello.", "What is 12 + 30?"]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    # head_dim 64: vLLM's CPU attention has kernels for 32/64/80/96/112/128/..., not 16
    return save_tiny_model(
        tmp_path_factory.mktemp("tiny"), vocab_size=512, hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1
    )


def _greedy_hf(model, tokenizer, prompts, max_new_tokens):
    FastLanguageModel.for_inference(model)
    out = []
    for text in prompts:
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
        gen = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
        out.append(gen[0, ids["input_ids"].shape[1] :].tolist())
    FastLanguageModel.for_training(model)
    return out


def _train_one_step(model, tokenizer, lr=3e-3):
    """One AdamW step of plain LM loss on a fixed sentence: the LoRA weights change."""
    batch = tokenizer(["The answer is 12. The colour is blue. Hello there!"] * 2, return_tensors="pt")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    model.train()
    model(**batch, labels=batch["input_ids"]).loss.backward()
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize("weight_sync", ["merged", "lora"])
def test_fast_generate_serves_the_base_the_live_adapter_and_a_saved_one(weight_sync, tmp_path):
    """Unsloth's meaning: no lora_request = the base model, load_lora(folder) = the adapter saved there (on either
    hand-over); slimrl's use_adapter=True = the adapter as it is now. Each == greedy HF of those weights."""
    from vllm import SamplingParams

    model, tokenizer = FastLanguageModel.from_pretrained(
        "smollm2-135m",
        max_seq_length=512,
        dtype="float32",
        fast_inference=True,
        gpu_memory_utilization=0.1,
        vllm_weight_sync=weight_sync,
        vllm_engine_kwargs=EAGER,
    )
    model = FastLanguageModel.get_peft_model(model, r=8, lora_alpha=16, random_state=0)
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in QUESTIONS
    ]
    greedy = SamplingParams(temperature=0, max_tokens=20)

    def fast(**kwargs):
        return [list(o.outputs[0].token_ids) for o in model.fast_generate(prompts, greedy, **kwargs)]

    base = fast()
    _train_one_step(model, tokenizer)
    adapted = fast(use_adapter=True)
    assert adapted == _greedy_hf(model, tokenizer, prompts, 20)
    assert adapted != base, "the step did not change the greedy outputs: the test would prove nothing"
    assert fast() == base, "without a lora_request fast_generate is the base model (Unsloth's meaning)"
    with model.disable_adapter():
        assert fast() == base == _greedy_hf(model, tokenizer, prompts, 20)
    model.save_lora(str(tmp_path / "saved"))
    saved = model.load_lora(str(tmp_path / "saved"))
    assert fast(lora_request=saved) == adapted
    _train_one_step(model, tokenizer)  # the live adapter moves on; the saved one stays what it was
    assert fast(lora_request=saved) == adapted
    moved = fast(use_adapter=True)
    assert moved == _greedy_hf(model, tokenizer, prompts, 20) and moved != adapted
    syncs = model.vllm_engine.sync_count
    fast(use_adapter=True)
    assert model.vllm_engine.sync_count == syncs, "nothing changed, yet the weights were handed over again"


def _grpo(model, tokenizer, trainer_cls="GRPO", steps=3, **config):
    import trl
    from datasets import Dataset

    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"what is {i} plus {i}"}] for i in range(16)]})

    def reward(completions, **kwargs):
        return [float(len(c[0]["content"]) % 7) for c in completions]

    defaults = dict(
        output_dir="/tmp/slimrl-vllm-tier",
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=16,
        max_steps=steps,
        learning_rate=1e-2,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        seed=0,
    )
    defaults.update(config)
    args = getattr(trl, f"{trainer_cls}Config")(**defaults)
    trainer = getattr(trl, f"{trainer_cls}Trainer")(
        model=model, reward_funcs=reward, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    return trainer


@pytest.fixture
def patched():
    registry.unpatch()
    from slimrl import PatchFastRL

    PatchFastRL("grpo")
    PatchFastRL("rloo")
    yield
    registry.unpatch()


@pytest.fixture(scope="module")
def tiny_engine_model(tiny_folder):
    model, tokenizer = FastLanguageModel.from_pretrained(
        tiny_folder,
        max_seq_length=256,
        dtype="float32",
        fast_inference=True,
        gpu_memory_utilization=0.05,
        vllm_engine_kwargs=EAGER,
    )
    return model, tokenizer


def test_grpo_rolls_out_on_the_engine_with_the_weights_it_trains(patched, tiny_engine_model, tmp_path):
    """TRL's IS-correction metric compares vLLM's sampling log-probs with the trainer's: ~1e-7 in fp32 when vLLM
    holds the current adapter. A negative control freezes the hand-over after step 1: the gap becomes large."""
    base, tokenizer = tiny_engine_model
    model = FastLanguageModel.get_peft_model(base, r=8, lora_alpha=16, random_state=1)
    trainer = _grpo(model, tokenizer)
    assert type(trainer.vllm_generation).__name__ == "EngineVLLMGeneration" and trainer.use_vllm
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    trainer.train()
    gaps = [h["sampling/sampling_logp_difference/max"] for h in trainer.state.log_history if "loss" in h]
    assert len(gaps) == 3 and max(gaps) < 1e-4, gaps
    assert all(not torch.equal(p, before[n]) for n, p in model.named_parameters() if p.requires_grad)
    trainer.save_model(str(tmp_path))  # the attached engine does not get in the way of saving
    assert (tmp_path / "adapter_model.safetensors").exists()

    engine = base.vllm_engine
    engine_sync = engine.sync
    calls = []

    def sync_once(m, use_adapter=None):  # the first hand-over only: later rollouts use step-1 weights
        calls.append(1)
        return engine_sync(m, use_adapter) if not calls[1:] else None

    engine.sync = sync_once
    try:
        stale = _grpo(model, tokenizer, steps=3, learning_rate=5e-2)
        stale.train()
    finally:
        engine.sync = engine_sync
    stale_gaps = [h["sampling/sampling_logp_difference/max"] for h in stale.state.log_history if "loss" in h]
    assert max(stale_gaps[1:]) > 100 * max(gaps), (stale_gaps, gaps)
    model.unload()


def test_vllm_sampling_params_reach_vllm_scalars_included(patched, tiny_engine_model):
    from vllm import SamplingParams

    base, tokenizer = tiny_engine_model
    model = FastLanguageModel.get_peft_model(base, r=4, random_state=2)
    seen = []
    llm_generate = base.vllm_engine.llm.generate

    def spy(prompts, sampling_params=None, **kwargs):
        seen.append(sampling_params)
        return llm_generate(prompts, sampling_params=sampling_params, **kwargs)

    base.vllm_engine.llm.generate = spy
    try:
        trainer = _grpo(
            model,
            tokenizer,
            steps=1,
            vllm_sampling_params=SamplingParams(min_p=0.05, top_k=20, stop=["zzz"], seed=7, presence_penalty=0.5),
        )
        assert trainer.args.min_p == 0.05 and trainer.args.top_k == 20  # the loss sees the same sampler
        trainer.train()
    finally:
        base.vllm_engine.llm.generate = llm_generate
    params = seen[0]
    assert isinstance(params, list) and len(params) == 4  # 4 rows (1 prompt x 4 generations), one request each
    first = params[0]
    assert (first.min_p, first.top_k, first.stop, first.presence_penalty) == (0.05, 20, ["zzz"], 0.5)
    assert [p.seed for p in params] == list(range(7, 7 + len(params))), "one seed per request, distinct"
    model.unload()


def test_rloo_rolls_out_on_the_engine(patched, tiny_engine_model):
    base, tokenizer = tiny_engine_model
    model = FastLanguageModel.get_peft_model(base, r=4, random_state=3)
    trainer = _grpo(model, tokenizer, trainer_cls="RLOO", steps=2)
    assert type(trainer.vllm_generation).__name__ == "EngineVLLMGeneration"
    syncs = base.vllm_engine.sync_count
    trainer.train()
    assert base.vllm_engine.sync_count >= syncs + 2  # the changed adapter went over at each step
    assert all(h["loss"] == h["loss"] for h in trainer.state.log_history if "loss" in h)
    model.unload()


def test_explicit_use_vllm_false_keeps_hf_generate(patched, tiny_engine_model):
    base, tokenizer = tiny_engine_model
    model = FastLanguageModel.get_peft_model(base, r=4, random_state=4)
    with pytest.warns(UserWarning, match="use_vllm=False"):
        trainer = _grpo(model, tokenizer, steps=1, use_vllm=False)
    assert not trainer.use_vllm and not hasattr(trainer, "vllm_generation")
    model.unload()


def test_cli_grpo_fast_inference_runs_and_exits_cleanly(tiny_folder, tmp_path):
    """`slimrl grpo --fast_inference` end to end, in its own process (it shuts its engine down at the end)."""
    import json
    import os
    import subprocess
    import sys

    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "slimrl.cli",
            "grpo",
            "--fast_inference",
            "--vllm_enforce_eager",
            "--gpu_memory_utilization",
            "0.05",
            "--model_name_or_path",
            tiny_folder,
            "--max_steps",
            "2",
            "--max_completion_length",
            "8",
            "--per_device_train_batch_size",
            "4",
            "--gradient_accumulation_steps",
            "1",
            "--num_generations",
            "4",
            "--num_train_samples",
            "16",
            "--num_eval_samples",
            "4",
            "--bf16",
            "False",
            "--dtype",
            "float32",
            "--output_dir",
            str(out),
            "--plot",
            "False",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "2"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    gaps = [r["sampling/sampling_logp_difference/max"] for r in rows if "sampling/sampling_logp_difference/max" in r]
    assert len(gaps) == 2 and max(gaps) < 1e-4  # the rollouts came from the engine, with the current adapter
    assert (out / "adapter_model.safetensors").is_file()


def test_4bit_training_weights_roll_out_on_a_cpu_engine(patched, tiny_folder):
    """fast_inference=True with load_in_4bit=True on CPU: the engine holds the NF4 weights dequantized (pushed at
    the first generation) plus the merged LoRA, so its sampling log-probs match the trainer's 4-bit forward."""
    pytest.importorskip("bitsandbytes")
    base, tokenizer = FastLanguageModel.from_pretrained(
        tiny_folder,
        max_seq_length=256,
        dtype="float32",
        load_in_4bit=True,
        fast_inference=True,
        gpu_memory_utilization=0.05,
        vllm_engine_kwargs=EAGER,
    )
    engine = base.vllm_engine
    assert engine.weight_sync == "merged" and "quantization" not in engine.engine_kwargs
    model = FastLanguageModel.get_peft_model(base, r=4, random_state=5)
    trainer = _grpo(model, tokenizer, steps=2)
    trainer.train()
    gaps = [h["sampling/sampling_logp_difference/max"] for h in trainer.state.log_history if "loss" in h]
    assert len(gaps) == 2 and max(gaps) < 1e-3, gaps
    engine.close()
