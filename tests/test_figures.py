"""Every figure in README.md and docs/*.md that is a measurement names the committed results file that holds it
(the convention: tests/_figures.py and docs/testing.md, "Figures and their results files"). There are no exceptions:
a figure whose results file is not committed is not quoted.
"""

import json

import pytest

import _figures as F

BLOCKS = [block for page in F.pages() for block in F.blocks(page)]


def _without_results(blocks: list[F.Block]) -> list[F.Block]:
    """The blocks with a figure and no marker."""
    return [b for b in blocks if b.figures and b.mark is None]


def test_every_figure_names_its_results_file():
    unmarked = _without_results(BLOCKS)
    assert unmarked == [], (
        "figures without a results file: put <!-- results: bench/results/committed/NAME.json --> before the block "
        "(a bench script's --json), or <!-- not measured: REASON --> where its numbers are settings or arithmetic:\n"
        + "\n".join(f"{b.page}:{b.line}: {b.figures[:6]}" for b in unmarked)
    )


def test_every_marked_figure_is_in_the_results_files_it_names():
    marked = [b for b in BLOCKS if b.mark and b.mark[0] == "results"]
    problems = {f"{b.page}:{b.line}": F.results_problems(b) for b in marked}
    assert {where: found for where, found in problems.items() if found} == {}


def test_an_unmarked_figure_fails_and_a_marker_accounts_for_one(tmp_path):  # the negative control
    page = tmp_path / "page.md"
    page.write_text("A step takes 12.5 s.\n\n<!-- not measured: a limit -->\n\nCalls stop after 10 s.\n")
    assert [(b.line, b.figures) for b in _without_results(F.blocks(page))] == [(1, ["12.5 s"])]


def test_not_measured_marks_give_their_reason():
    bare = [f"{b.page}:{b.line}" for b in BLOCKS if b.mark and b.mark[0] == "not measured" and not b.mark[1]]
    assert bare == []


def test_figures_are_found_in_prose_and_tables_and_settings_in_code_are_not():
    found = F.figures("peak 5.35 GiB, 85.3 s (0.76×); 0.344 → 0.594; 44 passed; 8 × 512 tokens; TRL 1.16; `128 MiB`")
    assert found == ["5.35 GiB", "85.3 s", "0.76×", "0.344 → 0.594", "44 passed"]
    assert F.figures("go from 0.00 to 1.00; accuracy 0.31 to 0.52; 45.0 to 46.2 s; from 3 to 5 layers; 0.29-0.98") == [
        "0.00 to 1.00",
        "0.31 to 0.52",
        "45.0 to 46.2 s",
        "0.29-0.98",
    ]
    assert F.figures("| 8b | 8 × 8192 | stock | 50.80 | **0.78** |") == ["50.80", "**0.78**"]
    assert F.figures("Qwen2.5-7B, H100, 8b, vllm 0.32.1, [page](memory.md#v-152k)") == []


def _page_with(tmp_path, table: str, held: dict) -> F.Block:
    results = tmp_path / "bench" / "results" / "committed" / "x.json"
    results.parent.mkdir(parents=True)
    provenance = {"commit": "abc", "command": "python bench/x.py", "date": "2026-01-01", "machine": {"cores": 2}}
    results.write_text(json.dumps({"provenance": {**provenance, "versions": {"trl": "1.16.0"}}, **held}))
    page = tmp_path / "page.md"
    page.write_text(f"Intro.\n\n<!-- results: bench/results/committed/x.json -->\n\n{table}\n")
    return next(b for b in F.blocks(page) if b.mark)


def test_a_marked_table_passes_when_its_file_holds_each_number_to_the_digits_shown(tmp_path, monkeypatch):
    monkeypatch.setattr(F, "ROOT", tmp_path)
    table = "| arm | peak GiB | ratio |\n|---|---|---|\n| stock | 5.35 | 1.00 |\n| slimrl | **1.29** | 0.24× |"
    held = {"rows": [{"peak": 5.3512}, {"peak": 1.2866}], "stdout": "| slimrl | 1.29 | 0.24× |\n1.00"}
    assert F.results_problems(_page_with(tmp_path, table, held)) == []


