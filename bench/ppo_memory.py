"""Peak memory of slimrl's PPO against the four-model set-up PPO trainers build, same batch and lengths.

    PYTHONPATH=src python bench/ppo_memory.py --threads 1 --markdown                 # the README table (CPU)
    PYTHONPATH=src python bench/ppo_memory.py --device cuda --markdown               # the same on a GPU
    PYTHONPATH=src python bench/ppo_memory.py --quick                                # smoke run, tiny sizes

Choices:
* Arms, each in its own process (this script re-invoked with `--child`), one after the other, threads pinned:
  - `four`: what TRL's PPO (<= 1.12, `trl.experimental.ppo`) built: a full policy and a full value model
    (`AutoModelForSequenceClassification`, num_labels=1), both trained by one AdamW, a frozen reference copy of the
    policy and a frozen reward model (sequence classification), all of the same shape; full `[B, T, V]` logits as
    its loop kept them: generation with `output_scores=True` (the `[B, C, V]` sampling logits give the old
    log-probs), the reference forward's logits, the training forward's logits (log-probs by a row-wise
    log-sum-exp, TRL's `selective_log_softmax` before its Triton kernel; entropy from the full softmax, TRL's
    metric), and the critic through the value model's backbone with every hidden state kept
    (`output_hidden_states=True`, TRL's `PolicyAndValueWrapper`). TRL is no longer shipping it, so this script runs
    that loop itself (with slimrl.ppo.core's math, the same as TRL's).
  - `slimrl`: `slimrl.PPOTrainer` with a LoRA policy (r=16, every projection): one base model (the reference is the
    adapter-disabled base, the critic a value adapter + head on it), the same frozen reward model.
  - `slimrl-full`: `slimrl.PPOTrainer` with a full-model policy: the reference is a frozen copy carrying the value
    adapter (two model bodies), the same reward model.
* Model: a random Llama of a real shape with a large vocabulary (default V=152064 as Qwen2.5, hidden 512, 4 layers,
  8 heads, MLP 1536, untied head), fp32. Prompts are random filler tokens of exactly `--prompt` tokens; a random
  model never stops early and no stop token is set, so every response has exactly `--response` tokens.
* Same geometry in every arm: rollouts of `--rows` prompts (all in one no-grad forward), `--epochs` PPO epochs of
  one optimizer step each, micro-batches of `--micro` rows (accumulation rows / micro), no gradient checkpointing
  (TRL's PPO loop never enabled it), `--steps` rollouts.
* Memory: CPU = peak RSS of the whole process (VmHWM polled every 5 ms, bench/_common.OverallPeak), models
  included; CUDA = `torch.cuda.max_memory_allocated`. "static" is the memory right before training starts (models,
  optimizer not yet allocated). The ratio is slimrl's peak over the four-model peak (target <= 0.4).
* `--mem_limit_gb` (CPU, default 18): a watchdog stops an arm whose RSS passes it (bench/_common.py's),
  and its peak is reported as a bound.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (  # noqa: E402
    GiB,
    OverallPeak,
    pin_threads,
    render,
    results_path,
    run_self,
    start_watchdog,
    write_results,
)

ARMS = ("four", "slimrl", "slimrl-full")
SHAPE = {"vocab": 152064, "hidden": 512, "layers": 4, "heads": 8, "intermediate": 1536}
QUICK_SHAPE = {"vocab": 4096, "hidden": 64, "layers": 2, "heads": 4, "intermediate": 128}
QUICK = {"rows": 4, "micro": 2, "prompt": 16, "response": 16}
TEMPERATURE = 0.7  # TRL's PPOConfig default


def model_config(shape: dict, num_labels: int | None = None):
    from slimrl.testing import tiny_llama_config

    extra = {} if num_labels is None else {"num_labels": num_labels}
    return tiny_llama_config(
        vocab_size=shape["vocab"],
        hidden_size=shape["hidden"],
        num_layers=shape["layers"],
        num_heads=shape["heads"],
        num_kv_heads=shape["heads"],
        intermediate_size=shape["intermediate"],
        max_position_embeddings=4096,
        **extra,
    )


def build(shape: dict, seed: int, kind: str, device: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    torch.manual_seed(seed)
    if kind == "causal":
        model = AutoModelForCausalLM.from_config(model_config(shape))
        model.generation_config.pad_token_id = 0
    else:
        model = AutoModelForSequenceClassification.from_config(model_config(shape, num_labels=1))
    return model.to(device)


def prompt_ids(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.randint(200, vocab, (n, length), generator=generator).tolist()


def row_logprobs(logits, tokens):
    """Old TRL's `selective_log_softmax` for fp32: gather minus a row-by-row log-sum-exp over the full logits."""
    import torch

    picked = torch.gather(logits, -1, tokens.unsqueeze(-1)).squeeze(-1)
    return picked - torch.stack([torch.logsumexp(row, dim=-1) for row in logits])


