"""Rule: generation and rewards: rollouts through HF generate or vLLM, multi-turn, reward functions, judges."""
