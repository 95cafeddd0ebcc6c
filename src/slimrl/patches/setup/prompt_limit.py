"""`max_prompt_length`, the prompt limit TRL removed (GRPO 0.26, RLOO 0.27, ORPO/CPO 0.28, DPO 0.29), kept with the
meaning it had for scripts written against TRL 0.2x. A config field of slimrl's (default None: no limit, TRL 1.16's
behaviour); setting it prints one notice saying what it does.

- GRPO/RLOO (TRL <= 0.25): a prompt longer than the limit keeps its last `max_prompt_length` tokens (cut from the
  left: `prompt_ids[:, -max_prompt_length:]` in TRL 0.19-0.21, vLLM's `truncate_prompt_tokens` later). Patched:
  `_tokenize_prompts`, so generation, the old/reference log-probs and the loss all see the kept tokens only.
  Prompts with images are refused rather than cut (cutting would split the image tokens from their pixels).
- DPO (TRL <= 0.28's `tokenize_row`): the tokenized prompt keeps its last `max_prompt_length` tokens, before
  `max_length` truncates prompt + completion as TRL 1.16 does. Patched: `_prepare_dataset` (TRL's own tokenization
  runs first; its filter of prompts that fill `max_length`, which must see the cut prompts, runs after the cut).
  Vision datasets (tokenized in the collator) are refused.
- ORPO/CPO (TRL <= 0.27's `tokenize_row`, `truncation_mode="keep_end"`, its default): when prompt + the longer
  answer exceed `max_length`, the prompt keeps its last `max_prompt_length` tokens; if still too long, each answer
  keeps its first `max_length - max_prompt_length` tokens. Patched: `tokenize_row` (TRL's tokenization with no cut,
  then that cut; TRL 1.16 alone would keep the whole prompt and cut only the answers).
"""

from __future__ import annotations

import copy
import functools
import sys

from ...notices import notice
from ...state import trainer_state

FIELD = ("max_prompt_length", None)  # (name, default), as trainer_setup.Family declares config fields
NAME = FIELD[0]


def check_config(args) -> None:
    """The limit's value, and one notice saying what it does for this trainer."""
    limit = getattr(args, NAME)
    if limit is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"{NAME} must be a positive number of tokens or None, got {limit!r}.")
    notice(
        f"{type(args).__name__}({NAME}={limit}): TRL 1.16 removed it; slimrl keeps its TRL 0.2x meaning: prompts "
        f"longer than {limit} tokens keep their last {limit} tokens."
    )


def keep_last(ids: list, limit: int) -> list:
    return ids[-limit:] if len(ids) > limit else ids


# -- GRPO / RLOO ----------------------------------------------------------------------------------------------------
def make_tokenize_prompts(original):
    @functools.wraps(original)
    def _tokenize_prompts(self, prompts):
        prompt_ids, images, multimodal_fields = original(self, prompts)
        limit = getattr(self.args, NAME)
        if limit is None or all(len(ids) <= limit for ids in prompt_ids):
            return prompt_ids, images, multimodal_fields
        if images is not None or multimodal_fields:
            raise ValueError(
                f"{NAME}={limit}: a prompt with images is {max(map(len, prompt_ids))} tokens long; slimrl cuts text "
                f"prompts only (cutting would separate image tokens from their pixels). Raise {NAME} or set it to None."
            )
        return [keep_last(list(ids), limit) for ids in prompt_ids], images, multimodal_fields

    return _tokenize_prompts


# -- DPO ------------------------------------------------------------------------------------------------------------
def make_prepare_dataset(original):
    @functools.wraps(original)
    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
        limit = getattr(args, NAME, None)
        if limit is None:
            return original(self, dataset, processing_class, args, dataset_name)
        uncut = copy.copy(args)
        uncut.max_length = None  # TRL's filter of over-long prompts runs below, on the cut prompts
        dataset = original(self, dataset, processing_class, uncut, dataset_name)
        dataset = dataset.map(lambda example: {"prompt_ids": keep_last(example["prompt_ids"], limit)})
        if args.max_length is not None and args.truncation_mode == "keep_start":
            max_length = args.max_length  # TRL's rule: a prompt that fills max_length leaves no completion token
            dataset = dataset.filter(lambda example: len(example["prompt_ids"]) < max_length)
        return dataset

    return _prepare_dataset


def refuse_vision_dataset(call) -> None:
    """DPO tokenizes image datasets in its collator, where the limit would not apply: refused, not ignored."""
    dataset = call.arguments.get("train_dataset")
    columns = getattr(dataset, "column_names", None) or []
    if getattr(call.args, NAME, None) is not None and ("image" in columns or "images" in columns):
        raise ValueError(f"{NAME} applies to text datasets; this one has images. Remove {NAME} (or the images).")


# -- ORPO / CPO -----------------------------------------------------------------------------------------------------
def _split(batch: dict, side: str) -> tuple[list, list, list, list]:
    """(prompt ids, prompt mask, answer ids, answer mask) of one side of a tokenized row (labels -100 on the prompt)."""
    ids, mask, labels = batch[f"{side}_input_ids"], batch[f"{side}_attention_mask"], batch[f"{side}_labels"]
    n = next((i for i, label in enumerate(labels) if label != -100), len(labels))
    return ids[:n], mask[:n], ids[n:], mask[n:]


def cut_pair(batch: dict, limit: int, max_length: int) -> dict:
    """TRL 0.2x's ORPO/CPO truncation (keep_end) on a row tokenized without any cut."""
    sides = {side: list(_split(batch, side)) for side in ("chosen", "rejected")}
    longer = max(len(parts[2]) for parts in sides.values())
    prompt = [batch["prompt_input_ids"], batch["prompt_attention_mask"]]
    for parts in (*sides.values(), prompt):
        if len(parts[0]) + longer > max_length:
            parts[0], parts[1] = keep_last(parts[0], limit), keep_last(parts[1], limit)
    out = dict(batch, prompt_input_ids=prompt[0], prompt_attention_mask=prompt[1])
    for side, (p_ids, p_mask, a_ids, a_mask) in sides.items():
        if len(p_ids) + longer > max_length:
            a_ids, a_mask = a_ids[: max_length - limit], a_mask[: max_length - limit]
        out[f"{side}_input_ids"], out[f"{side}_attention_mask"] = p_ids + a_ids, p_mask + a_mask
        out[f"{side}_labels"] = [-100] * len(p_ids) + a_ids
    return out


def record_limit(call) -> None:
    """The limit where ORPO/CPO's `tokenize_row` finds it: TRL tokenizes inside `__init__`, before `self.args`."""
    trainer = call.arguments.get("self")
    if trainer is not None:
        trainer_state(trainer).max_prompt_length = getattr(call.args, NAME, None)


def make_tokenize_row(original):
    @functools.wraps(original)
    def tokenize_row(self, feature, model=None):
        state = trainer_state(self, create=False)
        limit = None if state is None else state.max_prompt_length
        if limit is None or self.is_encoder_decoder:
            return original(self, feature, model)
        max_length = self.max_length
        self.max_length = sys.maxsize  # TRL's tokenization with nothing cut; TRL 0.2x's cut follows
        try:
            batch = original(self, feature, model)
        finally:
            self.max_length = max_length
        return cut_pair(batch, limit, max_length)

    return tokenize_row
