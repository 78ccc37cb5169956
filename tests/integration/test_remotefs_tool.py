"""The tests' own "remote" filesystem, tests/tools/remotefs.c, against the
real kernel: that it shows its backing directory byte for byte (read and
mmap, nested directories, offsets past 4 GiB), that changes made in the
backing directory ("by another host") raise no inotify event on the mount
and show only once the cached attributes expire, that handles of a freed
inode fail as on NFS (EIO, ESTALE, or not with --stale=keep), that a
mapping whose pages were dropped gets SIGBUS on its next touch (the failure
wcached must spare its workers), that --read-rate (and throttle() /
unthrottle() while mounted) makes reads as slow as asked and fast again,
and that other users get in with allow_other. tests/pyutil/remotefs.py mounts it; everything skips, on one
line, where it cannot run (not built, no /dev/fuse, not root)."""
import ctypes
import hashlib
import ctypes.util
import errno
import mmap
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time

import pytest

from conftest import TEST_USER, as_user, open_to, parse_user, wait_until

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from remotefs import (FUSE_SUPER_MAGIC, RemoteFS, binary, drop_cache,  # noqa: E402
                      mount_entry, resident_pages, skip_reason)

SKIP = skip_reason()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

MiB = 1 << 20


def pattern(size, seed):
    """size bytes that differ from one seed to another and along the file."""
    block = bytes((i * 31 + seed * 7) & 0xFF for i in range(4093))
    return (block * (size // len(block) + 1))[:size]


@pytest.fixture
def rfs(tmp_path):
    """A mounted remotefs with attributes cached 0.5 s and a 1 MiB
    readahead; stopped after the test (its exit status 0 is part of the
    test: a crash or, in the ASan build, a leak fails it)."""
    with RemoteFS(tmp_path / "backing", tmp_path / "mnt", attr_timeout=0.5,
                  read_ahead_kb=1024) as fs:
        yield fs


# -- inotify, through ctypes ----------------------------------------------

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
IN_ALL_EVENTS = 0xFFF
IN_OPEN = 0x20
IN_MOVED_TO = 0x80
# What a change to a directory's entries or files raises: IN_MODIFY,
# IN_ATTRIB, IN_CLOSE_WRITE, IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE,
# IN_DELETE (IN_OPEN, IN_ACCESS, IN_CLOSE_NOWRITE are reads).
IN_CHANGES = 0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200


class Inotify:
    """An inotify descriptor watching the given directories for everything."""

    def __init__(self, *paths):
        self.fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0, os.strerror(ctypes.get_errno())
        self.watches = {}
        for p in paths:
            wd = _libc.inotify_add_watch(self.fd, os.fsencode(str(p)), IN_ALL_EVENTS)
            assert wd >= 0, f"inotify_add_watch {p}: {os.strerror(ctypes.get_errno())}"
            self.watches[wd] = str(p)

    def events(self, wait):
        """[(watched path, mask, name)] of the events that arrive within
        wait seconds of the first read (all of them already queued)."""
        out, deadline = [], time.monotonic() + wait
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.fd], [], [], max(left, 0))
            if not ready:
                return out
            data = os.read(self.fd, 65536)
            off = 0
            while off < len(data):
                wd, mask, _, length = struct.unpack_from("iIII", data, off)
                name = data[off + 16:off + 16 + length].rstrip(b"\0").decode()
                out.append((self.watches.get(wd), mask, name))
                off += 16 + length

    def close(self):
        os.close(self.fd)


# -- the passthrough -------------------------------------------------------

