"""A model's load never opens a file across a neighbour's FUSE mount, nor
walks into one (review rev202 H1; daemon/mountrule.h).

The writer walk of a failed reload was closed against a neighbour's FUSE
mount (test_watch_writer_neighbours), but the load itself still opened one:
shards_find_model took any *.safetensors.index.json of a directory model's
directory, and the opener (tree.c) followed links and crossed mounts inside
the model's tree. A neighbour who may add entries to the directory (a 1777
drop directory, a 2775 team directory) mounted a FUSE server that never
answers an open on a file of his own (allow_other; user_allow_other in
/etc/fuse.conf) and got the load to open it: a thread of the work queue's
local share waited for good, the model's load never ended, and wcached
could not stop. Now a name with a remote mount on it is no model file, and
a model file reached across a mount is opened only where the mount's device
(told without asking its server) is a local filesystem: a shard
bind-mounted from another local filesystem, or a model directory that is a
mount itself, still loads. The FUSE tests mount with mount(2) as root, as
fusermount would for the file's owner (tests/pyutil/fusehang.py); they, and
the bind-mount tests, skip, saying why, where they cannot (not root, no
/dev/fuse)."""
import os
import subprocess
import sys

import pytest

from conftest import Daemon, mkmodel, wait_until
from ctlutil import ctl
from test_watch_pending import entry, ready
from test_watch_backoff import shard_files, write_file
from test_watch_writer_neighbours import BOB, neighbours_file

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from fusehang import FuseHang, blocked_in_fuse, neighbours_place  # noqa: E402


def error_of(d, name):
    """The model's error in status, or None."""
    return entry(d, name).get("error")


def test_a_neighbours_fuse_index_beside_a_one_file_directory_model_hangs_nothing(tmp_path):
    """m/ (1777) holds one model.safetensors (no index: the directory's one
    *.safetensors is the model). Bob adds zz.safetensors.index.json, his (m's
    watched reload fails on it: not a shard index), then mounts a FUSE server
    on it that never answers an open, and makes any entry in m/: the
    reload that follows does not open his index (a remote mount is on the
    name), and loads m's one file; so does the operator's reload."""
    model_dir = neighbours_place(tmp_path, "m")
    mkmodel(str(model_dir / "model.safetensors"))
    os.chmod(model_dir, 0o1777)
    d = Daemon(tmp_path, {"m": str(model_dir)}).start()
    bob = model_dir / "zz.safetensors.index.json"
    try:
        ready(d, "m", 1)
        neighbours_file(bob, b"{}")
        wait_until(lambda: error_of(d, "m"), timeout=60, what="m's error (bob's index)")
        with FuseHang(bob, *BOB):
            neighbours_file(model_dir / "bob.lock", b"x")  # any event reloads m
            wait_until(lambda: error_of(d, "m") is None, timeout=60,
                       what="m reloaded past bob's mounted index")
            assert not blocked_in_fuse(d.proc.pid), d.read_log()[-2000:]
            r = ctl(d, "reload", "m")
            assert r.returncode == 0, r.stdout + r.stderr
            stuck = blocked_in_fuse(d.proc.pid)
            assert not stuck, ("wcached threads wait on bob's FUSE server", stuck,
                               d.read_log()[-2000:])
            assert entry(d, "m")["state"] == "ready"
    finally:
        assert d.stop() == 0, d.read_log()


def team_model(tmp_path):
    """Skips without FUSE; else m/, root's directory model of two shards and
    their index in a team directory (2775, group 64100, bob a member): m/
    and the shards' [(name, bytes)]."""
    mdir = neighbours_place(tmp_path, "m")
    shards, index = shard_files(tmp_path, 1, 2)
    for name, data in shards:
        write_file(mdir / name, data)
    write_file(mdir / "model.safetensors.index.json", index)
    os.chown(mdir, 0, BOB[1])
    os.chmod(mdir, 0o2775)
    return mdir, shards


