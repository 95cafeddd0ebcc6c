"""The memory planner's terms: one function per term, each returning (bytes, the formula with its numbers).

Symbols: L layers, H hidden, I intermediate, V vocabulary, Hkv = kv heads x head_dim, w bytes per weight, a bytes
per activation, b rows per micro-batch, P prompt and C completion tokens, T = P + C, Bg rows generated at once.
The formulas (module docstring of slimrl.planning.plan says how they combine into a peak):
- weights: parameters x w (4-bit decoder Linear weights: 0.5625 B each, 4 bits plus one fp32 scale per 64).
- reference copy (full fine-tuning with a KL/reference term): the weights once more.
- LoRA: A and B of every target, r x (in + out) each, fp32 (PEFT keeps adapters in fp32): 4 B each.
- optimizer state: AdamW's two moments, 2 x trainable x (4 for LoRA, w for full fine-tuning).
- gradients: trainable x (4 or w), alive from the first backward of a step to the optimizer step.
- optimizer step: CPU's single-tensor AdamW makes ~3 temporaries of one tensor; CUDA's foreach AdamW ~1 of all.
- saved activations, per token and layer (counted from autograd's saved tensors of Llama blocks in fp32 and bf16,
  tests/planning): attention a x (2 q_dim + 2 kv_dim) (q, output, k, v; no kv repeat with SDPA) + 4 B x heads; the
  two RMSNorms 2 x (4H + 4) (the fp32 residual each keeps, and its rsqrt); the MLP 3I x a (gate, SiLU(gate), up);
  the Linear inputs: LoRA keeps its fp32 input (4 B x the LoRA modules' input widths, an input shared by q/k/v or
  gate/up counted once when activations are fp32 too) and 4 B x r per module (its A output); full fine-tuning keeps
  a x (4H + I) (each norm's output and normalized input, the down projection's input). With checkpointing: a x H
  per token and layer (the block input) plus one block's full set during its recompute; "offload" moves the block
  inputs to host memory (CUDA) but two (the one in use and the newest kept or the next prefetched), and none under
  slimrl.models.offload.MIN_BYTES; on the host each is a power-of-two pool buffer (offload_host_bytes).
- policy tokens: b x T (online), 2b x T (DPO/ORPO/CPO: chosen and rejected), b x T (KTO); shared prefix: the
  distinct prompts' P once each plus b x C.
- log-prob head (slimrl.ops.lean_logprob, CPU): n = scored tokens (b x C; 2b x C paired) cut into k row chunks
  (slimrl_num_chunks, or automatic: rows = 128 MiB / (2 x 4 x V)); forward: 2 buffers of ceil(n/k) x V fp32 (log Z
  and the entropy), + ceil(n/k) x V x 2 when the product runs in 16 bits; backward: 1 buffer (2 when the entropy is
  differentiated), the hidden gradient n x H x a, and for a trained LM head its fp32 gradient V x H x 4. CUDA runs
  TRL's Triton kernel: ceil(n/k) capped at 4096 rows by V capped at 32768 columns.
- rollout KV cache (HF generate): 2 x L x Hkv x Bg x T x w; decoding adds ~3 fp32 vectors of V per row (logits,
  processed scores, probabilities) and the prefill one block's activations for Bg x P tokens, a x (4H + 3I).
- scoring forwards (no grad: old policy, reference): chunks of b rows: one block's activations a x b x T x (4H + 3I)
  and the head's forward buffers for b x C tokens.
- vLLM engine: gpu_memory_utilization x the device memory (CPU: resident all run; CUDA: during rollouts, asleep
  while training).
- runtime: the process before any model (CPU: libtorch, transformers and TRL resident, RUNTIME_CPU_BYTES measured
  here; CUDA: the context and kernels outside PyTorch's allocator, CUDA_CONTEXT_BYTES).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..families import PAIRED, SHARED_PREFIX
from ..ops.chunking import resolve_num_chunks
from . import levers
from .run import RunShape
from .shapes import ModelShape

GiB = 1024**3
MiB = 1024**2
HEAP_LIMIT = 1 * MiB  # the mmap threshold slimrl sets on a CPU (training/cpu_heap.py): smaller blocks stay in the heap
RUNTIME_CPU_BYTES = int(0.55 * GiB)  # peak RSS of a GRPO/DPO step on a 1-layer, 16-wide model (this machine)
CUDA_CONTEXT_BYTES = int(0.5 * GiB)  # CUDA context + cuBLAS/cuDNN workspaces, outside torch's allocator
TRITON_TOKEN_CHUNK, TRITON_VOCAB_TILE = 4096, 32768  # TRL's ChunkedLogProbFunction tiles (CUDA)
FOUR_BIT_BYTES = 0.5625
MLP_GRADIENTS = 2  # [N, I] gradients alive beside the recomputed MLP tensors in a block's backward
OFFLOAD_DEVICE_LAYERS = 2  # offload's device share: the block input in use and the next (kept newest, or prefetched)


def _mib(n: float) -> str:
    return f"{n / MiB:,.0f} MiB"


@dataclass(frozen=True)
class Part:
    """A term's bytes, its formula, and how much of it is allocated in blocks under HEAP_LIMIT (CPU: such blocks
    come from glibc's heap, which keeps them resident after they are freed)."""

    bytes: int
    formula: str = ""
    heap: int = 0


