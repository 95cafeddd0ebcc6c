"""Memory-lean ops: the fused, completion-only log-prob head used by slimrl's GRPO/RLOO patches.

- `slimrl.ops.logprob.add_fused_lm_head`: drop-in for `trl.trainer.utils.add_fused_lm_head` (TRL 1.16).
- `slimrl.ops.logprob.set_num_chunks`: the `slimrl_num_chunks` knob (-1 auto, N >= 1 chunks).
- `slimrl.ops.lean_logprob.LeanLogProbFunction`: the torch autograd op used where Triton is not available.

Submodules import torch/trl only when imported themselves, so `import slimrl.ops` stays cheap.
"""
