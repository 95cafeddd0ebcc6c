"""PPO's rollout phase, model-free parts: prompts in, responses out, scored; the batch the PPO epochs train on.

Choices:
1. Prompts: a `prompt` column (text, or chat messages rendered with the tokenizer's chat template, as GRPO does), or
   a pre-tokenized `input_ids` column (TRL's PPO examples tokenized the dataset up front); a collator's padded
   `{"input_ids", "attention_mask"}` batch works too. Left-padded to one length per rollout.
2. Generation: HF `generate` between FastLanguageModel.for_inference / for_training (KV cache on, checkpointing
   off), pure sampling at `temperature` (top_k=0, top_p=1: the log-probs the loss uses are exactly the sampler's),
   in chunks of `local_rollout_forward_batch_size`; or the model's vLLM engine when `fast_inference=True` attached
   one (the adapter handed over first by the engine itself). A response ends after its first stop token (kept)
   or at `response_length`; with no stop token (TRL's default) every response runs to `response_length`.
3. Scores: GRPO's conventions. A reward model (`nn.Module`, sequence classification) reads prompt + completion as
   text (chat template for conversations), tokenized with the policy's tokenizer, right-padded, `logits[:, 0]`; a
   reward function is called as `f(prompts=, completions=, completion_ids=, trainer_state=, **other_columns)`; None
   becomes NaN, several sources are summed with `reward_weights` (NaN-skipping).
4. Order: the dataloader yields one rollout's prompts once per micro-step that trains on them (TRL's RepeatSampler,
   as GRPO uses it), so the HF loop's step counting, epochs and resume-time batch skipping stay exact; the
   permutation is reseeded per epoch (`seed + epoch`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import nn
from trl.trainer.utils import RepeatSampler


@dataclass
class RolloutBatch:
    """One rollout on this process: `input_ids` = left-padded prompt (`context_length` columns) + right-padded
    response; per-token tensors are `[R, C]` over the response columns."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    context_length: int
    response_mask: torch.Tensor
    logprobs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor

    def select(self, rows: torch.Tensor) -> RolloutBatch:
        """The given rows, with response columns beyond their longest response dropped."""
        rows = rows.to(self.input_ids.device)
        length = max(int(self.response_mask[rows].sum(1).max().item()), 1)
        width = self.context_length + length
        return RolloutBatch(
            self.input_ids[rows, :width],
            self.attention_mask[rows, :width],
            self.context_length,
            *(getattr(self, f.name)[rows, :length] for f in fields(self)[3:]),
        )

    def state_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_state_dict(cls, state: dict, device) -> RolloutBatch:
        return cls(**{k: v.to(device) if torch.is_tensor(v) else v for k, v in state.items()})


class EpochSampler(RepeatSampler):
    """TRL's RepeatSampler (one rollout's prompts, repeated for every micro-step that trains on them) with an
    epoch-seeded permutation, so a resumed run sees the straight run's order in every epoch."""

    def __init__(self, dataset, rollout_rows: int, micro_steps: int, seed: int):
        super().__init__(dataset, mini_repeat_count=1, batch_size=rollout_rows, repeat_count=micro_steps, seed=seed)

    def set_epoch(self, epoch: int) -> None:
        self.generator.manual_seed(self.seed + epoch)


def is_conversational_prompt(prompt) -> bool:
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict)


def prompt_token_ids(batch, tokenizer) -> tuple[list[list[int]], list]:
    """(token ids per row, the prompts as reward functions see them) from a list of rows or a collated dict."""
    if isinstance(batch, dict):  # a collator's padded batch (e.g. DataCollatorWithPadding)
        ids = [row[mask.bool()].tolist() for row, mask in zip(batch["input_ids"], batch["attention_mask"])]
        return ids, tokenizer.batch_decode(ids, skip_special_tokens=True)
    if "prompt" in batch[0]:
        prompts = [row["prompt"] for row in batch]
        texts = [
            tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
            if is_conversational_prompt(p)
            else p
            for p in prompts
        ]
        return tokenizer(texts, add_special_tokens=False)["input_ids"], prompts
    if "input_ids" in batch[0]:
        ids = [list(row["input_ids"]) for row in batch]
        return ids, tokenizer.batch_decode(ids, skip_special_tokens=True)
    raise ValueError(f"train_dataset rows need a 'prompt' or an 'input_ids' column; got {sorted(batch[0])}.")