def critic_values(value_model, ids, context: int):
    backbone = getattr(value_model, value_model.base_model_prefix)
    hidden = backbone(input_ids=ids, output_hidden_states=True).hidden_states[-1]
    return value_model.score(hidden).squeeze(-1)[:, context - 1 : -1]


def four_rollout(policy, ref, value, reward, prompts, a):
    """One no-grad rollout as TRL's PPO ran it: (responses, query_responses, old log-probs, values, advantages,
    returns)."""
    import torch

    from slimrl.ppo import core

    with torch.no_grad():
        out = policy.generate(
            prompts,
            do_sample=True,
            temperature=TEMPERATURE,
            top_k=0,
            top_p=1.0,
            max_new_tokens=a.response,
            min_new_tokens=a.response,
            eos_token_id=[],
            return_dict_in_generate=True,
            output_scores=True,
        )
        query_responses = out.sequences
        responses = query_responses[:, a.prompt :]
        logits = torch.stack(out.scores, 1)  # TRL's batch_generation kept the [B, C, V] sampling logits
        logprobs = row_logprobs(logits / TEMPERATURE, responses)
        del logits, out
        ref_logits = ref(query_responses).logits[:, a.prompt - 1 : -1] / TEMPERATURE
        ref_logprobs = row_logprobs(ref_logits, responses)
        del ref_logits
        values = critic_values(value, query_responses, a.prompt)
        scores = reward(query_responses).logits[:, 0]
        mask = torch.ones_like(logprobs)
        kl = core.kl_estimate(logprobs, ref_logprobs, "k1")
        rewards, _ = core.token_rewards(kl, scores, mask, 0.05)
        advantages, returns = core.gae(rewards, values, mask, 1.0, 0.95)
        advantages = core.masked_whiten(advantages, mask)
    return responses, query_responses, logprobs, values, advantages, returns


def four_train(policy, value, optimizer, rollout, a):
    import torch

    from slimrl.ppo import core

    responses, query_responses, logprobs, values, advantages, returns = rollout
    for _ in range(a.epochs):
        for start in range(0, a.rows, a.micro):
            rows = slice(start, start + a.micro)
            logits = policy(query_responses[rows]).logits[:, a.prompt - 1 : -1]
            logits = logits / TEMPERATURE
            new_logprobs = row_logprobs(logits, responses[rows])
            vpred = critic_values(value, query_responses[rows], a.prompt)
            mask = torch.ones_like(new_logprobs)
            pg_loss, _ = core.policy_loss(new_logprobs, logprobs[rows], advantages[rows], mask, 0.2)
            vf_loss, _ = core.value_loss(vpred, values[rows], returns[rows], mask, 0.2)
            ((pg_loss + 0.1 * vf_loss) * a.micro / a.rows).backward()
            with torch.no_grad():  # TRL's entropy metric, from the full softmax
                probs = torch.softmax(logits, dim=-1)
                (torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)).mean()
            del logits, probs
        optimizer.step()
        optimizer.zero_grad()


