"""The Python blocks of docs/distillation.md run as written (one namespace, as a reader would paste them); the
embedded model becomes a tiny local one in the default tier."""

import pytest
from test_docs_unsloth_pages import run_page


def test_distillation_page_runs_on_a_tiny_model(tmp_path, capsys):
    from slimrl import unpatch
    from slimrl.testing import save_tiny_model

    tiny = save_tiny_model(tmp_path / "tiny", hidden_size=32, num_layers=2)
    try:
        out = repr(str(tmp_path / "out"))
        rewrite = lambda block: block.replace('"smollm2-135m"', repr(tiny)).replace('"outputs/gkd-demo"', out)  # noqa: E731
        assert run_page("distillation.md", rewrite) == 2
    finally:
        unpatch()
    assert float(capsys.readouterr().out.strip().splitlines()[-1]) > 0  # the patched trainer's peak metric


@pytest.mark.slow
def test_distillation_page_runs_as_written(capsys):
    from slimrl import unpatch

    try:
        run_page("distillation.md")
    finally:
        unpatch()
