"""Unsloth's Gemma 3 vision GRPO notebook (python_scripts/Gemma3_(4B)-Vision-GRPO.py) runs with the import changed to
slimrl, in a fresh interpreter with patching on import (as Unsloth patches TRL): the model id replaced by a tiny
saved Gemma 3, the MathVista download by drawn images, 2 steps, and `.to("cuda")` dropped. Everything else is the
notebook's code: FastVisionModel's keywords, the dataset's `prompt` / `image` / `answer` columns, both rewards, the
GRPOConfig (8-bit AdamW, sequence-level ratios, dr_grpo), for_inference + processor(image, text) + generate, and
saving the adapter. One change more: both rewards read a completion's text (`completion[0]["content"]`): the notebook's
rewards expect strings, but TRL 1.16 hands conversational completions over as message lists (the notebook skips its
string-prompt branch for TRL >= 0.24), and `re.findall` raises on a list with or without slimrl."""

import os
import subprocess
import sys

import pytest

import slimrl
from slimrl.patches.on_import import AUTO_PATCH_OFF
from slimrl.testing_vision import save_tiny_vlm

NOTEBOOK = r"""
from slimrl import FastVisionModel
import torch

model, tokenizer = FastVisionModel.from_pretrained(
    MODEL,
    load_in_4bit = False,
    use_gradient_checkpointing = "unsloth",
)
model = FastVisionModel.get_peft_model(
    model,
    finetune_vision_layers     = False,
    finetune_language_layers   = True,
    finetune_attention_modules = True,
    finetune_mlp_modules       = True,
    r = 16,
    lora_alpha = 16,
    lora_dropout = 0,
    bias = "none",
    random_state = 3407,
    use_rslora = False,
    loftq_config = None,
    use_gradient_checkpointing = "unsloth",
)
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer
from slimrl.testing_vision import draw_shapes

dataset = Dataset.from_list(
    [{"question": "how many squares", "answer": str(n), "decoded_image": draw_shapes(n, seed=n)} for n in (1, 2, 3, 4)]
)
REASONING_START = "<REASONING>"
REASONING_END = "</REASONING>"
SOLUTION_START = "<SOLUTION>"
SOLUTION_END = "</SOLUTION>"

def make_conversation(example):
    text_content = (
        f"{example['question']}, provide your reasoning between {REASONING_START} and {REASONING_END} "
        f"and then your final answer between {SOLUTION_START} and (put a float here) {SOLUTION_END}"
    )
    prompt = [
        {
            "role": "user",
            "content": [
                {"type": "image"},
                {"type": "text", "text": text_content},
            ],
        },
    ]
    return {"prompt": prompt, "image": example["decoded_image"], "answer": example["answer"]}

train_dataset = dataset.map(make_conversation)
train_dataset = train_dataset.remove_columns("image")
train_dataset = train_dataset.rename_column("decoded_image", "image")

def formatting_reward_func(completions,**kwargs):
    import re
    thinking_pattern = f'{REASONING_START}(.*?){REASONING_END}'
    answer_pattern = f'{SOLUTION_START}(.*?){SOLUTION_END}'
    scores = []
    for completion in completions :
      completion = completion[0]["content"]
      score = 0
      thinking_matches = re.findall(thinking_pattern, completion, re.DOTALL)
      answer_matches = re.findall(answer_pattern, completion, re.DOTALL)
      if len(thinking_matches) == 1 :
        score +=1.0
      if len(answer_matches) == 1 :
        score +=1.0
      scores.append(score)
    return scores

def correctness_reward_func(prompts, completions, answer, **kwargs) -> list[float]:
    import re
    answer_pattern = f'{SOLUTION_START}(.*?){SOLUTION_END}'
    responses = [re.findall(answer_pattern, completion[0]["content"], re.DOTALL) for completion in completions]
    return [2.0 if len(r)==1 and a == r[0].replace('\n','') else 0.0 for r, a in zip(responses, answer)]

training_args = GRPOConfig(
    learning_rate = 5e-6,
    adam_beta1 = 0.9,
    adam_beta2 = 0.99,
    weight_decay = 0.001,
    warmup_ratio = 0.1,
    lr_scheduler_type = "cosine",
    optim = "adamw_8bit",
    logging_steps = 1,
    per_device_train_batch_size = 1,
    gradient_accumulation_steps = 2,
    num_generations = 4,
    max_prompt_length = 1024,
    max_completion_length = 8,
    importance_sampling_level = "sequence",
    mask_truncated_completions = False,
    loss_type = 'dr_grpo',
    max_steps = 2,
    save_steps = 60,
    max_grad_norm = 0.1,
    report_to = "none",
    output_dir = OUTPUT,
)
trainer = GRPOTrainer(
    model = model,
    args = training_args,
    processing_class = tokenizer,
    reward_funcs = [formatting_reward_func, correctness_reward_func],
    train_dataset = train_dataset,
)
trainer.train()
FastVisionModel.for_inference(model)
image = dataset[1]["decoded_image"]
instruction = "how many squares"
messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": instruction}]}]
input_text = tokenizer.apply_chat_template(messages, add_generation_prompt = True)
inputs = tokenizer(image, input_text, add_special_tokens = False, return_tensors = "pt")
result = model.generate(**inputs, max_new_tokens = 8, use_cache = True, temperature = 1.0, top_p = 0.95, top_k = 64)
model.save_pretrained(OUTPUT + "/gemma_3_lora")
tokenizer.save_pretrained(OUTPUT + "/gemma_3_lora")

from slimrl.patches.scoring.shared_prefix import shared_prefix_stats
stats = shared_prefix_stats(trainer)
print("STEPS", trainer.state.global_step, "PATCHED", "peak_memory_gb" in trainer.state.log_history[0])
print("IMAGES", stats.images_given, stats.images_encoded, "GENERATED", result.shape[1] > inputs["input_ids"].shape[1])
"""


@pytest.mark.slow
def test_gemma3_vision_grpo_notebook_runs_with_the_import_changed(tmp_path):
    model = save_tiny_vlm(tmp_path / "model", "gemma3")
    environ = {k: v for k, v in os.environ.items() if k != AUTO_PATCH_OFF}
    source = os.path.dirname(os.path.dirname(slimrl.__file__))
    environ["PYTHONPATH"] = os.pathsep.join([source, *filter(None, [environ.get("PYTHONPATH")])])
    code = f"MODEL, OUTPUT = {str(model)!r}, {str(tmp_path / 'out')!r}\n" + NOTEBOOK
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env={**environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert "STEPS 2 PATCHED True" in out.stdout
    given, encoded = (int(x) for x in out.stdout.split("IMAGES ")[1].split()[:2])
    # a rollout's 4 rows show one image, encoded once; the loss forwards hold one row each (batch size 1)
    assert 0 < encoded < given
    assert "GENERATED True" in out.stdout
    assert os.path.exists(tmp_path / "out" / "gemma_3_lora" / "adapter_config.json")
