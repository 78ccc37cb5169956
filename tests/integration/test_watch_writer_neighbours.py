"""Which files a failed watched reload asks for a writer (registry_load.c's
path_writer): only files whose owner the reload takes, asked before they
are opened, on the model directory's own filesystem, never across a mount;
for a model whose file can be told (a shard index, a directory holding
one), only the files its load opens (review rev200 H1, M1, L2).

Before, the walk opened every *.safetensors of the model's directory and
only then asked its owner: a neighbour who may add files there (a team's
drop directory, 1777) mounted a FUSE server on a file of his own that never
answers an open, and the open blocked a thread of the work queue's local
share for good: the model's load never ended ("a load of this model is
already in progress"), and eight such stop everyone's work. And the walk's
bound counted the neighbour's files: 4096 of his empty files listed first,
the owner's own file open for writing was never reached, and the reload's
failure was an ERROR and the model's error while her file was only being
written (review rev194 MEDIUM-2 back). The FUSE test mounts with mount(2)
as root, as fusermount would for the file's owner (tests/pyutil/fusehang.py);
it skips, saying why, where it cannot (not root, no /dev/fuse)."""
import os
import sys

import pytest

from conftest import Daemon, wait_until
from ctlutil import ctl
from test_watch_pending import DAEMON_USER, entry, ready
from test_warm_restart import shard_files
from test_watch_writer import OPEN_FOR_WRITING

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from fusehang import FuseHang, blocked_in_fuse, neighbours_place  # noqa: E402

# A neighbour: neither wcached's user nor the models' owner.
BOB = (64112, 64100)


def own(path):
    """Gives path to the models' owner (wcached's user under
    WCACHE_TEST_USER, else root)."""
    if DAEMON_USER is not None:
        os.chown(path, *DAEMON_USER)


def write_index_model(tmp_path, model_dir, v=1):
    """Version v of a model of two shards and its index in model_dir, all
    the owner's; the index's path."""
    shards, text = shard_files(tmp_path, v)
    for fname, data in shards:
        with open(model_dir / fname, "wb") as f:
            f.write(data)
        own(str(model_dir / fname))
    index = model_dir / "model.safetensors.index.json"
    index.write_text(text)
    own(str(index))
    return index


def neighbours_file(path, data=b""):
    """A file of bob's at path."""
    with open(path, "wb") as f:
        f.write(data)
    os.chown(path, *BOB)


def test_a_neighbours_fuse_mount_beside_a_directory_model_is_never_opened(tmp_path):
    """A directory model m/ in a directory others may add files to (1777).
    Bob adds zzz.safetensors, his, a FUSE mount whose server never answers
    an open, then a second shard index, which fails m's watched reload ("2
    shard indexes"). wcached asks for the reload's writers without opening
    bob's file: no thread waits on his server, the failure is the model's
    error, and once bob takes his index back m reloads."""
    model_dir = neighbours_place(tmp_path, "m")
    write_index_model(tmp_path, model_dir)
    os.chmod(model_dir, 0o1777)
    d = Daemon(tmp_path, {"m": str(model_dir)}).start()
    bob = model_dir / "zzz.safetensors"
    neighbours_file(bob)
    try:
        with FuseHang(bob, *BOB):
            ready(d, "m", 1)
            idx = model_dir / "zzz.safetensors.index.json"
            neighbours_file(idx, b"{}")
            d.wait_for_log(r'model "m": .*2 shard indexes')
            m = wait_until(lambda: (lambda e: e if e.get("error") else None)(entry(d, "m")),
                           timeout=60, what="m's error in status")
            assert "2 shard indexes" in m["error"], m
            assert "waiting_for_writer" not in m, m
            stuck = blocked_in_fuse(d.proc.pid)
            assert not stuck, ("wcached threads wait on bob's FUSE server", stuck)
            idx.unlink()  # bob takes his index back: m is fine again
            wait_until(lambda: "error" not in entry(d, "m"), timeout=60,
                       what="m's error gone once bob's index is")
            r = ctl(d, "reload", "m")
            assert r.returncode == 0, r.stdout + r.stderr
            assert not blocked_in_fuse(d.proc.pid)
    finally:
        assert d.stop() == 0, d.read_log()


def readdir_position(directory, name):
    """name's place among the model files of directory, in the order
    readdir(3) gives them."""
    names = [n for n in os.listdir(directory) if n.endswith((".safetensors",
                                                              ".safetensors.index.json"))]
    return names.index(name)


def test_the_owners_writer_is_found_past_thousands_of_a_neighbours_files(tmp_path):
    """A directory model m/ (1777) holds, before its index in readdir's
    order, 6000 empty *.safetensors of bob's. Its owner has its index open
    for writing when bob adds a second index: the reload fails ("2 shard
    indexes") while her file is written, which is a wait for its writer,
    not an error. Bob's files are not asked (not hers), and count toward
    no bound of what is asked: her index is reached."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give files to a neighbour")
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    os.chmod(tmp_path, 0o755)
    write_index_model(tmp_path, model_dir)
    for i in range(6000):
        neighbours_file(model_dir / f"bob-{i:05d}.safetensors")
    # Her index renamed (any name ending .safetensors.index.json is a
    # directory model's index) until readdir lists it past 4200 of bob's.
    name = "model.safetensors.index.json"
    for k in range(200):
        if readdir_position(model_dir, name) > 4200:
            break
        new = f"model-{k}.safetensors.index.json"
        os.rename(model_dir / name, model_dir / new)
        name = new
    assert readdir_position(model_dir, name) > 4200, "readdir never listed it late"
    index = model_dir / name
    os.chmod(model_dir, 0o1777)
    d = Daemon(tmp_path, {"m": str(model_dir)}).start()
    try:
        ready(d, "m", 1)
        fd = os.open(index, os.O_RDWR | os.O_CLOEXEC)  # her writer, not closed yet
        try:
            neighbours_file(model_dir / "zzz.safetensors.index.json", b"{}")
            d.wait_for_log(r'model "m": %s %s' % (index, OPEN_FOR_WRITING))
            m = entry(d, "m")
            assert m.get("waiting_for_writer") == str(index), m
            assert "error" not in m, m
            log = d.read_log()
            line = [x for x in log.splitlines() if OPEN_FOR_WRITING in x][-1]
            # The load's own failure is in the line too.
            assert "2 shard indexes" in line, line
            assert 'error: model "m"' not in log, log[-3000:]
        finally:
            os.close(fd)
    finally:
        assert d.stop() == 0, d.read_log()
