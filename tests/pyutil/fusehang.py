"""A FUSE filesystem mounted on one regular file, whose server never answers
an open: an open(2) of the file blocks in the kernel until the connection
is aborted. It is what a neighbour who may add files to a model's directory
can make of a file of his own (fusermount mounts on a regular file its user
owns; with user_allow_other in /etc/fuse.conf, allow_other lets wcached in).
The tests mount it with mount(2) as root, as fusermount would, with the
file's owner as the mount's user_id (review rev200 H1, L3). HangFS is the
worst neighbour's server: on a directory or a file, it answers nothing but
INIT (no LOOKUP, GETATTR, OPENDIR, OPEN, STATFS...; review rev205).

    from fusehang import FuseHang, HangFS, skip_reason, blocked_in_fuse
    with FuseHang(path, uid, gid):           # path: an existing regular file
        ...                                  # an open of path blocks
        assert not blocked_in_fuse(pid)      # no thread of pid is stuck there
    place = neighbours_place(tmp_path, "m")  # skips the test without FUSE

Run as a script (python3 fusehang.py PATH UID GID) it mounts, prints
"mounted" and serves until killed."""
import ctypes
import os
import select
import signal
import struct
import subprocess
import sys
import threading

_libc = ctypes.CDLL(None, use_errno=True)
_OPEN = 14
_INIT = 26
_GETATTR = 3
_FORGET, _BATCH_FORGET, _INTERRUPT = 2, 42, 36  # no reply is sent to these
_ENOSYS = 38
_HDR_IN = struct.Struct("<IIQQIIII")  # len opcode unique nodeid uid gid pid padding


def skip_reason():
    """Why a FuseHang cannot be mounted here (one line), or None."""
    if os.geteuid() != 0:
        return "fusehang: mounting FUSE on a file with mount(2) needs root"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC))
    except OSError as e:
        return f"fusehang: cannot open /dev/fuse: {e.strerror}"
    return None


def neighbours_place(tmp_path, name):
    """Skips the test (pytest.skip, saying why) where no FUSE mount can be
    made; else the directory tmp_path/NAME, made, tmp_path opened (0755)
    so that wcached and the neighbour reach it."""
    why = skip_reason()
    if why is not None:
        import pytest
        pytest.skip(why)
    place = tmp_path / name
    place.mkdir()
    os.chmod(tmp_path, 0o755)
    return place


def blocked_in_fuse(pid):
    """The threads of pid that wait on a FUSE server: (tid, wchan)."""
    out = []
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/wchan") as f:
                w = f.read()
        except OSError:
            continue
        if "fuse" in w or "request_wait_answer" in w:
            out.append((t, w))
    return out


class FuseHang:
    """The mount on target (a regular file), its owner uid:gid, mounted
    allow_other; served by a thread of this process until close().
    getattr_too: GETATTR is not answered either (a stat(2) that asks the
    server, a realpath(3) through the file, blocks too). What is never
    answered is listed in ops (its opcodes) until close() fails it."""

    _source, _type, _answers = b"fusehang", b"fuse", True

    def __init__(self, target, uid, gid, getattr_too=False, directory=False):
        self.fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        self.uid, self.gid = uid, gid
        self.getattr_too = getattr_too  # a stat(2) of the file blocks too
        self.target = str(target)
        self.ops = []
        mode = "040755" if directory else "100644"
        opts = f"fd={self.fd},rootmode={mode},user_id={uid},group_id={gid},allow_other"
        if _libc.mount(self._source, self.target.encode(), self._type, 0, opts.encode()) != 0:
            e = ctypes.get_errno()
            os.close(self.fd)
            raise OSError(e, os.strerror(e), self.target)
        self.opens = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _reply(self, unique, body=b"", error=0):
        os.write(self.fd, struct.pack("<IiQ", 16 + len(body), error, unique) + body)

    def _serve(self):
        """Until close(): then this thread closes the descriptor itself
        (a read in progress would keep the connection open)."""
        while not self._stop.is_set():
            if not select.select([self.fd], [], [], 0.05)[0]:
                continue
            try:
                buf = os.read(self.fd, 1 << 20)
            except OSError:
                break
            _, op, unique, _, _, _, _, _ = _HDR_IN.unpack_from(buf)
            if op == _INIT:
                self._reply(unique, struct.pack("<IIIIHHIIHHI7I", 7, 31, 0, 0, 0, 0, 4096,
                                                0, 0, 0, 0, *([0] * 7)))
            elif op in (_FORGET, _BATCH_FORGET, _INTERRUPT):
                pass
            elif self._answers and op == _GETATTR and not self.getattr_too:
                attr = struct.pack("<QQQQQQIIIIIIIIII", 1, 128, 1, 0, 0, 0, 0, 0, 0,
                                   0o100644, 1, self.uid, self.gid, 0, 4096, 0)
                self._reply(unique, struct.pack("<QII", 0, 0, 0) + attr)
            elif not self._answers or op == _OPEN or op == _GETATTR:
                self.opens += op == _OPEN  # never answered (until close)
                self.ops.append(op)
            else:
                self._reply(unique, error=-_ENOSYS)
        os.close(self.fd)

    def close(self):
        """Aborts the connection (every request left unanswered fails: a
        thread blocked on it goes on), then detaches the mount."""
        if self.fd < 0:
            return
        self._stop.set()
        self.thread.join(timeout=30)
        self.fd = -1
        subprocess.run(["umount", "-l", self.target], stderr=subprocess.DEVNULL)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class HangFS(FuseHang):
    """A mount of uid's on target (a directory, or a regular file where
    directory=False), allow_other, whose server answers INIT only: the
    worst neighbour's server; source and fstype as fusermount3 -o
    fsname=,subtype= would make them."""

    _answers = False

    def __init__(self, target, uid, gid, directory=True, source=b"hangfs",
                 fstype=b"fuse.hangfs"):
        self._source, self._type = source, fstype
        super().__init__(target, uid, gid, directory=directory)


if __name__ == "__main__":
    f = FuseHang(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
    print("mounted", flush=True)
    signal.pause()
