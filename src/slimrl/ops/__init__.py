"""Memory-lean ops: the fused, completion-only log-prob heads used by slimrl's patches.

- `slimrl.ops.logprob.add_fused_lm_head`: drop-in for `trl.trainer.utils.add_fused_lm_head` (TRL 1.16).
- `slimrl.ops.chunking`: the `slimrl_num_chunks` knob (-1 auto, N >= 1 chunks): its validator and storage.
- `slimrl.ops.lean_logprob.LeanLogProbFunction`: the torch autograd op used where Triton is not available.
- `slimrl.ops.chunked_preference`: the lean forward of the paired-preference trainers (ORPO, CPO).

Submodules import torch/trl only when imported themselves, so `import slimrl.ops` stays cheap.
"""