def test_a_neighbours_link_over_a_shard_in_a_team_directory_hangs_nothing(tmp_path):
    """m/, root's directory model of two shards and their index, in a team
    directory (2775, group 64100, bob a member). Bob renames a relative link
    `<shard> -> bob-evil` over a shard the index names; bob-evil is his file,
    a FUSE mount whose server never answers an open. The watched reload
    does not open the shard across the mount: it fails, naming the mount,
    and m serves its first generation still; the operator's reload fails
    alike, at once; wcached stops."""
    mdir, shards = team_model(tmp_path)
    d = Daemon(tmp_path, {"m": str(mdir)}).start()
    evil = mdir / "bob-evil"
    neighbours_file(evil, b"x")
    try:
        ready(d, "m", 1)
        with FuseHang(evil, *BOB):
            link = mdir / ".bob-link"
            os.symlink("bob-evil", link)
            os.lchown(link, *BOB)
            os.rename(link, mdir / shards[0][0])  # bob may: 2775, not sticky
            err = wait_until(lambda: error_of(d, "m"), timeout=60, what="m's error")
            assert "fuse" in err and shards[0][0] in err, err
            stuck = blocked_in_fuse(d.proc.pid)
            assert not stuck, ("wcached threads wait on bob's FUSE server", stuck,
                               d.read_log()[-2000:])
            r = ctl(d, "reload", "m")
            assert r.returncode != 0 and "fuse" in r.stdout + r.stderr, r
            assert not blocked_in_fuse(d.proc.pid)
            m = entry(d, "m")
            assert m["generation"] == 1, m
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_neighbours_absolute_link_over_a_shard_to_his_fuse_file_hangs_nothing(tmp_path):
    """As above, but bob's link over the shard is absolute, to his file
    outside the model's tree, a FUSE mount whose server answers neither an
    open nor a stat: the link is refused as leaving the tree (as before),
    and the refusal's message looks nothing up past it (before, realpath(3)
    of the link, for the message, asked bob's server and waited for good)."""
    mdir, shards = team_model(tmp_path)
    bobs = tmp_path / "bob"
    bobs.mkdir()
    evil = bobs / "evil"
    neighbours_file(evil, b"x")
    d = Daemon(tmp_path, {"m": str(mdir)}).start()
    try:
        ready(d, "m", 1)
        with FuseHang(evil, *BOB, getattr_too=True):
            link = mdir / ".bob-link"
            os.symlink(str(evil), link)
            os.lchown(link, *BOB)
            os.rename(link, mdir / shards[0][0])
            err = wait_until(lambda: error_of(d, "m"), timeout=60, what="m's error")
            assert "leaves the model's tree" in err and shards[0][0] in err, err
            stuck = blocked_in_fuse(d.proc.pid)
            assert not stuck, ("wcached threads wait on bob's FUSE server", stuck,
                               d.read_log()[-2000:])
            assert entry(d, "m")["generation"] == 1
    finally:
        assert d.stop() == 0, d.read_log()


def mount(*args):
    subprocess.run(["mount", *args], check=True, capture_output=True)


def umount(path):
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def bind_mounted_shards(tmp_path, v, other, mounted):
    """Version v's two shards in tmp_path/m: the first a file there, the
    second a bind mount of a file on other (a tmpfs), added to mounted;
    its index's text."""
    mdir = tmp_path / "m"
    shards, index = shard_files(tmp_path, v, 2)
    write_file(mdir / shards[0][0], shards[0][1])
    write_file(other / f"shard{v}", shards[1][1])
    write_file(mdir / shards[1][0], b"")
    mount("--bind", str(other / f"shard{v}"), str(mdir / shards[1][0]))
    mounted.append(mdir / shards[1][0])
    return index


def test_a_shard_bind_mounted_from_another_local_filesystem_loads_and_reloads(tmp_path):
    """The layouts a container gives (docker -v host/shard:/models/m/shard,
    a Kubernetes subPath mount of one file): m/'s index and one shard on
    this filesystem, the other shard a bind mount of a file on a tmpfs. The
    load crosses that mount (its device is a local filesystem's), and so
    does a watched reload (a new index renamed over) and the operator's."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs and bind-mount a file")
    mdir = tmp_path / "m"
    mdir.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    os.chmod(tmp_path, 0o755)
    mount("-t", "tmpfs", "tmpfs", str(other))
    mounted = []
    try:
        index = bind_mounted_shards(tmp_path, 1, other, mounted)
        write_file(mdir / "model.safetensors.index.json", index)
        d = Daemon(tmp_path, {"m": str(mdir)}).start()
        try:
            ready(d, "m", 1)
            # the README's update: version 2's shards (the second again a
            # bind mount), then its index renamed over
            index2 = bind_mounted_shards(tmp_path, 2, other, mounted)
            write_file(mdir / ".index.tmp", index2)
            os.rename(mdir / ".index.tmp", mdir / "model.safetensors.index.json")
            ready(d, "m", 2)
            assert error_of(d, "m") is None, entry(d, "m")
            r = ctl(d, "reload", "m")
            assert r.returncode == 0, r.stdout + r.stderr
        finally:
            assert d.stop() == 0, d.read_log()
    finally:
        for path in mounted:
            umount(path)
        umount(other)


def test_a_model_directory_that_is_a_mount_itself_loads_and_reloads(tmp_path):
    """m/ is a tmpfs mount of its own holding a one-file model: its tree is
    that mount, nothing crossed; the load, a watched reload (a new file
    renamed over) and the operator's reload all work."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    mdir = tmp_path / "m"
    mdir.mkdir()
    os.chmod(tmp_path, 0o755)
    mount("-t", "tmpfs", "tmpfs", str(mdir))
    try:
        mkmodel(str(mdir / "model.safetensors"))
        d = Daemon(tmp_path, {"m": str(mdir)}).start()
        try:
            ready(d, "m", 1)
            mkmodel(str(mdir / ".new"), seed=2)
            os.rename(mdir / ".new", mdir / "model.safetensors")
            ready(d, "m", 2)
            r = ctl(d, "reload", "m")
            assert r.returncode == 0, r.stdout + r.stderr
        finally:
            assert d.stop() == 0, d.read_log()
    finally:
        umount(mdir)
