"""A model whose files keep changing is reloaded less and less often
(watch.h's backoff), and a dropped pending generation is not loaded while
a writer that opened it during the settle time has it open.

Before, every change reloaded after the settle time (100 ms), for ever:
coreutils `touch` in a loop on a served file reloaded it (open, validate,
holes walk) at each touch, a chmod loop on a pending generation dropped and
reloaded it at each chmod, each with its "files changed on disk, reloading"
line (review rev188 F4). Now, past 5 watched reloads in 10 s, each further
one waits 200 ms after the one before, twice as long each time, up to 30 s,
one info line says so, and the "reloading" line is logged once a minute
(the others at debug level); the last change still reloads.

What is asserted is counted (reloads asked for, lines, generations), never
timed: each change is made once the reload of the one before was asked for,
so none merges into another. The gate shim and the barrier are
test_watch_pending's (its docstring says how they work); the shim here
holds, besides, the daemon just after a writer check's lease is given back
(GATE/lease), so that a writer opens the file between that check and the
reload it lets through, with certainty."""
import json
import os
import re
import subprocess
import time

import pytest

from conftest import Daemon, mkmodel, wait_until
from test_warm_restart import shard_files
from test_watch_pending import (BIG, DAEMON_USER, GATE_SHIM, SMALL, Models, build_shim, entry,
                                ready, start, wait_dropped)

__all__ = ["start"]  # the fixture, used by name

# test_watch_pending's shim, and a hold once a read lease of the gated file
# is given back (watch.c's open_for_writing found no writer).
LEASE_SHIM = GATE_SHIM + r"""
#include <stdarg.h>
#include <stdint.h>

static int
after_lease(int fd, int cmd, void *arg, int r)
{
	if (r == 0 && cmd == F_SETLEASE && (int)(intptr_t)arg == F_UNLCK)
		hold(fd, "lease");
	return r;
}

/* fcntl, and fcntl64 (where _FILE_OFFSET_BITS=64 sends the calls). */
#define AFTER_LEASE(fn)                                                        \
	int                                                                    \
	fn(int fd, int cmd, ...)                                               \
	{                                                                      \
		va_list ap;                                                    \
		void *arg;                                                     \
									       \
		va_start(ap, cmd);                                             \
		arg = va_arg(ap, void *);                                      \
		va_end(ap);                                                    \
		return after_lease(fd, cmd, arg, NEXT(fn)(fd, cmd, arg));      \
	}
AFTER_LEASE(fcntl)
AFTER_LEASE(fcntl64)
"""

RELOADING = 'model "m": files changed on disk, reloading'
# watch.c's debug line once a watched reload is answered: the backoff
# counts it then, by what it did.
ANSWERED = 'model "m": watched reload: '
BACKOFF = re.compile(r'model "m": (\d+) reloads in [0-9.]+ s, its files keep changing: '
                     r'backing off, the next reload waits (\d+) ms after this one')
# WATCH_QUIET_MS: the quiet that ends a backoff.
QUIET_S = 10
# Enough changes for the backoff to begin on any machine: it needs 6
# reloads within 10 s, and a slow one may make fewer in a first window.
MAX_CHANGES = 60


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    return build_shim(tmp_path_factory, LEASE_SHIM)


def reloads(d):
    """The lines of m's watched reloads asked for: (info, debug)."""
    lines = [line for line in d.read_log().splitlines() if RELOADING in line]
    debug = [line for line in lines if "debug: " in line]
    return [line for line in lines if "debug: " not in line], debug


def asked(d):
    return sum(len(kind) for kind in reloads(d))


def answered(d):
    return d.read_log().count(ANSWERED)


def change_until_backed_off(d, change, lines=1):
    """change(i) for i = 1, 2, ..., each once the reload of the change
    before was answered (the backoff counts it then), until the backoff
    line is logged (the lines-th time); returns the number of changes."""
    for i in range(1, MAX_CHANGES + 1):
        before, ended = asked(d), answered(d)
        change(i)
        wait_until(lambda: asked(d) > before, timeout=60, what=f"the reload of change {i}")
        wait_until(lambda: answered(d) > ended, timeout=60,
                   what=f"the answer to the reload of change {i}")
        assert asked(d) == before + 1, d.read_log()  # one change, one reload
        if len(BACKOFF.findall(d.read_log())) >= lines:
            return i
    raise AssertionError("no backoff after %d reloads:\n%s" % (MAX_CHANGES, d.read_log()))


def assert_backed_off(d, lines=1):
    """lines backoff lines, each at the reload past the 5th in a window;
    its delay twice the settle time."""
    found = BACKOFF.findall(d.read_log())
    assert len(found) == lines, d.read_log()
    assert all(int(n) == 6 and delay == "200" for n, delay in found), found


