"""A model's owner against the other tenants of wcached (review rev173):
what she can change of her own model's path must not reach another model's
files, nor wcached's descriptors. wcached runs unprivileged, as the
neighbour tests do (test_neighbours.py)."""
import contextlib
import hashlib
import json
import os
import re
import socket
import struct
import subprocess

import pytest

from conftest import Daemon, as_user, binary, mkmodel, wait_until
from test_daemon import message

# Ids no account uses: the daemon's user, a model's owner and another user,
# all in GROUP (which may connect to the 0660 client socket).
DAEMON_UID, ALICE_UID, OTHER_UID, GROUP = 64101, 64104, 64103, 64100

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root to run wcached and clients as other users")


def control(d, *words):
    r = subprocess.run([binary("wcachectl"), "--control", d.control, *words],
                       capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


def as_alice(script, cwd):
    subprocess.run(as_user(ALICE_UID, GROUP) + ["/bin/sh", "-ec", script], cwd=cwd, check=True)


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def served_generation(d, name):
    """The generation of name an attach gets (wcachectl attach's line)."""
    r = d.attach(name)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def owned_dir(path, uid):
    os.makedirs(path)
    os.chown(path, uid, GROUP)
    os.chmod(path, 0o755)
    return str(path)


def test_a_link_renamed_over_a_model_directory_waits_for_the_operator(tmp_path):
    """F1: alice owns the directory holding her model's directory; she renames
    a symbolic link to bob's model over it. wcached saw the rename (inotify)
    and served bob's files as alice's model generation 2, past bob's
    allow_users. Now the watched reload is refused with one line naming both
    trees, generation 1 serves on, and an operator's reload takes the new
    tree. A hub snapshot switch (the tree stays models--X) still passes."""
    alice = owned_dir(tmp_path / "alice", ALICE_UID)
    os.makedirs(tmp_path / "bob" / "m")
    mkmodel(os.path.join(alice, "m.tmp"), seed=1)
    as_alice("mkdir m && cp m.tmp m/model.safetensors && rm m.tmp", alice)
    mkmodel(tmp_path / "bob" / "m" / "model.safetensors", seed=2)
    hub = tmp_path / "hub" / "models--o--n"
    for rev, seed in (("rev1", 3), ("rev2", 4)):
        os.makedirs(hub / "snapshots" / rev)
        mkmodel(hub / "snapshots" / rev / "model.safetensors", seed=seed)
    os.symlink("rev1", hub / "snapshots" / "cur")
    models = {"alice": os.path.join(alice, "m"), "bob": str(tmp_path / "bob" / "m"),
              "hub": str(hub / "snapshots" / "cur")}
    d = Daemon(tmp_path, models, user=(DAEMON_UID, GROUP), nofile=1024).start()
    try:
        d.wait_for_log(r'model "hub": generation 1 warm')
        d.wait_for_log(r'model "alice": generation 1 warm')
        assert "generation 1" in served_generation(d, "alice")

        as_alice("ln -s ../bob/m m.new && mv m m.old && mv m.new m", alice)
        _, line = d.wait_for_log(r'model "alice": its path .* now resolves into')
        assert str(tmp_path / "bob" / "m") in line and os.path.join(alice, "m") in line, line
        assert "wcachectl reload alice" in line and "generation 1 still serving" in line, line
        assert "generation 1" in served_generation(d, "alice")
        assert 'model "alice": generation 2' not in d.read_log()

        # A hub snapshot switch inside models--o--n is the same tree.
        os.symlink("rev2", hub / "snapshots" / "cur.new")
        os.rename(hub / "snapshots" / "cur.new", hub / "snapshots" / "cur")
        d.wait_for_log(r'model "hub": generation 2 is current')

        # The operator's reload resolves the path anew: her act.
        code, out = control(d, "reload", "alice")
        assert code == 0, out
        d.wait_for_log(r'model "alice": generation 2 is current')
        assert "generation 2" in served_generation(d, "alice")
        assert digest(os.path.join(alice, "m", "model.safetensors")) == \
            digest(tmp_path / "bob" / "m" / "model.safetensors")
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_model_with_no_generation_keeps_the_tree_its_operator_found(tmp_path):
    """rev177 D: a watched reload of a model with no generation (its first
    load failed, or its files did not exist yet) kept no tree and followed
    a link renamed over it into bob's model, served as alice's generation
    1. Now it keeps the tree the operator's last load found: the one the
    path resolved to (m, whose load failed), or where the path did not
    exist the tree it would have in its directory (n, f). A link into
    another directory waits for the operator; her own files appearing
    there, a directory or one file, still load by themselves."""
    alice = owned_dir(tmp_path / "alice", ALICE_UID)
    bob = str(tmp_path / "bob" / "m")
    os.makedirs(bob)
    mkmodel(os.path.join(bob, "model.safetensors"), seed=2)
    for name, seed in (("m.tmp", 1), ("n.tmp", 3), ("f.tmp", 4)):
        mkmodel(os.path.join(alice, name), seed=seed)
    as_alice("mkdir m && printf 'garbage-not-a-model' > m/model.safetensors", alice)
    models = {"alice": os.path.join(alice, "m"), "later": os.path.join(alice, "n"),
              "file": os.path.join(alice, "f.safetensors"), "bob": bob}
    d = Daemon(tmp_path, models, user=(DAEMON_UID, GROUP), nofile=1024).start()
    try:
        d.wait_for_log(r'model "bob": generation 1 warm')
        d.wait_for_log(r'model "alice": .*not a safetensors file')
        d.wait_for_log(r'model "later": ')
        as_alice("ln -s ../bob/m m.new && mv m m.old && mv m.new m && ln -s ../bob/m n", alice)
        for name, was in (("alice", "m"), ("later", "n")):
            _, line = d.wait_for_log(r'model "%s": its path .* now resolves into' % name)
            assert bob in line and "(was %s)" % os.path.join(alice, was) in line, line
            assert "wcachectl reload %s" % name in line and "not served" in line, line
        log = d.read_log()
        assert 'model "alice": generation' not in log and 'model "later": generation' \
            not in log, log

        # Her own files, in the tree the path names: taken by themselves.
        as_alice("rm m n && mkdir m.2 n.2 && mv m.tmp m.2/model.safetensors && mv m.2 m"
                 " && mv n.tmp n.2/model.safetensors && mv n.2 n && mv f.tmp f.safetensors",
                 alice)
        for name in ("alice", "later", "file"):
            d.wait_for_log(r'model "%s": generation 1 warm' % name)
            assert "generation 1" in served_generation(d, name)
        assert digest(os.path.join(alice, "m", "model.safetensors")) != digest(
            os.path.join(bob, "model.safetensors"))
    finally:
        assert d.stop() == 0, d.read_log()


def two_versions(tmp_path):
    """alice's directory (hers) holding her versions v1 and v2 of a model
    and the link m to v1, the path configured; returns the directory."""
    alice = owned_dir(tmp_path / "alice", ALICE_UID)
    mkmodel(os.path.join(alice, "m1.tmp"), seed=1)
    mkmodel(os.path.join(alice, "m2.tmp"), seed=2)
    as_alice("mkdir v1 v2 && mv m1.tmp v1/model.safetensors && mv m2.tmp v2/model.safetensors"
             " && ln -s v1 m", alice)
    return alice


@contextlib.contextmanager
def serving(tmp_path, alice):
    """wcached (unprivileged) serving alice's m, generation 1 warm; stops it."""
    d = Daemon(tmp_path, {"alice": os.path.join(alice, "m")}, user=(DAEMON_UID, GROUP),
               nofile=1024).start()
    try:
        d.wait_for_log(r'model "alice": generation 1 warm')
        yield d
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_deployer_swaps_her_versions_by_a_link_but_not_into_another_users_tree(tmp_path):
    """README "Updating a model safely": `ln -s v2 .next && mv -T .next m`
    swaps a directory model to a sibling version of its owner's, and
    wcached takes it by itself (the F1 refusal had made that wait for the
    operator). A sibling that another user owns (a tree she did not make)
    is refused as F1's link to another directory is."""
    alice = two_versions(tmp_path)
    other = owned_dir(os.path.join(alice, "x"), OTHER_UID)
    mkmodel(os.path.join(other, "model.safetensors"), seed=3)
    os.chown(os.path.join(other, "model.safetensors"), OTHER_UID, GROUP)
    with serving(tmp_path, alice) as d:
        as_alice("ln -s v2 .next && mv -T .next m", alice)
        d.wait_for_log(r'model "alice": generation 2 is current')
        assert "generation 2" in served_generation(d, "alice")

        as_alice("ln -s x .next && mv -T .next m", alice)
        _, line = d.wait_for_log(r'model "alice": its path .* now resolves into')
        assert other in line and "generation 2 still serving" in line, line
        assert "generation 2" in served_generation(d, "alice")
        assert 'model "alice": generation 3' not in d.read_log()


def test_a_deployer_swaps_her_versions_and_removes_the_old_one_at_once(tmp_path):
    """README's swap ends with `rm -rf v1`. The watched reload runs after
    the settle time, when v1 is gone: it used to find the old tree's root
    and owner by stat()ing v1 then, found nothing, and refused the swap
    until an operator's reload (review rev175 F8). The root and its owner
    are recorded when generation 1 loads, so the swap is taken by itself."""
    alice = two_versions(tmp_path)
    with serving(tmp_path, alice) as d:
        as_alice("ln -s v2 .next && mv -T .next m && rm -rf v1", alice)
        d.wait_for_log(r'model "alice": generation 2 is current')
        assert "generation 2" in served_generation(d, "alice")
        assert "now resolves into" not in d.read_log(), d.read_log()


def sparse_model(path, size, name="t"):
    """A safetensors file of one U8 tensor (name) of size bytes, all of them
    a hole (written as `truncate -s` makes it): a few bytes on disk."""
    header = json.dumps({name: {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}})
    header += " " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header.encode())
        f.truncate(8 + len(header) + size)
    return os.stat(path)