def part(n: float, formula: str, tensor: float) -> Part:
    """`n` bytes allocated in blocks of about `tensor` bytes each."""
    return Part(int(n), formula, int(n) if tensor < HEAP_LIMIT else 0)


def weights(m: ModelShape, r: RunShape) -> Part:
    if r.load_in_4bit:
        rest = m.num_params - m.decoder_linear_params
        n = m.decoder_linear_params * FOUR_BIT_BYTES + rest * r.weight_bytes
        return Part(int(n), f"{m.decoder_linear_params:,} x {FOUR_BIT_BYTES} B (4-bit) + {rest:,} x {r.weight_bytes} B")
    return Part(m.num_params * r.weight_bytes, f"{m.num_params:,} parameters x {r.weight_bytes} B")


def trainable(m: ModelShape, r: RunShape) -> tuple[int, int]:
    """(trainable elements, bytes per element of their gradients and optimizer moments)."""
    return (m.lora_params, 4) if r.lora else (m.num_params, r.weight_bytes)


def adapter(m: ModelShape, r: RunShape) -> Part:
    return Part(m.lora_params * 4, f"{m.lora_params:,} LoRA parameters x 4 B") if r.lora else Part(0)


def optimizer_state(m: ModelShape, r: RunShape) -> Part:
    n, size = trainable(m, r)
    return Part(2 * n * size, f"2 moments x {n:,} x {size} B")


def gradients(m: ModelShape, r: RunShape) -> Part:
    n, size = trainable(m, r)
    if r.lora:
        return Part(n * size, f"{n:,} x {size} B", n * size)
    heap = sum(k for k in m.param_sizes if k * size < HEAP_LIMIT) * size
    return Part(n * size, f"{n:,} x {size} B", heap)


def optimizer_temporaries(m: ModelShape, r: RunShape) -> Part:
    n, size = trainable(m, r)
    if r.device == "cuda":
        return Part(n * size, f"foreach AdamW: {n:,} x {size} B")
    largest = n if r.lora else m.largest_param
    return part(3 * largest * size, f"3 x largest tensor {largest:,} x {size} B", largest * size)


def mlp_token_bytes(m: ModelShape, r: RunShape) -> int:
    """The MLP's share of `per_token_layer_bytes`: gate, SiLU(gate) and up (3I x a), and LoRA's fp32 inputs and A
    outputs of the MLP modules (full fine-tuning: the down projection's input, I x a)."""
    a = r.act_bytes
    if not r.lora:
        return 3 * m.intermediate * a + m.intermediate * a
    targets = set(m.lora_targets)
    gate_up = sum(name in targets for name in ("gate_proj", "up_proj"))
    down = "down_proj" in targets
    widths = (m.hidden if a == 4 and gate_up == 2 else gate_up * m.hidden) + down * m.intermediate
    return 3 * m.intermediate * a + 4 * widths + 4 * m.lora_rank * (gate_up + down)


def per_token_layer_bytes(m: ModelShape, r: RunShape) -> int:
    """Saved activations of one block per token without checkpointing (see the module docstring)."""
    a, q_dim, kv_dim = r.act_bytes, m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    attention = a * (2 * q_dim + 2 * kv_dim) + 4 * m.num_heads
    norms = 2 * (4 * m.hidden + 4)
    mlp = 3 * m.intermediate * a
    if not r.lora:
        return attention + norms + mlp + a * (4 * m.hidden + m.intermediate)
    widths = m.lora_shared_inputs_per_layer if a == 4 else m.lora_inputs_per_layer
    return attention + norms + mlp + 4 * widths + 4 * m.lora_rank_sum_per_layer