def pad(seqs: list[list[int]], pad_id: int, side: str, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention_mask) padded to the longest sequence on `side` ("left" or "right")."""
    width = max(1, max(len(s) for s in seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((len(seqs), width), dtype=torch.long, device=device)
    for i, seq in enumerate(seqs):
        if seq:
            span = slice(width - len(seq), width) if side == "left" else slice(0, len(seq))
            ids[i, span] = torch.tensor(seq, dtype=torch.long, device=device)
            mask[i, span] = 1
    return ids, mask


def stop_token_ids(args, tokenizer) -> list[int]:
    """TRL's rule: `stop_token_id`, else the tokenizer's EOS for stop_token="eos", else none."""
    if args.stop_token_id is not None:
        return [args.stop_token_id]
    if args.stop_token == "eos":
        if tokenizer.eos_token_id is None:
            raise ValueError("stop_token='eos' but the tokenizer has no eos_token_id: set stop_token_id.")
        return [tokenizer.eos_token_id]
    return []


def trim_at_stop(ids: list[int], stop_ids: list[int]) -> list[int]:
    """The response up to and including its first stop token."""
    for i, token in enumerate(ids):
        if token in stop_ids:
            return ids[: i + 1]
    return ids


def generation_config(args, stop_ids: list[int], pad_id: int):
    from transformers import GenerationConfig

    # generate fills every None field from the model's own generation_config, so each sampling field is explicit
    # (a model default such as repetition_penalty=1.1 would otherwise change the sampler the loss assumes), and
    # eos_token_id=[] means "never stop early"
    return GenerationConfig(
        max_new_tokens=args.response_length,
        do_sample=True,
        temperature=args.temperature,
        top_k=0,
        top_p=1.0,
        min_p=0.0,
        typical_p=1.0,
        repetition_penalty=1.0,
        eos_token_id=list(stop_ids),
        pad_token_id=pad_id,
        disable_compile=True,
    )


@torch.no_grad()
def generate_hf(
    model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, config, chunk_size: int, stop_ids: list[int]
) -> list[list[int]]:
    """Sample one response per prompt with HF generate, in chunks (the caller has put the model in inference mode)."""
    responses = []
    for start in range(0, prompt_ids.shape[0], chunk_size):
        out = model.generate(
            input_ids=prompt_ids[start : start + chunk_size],
            attention_mask=prompt_mask[start : start + chunk_size],
            generation_config=config,
        )
        responses += [trim_at_stop(row.tolist(), stop_ids) for row in out[:, prompt_ids.shape[1] :]]
    return responses


def generate_vllm(engine, model, prompt_lists: list[list[int]], args, stop_ids: list[int]) -> list[list[int]]:
    """Sample one response per prompt on the model's vLLM engine (which syncs the current adapter first)."""
    from vllm import SamplingParams

    params = SamplingParams(
        n=1,
        temperature=args.temperature,
        top_p=1.0,
        max_tokens=args.response_length,
        stop_token_ids=list(stop_ids) or None,
        ignore_eos=not stop_ids,
    )
    outputs = engine.generate([{"prompt_token_ids": ids} for ids in prompt_lists], params, model=model)
    engine.sleep()
    return [trim_at_stop(list(out.outputs[0].token_ids), stop_ids) for out in outputs]


def completions_of(prompts: list, texts: list[str]) -> list:
    """Completion texts in the prompts' shape: assistant messages for chat prompts, plain strings otherwise."""
    if prompts and is_conversational_prompt(prompts[0]):
        return [[{"role": "assistant", "content": text}] for text in texts]
    return texts


@torch.no_grad()
def reward_model_scores(reward_model, tokenizer, prompts: list, completions: list, chunk_size: int) -> torch.Tensor:
    """`logits[:, 0]` of a sequence-classification model on prompt + completion text (GRPO's convention)."""
    if prompts and is_conversational_prompt(prompts[0]):
        texts = [tokenizer.apply_chat_template(p + c, tokenize=False) for p, c in zip(prompts, completions)]
    else:
        texts = [p + c for p, c in zip(prompts, completions)]
    device = next(reward_model.parameters()).device
    scores = []
    for start in range(0, len(texts), chunk_size):
        enc = tokenizer(
            texts[start : start + chunk_size],
            return_tensors="pt",
            padding=True,
            padding_side="right",
            add_special_tokens=False,
        ).to(device)
        scores.append(reward_model(**enc).logits[:, 0].float())
    return torch.cat(scores)


def score_completions(
    reward_funcs: list,
    weights,
    tokenizer,
    prompts: list,
    completions: list,
    completion_ids: list[list[int]],
    columns: dict,
    trainer_state,
    chunk_size: int,
):
    """Weighted NaN-skipping sum over the reward sources: `[R]` float32 (CPU)."""
    per_source = []
    for source in reward_funcs:
        if isinstance(source, nn.Module):
            values = reward_model_scores(source, tokenizer, prompts, completions, chunk_size).cpu()
        else:
            out = source(
                prompts=prompts,
                completions=completions,
                completion_ids=completion_ids,
                trainer_state=trainer_state,
                **columns,
            )
            if len(out) != len(prompts):
                raise ValueError(
                    f"reward function {getattr(source, '__name__', source)!r} returned {len(out)} "
                    f"rewards for {len(prompts)} completions: return one per completion."
                )
            values = torch.tensor([float("nan") if r is None else float(r) for r in out], dtype=torch.float32)
        per_source.append(values)
    stacked = torch.stack(per_source, dim=1)
    weights = torch.tensor(weights if weights is not None else [1.0] * len(reward_funcs), dtype=torch.float32)
    return (stacked * weights).nansum(dim=1)