def test_a_sparse_model_file_is_refused(tmp_path):
    """rev173 F3: alice renames over her model a file that claims 256 MiB
    of tensor data and has none on disk. wcached loaded and warmed it: the
    holes read into the page cache as zeros, at no cost to her. Now the load
    is refused with one line naming the file, its size and its data, and
    generation 1 serves on; a file whose holes stay under GEN_HOLES_MAX
    (64 MiB) still loads."""
    with alice_and_a_connection(tmp_path, {}, 1024) as (d, alice, _):
        st = sparse_model(os.path.join(alice, "next.safetensors"), 256 << 20)
        assert st.st_blocks * 512 < 1 << 20, st
        os.rename(os.path.join(alice, "next.safetensors"),
                  os.path.join(alice, "model.safetensors"))
        _, line = d.wait_for_log(r'model "alice": .*a sparse file')
        assert "model.safetensors: a sparse file: %d bytes long" % st.st_size in line, line
        assert "cp --sparse=never" in line and "generation 1 still serving" in line, line
        assert "generation 1" in served_generation(d, "alice")

        sparse_model(os.path.join(alice, "next.safetensors"), 16 << 20)
        os.rename(os.path.join(alice, "next.safetensors"),
                  os.path.join(alice, "model.safetensors"))
        d.wait_for_log(r'model "alice": generation 2 is current')


