"""Where a model comes from, checked before anything loads: a missing folder, a file that is not GGUF or was cut off,
and a Hub id that cannot be reached each fail at once with a message that names the fix.

Choices:
- A name that can only be a path (absolute, starting with "." or "~", or with more than one "/") must exist; a Hub id
  (`org/name` or `name`) is left to transformers, whose failure is re-raised with what was tried.
- Weights load from safetensors (or GGUF) only: a folder with only pickle weights (`pytorch_model.bin`) raises
  unless `allow_unsafe_weights=True` is passed, since unpickling runs whatever code the file holds.
- A `.gguf` file is read up to the end of its tensor table (header, key-values, tensor infos: milliseconds) and the
  data it declares is compared with the file's size, so a truncated download fails before transformers spends a
  minute dequantizing it. gguf's own reader would catch the same in ~5 s for the embedded model.
"""

from __future__ import annotations

import os
import struct

GGUF_MAGIC = b"GGUF"


class ModelSourceError(FileNotFoundError):
    """The model named cannot be loaded from where it points."""


def looks_like_path(name: str) -> bool:
    return os.path.isabs(name) or name.startswith((".", "~")) or name.count("/") > 1 or name.endswith(".gguf")


def check_local_source(name: str) -> None:
    """A path that does not exist, or a `.gguf` that is not a whole GGUF file, raises ModelSourceError."""
    if looks_like_path(name) and not os.path.exists(os.path.expanduser(name)):
        raise ModelSourceError(
            f"No model folder or file at {name!r}. Check the path, or pass a Hub id "
            "('org/name'), or 'smollm2-135m' for the embedded model."
        )
    if name.lower().endswith(".gguf"):
        check_gguf_file(name)


def check_gguf_file(path: str) -> None:
    with open(path, "rb") as f:
        magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise ModelSourceError(f"{path} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r}).")
        try:
            needed = _declared_size(f)
        except (struct.error, ValueError, KeyError) as exc:
            raise ModelSourceError(
                f"{path} is not a readable GGUF file (its header is cut off or corrupt: {exc}). Download it again."
            ) from exc
    size = os.path.getsize(path)
    if size < needed:
        raise ModelSourceError(
            f"{path} is truncated: its header declares {needed:,} bytes of data, the file has "
            f"{size:,}. Download it again."
        )


def hub_error(path: str, exc: OSError) -> ModelSourceError:
    """A Hub id transformers could not load, said with what was tried."""
    offline = (
        " (HF_HUB_OFFLINE is set: only models already in the local cache load)"
        if os.environ.get("HF_HUB_OFFLINE") in ("1", "true", "True")
        else ""
    )
    return ModelSourceError(
        f"{path!r} is not a local folder, and it could not be loaded as a Hugging Face Hub id"
        f"{offline}: {str(exc).splitlines()[0]} Check the name, pass a local folder or a .gguf "
        "file, or 'smollm2-135m' for the embedded model."
    )


def pickle_only_error(path: str) -> ModelSourceError:
    return ModelSourceError(
        f"{path} holds no safetensors weights, only pickle ones (pytorch_model.bin): unpickling "
        "runs whatever code the file holds, so slimrl does not load them by default. If you trust "
        "the source, pass allow_unsafe_weights=True to FastLanguageModel.from_pretrained; better, "
        "convert it once (model.save_pretrained(folder) writes safetensors)."
    )


def _read(f, fmt: str):
    data = f.read(struct.calcsize(fmt))
    return struct.unpack(fmt, data)[0]


def _skip_value(f, value_type: int) -> None:
    """Skip one key-value value of GGUF type `value_type` (arrays recursively)."""
    scalar = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
    if value_type in scalar:
        f.seek(struct.calcsize(scalar[value_type]), 1)
    elif value_type == 8:  # string
        f.seek(_read(f, "<Q"), 1)
    elif value_type == 9:  # array: item type, count, items
        item_type, count = _read(f, "<I"), _read(f, "<Q")
        if item_type in scalar:
            f.seek(count * struct.calcsize(scalar[item_type]), 1)
        else:
            for _ in range(count):
                _skip_value(f, item_type)
    else:
        raise ValueError(f"unknown value type {value_type}")


def _declared_size(f) -> int:
    """Bytes the file must hold: the data section's start plus the end of its last tensor."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    version, n_tensors, n_kv = _read(f, "<I"), _read(f, "<Q"), _read(f, "<Q")
    if version < 2:
        raise ValueError(f"GGUF version {version} is too old")
    alignment = 32
    for _ in range(n_kv):
        key = f.read(_read(f, "<Q")).decode("utf-8", "replace")
        value_type = _read(f, "<I")
        if key == "general.alignment" and value_type == 4:
            alignment = _read(f, "<I")
        else:
            _skip_value(f, value_type)
    end = 0
    for _ in range(n_tensors):
        f.seek(_read(f, "<Q"), 1)  # the tensor's name
        dims = [_read(f, "<Q") for _ in range(_read(f, "<I"))]
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(_read(f, "<I"))]
        elements = 1
        for d in dims:
            elements *= d
        end = max(end, _read(f, "<Q") + elements // block * block_bytes)
    data_start = -(-f.tell() // alignment) * alignment
    return data_start + end
