"""A live staged generation's origin is kept by its inode AND its ctime
(review rev219 H2).

Where the directory holding a model's files is one others may rename
entries in (a team's 2775 place), wcached's own reloads take only the very
files serving (files_kept). A staged generation serves its copies in
stage_dir and holds nothing of its origin: once bob (of the group) removes
alice's model file, its inode number is free, and ext4 gives it to the next
file made there (her next upload). bob renames that file at the model's
name: by (dev, ino) alone it was "one of the files serving", and her other
model was served as the model. Now the origin's ctime must match too (a
freshly made file has its own), so that waits for the operator's reload,
as a file at a new inode does; and so does a chmod of the origin (it moves
the ctime of the same inode), which the operator's `wcachectl reload` then
loads. stage = no is the control: that generation holds its file, so its
number is never freed while it serves. A shard index is held by nothing
either (read, then closed): her write in place to it waits the same. Nor,
on a remote filesystem, does a descriptor held here hold a file served
where it lies (stage = no): another host's rm frees it on the server
(review rev222 M1), so those are kept by their ctime too.
"""
import contextlib
import json
import os
import re
import shutil
import subprocess

import pytest

from conftest import Daemon, as_user, mkmodel
from ctlutil import ctl
from test_stage import remotefs, write_safetensors
from test_tree_places import (ALICE_UID, DAEMON_UID, GROUP, WCACHED_GID, as_alice, as_bob,
                              generation_1_waits, made_by, pytestmark, served, sharded_model)

__all__ = ["pytestmark"]

# How many files alice makes, at most, for one to get the freed number.
TRIES = 1000

# The line of a reload files_kept refuses (registry_load.c).
NOT_SERVING = (r"its file %s is not one of the files serving .* in a directory others than "
               r"its owner \(uid 0, mode 2775\) may rename entries in")


@contextlib.contextmanager
def own_ext4(tmp_path):
    """A directory on an ext4 filesystem of the test's own (an image in
    tmp_path, loop-mounted), where nothing else makes files: a freed inode
    number goes to the next file made there (the lowest free one in the
    directory's group). Where none can be mounted (no mkfs.ext4, no loop
    device), tmp_path itself: on a busy filesystem another process's file
    may take the number first."""
    img, mnt = tmp_path / "ext4.img", tmp_path / "ext4"
    if shutil.which("mkfs.ext4") is None:
        yield tmp_path
        return
    with open(img, "wb") as f:
        f.truncate(64 << 20)
    os.mkdir(mnt)
    if (subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], capture_output=True).returncode
            or subprocess.run(["mount", "-o", "loop", str(img), str(mnt)],
                              capture_output=True).returncode):
        yield tmp_path
        return
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)]).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], check=True)


def team_model(tmp_path, place, stage):
    """alice's one-file model m.safetensors in root's team place (2775,
    GROUP: its members may rename entries there) under place, served with
    stage; her other model (another one, seed 2) beside the place:
    (daemon, team, m, other)."""
    team = made_by(place / "team", 0, 0o2775)
    m = mkmodel(os.path.join(team, "m.safetensors"), seed=1)
    os.chown(m, ALICE_UID, GROUP)
    other = mkmodel(tmp_path / "other.safetensors", layers=3, seed=2)
    os.chown(other, ALICE_UID, GROUP)
    staged = made_by(tmp_path / "staged", DAEMON_UID, 0o700)
    d = Daemon(tmp_path, {"llama": (m, {"stage": stage})}, user=(DAEMON_UID, WCACHED_GID),
               nofile=1024, extra="stage_dir = %s\n" % staged).start()
    d.wait_for_log(r'model "llama": generation 1 warm')
    return d, team, m, str(other)


