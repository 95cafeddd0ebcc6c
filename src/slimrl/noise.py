"""Third-party start-up noise slimrl keeps off the screen at its source, for the API and the CLI alike.

bitsandbytes 0.50, when imported on a CPU with AVX512-BF16, tries to fetch an optional kernel from the Hub
(`kernels-community/quantization-bitsandbytes`) and, without the `kernels` package, logs "Failed to load CPU
gemm_4bit_forward from kernels-community: ..." on its `bitsandbytes.backends.cpu.ops` logger. The kernel serves the
CPU 4-bit inference path slimrl switches off anyway (slimrl.models.quantization), and peft imports bitsandbytes
whenever it is installed, so every run would print the line. slimrl imports bitsandbytes first, with a filter on that
one logger that drops that one message, and removes the filter right after: any other bitsandbytes line still shows,
and a later failure to load the kernel (none is attempted after import) would too.
"""

from __future__ import annotations

import importlib.util
import logging
import sys

BNB_LOGGER = "bitsandbytes.backends.cpu.ops"
BNB_KERNEL_LINE = "Failed to load CPU gemm_4bit_forward from kernels-community"


class DropLine(logging.Filter):
    """Drops the records whose message (before formatting) starts with `start`."""

    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.start)


def import_bitsandbytes_quietly() -> None:
    """Import bitsandbytes, when it is installed and not imported yet, without its kernel-download line."""
    if "bitsandbytes" in sys.modules or importlib.util.find_spec("bitsandbytes") is None:
        return
    logger, line_filter = logging.getLogger(BNB_LOGGER), DropLine(BNB_KERNEL_LINE)
    logger.addFilter(line_filter)
    try:
        import bitsandbytes  # noqa: F401
    finally:
        logger.removeFilter(line_filter)
