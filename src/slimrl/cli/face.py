"""What the `slimrl` command shows when something goes wrong, and the library noise it keeps off the screen.

1. A user error (bad input: a value, a path, a version, a moved TRL seam, a failing reward) prints one line,
   `slimrl <command>: error: <message>`, and exits 2; the message already names the fix. The traceback appears with
   a bare `--debug` flag (anywhere on the line) or SLIMRL_DEBUG=1. Anything else (a bug) keeps its traceback.
2. Known noise, silenced during a command (each is harmless and would otherwise repeat or break the progress bar):
   - bitsandbytes' "Failed to load CPU gemm_4bit_forward from kernels-community" at every start on AVX512-BF16 CPUs
     (an optional kernel package for a path slimrl switches off anyway): dropped at its source, slimrl's import of
     bitsandbytes (slimrl/noise.py), which the command does first, as the API's first use does;
   - transformers' FutureWarnings about `gradient_checkpointing` names TRL 1.16 still uses (renamed to
     `activation_checkpointing` in transformers 5);
   - torch's "'pin_memory' argument is set as true but no accelerator is found" on CPU, printed mid-progress-bar;
   - TRL's TRLExperimentalWarning for the experimental ORPO trainer `slimrl orpo` runs on purpose.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings

NOISY_WARNINGS = (
    (FutureWarning, r".*(gradient_checkpointing|is_gradient_checkpointing|activation_checkpointing).*"),
    (UserWarning, r".*'pin_memory' argument is set as true but no accelerator is found.*"),
)


def user_errors() -> tuple[type[BaseException], ...]:
    from slimrl.patches.seams import PatchError

    return ValueError, OSError, ImportError, NotImplementedError, PatchError


def take_debug_flag(argv: list[str]) -> bool:
    """Remove a bare `--debug` from argv (TrainingArguments' own `--debug <mode>` keeps its value) and say whether
    tracebacks were asked for."""
    found = False
    for i in range(len(argv) - 1, -1, -1):
        if argv[i] == "--debug" and (i + 1 == len(argv) or argv[i + 1].startswith("--")):
            del argv[i]
            found = True
    return found or os.environ.get("SLIMRL_DEBUG") in ("1", "true", "True")


def print_user_error(command: str, exc: BaseException, out=None) -> None:
    message = str(exc).strip() or type(exc).__name__
    print(f"slimrl {command}: error: {message}\n(run with --debug for the traceback)", file=out or sys.stderr)


@contextlib.contextmanager
def quiet_known_noise():
    """The noise of the module docstring, silenced for the duration (filters removed afterwards)."""
    from slimrl.noise import import_bitsandbytes_quietly

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    with warnings.catch_warnings():
        for category, message in NOISY_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=category)
        import_bitsandbytes_quietly()
        yield
