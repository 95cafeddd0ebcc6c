"""A small 2048 game, a strategy for it written as source (as a model would), and completions that stand for what
a model might write instead: the sandbox tests' shared material."""

import random

from slimrl import execute_with_time_limit


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


def play_unlimited(strategy, game):
    steps = 0
    while game.state == "ongoing":
        game.move(strategy([list(row) for row in game.cells]))
        steps += 1
    return steps, game.state


@execute_with_time_limit(20)
def play(strategy, game):
    return play_unlimited(strategy, game)


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
