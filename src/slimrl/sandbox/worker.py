"""The trainer's side of a sandbox process: start it, hand it the function, call it, stop it.

One process per locked-down function, started at its first call (creating one only checks the source) from a spare
that was already started and locked down with the same settings, so the next function does not wait for an
interpreter to start. A process that runs past its deadline, dies, or sends anything but plain data is stopped with
SIGKILL; the next call starts a fresh one. Processes, and their empty working folders, go when their function is
garbage-collected, closed, or the trainer exits; a process whose trainer dies is killed by the kernel.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref

from . import layers, limits, policy, wire

START_SECONDS = 30.0
OUTPUT_LIMIT_CHARS = 10_000
# __main__ keeps no module: its frame is the outermost of the serving loop's
_BOOT = "import sys; sys.path[:0] = [{folder!r}]; del sys, __builtins__; __import__('child').main()"
_SPARES: dict = {}
_SPARES_LOCK = threading.Lock()


class SandboxError(RuntimeError):
    """The sandboxed function raised (`error_type` names what it raised), returned something that is not plain
    data, or its process ended during the call."""

    def __init__(self, message: str, error_type: str | None = None):
        super().__init__(message)
        self.error_type = error_type


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a sandbox process is started with (equal settings share spares)."""

    memory_mb: int = 512
    cpu_seconds: int = 60  # over the process's life; past it the kernel stops the process
    interpreter_policy: bool = True  # False: the kernel layers alone (any preloaded module may be imported)
    preload: tuple[str, ...] = ()  # modules imported before the lock-down besides the allowed ones
    layers_off: tuple[str, ...] = ()  # kernel layers not applied (see kernel.lock_down)
    # run model code even when a kernel layer is missing (or in layers_off): see layers.py; also the environment's
    # SLIMRL_SANDBOX_ALLOW_WEAKER=1
    allow_weaker_sandbox: bool = False

    def __post_init__(self):
        unknown = set(self.layers_off) - set(layers.KERNEL_LAYERS)
        if unknown:
            raise ValueError(f"layers_off: unknown layers {sorted(unknown)} (known: {', '.join(layers.KERNEL_LAYERS)})")

    def message(self) -> dict:
        return {
            "memory_bytes": self.memory_mb * 1024 * 1024,
            "cpu_seconds": self.cpu_seconds,
            "layers": {name: False for name in self.layers_off},
            "interpreter_policy": self.interpreter_policy,
            "allowed_modules": list(policy.ALLOWED_MODULES),
            "refused_module_attributes": {k: list(v) for k, v in policy.REFUSED_MODULE_ATTRIBUTES.items()},
            "refused_builtins": list(policy.REFUSED_BUILTINS),
            "refused_attributes": list(policy.REFUSED_ATTRIBUTES),
            "preload": list(self.preload),
            "refused_events": list(policy.REFUSED_EVENTS),
            "refused_event_prefixes": list(policy.REFUSED_EVENT_PREFIXES),
            "audited_frame_attributes": list(policy.AUDITED_FRAME_ATTRIBUTES),
            "output_limit": OUTPUT_LIMIT_CHARS,
        }


def _stop(popen: subprocess.Popen, folder: str, owner_pid: int) -> None:
    if os.getpid() != owner_pid:  # a forked copy of the trainer: the process is not its to stop
        return
    if popen.poll() is None:
        popen.kill()
    popen.wait()
    for pipe in (popen.stdin, popen.stdout):
        pipe.close()
    shutil.rmtree(folder, ignore_errors=True)


class _Process:
    def __init__(self, settings: Settings):
        if not sys.executable:
            raise SandboxError("the sandbox needs sys.executable (a Python interpreter to start) and it is empty")
        self.folder = tempfile.mkdtemp(prefix="slimrl-sandbox-")
        boot = _BOOT.format(folder=os.path.dirname(os.path.abspath(__file__)))
        self.popen = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", "-c", boot],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=self.folder,
            env={},
            start_new_session=True,
        )
        self.owner_pid = os.getpid()
        self.stop = weakref.finalize(self, _stop, self.popen, self.folder, self.owner_pid)
        wire.write_frame(self.popen.stdin.fileno(), wire.dump(settings.message()))

    def send(self, message) -> None:
        wire.write_frame(self.popen.stdin.fileno(), message if isinstance(message, bytes) else wire.dump(message))

    def receive(self, deadline: float):
        return wire.load(wire.read_frame(self.popen.stdout.fileno(), deadline))

    def ended(self) -> str:
        """How the process ended (after EOF on its pipe)."""
        try:
            code = self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "it closed its pipe"
        if code < 0:
            name = signal.Signals(-code).name
            return {"SIGXCPU": "it ran out of its CPU budget", "SIGKILL": "it was killed (SIGKILL)"}.get(
                name, f"it ended by {name}"
            )
        return f"it exited with status {code}"


