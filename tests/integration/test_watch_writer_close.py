"""A watched reload refused for a writer ("PATH is open for writing: not
loaded while it is") loads the files once no writer is left, whatever
directory the file is in and whether the model is watched or polled; and a
file not valid only because it is still being written is such a refusal,
not an error (reviews rev194 MEDIUM-1, MEDIUM-2, LOW-6; rev196).

Before, the reload after a writer relied on the writer's close reaching
inotify in a watched directory under a name of the model. It never came
for a file behind a link in its own directory (`m.safetensors ->
m-v2.safetensors`: the close names m-v2.safetensors), for a directory
swapped in by a link (`m -> v2`: v2 is not watched before a generation of
it loads), nor for a polled model (a close changes nothing a poll sees):
generation 1 served for ever, newer files on disk, no error in status, and
the line named the link, not the file open for writing. And the writer
check came after validation: a pending file rewritten from its start (cp,
save_file, torch.save: O_TRUNC) failed validation while it was written,
with an ERROR line and the model's error set.

Now wcached keeps a descriptor of the file it found open for writing and
asks it again every 500 ms (watch.h's WATCH_WRITER_MS, a read lease given
back at once), reloading the model once no writer is left; status shows
the wait (waiting_for_writer). Run as root (CAP_LEASE) and, in ctest's
integration_unprivileged, as WCACHE_TEST_USER, the models' files then its
own (a lease needs the file's owner or CAP_LEASE)."""
import json
import os
import time

from conftest import Daemon, mkmodel, wait_until
from ctlutil import ctl
from test_watch_pending import BIG, DAEMON_USER, SMALL, Models, build_shim, entry, ready
from test_watch_pending import wait_dropped
from test_watch_pending import shim, start  # noqa: F401 (fixtures)
from test_warm_restart import shard_files
from test_watch_writer import OPEN_FOR_WRITING, written_serves
from test_watch_writer_neighbours import write_index_model


def own(path):
    """Gives path to wcached's user (WCACHE_TEST_USER), whose lease on it
    needs no capability."""
    if DAEMON_USER is not None:
        os.chown(path, *DAEMON_USER)


def writer_line(d, path):
    """The refusal's line names path, the file open for writing."""
    return d.wait_for_log(r'model "m": %s %s' % (path, OPEN_FOR_WRITING))


def waits_for(d, path):
    """Status and `wcachectl status` show that m waits for path's writer."""
    m = wait_until(lambda: (lambda e: e if e.get("waiting_for_writer") else None)(
        entry(d, "m")), timeout=60, what="m waiting for a writer in status")
    assert m["waiting_for_writer"] == path, m
    assert m["generation"] == 1 and "error" not in m, m
    r = ctl(d, "status", "m")
    assert "updates waiting for a writer:" in r.stdout, r.stdout
    assert "m: %s is open for writing" % path in r.stdout, r.stdout


def loads_after_close(d, size):
    """Generation 2 (size bytes) serves without an error once the writer
    closed, and status no longer shows a wait."""
    try:
        m = ready(d, "m", 2, size)
    except Exception as e:
        raise AssertionError("the writer's close reloaded nothing (%s):\n%s"
                             % (e, d.read_log())) from e
    assert "error" not in m and "waiting_for_writer" not in m, m


def swapped_in_while_written(tmp_path, link, first, v1, v2, target):
    """m configured as link (to first), serving v1 (its model file); v2 (a
    model file) made complete, kept open for writing, and the link swapped
    to target by a rename (`ln -s ... .next && mv -T .next
    LINK`): the writer's line names v2 and status shows the wait; once the
    writer closed, v2 serves."""
    own(v1)
    os.symlink(first, link)
    d = Daemon(tmp_path, {"m": link}).start()
    try:
        ready(d, "m", 1, os.path.getsize(v1))
        mkmodel(v2, seed=2, layers=3, hidden=64, ffn=128, vocab=100)
        own(v2)
        fd = os.open(v2, os.O_RDWR | os.O_CLOEXEC)  # the writer, still open
        try:
            tmp = os.path.join(os.path.dirname(link), ".next")
            os.symlink(target, tmp)
            os.rename(tmp, link)
            writer_line(d, v2)
            waits_for(d, v2)
        finally:
            os.close(fd)
        loads_after_close(d, os.path.getsize(v2))
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_linked_file_written_then_swapped_in_loads_at_its_writers_close(tmp_path):
    """m configured as m.safetensors, a link to m-v1.safetensors in its own
    (watched) directory; m-v2.safetensors written complete but kept open
    for writing, the link swapped to it. The close's IN_CLOSE_WRITE names
    m-v2.safetensors, no name of m."""
    d_ = tmp_path / "d"
    d_.mkdir()
    os.chmod(d_, 0o755)
    v1 = mkmodel(str(d_ / "m-v1.safetensors"), seed=1, **SMALL)
    swapped_in_while_written(tmp_path, str(d_ / "m.safetensors"), "m-v1.safetensors", v1,
                             str(d_ / "m-v2.safetensors"), "m-v2.safetensors")


