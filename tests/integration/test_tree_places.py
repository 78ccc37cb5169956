"""Which tree a watched reload may take its files from, where hub names
(models--X with blobs/ or snapshots/REV/ below it) meet a shared writable
place: a directory name is no one's word on who made what is under it.
wcached runs unprivileged, as the neighbour tests do (test_neighbours.py).
Last, review rev199's attacks: trees renamed over, or in above, in a 2775
place while wcached restarts, or at run time."""
import hashlib
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import Daemon, as_user, mkmodel, wait_until
from ctlutil import ctl
from test_warm_restart import ready, start

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from fakemanager import FakeManager  # noqa: E402 (path set just above)

# Ids no account uses: the daemon's user, a model's owner (alice) and
# another user (bob), all in GROUP (which may connect to the client socket).
DAEMON_UID, ALICE_UID, BOB_UID, GROUP = 64101, 64104, 64103, 64100

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root to run wcached and clients as other users")


def as_alice(script, cwd):
    subprocess.run(as_user(ALICE_UID, GROUP) + ["/bin/sh", "-ec", script], cwd=cwd, check=True)


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def made_by(path, uid, mode=0o755):
    """The directory path, made and owned by uid."""
    os.makedirs(path)
    os.chown(path, uid, GROUP)
    os.chmod(path, mode)
    return str(path)


def served(d, name):
    """The generation of name an attach gets (wcachectl attach's line)."""
    r = d.attach(name)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def shared_place(tmp_path):
    """A shared place (root's, sticky and writable by GROUP, as a team's
    model directory) holding alice's model directory v1 and her link m to
    it, the path configured (README's `ln -s v2 .next && mv -T .next m`
    swaps it). Not world-writable: where fs.protected_symlinks is 1
    (Debian's and systemd's default) the kernel follows no link of
    alice's in a sticky world-writable directory for another user
    (wcached), and generation 1 would never load (review rev187 R6)."""
    shared = made_by(tmp_path / "shared", 0, 0o1775)
    mkmodel(os.path.join(shared, "alice.tmp"), seed=1)
    os.chown(os.path.join(shared, "alice.tmp"), ALICE_UID, GROUP)
    as_alice("mkdir v1 && mv alice.tmp v1/model.safetensors && ln -s v1 m", shared)
    return shared


def test_a_blobs_directory_made_in_another_users_repo_does_not_widen_her_tree(tmp_path):
    """bob's hub repo models--o--m is a shared writable place (1777, as a
    shared hub cache's repo may be) with no blobs/ of its own. alice made
    blobs/ in it, hers, with her model, and renamed a link to it over her
    model m: its tree was taken, by the name models--o--m, as bob's repo
    itself, with her as its owner (blobs/'s), so the swap passed as a
    sibling of hers; her next link, to bob's snapshot in the same repo,
    was then "the same tree", and bob's files were served as alice's
    generation 3. Now a blobs/ directory is its repo's only where the repo
    owns it too: her blobs/ is a tree of its own, inside bob's repo, and
    each swap waits for the operator, with one line naming both trees."""
    shared = shared_place(tmp_path)
    repo = made_by(os.path.join(shared, "models--o--m"), BOB_UID, 0o1777)
    snap = os.path.join(repo, "snapshots", "main")
    made_by(os.path.join(repo, "snapshots"), BOB_UID)
    made_by(snap, BOB_UID)
    mkmodel(os.path.join(snap, "model.safetensors"), seed=2)
    os.chown(os.path.join(snap, "model.safetensors"), BOB_UID, GROUP)
    mkmodel(os.path.join(shared, "mine.tmp"), seed=3)
    os.chown(os.path.join(shared, "mine.tmp"), ALICE_UID, GROUP)
    m, v1 = os.path.join(shared, "m"), os.path.join(shared, "v1")
    d = Daemon(tmp_path, {"alice": m}, user=(DAEMON_UID, GROUP), nofile=1024).start()
    try:
        d.wait_for_log(r'model "alice": generation 1 warm')
        # (Each wait also ends on the swap's generation, so that the code
        # before this fix fails on its served generation, not a timeout.)
        as_alice("mkdir models--o--m/blobs && mv mine.tmp models--o--m/blobs/model.safetensors"
                 " && ln -s models--o--m/blobs .next && mv -T .next m", shared)
        _, first = d.wait_for_log(r'model "alice": (its path .* now resolves into|'
                                  r'generation 2 is current)')
        as_alice("ln -s models--o--m/snapshots/main .next && mv -T .next m", shared)
        _, second = d.wait_for_log(r'model "alice": (its path .* now resolves into %s |'
                                   r'generation 3 is current)' % repo)
        log = d.read_log()
        assert 'model "alice": generation 3' not in log, "bob's files served as alice's:\n" + log
        assert 'model "alice": generation 2' not in log, log
        assert os.path.join(repo, "blobs") in first and "(was %s)" % v1 in first, first
        assert "wcachectl reload alice" in first and "generation 1 still serving" in first, first
        assert "(was %s)" % v1 in second and "generation 1 still serving" in second, second
        assert "generation 1" in served(d, "alice")
    finally:
        assert d.stop() == 0, d.read_log()


