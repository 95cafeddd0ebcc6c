"""The Python blocks of README.md and docs/*.md, and how the tests run them (tests/test_readme.py, test_docs.py).

A page's blocks run in order, in one namespace (as a reader would paste them into a notebook). Default tier: on a
tiny local model in place of the embedded "smollm2-135m" (the embedded model needs its own package) and with
`max_steps` capped at 1. Slow tier: exactly as written. A block whose first line is a mark runs only where the mark
allows (docs/testing.md): `# needs: vllm`, `# needs: cuda`, `# needs: hub` (never here: a Hub account and network;
tests/export/test_hub.py covers it on a stand-in) or `# not run: <reason>`. An unknown mark fails, so a misspelt one
cannot hide a block.
"""

import importlib.util
import re
from contextlib import contextmanager
from pathlib import Path

import torch

from slimrl.patches.on_import import AUTO_PATCH_OFF

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)
NEEDS = re.compile(r"# needs: (\S+)\s*$")
NOT_RUN = re.compile(r"# not run: *(.*)$")


def docs_pages() -> list[Path]:
    """Every Markdown page of the site (docs/_drafts/ holds unpublished text, as mkdocs.yml's exclude_docs says)."""
    return sorted(p for p in DOCS.rglob("*.md") if "_drafts" not in p.relative_to(DOCS).parts)


def python_blocks(page: Path) -> list[str]:
    return BLOCK.findall(page.read_text())


def _available() -> dict[str, bool]:
    return {
        "vllm": importlib.util.find_spec("vllm") is not None,
        "cuda": torch.cuda.is_available(),
        "hub": False,
    }


def runs_here(block: str) -> bool:
    """Whether the block runs in this environment; raises on a mark the tests do not know."""
    first = block.split("\n", 1)[0]
    not_run = NOT_RUN.match(first)
    if not_run:
        if not not_run.group(1).strip():
            raise ValueError("a `# not run:` mark needs its reason")
        return False
    needs = NEEDS.match(first)
    if needs is None:
        return True
    available = _available()
    if needs.group(1) not in available:
        raise ValueError(f"unknown mark {first!r}: use one of {sorted(available)} or `# not run: <reason>`")
    return available[needs.group(1)]


def tiny(block: str, model_dir: str) -> str:
    block = block.replace('"smollm2-135m"', repr(model_dir))
    return re.sub(r"max_steps=\d+", "max_steps=1", block)


@contextmanager
def as_a_fresh_script(monkeypatch):
    """Patching on import on, as in the reader's own process (tests/conftest.py turns it off for the suite), and
    off again afterwards: `from slimrl import FastLanguageModel` then patches the TRL trainers the page imports."""
    from slimrl.patches import auto

    monkeypatch.delenv(AUTO_PATCH_OFF, raising=False)
    before = auto.HOOK.get()
    auto.HOOK.set(auto.NOT_REQUESTED)
    try:
        yield
    finally:
        auto.uninstall()  # the hook goes; tests/conftest.py's fixture unpatches the trainers
        auto.HOOK.set(before)


def run_blocks(page: Path, tmp_path, monkeypatch, rewrite=lambda block: block) -> tuple[int, dict]:
    """(how many blocks ran, the page's namespace) after running every block that runs here, in order, in a
    process set up as the reader's would be (as_a_fresh_script)."""
    monkeypatch.chdir(tmp_path)  # outputs/... land in the test's folder
    with as_a_fresh_script(monkeypatch):
        return _run_in_order(page, rewrite)


def _run_in_order(page: Path, rewrite) -> tuple[int, dict]:
    namespace = {"__name__": "__docs__"}
    ran = 0
    for number, block in enumerate(python_blocks(page), 1):
        if not runs_here(block):
            continue
        try:
            exec(compile(rewrite(block), f"{page.name} block {number}", "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"{page.name} python block {number} failed: {exc!r}\n{block}") from exc
        ran += 1
    return ran, namespace
