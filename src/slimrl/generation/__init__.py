"""Generation backends for rollouts: the vLLM engine behind `fast_inference=True` (vllm_engine.py) and what it
receives from the training model (weights.py). Without vLLM the trainers use transformers' generate, as TRL does."""
