"""How data crosses between the trainer and a sandbox process: length-prefixed frames of pickled plain data.

Plain data is None, bool, int, float, str, bytes, bytearray and lists, tuples, dicts, sets and frozensets of them:
what pickle writes without naming any class or function. The unpickler below refuses every class or function a
pickle names, so neither side can make the other build an object (or run code) it did not choose. Used by the
trainer (slimrl.sandbox.wire) and by the sandbox process (imported there as the top-level module `wire`): stdlib only.
"""

from __future__ import annotations

import io
import os
import pickle
import select
import struct
import time

MAX_FRAME_BYTES = 64 * 1024 * 1024
PLAIN_TYPES = "None, bool, int, float, str, bytes, and lists/tuples/dicts/sets of them"
_HEADER = struct.Struct(">I")


class NotPlainData(TypeError):
    """A value that is not plain data was sent or received."""


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise NotPlainData(f"{module}.{name}")

    def persistent_load(self, pid):
        raise NotPlainData("a persistent reference")


def dump(value) -> bytes:
    """Pickle `value`; raises NotPlainData when it holds anything but plain data."""
    try:
        data = pickle.dumps(value, protocol=5)
    except (pickle.PicklingError, TypeError, AttributeError, RecursionError) as exc:
        raise NotPlainData(f"cannot be pickled ({type(exc).__name__}: {exc})") from None
    load(data)  # the same check the receiving side makes
    return data


def load(data: bytes):
    """Unpickle plain data; raises NotPlainData naming the first class or function the pickle refers to."""
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except NotPlainData:
        raise
    except Exception as exc:  # a truncated or malformed pickle
        raise NotPlainData(f"malformed data ({type(exc).__name__}: {exc})") from None


def write_frame(fd: int, data: bytes) -> None:
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def read_frame(fd: int, deadline: float | None = None) -> bytes:
    """One frame from `fd`. EOFError when the other side is gone; TimeoutError when `deadline` (time.monotonic())
    passes first; NotPlainData when the announced length is over MAX_FRAME_BYTES."""
    (length,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
    if length > MAX_FRAME_BYTES:
        raise NotPlainData(f"a message of {length} bytes (the limit is {MAX_FRAME_BYTES})")
    return _read_exact(fd, length, deadline)


def _read_exact(fd: int, size: int, deadline: float | None) -> bytes:
    chunks = []
    while size:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError("deadline passed")
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the pipe")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)
