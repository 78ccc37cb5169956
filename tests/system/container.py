"""container.py: boots a copy of the cached root with systemd-nspawn and
runs commands inside it with nsenter.

The container is given what a host's PID1 has and nspawn withholds by
default (HOST_CAPABILITIES): CAP_IPC_LOCK, without which nspawn's own
seccomp filter refuses mlock(2) to every process inside, and
CAP_SYS_RESOURCE, without which its systemd cannot raise a unit's
LimitMEMLOCK= (or any limit) above the runner's hard limit. A capability
missing from the runner's own bounding set cannot be given (nspawn drops
it silently): Container.missing names it, and the checks expect what
systemd can do without it.

The copy (cp -a, reflinked where the file system can) is the run's own:
the cached root stays pristine. systemd-nspawn runs in the background with
systemd as the container's PID1; commands enter its namespaces by the host
PID of that PID1. Every wait has a deadline. close() always tears the
container down: it kills PID1 (which ends its PID namespace) and then, if
it lingers, nspawn, by their PIDs.
"""
import os
import shutil
import signal
import subprocess
import time

# Capability numbers (linux/capability.h) of what a host's PID1 has and
# systemd-nspawn does not give a container unless told.
HOST_CAPABILITIES = {"CAP_IPC_LOCK": 14, "CAP_SYS_RESOURCE": 24}

# What a command inside sees: no host variables leak in.
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
       "LANG": "C.UTF-8", "SYSTEMD_COLORS": "0", "SYSTEMD_PAGER": "", "TERM": "dumb"}


class Timeout(TimeoutError):
    pass


def wait_for(what, predicate, timeout, interval=0.05):
    """Polls PREDICATE until it returns a true value, which is returned;
    raises Timeout naming WHAT after TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise Timeout(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def bounding_set():
    """The capability numbers in this process's bounding set: what it can
    give the container at most."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapBnd:"):
                mask = int(line.split()[1], 16)
                return {n for n in range(64) if mask >> n & 1}
    return set()


def _children(pid):
    """PIDs whose parent is PID."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces.
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid:
            out.append(int(name))
    return out


def _ns_pid1(pid):
    """True when PID is PID 1 of its own PID namespace."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    ids = line.split()[1:]
                    return len(ids) > 1 and ids[-1] == "1"
    except OSError:
        pass
    return False


class Container:
    def __init__(self, root, workdir, log):
        self.cached_root = root
        self.dir = os.path.join(workdir, "root")
        self.log = log
        self.nspawn = None
        self.pid1 = None
        have = bounding_set()
        # HOST_CAPABILITIES the runner has (given) and has not (missing).
        self.capabilities = [c for c, n in HOST_CAPABILITIES.items() if n in have]
        self.missing = [c for c in HOST_CAPABILITIES if c not in self.capabilities]

    def path(self, inside):
        """The host path of a path inside the container's root."""
        return os.path.join(self.dir, inside.lstrip("/"))

    def prepare(self):
        if os.path.exists(self.dir):
            shutil.rmtree(self.dir)
        subprocess.run(["cp", "-a", "--reflink=auto", self.cached_root, self.dir], check=True)

    def boot(self, timeout=90):
        cmd = ["systemd-nspawn", "-D", self.dir, "--register=no", "--keep-unit", "-b",
               "--console=passive", "--link-journal=no",
               f"--machine=wcache-system-{os.getpid()}"]  # unique: runs may overlap
        if self.capabilities:
            cmd.append("--capability=" + ",".join(self.capabilities))
        if "CAP_IPC_LOCK" in self.missing:
            # Without it nspawn's filter refuses mlock(2) to everything
            # inside; let it through, so that mlock obeys RLIMIT_MEMLOCK as
            # on a host.
            cmd.append("--system-call-filter=@memlock")
        self.log.write("$ " + " ".join(cmd) + "\n")
        self.log.flush()
        self.nspawn = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.log,
                                       stderr=subprocess.STDOUT, start_new_session=True)

        def find_pid1():
            if self.nspawn.poll() is not None:
                raise RuntimeError(f"systemd-nspawn exited with {self.nspawn.returncode}; "
                                   f"see {self.log.name}")
            for child in _children(self.nspawn.pid):
                if _ns_pid1(child):
                    return child
            return None

        self.pid1 = wait_for("the container's PID1", find_pid1, timeout)

        def booted():
            r = self.run(["systemctl", "is-system-running"], check=False, timeout=10)
            state = r.stdout.strip()
            if state in ("running", "degraded"):
                return state
            if self.nspawn.poll() is not None:
                raise RuntimeError(f"the container stopped while booting; see {self.log.name}")
            return None

        return wait_for("the container's systemd to finish booting", booted, timeout,
                        interval=0.2)

    def run(self, argv, user=None, input=None, check=True, timeout=120):
        """Runs ARGV inside the container (as USER when given) and returns the
        CompletedProcess (text). CHECK: a non-zero exit raises RuntimeError
        with the output."""
        r = subprocess.run(self._enter(argv, user), input=input, capture_output=True, text=True,
                           env=ENV, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"in the container, {' '.join(argv)} exited with "
                               f"{r.returncode}: {r.stderr.strip() or r.stdout.strip()}")
        return r

    def popen(self, argv, user=None):
        """Starts ARGV inside the container (as USER when given) with pipes
        for stdin, stdout and stderr (bytes) and returns the Popen; the
        caller waits for it."""
        return subprocess.Popen(self._enter(argv, user), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)

    def _enter(self, argv, user):
        cmd = ["nsenter", "-t", str(self.pid1), "-m", "-u", "-i", "-n", "-p", "-r", "-w"]
        if user is not None:
            cmd += ["runuser", "-u", user, "--"]
        return cmd + list(argv)

    def close(self, timeout=30):
        """Ends the container and removes the copy. The copy is thrown away,
        so there is nothing to shut down cleanly: SIGKILL to PID1 ends every
        process of its PID namespace at once (a poweroff waits for
        stragglers), then nspawn exits, or is killed after TIMEOUT seconds."""
        if self.nspawn is not None and self.nspawn.poll() is None:
            if self.pid1 is not None:
                try:
                    os.kill(self.pid1, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            else:
                self.nspawn.send_signal(signal.SIGTERM)
            try:
                self.nspawn.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.nspawn.kill()
                self.nspawn.wait(timeout=timeout)
        self.nspawn = None
        if os.path.exists(self.dir):
            shutil.rmtree(self.dir, ignore_errors=True)
