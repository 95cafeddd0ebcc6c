"""Activation offload: the inputs checkpointing keeps for each layer's recompute wait in host memory.

Under non-reentrant `torch.utils.checkpoint` the only tensors a checkpointed decoder layer keeps for its backward are
its inputs, saved through autograd's saved-tensor hooks; `offloaded_checkpoint` (slimrl.models.checkpointing) wraps
each layer's checkpoint call in the hooks of the model's one ActivationOffloader, which
- keeps on the device: the newest `keep_last` layer inputs (their backward comes first: copying them out and straight
  back only costs time; torchtune PR #1443, DeepSpeed's keep_last_count), tensors under `min_bytes`, and anything
  that is not a plain contiguous strided tensor on a CUDA device (parameters, tensor subclasses such as DTensor);
- copies a layer input out when the next one is saved, so the copy of layer k's input runs beside layer k+1's
  compute, on a copy stream of its own that first waits for the compute stream; the source's memory goes back to the
  allocator only once the copy is done (`record_stream`), so the compute stream never waits for a copy out;
- in the backward, when layer k's input is asked for, issues its copy back if it is not already there, then the
  copy of the input saved before it (prefetch), which arrives while layer k recomputes and runs its backward; the
  compute stream waits for a copy (an event) only where it uses that tensor;
- takes host buffers from a pool (HostPool) that lives as long as the model: a step of the same shapes allocates
  nothing, a longer one replaces too-small buffers instead of adding to them. A buffer goes back to the pool when
  its copy back is issued (or when a graph that never ran backward is freed) and is reused without waiting: every
  copy that reads or writes a pool buffer runs on the same copy stream, in order.
Values are exact: same dtype, shape and strides, bytes copied as they are. A layer input changed in place after it
was saved raises, as plain checkpointing's own check does (saved-tensor hooks switch that check off).

The device-specific parts live in a copy engine: CudaCopies (side stream, events, pinned buffers) or SyncCopies
(copies that are complete when they return, plain host buffers). Tensors already in host memory are left where they
are, unless the offloader was built with `host_tensors=True`: then they go through SyncCopies, so a CPU runs the
same bookkeeping (pool, keep-last, size threshold, prefetch order, exactness) the CUDA path uses.
"""

from __future__ import annotations

import collections
import weakref
from dataclasses import dataclass

import torch

MIN_BYTES = 1 << 20  # tensors under 1 MiB stay: a copy's fixed cost outweighs what it frees
KEEP_LAST = 1  # the newest layer input stays on the device


@dataclass
class OffloadStats:
    """What the offloader saw since the model was set up (counts of tensors; bytes of the copies out)."""

    tensors_seen: int = 0  # every tensor checkpointing saved through the hooks
    tensors_moved: int = 0  # copied to host memory
    bytes_moved: int = 0
    kept_last: int = 0  # the newest inputs, used by the backward straight from the device
    kept_small: int = 0  # under min_bytes
    kept_other: int = 0  # already in host memory, or not a plain contiguous CUDA tensor
    prefetched: int = 0  # on their way back before the backward asked for them
    fetched_on_demand: int = 0  # copied back only when the backward asked for them