def test_hub_names_in_a_shared_place_reach_only_their_makers_files(tmp_path):
    """What a hub name does widen, pinned: a model's tree is its hub repo
    (models--X, two levels above a snapshot), and a swap is taken only into
    that tree or a sibling tree of the same owner. alice's own repo in the
    shared place is hers: a swap to its snapshot is taken by itself. bob's
    repo beside it (his blobs/ and snapshots/) is not hers: a swap into
    it waits for the operator; a link from her repo's snapshot into his
    blobs/ leaves her repo and is refused as it is opened."""
    shared = shared_place(tmp_path)
    bob = made_by(os.path.join(shared, "models--o--bob"), BOB_UID)
    for sub in ("blobs", "snapshots", "snapshots/main"):
        made_by(os.path.join(bob, sub), BOB_UID)
    mkmodel(os.path.join(bob, "blobs", "h2"), seed=2)
    os.chown(os.path.join(bob, "blobs", "h2"), BOB_UID, GROUP)
    os.symlink("../../blobs/h2", os.path.join(bob, "snapshots", "main", "model.safetensors"))
    mkmodel(os.path.join(shared, "mine.tmp"), seed=3)
    os.chown(os.path.join(shared, "mine.tmp"), ALICE_UID, GROUP)
    m = os.path.join(shared, "m")
    d = Daemon(tmp_path, {"alice": m}, user=(DAEMON_UID, GROUP), nofile=1024).start()
    try:
        d.wait_for_log(r'model "alice": generation 1 warm')
        as_alice("mkdir -p models--o--a/blobs models--o--a/snapshots/r"
                 " && mv mine.tmp models--o--a/blobs/h3"
                 " && ln -s ../../blobs/h3 models--o--a/snapshots/r/model.safetensors"
                 " && ln -s models--o--a/snapshots/r .next && mv -T .next m", shared)
        d.wait_for_log(r'model "alice": generation 2 is current')
        assert "generation 2" in served(d, "alice")

        as_alice("ln -s models--o--bob/snapshots/main .next && mv -T .next m", shared)
        _, line = d.wait_for_log(r'model "alice": its path .* now resolves into %s ' % bob)
        assert "generation 2 still serving" in line, line

        as_alice("mkdir models--o--a/snapshots/s && ln -s ../../../models--o--bob/blobs/h2"
                 " models--o--a/snapshots/s/model.safetensors"
                 " && ln -s models--o--a/snapshots/s .next && mv -T .next m", shared)
        _, line = d.wait_for_log(r'model "alice": .*leaves the model\'s tree')
        assert os.path.join(shared, "models--o--a") in line, line
        log = d.read_log()
        assert 'model "alice": generation 3' not in log, log
        assert "generation 2" in served(d, "alice")
        assert digest(os.path.join(shared, "models--o--a", "blobs", "h3")) != \
            digest(os.path.join(bob, "blobs", "h2"))
    finally:
        assert d.stop() == 0, d.read_log()


def as_bob(script, cwd):
    subprocess.run(as_user(BOB_UID, GROUP) + ["/bin/sh", "-ec", script], cwd=cwd, check=True)


def alice_v2_beside_bobs_model(tmp_path, mode):
    """A shared place of mode (no link anywhere) holding alice's directory
    model v2 and bob's model file b.tmp: (the place, v2)."""
    shared = made_by(tmp_path / "shared", 0, mode)
    mkmodel(os.path.join(shared, "a.tmp"), seed=1)
    os.chown(os.path.join(shared, "a.tmp"), ALICE_UID, GROUP)
    as_alice("mkdir v2 && mv a.tmp v2/model.safetensors && chmod 755 v2", shared)
    mkmodel(os.path.join(shared, "b.tmp"), layers=3, seed=2)
    os.chown(os.path.join(shared, "b.tmp"), BOB_UID, GROUP)
    return shared, os.path.join(shared, "v2")


# bob renames alice's v2 away (in a place that is not sticky) and his own
# directory, with his model in it, to v2: one rename, one reload.
BOB_TAKES_V2 = "mv v2 .alices && mkdir b && mv b.tmp b/model.safetensors && mv b v2"


def alices_generation_1_waits(d, refusal, what):
    """The reload after bob's move waits for the operator's, with one line
    (matching refusal) that says what (bob's uid, then alice's)."""
    _, line = d.wait_for_log(r'model "alice": (%s|generation 2 is current)' % refusal)
    log = d.read_log()
    assert 'model "alice": generation 2' not in log, "bob's model served as alice's:\n" + log
    assert what % (BOB_UID, ALICE_UID) in line, line
    assert "wcachectl reload alice" in line and "generation 1 still serving" in line, line
    assert "generation 1" in served(d, "alice")


def bobs_v2_waits(d, v2):
    """The reload after bob made v2 his waits for the operator's: the root
    of the path is the same, its owner is not (review rev187 R2)."""
    alices_generation_1_waits(d, "its path .* still, but", "resolves into " + v2 +
                              " still, but that directory is now owned by uid %d (was uid %d)")


def test_a_tree_removed_and_made_again_by_another_user_waits(tmp_path):
    """A sticky place (1777, as /tmp): alice removes her model directory v2
    to redeploy; bob makes his own v2 there first. It was taken as the same
    tree (its path is) and served as her generation 2."""
    shared, v2 = alice_v2_beside_bobs_model(tmp_path, 0o1777)
    d = Daemon(tmp_path, {"alice": v2}, user=(DAEMON_UID, GROUP), nofile=1024).start()
    try:
        d.wait_for_log(r'model "alice": generation 1 warm')
        as_alice("rm -rf v2", shared)
        as_bob("mkdir b && mv b.tmp b/model.safetensors && mv b v2", shared)
        bobs_v2_waits(d, v2)
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_neighbour_moving_the_tree_away_waits(tmp_path):
    """A shared place that is not sticky (0777, as a hub cache made
    writable for a team): bob needs no help, he renames alice's v2 away
    and his own directory to v2."""
    shared, v2 = alice_v2_beside_bobs_model(tmp_path, 0o777)
    d = Daemon(tmp_path, {"alice": v2}, user=(DAEMON_UID, GROUP), nofile=1024).start()
    try:
        d.wait_for_log(r'model "alice": generation 1 warm')
        as_bob(BOB_TAKES_V2, shared)
        bobs_v2_waits(d, v2)
    finally:
        assert d.stop() == 0, d.read_log()


