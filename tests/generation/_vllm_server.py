"""A vLLM server for the vLLM tier, started the way TRL's docs start one (`trl vllm-serve`), and a patched GRPO run
against it (used in process and under torchrun by tests/generation/test_vllm_server.py).

    python tests/generation/_vllm_server.py GRPO_OUT BASE_URL MODEL_DIR     (one process of a torchrun launch)

The server: `python -m trl.cli.main vllm-serve` (TRL's flags: processed log-probs, --max-logprobs -1, its NCCL
weight-transfer config), plus vLLM's own LoRA flags and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, which slimrl's
adapter hand-over needs; float32 and eager (exact greedy comparisons, a start in about a minute on CPU). It runs in
its own process group, ended by its id when the test is done.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

STARTUP_TIMEOUT_S = 420
LORA_RANK = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model_dir: str, log_path: str):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
        }
        command = [
            sys.executable,
            "-m",
            "trl.cli.main",
            "vllm-serve",
            "--model",
            model_dir,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--enforce_eager",
            "--dtype",
            "float32",
            "--max_model_len",
            "256",
            "--enable-lora",
            "--max-lora-rank",
            str(LORA_RANK),
            "--max-loras",
            "2",
        ]
        self.log_path = log_path
        self.log = open(log_path, "w")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            command, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    def wait(self) -> None:
        import requests

        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the vLLM server exited ({self.process.returncode}):\n{self.tail()}")
            try:
                if requests.get(f"{self.base_url}/v1/models", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(2)
        raise RuntimeError(f"the vLLM server did not answer in {STARTUP_TIMEOUT_S} s:\n{self.tail()}")

    def tail(self, chars: int = 4000) -> str:
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()[-chars:]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)  # the server and the engine process it started
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)
        self.log.close()


def reward(completions, **kwargs):
    return [float(len(c[0]["content"]) % 7) for c in completions]


def grpo_trainer(model_dir: str, base_url: str, output_dir: str, steps: int = 3, batch: int = 4, **config):
    """The patched GRPO trainer in server mode on a LoRA of the served model (fp32, like the server)."""
    import trl
    from datasets import Dataset

    from slimrl import FastLanguageModel, PatchFastRL

    PatchFastRL("grpo", FastLanguageModel)
    model, tokenizer = FastLanguageModel.from_pretrained(model_dir, max_seq_length=256, dtype="float32")
    model = FastLanguageModel.get_peft_model(model, r=LORA_RANK, lora_alpha=16, random_state=1)
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"what is {i} plus {i}"}] for i in range(16)]})
    kw = dict(
        output_dir=output_dir,
        per_device_train_batch_size=batch,
        num_generations=4,
        max_completion_length=16,
        max_steps=steps,
        learning_rate=1e-2,
        logging_steps=1,
        report_to=[],
        bf16=False,
        save_strategy="no",
        seed=0,
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url=base_url,
    )
    kw.update(config)
    return trl.GRPOTrainer(
        model=model, reward_funcs=reward, args=trl.GRPOConfig(**kw), train_dataset=dataset, processing_class=tokenizer
    )


def sampling_gaps(trainer) -> list[float]:
    """TRL's largest |vLLM sampling log-prob - trainer log-prob| per step: ~1e-6 in fp32 when vLLM held the weights
    the trainer scored with, large when it rolled out from others."""
    return [h["sampling/sampling_logp_difference/max"] for h in trainer.state.log_history if "loss" in h]


def main(out: str, base_url: str, model_dir: str) -> None:
    import torch

    torch.set_num_threads(1)
    trainer = grpo_trainer(model_dir, base_url, os.path.dirname(out), batch=2)
    trainer.train()
    if trainer.accelerator.is_main_process:
        with open(out, "w") as f:
            json.dump(
                {
                    "world_size": trainer.args.world_size,
                    "gaps": sampling_gaps(trainer),
                    "generation": type(trainer.vllm_generation).__name__,
                },
                f,
            )


if __name__ == "__main__":
    main(*sys.argv[1:4])
