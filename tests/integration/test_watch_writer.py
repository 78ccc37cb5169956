"""A watched reload never loads a file while someone has it open for
writing, whatever event led to it (reviews rev190 W1, rev192 W1'): the
reload's own load job asks, on the descriptors it just opened
(registry_load.c's find_writer), and a file still open for writing makes
no generation; the close of its writer reloads the model again.

Before, the question was asked at the drop of the pending generation, and
again at the reload on descriptors kept of it (watch.c), which a close of
another descriptor, or a name event of any other file of a directory model
(a log or lock file created, appended or removed), skipped or forgot: the
file still being written was loaded, its next write marked the new
generation modified in place, and nothing could attach it.

Uses test_watch_pending's gate and barrier (wcached as root: CAP_LEASE;
as WCACHE_TEST_USER the models' files are its own)."""
import os

import pytest

from test_watch_pending import Models, serving, wait_dropped
from test_watch_pending import shim, start  # noqa: F401 (fixtures)

OPEN_FOR_WRITING = "is open for writing: not loaded while it is"


def writer_waited_for(s):
    """After n's next reload, m's generation 1 serves, nothing pending."""
    s.barrier()
    serving(s.d, "m", 1)


def written_serves(s):
    """The written file serves once its writer closed it, and a reload said
    why it loaded nothing before."""
    s.written_serves()
    s.could_tell()
    assert OPEN_FOR_WRITING in s.d.read_log(), s.d.read_log()


def test_a_second_descriptors_close_does_not_load_what_the_first_writes(
        start, tmp_path, shim):  # noqa: F811 (fixtures)
    """Two descriptors open for writing (two writers, or one writer with two,
    or a parallel chunk writer): the first close reloads the model, and
    that reload loads nothing while the other is open; the last close
    loads the written file, which serves and attaches."""
    s = Models(start, tmp_path, shim)
    d = s.d
    s.pending_watched()
    fd1 = os.open(s.m, os.O_WRONLY | os.O_CLOEXEC)
    fd2 = os.open(s.m, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.pwrite(fd1, b"\x01\x02", 1 << 20)
        wait_dropped(d)
        writer_waited_for(s)
        os.close(fd2)
        fd2 = -1
        writer_waited_for(s)
        s.release("warm")
        os.pwrite(fd1, b"\x05\x06", (1 << 20) + 64)
    finally:
        if fd2 >= 0:
            os.close(fd2)
        os.close(fd1)
    written_serves(s)


def writer_open_then(s, other):
    """m a directory model: its pending generation's file written and kept
    open, then other() (another file's event); nothing is loaded while the
    writer is open, and its close loads the written file."""
    d = s.d
    s.pending_watched()
    fd = os.open(s.m, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.pwrite(fd, b"\x01\x02", 1 << 20)
        wait_dropped(d)
        writer_waited_for(s)
        other()
        writer_waited_for(s)
        s.release("warm")
    finally:
        os.close(fd)
    written_serves(s)


@pytest.mark.parametrize("existing", [False, True])
def test_a_log_appended_beside_a_file_being_written(
        start, tmp_path, shim, existing):  # noqa: F811 (fixtures)
    """`>> notes.log`: made by it (an IN_CREATE and an IN_CLOSE_WRITE of the
    directory), or there before (an IN_CLOSE_WRITE alone)."""
    if existing:
        (tmp_path / "m").mkdir()
        (tmp_path / "m" / "notes.log").write_text("start\n")
    s = Models(start, tmp_path, shim, directory=True)

    def log():
        with open(tmp_path / "m" / "notes.log", "a") as f:
            f.write("x\n")
    writer_open_then(s, log)


def test_a_lock_file_made_beside_a_file_being_written(
        start, tmp_path, shim):  # noqa: F811 (fixtures)
    """A downloader's lock, an editor's swap file: an IN_CREATE."""
    s = Models(start, tmp_path, shim, directory=True)
    writer_open_then(s, lambda: os.close(os.open(tmp_path / "m" / ".lock",
                                                 os.O_RDONLY | os.O_CREAT, 0o644)))


def test_a_file_removed_beside_a_file_being_written(
        start, tmp_path, shim):  # noqa: F811 (fixtures)
    """A log rotated away: an IN_DELETE."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "old.log").write_text("start\n")
    s = Models(start, tmp_path, shim, directory=True)
    writer_open_then(s, lambda: os.unlink(tmp_path / "m" / "old.log"))