def after_a_warm_restart(tmp_path, path, then, while_down=None):
    """Serves alice's model at path, restarts wcached warm (a fake
    service manager keeps its descriptors; while_down() runs while no
    wcached does) and calls then(d) once her generation 1 is restored."""
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    os.chmod(mgr.path, 0o666)   # wcached, as DAEMON_UID, sends to it
    d = Daemon(tmp_path, {"alice": path}, user=(DAEMON_UID, GROUP), nofile=1024)
    try:
        start(d, mgr, user=(DAEMON_UID, GROUP))
        wait_until(lambda: ready(d, "alice"), what="alice ready")
        mgr.wait_for(lambda m: "wc-desc" in m.store and "wc-1-1-i" in m.store,
                     what="alice's generation and the description stored")
        assert d.stop() == 0, d.read_log()
        if while_down is not None:
            while_down()
        start(d, mgr, *mgr.listen_fds(), user=(DAEMON_UID, GROUP))
        _, line = d.wait_for_log(r'model "alice": (generation 1 restored from the file '
                                 r'descriptor store|not restored)')
        assert "generation 1 restored" in line, d.read_log()
        then(d)
    finally:
        code = d.stop()
        mgr.close()
    assert code == 0, d.read_log()


def test_a_neighbour_moving_the_tree_away_after_a_warm_restart_waits(tmp_path):
    """The same after a warm restart: the restored generation recorded no
    tree, and the reload took the root's owner from a stat of its path
    then, bob's, as the old tree's owner too. The restore's check now
    takes it from the directory its files were found beneath."""
    shared, v2 = alice_v2_beside_bobs_model(tmp_path, 0o777)

    def bob_takes_v2(d):
        as_bob(BOB_TAKES_V2, shared)
        bobs_v2_waits(d, v2)
    after_a_warm_restart(tmp_path, v2, bob_takes_v2)


def alices_file_in_a_shared_place(tmp_path):
    """A sticky place (1777, as /tmp) holding alice's model that is one
    file, m.safetensors, the path configured, and bob's model file b.tmp:
    (the place, the path)."""
    shared = made_by(tmp_path / "shared", 0, 0o1777)
    m = mkmodel(os.path.join(shared, "m.safetensors"), seed=1)
    os.chown(m, ALICE_UID, GROUP)
    mkmodel(os.path.join(shared, "b.tmp"), layers=3, seed=2)
    os.chown(os.path.join(shared, "b.tmp"), BOB_UID, GROUP)
    return shared, m


def bobs_file_waits(d, shared, m):
    """alice removes her file (to redeploy); bob renames his to its name.
    Its tree is the shared place, whose owner did not change: the reload
    waits for the operator's because the file's owner did (review rev187
    R2b)."""
    as_alice("rm m.safetensors", shared)
    as_bob("mv b.tmp m.safetensors", shared)
    alices_generation_1_waits(d, "its path .* names a file now owned", "its path " + m +
                              " names a file now owned by uid %d (was uid %d)")


def test_a_file_made_again_by_another_user_in_a_shared_place_waits(tmp_path):
    """A model that is one file directly in a sticky place: its tree is
    the place (root's), so bob's file at its name, once alice's is gone,
    was the same tree and served as her generation 2."""
    shared, m = alices_file_in_a_shared_place(tmp_path)
    d = Daemon(tmp_path, {"alice": m}, user=(DAEMON_UID, GROUP), nofile=1024).start()
    try:
        d.wait_for_log(r'model "alice": generation 1 warm')
        bobs_file_waits(d, shared, m)
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_file_made_again_by_another_user_after_a_warm_restart_waits(tmp_path):
    """The same after a warm restart: the restored generation's file owner
    is its stored descriptor's, as the restart's check fstat'ed it."""
    shared, m = alices_file_in_a_shared_place(tmp_path)
    after_a_warm_restart(tmp_path, m, lambda d: bobs_file_waits(d, shared, m))


def sharded_model(directory, shard_from):
    """A sharded model in directory (made): the model file shard_from
    renamed to its one shard s.safetensors, and an index naming it for
    each of its tensors."""
    os.makedirs(directory, exist_ok=True)
    shard = os.path.join(directory, "s.safetensors")
    os.rename(shard_from, shard)
    with open(shard, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": {n: "s.safetensors" for n in header
                                  if n != "__metadata__"}}, f)


