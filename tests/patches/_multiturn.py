"""The tiny multi-turn world of the GRPO tools / environment / rollout_func tests.

A random model does not write tool calls, so this world gives it a call syntax it writes on its own:
- the tool names are words of the tiny tokenizer's vocabulary ("plus", "answer"); a tool call is the name followed by
  optional `<letter> <digit>` arguments (`plus a 3 b 4`), parsed by a transformers `response_template` (the parser
  TRL's `parse_response` runs), typed by the tool's schema;
- the chat template renders a tool call as that text and a tool result as a user turn (`result 7`), so TRL's checks
  pass (`supports_tool_calling`, prefix-preserving) and `_get_tool_suffix_ids` finds the result's tokens;
- the model (`tool_model`) gets a shared direction added to every token embedding and the LM head rows of EOS and of
  the tool word pointed along the hidden states' mean: both become likely at almost every position, so completions
  are short, tool calls frequent, and rollouts mix finished, truncated, tool-calling and plain rows.
The logits of every other token stay the random model's.
"""

from __future__ import annotations

import torch

import _tiny as T

TOOL_WORDS = ("plus", "answer")
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'tool' -%}"
    "{{ '<|im_start|>user\n' + 'result ' + message['content'] | string + '<|im_end|>\n' }}"
    "{%- else -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] }}"
    "{%- for call in message.get('tool_calls', []) -%}"
    "{{ ' ' + call['function']['name'] }}"
    "{%- for key, value in call['function']['arguments'].items() -%}"
    "{{ ' ' + key + ' ' + value | string }}"
    "{%- endfor -%}"
    "{%- endfor -%}"
    "{{ '<|im_end|>\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)
_NAMES = "|".join(TOOL_WORDS)
RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor_pattern": r"<\|im_start\|>\s*assistant\s*",  # the tiny tokenizer decodes no newlines
    "fields": {
        "tool_calls": {
            "open_pattern": rf"\b(?P<name>{_NAMES})\b",
            "close_pattern": rf"(?=\b(?:{_NAMES})\b)|<\|im_end\|>|$",
            "repeats": True,
            "content": "xml-inline",
            "content_args": {"tag_pattern": r"\b(?P<key>[a-z])\s+(?P<value>\d)"},
            "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}},
        },
        "content": {"close_pattern": r"<\|im_end\|>", "content": "text"},
    },
}
# Likelihood (logit at the mean hidden state) of EOS and of the tool word in `tool_model`
EOS_LOGIT, TOOL_LOGIT = 4.5, 5.0
# LoRA scale of the parity cases: _tiny's adapters (random B, alpha 8) would move the outputs away from these biases
LORA_ALPHA = 1
QUESTIONS = ["what is 3 plus 4 ?", "solve 8 times 9", "hello world", "compute the sum of 2 and 5"]


def tokenizer():
    tok = T.tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    tok.response_template = RESPONSE_TEMPLATE
    return tok


def _mean_hidden(model, tok) -> torch.Tensor:
    ids = tok(" ".join(T.PROMPTS), return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return model.model(input_ids=ids).last_hidden_state[0].mean(0)


def tool_model(word: str = "plus", seed: int = 0):
    """The tiny Llama of _tiny, made to end turns early and to write `word` (a tool name) often."""
    tok = T.tokenizer()
    model = T.tiny_model(seed)
    generator = torch.Generator().manual_seed(seed + 5)
    shared = torch.randn(model.config.hidden_size, generator=generator)
    with torch.no_grad():
        embeddings = model.model.embed_tokens.weight
        embeddings += 3 * shared * embeddings.norm(dim=1).mean() / shared.norm()
        mean = _mean_hidden(model, tok)
        direction = mean / mean.dot(mean)
        model.lm_head.weight[T.EOS_ID] = EOS_LOGIT * direction
        model.lm_head.weight[tok.convert_tokens_to_ids(word)] = TOOL_LOGIT * direction
    return model


def plus(a: int = 0, b: int = 0) -> str:
    """Add two digits.

    Args:
        a: The first digit.
        b: The second digit.
    """
    return str(a + b)


class GuessingGame:
    """Guess a digit: `answer n 7` is a guess; the game says yes or no, and the reward counts the tries."""

    def __init__(self):
        self.secret, self.tries, self.solved = 0, 0, False

    def reset(self, secret: int = 0, **kwargs) -> str:
        self.secret, self.tries, self.solved = secret, 0, False
        return " what is the number ?"

    def answer(self, n: int = 0) -> str:
        """Guess the secret digit.

        Args:
            n: The guess.
        """
        self.tries += 1
        self.solved = self.solved or n == self.secret
        return "yes" if n == self.secret else "no"

    def get_reward(self) -> float:
        return float(self.solved) - 0.25 * self.tries


def conversation(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def dataset(n: int = 8, secrets: bool = False):
    from datasets import Dataset

    rows = {"prompt": [conversation(QUESTIONS[i % len(QUESTIONS)]) for i in range(n)]}
    if secrets:
        rows["secret"] = [i % 3 * 3 for i in range(n)]  # 0 (the default guess wins), 3, 6
    return Dataset.from_dict(rows)


def generation_batch(args, secrets: bool = False) -> list[dict]:
    """One generation batch as TRL's RepeatSampler lays it out: each row `num_generations` times in a row."""
    rows = dataset(args.per_device_train_batch_size * args.steps_per_generation, secrets)
    n_prompts = len(rows) // args.num_generations
    return [dict(rows[i]) for i in range(n_prompts) for _ in range(args.num_generations)]


# --- rollout_func: a two-turn text protocol (the model writes, the game replies, the model writes again) ---------

FEEDBACK = "<|im_start|> user no <|im_end|> <|im_start|> assistant"  # the reply, in the tiny tokenizer's words
TURN_TOKENS = 4


def _sample(model, tok, prompts: list[list[int]], max_new_tokens: int) -> tuple[list[list[int]], list[list[float]]]:
    """Sampled continuations of `prompts` (left-padded batch), cut after their first EOS, with their log-probs."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            max_new_tokens=max_new_tokens,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            output_scores=True,
            return_dict_in_generate=True,
        )
    new = out.sequences[:, width:]
    logps = torch.stack(out.scores, 1).float().log_softmax(-1).gather(-1, new[..., None])[..., 0]
    turns, turn_logps = [], []
    for row, row_logps in zip(new.tolist(), logps.tolist()):
        end = row.index(tok.eos_token_id) + 1 if tok.eos_token_id in row else len(row)
        turns.append(row[:end])
        turn_logps.append(row_logps[:end])
    return turns, turn_logps


def text_game_rollout(prompts, trainer) -> dict:
    """A `rollout_func`: two model turns around a fixed game reply, the reply marked 0 in `env_mask`."""
    tok = trainer.processing_class
    model = trainer.accelerator.unwrap_model(trainer.model)
    prompt_ids = [
        tok.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False) for p in prompts
    ]
    first, first_logps = _sample(model, tok, prompt_ids, TURN_TOKENS)
    reply = tok(FEEDBACK, add_special_tokens=False)["input_ids"]
    second, second_logps = _sample(model, tok, [p + f + reply for p, f in zip(prompt_ids, first)], TURN_TOKENS)
    return {
        "prompt_ids": prompt_ids,
        "completion_ids": [f + reply + s for f, s in zip(first, second)],
        "logprobs": [fl + [0.0] * len(reply) + sl for fl, sl in zip(first_logps, second_logps)],
        "env_mask": [[1] * len(f) + [0] * len(reply) + [1] * len(s) for f, s in zip(first, second)],
    }
