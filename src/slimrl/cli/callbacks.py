"""TrainerCallbacks for the training commands: a one-line tqdm progress bar and a JSONL metrics log.

Choices made: the bar replaces transformers' ProgressCallback (which prints every log dict) and shows a few metrics
(GRPO: reward, and KL only when TRL logs it, i.e. beta != 0; DPO/ORPO/KTO: loss, reward margin and accuracy), the
running count of reward-function failures skipped under slimrl_reward_errors="skip" (once there is one), and wall
seconds per optimizer step. The metrics file gets one JSON object per
`on_log` call (step, epoch and every logged value), flushed immediately so a killed run still leaves its history;
a resumed run keeps the rows up to its checkpoint's step and appends.
"""

from __future__ import annotations

import json
import math
import os
import time

from transformers import TrainerCallback


def _fmt(value) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) and math.isfinite(value) else "n/a"


GRPO_BAR_KEYS = {"reward": "reward", "kl": "kl"}
PREFERENCE_BAR_KEYS = {"loss": "loss", "margin": "rewards/margins", "acc": "rewards/accuracies", "kl": "kl"}


class ProgressBarCallback(TrainerCallback):
    def __init__(self, desc: str = "GRPO", keys: dict[str, str] | None = None):
        self.desc = desc
        self.keys = dict(GRPO_BAR_KEYS if keys is None else keys)  # bar label -> logged metric name
        self.bar = None
        self.last_time = None
        self.seconds_per_step = None
        self.postfix: dict[str, str] = {}
        self.reward_errors = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=state.max_steps, desc=self.desc, dynamic_ncols=True)
        self.last_time = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        self.seconds_per_step = now - self.last_time
        self.last_time = now
        if self.bar is not None:
            self.postfix["s/step"] = f"{self.seconds_per_step:.1f}"
            self.bar.set_postfix(self.postfix, refresh=False)
            self.bar.update(1)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.bar is None or not logs or not any(key in logs for key in self.keys.values()):
            return
        errors = sum(v for k, v in logs.items() if k.startswith("rewards/") and k.endswith("/errors"))
        if errors:  # a per-step mean of per-call counts: its running sum shows that (and roughly how often) it happens
            self.reward_errors += errors
            self.postfix["reward errs"] = f"{self.reward_errors:.0f}"
        for label, key in self.keys.items():
            if key in logs:  # e.g. KL only when TRL logs it (beta != 0)
                self.postfix[label] = _fmt(logs.get(key))
        self.bar.set_postfix(self.postfix)

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class JsonlMetricsCallback(TrainerCallback):
    def __init__(self, path: str):
        self.path = path

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            # a resumed run keeps the history up to its checkpoint's step (rows after it are re-logged)
            kept = (
                [r for r in read_metrics(self.path) if r.get("step", 0) <= state.global_step]
                if state.global_step and os.path.isfile(self.path)
                else []
            )
            with open(self.path, "w") as f:
                f.writelines(json.dumps(r, allow_nan=True) + "\n" for r in kept)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        row = {"step": state.global_step, "epoch": state.epoch}
        row.update({k: v for k, v in logs.items() if isinstance(v, (int, float, str, bool)) or v is None})
        with open(self.path, "a") as f:
            f.write(json.dumps(row, allow_nan=True) + "\n")


def read_metrics(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