def her_file_at(team, ino, other):
    """alice makes files in team until one gets inode number ino, then
    writes her other model into it and names it up.safetensors: 1, or 0 when
    none did in TRIES files (the rest stay: each holds a number, so the next
    file gets a higher one)."""
    script = ('i=0; while [ $i -lt %d ]; do : > f.$i; '
              'if [ "$(stat -c %%i f.$i)" = %d ]; then cat %s > f.$i; '
              'mv f.$i up.safetensors; exit 0; fi; i=$((i+1)); done; exit 3'
              % (TRIES, ino, other))
    r = subprocess.run(as_user(ALICE_UID, GROUP) + ["/bin/sh", "-ec", script], cwd=team)
    assert r.returncode in (0, 3), r
    return r.returncode == 0


@pytest.mark.parametrize("stage", ["yes", "no"])
def test_her_other_file_at_the_freed_origin_inode_renamed_at_its_name_waits(tmp_path, stage):
    """bob removes alice's model file (its reload fails, generation 1
    serving), alice's next file in the team place gets its freed inode
    number, bob renames it at the model's name: generation 1 stays serving
    and the reload waits for the operator's. With stage = no the number is
    never freed (generation 1 holds the file): the file alice makes is at
    another number, and waits the same."""
    with own_ext4(tmp_path) as place:
        d, team, m, other = team_model(tmp_path, place, stage)
        try:
            ino = os.stat(m).st_ino
            as_bob("rm -f m.safetensors", team)
            d.wait_for_log(r'model "llama": .*No such file.*generation 1 still serving')
            if stage == "no":
                as_alice("cp %s up.safetensors" % other, team)
                assert os.stat(os.path.join(team, "up.safetensors")).st_ino != ino
            elif not her_file_at(team, ino, other):
                pytest.skip("the filesystem of %s gave the freed inode number %d to none of "
                            "%d new files (another file got it first, or it does not reuse "
                            "numbers at once)" % (team, ino, TRIES))
            as_bob("mv up.safetensors m.safetensors", team)
            generation_1_waits(d, "llama", NOT_SERVING % re.escape(m), head="its file")
        finally:
            assert d.stop() == 0, d.read_log()


def waits_then_the_operators_reload_loads(d, path, loaded):
    """d's watched reload of llama waits for the operator's, refusing path
    (files_kept's line); then `wcachectl reload llama` loads generation 2
    (its log line matching loaded), which an attach gets."""
    generation_1_waits(d, "llama", NOT_SERVING % re.escape(path), head="its file")
    r = ctl(d, "reload", "llama")
    assert r.returncode == 0, r.stdout + r.stderr
    d.wait_for_log(loaded)
    assert "generation 2" in served(d, "llama")


def test_a_chmod_of_the_origin_waits_for_the_operators_reload(tmp_path):
    """alice's chmod of her staged model's origin moves its ctime, the
    inode the same: nothing held it, so wcached cannot tell it from another
    file made at that number, and its own reload waits; the operator's
    `wcachectl reload llama` then loads it (a new generation, staged
    again). A chmod alone reloads nothing (inotify's IN_ATTRIB is no
    event of a name): here her descriptor open for writing across it,
    closed unwritten, is the event that reloads it (before, the reload
    staged it again by itself: its ctime moved)."""
    d, team, m, _ = team_model(tmp_path, tmp_path, "yes")
    try:
        as_alice("exec 3>>m.safetensors; chmod 0444 m.safetensors; exec 3>&-", team)
        waits_then_the_operators_reload_loads(d, m, r'model "llama": generation 2 staged from ')
    finally:
        assert d.stop() == 0, d.read_log()


def two_shard_index(team):
    """alice's sharded model in team: shards s1 (tensor a) and s2 (tensor
    b), its index naming both; and an index naming a alone (new.json,
    beside the place): (index, new.json)."""
    shards = [os.path.join(team, "s%d.safetensors" % k) for k in (1, 2)]
    write_safetensors(shards[0], {"a": os.urandom(4096)})
    write_safetensors(shards[1], {"b": os.urandom(4096)})
    index = os.path.join(team, "model.safetensors.index.json")
    with open(index, "w") as f:
        json.dump({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}, f)
    new = os.path.join(os.path.dirname(team), "new.json")
    with open(new, "w") as f:
        json.dump({"weight_map": {"a": "s1.safetensors"}}, f)
    for f in (index, new, *shards):
        os.chown(f, ALICE_UID, GROUP)
    return index, new


