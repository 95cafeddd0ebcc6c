"""GRPO for reasoning, in the shape of Unsloth's Llama 3.1 / Qwen3 GRPO notebooks, on the embedded SmolLM2-135M.

The same cells: load with fast_inference, LoRA, a GSM8K-style dataset (question, answer after "####") turned into
chat prompts with a system prompt, format and answer rewards, the prompt length measured with
apply_chat_template(tokenize=True), GRPOConfig with warmup_ratio and max_prompt_length, train; then the inference
cells (before and after saving the LoRA), save_lora / load_lora, and the save cells. Two steps, a CPU is enough.

    python examples/notebooks/grpo_reasoning.py                     # generation through transformers
    .venv-vllm/bin/python examples/notebooks/grpo_reasoning.py --fast_inference   # vLLM (scripts/install_vllm.sh)
"""

import sys

fast_inference = "--fast_inference" in sys.argv

# %% Load the model
from slimrl import FastLanguageModel  # patches TRL's trainers on import, as Unsloth does

max_seq_length = 320
lora_rank = 16
model, tokenizer = FastLanguageModel.from_pretrained(
    model_name="smollm2-135m",
    max_seq_length=max_seq_length,
    load_in_4bit=False,
    fast_inference=fast_inference,
    max_lora_rank=lora_rank,
    gpu_memory_utilization=0.1,  # on CPU: the fraction of RAM vLLM's KV cache may use
    vllm_engine_kwargs={"enforce_eager": True},  # no graph compilation: a start in seconds (vLLM only)
)
model = FastLanguageModel.get_peft_model(
    model,
    r=lora_rank,
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    lora_alpha=lora_rank * 2,
    use_gradient_checkpointing="unsloth",
    random_state=3407,
)

# %% Data: GSM8K's columns, made here (no download)
from datasets import Dataset

rows = []
for i in range(1, 17):
    apples, eaten = 3 * i + 4, i
    rows.append(
        {
            "question": f"Tom has {apples} apples and eats {eaten}. How many apples are left?",
            "answer": f"Tom had {apples} apples and ate {eaten}, so {apples} - {eaten} = {apples - eaten}.\n"
            f"#### {apples - eaten}",
        }
    )
dataset = Dataset.from_list(rows)


def extract_hash_answer(text):
    if "####" not in text:
        return None
    return text.split("####")[1].strip()


reasoning_start, reasoning_end = "<start_working_out>", "<end_working_out>"
solution_start, solution_end = "<SOLUTION>", "</SOLUTION>"
system_prompt = f"""You are given a problem.
Think about the problem and provide your working out.
Place it between {reasoning_start} and {reasoning_end}.
Then, provide your solution between {solution_start}{solution_end}"""

dataset = dataset.map(
    lambda x: {
        "prompt": [{"role": "system", "content": system_prompt}, {"role": "user", "content": x["question"]}],
        "answer": extract_hash_answer(x["answer"]),
    }
)

# %% Reward functions: the format, then the answer
import re

match_format = re.compile(
    rf"^[\s]{{0,}}{reasoning_start}.+?{reasoning_end}.*?{solution_start}(.+?){solution_end}[\s]{{0,}}$",
    flags=re.MULTILINE | re.DOTALL,
)
match_numbers = re.compile(solution_start + r".*?([\d\.\,]{1,})", flags=re.MULTILINE | re.DOTALL)


def match_format_exactly(completions, **kwargs):
    return [3.0 if match_format.search(c[0]["content"]) is not None else 0.0 for c in completions]


def match_format_approximately(completions, **kwargs):
    scores = []
    for completion in completions:
        response = completion[0]["content"]
        score = 0.0
        for tag in (reasoning_start, reasoning_end, solution_start, solution_end):
            score += 0.5 if response.count(tag) == 1 else -1.0
        scores.append(score)
    return scores