def test_a_touch_loop_on_a_served_file_backs_off_and_the_last_change_still_loads(
        start, tmp_path, shim):
    s = Models(start, tmp_path, shim)
    d = s.d
    changes = change_until_backed_off(d, lambda i: subprocess.run(["touch", s.m], check=True))
    assert_backed_off(d)
    info, debug = reloads(d)
    assert len(info) == changes and not debug, d.read_log()

    # Backed off, each reload still comes (later); its line once a minute,
    # the others at debug level. Before, a line each.
    for i in range(4):
        before = asked(d)
        subprocess.run(["touch", s.m], check=True)
        wait_until(lambda: asked(d) > before, timeout=60, what=f"backed-off reload {i}")
    info, debug = reloads(d)
    assert len(info) + len(debug) == changes + 4, d.read_log()
    assert debug, d.read_log()
    assert all("not logged since the last" in line for line in info[changes:]), info

    # A real change in the middle of more touches is loaded: backoff makes
    # it later, never lost.
    for _ in range(5):
        subprocess.run(["touch", s.m], check=True)
    s.replace(s.m, lambda p: mkmodel(p, seed=3, **BIG))
    m = ready(d, "m", 2, os.path.getsize(s.m))
    assert "error" not in m, m
    r = d.attach("m", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["generation"] == 2
    assert len(BACKOFF.findall(d.read_log())) == 1, d.read_log()


def test_a_chmod_loop_on_a_pending_generation_backs_off_and_the_last_one_serves(
        start, tmp_path, shim):
    """Each chmod drops the pending generation (one error line) and its
    reload makes the next; past the burst they back off, and once the
    chmods stop the newest generation serves."""
    s = Models(start, tmp_path, shim)
    d = s.d
    s.pending_watched()  # generation 2 pending, its warm-up held
    before = asked(d)

    def chmod(i):
        os.chmod(s.m, 0o600 if i % 2 else 0o644)
        # Its generation was made (opened) before the next chmod.
        wait_until(lambda: entry(d, "m")["pending"] == 2 + i, timeout=60,
                   what=f"generation {2 + i} pending")

    changes = change_until_backed_off(d, chmod)
    assert asked(d) == before + changes
    assert_backed_off(d)
    # Each dropped generation's warm-up holds a warm thread in the gate:
    # no barrier (n's warm-up would wait behind them) until they go.
    s.release("warm")
    m = ready(d, "m", 2 + changes, os.path.getsize(s.m))
    assert "error" not in m, m
    s.barrier()
    assert asked(d) == before + changes, d.read_log()
    assert entry(d, "m")["generation"] == 2 + changes


def test_a_writer_opened_in_the_settle_time_holds_the_reload_until_its_close(
        start, tmp_path, shim):
    """The pending generation's file is chmod'ed with no writer: the drop
    finds none and asks for a reload. A writer opens the file before that
    reload runs (the daemon is held just after its look, GATE/lease): the
    reload's own look at the files it opened finds the writer, and nothing
    is loaded until its close, so the file is not loaded while written.
    Before, it was loaded as generation 3 while the writer had it open."""
    s = Models(start, tmp_path, shim)
    d = s.d
    s.pending_watched()
    s.arm("lease")
    os.chmod(s.m, 0o600)
    s.held("lease")  # the look found no writer: a reload is asked for
    fd = os.open(s.m, os.O_WRONLY | os.O_CLOEXEC)
    try:
        s.release("lease")
        wait_dropped(d)
        s.barrier()  # a reload of m would have been queued before this one
        m = entry(d, "m")
        assert m["generation"] == 1 and m["pending"] == 0, m
        # The reload's own look (registry_load.c's find_writer) finds the
        # writer: nothing is loaded until its close.
        d.wait_for_log(r'is open for writing: not loaded while it is')
        s.release("warm")
        os.pwrite(fd, b"\x01\x02", 1 << 20)  # inside the tensors' data
    finally:
        os.close(fd)
    m = ready(d, "m", 3, os.path.getsize(s.m))  # the written file, at its close
    assert "error" not in m, m
    r = d.attach("m", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["generation"] == 3


def test_the_backoff_ends_once_the_files_are_quiet(start, tmp_path, shim):
    """Once a backed-off model's files are quiet for 10 s, its next change
    reloads as a first one (its line at info level, not limited), and a new
    loop backs off again from 200 ms."""
    s = Models(start, tmp_path, shim)
    d = s.d

    def touch(i):
        subprocess.run(["touch", s.m], check=True)

    change_until_backed_off(d, touch)
    # Not a wait for the daemon: the quiet itself, measured by its clock
    # from the last reload, which was asked for before this.
    time.sleep(QUIET_S + 2)
    before = reloads(d)
    touch(0)
    wait_until(lambda: asked(d) > sum(map(len, before)), timeout=60, what="the next reload")
    info, debug = reloads(d)
    # Still backed off, it would be limited (at debug level, the backoff's
    # first line having been logged).
    assert len(info) == len(before[0]) + 1 and len(debug) == len(before[1]), d.read_log()
    assert "not logged" not in info[-1], info[-1]
    change_until_backed_off(d, touch, lines=2)
    assert_backed_off(d, lines=2)


def test_a_rename_away_and_back_loop_backs_off(start, tmp_path, shim):
    """A rename of the served file away and back brings nothing new (the
    same inode goes and comes back): each reload counts, as a touch's does.
    Before (review rev197 W1), only a writer's close counted: this loop
    reloaded after every settle time, for ever, each with its info line (no
    backoff after 60 reloads)."""
    s = Models(start, tmp_path, shim)
    d = s.d
    away = s.m + ".away"

    def change(i):
        os.rename(s.m, away)
        os.rename(away, s.m)

    changes = change_until_backed_off(d, change)
    assert_backed_off(d)
    assert entry(d, "m")["generation"] == 1  # nothing was ever a swap
    assert changes <= 10, changes


def test_a_lock_dir_loop_in_a_directory_model_backs_off(start, tmp_path, shim):
    """Any entry made and removed in a directory model's directory (a lock
    directory here: no write, no close) reloads the model: each such reload
    counts. Before (review rev197 W1), no backoff after 60 reloads."""
    s = Models(start, tmp_path, shim, directory=True)
    d = s.d
    lock = os.path.join(os.path.dirname(s.m), "lock")

    def change(i):
        os.mkdir(lock)   # IN_CREATE|IN_ISDIR: no close, no write
        os.rmdir(lock)   # IN_DELETE|IN_ISDIR

    change_until_backed_off(d, change)
    assert_backed_off(d)
    assert entry(d, "m")["generation"] == 1


def test_a_series_of_swaps_of_a_directory_model_is_not_backed_off(start, tmp_path, shim):
    """A directory model's new file is written in its directory, then
    renamed over (README's procedure): its writer's close is an event of
    the model's too, yet the reload brings new inodes, a swap, and does not
    count. Before (review rev197 W2), that close counted: ten swaps in a
    row began the backoff."""
    s = Models(start, tmp_path, shim, directory=True)
    d = s.d
    for seed in range(2, 12):
        s.replace(s.m, lambda p, seed=seed: mkmodel(p, seed=seed, **SMALL))
        ready(d, "m", seed)
    assert not BACKOFF.findall(d.read_log()), d.read_log()


def own(path):
    """Gives path to wcached's user, where the tests run it as another."""
    if DAEMON_USER is not None:
        os.chown(path, *DAEMON_USER)


def write_file(path, data):
    """data written into path (open, write, close: its IN_CLOSE_WRITE),
    given to wcached's user."""
    with open(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    own(str(path))


class ShardedModel:
    """m, a directory model of shards and their index (m/), and n, a
    one-file model in n/ whose swaps are the barrier: n's reload is asked
    after the events that came before its own, and so after any reload of
    m they asked for; once n's new generation is ready, m's reloading lines
    for those events are in the log."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.dir = tmp_path / "m"
        for sub in ("m", "n"):
            (tmp_path / sub).mkdir()
            os.chmod(tmp_path / sub, 0o755)
        os.chmod(tmp_path, 0o755)
        shards, index = shard_files(tmp_path, 1, 2)
        for name, data in shards:
            write_file(self.dir / name, data)
        write_file(self.dir / "model.safetensors.index.json", index)
        self.n = str(tmp_path / "n" / "n.safetensors")
        self.n_generation = 1
        write_file(self.n, open(mkmodel(tmp_path / "n1.safetensors", seed=1, **SMALL),
                                "rb").read())
        self.d = Daemon(tmp_path, {"m": str(self.dir), "n": self.n}).start()
        ready(self.d, "m", 1)
        ready(self.d, "n", 1)

    def barrier(self):
        self.n_generation += 1
        tmp = str(self.tmp / "n" / ".n.tmp")
        mkmodel(tmp, seed=self.n_generation, **SMALL)
        own(tmp)
        os.rename(tmp, self.n)
        ready(self.d, "n", self.n_generation, os.path.getsize(self.n))

    def index(self, text):
        """The index renamed over, written beside it first."""
        tmp = self.dir / ".index.tmp"
        write_file(tmp, text)
        os.rename(tmp, self.dir / "model.safetensors.index.json")

    def reloads(self):
        return self.d.read_log().count(RELOADING)


def test_a_readme_way_update_of_a_sharded_directory_model_reloads_once_its_index_moves(
        tmp_path):
    """A directory model of shards and their index updated the README's
    way: new shards written into its directory under new names, then the
    index renamed over. The shards cannot change what loads (the index
    says which shards do, and names none of them yet): none reloads m; the
    index's rename does, at once, not backed off. Before (review rev200
    M2), each shard's close reloaded m, unchanged and counted, the sixth
    began the backoff, and the index's rename then waited out its delay
    (3 to 4 s measured, up to 30 s)."""
    s = ShardedModel(tmp_path)
    d = s.d
    try:
        shards, index = shard_files(tmp_path, 2, 8, layers=8)
        for name, data in shards:
            write_file(s.dir / name, data)
            s.barrier()  # m's reload for that shard, if any, was asked
        assert s.reloads() == 0, d.read_log()
        s.index(index)
        m = ready(d, "m", 2)
        assert "error" not in m, m
        r = d.attach("m", "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["generation"] == 2
        # The index's temporary file's close and its rename: one reload
        # each, or one for both.
        assert 1 <= s.reloads() <= 2, d.read_log()
        assert "backing off" not in d.read_log(), d.read_log()
    finally:
        assert d.stop() == 0, d.read_log()


def test_shards_written_after_the_index_that_names_them_still_load(tmp_path):
    """The other order: the new index renamed over first, naming shards not
    there yet. Its reload fails (generation 1 serves on); then each new
    shard reloads m, as any event does after a failed load, and the last
    one loads generation 2: a shard's name the index names is no name that
    cannot change what loads."""
    s = ShardedModel(tmp_path)
    d = s.d
    try:
        shards, index = shard_files(tmp_path, 2, 3, layers=8)
        s.index(index)
        wait_until(lambda: entry(d, "m").get("error"), timeout=60, what="the failed reload")
        for name, data in shards:
            write_file(s.dir / name, data)
        m = ready(d, "m", 2)
        assert "error" not in m, m
    finally:
        assert d.stop() == 0, d.read_log()


SWAPS_BACKOFF = re.compile(r'model "m": (\d+) swaps in [0-9.]+ s, its files keep being '
                           r'replaced: backing off, the next reload waits (\d+) ms after this one')
# watch.h's WATCH_BURST_SWAPS: swaps in 10 minutes that are not backed off.
BURST_SWAPS = 60


def test_a_loop_of_swaps_backs_off_past_60_and_its_last_swap_still_loads(tmp_path):
    """Two files of the model's owner hard-linked over its path in turn:
    each rename is a swap (other inodes), an update. Up to 60 of them in
    10 minutes each loads at the settle time; past them, the model backs
    off as for changes in a loop: one line says so, the next reloads wait
    longer and longer and their lines are logged once a minute, and the
    last swap still loads. Before (review rev197 W3, rev200 L1), swaps were
    never counted: a loop made a generation, with its five lines and its
    warm-up, every settle time, for as long as it ran."""
    d_ = tmp_path / "d"
    d_.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(d_, 0o755)
    path = str(d_ / "m.safetensors")
    files = [str(d_ / "a.st"), str(d_ / "b.st")]
    for seed, f in enumerate(files, 2):
        mkmodel(f, seed=seed, **SMALL)
        own(f)
    os.link(files[0], path)  # the first swap links files[1]
    d = Daemon(tmp_path, {"m": path}).start()
    link = str(d_ / ".t")

    def swap(i):
        os.link(files[i % 2], link)
        os.rename(link, path)
        ready(d, "m", 1 + i)
    try:
        ready(d, "m", 1)
        for i in range(1, BURST_SWAPS + 1):
            swap(i)
        assert not SWAPS_BACKOFF.findall(d.read_log()), d.read_log()
        swap(BURST_SWAPS + 1)
        assert SWAPS_BACKOFF.findall(d.read_log()) == [(str(BURST_SWAPS + 1), "200")], \
            d.read_log()
        info, debug = reloads(d)
        # Backed off, each swap still loads, later; its reloading line
        # once a minute (the backoff's own line was its minute's), the
        # others at debug level.
        for i in range(BURST_SWAPS + 2, BURST_SWAPS + 5):
            swap(i)
        after = reloads(d)
        assert len(after[0]) + len(after[1]) == len(info) + len(debug) + 3, d.read_log()
        assert len(after[1]) > len(debug), d.read_log()
        assert len(SWAPS_BACKOFF.findall(d.read_log())) == 1, d.read_log()
        r = d.attach("m", "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["generation"] == BURST_SWAPS + 5
    finally:
        assert d.stop() == 0, d.read_log()
