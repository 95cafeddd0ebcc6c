"""The figures of README.md and docs/*.md, and the results files they name (tests/test_figures.py; the convention is in
docs/testing.md, "Figures and their results files").

A page is read as blocks (paragraphs, tables, list runs: text between blank lines), fenced code left out. A block is
marked by an HTML comment line before it (or as its first line):
- `<!-- results: bench/results/committed/NAME.json [...] -->`: a measurement. Each figure is matched to a row and a
  field of those files (bench/_common.py's write_results: the data and every line the script printed), to the digits
  shown (0.24 is held by 0.2411, by 0.235 and by a printed "0.24×"): a figure with a unit (or in a table column whose
  header names one) by a numeric value whose key names that kind of quantity (GiB: peak_gib, peak, bytes...; s:
  quiet_s, seconds, times...; ×: ratio, slowdown...) or by a printed line; a change "a -> b" by one row (a JSON
  object, the file's top-level values, or one printed line) holding both ends; a range "a-b" or "a to b" end by end;
  a figure without a unit by a value whose key holds a word of its sentence (in a table: of its column's header or
  its row's first cell). Every other number of the block must be a numeric value or in a printed line of those files
  (keys hold none).
- `<!-- not measured: REASON -->`: the block's numbers look like figures but are settings, limits or arithmetic.
An unmarked block with a figure (a number with a unit of memory, time, speed or ratio, an "a -> b" change, two
decimals joined by "to" or a dash, a test count, or a table cell that is a bare decimal) is a figure without its
results file.
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
DECIMAL = r"\d+\.\d+"
FIGURE = re.compile(
    rf"(?<![\w.]){NUM}(?:\s*(?:[-–]|to)\s*{NUM})?(?:×|\s*(?:(?:{UNIT})(?![A-Za-z])|(?:passed|failed|skipped)\b))"
    rf"|(?<![\w.]){NUM}\s*(?:->|→)\s*{NUM}"
    rf"|(?<![\w.]){DECIMAL}\s*(?:to|[-–])\s*{DECIMAL}(?!\.?\d)"  # "from 0.00 to 1.00", "0.29-0.98": a change or a range
)
CHANGE = re.compile(r"->|→")
RANGE = re.compile(r"(?<=\d)\s*(?:[-–]|to)\s*(?=\d)")
FIELDS = {  # a unit, and the key words of the numeric values that can hold a figure in it
    "memory": (r"GiB|GB|MiB|MB|KiB|kB", r"gib|gb|mib|mb|peak|bytes|mem|resident|reserved|working|used|total|saved"),
    "time": (r"ms|s/step|s|min|minutes?|seconds?|hours?", r"(^|[._])s$|_s[._]|sec|time|_ms|ms$|wall|s_per_|median"),
    "ratio": (r"×|x", r"ratio|slowdown|speed|over|factor"),
    "rate": (r"tokens/s|it/s", r"per_s|rate"),
    "tests": (r"passed|failed|skipped", r"passed|failed|skipped|tests"),
}
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


@dataclass
class Held:
    """What results files hold: numeric values with their key paths, and rows (a JSON object's values, the top-level
    values, one printed line) as lists of numbers. Keys hold no numbers."""

    values: list[tuple[str, Decimal]] = field(default_factory=list)
    rows: list[list[tuple[str, Decimal]]] = field(default_factory=list)
    lines: list[list[Decimal]] = field(default_factory=list)

    def add(self, value, path: str = "", top: bool = True) -> list[tuple[str, Decimal]]:
        """Record `value` (a loaded results file when top) and return the (key path, number) pairs under it."""
        if isinstance(value, bool) or value is None:
            return []
        if isinstance(value, int | float):
            if value != value or abs(value) == float("inf"):
                return []
            self.values.append((path.lower(), Decimal(repr(value))))
            return [self.values[-1]]
        if isinstance(value, str):
            self.lines += [row for row in ([Decimal(n) for n in numbers(line)] for line in value.splitlines()) if row]
            return []
        if isinstance(value, list):
            return [n for item in value for n in self.add(item, path, False)]
        if not isinstance(value, dict):
            return []
        under, own = [], []
        for key, item in value.items():
            found = self.add(item, f"{path}.{key}", False)
            under += found
            own += found if not isinstance(item, dict | list) else []
        self.rows.append(own if top else under)
        return under

    def numbers(self) -> list[Decimal]:
        return [number for _, number in self.values] + [number for line in self.lines for number in line]


def is_held(written: str, held: list[Decimal]) -> bool:
    """Whether a number as written equals a held one to the digits shown (half a unit of its last digit)."""
    shown = Decimal(written)
    half = Decimal(1).scaleb(shown.as_tuple().exponent) / 2
    return any(abs(value - shown) <= half for value in held)


def _keys_for(unit: str | None) -> str | None:
    """The key words of the values that can hold a figure in `unit` (None: any value)."""
    return next((keys for pattern, keys in FIELDS.values() if unit and re.fullmatch(pattern, unit)), None)


def _unit(text: str) -> str | None:
    found = re.search(rf"×|\b(?:{UNIT}|passed|failed|skipped)(?![A-Za-z])|%", text)
    return found.group(0) if found else None


STOP = set("with from that this than over into each when then also what were been have their under both only".split())


def _sentence_keys(sentence: str) -> str | None:
    """A figure without a unit: the words of its sentence (or its column's header and its row's first cell), one of
    which its value's key must hold."""
    words = {w.lower()[:7] for w in re.findall(r"[A-Za-z]{4,}", sentence) if w.lower() not in STOP}  # a stem
    return "|".join(sorted(words)) or None