def test_reads_and_maps_the_backing_bytes(rfs):
    data = pattern(24 * MiB + 12345, 1)
    os.makedirs(rfs.backing_path("org/model"))
    rfs.replace("org/model/model.safetensors", data)
    rfs.replace("small.txt", b"hello\n")
    os.symlink("model/model.safetensors", rfs.backing_path("org/latest"))

    path = rfs.path("org/model/model.safetensors")
    with open(path, "rb") as f:
        assert f.read() == data
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        assert len(m) == len(data)
        assert m[:] == data
    # A file never read before, mapped and touched: the pages come in
    # through remotefs's read on the mapping's handle.
    assert drop_cache(path) == 0
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        assert m[len(data) - 5000:] == data[len(data) - 5000:]
        assert m[:] == data

    assert sorted(os.listdir(rfs.mount)) == ["org", "small.txt"]
    assert sorted(os.listdir(rfs.path("org"))) == ["latest", "model"]
    assert os.readlink(rfs.path("org/latest")) == "model/model.safetensors"
    with open(rfs.path("org/latest"), "rb") as f:
        assert f.read(100) == data[:100]
    # Nodes are backing inodes, as NFS file handles are.
    assert os.stat(path).st_ino == os.stat(rfs.backing_path("org/model/model.safetensors")).st_ino
    assert os.stat(path).st_size == len(data)

    entry = mount_entry(rfs.mount)
    assert entry["fstype"] == "fuse.remotefs"
    with open(f"/sys/class/bdi/{entry['dev']}/read_ahead_kb") as f:
        assert f.read().strip() == "1024"
    assert "allow_other" in entry["options"] and "ro" in entry["options"].split(",")
    sv, bsv = os.statvfs(rfs.mount), os.statvfs(rfs.backing)
    assert (sv.f_bsize, sv.f_blocks) == (bsv.f_bsize, bsv.f_blocks)
    assert statfs_type(rfs.mount) == FUSE_SUPER_MAGIC

    with pytest.raises(OSError) as e:
        open(rfs.path("new.txt"), "wb")
    assert e.value.errno == errno.EROFS
    with pytest.raises(OSError) as e:
        open(rfs.path("small.txt"), "r+b")
    assert e.value.errno == errno.EROFS


def statfs_type(path):
    """statfs(2)'s f_type (os.statvfs has no f_type)."""
    buf = ctypes.create_string_buffer(256)
    assert _libc.statfs(os.fsencode(path), buf) == 0, os.strerror(ctypes.get_errno())
    return struct.unpack_from("l", buf)[0]


def test_offsets_past_4_gib(rfs):
    """A sparse 6 GiB file: 64-bit offsets all the way through pread,
    read and mmap."""
    tail = pattern(3 * MiB, 2)
    where = (5 << 30) + 4096 * 3
    with open(rfs.backing_path("big.bin"), "wb") as f:
        f.seek(where)
        f.write(tail)
        f.truncate(6 << 30)
    path = rfs.path("big.bin")
    assert os.stat(path).st_size == 6 << 30
    fd = os.open(path, os.O_RDONLY)
    try:
        assert os.pread(fd, len(tail), where) == tail
        assert os.pread(fd, 8192, where - 4096) == bytes(4096) + tail[:4096]
        with mmap.mmap(fd, 3 * MiB, prot=mmap.PROT_READ, offset=where - 4096 * 3) as m:
            assert m[4096 * 3:] == tail[:3 * MiB - 4096 * 3]
        assert os.pread(fd, 100, (6 << 30) - 50) == bytes(50)
    finally:
        os.close(fd)


# -- what another host's changes look like here ---------------------------

def test_remote_rename_shows_late_and_without_inotify(rfs):
    rfs.replace("model.bin", pattern(MiB, 3))
    cached = time.monotonic()         # the stat below caches the attributes
    old_ino = os.stat(rfs.path("model.bin")).st_ino
    watch = Inotify(rfs.mount, rfs.backing)
    try:
        new_ino = rfs.replace("model.bin", pattern(2 * MiB, 4))
        assert new_ino != old_ino
        # Within the attribute timeout the mount still shows the old file
        # (the kernel's cache): that is what "no event" costs a watcher.
        seen = os.stat(rfs.path("model.bin")).st_ino
        if time.monotonic() - cached < rfs.attr_timeout * 0.8:
            assert seen == old_ino
        # Then it shows within the timeout (twice, for the slack).
        rfs.wait_visible("model.bin", timeout=2 * rfs.attr_timeout)
        with open(rfs.path("model.bin"), "rb") as f:
            assert f.read() == pattern(2 * MiB, 4)

        events = watch.events(wait=2 * rfs.attr_timeout)
        on_backing = [e for e in events if e[0] == rfs.backing]
        on_mount = [e for e in events if e[0] == rfs.mount]
        # The controls: both watches work. The one on BACKING saw the
        # rename; the one on the mount saw this test's own open.
        assert any(mask & IN_MOVED_TO and name == "model.bin" for _, mask, name in on_backing)
        assert any(mask & IN_OPEN and name == "model.bin" for _, mask, name in on_mount)
        # No change reached the mount.
        assert [e for e in on_mount if e[1] & IN_CHANGES] == [], on_mount
    finally:
        watch.close()


