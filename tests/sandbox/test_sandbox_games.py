"""The game notebooks' use of the reward helpers, with slimrl's: a 2048 strategy written as a string runs in the sandbox
and plays; a reward loop over completions (a training loop stand-in) scores escapes, crashes and timeouts as failures
and goes on; nothing of the trainer's reaches the function."""

import gc
import random

import psutil
import pytest

from slimrl import check_python_modules, create_locked_down_function, execute_with_time_limit
from slimrl.sandbox import SandboxError, worker


class Game2048:
    """A small 2048: moves W/A/S/D, a new 2 (or 4) after every move that changes the board."""

    def __init__(self, size=4, seed=0, target=64):
        self.rng, self.size, self.target = random.Random(seed), size, target
        self.cells = [[0] * size for _ in range(size)]
        self.state = "ongoing"
        self._spawn()
        self._spawn()

    def _spawn(self):
        empty = [(r, c) for r in range(self.size) for c in range(self.size) if not self.cells[r][c]]
        if empty:
            r, c = self.rng.choice(empty)
            self.cells[r][c] = 4 if self.rng.random() < 0.1 else 2

    @staticmethod
    def _merge_left(row):
        tiles = [v for v in row if v]
        out = []
        while tiles:
            if len(tiles) > 1 and tiles[0] == tiles[1]:
                out.append(tiles[0] * 2)
                tiles = tiles[2:]
            else:
                out.append(tiles.pop(0))
        return out + [0] * (len(row) - len(out))

    def move(self, key):
        turns = {"A": 0, "W": 1, "D": 2, "S": 3}.get(key)
        if turns is None:
            self.state = "failed"
            return
        grid = self.cells
        for _ in range(turns):  # rotate counter-clockwise so the move becomes "left"
            grid = [list(row) for row in zip(*grid)][::-1]
        grid = [self._merge_left(row) for row in grid]
        for _ in range((4 - turns) % 4):
            grid = [list(row) for row in zip(*grid)][::-1]
        if grid != self.cells:
            self.cells = grid
            self._spawn()
        if max(max(row) for row in self.cells) >= self.target:
            self.state = "success"


def _play(strategy, game):
    steps = 0
    while game.state == "ongoing":
        game.move(strategy([list(row) for row in game.cells]))
        steps += 1
    return steps, game.state


@execute_with_time_limit(20)
def play(strategy, game):
    return _play(strategy, game)


STRATEGY = '''
def strategy(board):
    """Prefer the move that keeps the most empty cells; ties in W, A, S, D order."""
    import itertools

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

    def after(key):
        grid = board
        turns = "AWDS".index(key)
        for _ in range(turns):
            grid = [list(r) for r in zip(*grid)][::-1]
        grid = [merge(r) for r in grid]
        for _ in range((4 - turns) % 4):
            grid = [list(r) for r in zip(*grid)][::-1]
        return grid

    best = None
    for key in "WASD":
        grid = after(key)
        if grid == board:
            continue
        empty = sum(1 for v in itertools.chain(*grid) if v == 0)
        if best is None or empty > best[0]:
            best = (empty, key)
    return best[1] if best else "W"
'''


def test_a_2048_strategy_plays_as_it_would_in_process():
    sandboxed = create_locked_down_function(STRATEGY)
    namespace = {}
    exec(STRATEGY, namespace)
    assert sandboxed([[2, 2, 0, 0]] * 4) == namespace["strategy"]([[2, 2, 0, 0]] * 4) == "W"
    assert play(sandboxed, Game2048(seed=3)) == _play(namespace["strategy"], Game2048(seed=3))
    sandboxed.close()


def test_a_strategy_that_never_ends_the_game_times_out():
    always_up = create_locked_down_function('def strategy(board):\n    return "W"\n')
    game = Game2048(seed=1)
    for _ in range(6):
        game.move("W")  # the board is packed upwards: "W" changes nothing from here on
    with pytest.raises(TimeoutError, match="Timed out after 0.5s"):
        execute_with_time_limit(0.5)(_play)(always_up, game)
    always_up.close()


def test_nothing_of_the_callers_reaches_the_function():
    board = [[2, 0], [0, 2]]
    spoil = create_locked_down_function("def f(board):\n    board[0][0] = 1024\n    return board[0][0]\n")
    assert spoil(board) == 1024 and board == [[2, 0], [0, 2]]  # the function got a copy
    peek = create_locked_down_function("def f():\n    return Game2048\n")
    with pytest.raises(SandboxError, match="NameError") as caught:
        peek()  # no globals: not the caller's, not the function's own module
    assert caught.value.error_type == "NameError"
    with pytest.raises(TypeError, match="plain data"):
        spoil(Game2048())  # only plain data crosses
    leak = create_locked_down_function("def f():\n    return lambda: 1\n")
    with pytest.raises(SandboxError, match="not plain data"):
        leak()


COMPLETIONS = {
    "plays": STRATEGY,
    "imports numpy": "def strategy(board):\n    import numpy\n    return 'W'\n",
    "shells out": "def strategy(board):\n    import os\n    os.system('rm -rf ~')\n    return 'W'\n",
    "walks to os": "def strategy(board):\n    return ().__class__.__base__.__subclasses__()\n",
    "loops forever": "def strategy(board):\n    while True:\n        pass\n",
    "allocates 10 GB": "def strategy(board):\n    return str(len(bytearray(10 * 1024**3)))\n",
    "raises": "def strategy(board):\n    return 1 / 0\n",
    "not a function": "def strategy(board)\n    return 'W'\n",
}


def strategy_reward(completions):
    """The notebooks' scoring: -2 not runnable, -20 cheating, -1 timeout, -3 crash, 2 played, 20 won."""
    scores = []
    for code in completions:
        ok, info = check_python_modules(code)
        if "error" in info:
            scores.append(-2.0)
            continue
        if not ok:
            scores.append(-20.0)
            continue
        strategy = create_locked_down_function(code, time_limit=0.5, memory_mb=256)
        try:
            _, state = play(strategy, Game2048(seed=5, target=32))
            scores.append(20.0 if state == "success" else 2.0)
        except TimeoutError:
            scores.append(-1.0)
        except Exception:
            scores.append(-3.0)
        finally:
            strategy.close()
    return scores


def test_a_training_loop_scores_every_completion_and_goes_on():
    expected = [20.0, -20.0, -20.0, -20.0, -1.0, -3.0, -3.0, -2.0]
    for _ in range(2):  # two "steps": the loop survives every kind of failure
        assert strategy_reward(list(COMPLETIONS.values())) == expected
    gc.collect()
    spares = {process.popen.pid for process in worker._SPARES.values()}
    leftover = {child.pid for child in psutil.Process().children(recursive=True)} - spares
    assert not leftover, "sandbox processes outlived their functions"


def test_a_forked_copy_of_the_trainer_leaves_its_sandbox_processes_alone():
    import os

    echo = create_locked_down_function("def echo(x):\n    return x\n")
    assert echo(1) == 1
    folder = echo._process.folder
    pid = os.fork()
    if pid == 0:  # the copy: its own process for the call; dropping its copy of `echo` stops nothing of the parent's
        code = 0
        try:
            code = 0 if echo(2) == 2 else 1
            worker._SPARES.clear()  # the parent's spares, as the copy sees them, are garbage-collected here
            gc.collect()
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert echo(3) == 3 and os.path.isdir(folder)  # the parent's process still serves it, its folder still there
    echo.close()