def test_her_shard_index_written_in_place_waits_for_the_operators_reload(tmp_path):
    """The same for a sharded model served where it lies: its shards are
    held by the generation, its index is not (read, then closed), so an
    index at its inode number (alice's write in place here, naming one of
    the two shards serving; as well bob's rename of her next file made at
    the number freed) is not taken for the one serving: it waits for the
    operator's reload, which loads it (before, it loaded by itself: the
    same inode, and each shard it names one serving)."""
    team = made_by(tmp_path / "team", 0, 0o2775)
    index, new = two_shard_index(team)
    d = Daemon(tmp_path, {"llama": index}, user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
    try:
        d.wait_for_log(r'model "llama": generation 1 warm')
        ino = os.stat(index).st_ino
        as_alice("cat %s > %s" % (new, index), team)
        assert os.stat(index).st_ino == ino
        waits_then_the_operators_reload_loads(d, index, r'model "llama": generation 2 is current')
    finally:
        assert d.stop() == 0, d.read_log()


def test_her_file_served_where_it_lies_on_a_remote_filesystem_is_kept_by_its_ctime(tmp_path):
    """Review rev222 M1: stage = no on a remote filesystem (NFS, a FUSE
    mount of a network store). wcached's descriptor there does not hold the
    file on the server: another host's rm frees it, and the server may give
    its inode number (NFS's fileid) to the next file made, which through
    this client has the same st_dev and st_ino: by those alone it was "one
    of the files serving", so bob's rename of alice's next file at the
    model's name was taken by wcached's own reload. Those ids are kept with
    their ctime now, as a staged origin's. remotefs keeps a backing file
    open while wcached holds it, so no number is given again here: alice's
    write in place of her model file (her other model, another size),
    which the poll sees as a reused number would be seen ("written in
    place ..., or replaced by a file given the same inode number"), is to
    wcached what that file is: the same device and inode, another ctime.
    Before, the watched reload took it by itself (generation 2 is
    current); now it waits for the operator's reload, which loads it."""
    rfs = remotefs()
    backing = made_by(tmp_path / "backing", 0)
    team = made_by(os.path.join(backing, "team"), 0, 0o2775)
    own = mkmodel(os.path.join(team, "m.safetensors"), seed=1)
    os.chown(own, ALICE_UID, GROUP)
    other = mkmodel(tmp_path / "other.safetensors", layers=3, seed=2)
    os.chown(other, ALICE_UID, GROUP)
    with rfs.RemoteFS(backing, tmp_path / "mnt", attr_timeout=0.1) as fs:
        m = fs.path("team/m.safetensors")
        d = Daemon(tmp_path, {"llama": (m, {"stage": "no", "poll_interval": "0.2"})},
                   user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
        try:
            d.wait_for_log(r'model "llama": generation 1 warm')
            ino = os.stat(m).st_ino
            as_alice("cat %s > m.safetensors" % other, team)
            assert os.stat(own).st_ino == os.stat(m).st_ino == ino
            _, line = d.wait_for_log(r'model "llama": (its file|generation 2 is current)')
            assert re.search(NOT_SERVING % re.escape(m), line), line
            assert "wcachectl reload llama" in line, line
            assert 'model "llama": generation 2' not in d.read_log(), d.read_log()
            r = ctl(d, "reload", "llama")
            assert r.returncode == 0, r.stdout + r.stderr
            d.wait_for_log(r'model "llama": generation 2 is current')
            assert "generation 2" in served(d, "llama")
        finally:
            assert d.stop() == 0, d.read_log()
