"""Review rev199: attacks on 6f09db8 / 09727c2 against the real unprivileged
wcached (as test_tree_links_owner.py, test_reload_refused.py)."""
import os
import subprocess

from conftest import Daemon, mkmodel, wait_until
from test_warm_restart import ready, start
from test_tree_places import (DAEMON_UID, FakeManager, WCACHED_GID, as_bob, made_by, pytestmark,
                              roots_private_model, served)

__all__ = ["pytestmark"]


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
    reload through the renamed place waits for the operator (the line names
    the directory), and root's private model (secret) is never generation 2."""
    assert "generation 1 restored" in line, d.read_log()
    _, line = d.wait_for_log(r'model "llama": (its path .*operator|generation 2 from)',
                             timeout=60)
    log = d.read_log()
    assert "goes through the directory" in line, log
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
    "llama" generation 2."""
    shared = made_by(tmp_path / "shared", 0, 0o2775)
    llama = made_by(os.path.join(shared, "llama"), 0)
    mkmodel(os.path.join(llama, "model.safetensors"), seed=1)
    secret = roots_private_model(os.path.join(shared, "secret"))

    def then(d, line):
        restored_then_waits(d, line, secret, "after bob's renames while down")
        assert "generation 1" in served(d, "llama")
    warm_restart(tmp_path, {"llama": llama}, "llama", then,
                 lambda: as_bob("mv llama llama.old && mv secret llama", shared))


def test_roots_private_dir_renamed_in_one_level_up_in_a_2775_place_waits(tmp_path):
    """rev198 M1, one level up. Team place 2775 (group-writable, not
    sticky) holding root's project directories team (0755) and other
    (0755); the model "llama" is team/llama, and other/llama is root's
    private model (0750 root:wcached, bob cannot read it). bob (group
    member) does `mv team team.old && mv other team` (same-parent renames
    need only write on the place). The tree root is the same path and owner,
    another inode; but renamed_in asks only the directory holding the root
    (team, 0755: not writable by others), so same_root takes it."""
    shared = made_by(tmp_path / "shared", 0, 0o2775)
    team = made_by(os.path.join(shared, "team"), 0)
    llama = made_by(os.path.join(team, "llama"), 0)
    mkmodel(os.path.join(llama, "model.safetensors"), seed=1)
    other = made_by(os.path.join(shared, "other"), 0)
    secret = roots_private_model(os.path.join(other, "llama"))
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


def test_owners_own_swap_in_her_private_group_0775_dir_loads(tmp_path):
    """L1 (legit flow). A user's own directory, 0775 with her private group
    (the user-private-group scheme: umask 002 on RHEL/Fedora, Debian's
    pam_umask usergroups; no one else is in the group). Her own
    `mv llama llama.old && mv llama.new llama` (README's directory
    replacement) loads by itself: a group-writable directory whose group
    holds no one else is no place others may rename in. (A group the user
    database does not know is not taken as private: test_rev199's bob holds
    such a gid.)"""
    import pytest
    from ctlutil import as_user
    found = private_group_user()
    if found is None:
        pytest.skip("no user with a private group in this user database")
    uid, gid = found
    home = made_by(tmp_path / "alice", uid, 0o775)
    os.chown(home, uid, gid)
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
    shared = made_by(tmp_path / "shared", 0, 0o2775)
    team = made_by(os.path.join(shared, "team"), 0)
    llama = made_by(os.path.join(team, "llama"), 0)
    mkmodel(os.path.join(llama, "model.safetensors"), seed=1)
    other = made_by(os.path.join(shared, "other"), 0)
    secret = roots_private_model(os.path.join(other, "llama"))
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
