"""A pending generation (a watched reload's new generation, loaded and
warming, not yet served) whose file is changed in place: the same outcome
whether the change lands before wcached compared the generation's paths
once it was watched (watch.c's sync job) or after; and whatever the change
(a touch, a change of times alone, a truncate(2), a chmod before a write),
the file is loaded again once, and never while a writer has it open.

Before, the two timings differed. A touch between the load's open of the
file and the generation's install (no event can reach a generation not yet
made) was found by the sync job's stat of the model's path: generation 2
was dropped, "PATH changed before its directory was watched" logged, and
the touched file reloaded as generation 3. The same touch once the sync job
had stat'ed the path came as an inotify event (IN_ATTRIB): generation 2 was
dropped and nothing reloaded, so generation 1 served on, older than the
file on disk, until the next rename. Now both drop generation 2 with one
line and reload the touched file once, as generation 3, which serves
(README, "Updating a model safely").

The timings are driven with an LD_PRELOAD gate in the daemon, no sleep:
while GATE/load exists, the load's first SEEK_DATA on the model file (its
holes check, after open and validation, before the install; a model over
64 MiB has one) waits; while GATE/warm exists, the warm pool's reads of it
wait, so the generation stays pending. Each creates GATE/NAME.held when it
holds. With one work queue thread (UV_THREADPOOL_SIZE=1) jobs run in the
order they were queued, so a second model's reload that has been installed
proves that every job queued before it (the sync job, or a reload of the
first model) has run: the barrier that makes "after", "reloaded" and
"only once" certain rather than likely.

Whether anyone has a file open for writing, wcached asks with a read lease
(F_SETLEASE), which needs the file's owner or CAP_LEASE. As root it has
CAP_LEASE. The packaged unit runs it as wcache with no capabilities: these
tests run so too in ctest's integration_unprivileged (WCACHE_TEST_USER), the
models' files then owned by wcached's uid, and must give the same outcome
with no "cannot tell" line. The last tests give the files to another user
than wcached's, with wcached unprivileged (as WCACHE_TEST_USER, else as
OWN_USER when this process is root): wcached cannot tell, says so once, and
loads the file again after the settle time, as it did before it asked,
written or not (README, "Updating a model safely"). The question is asked
by the reload's own load job (registry_load.c's find_writer); what other
events may not load a file still being written is test_watch_writer's."""
import json
import os
import shutil
import signal
import subprocess

import pytest

from conftest import TEST_USER, Daemon, mkmodel, parse_user, wait_until
from ctlutil import daemons, model_entry

SMALL = dict(layers=2, hidden=64, ffn=128, vocab=100)
# 96 MiB, over gen_check_holes' 64 MiB bound: a load of it seeks its data.
BIG = dict(layers=2, hidden=1024, ffn=4096, vocab=8192)

GATE_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/sendfile.h>
#include <sys/types.h>
#include <unistd.h>

/* Waits while WC_GATE_DIR/what exists and fd is WC_GATE_FILE (by
 * /proc/self/fd), having created WC_GATE_DIR/what.held. */
static void
hold(int fd, const char *what)
{
	const char *gate = getenv("WC_GATE_DIR"), *file = getenv("WC_GATE_FILE");
	char armed[PATH_MAX], held[PATH_MAX], link[64], target[PATH_MAX];
	ssize_t n;
	int h;

	if (gate == NULL || file == NULL)
		return;
	snprintf(armed, sizeof(armed), "%s/%s", gate, what);
	if (access(armed, F_OK) != 0)
		return;
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	if ((n = readlink(link, target, sizeof(target) - 1)) < 0)
		return;
	target[n] = '\0';
	if (strcmp(target, file) != 0)
		return;
	snprintf(held, sizeof(held), "%s/%s.held", gate, what);
	if ((h = open(held, O_WRONLY | O_CREAT | O_CLOEXEC, 0666)) >= 0)
		close(h);
	while (access(armed, F_OK) == 0)
		usleep(5000);
}

static int
warm_thread(void)
{
	char name[17] = "";

	prctl(PR_GET_NAME, name);
	return strncmp(name, "wc-warm", 7) == 0;
}

#define NEXT(fn) ((__typeof__(&fn))dlsym(RTLD_NEXT, #fn))

off_t
lseek(int fd, off_t off, int whence)
{
	if (whence == SEEK_DATA)
		hold(fd, "load");
	return NEXT(lseek)(fd, off, whence);
}