def _rows(r: RunShape) -> int:
    return 2 * r.batch if r.algorithm in PAIRED else r.policy_rows


def policy_tokens(r: RunShape) -> int:
    if r.shared_prefix and r.algorithm in SHARED_PREFIX:
        rows = r.batch if r.algorithm == "dpo" else r.policy_rows
        prompts = rows if r.algorithm == "dpo" else min(rows, max(r.generation_rows // r.num_generations, 1))
        return prompts * r.prompt_length + _rows(r) * r.completion_length
    return _rows(r) * (r.prompt_length + r.completion_length)


def scored_tokens(r: RunShape) -> int:
    return _rows(r) * r.completion_length


def _activation_tensor(m: ModelShape, r: RunShape, tokens: int) -> int:
    return tokens * max(m.hidden, m.intermediate) * r.act_bytes


def saved_activations(m: ModelShape, r: RunShape) -> Part:
    tokens = policy_tokens(r)
    tensor = _activation_tensor(m, r, tokens)
    if r.checkpointing is False:
        per = per_token_layer_bytes(m, r)
        return part(tokens * m.num_layers * per, f"{tokens:,} tokens x {m.num_layers} layers x {per:,} B", tensor)
    if r.offload_moves and offloaded_inputs(m, r).bytes:
        layers = min(OFFLOAD_DEVICE_LAYERS, m.num_layers)
        n = layers * tokens * m.hidden * r.act_bytes
        return Part(n, f"block inputs offloaded to host memory but {layers}: {tokens:,} tokens x H x a")
    n = tokens * m.num_layers * m.hidden * r.act_bytes
    return part(n, f"{tokens:,} tokens x {m.num_layers} layers x H x a", tensor)


def recompute(m: ModelShape, r: RunShape) -> Part:
    """One block's activations rebuilt during the backward (checkpointing only), with the MLP's gradients, one MLP
    shard's worth where the MLP is tiled (the tiled function keeps only the MLP's input for the whole call)."""
    if r.checkpointing is False:
        return Part(0)
    tokens, per = policy_tokens(r), per_token_layer_bytes(m, r)
    mlp = mlp_token_bytes(m, r) + MLP_GRADIENTS * m.intermediate * r.act_bytes
    shard = levers.mlp_shard_tokens(r.tiled_mlp, m.hidden, m.intermediate, tokens, r.act_bytes)
    if shard:
        rest = per - mlp_token_bytes(m, r) + m.hidden * r.act_bytes
        n, text = (
            tokens * rest + shard * mlp,
            f"one block: {tokens:,} tokens x {rest:,} B + MLP shard {shard:,} x {mlp:,} B",
        )
        return part(n, text, _activation_tensor(m, r, tokens))
    n, text = tokens * (per + mlp - mlp_token_bytes(m, r)), f"one block: {tokens:,} tokens x {per:,} B + MLP grads"
    return part(n, text, _activation_tensor(m, r, tokens))


def offload_host_bytes(
    num_layers: int, hidden: int, act_bytes: int, tokens: int, keep_last: int | None = None, min_bytes=None
) -> Part:
    """Host memory the offloader's pool holds for one forward of `tokens` tokens (slimrl.models.offload): every
    block input but the newest `keep_last` in a host buffer of its own, rounded up to a power of two (HostPool), none
    for inputs under `min_bytes` (they stay on the device); both default to the offloader's defaults. One owner of
    this figure: the plan (its note and JSON) and the host-memory check at trainer set-up
    (slimrl.patches.setup.offload_checks) both read it."""
    from ..models.offload import KEEP_LAST, MIN_BYTES

    keep_last, min_bytes = KEEP_LAST if keep_last is None else keep_last, MIN_BYTES if min_bytes is None else min_bytes
    tensor = tokens * hidden * act_bytes
    buffers = max(num_layers - keep_last, 0)
    if tensor < min_bytes or not buffers or not tensor:
        return Part(0)
    capacity = 1 << (tensor - 1).bit_length()
    text = f"{buffers} layers x pow2({tokens:,} tokens x {hidden} x {act_bytes} B) = {buffers} x {_mib(capacity)}"
    return Part(buffers * capacity, text)


def offloaded_inputs(m: ModelShape, r: RunShape) -> Part:
    """Host memory holding the offloaded block inputs (CUDA "offload"): one policy forward's (a row group's)."""
    if r.offload_moves:
        return offload_host_bytes(m.num_layers, m.hidden, r.act_bytes, policy_tokens(r))
    return Part(0)


def head_rows(m: ModelShape, r: RunShape, tokens: int, buffers: int = 2) -> int:
    if r.device == "cuda":
        chunks = 1 if r.num_chunks < 1 else min(r.num_chunks, max(tokens, 1))
        return min(math.ceil(tokens / chunks), TRITON_TOKEN_CHUNK)
    return math.ceil(tokens / resolve_num_chunks(tokens, m.vocab, r.num_chunks, buffers=buffers))


def _head_columns(m: ModelShape, r: RunShape) -> int:
    return min(m.vocab, TRITON_VOCAB_TILE) if r.device == "cuda" else m.vocab


def head_forward(m: ModelShape, r: RunShape, tokens: int) -> Part:
    rows, cols = head_rows(m, r, tokens), _head_columns(m, r)
    low = rows * cols * 2 if r.act_bytes == 2 else 0
    text = f"2 x {rows:,} rows x {cols:,} x 4 B" + (" + 16-bit product" if low else "")
    return part(2 * rows * cols * 4 + low, text, rows * cols * 4)


def head_backward(m: ModelShape, r: RunShape, tokens: int) -> Part:
    rows, cols = head_rows(m, r, tokens), _head_columns(m, r)
    buffers = 2 if r.entropy_grad else 1
    tiles, hidden = buffers * rows * cols * 4, tokens * m.hidden * r.act_bytes
    text = f"{buffers} x {rows:,} x {cols:,} x 4 B + hidden grad {tokens:,} x H x a"
    head_grad = 0 if r.lora else m.vocab * m.hidden * (4 + r.weight_bytes)
    if head_grad:
        text += " + LM head grad V x H x (4 + w)"
    heap = part(tiles, "", rows * cols * 4).heap + part(hidden, "", hidden).heap + part(head_grad, "", head_grad).heap
    return Part(tiles + hidden + head_grad, text, heap)


def kv_cache(m: ModelShape, r: RunShape) -> Part:
    """The cache, plus one layer's keys and values once more: DynamicCache grows by `torch.cat`, so each decoding
    step allocates a layer's new K and V before the old ones are freed."""
    if r.fast_inference:
        return Part(0)
    tokens = r.generation_rows * (r.prompt_length + r.completion_length)
    kv = m.num_kv_heads * m.head_dim
    size = r.act_bytes if r.load_in_4bit else r.weight_bytes
    layer = 2 * kv * tokens * size
    text = f"2 x {m.num_layers} layers x {kv} x {tokens:,} tokens x {size} B + one layer's growth copy"
    n = layer * (m.num_layers + 1)
    # each K or V block grows from the prompt's size to `layer / 2`: the part grown under HEAP_LIMIT is heap
    return Part(n, text, int(n * min(1.0, HEAP_LIMIT / (layer / 2))))


def decoding(m: ModelShape, r: RunShape) -> Part:
    if r.fast_inference:
        return Part(0)
    rows, prompt_tokens = r.generation_rows, r.generation_rows * r.prompt_length
    per = (4 * m.hidden + 3 * m.intermediate) * r.act_bytes
    n = 3 * rows * m.vocab * 4 + prompt_tokens * per
    return part(
        n,
        f"3 x {rows} x V x 4 B + prefill {prompt_tokens:,} tokens x {per:,} B",
        max(rows * m.vocab * 4, _activation_tensor(m, r, prompt_tokens)),
    )


def scoring_forward(m: ModelShape, r: RunShape) -> Part:
    """One no-grad forward over a chunk of b rows (old policy or reference)."""
    tokens = _rows(r) * (r.prompt_length + r.completion_length)
    per = (4 * m.hidden + 3 * m.intermediate) * r.act_bytes
    block = part(tokens * per, "", _activation_tensor(m, r, tokens))
    head = head_forward(m, r, scored_tokens(r))
    return Part(
        block.bytes + head.bytes,
        f"one block {tokens:,} tokens x {per:,} B + head forward {_mib(head.bytes)}",
        block.heap + head.heap,
    )


def engine_share(r: RunShape, device_bytes: int) -> Part:
    if not r.fast_inference:
        return Part(0)
    return Part(int(r.engine_fraction * device_bytes), f"{r.engine_fraction} x {device_bytes / GiB:.1f} GiB")
