"""An in-process rollout worker and weight transfer for AsyncGRPOTrainer, through TRL's own plug-in protocols.

TRL's AsyncGRPOTrainer takes a `rollout_worker` (RolloutWorkerProtocol) and a `weight_transfer`
(WeightTransferProtocol) in place of its vLLM server client and NCCL transfer. These implement both on CPU with
transformers' `generate`: a thread samples `num_generations` completions per prompt from its own copy of the policy
(tagged with the policy version it has), scores them, and pushes TRL's `RolloutSample`s while the trainer trains; the
weight transfer copies every weight TRL streams into that copy, under a lock the generation thread holds.
"""

from __future__ import annotations

import queue
import threading
import time

import numpy as np
import torch

import _tiny as T


def length_reward(completion_ids: list[int]) -> float:
    """Deterministic reward with spread inside a group: token-id checksum plus a length term."""
    return float(sum(completion_ids) % 7) + 0.5 * len(completion_ids)


class LocalRolloutWorker:
    def __init__(self, model_path: str, prompts: list[str], num_generations: int, max_new_tokens: int, seed: int = 0):
        self.model = T.load_tiny(model_path).eval()
        self.tokenizer = T.tokenizer()
        self.prompts, self.num_generations, self.max_new_tokens = prompts, num_generations, max_new_tokens
        self.rollout_buffer: queue.Queue = queue.Queue(maxsize=64)
        self.metrics_queue: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.model_version = 0
        self.versions_produced: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rollouts", daemon=True)
        self._error: BaseException | None = None
        self._generator = torch.Generator().manual_seed(seed)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def update_model_version(self, model_version: int) -> None:
        self.model_version = model_version

    def check_health(self, stale_after_s: float) -> None:
        if self._error is not None:
            raise RuntimeError("the rollout thread failed") from self._error
        if not self._thread.is_alive():
            raise RuntimeError("the trainer waits for samples, but the rollout thread is not running")

    def _loop(self) -> None:
        group = 0
        try:
            while not self._stop.is_set():
                for sample in self._group(group):
                    while not self._stop.is_set():
                        try:
                            self.rollout_buffer.put(sample, timeout=0.2)
                            break
                        except queue.Full:
                            continue
                group += 1
        except BaseException as error:  # reported to the trainer through check_health
            self._error = error

    def _group(self, group: int) -> list:
        from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

        prompt = self.prompts[group % len(self.prompts)]
        prompt_ids = self.tokenizer(prompt)["input_ids"]
        with self.lock:
            version = self.model_version
            completions = [self._sample(prompt_ids) for _ in range(self.num_generations)]
        rewards = np.array([length_reward(ids) for ids, _ in completions])
        advantages = rewards - rewards.mean()
        self.versions_produced.append(version)
        return [
            RolloutSample(
                prompt=[{"role": "user", "content": prompt}],
                completion=[{"role": "assistant", "content": ""}],
                input_ids=np.array(prompt_ids + ids),
                completion_mask=np.array([0] * len(prompt_ids) + [1] * len(ids)),
                old_log_probs=np.array([0.0] * len(prompt_ids) + logps, dtype=np.float32),
                advantage=float(advantage),
                model_version=version,
                group_id=group,
                metrics={"reward": float(reward)},
                enqueued_at=time.time(),
            )
            for (ids, logps), advantage, reward in zip(completions, advantages, rewards)
        ]

    def _sample(self, prompt_ids: list[int]) -> tuple[list[int], list[float]]:
        """Ancestral sampling with the worker's generator, cut after EOS; each token's log-prob under the policy."""
        ids, logps = list(prompt_ids), []
        with torch.no_grad():
            for _ in range(self.max_new_tokens):
                logits = self.model(input_ids=torch.tensor([ids])).logits[0, -1].float()
                log_probs = logits.log_softmax(-1)
                token = int(torch.multinomial(log_probs.exp(), 1, generator=self._generator))
                ids.append(token)
                logps.append(float(log_probs[token]))
                if token == T.EOS_ID:
                    break
        return ids[len(prompt_ids) :], logps


class LocalWeightTransfer:
    """Every weight TRL streams (base-checkpoint names, a LoRA adapter merged in) copied into the worker's model."""

    def __init__(self, worker: LocalRolloutWorker):
        self.worker = worker
        self.syncs = 0

    def init_weight_transfer(self) -> None:
        pass

    def pause(self) -> None:
        self.worker.lock.acquire()

    def send_weights(self, iterator) -> None:
        params = dict(self.worker.model.named_parameters())
        with torch.no_grad():
            for name, tensor in iterator:
                params[name].copy_(tensor)
        self.syncs += 1

    def resume(self) -> None:
        self.worker.lock.release()

    def destroy(self) -> None:
        pass