def test_a_number_the_file_does_not_hold_fails(tmp_path, monkeypatch):  # the negative control
    monkeypatch.setattr(F, "ROOT", tmp_path)
    table = "| arm | peak GiB |\n|---|---|\n| stock | 5.35 |\n| slimrl | 1.31 |"
    problems = F.results_problems(_page_with(tmp_path, table, {"rows": [{"peak": 5.3512}, {"peak": 1.2866}]}))
    assert [p.split(":")[0] for p in problems] == ["1.31"]


ROWS = {
    "rows": [
        {"arm": "stock", "peak_gib": 5.3512, "s_per_step": 2.2, "accuracy": 0.31},
        {"arm": "slimrl", "peak_gib": 1.2866, "s_per_step": 3.9, "accuracy": 0.52},
    ],
    "steps": 12,
    "accuracy_before": 0.336,
    "accuracy_after": 0.695,
}


@pytest.mark.parametrize(
    "prose",
    [
        "Peak 1.29 GiB in 3.9 s; accuracy 0.31 to 0.52 over the arms, 0.336 → 0.695 held-out, 12 steps.",
        "| arm | peak GiB | s/step |\n|---|---|---|\n| stock | 5.35 | 2.2 |",
        "| | value |\n|---|---|\n| held-out accuracy, before → after | 0.336 → 0.695 |",
    ],
)
def test_figures_held_by_their_row_and_field_pass(tmp_path, monkeypatch, prose):
    monkeypatch.setattr(F, "ROOT", tmp_path)
    assert F.results_problems(_page_with(tmp_path, prose, ROWS)) == []


@pytest.mark.parametrize(
    "prose, wrong",
    [
        ("Accuracy went from 0.31 to 0.53 over the arms.", "0.31 to 0.53"),  # a planted wrong figure in prose
        ("Held-out accuracy 0.336 → 0.52.", "0.336 → 0.52"),  # both ends held, by no one row
        ("The loss went 0.31 to 0.52 over the arms.", "0.31 to 0.52"),  # held as accuracy, not as a loss
        ("A step takes 12 s.", "12 s"),  # 12 is only the steps count: an unrelated field
        ("The peak is 2.2 GiB.", "2.2 GiB"),  # 2.2 is a time
        ("| arm | peak GiB |\n|---|---|\n| stock | 3.90 |", "3.90"),  # the column names the field
        ("| arm | accuracy |\n|---|---|\n| stock | 2.20 |", "2.20"),  # so does a column without a unit
    ],
)
def test_a_figure_held_only_elsewhere_in_the_file_fails(tmp_path, monkeypatch, prose, wrong):  # negative controls
    monkeypatch.setattr(F, "ROOT", tmp_path)
    problems = F.results_problems(_page_with(tmp_path, prose, ROWS))
    assert [p.split(":")[0] for p in problems] == [wrong], problems


def test_the_docs_planted_wrong_range_fails():  # the negative control on a real page and its results file
    base = next(b for b in BLOCKS if b.page == "vision.md" and b.mark and b.mark[0] == "results")
    assert F.results_problems(base) == []
    planted = {"The accuracy went 0.31 to 0.52.": "0.31 to 0.52", "Peak 0.31 to 0.52 GiB.": "0.31 to 0.52 GiB"}
    for sentence, figure in planted.items():
        block = F.Block(base.page, base.line, f"{base.text}\n\n{sentence}", base.mark)
        assert [p.split(":")[0] for p in F.results_problems(block)] == [figure]


def test_a_results_file_outside_committed_or_without_provenance_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(F, "ROOT", tmp_path)
    block = _page_with(tmp_path, "peak 5.35 GiB", {"peak": 5.35})
    block.mark = ("results", "bench/results/x.json")
    assert F.results_problems(block) == [f"bench/results/x.json: not a file under {F.COMMITTED}"]
    (tmp_path / F.COMMITTED / "x.json").write_text(json.dumps({"peak": 5.35}))
    block.mark = ("results", F.COMMITTED + "x.json")
    assert "provenance lacks" in F.results_problems(block)[0]
