"""slimrl/noise.py: bitsandbytes' kernel-download line, printed at import on AVX512-BF16 CPUs, is dropped at slimrl's
import of bitsandbytes (the API's first use, every CLI command); other bitsandbytes lines still show. The CPU feature
is simulated (bitsandbytes.functional.has_avx512bf16 answers True), so the test runs on any CPU."""

import subprocess
import sys

import pytest

pytest.importorskip("bitsandbytes", reason="bitsandbytes is an optional extra (pip install 'slimrl[quant]')")

LINE = "Failed to load CPU gemm_4bit_forward from kernels-community"
# Makes bitsandbytes take its AVX512-BF16 path at import: it then tries the optional `kernels` package (absent, or
# offline) and logs LINE
SIMULATE_AVX512_BF16 = """
import importlib.machinery, os, sys
os.environ["HF_HUB_OFFLINE"] = "1"

class AnswerAvx512Bf16:
    def find_spec(self, name, path, target=None):
        if name != "bitsandbytes.functional":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        real_exec = spec.loader.exec_module

        def exec_module(module):
            real_exec(module)
            module.has_avx512bf16 = lambda: True

        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, AnswerAvx512Bf16())
"""


def _stderr(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", SIMULATE_AVX512_BF16 + code], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stderr


def test_a_plain_import_prints_the_line():  # the negative control: the simulation does produce it
    assert LINE in _stderr("import bitsandbytes")


def test_slimrls_import_drops_only_that_line():
    err = _stderr(
        "import logging\n"
        "from slimrl.noise import import_bitsandbytes_quietly, BNB_LOGGER\n"
        "import_bitsandbytes_quietly()\n"
        "import peft  # imports bitsandbytes again: nothing more is printed\n"
        "logging.getLogger(BNB_LOGGER).warning('another bitsandbytes line')\n"
        "assert not logging.getLogger(BNB_LOGGER).filters, 'the filter is removed after the import'\n"
    )
    assert LINE not in err and "another bitsandbytes line" in err


def test_the_api_and_the_cli_print_no_such_line():
    assert LINE not in _stderr("import slimrl\nslimrl.FastLanguageModel\nimport peft")
    assert LINE not in _stderr("from slimrl.cli import main\nassert main(['doctor']) == 0")