off64_t
lseek64(int fd, off64_t off, int whence)
{
	if (whence == SEEK_DATA)
		hold(fd, "load");
	return NEXT(lseek64)(fd, off, whence);
}

ssize_t
sendfile(int out, int in, off_t *off, size_t n)
{
	hold(in, "warm");
	return NEXT(sendfile)(out, in, off, n);
}

ssize_t
sendfile64(int out, int in, off64_t *off, size_t n)
{
	hold(in, "warm");
	return NEXT(sendfile64)(out, in, off, n);
}

ssize_t
pread(int fd, void *buf, size_t n, off_t off)
{
	if (warm_thread())
		hold(fd, "warm");
	return NEXT(pread)(fd, buf, n, off);
}

ssize_t
pread64(int fd, void *buf, size_t n, off64_t off)
{
	if (warm_thread())
		hold(fd, "warm");
	return NEXT(pread64)(fd, buf, n, off);
}
"""


def build_shim(tmp_path_factory, source):
    """source compiled as an LD_PRELOAD library in a directory any uid may
    read (the daemon may run as another user); skips without a compiler."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler for the gate shim")
    d = tmp_path_factory.mktemp("shim")
    (d / "gate.c").write_text(source)
    out = str(d / "gate.so")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", out, str(d / "gate.c"), "-ldl"],
                   check=True)
    os.chmod(str(d), 0o755)
    return out


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    return build_shim(tmp_path_factory, GATE_SHIM)


class GatedDaemon(Daemon):
    """A Daemon under the gate shim, its work queue one thread."""

    gate_env = {}

    def start(self, env=None, timeout=60.0, args=()):
        env = dict(os.environ, **self.gate_env)
        # A gcc ASan build's runtime must come first; the shim is harmless there.
        env["ASAN_OPTIONS"] = ":".join(filter(None, [os.environ.get("ASAN_OPTIONS"),
                                                     "verify_asan_link_order=0"]))
        return super().start(env=env, timeout=timeout, args=args)


@pytest.fixture
def start(tmp_path):
    yield from daemons(lambda models, **kw: GatedDaemon(tmp_path, models, **kw))


def entry(d, name):
    m = model_entry(d, name)
    assert m is not None, name
    return m


def ready(d, name, generation, size=None):
    def check():
        m = entry(d, name)
        return m if (m["generation"] == generation and m["state"] == "ready"
                     and m["pending"] == 0
                     and (size is None or m["bytes"] == size)) else None
    return wait_until(check, timeout=60, what=f"{name} generation {generation} ready")


def wait_dropped(d):
    """Waits until m's pending generation 2 is dropped, generation 1
    serving, and its one line is logged."""
    def dropped():
        m = entry(d, "m")
        return m if m["pending"] != 2 else None
    m = wait_until(dropped, timeout=60, what="generation 2 to be dropped")
    assert m["generation"] == 1, m
    d.wait_for_log(r'model "m": \S+ of generation 2 was modified in place')


def wait_file(path):
    wait_until(lambda: os.path.exists(path), timeout=60, what=f"{path} to appear")


# Whom wcached runs as here: None for root (with CAP_LEASE), else (uid, gid).
DAEMON_USER = parse_user(TEST_USER) if TEST_USER else None
if DAEMON_USER is not None and (os.geteuid() != 0 or shutil.which("setpriv") is None):
    pytestmark = pytest.mark.skip(reason="WCACHE_TEST_USER is set: running wcached as that "
                                  "user, and giving it the models' files, needs root and "
                                  "setpriv (util-linux)")
# wcached's user where a test needs it unprivileged and WCACHE_TEST_USER is
# not set, and the other user whose files it cannot lease.
OWN_USER, OTHER_USER = (64141, 64100), (64142, 64142)
CANNOT_TELL = "cannot tell whether its files are still being written"