def take_process(settings: Settings) -> _Process:
    """A started, locking-down process for `settings`; a new spare starts in its place."""
    key = (settings, os.getpid())  # a forked copy of the trainer starts its own
    with _SPARES_LOCK:
        process = _SPARES.pop(key, None)
        _SPARES[key] = _Process(settings)
    if process is None or process.popen.poll() is not None:
        process = _Process(settings)
    return process


def read_ready(process: _Process, deadline: float) -> dict:
    """The status of each kernel layer the process applied."""
    kind, status = process.receive(deadline)
    if kind != "ready":
        raise SandboxError(f"the sandbox process answered {kind!r} instead of 'ready'")
    return status


class LockedDownFunction:
    """A model-written function that runs in its own sandbox process; call it like the function itself."""

    def __init__(self, source: str, *, time_limit: float = 10.0, settings: Settings | None = None):
        self.settings = settings or Settings()
        self.__name__ = policy.function_name(source, enforce_policy=self.settings.interpreter_policy)
        self.source = source
        self.time_limit = limits.check_seconds(time_limit)
        self.protection: dict | None = None  # each kernel layer's status, once a process has started
        self._process: _Process | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<sandboxed function {self.__name__}>"

    def close(self) -> None:
        """Stop the process now (the next call starts a fresh one)."""
        if self._process is not None:
            self._process.stop()
            self._process = None

    def _deadline(self, seconds: float) -> tuple[float, float]:
        now = time.monotonic()
        deadline, limit = now + seconds, seconds
        outer = limits.current_deadline()
        if outer is not None and outer[0] < deadline:
            deadline, limit = outer
        if deadline <= now:
            raise limits.timeout_error(limit)
        return deadline, limit

    def _start(self) -> _Process:
        deadline, limit = self._deadline(START_SECONDS)
        process = take_process(self.settings)
        try:
            self.protection = read_ready(process, deadline)
            layers.enforce(self.protection, self.settings.allow_weaker_sandbox)  # the source is not sent otherwise
            process.send({"source": self.source, "name": self.__name__, "annotations_flag": policy.ANNOTATIONS_FLAG})
            self._reply(process.receive(deadline))
        except TimeoutError:
            process.stop()
            if limit == START_SECONDS:
                raise SandboxError(f"the sandbox process did not start within {START_SECONDS:g} s") from None
            raise limits.timeout_error(limit) from None
        except BaseException:
            process.stop()
            raise
        return process

    def _reply(self, reply):
        if reply[0] == "error":
            kind, error_type, message, output = reply
            sys.stdout.write(output)
            raise SandboxError(f"{self.__name__} raised {error_type}: {message}", error_type=error_type)
        sys.stdout.write(reply[-1])
        return reply[1] if reply[0] == "ok" else None

    def __call__(self, *args, **kwargs):
        try:
            payload = wire.dump({"args": args, "kwargs": kwargs})
        except wire.NotPlainData as exc:
            raise TypeError(f"{self.__name__}: arguments must be plain data ({wire.PLAIN_TYPES}); got {exc}") from None
        if len(payload) > wire.MAX_FRAME_BYTES:
            raise ValueError(
                f"{self.__name__}: arguments of {len(payload)} bytes (the limit is {wire.MAX_FRAME_BYTES})"
            )
        with self._lock:
            if self._process is not None and self._process.owner_pid != os.getpid():
                self._process = None  # called in a forked copy of the trainer: start its own process
            if self._process is None:
                self._process = self._start()
            deadline, limit = self._deadline(self.time_limit)
            try:
                self._process.send(payload)
                reply = self._process.receive(deadline)
            except TimeoutError:
                self.close()
                raise limits.timeout_error(limit) from None
            except (EOFError, BrokenPipeError) as exc:
                how = self._process.ended() if self._process is not None else str(exc)
                self.close()
                raise SandboxError(f"{self.__name__}: the sandbox process ended during the call: {how}") from None
            except wire.NotPlainData as exc:
                self.close()
                raise SandboxError(f"{self.__name__} returned a value that is not plain data: {exc}") from None
            except BaseException:
                self.close()
                raise
        return self._reply(reply)
