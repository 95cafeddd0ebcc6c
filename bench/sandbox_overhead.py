"""What running a model-written function in slimrl's sandbox costs, against Unsloth's in-process `exec`.

Usage: python bench/sandbox_overhead.py [--repeats 20] [--calls 200] [--markdown]

Arms (the same 2048-style strategy: pick the move that keeps the most empty cells on a 4x4 board):
  in-process   the source exec'd and its function re-created with empty globals (Unsloth's create_locked_down_function)
  sandbox      slimrl.create_locked_down_function: one sandbox process per function
Rows: `create + first call` (cold: no spare process was waiting; warm: the spare started by the previous function
was ready), `one call` (median round trip of `--calls` calls on a started function) and `reward of 8` (8 fresh
functions, 25 calls each, as a GRPO reward over 8 completions would make).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import render  # noqa: E402

STRATEGY = """
def strategy(board):
    def merge(row):
        tiles = [v for v in row if v]
        out = []
        while tiles:
            if len(tiles) > 1 and tiles[0] == tiles[1]:
                out.append(tiles[0] * 2)
                tiles = tiles[2:]
            else:
                out.append(tiles.pop(0))
        return out + [0] * (len(row) - len(out))

    best = None
    for turns, key in enumerate("AWDS"):
        grid = board
        for _ in range(turns):
            grid = [list(r) for r in zip(*grid)][::-1]
        empty = sum(merge(r).count(0) for r in grid)
        if best is None or empty > best[0]:
            best = (empty, key)
    return best[1]
"""
BOARD = [[2, 2, 0, 4], [0, 4, 4, 0], [8, 0, 0, 2], [0, 0, 2, 2]]


def in_process(source: str):
    namespace: dict = {}
    exec(source, {}, namespace)
    return types.FunctionType(namespace["strategy"].__code__, {})


def sandboxed(source: str):
    from slimrl import create_locked_down_function

    return create_locked_down_function(source)


def _seconds(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def measure(make, repeats: int, calls: int, cold: bool) -> dict:
    from slimrl.sandbox import worker

    def first_call():
        if cold:
            for process in worker._SPARES.values():
                process.stop()
            worker._SPARES.clear()
            time.sleep(0.2)
        function = make(STRATEGY)
        return _seconds(lambda: function(BOARD)), function

    firsts = []
    for _ in range(repeats):
        seconds, function = first_call()
        firsts.append(seconds)
        time.sleep(0.3)  # the next spare starts meanwhile (warm runs)
    per_call = statistics.median(_seconds(lambda: function(BOARD)) for _ in range(calls))
    reward = statistics.median(
        _seconds(lambda: [[f(BOARD) for _ in range(25)] for f in [make(STRATEGY) for _ in range(8)]])
        for _ in range(max(3, repeats // 4))
    )
    return {"first": statistics.median(firsts), "call": per_call, "reward": reward}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    rows = [
        ["in-process (Unsloth)", measure(in_process, args.repeats, args.calls, cold=False)],
        ["sandbox, cold", measure(sandboxed, args.repeats, args.calls, cold=True)],
        ["sandbox, warm spare", measure(sandboxed, args.repeats, args.calls, cold=False)],
    ]
    head = ["arm", "create + first call (ms)", "one call (ms)", "reward of 8 x 25 calls (ms)"]
    lines = [
        [name, f"{r['first'] * 1e3:.2f}", f"{r['call'] * 1e3:.3f}", f"{r['reward'] * 1e3:.1f}"] for name, r in rows
    ]
    print(render(head, lines, args.markdown))


if __name__ == "__main__":
    main()
