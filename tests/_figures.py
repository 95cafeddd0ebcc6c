"""The figures of README.md and docs/*.md, and the results files they name (tests/test_figures.py; the convention is in
docs/testing.md, "Figures and their results files").

A page is read as blocks (paragraphs, tables, list runs: text between blank lines), fenced code left out. A block is
marked by an HTML comment line before it (or as its first line):
- `<!-- results: bench/results/committed/NAME.json [...] -->`: a measurement; every number in the block must occur in
  one of those files (bench/_common.py's write_results: the data and everything the script printed), to the digits
  shown: 0.24 is held by 0.2411, by 0.235 and by the text "0.24×".
- `<!-- not measured: REASON -->`: the block's numbers look like figures but are settings, limits or arithmetic.
An unmarked block with a figure (a number with a unit of memory, time, speed or ratio, an "a -> b" change, a test
count, or a table cell that is a bare decimal) is a figure without its results file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = "bench/results/committed/"
PROVENANCE = ("commit", "command", "date", "machine", "versions")

NUM = r"\d+(?:,\d{3})*(?:\.\d+)?(?:e[-+]?\d+)?"
NUMBER = re.compile(rf"(?<![\w.]){NUM}(?!\.\d)(?![A-Za-z])")  # not inside a name (Qwen2.5, H100, 8b) or a version
UNIT = r"GiB|GB|MiB|MB|KiB|kB|ms|s/step|s|min|minutes?|seconds?|hours?|tokens/s|it/s|%"
FIGURE = re.compile(
    rf"(?<![\w.]){NUM}(?:\s*[-–]\s*{NUM})?(?:×|\s*(?:(?:{UNIT})(?![A-Za-z])|(?:passed|failed|skipped)\b))"
    rf"|(?<![\w.]){NUM}\s*(?:->|→)\s*{NUM}"
)
BARE_CELL = re.compile(r"^\**~?\d+\.\d+(?:×|%)?\**$")  # a table cell holding only a decimal: a measured value
MARKER = re.compile(r"^<!--\s*(results|not measured):\s*(.*?)\s*-->$")
FENCE = re.compile(r"^\s*(```|~~~)")


@dataclass
class Block:
    page: str
    line: int
    text: str
    mark: tuple[str, str] | None = None  # ("results", "a.json b.json") or ("not measured", reason)
    figures: list[str] = field(default_factory=list)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def prose(text: str) -> str:
    """The text a reader sees as numbers: no inline code, link targets or HTML comments."""
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)
    return re.sub(r"\]\([^)]*\)", "]", text)


def figures(text: str) -> list[str]:
    found = [m.group(0) for m in FIGURE.finditer(prose(text))]
    for line in text.splitlines():
        if line.lstrip().startswith("|"):
            found += [cell.strip() for cell in line.strip().strip("|").split("|") if BARE_CELL.match(cell.strip())]
    return found


def _raw_blocks(text: str) -> list[tuple[int, list[str]]]:
    blocks, current, start, fenced = [], [], 0, False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        if fenced or FENCE.match(line) or not line.strip():
            if current:
                blocks.append((start, current))
            current = []
            continue
        if not current:
            start = number
        current.append(line)
    return blocks + ([(start, current)] if current else [])


def blocks(page: Path) -> list[Block]:
    """The page's blocks, each with the marker that precedes it (or opens it) and its figures."""
    out, pending = [], None
    for start, lines in _raw_blocks(page.read_text()):
        marker = MARKER.match(lines[0].strip())
        if marker:
            pending, lines, start = (marker.group(1), marker.group(2)), lines[1:], start + 1
            if not lines:
                continue
        text = "\n".join(lines)
        out.append(Block(page.name, start, text, pending, figures(text)))
        pending = None
    return out


def numbers(text: str) -> list[str]:
    """Every number a reader sees in the text, as written (thousands separators dropped)."""
    return [m.group(0).replace(",", "") for m in NUMBER.finditer(prose(text))]


def held_numbers(value) -> list[Decimal]:
    """Every number in a results file: its numeric values, keys and the numbers inside its strings (what it printed)."""
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int | float):
        return [Decimal(repr(value))] if value == value and abs(value) != float("inf") else []
    if isinstance(value, str):
        return [Decimal(token) for token in numbers(value)]
    if isinstance(value, dict):
        return [n for key, item in value.items() for n in held_numbers(str(key)) + held_numbers(item)]
    if isinstance(value, list):
        return [n for item in value for n in held_numbers(item)]
    return []


def is_held(written: str, held: list[Decimal]) -> bool:
    """Whether a number as written equals a held one to the digits shown (half a unit of its last digit)."""
    shown = Decimal(written)
    half = Decimal(1).scaleb(shown.as_tuple().exponent) / 2
    return any(abs(value - shown) <= half for value in held)


def results_problems(block: Block) -> list[str]:
    """What is wrong with a block marked `results:`: a file missing or outside bench/results/committed/, a results
    file without its provenance, or a number no named file holds."""
    paths = block.mark[1].split()
    problems, held = [], []
    for path in paths:
        if not path.startswith(COMMITTED) or not (ROOT / path).is_file():
            problems.append(f"{path}: not a file under {COMMITTED}")
            continue
        data = json.loads((ROOT / path).read_text())
        missing = [key for key in PROVENANCE if not data.get("provenance", {}).get(key)]
        if missing:
            problems.append(f"{path}: provenance lacks {missing} (write it with bench/_common.py's write_results)")
        held += held_numbers(data)
    if not paths:
        problems.append("the marker names no results file")
    if not problems:
        problems += [f"{n} is in none of {paths}" for n in numbers(block.text) if not is_held(n, held)]
    return problems
