"""The vLLM tier for PPO (needs vLLM: `bash scripts/test_vllm.sh`): with `fast_inference=True` the rollouts come from
the model's engine, handed the policy adapter (never the value adapter, never a stale one) before each rollout.

Float32 and eager engines, as the other vLLM-tier tests.
"""

import pytest
import torch

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/install_vllm.sh)")

from slimrl import FastLanguageModel  # noqa: E402
from slimrl.testing import save_tiny_model  # noqa: E402

QUESTIONS = ["what is 1 plus 2", "what is 3 plus 4", "say hello", "what is 7 plus 5"]


@pytest.fixture(scope="module")
def engine_model(tmp_path_factory):
    # head_dim 64: vLLM's CPU attention has no kernel for 16
    folder = save_tiny_model(
        tmp_path_factory.mktemp("tiny"), vocab_size=512, hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1
    )
    model, tokenizer = FastLanguageModel.from_pretrained(
        folder,
        max_seq_length=256,
        dtype="float32",
        fast_inference=True,
        gpu_memory_utilization=0.05,
        vllm_engine_kwargs={"enforce_eager": True},
    )
    return FastLanguageModel.get_peft_model(model, r=8, lora_alpha=16, random_state=0), tokenizer


def _greedy_hf(model, tokenizer, prompts, max_new_tokens):
    FastLanguageModel.for_inference(model)
    out = []
    for text in prompts:
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
        gen = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
        out.append(gen[0, ids["input_ids"].shape[1] :].tolist())
    FastLanguageModel.for_training(model)
    return out


def test_ppo_rolls_out_on_the_engine_with_the_policy_adapter(engine_model, tmp_path):
    from datasets import Dataset
    from vllm import SamplingParams

    from slimrl.ppo import PPOConfig, PPOTrainer

    model, tokenizer = engine_model
    engine = model.get_base_model().vllm_engine
    calls = []
    generate = engine.generate
    engine.generate = lambda *a, **kw: calls.append(engine.sync_count) or generate(*a, **kw)
    model.generate = None  # HF generate must not run
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": q}] for q in QUESTIONS * 4]})
    args = PPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_ppo_epochs=2,
        response_length=8,
        max_steps=4,
        learning_rate=1e-2,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        seed=0,
        gradient_checkpointing=False,
    )
    trainer = PPOTrainer(
        args=args,
        processing_class=tokenizer,
        model=model,
        train_dataset=data,
        reward_funcs=lambda completion_ids, **kw: [float(len(ids)) for ids in completion_ids],
    )
    try:
        trainer.train()
    finally:
        engine.generate = generate
        del model.generate
    assert len(calls) == 2, "one engine call per rollout"
    assert engine.sync_count > calls[0], "the trained adapter was not handed over before the second rollout"
    # with two adapters on the model, the engine generates with the policy's (the active one), as HF does
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in QUESTIONS
    ]
    greedy = SamplingParams(temperature=0, max_tokens=12)
    from_engine = [list(o.outputs[0].token_ids) for o in model.fast_generate(prompts, greedy, use_adapter=True)]
    assert model.active_adapter == "default" and "value" in model.peft_config
    assert from_engine == _greedy_hf(model, tokenizer, prompts, 12)
    with torch.no_grad(), model.disable_adapter():
        assert from_engine != _greedy_hf(model, tokenizer, prompts, 12), "the adapter did not change anything"


def test_cli_ppo_fast_inference_runs_and_exits_cleanly(tmp_path):
    """`slimrl ppo --fast_inference` end to end, in its own process (it shuts its engine down at the end)."""
    import json
    import os
    import subprocess
    import sys

    folder = save_tiny_model(
        tmp_path / "tiny", vocab_size=512, hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1
    )
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "slimrl.cli",
            "ppo",
            "--fast_inference",
            "--vllm_enforce_eager",
            "--gpu_memory_utilization",
            "0.05",
            "--model_name_or_path",
            folder,
            "--max_steps",
            "2",
            "--response_length",
            "8",
            "--per_device_train_batch_size",
            "4",
            "--gradient_accumulation_steps",
            "1",
            "--num_train_samples",
            "16",
            "--num_eval_samples",
            "4",
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
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss/policy_avg" in r] == [1, 2]
    assert (out / "adapter_model.safetensors").is_file()
