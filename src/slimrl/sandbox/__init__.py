"""Running code a model wrote, for a reward: Unsloth's `create_locked_down_function`, `check_python_modules` and
`execute_with_time_limit`, with their signatures, but the model's function runs in a separate process.

    from slimrl import check_python_modules, create_locked_down_function, execute_with_time_limit

    ok, info = check_python_modules(code)          # what the sandbox would refuse, before running anything
    strategy = create_locked_down_function(code)   # checks the source; the process starts at the first call
    @execute_with_time_limit(2)
    def play(strategy, board): return strategy(board)

Layers, outermost first (docs/sandbox.md): a separate interpreter (`python -I -S`, empty environment, an empty
temporary working folder, no memory shared with the trainer); the kernel layers of kernel.py (namespaces, Landlock,
rlimits, seccomp); and the interpreter layer of policy.py (allowed imports, builtins and attributes). Arguments and
results cross as plain data only (wire.py). Fail closed (layers.py): model code runs only when every kernel layer
is on, unless the weaker sandbox is accepted (Settings(allow_weaker_sandbox=True) or SLIMRL_SANDBOX_ALLOW_WEAKER=1).
`protection()` says which layers this machine applies.
"""

from __future__ import annotations

from . import layers
from .layers import ALLOW_WEAKER_ENV, SandboxUnavailable
from .limits import execute_with_time_limit
from .policy import ALLOWED_MODULES, check_python_modules
from .worker import LockedDownFunction, SandboxError, Settings, read_ready, take_process

__all__ = [
    "ALLOW_WEAKER_ENV",
    "ALLOWED_MODULES",
    "LockedDownFunction",
    "SandboxError",
    "SandboxUnavailable",
    "Settings",
    "check_python_modules",
    "create_locked_down_function",
    "execute_with_time_limit",
    "protection",
]


def create_locked_down_function(
    function: str, *, time_limit: float = 10.0, memory_mb: int = 512, allow_weaker_sandbox: bool = False
):
    """Unsloth's `create_locked_down_function(code)`: the one function `code` defines, as a callable that runs in a
    sandbox process. Raises RuntimeError now when the code is not a single plain function or uses what the sandbox
    refuses (check_python_modules lists it). Each call takes and returns plain data, may run `time_limit` seconds
    (or until an enclosing execute_with_time_limit's deadline, if earlier) in `memory_mb` MiB of address space, and
    raises TimeoutError past it, SandboxError when the function raises or its process dies. The first call raises
    SandboxUnavailable when a kernel layer is missing here, unless `allow_weaker_sandbox` (or
    SLIMRL_SANDBOX_ALLOW_WEAKER=1) accepts the weaker sandbox."""
    settings = Settings(memory_mb=memory_mb, allow_weaker_sandbox=allow_weaker_sandbox)
    return LockedDownFunction(function, time_limit=time_limit, settings=settings)


def protection(settings: Settings | None = None) -> dict[str, str]:
    """Each protection layer and its status on this machine ("on ..." or "unavailable: why"): starts one sandbox
    process (default settings) and reads what its kernel applied. "model code" says whether model-written code
    runs here (every kernel layer on, or the weaker sandbox accepted) or is refused."""
    settings = settings or Settings()
    process = take_process(settings)
    try:
        kernel_layers = read_ready(process, deadline=_start_deadline())
    finally:
        process.stop()
    status = {"process": "on", "interpreter": "on" if settings.interpreter_policy else "unavailable: switched off"}
    return {**status, **kernel_layers, "model code": layers.verdict(kernel_layers, settings.allow_weaker_sandbox)}


def _start_deadline() -> float:
    import time

    from .worker import START_SECONDS

    return time.monotonic() + START_SECONDS