def test_remote_new_file_shows_after_the_negative_entry_expires(rfs):
    with pytest.raises(FileNotFoundError):
        os.stat(rfs.path("later.bin"))
    rfs.replace("later.bin", b"x" * 1000)
    rfs.wait_visible("later.bin", timeout=2 * rfs.attr_timeout)


def test_half_written_file_grows_through_the_mount(rfs):
    data = pattern(4 * MiB, 5)
    writer = rfs.write_slowly("slow.bin", data, seconds=2.0, chunks=10)
    sizes = set()
    while writer.is_alive():
        try:
            sizes.add(os.stat(rfs.path("slow.bin")).st_size)
        except FileNotFoundError:
            pass
        time.sleep(0.05)
    writer.join()
    assert writer.error is None
    assert any(0 < s < len(data) for s in sizes), sizes
    rfs.wait_visible("slow.bin")
    with open(rfs.path("slow.bin"), "rb") as f:
        assert f.read() == data


# -- handles of freed inodes ----------------------------------------------

@pytest.mark.parametrize("stale, expect", [("eio", errno.EIO), ("estale", errno.ESTALE),
                                           ("keep", None)])
@pytest.mark.parametrize("how", ["replace", "remove"])
def test_old_handle_after_remote_change(tmp_path, stale, expect, how):
    """Attributes are cached for 5 s here, so that every step below happens
    while the kernel still trusts what it cached: what fails, fails in
    remotefs, not by a timeout."""
    old, new = pattern(4 * MiB, 6), pattern(3 * MiB, 7)
    with RemoteFS(tmp_path / "b", tmp_path / "m", attr_timeout=5.0, stale=stale) as fs:
        fs.replace("model.bin", old)
        fd = os.open(fs.path("model.bin"), os.O_RDONLY)
        try:
            assert os.pread(fd, MiB, 0) == old[:MiB]
            if how == "replace":
                fs.replace("model.bin", new)
            else:
                fs.remove("model.bin")
            # Pages cached before the change still read (as on NFS)...
            assert os.pread(fd, 4096, 0) == old[:4096]
            # ...and the others go to remotefs, which finds the inode freed.
            assert drop_cache(fd) == 0
            if expect is None:
                assert os.pread(fd, len(old), 0) == old
            else:
                with pytest.raises(OSError) as e:
                    os.pread(fd, 4096, 2 * MiB)
                assert e.value.errno == expect

            # Once the kernel drops what it knows of the inode (its pages
            # and attributes), fstat of the old descriptor asks remotefs:
            # ESTALE, as NFS's GETATTR of a freed file handle.
            assert fs.drop_stale() == 1
            if expect is None:
                assert os.fstat(fd).st_nlink == 0
                assert os.pread(fd, len(old), 0) == old
                return
            with pytest.raises(OSError) as e:
                os.fstat(fd)
            assert e.value.errno == errno.ESTALE
            with pytest.raises(OSError) as e:
                os.pread(fd, 4096, 0)
            assert e.value.errno == expect
            # The path is looked up again at once (the kernel retries a
            # lookup that met ESTALE), well before the 5 s are over.
            if how == "replace":
                with open(fs.path("model.bin"), "rb") as f:
                    assert f.read() == new
            else:
                assert not os.path.exists(fs.path("model.bin"))
        finally:
            os.close(fd)


# -- SIGBUS through a mapping ---------------------------------------------

# The worker: maps the file, optionally touches every page, says "mapped",
# waits for a line on stdin, then touches every page again and compares
# the bytes with the SHA-256 it was given: exit 0, 3 on a mismatch, or
# death by SIGBUS.
TOUCHER = r"""
import hashlib, mmap, os, sys
path, touch_first, digest = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
fd = os.open(path, os.O_RDONLY)
m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
n = len(m)
if touch_first:
    sum(m[i] for i in range(0, n, mmap.PAGESIZE))
print("mapped", flush=True)
sys.stdin.readline()
sum(m[i] for i in range(0, n, mmap.PAGESIZE))
sys.exit(0 if hashlib.sha256(m).hexdigest() == digest else 3)
"""


