"""DPO in the shape of Unsloth's Zephyr DPO notebook, on the embedded SmolLM2-135M (4-bit, as the notebook loads it).

The same cells: PatchDPOTrainer(), a 4-bit model, UltraFeedback-style rows (chosen / rejected conversations) turned
into prompt / chosen / rejected text with the chat template, LoRA, and TRL 0.x's trainer call
`DPOTrainer(..., beta=, tokenizer=, max_length=, max_prompt_length=)` with `warmup_ratio`; then generation and the
save cells. Two steps.

    python examples/notebooks/dpo.py                     # generation through transformers
    .venv-vllm/bin/python examples/notebooks/dpo.py --fast_inference   # the inference cell on vLLM
"""

import sys

fast_inference = "--fast_inference" in sys.argv

# %% Load the model
from slimrl import FastLanguageModel, PatchDPOTrainer

PatchDPOTrainer()
max_seq_length = 512
model, tokenizer = FastLanguageModel.from_pretrained(
    model_name="smollm2-135m",
    max_seq_length=max_seq_length,
    dtype=None,  # bfloat16 where the CPU computes it fast, else float32
    load_in_4bit=True,
    fast_inference=fast_inference,
    gpu_memory_utilization=0.1,
    vllm_engine_kwargs={"enforce_eager": True},
)

# %% Data: UltraFeedback's columns, made here (no download)
from datasets import Dataset, DatasetDict


def conversation(question, reply):
    return [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]


rows = []
for i in range(8):
    question = f"Name an even number bigger than {2 * i}."
    rows.append(
        {
            "prompt": question,
            "chosen": conversation(question, f"{2 * i + 2} is even and bigger than {2 * i}."),
            "rejected": conversation(question, f"{2 * i - 1}."),
        }
    )
raw_datasets = DatasetDict({"train": Dataset.from_list(rows[:6]), "test": Dataset.from_list(rows[6:])})


def apply_chat_template(example, tokenizer, assistant_prefix="<|im_start|>assistant\n"):
    """The notebook's "dpo" task: the user turn as the prompt, each reply without the assistant prefix."""
    prompt_messages = [{"role": "system", "content": ""}, example["chosen"][0]]
    text_chosen = tokenizer.apply_chat_template(example["chosen"][1:], tokenize=False)
    text_rejected = tokenizer.apply_chat_template(example["rejected"][1:], tokenize=False)
    return {
        "text_prompt": tokenizer.apply_chat_template(prompt_messages, tokenize=False, add_generation_prompt=True),
        "text_chosen": text_chosen.split(assistant_prefix, 1)[-1],  # SmolLM2's template adds a system turn first
        "text_rejected": text_rejected.split(assistant_prefix, 1)[-1],
    }


column_names = list(raw_datasets["train"].features)
raw_datasets = raw_datasets.map(apply_chat_template, fn_kwargs={"tokenizer": tokenizer}, remove_columns=column_names)
for split in ["train", "test"]:
    raw_datasets[split] = raw_datasets[split].rename_columns(
        {"text_prompt": "prompt", "text_chosen": "chosen", "text_rejected": "rejected"}
    )
print(raw_datasets["train"][0])

# %% LoRA
model = FastLanguageModel.get_peft_model(
    model,
    r=64,
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    lora_alpha=64,
    lora_dropout=0,
    bias="none",
    use_gradient_checkpointing="unsloth",
    random_state=3407,
    use_rslora=False,
    loftq_config=None,
)

# %% Train (TRL 0.x's trainer keywords: slimrl sets them on the config, with a notice)
from trl import DPOConfig, DPOTrainer

dpo_trainer = DPOTrainer(
    model=model,
    ref_model=None,
    args=DPOConfig(
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        warmup_ratio=0.1,
        max_steps=2,
        learning_rate=5e-6,
        logging_steps=1,
        optim="adamw_8bit",
        weight_decay=0.0,
        lr_scheduler_type="linear",
        seed=42,
        output_dir="outputs",
        report_to="none",
    ),
    beta=0.1,
    train_dataset=raw_datasets["train"],
    tokenizer=tokenizer,
    max_length=256,
    max_prompt_length=128,
)
dpo_trainer.train()
assert dpo_trainer.state.global_step == 2 and dpo_trainer.args.beta == 0.1

# %% Inference
messages = [{"role": "user", "content": "Name an even number bigger than 20."}]
text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
if fast_inference:
    from vllm import SamplingParams

    model.save_lora("dpo_lora")
    outputs = model.fast_generate(
        [text], SamplingParams(temperature=0, max_tokens=24), lora_request=model.load_lora("dpo_lora")
    )
    print(outputs[0].outputs[0].text)
else:
    FastLanguageModel.for_inference(model)
    inputs = tokenizer([text], return_tensors="pt", add_special_tokens=False).to(model.device)
    outputs = model.generate(**inputs, max_new_tokens=24, use_cache=True)
    print(tokenizer.batch_decode(outputs))

# %% Save
model.save_pretrained("dpo_model")
tokenizer.save_pretrained("dpo_model")
print("saved: dpo_model/")