def test_another_users_shard_renamed_into_a_sibling_waits(tmp_path):
    """A shared place that is not sticky (0777, as a team's directory):
    alice's sharded model v1, her link m to it configured. She makes v2
    with her index and, as its shard, bob's model file, renamed out of the
    place into her directory (a rename needs no right on the file), and
    swaps m to v2: her sibling, each file at its place, so bob's bytes were
    her generation 2. A reload wcached makes by itself now takes only
    files of the tree's owner or of the files serving (review rev187 R3)."""
    shared = made_by(tmp_path / "shared", 0, 0o777)
    sharded_model(os.path.join(shared, "v1"), mkmodel(os.path.join(shared, "a.tmp"), seed=1))
    subprocess.run(["chown", "-R", "%d:%d" % (ALICE_UID, GROUP), os.path.join(shared, "v1")],
                   check=True)
    mkmodel(os.path.join(shared, "b.tmp"), seed=2)   # the same tensors, other bytes
    os.chown(os.path.join(shared, "b.tmp"), BOB_UID, GROUP)
    os.chmod(os.path.join(shared, "b.tmp"), 0o640)
    m = os.path.join(shared, "m")
    as_alice("ln -s v1 m", shared)
    d = Daemon(tmp_path, {"alice": m}, user=(DAEMON_UID, GROUP), nofile=1024).start()
    try:
        d.wait_for_log(r'model "alice": generation 1 warm')
        as_alice("mkdir v2 && cp v1/model.safetensors.index.json v2/ && "
                 "mv b.tmp v2/s.safetensors && ln -s v2 .next && mv -T .next m", shared)
        alices_generation_1_waits(
            d, "its file .* is owned by uid", "its file %s/s.safetensors is owned by uid %%d, "
            "not by the owner of its tree %s/v2 (uid %%d) nor of the files serving" % (m, shared))
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_hard_link_of_another_users_file_is_not_served(tmp_path):
    """alice's model directory whose file is a hard link of bob's model
    file (fs.protected_hardlinks=0 lets her link a file she cannot read;
    root stands in for her here): the operator's own load served it as
    hers. Refused with one line naming the file, its owner, its mode and
    the tree's owner, who may not read it (review rev187 R3, rev195 M2);
    her own file, hard-linked beside it, loads."""
    shared = made_by(tmp_path / "shared", 0, 0o755)
    alice, mine = made_by(os.path.join(shared, "alice"), ALICE_UID), \
        made_by(os.path.join(shared, "mine"), ALICE_UID)
    bob = mkmodel(os.path.join(made_by(os.path.join(shared, "bob"), BOB_UID, 0o750), "b"),
                  layers=3, seed=2)
    os.chown(bob, BOB_UID, GROUP)
    os.chmod(bob, 0o640)
    os.link(bob, os.path.join(alice, "model.safetensors"))
    own = mkmodel(os.path.join(mine, "own"), seed=1)
    os.chown(own, ALICE_UID, GROUP)
    os.link(own, os.path.join(mine, "model.safetensors"))
    d = Daemon(tmp_path, {"alice": alice, "mine": mine}, user=(DAEMON_UID, GROUP),
               nofile=1024).start()
    try:
        _, line = d.wait_for_log(r'model "alice": (.* may not read|generation 1 from)')
        assert "%s/model.safetensors (it has 2 names; another may be anyone's link of it) is " \
            "owned by uid %d (mode 0640, group %d), which uid %d (the owner of the model's " \
            "tree %s) may not read: " % (alice, BOB_UID, GROUP, ALICE_UID, alice) in line, line
        assert "not served" in line, line
        d.wait_for_log(r'model "mine": generation 1 warm')
        assert 'model "alice": generation 1' not in d.read_log()
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_first_comer_at_a_place_others_may_write_waits(tmp_path):
    """The operator configures a hub snapshot before its download, in a
    shared hub cache (1777, as a cache shared by several users often is).
    alice made the repo first, hers, with her own file: wcached served it
    as that model by itself, and the repo stayed hers. Where others than
    its owner may write in the directory that existed, a first comer's
    files wait for the operator's reload, with one line that says why and
    whose they are (review rev187 R5)."""
    hub = made_by(tmp_path / "hub", 0, 0o1777)
    place = os.path.join(hub, "models--o--m", "snapshots", "abc", "model.safetensors")
    mkmodel(os.path.join(hub, "a.tmp"), seed=1)
    os.chown(os.path.join(hub, "a.tmp"), ALICE_UID, GROUP)
    d = Daemon(tmp_path, {"om": (place, {"watch": "poll"})}, user=(DAEMON_UID, GROUP),
               nofile=1024).start()
    try:
        d.wait_for_log(r'model "om": .*No such file or directory')
        as_alice("mkdir -p models--o--m/snapshots/abc && mv a.tmp %s" % place, hub)
        _, line = d.wait_for_log(r'model "om": (its path .* named nothing|generation 1 from)')
        assert "its path %s named nothing at the operator's last load, and %s, the directory " \
            "above it that existed, is writable by others than its owner (uid 0, mode 1777): " \
            "the files made there since (uid %d) could be anyone's" % (place, hub, ALICE_UID) \
            in line, line
        assert "wcachectl reload om" in line, line
        assert 'model "om": generation 1' not in d.read_log()
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_first_generation_at_a_place_says_whose_files_it_took(tmp_path):
    """alice's own directory (0755): her model file made at the place the
    operator configured is taken by itself, as before, and the log says
    whose files the first generation there is (review rev187 R5)."""
    mine = made_by(tmp_path / "alice", ALICE_UID)
    place = os.path.join(mine, "m.safetensors")
    mkmodel(os.path.join(mine, "a.tmp"), seed=1)
    os.chown(os.path.join(mine, "a.tmp"), ALICE_UID, GROUP)
    d = Daemon(tmp_path, {"alice": place}, user=(DAEMON_UID, GROUP), nofile=1024).start()
    try:
        d.wait_for_log(r'model "alice": .*No such file or directory')
        as_alice("mv a.tmp m.safetensors", mine)
        d.wait_for_log(r'model "alice": generation 1 warm')
        assert 'model "alice": generation 1 is the first at %s, where the operator\'s last ' \
            'load found nothing: its files are owned by uid %d' % (place, ALICE_UID) \
            in d.read_log(), d.read_log()
    finally:
        assert d.stop() == 0, d.read_log()


