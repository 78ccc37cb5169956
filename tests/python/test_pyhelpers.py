"""The tests' own helper that makes thread interleavings
(pyhelpers.other_thread_before) waits for the other thread only as long as
it must: until it ends, or is blocked on something the paused thread holds.
If the detector stops seeing a blocked thread (no /proc/self/task/TID/syscall
or schedstat), every interleaving test slows down to the upper bound again:
this says so. And the test daemons run as $WCACHE_TEST_USER where the
suite runs as root."""
import os
import threading
import time

from pyhelpers import other_thread_before, wait_done_or_blocked
from wcached import parse_user  # tests/pyutil, on the path pyhelpers sets


def _timed(t, limit):
    start = time.monotonic()
    how = wait_done_or_blocked(t, limit)
    return how, time.monotonic() - start


def test_a_thread_blocked_on_a_lock_is_seen_at_once():
    """A thread waiting for a lock, or for an event (a condition), is seen
    blocked (after some milliseconds), before the limit: a detector that
    does not see it answers "limit", after the 60 s a loaded machine never
    needs to show the wait."""
    lock, event = threading.Lock(), threading.Event()

    def take():
        with lock:
            pass
    for what, target in (("lock", take), ("event", event.wait)):
        with lock:
            t = threading.Thread(target=target)
            t.start()
            how, took = _timed(t, 60.0)
            assert how == "blocked", (what, how, took)
        if what == "event":
            event.set()
        t.join()


def test_a_thread_that_works_or_sleeps_is_not_blocked():
    """A thread that runs Python, or waits in another system call than
    futex (a sleep: a socket, a pipe, a child would be the same), is waited
    for until it ends or the limit passes."""
    stop = time.monotonic() + 0.3
    busy = threading.Thread(target=lambda: [None for _ in iter(lambda: time.monotonic() < stop,
                                                               False)])
    sleeper = threading.Thread(target=time.sleep, args=(0.3,))
    for t in (busy, sleeper):
        t.start()
        how, took = _timed(t, 5.0)
        assert how == "done" and took >= 0.2, (how, took)
    t = threading.Thread(target=time.sleep, args=(0.5,))
    t.start()
    assert _timed(t, 0.1)[0] == "limit"
    t.join()


def test_other_thread_before_does_not_wait_for_a_blocked_thread(monkeypatch):
    """other() blocked on a lock first() holds at the traced line: first()
    goes on once other() is seen blocked, not at the join bound (60 s here,
    which a loaded machine never needs), and other() runs once first()
    releases the lock."""
    import pyhelpers
    lock = threading.Lock()
    order, seen = [], []
    wait = pyhelpers.wait_done_or_blocked

    def watched(t, limit, *args, **kwargs):
        seen.append(wait(t, limit, *args, **kwargs))
        return seen[-1]
    monkeypatch.setattr(pyhelpers, "wait_done_or_blocked", watched)

    def first():
        with lock:
            order.append("first")  # the traced lines: other() runs before each
            order.append("first")

    def other():
        with lock:
            order.append("other")
    for k in range(3):
        errors, other_errors, ran = other_thread_before(first.__code__, k, first, other,
                                                        join=60.0)
        assert not errors and not other_errors and ran
    assert seen == ["done", "blocked", "blocked"]  # k=0 ran whole; then not "limit"
    assert order[:3] == ["other", "first", "first"]  # k=0: before the with, it ran whole
    assert order[3:] == ["first", "first", "other"] * 2  # then blocked until first was done


def test_the_daemon_runs_as_the_test_user(daemon):
    """Where WCACHE_TEST_USER is set and the suite runs as root (the ctest
    entries python and python_2), each test's wcached runs as that user,
    without capabilities, as wcached.service runs it (root hides limits);
    elsewhere as whoever runs the suite. (Before, as root always.)"""
    with open(f"/proc/{daemon.proc.pid}/status") as f:
        status = dict(line.split(":", 1) for line in f.read().splitlines())
    user = os.environ.get("WCACHE_TEST_USER") if os.geteuid() == 0 else None
    uid, gid = parse_user(user) if user else (os.getuid(), os.getgid())
    assert (int(status["Uid"].split()[0]), int(status["Gid"].split()[0])) == (uid, gid), status
    if user:
        assert uid != 0 and int(status["CapEff"], 16) == int(status["CapBnd"], 16) == 0, status
