"""The catalogue of escape attempts (_escapes.py), each run with the interpreter filter on: with every kernel layer
on, with each kernel layer switched off in turn, and with the filter alone (every kernel layer off). Every attempt is
refused at definition or contained, in every configuration: the filter alone stops every case that reaches os, sys
or a frame. Negative controls: with the filter off, the chosen attempts reach their target, so these tests can fail.
docs/sandbox.md carries the table this file computes (test_the_docs_table_is_the_catalogues)."""

import collections
import re
from pathlib import Path

import pytest

from slimrl.sandbox import LockedDownFunction, SandboxError, Settings

from _escapes import CASES, CONTROLS, NEEDS, TIME_LIMITS

LAYERS = ("namespaces", "landlock", "rlimits", "seccomp")
CONFIGS = {"every layer": (), **{f"no {name}": (name,) for name in LAYERS}, "filter only": LAYERS}
DOCS = Path(__file__).resolve().parents[2] / "docs" / "sandbox.md"


def attempt(source: str, layers_off=(), interpreter_policy=True, time_limit=5.0):
    """("refused", message) when the source is refused; otherwise ("raised" | "returned", text) of one call."""
    settings = Settings(
        memory_mb=256, layers_off=layers_off, interpreter_policy=interpreter_policy, allow_weaker_sandbox=True
    )  # fmt: skip  (the catalogue measures containment, not fail-closed)
    try:
        function = LockedDownFunction(source, time_limit=time_limit, settings=settings)
    except RuntimeError as exc:
        return "refused", str(exc)
    try:
        return "returned", repr(function())
    except (SandboxError, TimeoutError) as exc:
        return "raised", f"{type(exc).__name__}: {exc}"
    finally:
        function.close()


def verdict(case, config: str) -> str:
    _, name, source, outcome = case
    if expected(case, config) == "not run":
        return "not run"
    kind, text = attempt(source, CONFIGS[config], time_limit=TIME_LIMITS.get(name, 5.0))
    if outcome == "refused":
        assert kind == "refused" and re.search("refuses|Decorators|literal default", text), (config, kind, text)
        return "refused"
    assert kind != "refused", (config, text)
    assert re.search(re.escape(outcome.removeprefix("contained: ")), text), (config, kind, text)
    return "contained"


@pytest.mark.parametrize("case", CASES, ids=[case[1] for case in CASES])
def test_every_attempt_is_refused_or_contained_in_every_configuration(case):
    verdicts = {config: verdict(case, config) for config in CONFIGS}
    assert verdicts == {config: expected(case, config) for config in CONFIGS}


@pytest.mark.parametrize("name", sorted(CONTROLS))
def test_control_with_the_filter_off_the_attempt_reaches_its_target(name):
    source = next(case[2] for case in CASES if case[1] == name)
    kind, text = attempt(source, interpreter_policy=False)
    assert kind == "returned" and CONTROLS[name] in text, text


def test_the_catalogue_covers_each_technique():
    counts = collections.Counter(case[0] for case in CASES)
    assert len(CASES) >= 40 and len(counts) == 12 and min(counts.values()) >= 3, counts
    assert len({case[1] for case in CASES}) == len(CASES)  # names are unique: they are the test ids


def expected(case, config: str) -> str:
    if any(layer in CONFIGS[config] for layer in NEEDS.get(case[1], ())):
        return "not run"
    return case[3].split(":")[0]


def table() -> str:
    """The docs table: per technique, its count and the verdicts in each configuration."""
    by_technique = collections.defaultdict(list)
    for case in CASES:
        by_technique[case[0]].append(case)
    lines = ["| technique | cases | " + " | ".join(CONFIGS) + " | filter off: controls reaching their target |",
             "|---|---|" + "---|" * (len(CONFIGS) + 1)]  # fmt: skip
    for technique, cases in by_technique.items():
        cells = []
        for config in CONFIGS:
            tally = collections.Counter(expected(case, config) for case in cases)
            cells.append(", ".join(f"{count} {word}" for word, count in sorted(tally.items())))
        controls = sum(case[1] in CONTROLS for case in cases)
        lines.append(f"| {technique} | {len(cases)} | " + " | ".join(cells) + f" | {controls or '-'} |")
    return "\n".join(lines)


def test_the_docs_table_is_the_catalogues():
    assert table() in DOCS.read_text(), "docs/sandbox.md's catalogue table is out of date:\n" + table()


AUDIT_PROBE = """
import os, sys
sys.path[:0] = [os.path.dirname(sys.argv[1])]
import guards
settings = {"refused_events": sys.argv[2].split(","), "refused_event_prefixes": sys.argv[3].split(","),
            "audited_frame_attributes": sys.argv[4].split(",")}

def probes():
    def frame():
        try:
            1 / 0
        except ZeroDivisionError as exc:
            return exc.__traceback__.tb_frame
    out = {}
    for name, probe in {"open": lambda: open(sys.argv[1]).close(), "listdir": lambda: os.listdir("/"),
                        "system": lambda: os.system("true"), "frame": frame,
                        "sum": lambda: sum([1, 2])}.items():
        try:
            probe()
            out[name] = "ran"
        except PermissionError as exc:
            out[name] = str(exc)
    return out

before = probes()
sys.addaudithook(guards.audit_hook(settings))
print(repr((before, probes())))
"""


def test_the_audit_hook_refuses_what_reaches_the_system_even_from_os_itself():
    """Defense in depth for code that got hold of os or a traceback anyway; control: the same probes run before the
    hook is added."""
    import ast
    import subprocess
    import sys

    from slimrl.sandbox import guards, policy

    args = [guards.__file__, ",".join(policy.REFUSED_EVENTS), ",".join(policy.REFUSED_EVENT_PREFIXES),
            ",".join(policy.AUDITED_FRAME_ATTRIBUTES)]  # fmt: skip
    run = subprocess.run([sys.executable, "-I", "-c", AUDIT_PROBE, *args], capture_output=True, text=True, timeout=60)
    before, after = ast.literal_eval(run.stdout.strip())
    assert set(before.values()) == {"ran"}
    assert after == {"open": "open is not allowed in the sandbox", "listdir": "os.listdir is not allowed in the "
                     "sandbox", "system": "os.system is not allowed in the sandbox",
                     "frame": "the attribute 'tb_frame' is not available in the sandbox", "sum": "ran"}  # fmt: skip


MODULES_IN_REACH = """
def f():
    import math
    try:
        1 / 0
    except ZeroDivisionError as e:
        frame = e.__traceback__.tb_frame
    found = []
    while frame is not None:
        for scope in (frame.f_globals, frame.f_locals):
            found += sorted({frame.f_code.co_name + ":" + k for k, v in scope.items() if type(v).__name__ == "module"})
        frame = frame.f_back
    return found
"""


def test_the_serving_loops_frames_and_globals_hold_no_module():
    """With the filter off, a function walks every frame above it (the serving loop, the process's entry) and lists
    the modules in their globals and locals: only its own `math` (the control: the walk sees modules)."""
    kind, text = attempt(MODULES_IN_REACH, interpreter_policy=False)
    assert (kind, text) == ("returned", "['f:math']")
