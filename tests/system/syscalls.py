"""syscalls.py: which system calls wcached made under its unit, from an
strace of the container's PID1, against the unit's filter.

With SystemCallErrorNumber=EPERM a call the filter refuses fails quietly:
nothing in the journal says so. To know that the filter permits everything
the daemon does, strace -f follows PID1 (the service manager) from before
the service starts, so every process of wcached.service is traced from its
fork. Only what a process does after it executed wcached counts (before
that it is systemd setting up the sandbox), and the threads it creates.
"""
import re
import signal
import subprocess

from container import wait_for

WCACHED = "/usr/sbin/wcached"
# Calls the daemon is known to try and to live without when refused,
# by number (strace may not know their names either): cachestat (Linux
# 6.5) and statmount (6.8; mountrule.c asks it once where it is refused,
# then reads the mount table).
PROBES = {451: "cachestat", 457: "statmount"}
# Calls a sandbox setting answers ENOSYS, where glibc falls back to an older
# call by itself: clone3(2), whose flags live in a structure seccomp cannot
# read, which systemd refuses so under RestrictNamespaces=. Any other call
# answered ENOSYS on this kernel is one a setting of the unit took away:
# openat2(2) under RestrictSUIDSGID=, which wcached's tree rules need.
FALLBACKS = {"clone3"}

_LINE = re.compile(r"^(\d+) +(?:<\.\.\. (\w+) resumed>|(\w+)\()(.*)$")
# A result; a PID in the result (of clone) is the container's, and
# --decode-pids=pidns adds the host's, which the log's PIDs are.
_RESULT = re.compile(r"\) += (-?\d+)(?: /\* (\d+) in strace's PID NS \*/)?")
_UNKNOWN = re.compile(r"^syscall_0x([0-9a-f]+)$")
# A failed call's errno: strace prints "= -1 ENOSYS (Function not implemented)".
_ERRNO = re.compile(r"\) += -1 (E[A-Z0-9]+)\b")


class Tracer:
    """strace -f of PID (the container's PID1, a host PID) into LOG_PATH."""

    def __init__(self, pid, log_path):
        self.pid = pid
        self.log_path = log_path
        self.proc = subprocess.Popen(["strace", "-f", "-qq", "--decode-pids=pidns", "-o", log_path,
                                      "-p", str(pid)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        wait_for(f"strace to attach to PID {pid}", self._attached, 30)

    def _attached(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"strace -p {self.pid} exited: {self.proc.stderr.read()}")
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("TracerPid:"):
                    return int(line.split()[1]) == self.proc.pid
        return False

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # strace detaches and exits
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Tracing:
    """The strace of PID1 over the whole run, which a check may pause (a
    check that measures time: a traced daemon and manager are slower).
    Each stretch has its own log, LOG_PATH first, then LOG_PATH.2, ...; a
    process started while paused is not traced afterwards either."""

    def __init__(self, pid, log_path):
        self.pid = pid
        self.logs = []
        self.base = log_path
        self.tracer = None
        self.resume()

    def resume(self):
        if self.tracer is None:
            path = self.base if not self.logs else f"{self.base}.{len(self.logs) + 1}"
            self.tracer = Tracer(self.pid, path)
            self.logs.append(path)

    def pause(self):
        if self.tracer is not None:
            self.tracer.stop()
            self.tracer = None


def name_of(syscall):
    """strace's name for a call, or 'syscall_NUMBER' for one it does not know."""
    m = _UNKNOWN.match(syscall)
    return f"syscall_{int(m.group(1), 16)}" if m else syscall


def daemon_calls(log_paths):
    """{syscall name: [(pid, result), ...]} of the wcached processes in the
    strace logs, the result a number or, for a failed call, its errno's name
    ('ENOSYS'); names strace does not know are 'syscall_NUMBER'."""
    calls = {}
    for path in log_paths:
        for name, uses in _log_calls(path).items():
            calls.setdefault(name, []).extend(uses)
    return calls


def _log_calls(log_path):
    daemon = set()        # PIDs (and TIDs) that run wcached
    pending_exec = {}     # pid -> path of an execve not finished yet
    calls = {}
    with open(log_path, errors="replace") as f:
        for line in f:
            m = _LINE.match(line)
            if not m:
                continue
            pid = int(m.group(1))
            name = m.group(2) or m.group(3)
            rest = m.group(4)
            started = m.group(3) is not None
            finished = "<unfinished ...>" not in rest
            result = _RESULT.search(rest) if finished else None
            ret = int(result.group(1)) if result else None
            errno = _ERRNO.search(rest) if finished else None
            host_pid = int(result.group(2)) if result and result.group(2) else None
            if started and name == "execve":
                pending_exec[pid] = rest.split('"')[1] if '"' in rest else ""
            if name == "execve" and finished:
                path = pending_exec.pop(pid, "")
                if ret == 0:
                    if path == WCACHED:
                        daemon.add(pid)
                        continue
                    daemon.discard(pid)
            if pid not in daemon:
                continue
            if started:
                calls.setdefault(name_of(name), []).append((pid, None))
            if finished and ret is not None:
                if name in ("clone", "clone3", "fork", "vfork") and ret > 0:
                    if host_pid is None:
                        raise RuntimeError(f"{log_path}: {name} returned {ret} without the "
                                           "host PID (strace --decode-pids=pidns)")
                    daemon.add(host_pid)
                entries = calls.setdefault(name_of(name), [])
                if entries and entries[-1] == (pid, None):
                    entries[-1] = (pid, errno.group(1) if errno else ret)
    return calls


def unit_filter(container, unit):
    """(allowed, names): the names the unit's SystemCallFilter= permits (an
    allow list), or (False, names) for a deny list, as systemd resolved it."""
    value = container.run(["systemctl", "show", "-p", "SystemCallFilter", "--value",
                           unit]).stdout.strip()
    if value.startswith("~"):
        return False, set(value[1:].split())
    return True, set(value.split())


def failed_with(calls, errno):
    """The calls in CALLS that failed with ERRNO (a name, 'ENOSYS'): {name: count}."""
    out = {}
    for name, uses in calls.items():
        k = sum(1 for _, result in uses if result == errno)
        if k:
            out[name] = k
    return out


def refused(calls, allow, names):
    """The calls in CALLS the filter refuses: {name: count}."""
    out = {}
    for name, uses in calls.items():
        permitted = (name in names) if allow else (name not in names)
        if not permitted:
            out[name] = len(uses)
    return out
