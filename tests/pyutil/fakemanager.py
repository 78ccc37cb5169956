"""A fake service manager with systemd's file descriptor store, for the tests
and the benchmark of the warm restart (tests/integration/test_warm_restart.py,
test_restart_held.py, tests/bench/bench_restart.py): it listens on a
datagram socket given as $NOTIFY_SOCKET, keeps what wcached stores with
FDSTORE=1 (one copy of the same open file, as systemd), drops what
FDSTOREREMOVE=1 names, and hands the store to the next process
(listen_fds()). Given max_fds, it is a unit with FileDescriptorStoreMax=
max_fds: the tests give wcached $FDSTORE=max_fds, as systemd 254 and later
do, and the manager refuses (closes, without a reply, as systemd does) every
descriptor past max_fds, and lists its name in refused. Import it with

    sys.path.append(<tests>/pyutil); from fakemanager import FakeManager
"""
import array
import mmap
import os
import socket
import threading


class FakeManager:
    """A file descriptor store on a datagram socket, like systemd's."""

    def __init__(self, path, max_fds=None):
        self.path = path
        self.max_fds = max_fds   # None: no limit (and no $FDSTORE)
        self.refused = []        # the names of descriptors refused past max_fds
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(0.05)
        self.stopping = False
        self.store = {}          # name -> [fd, ...]
        self.messages = []
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        fdsize = array.array("i").itemsize
        while not self.stopping:
            try:
                data, anc, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(253 * fdsize))
            except socket.timeout:
                continue
            fds = array.array("i")
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(payload[:len(payload) - len(payload) % fdsize])
            fields = dict(line.split("=", 1) for line in data.decode().splitlines()
                          if "=" in line)
            with self.cond:
                self.messages.append(fields)
                name = fields.get("FDNAME", "stored")
                if fields.get("FDSTORE") == "1":
                    for fd in fds:
                        # systemd keeps one copy of the same open file
                        have = [os.fstat(f) for f in self.store.get(name, [])]
                        st = os.fstat(fd)
                        if any((h.st_dev, h.st_ino) == (st.st_dev, st.st_ino) for h in have):
                            os.close(fd)
                        elif self.max_fds is not None and \
                                sum(map(len, self.store.values())) >= self.max_fds:
                            self.refused.append(name)
                            os.close(fd)
                        else:
                            self.store.setdefault(name, []).append(fd)
                    fds = []
                elif fields.get("FDSTOREREMOVE") == "1":
                    for fd in self.store.pop(name, []):
                        os.close(fd)
                for fd in fds:
                    os.close(fd)
                self.cond.notify_all()

    def wait_for(self, cond, what):
        with self.cond:
            assert self.cond.wait_for(lambda: cond(self), timeout=60), \
                f"timed out waiting for {what}: {sorted(self.store)}"

    def env(self):
        """What wcached's environment gets from this manager: $NOTIFY_SOCKET,
        and $FDSTORE when it has a limit."""
        env = {"NOTIFY_SOCKET": self.path}
        if self.max_fds is not None:
            env["FDSTORE"] = str(self.max_fds)
        return env

    def fds(self):
        """How many descriptors the store holds."""
        with self.lock:
            return sum(map(len, self.store.values()))

    def count(self, key, value="1"):
        with self.lock:
            return sum(1 for m in self.messages if m.get(key) == value)

    def status_slot(self, slot):
        with self.lock:
            fd = self.store["wc-status"][0]
        with mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ) as m:
            return int.from_bytes(m[slot * 8:slot * 8 + 8], "little")

    def listen_fds(self):
        """The store as the next process gets it: high copies of the fds
        (so the wrapper can put them at 3..) and their names."""
        with self.lock:
            names, fds = [], []
            for name, stored in sorted(self.store.items()):
                for fd in stored:
                    names.append(name)
                    fds.append(os.dup2(fd, 1000 + len(fds), inheritable=True))
        return fds, names

    def close(self):
        self.stopping = True
        self.thread.join(timeout=60)
        self.sock.close()
        for stored in self.store.values():
            for fd in stored:
                os.close(fd)
