"""Residency that is true, and kept: status and metrics agree with the kernel
(fincore) whether wcached may ask the page cache (root: cachestat) or not
(its own user reading a root-owned model, as packaged: it counts the pages
it maps); a client's posix_fadvise(DONTNEED) on the descriptor it was given
drops nothing; pages memory pressure takes (MADV_PAGEOUT of the daemon's
mapping, from outside with process_madvise) are noticed and warmed again."""
import ctypes
import json
import os
import subprocess

import pytest

from conftest import Daemon, as_user, binary, mkmodel, open_to, wait_until

DAEMON_UID, BAD_UID, GROUP = 64101, 64102, 64100
SYS_PIDFD_OPEN, SYS_PROCESS_MADVISE, MADV_PAGEOUT = 434, 440, 21

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root: other users, fincore, process_madvise")


def status_model(d):
    r = subprocess.run([binary("wcachectl"), "--control", d.control, "--json", "status"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode in (0, 3), r.stderr  # 3: not ready (cold, warming)
    return json.loads(r.stdout)["models"][0]


def fincore(path):
    """The page cache's own answer (util-linux fincore, as root), in bytes
    capped at the file's size (it counts whole pages; status counts the
    bytes of the last, partial page)."""
    r = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", path],
                       capture_output=True, text=True, check=True)
    return min(int(r.stdout.split()[0]), os.path.getsize(path))


def mapped_bytes(pid, path):
    """How much of path process pid has mapped in (the Rss of its mappings
    of path, /proc/PID/smaps; an mlock()ed header splits one mapping in
    two)."""
    total, ours = 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            fields = line.split()
            if not fields[0].endswith(":"):     # a mapping's first line
                ours = len(fields) > 5 and line.rstrip("\n").endswith(" " + path)
            elif ours and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def page_out(pid, path):
    """Reclaims the pages of path that process pid maps (what memory pressure
    would do): process_madvise(MADV_PAGEOUT) over each of its mappings."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    pidfd = libc.syscall(SYS_PIDFD_OPEN, pid, 0)
    assert pidfd >= 0, os.strerror(ctypes.get_errno())
    try:
        with open(f"/proc/{pid}/maps") as f:
            ranges = [line.split()[0] for line in f if line.rstrip().endswith(path)]
        assert ranges, f"wcached does not map {path}"
        paged = 0
        for r in ranges:
            lo, hi = (int(x, 16) for x in r.split("-"))
            iov = IoVec(lo, hi - lo)
            n = libc.syscall(ctypes.c_long(SYS_PROCESS_MADVISE), ctypes.c_long(pidfd),
                             ctypes.byref(iov), ctypes.c_long(1), ctypes.c_long(MADV_PAGEOUT),
                             ctypes.c_long(0))
            # EINVAL: the mlock()ed header (pin = metadata), which stays.
            assert n >= 0 or ctypes.get_errno() == 22, os.strerror(ctypes.get_errno())
            paged += n > 0
        assert paged, f"no mapping of {path} could be paged out"
    finally:
        os.close(pidfd)


@pytest.mark.parametrize("who", ["root", "unprivileged"])
def test_residency_is_true_and_kept(tmp_path, who):
    # Root-owned, 0644: the packaged case (the daemon neither owns nor may
    # write it). About 17 MiB.
    model = mkmodel(tmp_path / "m.safetensors", layers=3, hidden=512, ffn=1024, vocab=1000)
    os.chmod(model, 0o644)
    open_to(tmp_path, 0, 0)  # a client of another user may open it too
    user = (DAEMON_UID, GROUP) if who == "unprivileged" else None
    d = Daemon(tmp_path, {"m": model}, user=user).start()
    try:
        size = os.path.getsize(model)
        m = wait_until(lambda: (lambda m: m["state"] == "ready" and m["resident_bytes"] == size
                                and m)(status_model(d)), what="m ready and resident")
        assert m["resident_method"] == ("cachestat" if who == "root" else "mapped"), m
        # Measured off the loop, and how long ago it says.
        assert isinstance(m["resident_age_ms"], int) and 0 <= m["resident_age_ms"] < 10000, m
        assert fincore(model) == size

        # A client drops the pages of the file it was given: nothing goes,
        # because wcached maps every page of a warm model. It maps them once
        # the model is ready (off the loop, after the figure above): wait.
        wait_until(lambda: mapped_bytes(d.proc.pid, model) >= size,
                   what="wcached to map every page of m")
        r = subprocess.run(as_user(BAD_UID, GROUP) + ["/usr/bin/python3", "-c",
                           "import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
                           "os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)", model],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert fincore(model) == size
        assert status_model(d)["resident_bytes"] == size

        # Memory pressure takes them: status says so, and wcached warms the
        # model again within its check interval (5 s).
        page_out(d.proc.pid, model)
        os.posix_fadvise(os.open(model, os.O_RDONLY), 0, 0, os.POSIX_FADV_DONTNEED)
        # (Unless the 5 s check came in between and warmed it already.)
        assert fincore(model) < size // 2 or "warming it again" in d.read_log()
        m = wait_until(lambda: (lambda m: m["rewarms"] >= 1 and m["resident_bytes"] == size
                                and m)(status_model(d)), timeout=60,
                       what="m warmed again after its pages were taken")
        # The kernel agrees (once the warm-up's own readahead has settled).
        wait_until(lambda: fincore(model) == size and
                   status_model(d)["resident_bytes"] == size, timeout=60,
                   what="fincore and status to agree the model is whole again")
        assert "still in memory (memory pressure); warming it again" in d.read_log()
        text = subprocess.run([binary("wcachectl"), "--control", d.control, "metrics"],
                              capture_output=True, text=True, check=True).stdout
        assert 'wcached_model_rewarms_total{model="m"} 1' in text
    finally:
        assert d.stop() == 0, d.read_log()