def start_toucher(path, touch_first, seed):
    """The toucher on path, which should hold pattern(its size, seed)."""
    digest = hashlib.sha256(pattern(os.stat(path).st_size, seed)).hexdigest()
    p = subprocess.Popen([sys.executable, "-c", TOUCHER, path, "1" if touch_first else "0",
                          digest], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    ready, _, _ = select.select([p.stdout], [], [], 60)
    assert ready and p.stdout.readline().strip() == "mapped", "the toucher did not start"
    return p


def finish_toucher(p):
    p.stdin.write("go\n")
    p.stdin.flush()
    return p.wait(timeout=60)


@pytest.mark.parametrize("touch_first", [False, True], ids=["untouched", "touched"])
def test_old_mapping_gets_sigbus_once_its_pages_are_dropped(tmp_path, touch_first):
    """What wcached must spare its workers: a worker maps a model on the
    remote filesystem, another host renames a new version over it (the
    server frees the old inode), the pages go, and the next touch kills
    the worker with SIGBUS.

    What drops the pages: an untouched mapping has no page mapped, so
    POSIX_FADV_DONTNEED on any descriptor of the old file drops them all
    (drop_cache, checked to leave 0 resident). A mapping that touched its
    pages holds them mapped, which fadvise and drop_caches skip; remotefs
    then has the kernel invalidate the freed inode (drop_stale: SIGUSR1,
    FUSE's inode invalidation unmaps and drops them, as an NFS client does
    once it learns the inode is gone)."""
    size = 8 * MiB
    with RemoteFS(tmp_path / "b", tmp_path / "m", attr_timeout=0.5) as fs:
        fs.replace("model.bin", pattern(size, 8))
        fd = os.open(fs.path("model.bin"), os.O_RDONLY)
        try:
            p = start_toucher(fs.path("model.bin"), touch_first, 8)
            fs.replace("model.bin", pattern(size, 9))
            if touch_first:
                assert resident_pages(fd) == size // mmap.PAGESIZE
                assert drop_cache(fd) == size // mmap.PAGESIZE   # mapped: kept
                assert fs.drop_stale() == 1
            assert drop_cache(fd) == 0
            status = finish_toucher(p)
        finally:
            os.close(fd)
        assert status == -signal.SIGBUS, f"the toucher exited with {status}, not SIGBUS"

        # The control: the same on a file left alone reads fine (and so
        # does a replaced one under --stale=keep, in the next test).
        p = start_toucher(fs.path("model.bin"), touch_first, 9)
        assert drop_cache(fs.path("model.bin")) >= 0
        assert finish_toucher(p) == 0


def test_keep_mode_old_mapping_reads_the_old_bytes(tmp_path):
    size = 8 * MiB
    with RemoteFS(tmp_path / "b", tmp_path / "m", attr_timeout=0.5, stale="keep") as fs:
        fs.replace("model.bin", pattern(size, 10))
        p = start_toucher(fs.path("model.bin"), True, 10)
        fs.replace("model.bin", pattern(size, 11))
        assert fs.drop_stale() == 1
        assert finish_toucher(p) == 0


# -- a slow server: the read throttle ------------------------------------

def timed_read(path):
    """Seconds to read path whole, from the server (its cached pages dropped
    first), and the bytes read."""
    assert drop_cache(path) == 0
    start = time.monotonic()
    with open(path, "rb") as f:
        n = len(f.read())
    return time.monotonic() - start, n


def test_read_rate_throttles_reads_and_unthrottle_ends_it(tmp_path):
    size = 6 * MiB
    with RemoteFS(tmp_path / "b", tmp_path / "m", attr_timeout=0.5,
                  read_rate=4 * MiB) as fs:
        fs.replace("model.bin", pattern(size, 20))
        fs.wait_visible("model.bin")
        path = fs.path("model.bin")
        # --read-rate 4 MiB/s: 6 MiB take 1.5 s, whatever the requests.
        slow, n = timed_read(path)
        assert n == size
        assert slow >= 0.8 * size / (4 * MiB), slow
        # Unthrottled: the backing's speed (tens of milliseconds here).
        fs.unthrottle()
        fast, n = timed_read(path)
        assert n == size and fast < slow / 3, (fast, slow)
        # Throttled again while mounted, at another rate.
        fs.throttle(2 * MiB)
        slow2, n = timed_read(path)
        assert n == size and slow2 >= 0.8 * size / (2 * MiB), slow2
        # Unthrottling lets a read waiting its turn go at once: one that
        # would take 6 s at 1 MiB/s ends soon after.
        fs.throttle(1 * MiB)
        assert drop_cache(path) == 0
        done, first = {}, threading.Event()

        def read():
            start = time.monotonic()
            with open(path, "rb") as f:
                n = len(f.read(MiB))
                done["first"] = time.monotonic() - start
                first.set()
                done["bytes"] = n + len(f.read())
            done["seconds"] = time.monotonic() - start
        reader = threading.Thread(target=read)
        reader.start()
        assert first.wait(timeout=30)
        assert done["first"] >= 0.5, done  # throttled: about 1 s for the first MiB
        fs.unthrottle()
        reader.join(timeout=30)
        assert done["bytes"] == size and done["seconds"] < 4.0, done
        # A SIGRTMIN without a value (kill(1)) ends the throttle too.
        fs.throttle(1 * MiB)
        fs.proc.send_signal(signal.SIGRTMIN)
        wait_until(lambda: fs.read_log().splitlines()[-1:] == ["remotefs: reads not throttled"],
                   timeout=30, what="remotefs to say the throttle ended")
        log = fs.read_log()
        assert log.count("remotefs: reads throttled to 2097152 bytes/s") == 1, log
        assert log.count("remotefs: reads throttled to 1048576 bytes/s") == 2, log


# -- other users, options, errors, cleanup --------------------------------

def test_bad_range_fails_the_reads_that_overlap_it(tmp_path):
    """--bad-range 1M-2M: a read overlapping the second MiB fails with EIO,
    the bytes before and after it read (a header and an end validate), and a
    file shorter than 1 MiB reads whole."""
    data = pattern(3 * MiB, 21)
    with RemoteFS(tmp_path / "b", tmp_path / "m", bad_range=(MiB, 2 * MiB)) as fs:
        fs.replace("big.bin", data)
        fs.replace("small.bin", data[:MiB - 4096])
        fs.wait_visible("small.bin")
        with open(fs.path("small.bin"), "rb") as f:
            assert f.read() == data[:MiB - 4096]
        fd = os.open(fs.path("big.bin"), os.O_RDONLY)
        try:
            assert os.pread(fd, 4096, 0) == data[:4096]
            assert os.pread(fd, 4096, 3 * MiB - 4096) == data[-4096:]
            with pytest.raises(OSError) as e:
                os.pread(fd, 4096, MiB + 8192)
            assert e.value.errno == errno.EIO
        finally:
            os.close(fd)


def run_as_test_user(*argv):
    uid, gid = parse_user(TEST_USER) if TEST_USER else (64101, 64100)
    return subprocess.run(as_user(uid, gid) + list(argv), capture_output=True, text=True,
                          timeout=60)


READER = "import sys; sys.stdout.write(open(sys.argv[1]).read())"


@pytest.mark.parametrize("allow_other", [True, False])
def test_other_users_need_allow_other(tmp_path, allow_other):
    uid, gid = parse_user(TEST_USER) if TEST_USER else (64101, 64100)
    open_to(tmp_path, uid, gid)
    with RemoteFS(tmp_path / "b", tmp_path / "m", allow_other=allow_other) as fs:
        fs.replace("open.txt", b"for everyone\n")
        fs.replace("secret.txt", b"root only\n", mode=0o600)
        r = run_as_test_user(sys.executable, "-c", READER, fs.path("open.txt"))
        if allow_other:
            assert r.returncode == 0, r.stderr
            assert r.stdout == "for everyone\n"
            # The kernel checks the backing modes (default_permissions).
            r = run_as_test_user(sys.executable, "-c", READER, fs.path("secret.txt"))
            assert r.returncode != 0 and "Permission denied" in r.stderr, r.stderr
        else:
            assert r.returncode != 0 and "Permission denied" in r.stderr, r.stderr


def test_stop_unmounts_a_busy_mount(tmp_path):
    fs = RemoteFS(tmp_path / "b", tmp_path / "m").start()
    fs.replace("f.bin", b"data")
    f = open(fs.path("f.bin"), "rb")
    m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    try:
        # fusermount3 -u refuses (busy), umount -l detaches it, and
        # remotefs, still serving the mapping, ends cleanly on SIGTERM.
        assert fs.stop(timeout=10) == 0
        assert not fs.mounted()
        assert fs.proc.poll() is not None
    finally:
        m.close()
        f.close()


def remotefs(*argv):
    return subprocess.run([binary(), *map(str, argv)], capture_output=True, text=True,
                          timeout=30)


def test_usage_and_errors(tmp_path):
    r = remotefs("--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: remotefs")
    assert "--stale=" in r.stdout and "--attr-timeout" in r.stdout
    assert "--read-rate BYTES" in r.stdout and "SIGRTMIN" in r.stdout

    d = tmp_path / "d"
    d.mkdir()
    (tmp_path / "file").write_text("x")
    for argv, status, message in [
        (["--bogus", d, d], 2, "remotefs: unknown option: --bogus (see 'remotefs --help')"),
        (["-x", d, d], 2, "remotefs: unknown option: -x (see 'remotefs --help')"),
        (["--stale=sometimes", d, d], 2,
         "remotefs: --stale wants eio, estale or keep, not: sometimes (see 'remotefs --help')"),
        (["--attr-timeout", "-1", d, d], 2,
         "remotefs: --attr-timeout wants seconds from 0 to 1e6, not: -1 "
         "(see 'remotefs --help')"),
        (["--attr-timeout"], 2, "remotefs: option needs a value: --attr-timeout "
         "(see 'remotefs --help')"),
        (["-o"], 2, "remotefs: option needs a value: -o (see 'remotefs --help')"),
        (["--read-rate"], 2, "remotefs: option needs a value: --read-rate "
         "(see 'remotefs --help')"),
        (["--read-rate", "fast", d, d], 2, "remotefs: --read-rate wants bytes per second "
         "(K, M, G: KiB, MiB, GiB), at most 1024G, not: fast (see 'remotefs --help')"),
        (["--read-rate=1025G", d, d], 2, "remotefs: --read-rate wants bytes per second "
         "(K, M, G: KiB, MiB, GiB), at most 1024G, not: 1025G (see 'remotefs --help')"),
        (["--read-rate=-1", d, d], 2, "remotefs: --read-rate wants bytes per second "
         "(K, M, G: KiB, MiB, GiB), at most 1024G, not: -1 (see 'remotefs --help')"),
        (["--read-rate=2T", d, d], 2, "remotefs: --read-rate wants bytes per second "
         "(K, M, G: KiB, MiB, GiB), at most 1024G, not: 2T (see 'remotefs --help')"),
        (["--bad-range", "2M-1M", d, d], 2, "remotefs: --bad-range wants FROM-TO, byte "
         "offsets, FROM below TO (K, M, G: KiB, MiB, GiB), not: 2M-1M (see 'remotefs --help')"),
        (["--bad-range=1M", d, d], 2, "remotefs: --bad-range wants FROM-TO, byte "
         "offsets, FROM below TO (K, M, G: KiB, MiB, GiB), not: 1M (see 'remotefs --help')"),
        ([d], 2, "remotefs: missing BACKING or MOUNTPOINT (see 'remotefs --help')"),
        ([d, d, d], 2, "remotefs: too many arguments (see 'remotefs --help')"),
        ([tmp_path / "none", d], 1,
         f"remotefs: BACKING {tmp_path}/none: No such file or directory"),
        ([tmp_path / "file", d], 1, f"remotefs: BACKING {tmp_path}/file: Not a directory"),
        ([d, tmp_path / "none"], 1,
         f"remotefs: MOUNTPOINT {tmp_path}/none: No such file or directory"),
        ([d, tmp_path / "file"], 1, f"remotefs: MOUNTPOINT {tmp_path}/file: not a directory"),
    ]:
        r = remotefs(*argv)
        assert (r.returncode, r.stderr) == (status, message + "\n"), argv
    # A mount option libfuse does not know: its reason, then ours.
    r = remotefs("-o", "no_such_option", d, d)
    assert r.returncode == 2
    assert r.stderr.splitlines()[-1] == "remotefs: bad mount options (libfuse's reason above)"
    assert "no_such_option" in r.stderr