def child_four(a, shape: dict, device: str, mark) -> None:
    import datasets  # noqa: F401  (TRL's PPO lived in trl: the same libraries are loaded in every arm)
    import torch
    import trl.trainer.base_trainer  # noqa: F401

    policy = build(shape, 0, "causal", device)
    ref = copy.deepcopy(policy).eval().requires_grad_(False)
    value, reward = build(shape, 1, "seqcls", device), build(shape, 2, "seqcls", device).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW([*policy.parameters(), *value.parameters()], lr=1e-6)
    prompts = torch.tensor(prompt_ids(a.rows, a.prompt, shape["vocab"]), device=device)
    mark("static")
    for _ in range(a.steps):
        four_train(policy, value, optimizer, four_rollout(policy, ref, value, reward, prompts, a), a)
        mark("step")


def child_slimrl(a, shape: dict, device: str, lora: bool, mark) -> None:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback

    from slimrl.ppo import PPOConfig, PPOTrainer
    from slimrl.testing import tiny_tokenizer

    policy, reward = build(shape, 0, "causal", device), build(shape, 2, "seqcls", device)
    data = Dataset.from_dict({"input_ids": prompt_ids(4 * a.rows, a.prompt, shape["vocab"])})
    args = PPOConfig(
        output_dir=tempfile.mkdtemp(prefix="slimrl-ppo-bench-"),
        per_device_train_batch_size=a.micro,
        gradient_accumulation_steps=a.rows // a.micro,
        num_ppo_epochs=a.epochs,
        max_steps=a.steps * a.epochs,
        response_length=a.response,
        local_rollout_forward_batch_size=a.rows,
        temperature=TEMPERATURE,
        learning_rate=1e-6,
        use_cpu=device == "cpu",
        bf16=False,
        gradient_checkpointing=False,
        save_strategy="no",
        report_to=[],
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
    )
    lora_config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear") if lora else None
    # the reward model reads decoded text re-tokenized: filler words of the tiny tokenizer are one token each
    trainer = PPOTrainer(
        args=args,
        processing_class=tiny_tokenizer(shape["vocab"]),
        model=policy,
        reward_model=reward,
        train_dataset=data,
        peft_config=lora_config,
    )

    class Mark(TrainerCallback):
        def on_train_begin(self, *args, **kwargs):
            mark("static")

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % a.epochs == 0:
                mark("step")

    trainer.add_callback(Mark())
    trainer.train()


def run_child(a) -> dict:
    import torch

    from slimrl.memory import current_memory_bytes

    shape = dict(QUICK_SHAPE if a.quick else SHAPE)
    shape.update({k: getattr(a, k) for k in ("vocab", "hidden", "layers") if getattr(a, k) is not None})
    cuda = a.device == "cuda"
    record = {"arm": a.child, "shape": shape, "device": a.device}
    overall = None if cuda else OverallPeak()
    marks, t0 = {"step": []}, time.perf_counter()

    def mark(name: str) -> None:
        if name == "static":
            marks["static"] = current_memory_bytes("cuda" if cuda else "cpu")
        else:
            marks["step"].append(time.perf_counter() - t0)

    if a.mem_limit_gb and not cuda:
        start_watchdog(int(a.mem_limit_gb * GiB), record, {})
    if a.child == "four":
        child_four(a, shape, a.device, mark)
    else:
        child_slimrl(a, shape, a.device, a.child == "slimrl", mark)
    peak = torch.cuda.max_memory_allocated() if cuda else overall.stop()
    steps = marks["step"]
    return {
        **record,
        "peak": peak,
        "static": marks["static"],
        "rollouts": len(steps),
        "s_per_rollout": (steps[-1] - steps[0]) / (len(steps) - 1) if len(steps) > 1 else None,
    }