def _in_row(ends: list[str], row: list[tuple[str, Decimal]], keys: str | None) -> bool:
    return all(is_held(n, [v for _, v in row]) for n in ends) and (
        keys is None or any(re.search(keys, path) for path, v in row if any(is_held(n, [v]) for n in ends))
    )


def figure_problem(figure: str, held: Held, header: str = "", sentence: str = "") -> str | None:
    """Why `figure` is not held by its row and field (None when it is): `header` is its table column's header, else
    `sentence` the prose it stands in."""
    ends = numbers(figure)
    unit = _unit(figure) or _unit(header)
    keys = _keys_for(unit) if unit else _sentence_keys(header or sentence)
    if CHANGE.search(figure):
        printed = any(all(is_held(n, line) for n in ends) for line in held.lines)
        if printed or any(_in_row(ends, row, keys) for row in held.rows):
            return None
        return f"no one row holds both ends with a key of its field ({keys or 'any'})"
    if len(ends) > 1 and not RANGE.search(figure):
        return "not one figure"
    for end in ends:
        by_value = any(is_held(end, [v]) and (keys is None or re.search(keys, path)) for path, v in held.values)
        if not by_value and not any(is_held(end, line) for line in held.lines):
            return f"{end} is in no value of its field ({keys or 'any'}) nor in a printed line"
    return None


def _prose_figures(text: str) -> list[tuple[str, str, str]]:
    sentences = re.split(r"(?<=[.;:!?])\s+(?=[A-Z(*`])", " ".join(text.split()))
    return [(figure, "", sentence) for sentence in sentences for figure in figures(sentence)]


def located_figures(text: str) -> list[tuple[str, str, str]]:
    """(figure, its column's header, its sentence) for the block's figures (a table's figures have no sentence, prose's
    no header)."""
    found, header, prose_lines = [], None, []
    for line in [*text.splitlines(), "|"]:
        if not line.lstrip().startswith("|"):
            header = None
            prose_lines.append(line)
            continue
        found += _prose_figures("\n".join(prose_lines)) if prose_lines else []
        prose_lines = []
        if line == "|":
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header is None or set("".join(cells)) <= set("-: "):
            header = header if header is not None else cells
            continue
        for column, cell in enumerate(cells):
            name = header[column] if column < len(header) else ""
            found += [(figure, f"{name} {cells[0]}", "") for figure in figures(f"| {cell} |")]
    return found


def results_problems(block: Block) -> list[str]:
    """What is wrong with a block marked `results:`: a file missing or outside bench/results/committed/, a results
    file without its provenance, a figure not held by its row and field, or another number no named file holds."""
    paths = block.mark[1].split()
    problems, held = [], Held()
    for path in paths:
        if not path.startswith(COMMITTED) or not (ROOT / path).is_file():
            problems.append(f"{path}: not a file under {COMMITTED}")
            continue
        data = json.loads((ROOT / path).read_text())
        missing = [key for key in PROVENANCE if not data.get("provenance", {}).get(key)]
        if missing:
            problems.append(f"{path}: provenance lacks {missing} (write it with bench/_common.py's write_results)")
        held.add(data)
    if not paths:
        problems.append("the marker names no results file")
    if problems:
        return problems
    located = located_figures(block.text)
    for figure, header, sentence in located:
        why = figure_problem(figure, held, header, sentence)
        problems += [f"{figure}: {why} in {paths}"] if why else []
    matched, every = {n for figure, _, _ in located for n in numbers(figure)}, held.numbers()
    others = [n for n in numbers(block.text) if n not in matched]
    return problems + [f"{n} is in none of {paths}" for n in others if not is_held(n, every)]