class Models:
    """m (gated, in dir m/) and n (the barrier, in dir n/) under one daemon."""

    def __init__(self, start, tmp_path, shim, directory=False, user=None, owner=None):
        """directory: m is its directory m/, its file m/m.safetensors.
        user: whom wcached runs as, (uid, gid) (default DAEMON_USER); owner:
        whose m's and n's files are (default wcached's user; None: this
        process's)."""
        self.user = user if user is not None else DAEMON_USER
        self.owner = owner if owner is not None else self.user
        self.tmp = tmp_path
        self.gate = tmp_path / "gate"
        self.gate.mkdir()
        os.chmod(self.gate, 0o777)  # the daemon may run as another user
        for sub in ("m", "n"):
            # The models' owner's, writable by her alone: in a directory
            # others may rename entries in, a file not serving waits for
            # the operator's reload (review rev201 H2).
            (tmp_path / sub).mkdir(exist_ok=True)
            os.chmod(tmp_path / sub, 0o755)
            self.own(str(tmp_path / sub))
        self.m = os.path.realpath(tmp_path / "m" / "m.safetensors")
        self.n = str(tmp_path / "n" / "n.safetensors")
        mkmodel(self.m, seed=1, **SMALL)
        mkmodel(self.n, seed=1, **SMALL)
        self.own(self.m)
        self.own(self.n)
        GatedDaemon.gate_env = {"LD_PRELOAD": shim, "WC_GATE_DIR": str(self.gate),
                                "WC_GATE_FILE": self.m, "UV_THREADPOOL_SIZE": "1"}
        # Warm threads to spare: n's warm-ups must not wait behind m's held ones.
        self.d = start({"m": os.path.dirname(self.m) if directory else self.m, "n": self.n},
                       prefetch_threads=4, user=self.user)
        ready(self.d, "m", 1)
        ready(self.d, "n", 1)
        self.n_generation = 1
        # Not a second *.safetensors in a directory model's directory.
        self.tmp_name = ".next.tmp" if directory else ".next.safetensors"

    def arm(self, what):
        (self.gate / what).touch()

    def release(self, what):
        os.unlink(self.gate / what)

    def held(self, what):
        wait_file(str(self.gate / f"{what}.held"))

    def own(self, path):
        """Gives path to the models' owner."""
        if self.owner is not None:
            os.chown(path, *self.owner)

    def replace(self, path, make):
        tmp = os.path.join(os.path.dirname(path), self.tmp_name)
        make(tmp)
        self.own(tmp)
        os.rename(tmp, path)

    def written_serves(self):
        """Generation 3 of m, its file as written, serves and attaches."""
        m = ready(self.d, "m", 3, os.path.getsize(self.m))
        assert "error" not in m, m
        r = self.d.attach("m", "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["generation"] == 3

    def could_tell(self):
        """wcached could lease every file it asked about: the files are its
        own (or it is root), and it never said it cannot tell."""
        assert CANNOT_TELL not in self.d.read_log(), self.d.read_log()

    def pending_watched(self):
        """Generation 2 of m, pending (its warm-up held), its sync job run:
        only inotify sees a change of its file from now on."""
        self.arm("warm")
        self.replace(self.m, lambda p: mkmodel(p, seed=2, **BIG))
        self.held("warm")
        self.barrier()

    def written_pending(self):
        """Generation 2 of m, pending, its file opened for writing and
        written in place, dropped for it: the writer's descriptor (open)."""
        self.pending_watched()
        fd = os.open(self.m, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.pwrite(fd, b"\x01\x02", 1 << 20)  # inside the tensors' data
            wait_dropped(self.d)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def touched_pending(self, timing, reloads=True):
        """Generation 2 of m, pending (its warm-up held), its file touched
        before its sync job compared its paths (timing "before") or after.
        reloads: whether the drop loads the file again (else, touched
        before, generation 2 may be dropped before its warm-up holds)."""
        self.arm("warm")
        if timing == "before":
            self.arm("load")
        self.replace(self.m, lambda p: mkmodel(p, seed=2, **BIG))
        if timing == "before":
            # Generation 2's load has opened and validated the file and is
            # not installed yet: no event of the touch can reach it.
            self.held("load")
            os.utime(self.m)
            self.release("load")
            if reloads:
                self.held("warm")  # generation 2's, or else 3's
        else:
            self.held("warm")
            # Its sync job was queued at its install: once n's reload has
            # run, the job has stat'ed m's path, and only inotify sees the
            # touch.
            self.barrier()
            os.utime(self.m)

    def reloaded_once(self, size=True):
        """After n's next reload, generation 3 of m (the changed file) is
        pending and 1 serves; released, 3 serves without an error."""
        self.barrier()
        m = entry(self.d, "m")
        assert m["generation"] == 1 and m["pending"] == 3, m
        self.release("warm")
        m = ready(self.d, "m", 3, os.path.getsize(self.m) if size else None)
        assert "error" not in m, m
        self.could_tell()
        return m

    def barrier(self):
        """A reload of n, through the one work queue thread: once it is
        ready, every job queued before its load has run."""
        self.n_generation += 1
        self.replace(self.n, lambda p: mkmodel(p, seed=self.n_generation, **SMALL))
        ready(self.d, "n", self.n_generation, os.path.getsize(self.n))


@pytest.mark.parametrize("timing", ["before", "after"])
def test_a_pending_generation_touched_is_dropped_and_reloaded_alike(start, tmp_path, shim,
                                                                    timing):
    s = Models(start, tmp_path, shim)
    d = s.d
    s.touched_pending(timing)
    wait_dropped(d)
    # One line for it (the one above); before, in the first timing, the
    # sync job's "PATH changed before its directory was watched" too.
    assert "before its directory was watched" not in d.read_log(), d.read_log()

    # The drop reloads m (after the settle time, before n's next reload):
    # generation 3 is the touched file, the newest on disk, loaded once.
    # Before, in the second timing, nothing reloaded it: generation 1,
    # older than the file on disk, kept serving.
    s.barrier()
    m = entry(d, "m")
    assert m["generation"] == 1 and m["pending"] == 3, m
    assert sorted(g["number"] for g in m["generations"]) in ([1, 3], [1, 2, 3]), m
    reloads = [line for line in d.read_log().splitlines()
               if 'model "m": files changed on disk, reloading' in line]
    assert len(reloads) == 2, d.read_log()  # the rename's and the touch's

    # Once the warm-ups may go on, generation 3 serves the touched file;
    # generation 2 closes; nothing more is loaded.
    s.release("warm")
    m = ready(d, "m", 3, os.path.getsize(s.m))
    assert "error" not in m, m
    wait_until(lambda: 2 not in [g["number"] for g in entry(d, "m")["generations"]],
               timeout=60, what="generation 2 to close")
    r = d.attach("m", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["generation"] == 3
    s.barrier()
    m = entry(d, "m")
    assert m["generation"] == 3 and m["pending"] == 0, m
    s.could_tell()


def test_a_pending_generation_written_in_place_is_reloaded_at_its_writers_close(
        start, tmp_path, shim):
    """A write, unlike a touch, may go on: the pending generation it
    changed is dropped at once, and the file loaded again only once its
    writer closes it (IN_CLOSE_WRITE), never while the write is open."""
    s = Models(start, tmp_path, shim)
    d = s.d
    fd = s.written_pending()
    try:
        s.barrier()  # a reload of m would have been queued before this one
        m = entry(d, "m")
        assert m["generation"] == 1 and m["pending"] == 0, m
    finally:
        os.close(fd)
    s.reloaded_once()
    assert "before its directory was watched" not in d.read_log(), d.read_log()


def test_a_pending_generation_chmod_then_written_is_reloaded_at_its_writers_close(
        start, tmp_path, shim):
    """A writer that opens the file, changes its mode (fchmod: an
    IN_ATTRIB alone) and then writes: the drop must not reload the file
    while the write is open, else that generation could serve and then be
    written, leaving nothing new clients may attach (review rev188 F1)."""
    s = Models(start, tmp_path, shim)
    d = s.d
    s.pending_watched()
    fd = os.open(s.m, os.O_WRONLY | os.O_CLOEXEC)  # no event yet
    try:
        os.fchmod(fd, 0o644)
        wait_dropped(d)
        s.barrier()  # a reload of m would have been queued before this one
        m = entry(d, "m")
        assert m["generation"] == 1 and m["pending"] == 0, m
        s.release("warm")
        s.barrier()
        m = entry(d, "m")
        assert m["generation"] == 1 and m["pending"] == 0, m
        os.pwrite(fd, b"\x01\x02", 1 << 20)  # inside the tensors' data
    finally:
        os.close(fd)
    s.written_serves()
    s.could_tell()


@pytest.mark.parametrize("how", ["touch -c -m", "truncate"])
def test_a_pending_generation_changed_without_a_writer_is_reloaded(start, tmp_path, shim,
                                                                   how):
    """A change of mtime alone (utimensat by path) and a truncate(2) by
    path come as IN_MODIFY with no open and so no close: no writer has
    the file open, so the drop reloads it (review rev188 F2)."""
    s = Models(start, tmp_path, shim)
    d = s.d
    s.pending_watched()
    if how == "truncate":
        os.truncate(s.m, os.path.getsize(s.m))
    else:
        subprocess.run(["touch", "-c", "-m", s.m], check=True)
    wait_dropped(d)
    s.reloaded_once()


def test_a_directory_models_other_file_written_does_not_hold_the_reload(
        start, tmp_path, shim):
    """A directory model: its pending generation's file chmod'ed while
    another file in the directory (a log, not loaded) is written in the
    same wakeup and kept open. Whether to reload is decided by the
    generation's own files, not by the directory's events together
    (review rev188 F3)."""
    (tmp_path / "m").mkdir()
    log = open(tmp_path / "m" / "notes.log", "a")  # before the daemon: no event
    try:
        s = Models(start, tmp_path, shim, directory=True)
        d = s.d
        s.pending_watched()
        os.kill(d.proc.pid, signal.SIGSTOP)  # both events in one read
        try:
            # Readable by all still: m/ is root's (0777) and the file
            # wcached's user's, which a tree's owner who may not read it
            # does not lend (registry_load.c's linked_in, review rev195 M2).
            os.chmod(s.m, 0o444)
            log.write("x")
            log.flush()
        finally:
            os.kill(d.proc.pid, signal.SIGCONT)
        wait_dropped(d)
        s.reloaded_once(size=False)
    finally:
        log.close()


def unprivileged_user():
    """wcached's user for a test that needs it unprivileged, without
    capabilities: WCACHE_TEST_USER's, else OWN_USER; a skip saying why
    where this process cannot run it so."""
    if os.geteuid() != 0:
        pytest.skip("needs root: to run wcached as another user without capabilities "
                    "(setpriv) and to give the models' files to a third user")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is missing: wcached cannot be run unprivileged")
    return DAEMON_USER or OWN_USER


def cannot_tell(d):
    """Waits for README's line for m, whose lease wcached (not its owner, no
    CAP_LEASE) was refused; asserts it is m's only such line (n, the
    barrier, has its own)."""
    d.wait_for_log(rf'model "m": {CANNOT_TELL} \(fcntl F_SETLEASE: Permission denied: it '
                   r'needs wcached to own them or CAP_LEASE\): a watched reload loads them '
                   r'whether they are or not')
    assert d.read_log().count(f'model "m": {CANNOT_TELL}') == 1, d.read_log()


def serving(d, name, generation):
    """name's generation serves, nothing pending."""
    m = entry(d, name)
    assert m["generation"] == generation and m["pending"] == 0, m


def test_another_users_file_written_in_place_is_reloaded_after_the_settle(
        start, tmp_path, shim):
    """wcached unprivileged (the packaged unit without CAP_LEASE: wcache), the
    model's file root's, as models usually are: whether a writer has it
    open, wcached cannot tell (its lease refused, EACCES). It says so once
    and, as before it asked, loads the file after the settle time, writer or
    not (review rev190 W2: it never did); once written and closed, the file
    serves."""
    s = Models(start, tmp_path, shim, user=unprivileged_user(), owner=(0, 0))
    d = s.d
    fd = s.written_pending()
    try:
        s.barrier()  # the drop's reload was queued before this one
        m = entry(d, "m")
        assert m["generation"] == 1 and m["pending"] == 3, m
        cannot_tell(d)
    finally:
        os.close(fd)
    s.release("warm")
    s.written_serves()
    s.barrier()
    serving(d, "m", 3)  # loaded once
    cannot_tell(d)  # and said once


@pytest.mark.parametrize("timing", ["before", "after"])
def test_another_users_file_touched_in_place_is_reloaded_after_the_settle(
        start, tmp_path, shim, timing):
    """The same with the file a third user's and a touch, no writer, before
    or after the sync job compared the generation's paths: wcached cannot
    tell that no one writes it and loads the touched file after the settle
    time, which serves (review rev190 W2: generation 1 served on, older
    than the file on disk, until the operator's next rename)."""
    s = Models(start, tmp_path, shim, user=unprivileged_user(), owner=OTHER_USER)
    d = s.d
    s.touched_pending(timing)
    wait_dropped(d)
    s.barrier()
    m = entry(d, "m")
    assert m["generation"] == 1 and m["pending"] == 3, m
    cannot_tell(d)
    s.release("warm")
    m = ready(d, "m", 3, os.path.getsize(s.m))
    assert "error" not in m, m
    cannot_tell(d)
