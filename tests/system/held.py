"""held.py: for the held_across_restart check, drives tests/tools/
restart_worker in the container (one command line in, one answer line out,
each with a deadline) and tells which model files systemd's file descriptor
store holds, independently of what the daemon says.
"""
import os
import select
import signal
import subprocess
import time

from load import WorkerError


class RestartWorker:
    """restart_worker (at BINARY in the container) run as USER: it connects to
    the packaged socket and attaches MODEL; GENERATION is what that first
    attach got."""

    def __init__(self, container, binary, user, model, timeout=60):
        self.what = f"restart_worker {model}"
        self.proc = container.popen([binary, model], user=user)
        self.buf = b""
        self.generation = int(self._answer("attached", timeout)[1])

    def _answer(self, word, timeout):
        """The next line's words; it must start with WORD."""
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise WorkerError(f"{self.what} did not answer within {timeout:g} s")
            data = os.read(fd, 4096)
            if not data:
                raise WorkerError(f"{self.what} exited ({self.proc.wait()}) without an answer: "
                                  f"{self.proc.stderr.read().decode(errors='replace').strip()}")
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        words = line.decode(errors="replace").split()
        if not words or words[0] != word:
            raise WorkerError(f"{self.what} answered {line.decode(errors='replace')!r}, not "
                              f"{word!r}")
        return words

    def _ask(self, command, word, timeout=60):
        self.proc.stdin.write(command.encode() + b"\n")
        self.proc.stdin.flush()
        return self._answer(word, timeout)

    def attach(self):
        """Reads every model it holds end to end (a broken mapping is an
        error), attaches MODEL again on the same client and returns the
        generation."""
        return int(self._ask("attach", "attached")[1])

    def release(self, i):
        """Releases the I-th model it attached (0 is the first)."""
        self._ask(f"release {i}", "released")

    def quit(self, timeout=60):
        """Releases what it holds, disconnects and exits 0."""
        self.proc.stdin.write(b"quit\n")
        self.proc.stdin.close()
        code = self.proc.wait(timeout=timeout)
        err = self.proc.stderr.read().decode(errors="replace").strip()
        self.proc = None
        if code != 0:
            raise WorkerError(f"{self.what} exited with {code} after quit: {err}")

    def kill(self, timeout=30):
        """After a failure: the end of its input makes restart_worker release
        everything and exit; nsenter is killed if it is not gone in
        TIMEOUT seconds."""
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=timeout)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=timeout)
        self.proc = None


def file_id(path):
    """(st_dev, st_ino) of the file at host PATH."""
    st = os.stat(path)
    return st.st_dev, st.st_ino


def in_store(pid1, files):
    """Of FILES ({(st_dev, st_ino): label}), the labels of the files PID1 (the
    container's systemd, a host PID) has open: systemd's file descriptor
    store is a set of PID1's descriptors, and PID1 opens no model file
    otherwise."""
    open_files = set()
    for fd in os.listdir(f"/proc/{pid1}/fd"):
        try:
            open_files.add(file_id(f"/proc/{pid1}/fd/{fd}"))
        except OSError:
            continue  # closed meanwhile
    return {label for key, label in files.items() if key in open_files}
