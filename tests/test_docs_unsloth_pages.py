"""The Python blocks of docs/sandbox.md and docs/unsloth-names.md run as written (each page in one namespace, as a
reader would paste them); the embedded model becomes a tiny local one in the default tier."""

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


def run_page(name: str, rewrite=lambda block: block) -> int:
    namespace = {"__name__": "__docs__"}
    blocks = BLOCK.findall((DOCS / name).read_text())
    for number, block in enumerate(blocks, 1):
        if block.startswith("# not run:"):
            continue
        try:
            exec(compile(rewrite(block), f"{name} block {number}", "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"{name} python block {number} failed: {exc!r}\n{block}") from exc
    return len(blocks)


def test_sandbox_page_runs(capsys, monkeypatch):
    from _layers_here import accept_weaker_sandbox_if_missing

    accept_weaker_sandbox_if_missing(monkeypatch)  # a machine lacking a kernel layer refuses the examples by default
    assert run_page("sandbox.md") == 3
    printed = capsys.readouterr().out
    assert "['W', 'W', 'W']" in printed and "[1.0, -20.0, -1.0, -3.0]" in printed


def test_names_page_runs_on_a_tiny_model(tiny_dir, capsys):
    assert run_page("unsloth-names.md", lambda block: block.replace('"smollm2-135m"', repr(tiny_dir))) == 1
    assert "['k_proj', 'o_proj', 'q_proj', 'v_proj']" in capsys.readouterr().out


@pytest.mark.slow
def test_names_page_runs_as_written(capsys):
    run_page("unsloth-names.md")
    assert "['k_proj', 'o_proj', 'q_proj', 'v_proj']" in capsys.readouterr().out


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from slimrl.testing import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=32, num_layers=2)
