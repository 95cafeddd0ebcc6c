"""execute_with_time_limit: Unsloth's decorator on the caller's own code, and the deadline sandboxed calls obey."""

import signal
import threading
import time

import pytest

from slimrl import create_locked_down_function, execute_with_time_limit
from slimrl.sandbox import limits


def _spin(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return "done"


def test_the_callers_own_loop_is_interrupted_in_the_main_thread():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="Timed out after 0.3s"):
        execute_with_time_limit(0.3)(_spin)(30)
    assert time.monotonic() - start < 2
    assert execute_with_time_limit(5)(_spin)(0.01) == "done"  # in time: the value comes back


def test_in_another_thread_sandboxed_calls_obey_the_deadline():
    echo = create_locked_down_function("def echo(x):\n    return x\n", time_limit=10)
    echo(0)  # the process is up

    @execute_with_time_limit(0.5)
    def loop_calling_the_model():
        while True:
            echo(1)

    outcome = []
    thread = threading.Thread(target=lambda: outcome.append(_raises(loop_calling_the_model)))
    start = time.monotonic()
    thread.start()
    thread.join(10)
    assert outcome == ["TimeoutError: Timed out after 0.5s"] and time.monotonic() - start < 3
    late = []  # a thread's own loop cannot be interrupted: it fails when it returns past its deadline
    thread = threading.Thread(target=lambda: late.append(_raises(execute_with_time_limit(0.1)(_spin), 0.4)))
    thread.start()
    thread.join(10)
    assert late == ["TimeoutError: Timed out after 0.1s"]
    echo.close()


def _raises(function, *args):
    try:
        function(*args)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "returned"


def test_an_enclosing_limit_cuts_a_sandboxed_call_short():
    slow = create_locked_down_function("def slow():\n    while True:\n        pass\n", time_limit=30)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="Timed out after 0.7s"):
        execute_with_time_limit(0.7)(slow)()
    assert time.monotonic() - start < 3
    slow.close()


def test_an_earlier_timer_is_left_alone_and_a_later_one_restored():
    fired = []

    def handler(*_):
        fired.append(1)

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 30)
        assert execute_with_time_limit(0.2)(_spin)(0.01) == "done"
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 25 < left <= 30 and signal.getsignal(signal.SIGALRM) is handler  # the user's timer is back
        signal.setitimer(signal.ITIMER_REAL, 0.05)  # fires before our 5 s limit: the user's handler runs
        assert execute_with_time_limit(5)(_spin)(0.2) == "done" and fired == [1]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_nested_limits_take_the_earliest_deadline():
    outer = execute_with_time_limit(0.3)(lambda: execute_with_time_limit(10)(_spin)(30))
    with pytest.raises(TimeoutError):
        outer()
    assert limits.current_deadline() is None


@pytest.mark.parametrize("seconds", [0, -1, True, "2"])
def test_a_bad_limit_is_refused(seconds):
    with pytest.raises(ValueError, match="seconds"):
        execute_with_time_limit(seconds)


def test_an_alarm_inside_the_clean_up_leaves_no_deadline_behind(monkeypatch):
    """The alarm can fire while the block's own clean-up runs (a loaded machine): its deadline must not outlive it,
    or every later sandboxed call in the process times out at once."""
    from slimrl.sandbox import limits

    def arm(seconds):
        def restore():
            raise limits.timeout_error(seconds)  # what an alarm delivered inside restore() raises

        return restore

    monkeypatch.setattr(limits, "_arm_alarm", arm)
    with pytest.raises(TimeoutError):
        with limits.time_limit(5):
            pass
    assert limits.current_deadline() is None
