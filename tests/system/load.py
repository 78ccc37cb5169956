"""load.py: drives tests/tools/load_worker in the container and sums up what
its workers saw, for the restart_under_load check.

Workers(...).start() runs one load_worker as a worker user and returns once
every worker has attached once (its "ready" line); stop() tells them to
stop, waits for every line and for the process, and returns a Result. The
times are CLOCK_MONOTONIC nanoseconds, the host's clock too (nspawn gives
the container no time namespace; start() checks that the workers' clock
reads what the host's does).
"""
import math
import os
import select
import signal
import subprocess
import time

from container import Timeout


class WorkerError(RuntimeError):
    """load_worker did not do what it says it does (a check's failure)."""


class Result:
    def __init__(self):
        self.samples = []     # (mode, worker, t0, dur, generation)
        self.failures = []    # (mode, worker, t0, dur, code, message)
        self.failed = 0       # failed attaches, all of them (failures holds the first few)
        self.ends = {}        # worker -> (mode, attaches, failed)
        self.done = None      # (workers that exited 0, workers)

    def attaches(self):
        return len(self.samples)

    def across(self, windows, mode):
        """Durations (ns) of MODE's attaches that overlap one of WINDOWS
        ([(start, end)] in ns): they were waiting while the daemon
        restarted."""
        return [d for m, _, t0, d, _ in self.samples if m == mode
                and any(t0 <= end and t0 + d >= start for start, end in windows)]

    def outside(self, windows):
        return [d for _, _, t0, d, _ in self.samples
                if not any(t0 <= end and t0 + d >= start for start, end in windows)]


def p99(values):
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


class Workers:
    """load_worker (at BINARY in the container) with KEEP and CONNECT
    workers attaching MODEL of SEED, as USER."""

    def __init__(self, container, binary, user, model, seed, keep, connect):
        self.c = container
        self.argv = [binary, "--keep", str(keep), "--connect", str(connect), "--seed", str(seed),
                     model]
        self.user = user
        self.count = keep + connect
        self.proc = None
        self.buf = b""
        self.pids = []        # the workers' PIDs in the container
        self.ready = {}       # worker -> (mode, generation)
        self.result = Result()

    def _lines(self, deadline):
        """Yields stdout's lines until its end or DEADLINE (monotonic)."""
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                yield line.decode(errors="replace")
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout(f"load_worker wrote nothing for the rest of the wait "
                              f"({len(self.ready)} of {self.count} workers ready)")
            if select.select([fd], [], [], left)[0]:
                data = os.read(fd, 65536)
                if not data:
                    return
                self.buf += data

    def start(self, timeout=60):
        before = time.monotonic_ns()
        self.proc = self.c.popen(self.argv, user=self.user)
        for line in self._lines(time.monotonic() + timeout):
            word = line.split(" ", 4)
            if word[0] == "ready":
                _, w, mode, pid, clock, gen = line.split()
                if not before <= int(clock) <= time.monotonic_ns():
                    raise WorkerError(f"worker {w}'s CLOCK_MONOTONIC reads {clock}, not between "
                                      f"the host's {before} and now: not the host's clock")
                self.pids.append(int(pid))
                self.ready[int(w)] = (mode, int(gen))
                if len(self.ready) == self.count:
                    return self.ready
            elif word[0] == "error":
                raise WorkerError(f"worker {word[1]} ({word[2]}): first attach failed: "
                                  f"{line.split(' ', 3)[3]}")
            else:
                raise WorkerError(f"load_worker wrote {line!r} before every worker was ready")
        raise WorkerError(f"load_worker exited ({self.proc.wait()}) with {len(self.ready)} of "
                          f"{self.count} workers ready: {self.proc.stderr.read().decode()}")

    def stop(self, timeout=60):
        """Stops the workers and returns the Result; every worker process
        and load_worker have exited when it returns."""
        r = self.result
        try:
            self.proc.stdin.write(b"stop\n")
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        for line in self._lines(time.monotonic() + timeout):
            f = line.split(" ", 6)
            if f[0] == "a":
                r.samples.append((f[2], int(f[1]), int(f[3]), int(f[4]), int(f[5])))
            elif f[0] == "fail":
                r.failures.append((f[2], int(f[1]), int(f[3]), int(f[4]), int(f[5]), f[6]))
            elif f[0] == "end":
                r.ends[int(f[1])] = (f[2], int(f[3]), int(f[4]))
                r.failed += int(f[4])
            elif f[0] == "done":
                r.done = (int(f[1]), int(f[2]))
            else:
                raise WorkerError(f"load_worker wrote {line!r}")
        status = self.proc.wait(timeout=timeout)
        err = self.proc.stderr.read().decode(errors="replace").strip()
        self.proc = None
        if r.done is None or len(r.ends) != self.count:
            raise WorkerError(f"load_worker exited {status} after {len(r.ends)} of {self.count} "
                              f"workers reported: {err}")
        if status not in (0, 1) or (status == 0) != (r.failed == 0):
            raise WorkerError(f"load_worker exited {status} with {r.failed} failed attaches: "
                              f"{err}")
        return r

    def kill(self):
        """After a failure: ends load_worker (our nsenter's child) and its
        workers by their PIDs, whatever state they are in."""
        if self.proc is None:
            return
        self.c.run(["sh", "-c", "kill -9 " + " ".join(map(str, self.pids))], check=False)
        self.proc.send_signal(signal.SIGKILL)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        self.proc = None
