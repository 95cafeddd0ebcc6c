"""The game notebooks' use of the reward helpers, with slimrl's: a 2048 strategy written as a string runs in the sandbox
and plays; a reward loop over completions (a training loop stand-in) scores escapes, crashes and timeouts as failures
and goes on; nothing of the trainer's reaches the function."""

import gc

import psutil
import pytest

from slimrl import check_python_modules, create_locked_down_function, execute_with_time_limit
from slimrl.sandbox import SandboxError, worker

from _games import COMPLETIONS, STRATEGY, Game2048, play, play_unlimited


def test_a_2048_strategy_plays_as_it_would_in_process():
    sandboxed = create_locked_down_function(STRATEGY)
    namespace = {}
    exec(STRATEGY, namespace)
    assert sandboxed([[2, 2, 0, 0]] * 4) == namespace["strategy"]([[2, 2, 0, 0]] * 4) == "W"
    assert play(sandboxed, Game2048(seed=3)) == play_unlimited(namespace["strategy"], Game2048(seed=3))
    sandboxed.close()


def test_a_strategy_that_never_ends_the_game_times_out():
    always_up = create_locked_down_function('def strategy(board):\n    return "W"\n')
    game = Game2048(seed=1)
    for _ in range(6):
        game.move("W")  # the board is packed upwards: "W" changes nothing from here on
    with pytest.raises(TimeoutError, match="Timed out after 0.5s"):
        execute_with_time_limit(0.5)(play_unlimited)(always_up, game)
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


def _children() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)}


def test_a_training_loop_scores_every_completion_and_goes_on():
    expected = [20.0, -20.0, -20.0, -20.0, -1.0, -3.0, -3.0, -2.0]
    before = _children()  # earlier tests' processes (a data loader's, a compiler's) are not the sandbox's
    for _ in range(2):  # two "steps": the loop survives every kind of failure
        assert strategy_reward(list(COMPLETIONS.values())) == expected
    gc.collect()
    spares = {process.popen.pid for process in worker._SPARES.values()}
    leftover = _children() - before - spares
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
