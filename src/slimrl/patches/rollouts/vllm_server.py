"""Rollouts from a vLLM server (`vllm_mode="server"`, `trl vllm-serve`) with the LoRA adapter handed over through the
server's own LoRA endpoints instead of TRL's NCCL weight transfer.

TRL's server mode merges the adapter and streams every weight over vLLM's NCCL weight-transfer engine: the trainer's
rank 0 joins the server's workers in an NCCL group (`VLLMClient.init_communicator`). That needs CUDA on both sides:
TRL refuses any other device (NotImplementedError), and vLLM's transfer engines are NCCL or CUDA IPC only. For a PEFT
model slimrl can hand over what changed, the adapter, instead:

1. `vllm_server_sync` (config field, the value set of slimrl.generation.sync_modes): "merged" = TRL's NCCL path;
   "lora" = this module; "auto" (default) = "lora" where TRL's path cannot run (the trainer is not on CUDA) and the
   model is a PEFT model (a one-line notice names the change), else "merged". "lora" without a PEFT model raises
   at set-up. The former spellings "weights" / "adapter" are accepted with a notice.
2. At every sync (TRL calls `sync_weights` once per global step, before the step's rollouts), the adapter's weights
   are collected on every rank (DTensor shards gathered, ZeRO-3 parameters gathered: collectives), rank 0 writes them
   in PEFT's format to `<output_dir>/vllm-server-adapters/<name>`, loads them under a fresh name with
   `POST /v1/load_lora_adapter`, points the client's `model` at that name (every completion request then names the
   adapter: a rollout can never silently come from the base model), unloads the previous adapter and deletes its
   folder. No NCCL group is opened.
3. The server needs `--enable-lora --max-lora-rank R` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`, and must read the
   trainer's files (same machine or a shared file system); a server without the endpoints is named in the error at
   the first sync, with the flags to add.
TRL's own: prompt gathering to rank 0, SamplingParams from the config, the HTTP requests, log-prob extraction for the
importance-sampling correction, and everything around them.
"""

from __future__ import annotations

import os
import shutil
import uuid

from ... import fields
from ...generation.sync_modes import normalize_sync_mode
from ...notices import notice
from ...state import user_set

ADAPTER_FOLDER = "vllm-server-adapters"
SERVER_FLAGS = "--enable-lora --max-lora-rank <r> and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"


def is_peft(model) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def server_sync(args) -> str:
    """The config's `vllm_server_sync` in the one spelling ("auto" without a config)."""
    name = fields.VLLM_SERVER_SYNC
    return "auto" if args is None else normalize_sync_mode(getattr(args, name, "auto"), name)


def check_server_sync(args) -> None:
    """Before TRL's `__init__`: the field's value (the PEFT check waits for TRL's own PEFT wrapping)."""
    choice = server_sync(args)
    server = getattr(args, "vllm_mode", "colocate") == "server"
    if choice != "auto" and not server and user_set(args, fields.VLLM_SERVER_SYNC):
        notice(f"vllm_server_sync={choice!r} has no effect with vllm_mode={args.vllm_mode!r}")


def uses_adapter_sync(args, model, accelerator) -> bool:
    """Whether this trainer's server rollouts get the adapter over the LoRA endpoints (module docstring, point 1)."""
    choice = server_sync(args)
    if choice == "lora" and not is_peft(model):
        raise ValueError(
            "vllm_server_sync='lora' hands a LoRA adapter to the vLLM server, but the model has none: "
            "add LoRA (FastLanguageModel.get_peft_model or peft_config=...) or use 'merged'."
        )
    if choice != "auto":
        return choice == "lora"
    if not is_peft(model) or accelerator is None or accelerator.device.type == "cuda":
        return False
    if accelerator.is_main_process:
        notice(
            f"vllm_server_sync='lora' (was 'auto'): TRL's NCCL weight transfer needs CUDA and the trainer runs "
            f"on {accelerator.device.type}, so the LoRA adapter goes to the server through its LoRA endpoints"
        )
    return True


def adapter_state(model, dist) -> dict:
    """The active adapter's weights, whole, on CPU (every rank: the gathers are collectives)."""
    from peft import get_peft_model_state_dict

    with dist.gather_params([p for p in model.parameters() if p.requires_grad]):
        state = get_peft_model_state_dict(model, adapter_name=model.active_adapter)
        return {
            name: (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().to("cpu", copy=True)
            for name, t in state.items()
        }


def write_adapter(model, state: dict, folder: str) -> str:
    """PEFT's on-disk format (adapter_config.json + adapter_model.safetensors), what vLLM's loader reads."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    model.peft_config[model.active_adapter].save_pretrained(folder)
    save_file({name: t.contiguous() for name, t in state.items()}, os.path.join(folder, "adapter_model.safetensors"))
    return folder


def post_lora(client, endpoint: str, name: str, path: str | None = None) -> None:
    payload = {"lora_name": name} if path is None else {"lora_name": name, "lora_path": path}
    response = client.session.post(f"{client.base_url}/v1/{endpoint}", json=payload)
    if response.status_code == 404:
        raise RuntimeError(
            f"The vLLM server at {client.base_url} has no /v1/{endpoint}: start it with {SERVER_FLAGS} "
            "(slimrl hands the LoRA adapter over through these endpoints)."
        )
    if response.status_code != 200:
        raise RuntimeError(f"vLLM server /v1/{endpoint} for {name!r} failed ({response.status_code}): {response.text}")


def make_server_adapter_class(original):
    """A subclass of TRL's `VLLMGeneration` whose server gets the adapter, not the merged weights."""

    class ServerAdapterVLLMGeneration(original):
        __doc__ = f"TRL's {original.__name__} in server mode, the LoRA adapter handed over by file (slimrl)."

        def __init__(self, adapter_root: str, **kwargs):
            self.adapter_root, self.served, self.sync_count = adapter_root, None, 0
            self.run_id = uuid.uuid4().hex[:8]  # adapter names unique per trainer: a server outlives a run
            super().__init__(**kwargs)

        def _init_vllm(self):
            from trl.generation.vllm_client import VLLMClient

            if self.accelerator.is_main_process:  # the client only: no NCCL group (module docstring, point 2)
                base_url = self.server_base_url or f"http://{self.server_host}:{self.server_port}"
                self.vllm_client = VLLMClient(
                    base_url=base_url, group_port=self.group_port, connection_timeout=self.server_timeout
                )

        def sync_weights(self):
            model = self.accelerator.unwrap_model(self.model)
            state = adapter_state(model, self._dist)
            self.sync_count += 1
            if not self.accelerator.is_main_process:
                return
            name = f"slimrl-{self.run_id}-step-{self.sync_count}"
            path = write_adapter(model, state, os.path.join(self.adapter_root, name))
            client, previous = self.vllm_client, self.served
            post_lora(client, "load_lora_adapter", name, path)
            client.model, self.served = name, (name, path)
            if previous is not None:
                post_lora(client, "unload_lora_adapter", previous[0])
                shutil.rmtree(previous[1], ignore_errors=True)
            client.reset_prefix_cache()

    return ServerAdapterVLLMGeneration