class HostPool:
    """Host buffers (flat bytes) reused across steps. Capacities are powers of two, which is what torch's pinned
    allocator rounds every request to anyway; a request no free buffer fits replaces the largest free one."""

    def __init__(self, pinned: bool):
        self.pinned = pinned
        self.free: list[torch.Tensor] = []
        self.buffers = 0  # held by the pool, free or lent
        self.bytes = 0
        self.allocations = 0  # host allocations made since the pool was created

    def acquire(self, nbytes: int) -> torch.Tensor:
        fitting = [i for i, buf in enumerate(self.free) if buf.numel() >= nbytes]
        if fitting:
            return self.free.pop(min(fitting, key=lambda i: self.free[i].numel()))
        if self.free:
            largest = self.free.pop(max(range(len(self.free)), key=lambda i: self.free[i].numel()))
            self.buffers, self.bytes = self.buffers - 1, self.bytes - largest.numel()
        capacity = 1 << max(nbytes - 1, 0).bit_length()
        try:
            buf = torch.empty(capacity, dtype=torch.uint8, pin_memory=self.pinned)
        except RuntimeError as exc:
            kind = "pinned host" if self.pinned else "host"
            raise torch.OutOfMemoryError(  # an out-of-memory: slimrl's step guard keeps the last checkpoint
                f"activation offload could not allocate {capacity / 2**20:.1f} MiB of {kind} memory (the pool "
                f"already holds {self.bytes / 2**30:.2f} GiB in {self.buffers} buffer(s)). Free host memory, or use "
                "use_gradient_checkpointing=True to keep the layer inputs on the device."
            ) from exc
        self.buffers, self.bytes, self.allocations = self.buffers + 1, self.bytes + capacity, self.allocations + 1
        return buf

    def release(self, buf: torch.Tensor) -> None:
        self.free.append(buf)


class SyncCopies:
    """Copies complete when they return (the calling thread's stream); plain host buffers."""

    def __init__(self):
        self.pool = HostPool(pinned=False)

    def copy(self, dst: torch.Tensor, src: torch.Tensor):
        dst.copy_(src)
        return None  # nothing to wait for

    def wait(self, ready) -> None:
        pass


