"""What wcached logs where its walk of a model's paths refuses a
neighbour's FUSE mount (daemon/mountrule.h): the poll's and a warm
restart's check's line names the model, the path, the name on the mount,
the mount (its device and the uid that mounted it) and why, as the load's
own refusal does; before, the poll said only "Invalid cross-device link"
and the restart "was replaced or changed since it was stored".

The layout is test_load_neighbour_paths' (a team directory model, 2775,
bob a member; bob's relative link `<shard> -> bob-evil` renamed over a
shard, bob-evil his file with his FUSE server on it, which answers INIT
and nothing else); the tests skip, saying why, without root or /dev/fuse.
"""
import os
import re

from conftest import Daemon
from test_load_neighbour_mounts import error_of, team_model
from test_load_neighbour_paths import HangFS, stuck_or
from test_watch_pending import ready
from test_watch_writer_neighbours import BOB, neighbours_file


def refusal(path, name):
    """The walk's line for path, refused at name on bob's FUSE mount."""
    return (re.escape(f"{path}: {name} lies on fuse (device ") + r"\d+:\d+" +
            re.escape(f") mounted by uid {BOB[0]}: wcached walks into no user's FUSE mount "
                      "(a neighbour's server may never answer)"))


def link_over(mdir, shard):
    """Bob renames his link `shard -> bob-evil` over the shard."""
    link = mdir / ".bob-link"
    os.symlink("bob-evil", link)
    os.lchown(link, *BOB)
    os.rename(link, mdir / shard)


def test_a_polled_models_refused_path_is_logged_with_the_mount_and_why(tmp_path):
    """m polled (watch = poll): once bob's link leads a shard's path onto
    his FUSE file, each poll's walk refuses it, and the poll's line says
    where and why, once."""
    mdir, shards = team_model(tmp_path)
    neighbours_file(mdir / "bob-evil", b"x")
    d = Daemon(tmp_path, {"m": (str(mdir), {"watch": "poll", "poll_interval": "0.2"})}).start()
    try:
        ready(d, "m", 1)
        with HangFS(mdir / "bob-evil", *BOB, directory=False):
            link_over(mdir, shards[0][0])
            _, line = d.wait_for_log(r'model "m": polling refused: ' +
                                     refusal(mdir / shards[0][0], "bob-evil") +
                                     "; nothing is concluded until a poll works again",
                                     timeout=60)
            assert not stuck_or(d, lambda: False, timeout=1), d.read_log()[-3000:]
            log = d.read_log()
        assert "Invalid cross-device link" not in log, log[-3000:]
        assert log.count('model "m": polling refused:') == 1, log[-3000:]
    finally:
        assert d.stop() == 0, d.read_log()[-3000:]


def test_a_warm_restarts_refused_file_is_logged_with_the_mount_and_why(tmp_path):
    """Bob's link over a shard made while wcached restarts warm: the check
    of generation 1's files by path refuses the shard's, generation 1
    serves on (its stored files are intact), and the line that says its
    path leads elsewhere now names the mount and why."""
    from test_warm_restart import start, start_stored_model
    from fakemanager import FakeManager
    mdir, shards = team_model(tmp_path)
    neighbours_file(mdir / "bob-evil", b"x")
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    d = Daemon(tmp_path, {"m": str(mdir)})
    try:
        start_stored_model(d, mgr)
        assert d.stop() == 0, d.read_log()
        with HangFS(mdir / "bob-evil", *BOB, directory=False):
            link_over(mdir, shards[0][0])
            fds, names = mgr.listen_fds()
            start(d, mgr, fds, names)
            d.wait_for_log(r'model "m": generation 1 serves, but its path leads to other '
                           r'files now \(' + refusal(mdir / shards[0][0], "bob-evil") +
                           r"\)", timeout=60)
            stuck = stuck_or(d, lambda: error_of(d, "m"), timeout=30)
            log = d.read_log()[-3000:]
        assert not stuck, ("the warm restart waits on bob's server", stuck, log)
    finally:
        status_code = d.stop()
        mgr.close()
    assert status_code == 0, d.read_log()[-3000:]
