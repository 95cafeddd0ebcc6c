"""Stock accepts => patched accepts: every documented dataset format (tests/patches/_formats.py), every patched trainer.

Each (trainer, format) pair builds the trainer on a tiny model twice, stock TRL (unpatched) and after
`PatchFastRL(trainer)`, and takes one training step through the trainer's own `training_step` on the first batch of its
own dataloader. Required:
- stock builds and steps => patched builds and steps, on the same prepared dataset and the same batch (exact). The
  numbers of the step are the parity suites' business (test_implicit_prompt_parity.py for the implicit-prompt forms);
- stock fails => patched fails, either with slimrl's data check (the trainer, the columns it needs and those it has)
  or with stock's own error, same type and message; a bare `KeyError` from stock (a column name, nothing else) must
  become slimrl's message: where stock fails, slimrl's message is at least as clear;
- what stock trains on is pinned (STOCK_TRAINS, the table of docs/preference-data.md).
Arguments that make stock read the rows through the user's code (SFT's `formatting_func` and `skip_prepare_dataset`,
GRPO's `environment_factory`) are walked too. The negative controls put back the two mistakes this test exists for.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from slimrl.patches.setup import data_checks

import _formats as F
import _orpo_cpo_parity as O
import _parity as P
import _pref_parity as H
import _rl_parity as R
import _tiny as T

ALGORITHMS = ("grpo", "rloo", "dpo", "kto", "sft", "reward", "orpo", "cpo")
LORA = ("dpo", "kto", "rloo")  # a reference model: the adapter-disabled policy (a full copy needs a model on disk)


def trl_classes(algorithm: str):
    if algorithm in ("grpo", "rloo"):
        return R.trl_classes(algorithm)
    if algorithm in ("orpo", "cpo"):
        return O.trl_classes(algorithm)
    return H.trl_classes(algorithm)


def build(algorithm: str, train_dataset, output_dir: str, config: dict | None = None, **trainer_kwargs):
    """The trainer, built in the current patch state on a fresh tiny model (one step's worth of rows per batch)."""
    config_cls, trainer_cls = trl_classes(algorithm)
    kw = dict(output_dir=output_dir, bf16=False, report_to="none", save_strategy="no", learning_rate=1e-3, seed=0)
    kw.update(per_device_train_batch_size=4, dataloader_pin_memory=False, **(config or {}))
    if algorithm in ("grpo", "rloo"):
        kw.update(num_generations=2, max_completion_length=4)
        trainer_kwargs["reward_funcs"] = R.reward_ids
    else:
        kw.setdefault("max_length", 48)
    if algorithm in LORA:
        trainer_kwargs["peft_config"] = T.lora_config()
    model = H.tiny_reward_model(0) if algorithm == "reward" else T.tiny_model(0)
    torch.manual_seed(0)
    trainer_kwargs.setdefault("processing_class", T.tokenizer())
    return trainer_cls(model=model, args=config_cls(**kw), train_dataset=train_dataset, **trainer_kwargs)


@dataclass
class Outcome:
    failed_at: str | None  # None (built and stepped), "init" or "step"
    error: BaseException | None = None
    rows: dict | None = None  # the train_dataset the trainer prepared
    batch: Any = None  # the first batch it trained on


def attempt(algorithm: str, train_dataset, output_dir: str, **build_kwargs) -> Outcome:
    """Build and step in the current patch state; what failed where, or what the step saw."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            trainer = build(algorithm, train_dataset, output_dir, **build_kwargs)
        except Exception as exc:  # noqa: BLE001 - the outcome is compared, not hidden
            return Outcome("init", exc)
        try:
            trainer.model.train()
            trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train otherwise
            torch.manual_seed(0)
            batch = next(iter(trainer.get_train_dataloader()))
            seen = copy.deepcopy(batch)  # GRPO/RLOO consume their generation batch
            assert torch.isfinite(trainer.training_step(trainer.model, batch, None))
        except Exception as exc:  # noqa: BLE001
            return Outcome("step", exc)
    return Outcome(None, rows=trainer.train_dataset.to_dict(), batch=seen)


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def assert_patched_as_permissive(algorithm: str, make_dataset, output_dir: str, **build_kwargs) -> Outcome:
    with P.stock_state():
        stock = attempt(algorithm, make_dataset(), output_dir, **build_kwargs)
    with P.patched_state(algorithm):
        patched = attempt(algorithm, make_dataset(), output_dir, **build_kwargs)
    if stock.failed_at is None:
        assert patched.failed_at is None, f"stock trains on it, patched fails at {patched.failed_at}: {patched.error!r}"
        assert same(stock.rows, patched.rows), "the prepared train_dataset differs"
        assert same(stock.batch, patched.batch), "the first batch differs"
        return stock
    assert patched.failed_at is not None, f"stock fails ({stock.error!r}) but patched trains on it"
    trainer = trl_classes(algorithm)[1].__name__
    from_check = isinstance(patched.error, ValueError) and str(patched.error).startswith(
        f"{trainer}: train_dataset has the columns"
    )
    if not from_check:
        assert not isinstance(stock.error, KeyError), f"stock's bare {stock.error!r} left unexplained"
        assert (type(patched.error), str(patched.error)) == (type(stock.error), str(stock.error)), (
            f"stock fails with {stock.error!r}, patched with {patched.error!r}"
        )
    return stock


def _both(*types: str) -> frozenset[str]:
    return frozenset(f"{flavour}_{t}" for flavour in ("standard", "conversational") for t in types)


# What stock TRL 1.16 trains on, per trainer (docs/preference-data.md lists the same); the walk checks it is so
PREFERENCE = _both("preference", "implicit_preference")
STOCK_TRAINS = {
    "grpo": _both("prompt_only", "prompt_completion", "preference", "unpaired_preference"),
    "dpo": PREFERENCE,
    "kto": PREFERENCE | _both("unpaired_preference"),
    "sft": _both("language_modeling", "prompt_completion", "unpaired_preference")
    | {"conversational_sharegpt", "tokenized_language_modeling"},
    "reward": PREFERENCE | {"tokenized_preference", "tokenized_pairs", "tokenized_pairs_legacy"},
    "orpo": PREFERENCE,
}
STOCK_TRAINS.update(rloo=STOCK_TRAINS["grpo"], cpo=STOCK_TRAINS["orpo"])


@pytest.mark.parametrize("fmt", F.FORMATS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_patched_accepts_what_stock_accepts(algorithm, fmt, tmp_path, unpatched):
    stock = assert_patched_as_permissive(algorithm, lambda: F.dataset(fmt), str(tmp_path))
    expected = fmt in STOCK_TRAINS[algorithm]
    assert (stock.failed_at is None) == expected, (
        f"stock {algorithm} {'no longer trains' if expected else 'now trains'} on {fmt} ({stock.error!r}): "
        "update STOCK_TRAINS and docs/preference-data.md"
    )


def _question_rows():
    from datasets import Dataset

    return Dataset.from_dict({"question": F.PROMPTS[:4], "answer": F.GOOD[:4]})


def test_sft_formatting_func_reads_any_columns(tmp_path, unpatched):
    def as_text(row):
        return f"{row['question']} {row['answer']}"

    stock = assert_patched_as_permissive("sft", _question_rows, str(tmp_path), formatting_func=as_text)
    assert stock.failed_at is None, stock.error


def test_sft_skip_prepare_dataset_leaves_the_rows_to_the_collator(tmp_path, unpatched):
    tokenizer = T.tokenizer()

    def collate(rows):
        batch = tokenizer([f"{r['question']} {r['answer']}" for r in rows], padding=True, return_tensors="pt")
        return {**batch, "labels": batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)}

    config = dict(dataset_kwargs={"skip_prepare_dataset": True}, remove_unused_columns=False)
    stock = assert_patched_as_permissive("sft", _question_rows, str(tmp_path), config=config, data_collator=collate)
    assert stock.failed_at is None, stock.error


class AddingEnvironment:
    """An environment that owns the prompts (its rows need no `prompt` column) and offers one tool."""

    def reset(self, **kwargs) -> None:
        return None

    def add(self, a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: The first number.
            b: The second number.
        """
        return a + b


def test_grpo_environment_factory_needs_no_prompt_column(tmp_path, unpatched):
    from pathlib import Path

    import trl

    tokenizer = T.tokenizer()
    tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()  # tools
    stock = assert_patched_as_permissive(
        "grpo", _question_rows, str(tmp_path), environment_factory=AddingEnvironment, processing_class=tokenizer
    )
    assert stock.failed_at is None, stock.error


def test_negative_control_a_stricter_check_fails_the_walk(tmp_path, unpatched, monkeypatch):
    """ORPO limited to explicit prompts (the check before TRL's implicit prompts were counted) refuses what stock
    trains on."""
    monkeypatch.setitem(data_checks.DATASET_FORMS, "orpo", (data_checks.EXPLICIT_PREFERENCE,))
    with pytest.raises(AssertionError, match="stock trains on it, patched fails at init"):
        assert_patched_as_permissive("orpo", lambda: F.dataset("standard_implicit_preference"), str(tmp_path))


def test_negative_control_a_form_stock_refuses_leaves_its_bare_error(tmp_path, unpatched, monkeypatch):
    """DPO told that tokenized prompt_ids/chosen_ids/rejected_ids pass: stock's bare KeyError reaches the user."""
    forms = (*data_checks.PREFERENCE, ("prompt_ids", "chosen_ids", "rejected_ids"))
    monkeypatch.setitem(data_checks.DATASET_FORMS, "dpo", forms)
    with pytest.raises(AssertionError, match="left unexplained"):
        assert_patched_as_permissive("dpo", lambda: F.dataset("tokenized_preference"), str(tmp_path))