def check_answer(prompts, completions, answer, **kwargs):
    responses = [completion[0]["content"] for completion in completions]
    guesses = [m.group(1) if (m := match_format.search(r)) is not None else None for r in responses]
    scores = []
    for guess, true_answer in zip(guesses, answer):
        if guess is None:
            scores.append(0.0)
        elif guess.strip() == true_answer.strip():
            scores.append(3.0)
        else:
            try:
                ratio = float(guess) / float(true_answer)
                scores.append(1.0 if 0.9 <= ratio <= 1.1 else -1.5)
            except ValueError:
                scores.append(-1.5)
    return scores


def check_numbers(prompts, completions, answer, **kwargs):
    responses = [completion[0]["content"] for completion in completions]
    guesses = [m.group(1) if (m := match_numbers.search(r)) is not None else None for r in responses]
    scores = []
    for guess, true_answer in zip(guesses, answer):
        try:
            scores.append(1.5 if float(guess.replace(",", "")) == float(true_answer) else -0.5)
        except (AttributeError, ValueError):
            scores.append(0.0)
    return scores


assert (
    match_format_exactly([[{"content": f"{reasoning_start}3+4{reasoning_end}{solution_start}7{solution_end}"}]])[0] == 3
)

# %% The longest prompt (transformers 4.x's apply_chat_template(tokenize=True): the ids, so len() is their number)
lengths = dataset.map(
    lambda x: {"tokens": tokenizer.apply_chat_template(x["prompt"], add_generation_prompt=True, tokenize=True)},
    batched=True,
).map(lambda x: {"length": len(x["tokens"])})["length"]
max_prompt_length = max(lengths) + 1

# %% Train
from trl import GRPOConfig, GRPOTrainer

vllm_settings = {}
if fast_inference:
    from vllm import SamplingParams

    vllm_settings["vllm_sampling_params"] = SamplingParams(
        min_p=0.1, top_p=1.0, top_k=-1, seed=3407, stop=[tokenizer.eos_token], include_stop_str_in_output=True
    )
training_args = GRPOConfig(
    **vllm_settings,
    learning_rate=5e-6,
    weight_decay=0.1,
    warmup_ratio=0.1,
    lr_scheduler_type="cosine",
    optim="adamw_8bit",
    logging_steps=1,
    per_device_train_batch_size=1,
    gradient_accumulation_steps=1,
    num_generations=4,
    max_prompt_length=max_prompt_length,
    max_completion_length=max_seq_length - max_prompt_length,
    max_steps=2,
    save_steps=250,
    max_grad_norm=0.1,
    report_to="none",
    output_dir="outputs",
)
trainer = GRPOTrainer(
    model=model,
    processing_class=tokenizer,
    reward_funcs=[match_format_exactly, match_format_approximately, check_answer, check_numbers],
    args=training_args,
    train_dataset=dataset,
)
trainer.train()
assert trainer.state.global_step == 2

# %% Inference, then save the LoRA and use it
question = "What is the sqrt of 101?"
text = tokenizer.apply_chat_template(
    [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
)
if fast_inference:
    sampling_params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=32)
    base_output = model.fast_generate([text], sampling_params=sampling_params, lora_request=None)[0].outputs[0].text
    print("base model:", base_output)

model.save_lora("grpo_saved_lora")
from safetensors import safe_open

with safe_open("grpo_saved_lora/adapter_model.safetensors", framework="pt") as f:  # A and B of every target
    assert sum("lora_A" in key for key in f.keys()) == sum("lora_B" in key for key in f.keys()) == 7 * 30

messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]
text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
if fast_inference:
    output = model.fast_generate(text, sampling_params=sampling_params, lora_request=model.load_lora("grpo_saved_lora"))
    print("trained LoRA:", output[0].outputs[0].text)
else:
    FastLanguageModel.for_inference(model)
    inputs = tokenizer(text, return_tensors="pt", add_special_tokens=False).to(model.device)
    output = model.generate(**inputs, max_new_tokens=32, temperature=0.8, top_p=0.95, do_sample=True)
    print("trained LoRA:", tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))
    FastLanguageModel.for_training(model)

# %% Save: the LoRA alone, and merged to 16 bit
model.save_pretrained("model")
tokenizer.save_pretrained("model")
model.save_pretrained_merged("model_merged", tokenizer, save_method="merged_16bit")
print("saved: grpo_saved_lora/, model/, model_merged/")
