"""`slimrl gkd`: arithmetic conversations → student (model + LoRA) and teacher → eval before → GKDTrainer.train →
adapter, metrics, plot → eval after.

Choices made:
- Same shape as `slimrl grpo` / `slimrl dpo` (grpo.py, preference.py): TRL's TrlParser over GKDConfig (every field a
  flag, `--config run.yaml`), slimrl's model/LoRA flags, cheap checks before any model loads, `PatchFastRL("gkd")`
  before parsing, the LoRA adapter, `metrics.jsonl`, `training_curves.png`, `eval.json`, `slimrl_run.json`.
- The teacher is given explicitly, one of: `--teacher_adapter DIR`, a LoRA adapter on a base of the student's
  vocabulary (what `slimrl grpo` writes), merged into its own copy of that base (the student trains its own new
  adapter, so the two cannot share one base here); or `--teacher_model NAME`, a model of the same vocabulary
  (a Hub id, a folder, or the embedded 'smollm2-135m'). Neither, or both: an error before anything loads.
- Data: the built-in arithmetic task's training prompts as conversations whose assistant turn is the correct
  `<answer>N</answer>` (GKD's supervised data); with TRL's default `lmbda=0.5` about half the steps train on the
  student's own samples instead, scored by the teacher. The held-out split is the GRPO task's, so the greedy accuracy
  before / after is `slimrl grpo`'s, and `eval.json` adds the teacher's on the same prompts: the target the student
  moves toward.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

from slimrl.cli.args import SHORT_RUN_DEFAULTS, DataArguments, ModelArguments, SlimrlArguments, command_parser

# Measured basis: the embedded SmolLM2-135M on the arithmetic task, 2-core CPU (docs/distillation.md)
GKD_CLI_DEFAULTS: dict[str, tuple[object, str]] = {
    **SHORT_RUN_DEFAULTS,
    "output_dir": ("outputs/slimrl-gkd-{task}", "{task} is replaced"),
    "learning_rate": (2e-4, "LoRA on a 135M model needs a far larger step than full fine-tuning's to move in 30 steps"),
    "max_steps": (30, "minutes on a 2-core CPU"),
    "per_device_train_batch_size": (8, "8 conversations per step keep a CPU step to seconds"),
    "max_length": (256, "an arithmetic conversation fits in ~150 tokens; TRL's 1024 only pads"),
    "max_new_tokens": (16, "an answer `<answer>18</answer>` is 8 tokens; TRL's 128 multiplies generation time"),
}
BAR_KEYS = {"loss": "loss", "peak_gb": "peak_memory_gb"}


@dataclass
class DistillTaskArguments(DataArguments):
    """`slimrl gkd`: the teacher."""

    teacher_adapter: str | None = field(
        default=None,
        metadata={
            "help": "A LoRA adapter folder (e.g. written by `slimrl grpo`): the teacher is its base model with the "
            "adapter merged. Give this or --teacher_model."
        },
    )
    teacher_model: str | None = field(
        default=None,
        metadata={
            "help": "A teacher model with the student's vocabulary: a Hub id, a local folder, or 'smollm2-135m'. "
            "Give this or --teacher_adapter."
        },
    )


def apply_patches() -> None:
    from slimrl.fast_language_model import FastLanguageModel
    from slimrl.patches.registry import PatchFastRL

    PatchFastRL("gkd", FastLanguageModel)


def build_gkd_parser():
    from trl.experimental.gkd import GKDConfig

    summary = "Distil a teacher into a LoRA student with GKD (TRL's experimental GKDTrainer on slimrl's memory paths)."
    arguments = (DistillTaskArguments, ModelArguments, SlimrlArguments, GKDConfig)
    return command_parser(arguments, "slimrl gkd", summary, GKD_CLI_DEFAULTS)


def check_task_args(task_args, model_args) -> None:
    if (task_args.teacher_adapter is None) == (task_args.teacher_model is None):
        raise ValueError(
            "slimrl gkd needs one teacher: --teacher_adapter DIR (a LoRA adapter, e.g. from `slimrl grpo`) or "
            "--teacher_model NAME (a model with the student's vocabulary), not "
            + ("both." if task_args.teacher_adapter else "neither.")
        )
    if task_args.teacher_adapter and not os.path.isfile(os.path.join(task_args.teacher_adapter, "adapter_config.json")):
        raise ValueError(f"--teacher_adapter {task_args.teacher_adapter!r} holds no adapter (adapter_config.json)")
    if task_args.dataset_name:
        raise ValueError(
            "--dataset_name: slimrl gkd trains on the built-in arithmetic task; for your own conversations use "
            "GKDTrainer after PatchFastRL('gkd') (docs/distillation.md)."
        )
    if model_args.fast_inference:
        raise ValueError("--fast_inference: GKDTrainer generates with the training model; it has no vLLM mode.")


def parse_gkd_args(argv: list[str]):
    """(task_args, model_args, training_args) for `slimrl gkd` (grpo's conventions: cli/args.py)."""
    from slimrl.cli.args import parse_online_args

    task_args, model_args, training_args = parse_online_args(build_gkd_parser(), argv)
    check_task_args(task_args, model_args)
    return task_args, model_args, training_args


def build_distill_task(task_args, seed: int):
    """The arithmetic `Task`, its training prompts as conversations answered correctly (the `messages` column)."""
    from datasets import Dataset

    from slimrl.tasks import get_builtin_task

    options = {k: getattr(task_args, k) for k in ("max_operand", "operations", "num_examples")}
    task = get_builtin_task(
        task_args.task,
        num_train_samples=task_args.num_train_samples or 1000,
        num_eval_samples=task_args.num_eval_samples,
        seed=seed,
        **options,
    )
    rows = [
        {"messages": [*row["prompt"], {"role": "assistant", "content": f"<answer>{row['answer']}</answer>"}]}
        for row in task.train_dataset.to_list()
    ]
    task.train_dataset = Dataset.from_list(rows)
    return task


def load_teacher(task_args, model_args):
    from slimrl.cli.modeling import load_adapter, load_base

    if task_args.teacher_model is not None:
        teacher, _ = load_base(task_args.teacher_model, model_args.max_seq_length, model_args.dtype)
        return teacher, task_args.teacher_model
    peft_model, _, info = load_adapter(task_args.teacher_adapter, dtype=model_args.dtype)
    base = info.get("model_name_or_path") or peft_model.peft_config["default"].base_model_name_or_path
    return peft_model.merge_and_unload(), f"{base} + {task_args.teacher_adapter}"


def distill_panels(rows: list[dict]) -> list[tuple[str, list[str]]]:
    return [("divergence (loss)", ["loss"]), ("gradient norm", ["grad_norm"])]


def run_gkd(task_args, model_args, training_args) -> dict:
    from trl.experimental.gkd import GKDTrainer

    from slimrl.cli.training_run import RunSpec, evaluate_task, run_training

    wall0 = time.perf_counter()
    task = build_distill_task(task_args, training_args.seed)
    out = training_args.output_dir
    print(f"[slimrl] gkd on {task.name}: {len(task.train_dataset)} train rows; output_dir {out}", flush=True)
    teacher, teacher_name = load_teacher(task_args, model_args)
    max_new_tokens = training_args.max_new_tokens
    evals = {}

    def make_trainer(model, tokenizer, callbacks):
        evals["teacher"] = evaluate_task(teacher, tokenizer, task, task_args, max_new_tokens, "of the teacher")
        return GKDTrainer(
            model=model,
            teacher_model=teacher,
            args=training_args,
            train_dataset=task.train_dataset,
            processing_class=tokenizer,
            callbacks=callbacks,
        )

    run_info = {"algorithm": "gkd", "teacher": teacher_name}
    spec = RunSpec(make_trainer, f"GKD {task.name}", max_new_tokens, run_info, BAR_KEYS, distill_panels)
    summary = run_training(task, spec, task_args, model_args, training_args, wall0)
    return add_teacher_eval(out, summary, evals["teacher"])


def add_teacher_eval(out: str, summary: dict, teacher_eval) -> dict:
    """The teacher's accuracy on the same prompts added to `eval.json`: the target the student moves toward."""
    if teacher_eval is not None:
        summary["accuracy_teacher"], summary["eval_teacher"] = teacher_eval["accuracy"], teacher_eval
        with open(os.path.join(out, "eval.json"), "w") as f:
            json.dump(summary, f, indent=2)
        print(f"[slimrl] teacher accuracy {teacher_eval['accuracy']:.3f} on the same prompts", flush=True)
    return summary