def table(rows: dict, markdown: bool) -> str:
    four = rows.get("four", {})
    head = ["arm", "models", "static GiB", "peak GiB", "peak / four-model"]
    bodies = {
        "four": "policy + reference + value + reward (full)",
        "slimrl": "1 base (LoRA) + reward",
        "slimrl-full": "policy + frozen copy (ref + value adapter) + reward",
    }
    lines = []
    for arm, r in rows.items():
        if "error" in r:
            lines.append([arm, bodies[arm], "error", "error", "n/a"])
            continue
        peak = f"> {r['limit'] / GiB:.3g} (stopped)" if r.get("stopped") else f"{r['peak'] / GiB:.2f}"
        if arm == "four" or "peak" not in four or r.get("stopped"):
            ratio = "1.00" if arm == "four" else "n/a"
        else:
            ratio = f"{r['peak'] / (four['limit'] if four.get('stopped') else four['peak']):.2f}"
            ratio = f"<= {ratio}" if four.get("stopped") else ratio
        static = "n/a" if r.get("stopped") else f"{r['static'] / GiB:.2f}"
        lines.append([arm, bodies[arm], static, peak, ratio])
    return render(head, lines, markdown)


def child_flags(a) -> list[str]:
    """The parent's settings, passed on to each arm's process."""
    flags = ["--threads", str(a.threads), "--device", a.device, "--mem_limit_gb", str(a.mem_limit_gb)]
    for name in ("rows", "micro", "prompt", "response", "epochs", "steps", "vocab", "hidden", "layers"):
        if getattr(a, name) is not None:
            flags += [f"--{name}", str(getattr(a, name))]
    return flags + (["--quick"] if a.quick else [])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    p.add_argument("--vocab", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--layers", type=int)
    p.add_argument("--rows", type=int, default=8, help="prompts per rollout (one response each)")
    p.add_argument("--micro", type=int, default=4, help="rows per forward/backward")
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    p.add_argument("--response", type=int, default=256, help="response tokens")
    p.add_argument("--epochs", type=int, default=2, help="PPO epochs per rollout (one optimizer step each)")
    p.add_argument("--steps", type=int, default=2, help="rollouts")
    p.add_argument("--threads", type=int, default=1, help="OMP/MKL threads per process")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--quick", action="store_true", help=f"smoke run: {QUICK_SHAPE}, {QUICK}")
    p.add_argument("--mem_limit_gb", type=float, default=18.0, help="CPU: stop an arm whose RSS passes this (GiB)")
    p.add_argument("--markdown", action="store_true")
    p.add_argument(
        "--json",
        default=results_path("ppo_memory"),
        help="the results file",
    )
    p.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.quick:
        a.rows, a.micro, a.prompt, a.response = QUICK["rows"], QUICK["micro"], QUICK["prompt"], QUICK["response"]
    if a.rows % a.micro:
        p.error(f"--rows ({a.rows}) must be a multiple of --micro ({a.micro})")
    if a.child:
        pin_threads(a.threads)
        print(json.dumps(run_child(a)), flush=True)
        return 0
    flags, rows = child_flags(a), {}
    for arm in a.arms:
        rows[arm] = run_self(["--child", arm, *flags], a.threads)
        print(json.dumps(rows[arm]), file=sys.stderr, flush=True)
    shape = next((r["shape"] for r in rows.values() if "shape" in r), {})
    title = (
        f"# PPO peak memory, random Llama V={shape.get('vocab')} hidden {shape.get('hidden')} x "
        f"{shape.get('layers')} layers (fp32, {a.device}); rollouts of {a.rows} prompts x ({a.prompt} + "
        f"{a.response}) tokens, micro-batches of {a.micro}, {a.epochs} PPO epochs, {a.steps} rollouts, "
        f"{a.threads} thread(s)"
    )
    print(title)
    print(table(rows, a.markdown))
    write_results(a.json, {"title": title, "args": {k: v for k, v in vars(a).items() if k != "child"}, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