class CudaCopies:
    """Copies on a side stream of one CUDA device, into and out of pinned host buffers."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.pool = HostPool(pinned=True)

    def copy(self, dst: torch.Tensor, src: torch.Tensor):
        """Queue `dst.copy_(src)` after everything queued so far on the compute stream; return its event."""
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)
        (src if src.is_cuda else dst).record_stream(self.stream)  # the device block outlives the copy
        return self.stream.record_event()

    def wait(self, ready) -> None:
        if ready is not None:
            torch.cuda.current_stream(self.device).wait_event(ready)


class SavedInput:
    """One saved layer input: on the device ("kept"), in a host buffer ("offloaded"), on its way back ("fetched"),
    or handed to the backward ("restored")."""

    __slots__ = (
        *("engine", "tensor", "host", "ready", "state", "shape", "dtype", "device", "nbytes"),
        *("version", "source", "previous", "__weakref__"),
    )

    def __init__(self, engine, tensor: torch.Tensor, nbytes: int, previous):
        self.engine, self.nbytes, self.previous = engine, nbytes, previous
        self.shape, self.dtype, self.device = tensor.shape, tensor.dtype, tensor.device
        self.version, self.source = tensor._version, weakref.ref(tensor)
        self.tensor, self.host, self.ready, self.state = tensor.detach(), None, None, "kept"

    def check_unchanged(self) -> None:
        source = self.tensor if self.state == "kept" else self.source()  # the kept alias shares the version counter
        if source is not None and source._version != self.version:
            raise RuntimeError(
                "a checkpointed layer input was modified in place after checkpointing saved it (version "
                f"{self.version} -> {source._version}); its recompute would not see the forward's values"
            )

    def host_view(self) -> torch.Tensor:
        return self.host[: self.nbytes].view(self.dtype).view(self.shape)

    def offload(self, stats: OffloadStats) -> None:
        if self.state != "kept":
            return
        self.check_unchanged()
        self.host = self.engine.pool.acquire(self.nbytes)
        self.engine.copy(self.host_view(), self.tensor)
        self.tensor, self.state = None, "offloaded"
        stats.tensors_moved += 1
        stats.bytes_moved += self.nbytes

    def fetch(self) -> None:
        """Queue the copy back to the device (allocated on the compute stream) and return the host buffer."""
        self.tensor = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        self.ready = self.engine.copy(self.tensor, self.host_view())
        self.engine.pool.release(self.host)
        self.host, self.state = None, "fetched"

    def __del__(self):  # a graph freed without its backward: the buffer goes back to the pool
        if getattr(self, "host", None) is not None:
            self.engine.pool.release(self.host)


def _check_count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, not {value!r}")
    return value


class ActivationOffloader:
    """The saved-tensor hooks (`pack`, `unpack`) of one model's "offload" checkpointing, its engines and stats."""

    def __init__(self, min_bytes: int = MIN_BYTES, keep_last: int = KEEP_LAST, host_tensors: bool = False):
        self.min_bytes, self.keep_last, self.host_tensors = MIN_BYTES, KEEP_LAST, False
        self.configure(min_bytes, keep_last, host_tensors)
        self.stats = OffloadStats()
        self.engines: dict[torch.device, SyncCopies | CudaCopies] = {}
        self._newest: collections.deque = collections.deque()  # weak references, oldest first
        self._last_saved = None  # weak reference to the input saved last (the one the backward asks for next)

    def configure(self, min_bytes: int | None = None, keep_last: int | None = None, host_tensors=None) -> None:
        """Change the settings (None leaves one as it is); all are checked before any changes."""
        if host_tensors is not None and not isinstance(host_tensors, bool):
            raise ValueError(f"host_tensors must be True or False, not {host_tensors!r}")
        min_bytes = self.min_bytes if min_bytes is None else _check_count("min_bytes", min_bytes)
        keep_last = self.keep_last if keep_last is None else _check_count("keep_last", keep_last)
        self.min_bytes, self.keep_last = min_bytes, keep_last
        self.host_tensors = self.host_tensors if host_tensors is None else host_tensors

    def __reduce__(self):  # copy.deepcopy / pickle of a model: the settings travel, never streams or buffers
        return type(self), (self.min_bytes, self.keep_last, self.host_tensors)

    def _engine(self, tensor: torch.Tensor):
        if type(tensor) is not torch.Tensor or tensor.layout != torch.strided or not tensor.is_contiguous():
            return None
        device = tensor.device
        if device.type == "cuda":
            make = CudaCopies
        elif device.type == "cpu" and self.host_tensors:
            make = SyncCopies
        else:
            return None
        if device not in self.engines:
            self.engines[device] = make(device) if make is CudaCopies else make()
        return self.engines[device]

    def pack(self, tensor: torch.Tensor):
        self.stats.tensors_seen += 1
        engine = self._engine(tensor)
        if engine is None:
            self.stats.kept_other += 1
            return tensor
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes < self.min_bytes:
            self.stats.kept_small += 1
            return tensor
        saved = SavedInput(engine, tensor, nbytes, previous=self._last_saved)
        self._last_saved = weakref.ref(saved)
        self._newest.append(self._last_saved)
        while len(self._newest) > self.keep_last:
            older = self._newest.popleft()()
            if older is not None:
                older.offload(self.stats)
        return saved

    def unpack(self, packed):
        if not isinstance(packed, SavedInput):
            return packed
        packed.check_unchanged()
        if packed.state == "kept":
            self.stats.kept_last += 1
        elif packed.state == "offloaded":
            packed.fetch()
            self.stats.fetched_on_demand += 1
        elif packed.state == "fetched":
            self.stats.prefetched += 1
        previous = packed.previous() if packed.previous is not None else None
        if previous is not None and previous.state == "offloaded":
            previous.fetch()  # queued behind this one's copy: it arrives while this layer recomputes
        packed.engine.wait(packed.ready)
        packed.ready, packed.state = None, "restored"
        return packed.tensor

    def host_memory(self) -> dict:
        """The host pools: buffers held, their bytes, and the allocations made so far (all devices together)."""
        pools = [engine.pool for engine in self.engines.values()]
        return {
            "buffers": sum(p.buffers for p in pools),
            "bytes": sum(p.bytes for p in pools),
            "allocations": sum(p.allocations for p in pools),
            "free": sum(len(p.free) for p in pools),
        }