# wcached's own group in the tests below: root's private model is readable
# by it (0750 root:WCACHED_GID, as a model installed for wcached only) and
# not by alice or bob.
WCACHED_GID = 64102


def roots_private_model(directory, sharded=False):
    """root's model directory only wcached may read, made at directory:
    one file, or (sharded) an index and its shard s.safetensors."""
    made_by(directory, 0, 0o750)
    os.chown(directory, 0, WCACHED_GID)
    f = mkmodel(os.path.join(directory, "model.safetensors"), layers=3, seed=2)
    if sharded:
        sharded_model(directory, f)
        f = os.path.join(directory, "s.safetensors")
    os.chown(f, 0, WCACHED_GID)
    os.chmod(f, 0o640)
    r = subprocess.run(as_user(BOB_UID, GROUP) + ["cat", f], capture_output=True)
    assert r.returncode != 0, "bob may read root's private model"
    return str(directory)


def generation_1_waits(d, name, refusal, head="its path"):
    """The watched reload waits for the operator's with one line matching
    refusal (which begins with head); generation 1 is still what an attach
    gets."""
    _, line = d.wait_for_log(r'model "%s": (%s|generation 2 is current)' % (name, head))
    assert 'model "%s": generation 2' % name not in d.read_log(), d.read_log()
    assert re.search(refusal, line), line
    assert "wcachectl reload %s" % name in line and "generation 1 still serving" in line, line
    assert "generation 1" in served(d, name)


