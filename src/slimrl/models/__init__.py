"""Models: the parts behind FastLanguageModel (slimrl/fast_language_model.py, the front end above models/ and export/).

loading.py (sources, dtype, tokenizer fixes), embedded.py (the bundled SmolLM2-135M and slimrl's cache),
quantization.py (bitsandbytes NF4 on CPU/CUDA), lora.py (peft LoRA), checkpointing.py (False/True/"offload",
pinned against TRL), modes.py (for_inference / for_training). Nothing is imported here, so importing a submodule
stays cheap.
"""