def test_a_directory_written_then_swapped_in_loads_at_its_writers_close(tmp_path):
    """m configured as d/m, a link to v1; v2 made complete beside it, its
    file still open for writing, the link swapped to v2. The close is an
    event of v2, a directory wcached does not watch before a generation of
    it loads."""
    d_ = tmp_path / "d"
    for sub in ("", "v1", "v2"):
        (d_ / sub).mkdir(exist_ok=True)
        os.chmod(d_ / sub, 0o755)
    v1 = mkmodel(str(d_ / "v1" / "model.safetensors"), seed=1, **SMALL)
    swapped_in_while_written(tmp_path, str(d_ / "m"), "v1", v1,
                             str(d_ / "v2" / "model.safetensors"), "v2")


# inotify_add_watch refused as when fs.inotify.max_user_watches is used up:
# a model with `watch = poll` is then seen by its polls alone.
NO_WATCH_SHIM = r"""
#include <errno.h>
#include <stdint.h>

int
inotify_add_watch(int fd, const char *path, uint32_t mask)
{
	(void)fd;
	(void)path;
	(void)mask;
	errno = ENOSPC;
	return -1;
}
"""


def test_a_polled_file_written_loads_at_its_writers_close(tmp_path, tmp_path_factory):
    """m with `watch = poll`, no inotify watch to be had: m's file replaced
    by a new one (unlink, create) written complete and kept open (an fsync
    of gigabytes, a notebook's unclosed file). Two agreeing polls reload it,
    refused for the writer; the close changes no size or time a poll sees."""
    shim_path = build_shim(tmp_path_factory, NO_WATCH_SHIM)
    d_ = tmp_path / "d"
    d_.mkdir()
    os.chmod(d_, 0o755)
    path = str(d_ / "m.safetensors")
    mkmodel(path, seed=1, **SMALL)
    own(path)
    d = Daemon(tmp_path, {"m": (path, {"watch": "poll", "poll_interval": "0.2"})})
    env = dict(os.environ, LD_PRELOAD=shim_path)
    env["ASAN_OPTIONS"] = ":".join(filter(None, [os.environ.get("ASAN_OPTIONS"),
                                                 "verify_asan_link_order=0"]))
    d.start(env=env)
    try:
        ready(d, "m", 1, os.path.getsize(path))
        d.wait_for_log(r"cannot watch \S+ for model updates")
        new = str(tmp_path / "new.safetensors")
        mkmodel(new, seed=2, layers=3, hidden=64, ffn=128, vocab=100)
        with open(new, "rb") as f:
            data = f.read()
        os.unlink(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            own(path)
            os.write(fd, data)
            writer_line(d, path)
            waits_for(d, path)
        finally:
            os.close(fd)
        loads_after_close(d, len(data))
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_pending_file_rewritten_from_its_start_waits_for_its_writer_quietly(
        start, tmp_path, shim):  # noqa: F811 (fixtures)
    """A pending generation's file rewritten from its start (`cp new
    m.safetensors`, shutil.copyfile, save_file or torch.save onto the path:
    O_TRUNC, then its bytes in order) while its writer has it open: the
    truncate drops the pending generation, and the reload a settle time
    later finds a file short of its header's end: the writer's lines, no
    ERROR line, no error in status (the drop's neither); the close loads
    the file."""
    s = Models(start, tmp_path, shim)
    d = s.d
    new_path = str(tmp_path / "new.bin")
    mkmodel(new_path, seed=3, **BIG)
    with open(new_path, "rb") as f:
        new = f.read()
    os.unlink(new_path)
    half = len(new) // 2
    s.pending_watched()
    fd = os.open(s.m, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    try:
        os.write(fd, new[:half])
        wait_dropped(d)
        # The watched reload of m comes a settle time after the drop: the
        # writer's line, or (before) a failed validation's error.
        d.wait_for_log(r'(error: model "m": |model "m": .*%s)' % OPEN_FOR_WRITING)
        s.barrier()
        time.sleep(1)  # a reload of m already under way has said its word
        log = d.read_log()
        # Neither the drop ("... of generation 2 was modified in place
        # while it warmed, and is still open for writing") nor the reload
        # is an error: its writer is not done (review rev200 L4).
        errors = [line for line in log.splitlines() if 'error: model "m"' in line]
        assert not errors, \
            "a file being written got an ERROR line while its writer has it open:\n" + log
        assert "was modified in place while it warmed, and is still open for writing" in log
        m = entry(d, "m")
        assert "error" not in m, (m.get("error"), log)
        assert m["generation"] == 1 and m["pending"] == 0, m
        assert m["waiting_for_writer"] == s.m, m
        assert 'model "m": %s %s' % (s.m, OPEN_FOR_WRITING) in log, log
        s.release("warm")
        os.write(fd, new[half:])
    finally:
        os.close(fd)
    written_serves(s)


def index_model(tmp_path):
    """m, a model of two shards named by its index, in shards/ (the owner's);
    the shard directory and the index's path."""
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(shard_dir, 0o755)
    return shard_dir, write_index_model(tmp_path, shard_dir)


def rename_in(shard_dir, path, text):
    """text renamed over path, the owner's."""
    tmp = shard_dir / ".index.tmp"
    tmp.write_text(text)
    own(str(tmp))
    os.rename(tmp, path)


def test_an_index_error_is_not_hidden_by_another_models_writer(tmp_path):
    """A sharded model's index replaced by a broken one (a shard it names
    is missing) while other.safetensors beside it, another model of the
    same owner that the index does not name, is held open for writing
    (np.memmap r+, a training job's checkpoint): the failure is the
    index's, an error line and the model's error, not a wait for the other
    file's writer (review rev200 M1)."""
    shard_dir, index = index_model(tmp_path)
    other = mkmodel(str(shard_dir / "other.safetensors"), seed=5, **SMALL)
    own(other)
    fd = os.open(other, os.O_RDWR | os.O_CLOEXEC)  # held, never written
    d = Daemon(tmp_path, {"m": str(index)}).start()
    try:
        ready(d, "m", 1)
        good = json.loads(index.read_text())
        rename_in(shard_dir, index, json.dumps(dict(good, weight_map={
            k: "model-v9-00001-of-00002.safetensors" for k in good["weight_map"]})))
        d.wait_for_log(r'(error: model "m": |model "m": .*%s)' % OPEN_FOR_WRITING)
        m = wait_until(lambda: (lambda e: e if e.get("error") else None)(entry(d, "m")),
                       timeout=60, what="m's error in status")
        assert "model-v9-00001-of-00002.safetensors" in m["error"], m
        assert "waiting_for_writer" not in m, m
        assert OPEN_FOR_WRITING not in d.read_log()
    finally:
        os.close(fd)
        assert d.stop() == 0, d.read_log()


def test_a_shard_the_new_index_names_still_written_is_waited_for(tmp_path):
    """The README's update of a sharded model, with the index renamed in
    while its second new shard is still being written: the reload finds
    that shard short, and it is open for writing: a wait for its writer
    (the line names the shard and says the load's failure), no error; its
    writer's close loads generation 2."""
    shard_dir, index = index_model(tmp_path)
    d = Daemon(tmp_path, {"m": str(index)}).start()
    try:
        ready(d, "m", 1)
        shards, text = shard_files(tmp_path, 2)
        (first, one), (second, two) = sorted(shards)
        with open(shard_dir / first, "wb") as f:
            f.write(one)
        own(str(shard_dir / first))
        written = shard_dir / second
        fd = os.open(written, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            own(str(written))
            os.write(fd, two[:len(two) // 2])
            rename_in(shard_dir, index, text)
            _, line = writer_line(d, str(written))
            assert second in line.partition("(the load failed: ")[2], line
            m = entry(d, "m")
            assert m.get("waiting_for_writer") == str(written) and "error" not in m, m
            os.write(fd, two[len(two) // 2:])
        finally:
            os.close(fd)
        ready(d, "m", 2)
    finally:
        assert d.stop() == 0, d.read_log()