def test_another_users_link_at_a_freed_name_waits(tmp_path):
    """The operator's model directory llama in a team's sticky place (1775,
    root's: fs.protected_symlinks does not apply); beside it root's private
    model secret. The operator removes llama to redeploy; bob, first, makes
    the name his link to secret: the same owner's tree beside the old one,
    every file root's, so root's private model was served as "llama" to its
    holders (review rev191 F1b). Nobody asked who made the link."""
    shared = made_by(tmp_path / "shared", 0, 0o1775)
    llama = made_by(os.path.join(shared, "llama"), 0)
    mkmodel(os.path.join(llama, "model.safetensors"), seed=1)
    roots_private_model(os.path.join(shared, "secret"))
    d = Daemon(tmp_path, {"llama": llama}, user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
    try:
        d.wait_for_log(r'model "llama": generation 1 warm')
        subprocess.run(["rm", "-rf", llama], check=True)
        as_bob("ln -s secret llama", shared)
        generation_1_waits(d, "llama", r"its path %s leads through the symbolic link %s \(to "
                           r"secret\) made by uid %d, in %s owned by uid 0: a link of a user "
                           r"who owns neither" % (re.escape(llama), re.escape(llama), BOB_UID,
                                                  re.escape(shared)))
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_one_file_model_does_not_swap_to_a_directory_beside_its_own(tmp_path):
    """alice's one-file model m.safetensors straight in a team's sticky
    place (root's, 1775): its tree is that place, whose owner is root, and
    the directories beside the place were its "siblings". Her own link
    renamed over her name (README's swap) to ../priv, root's private
    sharded model beside the place (no one file whose owner is asked), was
    her generation 2 (review rev191 F1)."""
    shared = made_by(tmp_path / "shared", 0, 0o1775)
    m = mkmodel(os.path.join(shared, "m.safetensors"), seed=1)
    os.chown(m, ALICE_UID, GROUP)
    priv = roots_private_model(tmp_path / "priv", sharded=True)
    d = Daemon(tmp_path, {"alice": m}, user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
    try:
        d.wait_for_log(r'model "alice": generation 1 warm')
        as_alice("ln -s ../priv .n && mv -T .n m.safetensors", shared)
        generation_1_waits(d, "alice", r"its path %s now resolves into %s \(was %s\): a moved "
                           r"tree" % (re.escape(m), re.escape(priv), re.escape(shared)))
    finally:
        assert d.stop() == 0, d.read_log()


def test_roots_file_renamed_over_a_users_name_in_a_group_writable_place_waits(tmp_path):
    """A team's place that is group-writable and not sticky (2775, root's):
    alice's one-file model m.safetensors, and beside it root's private
    model file (0640, wcached's group: wcached reads it, alice and bob do
    not). bob renames root's file over alice's name (a rename needs no
    right on the file): a file of the tree's owner with one name was taken
    by the reload wcached made by itself, as alice's generation 2 (a5ca1e6,
    review rev195 M3). It waits for the operator's reload, whose load
    refuses it too: the model is alice's, and she may not read it (M2)."""
    shared = made_by(tmp_path / "shared", 0, 0o2775)
    m = mkmodel(os.path.join(shared, "m.safetensors"), seed=1)
    os.chown(m, ALICE_UID, GROUP)
    priv = mkmodel(os.path.join(shared, "priv.safetensors"), layers=3, seed=2)
    os.chown(priv, 0, WCACHED_GID)
    os.chmod(priv, 0o640)
    d = Daemon(tmp_path, {"alice": m}, user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
    try:
        d.wait_for_log(r'model "alice": generation 1 warm')
        as_bob("mv priv.safetensors m.safetensors", shared)
        generation_1_waits(d, "alice", r"its path %s names a file now owned by uid 0 \(was "
                           r"uid %d\)" % (re.escape(m), ALICE_UID))
        r = ctl(d, "reload", "alice")
        assert r.returncode != 0, r.stdout + r.stderr
        _, line = d.wait_for_log(r'model "alice": %s is owned by uid 0' % re.escape(m))
        assert "which uid %d (the owner of the file it replaces at %s) may not read" % (
            ALICE_UID, m) in line, line
        assert 'model "alice": generation 2' not in d.read_log(), d.read_log()
        assert "generation 1" in served(d, "alice")
    finally:
        assert d.stop() == 0, d.read_log()


# Review rev199: attacks on 6f09db8 / 09727c2 (a tree renamed over, or in
# one level up, in a 2775 place while wcached restarts, or at run time; the
# owner's own swap in her private-group 0775 directory; root's link of
# another model renamed over the model's link), against the real
# unprivileged wcached (as test_tree_links_owner.py, test_reload_refused.py).

def warm_restart(tmp_path, models, name, then, while_down, before_stop=None, extra=""):
    """as test_tree_places.after_a_warm_restart, the daemon's group WCACHED_GID
    (so it may read root's private model, as in test_tree_links_owner); extra
    is more configuration text; d.manager is the fake service manager, for a
    then() that restarts it again."""
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    os.chmod(mgr.path, 0o666)
    d = Daemon(tmp_path, models, extra=extra, user=(DAEMON_UID, WCACHED_GID), nofile=1024)
    d.manager = mgr
    try:
        start(d, mgr, user=(DAEMON_UID, WCACHED_GID))
        wait_until(lambda: ready(d, name), what="ready")
        mgr.wait_for(lambda m: "wc-desc" in m.store and "wc-1-1-i" in m.store,
                     what="generation and description stored")
        if before_stop is not None:
            before_stop(d)
        assert d.stop() == 0, d.read_log()
        while_down()
        start(d, mgr, *mgr.listen_fds(), user=(DAEMON_UID, WCACHED_GID))
        _, line = d.wait_for_log(r'model "%s": (generation 1 restored from the file '
                                 r'descriptor store|not restored)' % name)
        then(d, line)
    finally:
        code = d.stop()
        mgr.close()
    assert code == 0, d.read_log()


def waits(d, secret, what, reason):
    """The watched reload that came waits for the operator with reason in its
    line; root's private secret is not served as llama (generation 1 is)."""
    _, line = d.wait_for_log(r'model "llama": (its path|.*symbolic link|generation 2 )',
                             timeout=60)
    log = d.read_log()
    assert 'model "llama": generation 2' not in log, \
        "root's private %s served as llama %s:\n%s" % (secret, what, log)
    assert reason in line and "wcachectl reload llama" in line, line
    assert "generation 1" in served(d, "llama")


def restored_then_waits(d, line, secret, when):
    """After a warm restart that restored llama's generation 1: its next
    reload through the renamed place waits for the operator (judged against
    the tree the store recorded, llama as it was: the directory at its path
    is another one, renamed in where others may rename entries: review
    rev213 H1), and root's private model (secret) is never generation 2."""
    assert "generation 1 restored" in line, d.read_log()
    _, line = d.wait_for_log(r'model "llama": (its path .*operator|generation 2 from)',
                             timeout=60)
    log = d.read_log()
    assert "another directory than the tree serving (a new inode)" in line, log
    assert 'model "llama": generation 2' not in log, \
        "root's private %s served as llama %s:\n%s" % (secret, when, log)


def test_roots_private_dir_renamed_over_in_a_2775_place_while_down_waits(tmp_path):
    """rev198 M1 at a warm restart. Team place 2775 (group-writable, not
    sticky): root's model directory llama ("llama") and root's private
    secret (bob cannot read it). While wcached restarts bob does
    `mv llama llama.old && mv secret llama`. The restore finds the stored
    files intact (at llama.old) and the path listing others: generation 1
    serves and a watched reload is queued with the tree kept at the place the
    stored file has a name now (restore_moved_tree: llama.old). llama is a
    sibling of llama.old owned by root: sibling_swap takes it, no link, the
    M1 inode check never runs (path_same false): root's private model is
    "llama" generation 2. (Since rev213 H1 the tree kept is the one the
    store recorded, llama's root inode: the M1 check refuses the new one.)"""
    shared = made_by(tmp_path / "shared", 0, 0o2775)
    llama = made_by(os.path.join(shared, "llama"), 0)
    mkmodel(os.path.join(llama, "model.safetensors"), seed=1)
    secret = roots_private_model(os.path.join(shared, "secret"))

    def then(d, line):
        restored_then_waits(d, line, secret, "after bob's renames while down")
        assert "generation 1" in served(d, "llama")
    warm_restart(tmp_path, {"llama": llama}, "llama", then,
                 lambda: as_bob("mv llama llama.old && mv secret llama", shared))


def team_beside_other(tmp_path):
    """A team place shared (2775) holding root's project directories team
    and other (0755); root's model directory team/llama, and root's private
    model at other/llama: (shared, llama, secret)."""
    shared = made_by(tmp_path / "shared", 0, 0o2775)
    team = made_by(os.path.join(shared, "team"), 0)
    llama = made_by(os.path.join(team, "llama"), 0)
    mkmodel(os.path.join(llama, "model.safetensors"), seed=1)
    other = made_by(os.path.join(shared, "other"), 0)
    secret = roots_private_model(os.path.join(other, "llama"))
    return shared, llama, secret


def test_roots_private_dir_renamed_in_one_level_up_in_a_2775_place_waits(tmp_path):
    """rev198 M1, one level up. Team place 2775 (group-writable, not
    sticky) holding root's project directories team (0755) and other
    (0755); the model "llama" is team/llama, and other/llama is root's
    private model (0750 root:wcached, bob cannot read it). bob (group
    member) does `mv team team.old && mv other team` (same-parent renames
    need only write on the place). The tree root is the same path and owner,
    another inode; but renamed_in asks only the directory holding the root
    (team, 0755: not writable by others), so same_root takes it."""
    shared, llama, secret = team_beside_other(tmp_path)
    d = Daemon(tmp_path, {"llama": llama}, user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
    try:
        d.wait_for_log(r'model "llama": generation 1 warm')
        as_bob("mv team team.old && mv other team", shared)
        # No event in the watched directories (they moved with team); the
        # operator's cleanup of the stray team.old is one (any event there,
        # or a later update inside it, does the same).
        subprocess.run(["rm", "-rf", os.path.join(shared, "team.old")], check=True)
        waits(d, secret, "after bob's renames one level up", "goes through the directory")
    finally:
        assert d.stop() == 0, d.read_log()


def test_renamed_over_at_run_time_refused_then_served_after_a_warm_restart(tmp_path):
    """H1 without timing: bob's renames at run time are refused (6f09db8's
    renamed_in, waits for the operator); the refusal is not stored, and the
    next warm restart (an upgrade) serves root's private model as llama."""
    shared = made_by(tmp_path / "shared", 0, 0o2775)
    llama = made_by(os.path.join(shared, "llama"), 0)
    mkmodel(os.path.join(llama, "model.safetensors"), seed=1)
    secret = roots_private_model(os.path.join(shared, "secret"))

    def renames(d):
        as_bob("mv llama llama.old && mv secret llama", shared)
        _, line = d.wait_for_log(r'model "llama": (its path .*operator|generation 2 from)')
        assert "another directory than the tree serving" in line, d.read_log()

    def then(d, line):
        restored_then_waits(d, line, secret, "at the restart after a refusal")
    warm_restart(tmp_path, {"llama": llama}, "llama", then, lambda: None, before_stop=renames)


def private_group_user():
    """A user of the database (not root) whose primary group is hers alone:
    known to the group database by her name, no other member listed, no
    other user's primary group (the user-private-group scheme); None if
    there is none."""
    import grp
    import pwd
    users = pwd.getpwall()
    for p in users:
        try:
            g = grp.getgrgid(p.pw_gid)
        except KeyError:
            continue
        if p.pw_uid != 0 and g.gr_name == p.pw_name and \
                not [m for m in g.gr_mem if m != p.pw_name] and \
                [u.pw_uid for u in users if u.pw_gid == p.pw_gid] == [p.pw_uid]:
            return p.pw_uid, p.pw_gid
    return None


def private_group_home(tmp_path):
    """(uid, gid, home): a user of private_group_user's, and her directory
    tmp_path/alice, 0775 and of her private group; skips the test where
    the user database has no such user."""
    found = private_group_user()
    if found is None:
        pytest.skip("no user with a private group in this user database")
    uid, gid = found
    home = made_by(tmp_path / "alice", uid, 0o775)
    os.chown(home, uid, gid)
    return uid, gid, home


def test_owners_own_swap_in_her_private_group_0775_dir_loads(tmp_path):
    """L1 (legit flow). A user's own directory, 0775 with her private group
    (the user-private-group scheme: umask 002 on RHEL/Fedora, Debian's
    pam_umask usergroups; no one else is in the group). Her own
    `mv llama llama.old && mv llama.new llama` (README's directory
    replacement) loads by itself: a group-writable directory whose group
    holds no one else is no place others may rename in. (A group the user
    database does not know is not taken as private: this file's bob holds
    such a gid.)"""
    from ctlutil import as_user
    uid, gid, home = private_group_home(tmp_path)
    for name, seed in (("llama", 1), ("llama.new", 3)):
        dd = made_by(os.path.join(home, name), uid, 0o775)
        os.chown(dd, uid, gid)
        f = mkmodel(os.path.join(dd, "model.safetensors"), seed=seed)
        os.chown(f, uid, gid)
    llama = os.path.join(home, "llama")
    d = Daemon(tmp_path, {"llama": llama}, user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
    try:
        d.wait_for_log(r'model "llama": generation 1 warm')
        subprocess.run(as_user(str(uid), str(gid)) +
                       ["/bin/sh", "-ec", "mv llama llama.old && mv llama.new llama"],
                       cwd=home, check=True)
        _, line = d.wait_for_log(r'model "llama": (its path|generation 2 from)', timeout=60)
        assert "generation 2 from" in line, \
            "the owner's own update in her own directory waits:\n" + d.read_log()
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_file_renamed_over_hers_by_a_user_her_acl_lets_write_waits(tmp_path):
    """Review rev201 M1. A user's own directory, 0775 with her private
    group, which `setfacl -m u:bob:rwx` shares with bob: the mode's group
    bits show only the ACL's mask, and the directory counted as one no one
    but her may write in. Her one-file model m.safetensors, and beside it
    her private model (0640, wcached's group: bob may not read it). bob
    renames her private file over m.safetensors (a rename needs no right
    on the file): the same owner's file, taken by wcached's own reload as
    her generation 2. It waits for the operator's reload: a directory whose
    ACL lets a named user write counts as one all may write in (the ACL is
    set with setxattr, as setfacl writes it: 8-byte entries after a
    version 2 header)."""
    import struct
    uid, gid, home = private_group_home(tmp_path)
    entries = [(0x01, 7, 0xffffffff), (0x02, 7, BOB_UID), (0x04, 5, 0xffffffff),
               (0x10, 7, 0xffffffff), (0x20, 5, 0xffffffff)]
    try:
        os.setxattr(home, "system.posix_acl_access", struct.pack("<I", 2) +
                    b"".join(struct.pack("<HHI", *e) for e in entries))
    except OSError as e:
        pytest.skip(f"no ACLs here: {e}")
    m = mkmodel(os.path.join(home, "m.safetensors"), seed=1)
    os.chown(m, uid, gid)
    priv = mkmodel(os.path.join(home, "priv.safetensors"), layers=3, seed=2)
    os.chown(priv, uid, WCACHED_GID)
    os.chmod(priv, 0o640)
    r = subprocess.run(as_user(BOB_UID, GROUP) + ["cat", priv], capture_output=True)
    assert r.returncode != 0, "bob may read her private model"
    d = Daemon(tmp_path, {"m": m}, user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
    try:
        d.wait_for_log(r'model "m": generation 1 warm')
        as_bob("mv priv.safetensors m.safetensors", home)
        generation_1_waits(d, "m", r"its file %s is not one of the files serving .* in a "
                           r"directory others than its owner \(uid %d, mode 0777\) may rename "
                           r"entries in" % (re.escape(m), uid), head="its file")
    finally:
        assert d.stop() == 0, d.read_log()


def test_roots_link_of_another_model_renamed_over_the_models_link_in_a_2775_place_waits(tmp_path):
    """M2. README's directory swap by link, for two of root's models in a
    team place 2775 (group-writable, not sticky): llama -> llama-v2 (model
    "llama") and secret -> secret-v1 (root's private model, bob cannot read
    it). bob renames root's link over root's link: `mv -T secret llama`. The
    walk meets a link made by root (uid 0: approved wherever it lies, not
    bound to its name), it leads to secret-v1, a sibling of llama-v2 owned by
    root (sibling_swap); renamed_in is asked only for the same path."""
    shared = made_by(tmp_path / "shared", 0, 0o2775)
    v2 = made_by(os.path.join(shared, "llama-v2"), 0)
    mkmodel(os.path.join(v2, "model.safetensors"), seed=1)
    os.symlink("llama-v2", os.path.join(shared, "llama"))
    os.lchown(os.path.join(shared, "llama"), 0, 0)
    secret = roots_private_model(os.path.join(shared, "secret-v1"))
    os.symlink("secret-v1", os.path.join(shared, "secret"))
    path = os.path.join(shared, "llama")
    d = Daemon(tmp_path, {"llama": path}, user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
    try:
        d.wait_for_log(r'model "llama": generation 1 warm')
        as_bob("mv -T secret llama", shared)
        waits(d, secret, "after bob renamed root's link", "goes through the symbolic link")
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_removed_directory_made_again_empty_then_filled_loads(tmp_path):
    """f475dd8's slow redeploy, one step slower: `rm -rf llama && mkdir
    llama`, the watched reload fails (no such file; the directory is there,
    so not polled), then the new model is renamed into the new llama."""
    shared = made_by(tmp_path / "shared", 0, 0o1775)
    llama = made_by(os.path.join(shared, "llama"), 0)
    f = mkmodel(os.path.join(llama, "model.safetensors"), seed=1)
    d = Daemon(tmp_path, {"llama": f}, user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
    try:
        d.wait_for_log(r'model "llama": generation 1 warm')
        subprocess.run(["rm", "-rf", llama], check=True)
        made_by(llama, 0)
        d.wait_for_log(r'error: model "llama": .*No such file or directory')
        tmp = mkmodel(os.path.join(llama, ".tmp"), seed=2, layers=3)
        size = os.path.getsize(tmp)
        os.rename(tmp, f)
        d.wait_for_log(r'model "llama": generation 2 from .*: 1 file, %d bytes' % size,
                       timeout=60)
        # Loaded, then current once warm (generation 1 serves meanwhile).
        d.wait_for_log(r'model "llama": generation 2 is current \(was 1\)')
        assert "generation 2" in served(d, "llama")
    finally:
        assert d.stop() == 0, d.read_log()


def test_roots_private_dir_renamed_in_one_level_up_polled_waits(tmp_path):
    """M1 with watch = poll (a model on NFS, or a filesystem inotify does not
    see): no other event needed, the poll of the path sees the new files."""
    shared, llama, secret = team_beside_other(tmp_path)
    d = Daemon(tmp_path, {"llama": (llama, {"watch": "poll", "poll_interval": "0.5"})},
               user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
    try:
        d.wait_for_log(r'model "llama": generation 1 warm')
        as_bob("mv team team.old && mv other team", shared)
        waits(d, secret, "(polled)", "goes through the directory")
    finally:
        assert d.stop() == 0, d.read_log()


def test_roots_update_inside_the_tree_in_a_2775_place_loads(tmp_path):
    """The legit flow beside H1-H3: in a 2775 place, root's update inside the
    tree the generation serving was loaded from (a new file renamed over the
    old one in llama) loads by itself: every directory on the path is the
    one the operator's load went through (its walk recorded them)."""
    shared = made_by(tmp_path / "shared", 0, 0o2775)
    team = made_by(os.path.join(shared, "team"), 0, 0o2775)
    llama = made_by(os.path.join(team, "llama"), 0)
    f = mkmodel(os.path.join(llama, "model.safetensors"), seed=1)
    d = Daemon(tmp_path, {"llama": llama}, user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
    try:
        d.wait_for_log(r'model "llama": generation 1 warm')
        tmp = mkmodel(os.path.join(llama, ".tmp"), seed=2, layers=3)
        size = os.path.getsize(tmp)
        os.rename(tmp, f)
        _, line = d.wait_for_log(r'model "llama": (its path|generation 2 from)', timeout=60)
        assert "generation 2 from" in line and "%d bytes" % size in line, d.read_log()
    finally:
        assert d.stop() == 0, d.read_log()
