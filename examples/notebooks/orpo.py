"""ORPO in the shape of Unsloth's Llama-3 ORPO notebook, on the embedded SmolLM2-135M (4-bit, as the notebook).

The same cells: a 4-bit model with LoRA, Alpaca-style prompts from instruction / input / accepted / rejected rows,
PatchDPOTrainer(), `from trl import ORPOConfig, ORPOTrainer` (TRL 1.16 keeps them under trl.experimental; slimrl
adds the names), `ORPOTrainer(..., tokenizer=)` with max_prompt_length / max_completion_length; then generation
(for_inference, a TextStreamer), the LoRA saved and loaded back by its folder, and a GGUF file. Two steps.

    python examples/notebooks/orpo.py                     # generation through transformers
    .venv-vllm/bin/python examples/notebooks/orpo.py --fast_inference   # the first inference cell on vLLM
"""

import sys

fast_inference = "--fast_inference" in sys.argv

# %% Load the model
from slimrl import FastLanguageModel

max_seq_length = 512
dtype = None
load_in_4bit = True
model, tokenizer = FastLanguageModel.from_pretrained(
    model_name="smollm2-135m",
    max_seq_length=max_seq_length,
    dtype=dtype,
    load_in_4bit=load_in_4bit,
    fast_inference=fast_inference,
    gpu_memory_utilization=0.1,
    vllm_engine_kwargs={"enforce_eager": True},
)
model = FastLanguageModel.get_peft_model(
    model,
    r=16,
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    lora_alpha=16,
    lora_dropout=0,
    bias="none",
    use_gradient_checkpointing="unsloth",
    random_state=3407,
    use_rslora=False,
    loftq_config=None,
)

# %% Data: the dolphin preference set's columns, made here (no download)
from datasets import Dataset

alpaca_prompt = """Below is an instruction that describes a task, paired with an input that provides further context. \
Write a response that appropriately completes the request.
### Instruction:
{}
### Input:
{}
### Response:
{}"""
EOS_TOKEN = tokenizer.eos_token

rows = [
    {
        "instruction": "Add the numbers.",
        "input": f"{a} and {a + 3}",
        "accepted": f"{a} + {a + 3} = {2 * a + 3}",
        "rejected": "I do not know.",
    }
    for a in range(8)
]
dataset = Dataset.from_list(rows)


def format_prompt(sample):
    sample["prompt"] = alpaca_prompt.format(sample["instruction"], sample["input"], "")
    sample["chosen"] = sample["accepted"] + EOS_TOKEN
    sample["rejected"] = sample["rejected"] + EOS_TOKEN
    return sample


dataset = dataset.map(format_prompt)

# %% Train
from slimrl import PatchDPOTrainer

PatchDPOTrainer()
from trl import ORPOConfig, ORPOTrainer

orpo_trainer = ORPOTrainer(
    model=model,
    train_dataset=dataset,
    tokenizer=tokenizer,
    args=ORPOConfig(
        max_length=max_seq_length,
        max_prompt_length=max_seq_length // 2,
        max_completion_length=max_seq_length // 2,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        beta=0.1,
        logging_steps=1,
        optim="adamw_8bit",
        lr_scheduler_type="linear",
        max_steps=2,
        output_dir="outputs",
        report_to="none",
    ),
)
orpo_trainer.train()
assert orpo_trainer.state.global_step == 2

# %% Inference
prompt = alpaca_prompt.format("Continue the fibonacci sequence.", "1, 1, 2, 3, 5, 8", "")
if fast_inference:
    from vllm import SamplingParams

    model.save_lora("orpo_lora")
    outputs = model.fast_generate(
        prompt, SamplingParams(temperature=0, max_tokens=24), lora_request=model.load_lora("orpo_lora")
    )
    print(outputs[0].outputs[0].text)
FastLanguageModel.for_inference(model)
inputs = tokenizer([prompt], return_tensors="pt").to(model.device)
from transformers import TextStreamer

_ = model.generate(**inputs, streamer=TextStreamer(tokenizer), max_new_tokens=24)

# %% Save the LoRA, load it back by its folder, export a GGUF
model.save_pretrained("lora_model")
tokenizer.save_pretrained("lora_model")
model, tokenizer = FastLanguageModel.from_pretrained(
    model_name="lora_model", max_seq_length=max_seq_length, dtype=dtype, load_in_4bit=load_in_4bit
)
FastLanguageModel.for_inference(model)
inputs = tokenizer([alpaca_prompt.format("What is a famous tall tower in Paris?", "", "")], return_tensors="pt")
outputs = model.generate(**inputs.to(model.device), max_new_tokens=16, use_cache=True)
print(tokenizer.batch_decode(outputs))
model.save_pretrained_gguf("model_gguf", tokenizer, quantization_method="q8_0")
print("saved: lora_model/, model_gguf/")
