"""The checkpointing mode's precedence (slimrl.models.checkpointing.ROWS): one case per row and per device answer,
and a control that the cases tell the rows' order apart."""

import dataclasses

import pytest

from slimrl.models import checkpointing
from slimrl.models.checkpointing import ASKED, CONFIG_FLAG, CONFIG_OFFLOAD, MARKED, TRL_OFFLOADS, resolve_checkpointing

# (inputs, mode, deciding row, moves): each row matched with every later row's condition also true where one can be
CASES = [
    (dict(asked="unsloth", mark=True, flag=False, trl_offloading=True), "offload", ASKED, False),
    (dict(asked=False, mark="offload", trl_offloading=True, flag=True, kwargs_offload=True), False, ASKED, False),
    (dict(asked="offload", device="cuda"), "offload", ASKED, True),
    (
        dict(mark="offload", trl_offloading=True, flag=True, kwargs_offload=True, device="cuda"),
        True,
        TRL_OFFLOADS,
        False,
    ),
    (dict(mark="offload", trl_offloading=False, device="cuda"), "offload", MARKED, True),
    (dict(mark=True, trl_offloading=True, flag=True, kwargs_offload=True), True, MARKED, False),
    (dict(mark=False, flag=True, kwargs_offload=True), False, MARKED, False),
    (dict(mark="offload", device="cpu"), "offload", MARKED, False),
    (dict(mark="offload", device="cpu", host_tensors=True), "offload", MARKED, True),
    (dict(flag=True, kwargs_offload=True, trl_offloading=True, device="cuda"), "offload", CONFIG_OFFLOAD, True),
    (dict(flag=False, kwargs_offload=True), False, CONFIG_FLAG, False),
    (dict(flag=True, device="cuda"), True, CONFIG_FLAG, False),
    (dict(flag="offload", device="cuda"), "offload", CONFIG_FLAG, True),  # a plan's dict may give the mode as text
    (dict(flag=None), False, CONFIG_FLAG, False),
    ({}, False, CONFIG_FLAG, False),
]


def _check(cases) -> list:
    """The cases whose resolution differs from the expected one."""
    wrong = []
    for inputs, mode, row, moves in cases:
        got = resolve_checkpointing(**inputs)
        if (got.mode, got.row, got.moves) != (mode, row, moves) or type(got.mode) is not type(mode):
            wrong.append((inputs, got))
    return wrong


def test_every_row_resolves_as_its_table_says():
    assert {row for _, _, row, _ in CASES} == {row.number for row in checkpointing.ROWS}
    assert [row.number for row in checkpointing.ROWS] == list(range(1, len(checkpointing.ROWS) + 1))
    assert _check(CASES) == []
    with pytest.raises(ValueError, match="use_gradient_checkpointing"):
        resolve_checkpointing(asked="sometimes")


@pytest.mark.parametrize("first", range(len(checkpointing.ROWS) - 1))
def test_negative_control_the_cases_catch_two_rows_swapped(monkeypatch, first):
    rows = list(checkpointing.ROWS)
    rows[first], rows[first + 1] = rows[first + 1], rows[first]
    monkeypatch.setattr(checkpointing, "ROWS", tuple(rows))
    assert _check(CASES), f"rows {first + 1} and {first + 2} swapped went unnoticed"


def test_negative_control_the_cases_catch_a_row_whose_mode_changes(monkeypatch):
    rows = [
        dataclasses.replace(row, mode=lambda i: True) if row.number == CONFIG_OFFLOAD else row
        for row in checkpointing.ROWS
    ]
    monkeypatch.setattr(checkpointing, "ROWS", tuple(rows))
    assert _check(CASES)