def test_many_shards_each_under_the_bound_add_up(tmp_path):
    """rev177 E: the bound applied per file, so six shards of 48 MiB holes
    each (a few KiB on disk) loaded and warmed 288 MiB of zeros. The holes
    of all the model's files count together now: refused at start with one
    line, the model not served."""
    many = tmp_path / "many"
    os.makedirs(many)
    weight_map = {}
    for i in range(6):
        name = "model-%05d-of-00006.safetensors" % (i + 1)
        sparse_model(str(many / name), 48 << 20, "t%d" % i)
        weight_map["t%d" % i] = name
    with open(many / "model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    d = Daemon(tmp_path, {"many": str(many)}).start()
    try:
        _, line = d.wait_for_log(r'model "many": .*sparse files')
        assert "and 5 more: sparse files: %d bytes long in all" % sum(
            os.stat(many / n).st_size for n in set(weight_map.values())) in line, line
        assert "cp --sparse=never" in line, line
        assert "generation 1 warm" not in d.read_log()
    finally:
        assert d.stop() == 0, d.read_log()


def generation_lines(d):
    """How many lines say alice's generation changed, a load of it failed, or
    its reload waits for a release."""
    return len(re.findall(r'model "alice": (generation \d+ is current|.*still serving'
                          r'|.*older generations are still attached)', d.read_log()))


@contextlib.contextmanager
def alice_and_a_connection(tmp_path, others, nofile):
    """wcached (unprivileged, RLIMIT_NOFILE nofile) serving alice's directory
    model, generation 1 warm, and others; yields (d, alice's directory, a
    connection to its client socket that the test holds). Stops both."""
    alice = owned_dir(tmp_path / "alice", ALICE_UID)
    mkmodel(os.path.join(alice, "model.safetensors"), seed=1)
    d = Daemon(tmp_path, dict(others, alice=alice), user=(DAEMON_UID, GROUP),
               nofile=nofile).start()
    held = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        d.wait_for_log(r'model "alice": generation 1 warm')
        os.chmod(d.socket, 0o666)
        held.settimeout(10.0)
        held.connect(d.socket)
        yield d, alice, held
    finally:
        held.close()
        assert d.stop() == 0, d.read_log()


def replace_and_attach(d, alice, held, k):
    """Renames a new file over alice's model and, once wcached said what it
    made of it, attaches alice on the connection held (its descriptors
    closed here, the attach kept). False when no line came in 5 s. The new
    file is written beside alice's directory, not in it: a reload that saw
    it there half-written refused the directory's two files ("still
    serving"), a line this counts, and the tests' numbering slipped (seen
    under ASan, where mkmodel is slow)."""
    seen = generation_lines(d)
    nxt = mkmodel(os.path.join(os.path.dirname(alice), "next.safetensors"), seed=10 + k)
    os.rename(nxt, os.path.join(alice, "model.safetensors"))
    try:
        wait_until(lambda: generation_lines(d) > seen, timeout=5, what="alice's reload")
    except AssertionError:
        return False
    held.send(message(1, b"alice", seq=k + 1))
    data, anc, _, _ = held.recvmsg(65536, socket.CMSG_SPACE(4 * 16))
    for level, kind, cdata in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            for (fd,) in struct.iter_unpack("i", cdata[:len(cdata) // 4 * 4]):
                os.close(fd)
    return True


def test_attaching_every_generation_cannot_take_the_daemons_descriptors(tmp_path):
    """F9: the owner of one model, who may attach it, keeps one attach of each
    generation she makes (a file renamed over, seen by inotify). Each kept
    4 descriptors in wcached (the file, its reopen, the index, its reopen)
    with no bound, so wcached (RLIMIT_NOFILE 128 here, a reserve of 32)
    refused every other user with "wcached is short of file descriptors".
    Now past REGISTRY_RETIRED_MAX (4) retired generations a reload waits
    while theirs pass an eighth of the limit (16 descriptors here: 4
    generations), with one warning, until she releases one; the other user
    is served, and her release lets the waiting reload run."""
    bob = mkmodel(tmp_path / "bob.safetensors", seed=2)
    with alice_and_a_connection(tmp_path, {"bob": bob}, 128) as (d, alice, held):
        for k in range(24):
            if not replace_and_attach(d, alice, held, k):
                break  # nothing more comes: her reloads wait
        r = subprocess.run(as_user(OTHER_UID, GROUP) + [binary("wcachectl"), "attach", "bob",
                           "--socket", d.socket], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        _, line = d.wait_for_log(r'model "alice": 4 older generations are still attached')
        assert "still serving" in line, line
        # One warning (each refused reload's answer is a debug line too).
        assert d.read_log().count("warning: model \"alice\": 4 older generations are still "
                                  "attached") == 1, d.read_log()
        current = len(re.findall(r'model "alice": generation \d+ is current', d.read_log()))
        held.close()  # her release lets the reload that waited run
        wait_until(lambda: len(re.findall(r'model "alice": generation \d+ is current',
                                          d.read_log())) > current, timeout=30,
                   what="the reload that waited for a release")


def test_workers_that_keep_old_generations_do_not_stop_a_small_models_updates(tmp_path):
    """The bound of F9 is on descriptors, not a count alone: long-lived
    workers that each keep the generation they started with (never
    releasing it) must not stop a one-file model's updates after 4 swaps.
    Under RLIMIT_NOFILE 1024 its 8 retired generations keep 32 descriptors
    (an eighth is 128): every swap becomes current, and nothing waits."""
    with alice_and_a_connection(tmp_path, {}, 1024) as (d, alice, held):
        for k in range(8):
            assert replace_and_attach(d, alice, held, k), d.read_log()[-2000:]
        d.wait_for_log(r'model "alice": generation 9 is current')
        assert "older generations are still attached" not in d.read_log()
