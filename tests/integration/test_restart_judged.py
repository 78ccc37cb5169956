"""A warm restart's own loads are wcached's, never the operator's word
(review rev204 H2; H3's tests end this file): a model the restart
could not restore is loaded as a reload wcached makes by itself, judged
against the tree the file descriptor store recorded for it (format version
9): the tree its stored generation was loaded from. What the model's own
deployer put at its path while wcached was down (his link to root's
private model) waits for the operator's `wcachectl reload NAME`; the
deployer's own update in his tree loads as before. Run as root (wcached
and the neighbours run as other users)."""
import contextlib
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import Daemon, binary, mkmodel, wait_until
from ctlutil import ctl, model_entry
from fusehang import HangFS, blocked_in_fuse, neighbours_place
from remotefs import RemoteFS  # tests/pyutil, on the path conftest set
from test_reload_refused import REMOTE, SECRET_BYTES, remote_place, secret_never_served
from test_tree_places import (ALICE_UID, BOB_UID, DAEMON_UID, GROUP, WCACHED_GID, FakeManager,
                              alices_file_in_a_shared_place, as_alice, as_bob, made_by,
                              roots_private_model)
from test_tree_places import warm_restart as tp_warm_restart
from test_warm_restart import (ready, sealed_memfd, start, stopped_after,
                               write_in_place_keeping_mtime)

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root to run wcached and clients as other users")

USER = (DAEMON_UID, WCACHED_GID)


def restart_with(tmp_path, models, started, while_down, max_fds=None):
    """Starts wcached under a fake service manager (with room for max_fds
    descriptors, or any), runs started(d, mgr) once the description is
    stored, stops it, runs while_down(), starts it again warm and returns
    (d, mgr) (the caller stops both)."""
    mgr = FakeManager(str(tmp_path / "notify.sock"), max_fds=max_fds)
    os.chmod(mgr.path, 0o666)
    d = Daemon(tmp_path, models, user=USER, nofile=1024)
    start(d, mgr, user=USER)
    started(d, mgr)
    assert d.stop() == 0, d.read_log()
    while_down()
    time.sleep(0.3)
    start(d, mgr, *mgr.listen_fds(), user=USER)
    return d, mgr


def waits_then_operator_loads(d, what):
    """llama's restart load waited for the operator: nothing of root's
    private model served, status says waits_for_reload, a config reload that
    changes nothing leaves it, and her `wcachectl reload llama` loads what
    the path names now (her word)."""
    _, line = d.wait_for_log(r'model "llama": (its path .*wcachectl reload llama|'
                             r'generation \d+ from)', timeout=60)
    time.sleep(2)   # anything wcached would load by itself comes meanwhile
    secret_never_served(d, what)
    assert "wcachectl reload llama" in line, d.read_log()
    assert "waits_for_reload" in model_entry(d, "llama"), model_entry(d, "llama")
    ctl(d, "reload")
    time.sleep(2)
    secret_never_served(d, what + ", then a config reload")
    r = ctl(d, "reload", "llama")
    assert r.returncode == 0, r.stdout + r.stderr
    d.wait_for_log(r'model "llama": generation \d+ from .*%d bytes' % SECRET_BYTES,
                   timeout=60)
    assert "waits_for_reload" not in model_entry(d, "llama")
    print(d.read_log())


def bobs_home_model(tmp_path):
    """bob's model directory llama in his home (0755, his): the path."""
    home = made_by(tmp_path / "home", 0, 0o755)
    bobs = os.path.join(home, "bob")
    os.makedirs(bobs)
    os.chown(bobs, BOB_UID, GROUP)
    os.chmod(bobs, 0o755)
    as_bob("mkdir llama", bobs)
    llama = os.path.join(bobs, "llama")
    f = mkmodel(os.path.join(llama, "model.safetensors"), seed=1)
    os.chown(f, BOB_UID, GROUP)
    return bobs, llama


def stored(d, mgr):
    wait_until(lambda: ready(d, "llama"), what="ready")
    mgr.wait_for(lambda m: "wc-desc" in m.store and "wc-1-1-i" in m.store,
                 what="generation and description stored")


def restart_stored(tmp_path, models, while_down, until=stored, max_fds=None):
    """restart_with once until(d, mgr) has returned (by default llama's
    generation and description stored), while_down(mgr) given the fake
    service manager (to rewrite its store: untreed)."""
    mgrs = []

    def started(d, mgr):
        until(d, mgr)
        mgrs.append(mgr)
    return restart_with(tmp_path, models, started, lambda: while_down(mgrs[0]), max_fds)


def test_a_deployers_link_to_roots_private_model_at_a_warm_restart_waits(tmp_path):
    """rev204 H2: the deployer bob owns llama's directory and the one
    holding it (home/bob, 0755: no place others may rename entries in).
    While wcached restarts he moves his file's ctime (renames it to and
    fro: the check fails) and puts at llama his link to root's private
    model directory. The restart's load is judged against the tree the
    stored generation was loaded from (home/bob/llama): the link leads out
    of it, so it waits for the operator's reload."""
    bobs, llama = bobs_home_model(tmp_path)
    priv = made_by(tmp_path / "priv", 0, 0o755)
    secret = os.path.join(priv, "secret")
    roots_private_model(secret)

    def while_down():
        as_bob("mv llama/model.safetensors llama/x && mv llama/x llama/model.safetensors && "
               "mv llama llama.old && ln -s %s llama" % secret, bobs)
    d, mgr = restart_with(tmp_path, {"llama": llama}, stored, while_down)
    try:
        waits_then_operator_loads(d, "after a warm restart")
        assert re.search(r'model "llama": not restored: .*as a reload wcached makes by '
                         r'itself', d.read_log()), d.read_log()
    finally:
        status = d.stop()
        mgr.close()
    assert status == 0, d.read_log()   # the restarted process: ASan's leak report fails it


def test_the_deployers_own_update_at_a_warm_restart_loads(tmp_path):
    """Control: bob replaces his own file in his own tree while wcached
    restarts (the check fails: another inode): the restart's judged load
    takes it (same tree, same owner), as generation 2."""
    bobs, llama = bobs_home_model(tmp_path)

    def while_down():
        f = mkmodel(os.path.join(bobs, "new.tmp"), layers=3, seed=3)
        os.chown(f, BOB_UID, GROUP)
        as_bob("mv new.tmp llama/model.safetensors", bobs)
    d, mgr = restart_with(tmp_path, {"llama": llama}, stored, while_down)
    try:
        _, line = d.wait_for_log(r'model "llama": (generation 2 from|its path)', timeout=60)
        assert "generation 2 from" in line, d.read_log()
        assert "waits_for_reload" not in model_entry(d, "llama")
    finally:
        status = d.stop()
        mgr.close()
    assert status == 0, d.read_log()


# A warm restart of a model the previous process described with no current
# generation (its load had failed, or its remote generation was gone:
# review rev204 H3) is judged too, and waits for the operator's `wcachectl
# reload NAME` where its path goes through a place others may rename
# entries in; in a private place it loads as before.

def warm_restart_waits(d, mgr):
    """wcached (with its fake manager) restarts warm; llama, described with
    no current generation, is loaded as a reload wcached makes by itself,
    judged against the tree or place the store recorded (review rev204 H3),
    and refused: status says it waits, root's private model is not served,
    and the operator's `wcachectl reload llama` is her word on what the
    path names."""
    start(d, mgr, *mgr.listen_fds(), user=(DAEMON_UID, WCACHED_GID))
    _, line = d.wait_for_log(r'model "llama": (generation \d+ from|not restored|not in the file)')
    assert re.search(r"not restored: no current generation was stored \(.*\); loading it as a "
                     r"reload wcached makes by itself, judged against the (tree|place) ", line), line
    _, line = d.wait_for_log(r'model "llama": (generation \d+ from|its path .*'
                             r'wcachectl reload llama)')
    assert "served only after the operator's `wcachectl reload llama`" in line, line
    time.sleep(2)   # anything wcached would load by itself comes meanwhile
    secret_never_served(d, "by a warm restart")
    assert "waits_for_reload" in model_entry(d, "llama")
    r = ctl(d, "reload", "llama")
    assert r.returncode == 0, r.stdout + r.stderr
    d.wait_for_log(r'model "llama": generation \d+ from .*: 1 file, 275384 bytes')
    assert "waits_for_reload" not in model_entry(d, "llama")


@contextlib.contextmanager
def failed_at_start_then_stopped(tmp_path, llama):
    """wcached (with a fake service manager) started on llama, whose load
    fails (No such file or directory), its description stored, stopped.
    Gives (the stopped daemon, its manager)."""
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    os.chmod(mgr.path, 0o666)
    d = Daemon(tmp_path, {"llama": llama}, user=(DAEMON_UID, WCACHED_GID), nofile=1024)
    try:
        start(d, mgr, user=(DAEMON_UID, WCACHED_GID))
        d.wait_for_log(r'model "llama": .*No such file or directory')
        mgr.wait_for(lambda m: "wc-desc" in m.store, what="description stored")
        assert d.stop() == 0, d.read_log()
        yield d, mgr
    finally:
        code = d.stop()
        mgr.close()
    assert code == 0, d.read_log()   # the restarted process: ASan's leak report fails it


def test_a_model_nothing_serves_is_not_loaded_as_the_operators_by_a_warm_restart(tmp_path):
    """shared (2775) holds root's model directory llama and root's private
    secret. bob renames llama aside before wcached starts: its load fails,
    nothing serves it, and the store describes it with no generation and no
    wait. While wcached restarts warm, bob renames secret at llama: the
    restart loaded the path as the operator's load ("no current generation
    was stored; loading"), unjudged, and served root's private model."""
    shared = made_by(tmp_path / "shared", 0, 0o2775)
    llama = made_by(os.path.join(shared, "llama"), 0)
    mkmodel(os.path.join(llama, "model.safetensors"), seed=1)
    roots_private_model(os.path.join(shared, "secret"))
    as_bob("mv llama llama.x", shared)
    with failed_at_start_then_stopped(tmp_path, llama) as (d, mgr):
        as_bob("mv secret llama", shared)
        warm_restart_waits(d, mgr)


def test_a_model_nothing_serves_in_a_private_place_loads_at_a_warm_restart(tmp_path):
    """Control: in root's own 0755 directory llama's load at start fails
    (not there yet); the operator puts it there and wcached restarts warm:
    it loads, as before."""
    llama = os.path.join(made_by(tmp_path / "srv", 0), "llama")
    with failed_at_start_then_stopped(tmp_path, llama) as (d, mgr):
        made_by(llama, 0)
        mkmodel(os.path.join(llama, "model.safetensors"), seed=1)
        start(d, mgr, *mgr.listen_fds(), user=(DAEMON_UID, WCACHED_GID))
        d.wait_for_log(r'model "llama": not restored: no current generation was stored '
                       r'\(.*\); loading')
        wait_until(lambda: ready(d, "llama"), what="llama ready")
        assert "waits_for_reload" not in model_entry(d, "llama")


@contextlib.contextmanager
def gone_then_renamed_while_down(tmp_path):
    """rev203 H3's layout (remote 2775 place, stage = no, polled), served;
    bob removes llama's file, the poll finds generation 1 gone (failed: not
    stored), wcached stops, and bob renames root's private secret at llama.
    Gives (the stopped daemon, its fake manager, the remote filesystem)."""
    backing, mnt, shared = remote_place(tmp_path)
    llama = made_by(os.path.join(shared, "llama"), 0, 0o2775)
    mkmodel(os.path.join(llama, "model.safetensors"), seed=1)
    roots_private_model(os.path.join(shared, "secret"))
    with RemoteFS(backing, mnt, attr_timeout=0.1) as fs:
        mgr = FakeManager(str(tmp_path / "notify.sock"))
        os.chmod(mgr.path, 0o666)
        d = Daemon(tmp_path / "d", {"llama": (str(mnt / "shared" / "llama"), REMOTE)},
                   user=(DAEMON_UID, WCACHED_GID), nofile=1024)
        try:
            start(d, mgr, user=(DAEMON_UID, WCACHED_GID))
            wait_until(lambda: ready(d, "llama"), what="ready")
            as_bob("rm llama/model.safetensors", shared)
            d.wait_for_log(r"model \"llama\": generation 1's files were replaced or removed",
                           timeout=60)
            mgr.wait_for(lambda m: "wc-desc" in m.store and "wc-1-1-i" not in m.store,
                         what="generation 1 dropped from the store")
            assert d.stop() == 0, d.read_log()
            as_bob("mv llama llama.x && mv secret llama", shared)
            time.sleep(0.3)     # the mount's attribute cache (attr_timeout)
            yield d, mgr, fs
        finally:
            code = d.stop()
            mgr.close()
    assert code == 0, d.read_log()   # the restarted process: ASan's leak report fails it


def test_a_gone_remote_generation_is_not_loaded_as_the_operators_by_a_warm_restart(tmp_path):
    """While wcached restarts warm, bob renames root's private secret at
    llama, whose remote generation was gone: the restart loaded it as the
    operator's load."""
    with gone_then_renamed_while_down(tmp_path) as (d, mgr, fs):
        warm_restart_waits(d, mgr)


def test_the_operators_reload_while_a_restart_judges_the_path_is_not_lost(tmp_path):
    """The same; the server hangs while the restart judges llama's path,
    and the operator runs `wcachectl reload llama` meanwhile (answered: a
    load is already in progress). Once the server answers the model waits,
    and her reload, her word on what the path names, still runs."""
    with gone_then_renamed_while_down(tmp_path) as (d, mgr, fs):
        fs.freeze()
        try:
            start(d, mgr, *mgr.listen_fds(), user=(DAEMON_UID, WCACHED_GID))
            r = ctl(d, "reload", "llama")
            assert "already in progress" in r.stdout + r.stderr, r
        finally:
            fs.thaw()
        d.wait_for_log(r'model "llama": not restored: no current generation was stored \(')
        d.wait_for_log(r'model "llama": generation \d+ from .*: 1 file, 275384 bytes')


def alices_moves_and_bobs_file(shared):
    """alice renames her one-file model aside (keeping it while she
    redeploys: the same inode, its ctime moved, so a warm restart's check
    fails) and bob renames his file at its freed name in the sticky place."""
    as_alice("mv m.safetensors m.old", shared)
    as_bob("mv b.tmp m.safetensors", shared)


def alice_stored(d, mgr):
    wait_until(lambda: ready(d, "alice"), what="alice ready")
    mgr.wait_for(lambda m: "wc-desc" in m.store, what="the description stored")


def bobs_file_never_served(d, m):
    """alice's load waited for the operator: bob's file (now at m) was not
    served as her generation 2, and status says she waits."""
    _, line = d.wait_for_log(r'model "alice": (generation 2 from|its path .* names a file now '
                             r'owned|its files .* lie in|.*wcachectl reload alice)', timeout=60)
    time.sleep(2)   # anything wcached would load by itself comes meanwhile
    log = d.read_log()
    assert os.stat(m).st_uid == BOB_UID
    assert not re.search(r'model "alice": generation 2 from', log), \
        "bob's file served as alice's generation 2 after a warm restart:\n" + log
    assert "waits_for_reload" in model_entry(d, "alice"), model_entry(d, "alice")
    return line


def test_a_neighbours_file_at_a_one_file_models_name_in_a_shared_place_at_a_restart_waits(
        tmp_path):
    """alice's model is one file straight in a sticky place (1777, root's:
    its tree). While wcached restarts she renames her file aside and bob
    renames his at its name: the check fails, and the restart's judged load
    keeps, as a watched reload would, the owner of the file it served
    (alice's, told by its stored descriptor), so bob's file waits for
    `wcachectl reload alice`. Before, it kept the tree's root and owner only
    and served bob's file as alice's generation 2 (review rev206 H1)."""
    shared, m = alices_file_in_a_shared_place(tmp_path)
    d, mgr = restart_with(tmp_path, {"alice": m}, lambda d, mgr: (
        alice_stored(d, mgr), mgr.wait_for(lambda s: "wc-1-1-i" in s.store,
                                           what="alice's generation stored")),
        lambda: alices_moves_and_bobs_file(shared))
    try:
        line = bobs_file_never_served(d, m)
        assert "names a file now owned by uid %d (was uid %d)" % (BOB_UID, ALICE_UID) in line, \
            d.read_log()
    finally:
        status = d.stop()
        mgr.close()
    assert status == 0, d.read_log()


@pytest.mark.parametrize("store", ["10", "9"])
def test_a_neighbours_file_at_the_name_of_a_model_stored_without_its_generation_waits(
        tmp_path, store):
    """The same, with no room in the store for alice's generation (a unit's
    FileDescriptorStoreMax= of 2: the status page and the description): the
    description (format version 10) records the owner and inode of the file
    it served, and the restart's judged load keeps them as a stored
    descriptor's, so bob's file waits for `wcachectl reload alice` as above.
    From a version 9 store (the upgrade's), which records none, it waits
    where others may write in the directory holding the files, the restart
    unable to tell whose the file it served was (review rev209 M1). Before
    either, bob's file was served."""
    shared, m = alices_file_in_a_shared_place(tmp_path)

    def while_down(mgr):
        if store == "9":
            untreed(mgr, "9")
        alices_moves_and_bobs_file(shared)
    d, mgr = restart_stored(tmp_path, {"alice": m}, while_down, alice_stored, max_fds=2)
    try:
        assert not any(k.endswith("-i") for k in mgr.store), sorted(mgr.store)
        line = bobs_file_never_served(d, m)
        assert ("names a file now owned by uid %d (was uid %d)" % (BOB_UID, ALICE_UID)
                if store == "10" else
                "the warm restart could not tell whose the files it served") in line, \
            d.read_log()
    finally:
        status = d.stop()
        mgr.close()
    assert status == 0, d.read_log()


def test_a_neighbours_file_at_a_one_file_models_name_while_wcached_runs_waits(tmp_path):
    """Control for the two above: the same two moves with wcached running
    wait for the operator (same_file_owner, review rev187 R2b)."""
    shared, m = alices_file_in_a_shared_place(tmp_path)
    d = Daemon(tmp_path, {"alice": m}, user=USER, nofile=1024).start()
    try:
        d.wait_for_log(r'model "alice": generation 1 warm')
        alices_moves_and_bobs_file(shared)
        d.wait_for_log(r'model "alice": its path .* names a file now owned by uid %d' % BOB_UID)
        time.sleep(1)
        assert 'model "alice": generation 2' not in d.read_log()
    finally:
        assert d.stop() == 0, d.read_log()


@pytest.mark.parametrize("store", ["10", "9"])
def test_a_model_the_store_had_no_room_for_loads_at_a_restart_or_says_why(tmp_path, store):
    """alice's one-file model straight in a sticky place, a store with no
    room for its generation (FileDescriptorStoreMax= of 2: the status page
    and the description), nothing changed while wcached restarts: the
    description (format version 10) records the owner and inode of the file
    it served, and the restart's judged load, keeping them, loads that very
    file again (generation 2). Before, with no descriptor to tell whose the
    file it served was, it waited for `wcachectl reload alice` after every
    such restart (review rev209 M1); from a version 9 store (the upgrade's)
    it still does, failing closed, and its lines name the store's room as
    the cause and the remedy, as the stop's warning does."""
    def stored_without_its_generation(d, mgr):
        alice_stored(d, mgr)
        _, line = d.wait_for_log(r'not stored: models left out whole: "alice"', timeout=60)
        assert re.search(r'; .*a model left out whole loads as a reload wcached makes by '
                         r'itself, judged against the tree and files the description records'
                         r'.*raise FileDescriptorStoreMax= in the unit', line), line

    shared, m = alices_file_in_a_shared_place(tmp_path)
    d, mgr = restart_stored(tmp_path, {"alice": m},
                            lambda mgr: untreed(mgr, "9") if store == "9" else None,
                            stored_without_its_generation, max_fds=2)
    try:
        _, line = d.wait_for_log(r'model "alice": not restored', timeout=60)
        assert "the file descriptor store had no room for its descriptors: raise " \
            "FileDescriptorStoreMax= in the unit" in line, line
        assert (" and the owners of the files it served" in line) == (store == "10"), line
        _, line = d.wait_for_log(r'model "alice": (generation \d+ from|its files .* lie in'
                                 r'|.*wcachectl reload alice)', timeout=60)
        assert os.stat(m).st_uid == ALICE_UID
        if store == "10":
            assert "generation 2 from %s: 1 file, %d bytes" % (m, os.stat(m).st_size) in line, \
                d.read_log()
            wait_until(lambda: "generation 2" in d.attach("alice").stdout,
                       what="alice's generation 2 served")
            return
        assert "if the file descriptor store had no room for its generation's descriptors, " \
            "raise FileDescriptorStoreMax= in the unit" in line, line
        assert "waits_for_reload" in model_entry(d, "alice"), model_entry(d, "alice")
        assert os.stat(m).st_uid == ALICE_UID
    finally:
        status = d.stop()
        mgr.close()
    assert status == 0, d.read_log()


def alices_file_in_a_team_place(tmp_path):
    """alice's one-file model m.safetensors straight in team/ (root's,
    2775: its group may rename entries in it): (team, the path)."""
    team = made_by(tmp_path / "team", 0, 0o2775)
    os.chown(team, 0, GROUP)
    os.chmod(team, 0o2775)
    m = mkmodel(os.path.join(team, "m.safetensors"), seed=1)
    os.chown(m, ALICE_UID, GROUP)
    return team, m


def alices_private_file(tmp_path):
    """alice's one-file model m.safetensors in her own directory: (the
    directory, the path)."""
    place = made_by(tmp_path / "alice", ALICE_UID)
    m = mkmodel(os.path.join(place, "m.safetensors"), seed=1)
    os.chown(m, ALICE_UID, GROUP)
    return place, m


def seed2_bytes(tmp_path):
    """A seed-2 model's bytes, of the size of alice's (seed 1)."""
    with open(mkmodel(tmp_path / "seed2.safetensors", seed=2), "rb") as f:
        return f.read()


def alice_stored_1(d, mgr):
    alice_stored(d, mgr)
    mgr.wait_for(lambda s: "wc-1-1-i" in s.store, what="generation 1 stored")


@pytest.mark.parametrize("written", [False, True], ids=["linked", "linked+written"])
@pytest.mark.parametrize("where", ["private", "team"])
def test_a_link_made_while_down_is_loaded_again_at_the_restart(tmp_path, where, written):
    """review rev222 M2 across a restart: alice's file, its generation
    stored, gets a second name while wcached is down (and is written in
    place at its size, a new header and data, its mtime put back). Its
    ctime moved with its link count, which cannot be told from a write:
    generation 1 is restored, and its files are loaded again, validated
    anew, with no wait for the operator (the restored generation's own
    files, proved by the held descriptors), in her own directory and in a
    team place (2775) alike: the same index keeps generation 1 serving; a
    new header serves as generation 2, its bytes checked by a worker.
    Before, generation 1 was restored "not read again", serving a header
    no load read."""
    if where == "team":
        place, m = alices_file_in_a_team_place(tmp_path)
    else:
        place, m = alices_private_file(tmp_path)
    data = seed2_bytes(tmp_path)

    def linked_while_down(mgr):
        st = os.stat(m)
        time.sleep(0.05)   # a ctime of a later clock tick than the stored one
        os.link(m, os.path.join(place, "m.second"))
        if written:
            assert len(data) == st.st_size
            with open(m, "r+b") as f:
                f.write(data)
            os.utime(m, ns=(st.st_atime_ns, st.st_mtime_ns))

    d, mgr = restart_stored(tmp_path, {"alice": m}, linked_while_down, alice_stored_1)
    with stopped_after(d, mgr):
        d.wait_for_log(r'model "alice": generation 1 restored from the file descriptor store, '
                       r'but m\.safetensors was linked or unlinked while wcached was down',
                       timeout=60)
        if written:
            d.wait_for_log(r'model "alice": generation 2 is current', timeout=60)
            r = subprocess.run([binary("demo_worker"), "--socket", d.socket, "--repeat", "1",
                                "--check", "alice"], capture_output=True, text=True,
                               timeout=60)
            assert r.returncode == 0, r.stdout + r.stderr
        else:
            d.wait_for_log(r'model "alice": generation 1: its files, loaded again after a link '
                           r'count change, validated anew: unchanged', timeout=60)
        wait_until(lambda: "generation %d," % (2 if written else 1) in
                   d.attach("alice").stdout, what="alice served")
        log = d.read_log()
        assert "wcachectl reload alice" not in log, log
        assert written or 'model "alice": generation 2' not in log, log


@pytest.mark.parametrize("change", ["linked", "unlinked"])
def test_a_model_left_out_of_the_store_whose_file_got_a_link_while_running_loads(
        tmp_path, change):
    """As above (no room in the store for alice's generation), her
    one-file model straight in a team place others may rename entries in
    (2775), but while wcached runs a second name is linked to her file (or
    the second it had removed): no write, so wcached keeps serving it, but
    the file's ctime moved. The description records the ctime of the open
    file as the stop describes it, so the restart's judged load takes that
    very file (generation 2). Before, it recorded the load's, and the
    restart, finding another ctime, took the file for one made at a freed
    inode number and waited for `wcachectl reload alice` (h294's note)."""
    team, m = alices_file_in_a_team_place(tmp_path)
    second = os.path.join(team, "m.second")
    if change == "unlinked":
        os.link(m, second)

    def stored_then_linked(d, mgr):
        alice_stored(d, mgr)
        d.wait_for_log(r'not stored: models left out whole: "alice"', timeout=60)
        before = os.stat(m).st_ctime_ns
        time.sleep(0.05)
        os.link(m, second) if change == "linked" else os.unlink(second)
        assert os.stat(m).st_ctime_ns != before
        time.sleep(1)   # what the watch makes of it comes meanwhile
        assert 'model "alice": generation 2' not in d.read_log(), d.read_log()

    d, mgr = restart_stored(tmp_path, {"alice": m}, lambda mgr: None, stored_then_linked,
                            max_fds=2)
    with stopped_after(d, mgr):
        _, line = d.wait_for_log(r'model "alice": (generation \d+ from|its file .* is not one'
                                 r'|.*wcachectl reload alice)', timeout=60)
        assert "generation 2 from %s: 1 file, %d bytes" % (m, os.stat(m).st_size) in line, \
            d.read_log()
        wait_until(lambda: "generation 2" in d.attach("alice").stdout,
                   what="alice's generation 2 served")


def test_a_link_whose_reload_is_pending_at_the_stop_is_loaded_again_at_the_restart(tmp_path):
    """review rev227 M1: alice's file, its generation stored, is linked from
    another directory (loaded again, unchanged), then linked again there and
    written in place through that name, a new header and data at its size,
    its mtime put back; the residency check sees the link count move, and
    its reload waits (paced: the second within 60 s) when the stop comes.
    The stop describes the file with the load's link count and ctime, so
    the restart loads it again, validated anew: generation 2, its bytes
    checked by a worker. Before, the moved ones: generation 1 was restored
    "not read again", the old index over the new bytes, for good."""
    _, m = alices_private_file(tmp_path)
    other = made_by(tmp_path / "other", ALICE_UID)
    data = seed2_bytes(tmp_path)

    def stored_then_linked_written(d, mgr):
        alice_stored_1(d, mgr)
        time.sleep(0.05)   # a ctime of a later clock tick than the load's
        os.link(m, os.path.join(other, "first"))
        d.wait_for_log(r'model "alice": generation 1: its files, loaded again after a link '
                       r'count change, validated anew: unchanged', timeout=30)
        st = os.stat(m)
        second = os.path.join(other, "second")
        os.kill(d.proc.pid, signal.SIGSTOP)   # no check sees the write's mtime
        try:
            time.sleep(0.02)
            os.link(m, second)
            with open(second, "r+b") as f:
                f.write(data)
            os.utime(second, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.kill(d.proc.pid, signal.SIGCONT)
        d.wait_for_log(r'model "alice": m\.safetensors: its link count went from 2 to 3',
                       timeout=30)
        # its reload waits 5 s (paced): the stop comes now

    d, mgr = restart_stored(tmp_path, {"alice": m}, lambda mgr: None, stored_then_linked_written)
    with stopped_after(d, mgr):
        d.wait_for_log(r'model "alice": generation 1 restored from the file descriptor store, '
                       r'but m\.safetensors was linked or unlinked', timeout=30)
        d.wait_for_log(r'model "alice": generation 2 is current', timeout=60)
        r = subprocess.run([binary("demo_worker"), "--socket", d.socket, "--repeat", "1",
                            "--check", "alice"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr


def test_a_stored_file_linked_while_running_then_written_in_place_is_not_restored(tmp_path):
    """alice's file, its generation stored, gets a second name while wcached
    runs (no write: it keeps serving it); while wcached is down it is
    written in place at the same size, its mtime put back. The stop
    describes the open file's link count and ctime, so the restart finds
    the same link count with another ctime and does not restore it. Before,
    the description had the load's link count (1), the restart found 2,
    took the moved ctime for the link's and restored generation 1 with the
    bytes nobody loaded."""
    team, m = alices_file_in_a_team_place(tmp_path)

    def stored_then_linked(d, mgr):
        alice_stored(d, mgr)
        mgr.wait_for(lambda s: "wc-1-1-i" in s.store, what="generation 1 stored")
        time.sleep(0.05)
        os.link(m, os.path.join(team, "m.second"))
        time.sleep(1)   # what the watch makes of it comes meanwhile
        assert 'model "alice": generation 2' not in d.read_log(), d.read_log()

    d, mgr = restart_stored(tmp_path, {"alice": m},
                            lambda mgr: write_in_place_keeping_mtime(m), stored_then_linked)
    try:
        _, line = d.wait_for_log(r'model "alice": (generation 1 restored|not restored)',
                                 timeout=60)
        assert "not restored: file m.safetensors: written in place since it was stored" \
            in line, d.read_log()
    finally:
        status = d.stop()
        mgr.close()
    assert status == 0, d.read_log()


def untreed(mgr, *version):
    """mgr's stored description rewritten as a wcached before format version
    9 wrote it (no trees: tests/tools/store_untreed.c), or with version "9",
    as one of format version 9 (nothing of version 10): the upgrade's store."""
    with mgr.lock:
        old = mgr.store["wc-desc"]
        blob = os.pread(old[0], os.fstat(old[0]).st_size, 0)
        tool = os.path.join(os.environ["WCACHE_BUILD"], "bin", "store_untreed")
        v8 = subprocess.run([tool, *version], input=blob, capture_output=True,
                            check=True).stdout
        assert v8[8] == (9 if version else 8) or (not version and v8[8] == 7), v8[:12]
        mgr.store["wc-desc"] = [sealed_memfd(v8)]
        for fd in old:
            os.close(fd)


def alices_team_model_stored(tmp_path):
    """alice's one-file model straight in team/ (2775, bob a member; bob's
    own directory bobdir in it), stored by a wcached that then stopped:
    (team, d, mgr)."""
    neighbours_place(tmp_path, "unused")
    team = made_by(tmp_path / "team", 0, 0o2775)
    os.chown(team, 0, GROUP)
    os.chmod(team, 0o2775)
    llama = mkmodel(os.path.join(team, "llama.safetensors"), seed=1)
    os.chown(llama, ALICE_UID, GROUP)
    as_bob("mkdir -m 0755 bobdir", team)
    return (team,) + stored_then_stopped(tmp_path, llama)


def stored_then_stopped(tmp_path, llama):
    """wcached (as USER) serving llama at the path llama, its description
    stored, then stopped: (d, mgr)."""
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    os.chmod(mgr.path, 0o666)
    d = Daemon(tmp_path, {"llama": llama}, user=USER, nofile=1024)
    start(d, mgr, user=USER)
    stored(d, mgr)
    assert d.stop() == 0, d.read_log()
    return d, mgr


def restarts_asking_no_server(d, mgr, fs, line, what, waits=False):
    """wcached started again warm, bob's FUSE server fs mounted: the line
    (a regex) comes, and no thread waits on his server (with waits, llama
    waits for the operator's reload); with his server still mounted,
    wcached stops (exit 0). Ends fs, d and mgr."""
    status = None
    try:
        time.sleep(0.3)
        start(d, mgr, *mgr.listen_fds(), user=USER)
        wait_until(lambda: blocked_in_fuse(d.proc.pid) or re.search(line, d.read_log()),
                   what=what + ", or a thread in bob's server")
        stuck = blocked_in_fuse(d.proc.pid)
        assert not stuck, ("a wcached thread waits on bob's FUSE server", stuck, fs.ops,
                           d.read_log())
        assert not waits or "waits_for_reload" in model_entry(d, "llama"), \
            model_entry(d, "llama")
        status = d.stop(timeout=20)   # his server still mounted
    finally:
        fs.close()
        d.stop()
        mgr.close()
    assert status == 0, d.read_log()


def test_the_upgrade_restart_takes_no_tree_from_a_stored_file_a_neighbour_moved_under_his_mount(
        tmp_path):
    """rev210 H1: alice's one-file model straight in team/ (2775, bob a
    member). The restart is the upgrade (a store before format version 9:
    no tree recorded). While wcached restarts bob renames her file into his
    own directory team/bobdir and mounts his FUSE server (answering INIT
    alone) on bobdir. Her model's check fails (its file moved), and the
    restart looked for a tree where /proc/self/fd says the stored file is
    now, by name: stat(2) of team/bobdir/llama.safetensors asked his server
    (LOOKUP), never answered: the model was never listed and wcached did
    not stop. Now a stored file no longer where the model's path leads
    tells no tree: the model waits for `wcachectl reload llama`, saying
    why, no thread asks his server, and wcached stops."""
    team, d, mgr = alices_team_model_stored(tmp_path)
    untreed(mgr)
    as_bob("mv llama.safetensors bobdir/", team)
    fs = HangFS(os.path.join(team, "bobdir"), BOB_UID, GROUP)
    restarts_asking_no_server(d, mgr, fs,
                              r'model "llama": not restored: .*wcachectl reload llama',
                              "llama's wait", waits=True)


@pytest.mark.parametrize("what", ["nothing", "his_file", "his_proc_link"])
def test_the_upgrade_restart_says_why_a_staged_copys_origin_is_not_at_its_path(tmp_path, what):
    """rev211 L3: alice's one-file model straight in a shared sticky place
    (1777), staged (stage = yes). The restart is the upgrade (a store
    before format version 9: no tree recorded). While wcached restarts she
    removes her file, and bob makes nothing, or his link, at its name: to
    his own file in his directory bobdir there, or by /proc/self/root to
    it. The staged copy's origin is not where the model's path leads: the
    model waits for `wcachectl reload llama`, and its line said "its staged
    copy's origin is no longer at PATH" and no more; now it says why too,
    as the judged walk found it: no such file, another file is there, or
    the walk's own refusal (a link on /proc)."""
    shared = made_by(tmp_path / "shared", 0, 0o1777)
    llama = mkmodel(os.path.join(shared, "llama.safetensors"), seed=1)
    os.chown(llama, ALICE_UID, GROUP)
    as_bob("mkdir -m 0755 bobdir && cp llama.safetensors bobdir/ && "
           "chmod 644 bobdir/llama.safetensors", shared)
    bobs = os.path.join(shared, "bobdir", "llama.safetensors")
    staged = os.path.join(str(tmp_path), "staged")
    os.makedirs(staged)
    os.chown(staged, DAEMON_UID, WCACHED_GID)
    os.chmod(staged, 0o700)
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    os.chmod(mgr.path, 0o666)
    d = Daemon(tmp_path, {"llama": (llama, {"stage": "yes"})}, extra="stage_dir = %s\n" % staged,
               user=USER, nofile=1024)
    status = None
    try:
        start(d, mgr, user=USER)
        stored(d, mgr)
        assert d.stop() == 0, d.read_log()
        untreed(mgr)
        as_alice("rm llama.safetensors", shared)
        if what == "his_file":
            as_bob("ln -s bobdir/llama.safetensors llama.safetensors", shared)
        elif what == "his_proc_link":
            as_bob("ln -s /proc/self/root%s llama.safetensors" % bobs, shared)
        time.sleep(0.3)
        start(d, mgr, *mgr.listen_fds(), user=USER)
        _, line = d.wait_for_log(r'model "llama": (not restored: .*wcachectl reload llama|'
                                 r'generation \d+ from)', timeout=60)
        said = {"nothing": "no longer at %s (No such file or directory)" % llama,
                "his_file": "no longer at %s (another file is there)" % bobs,
                "his_proc_link": "no longer at %s (%s: self is a link on /proc " % (llama, llama)}
        assert "its staged copy's origin is " + said[what] in line, line
        assert "waits_for_reload" in model_entry(d, "llama"), model_entry(d, "llama")
        status = d.stop()
    finally:
        d.stop()
        mgr.close()
    assert status == 0, d.read_log()
# Review rev213 H1, H2: the tree of a restored generation, or the upgrade
# restart's tree, is never the directory a neighbour moved its stored file
# into. alice's files (alice 2775 directories team/v1 and team/v2 of the
# group bob is in, v2's model.safetensors a hard link of v1's: versions
# made with cp -al), deployed through bob's link home/bob/llama -> team/v1.

BOBS_BYTES = 275384    # mkmodel layers=3 seed=3; alice's (seed=1) is 192272


def alices_versions_by_bobs_link(tmp_path):
    """alice's v1 and v2 sharing model.safetensors by hard link; bob's home
    holding the configured path, his link llama -> v1, and his own model
    evil.tmp: (v1, v2, bob's home)."""
    parent = str(tmp_path)
    while parent != "/":    # pytest's temporary root is 0700
        os.chmod(parent, os.stat(parent).st_mode & 0o7777 | 0o011)
        parent = os.path.dirname(parent)
    team = made_by(tmp_path / "team", 0, 0o755)
    v1 = made_by(os.path.join(team, "v1"), ALICE_UID, 0o2775)
    v2 = made_by(os.path.join(team, "v2"), ALICE_UID, 0o2775)
    f = mkmodel(os.path.join(v1, "model.safetensors"), seed=1)
    os.chown(f, ALICE_UID, GROUP)
    os.chmod(f, 0o644)
    as_alice("ln %s/model.safetensors model.safetensors" % v1, v2)
    home = made_by(tmp_path / "home", 0, 0o755)
    bobs = made_by(os.path.join(home, "bob"), BOB_UID, 0o755)
    as_bob("ln -s %s llama" % v1, bobs)
    evil = mkmodel(os.path.join(bobs, "evil.tmp"), layers=3, seed=3)
    os.chown(evil, BOB_UID, GROUP)
    return v1, v2, bobs


def moves_alices_file(v1, v2, into="B"):
    """bob's script: v2's name of alice's file removed (its link count
    drops, so the restart's check does not compare its ctime), her file
    renamed into his own directory into."""
    return ("rm %s/model.safetensors && mkdir -m 755 %s && mv %s/model.safetensors %s/ && "
            % (v2, into, v1, into))


# bob's own model in his directory B2, his link re-pointed there.
BOBS_TREE = ("mkdir -m 755 B2 && mv evil.tmp B2/model.safetensors && "
             "ln -s B2 llama.new && mv -T llama.new llama")


def bobs_bytes_never_served(d, what):
    log = d.read_log()
    assert "%d bytes" % BOBS_BYTES not in log, "bob's model served as llama %s:\n%s" % (
        what, log)
    r = d.attach("llama")
    assert "%d" % BOBS_BYTES not in r.stdout, r.stdout


def llama_waits(d, what, timeout=60):
    """llama's next load (or the restart's) waited for the operator's
    `wcachectl reload llama`; nothing of bob's served meanwhile."""
    _, line = d.wait_for_log(r'model "llama": (generation [23] from|.*wcachectl reload llama)',
                             timeout=timeout)
    time.sleep(1)   # anything wcached would load by itself comes meanwhile
    bobs_bytes_never_served(d, what)
    assert "wcachectl reload llama" in line, d.read_log()
    assert "waits_for_reload" in model_entry(d, "llama"), model_entry(d, "llama")
    return line


@pytest.mark.parametrize("move", ["link count dropped", "left", "plain rename"])
def test_a_restored_generation_keeps_the_recorded_tree_where_bob_moved_its_file(
        tmp_path, move):
    """rev213 H1: while wcached restarts bob removes v2's name of alice's
    file and renames v1's into his home (B), then points his link at his
    own tree B2. The check passed (the link count changed, so the ctime is
    not compared), and the restart took the tree from where the stored
    file is now: B, his; his link to his sibling B2 was then "the tree's
    owner's", and his bytes were generation 2. The tree is now the one the
    store recorded (team/v1): the path's move waits for the operator.
    Controls: her file left in v1, or renamed with the link count as
    stored (the check catches it: not restored, judged against team/v1),
    wait as before."""
    v1, v2, bobs = alices_versions_by_bobs_link(tmp_path)
    moves = {"link count dropped": moves_alices_file(v1, v2), "left": "",
             "plain rename": "mkdir -m 755 B && mv %s/model.safetensors B/ && " % v1}[move]
    d, mgr = restart_with(tmp_path, {"llama": os.path.join(bobs, "llama")}, stored,
                          lambda: as_bob(moves + BOBS_TREE, bobs))
    try:
        line = llama_waits(d, "after a restart with alice's file moved (%s)" % move)
        print(line)
        if move == "plain rename":
            assert re.search(r"not restored: .*judged against the tree %s \(uid %d\)" %
                             (re.escape(v1), ALICE_UID), d.read_log()), d.read_log()
        else:
            assert "generation 1 restored" in d.read_log(), d.read_log()
    finally:
        d.stop()
        mgr.close()


def test_a_restored_generation_keeps_the_recorded_tree_where_bobs_link_leads_to_its_moved_file(
        tmp_path):
    """rev213 H1, the second way: bob moves alice's file into B (its link
    count dropped) and points his link at B itself. The path leads to the
    stored file, so the generation is restored, not moved, and its tree was
    taken from the path now: B, his; his file renamed over hers there while
    wcached runs was generation 2. The tree is team/v1, as recorded: B is
    not it, so his file waits for the operator."""
    v1, v2, bobs = alices_versions_by_bobs_link(tmp_path)
    d, mgr = restart_with(tmp_path, {"llama": os.path.join(bobs, "llama")}, stored,
                          lambda: as_bob(moves_alices_file(v1, v2) +
                                         "ln -s B llama.new && mv -T llama.new llama", bobs))
    try:
        d.wait_for_log(r'model "llama": generation 1 restored', timeout=60)
        wait_until(lambda: ready(d, "llama"), what="ready")
        time.sleep(1)
        as_bob("mv evil.tmp B/model.safetensors", bobs)
        print(llama_waits(d, "after his file was renamed over hers in B"))
    finally:
        d.stop()
        mgr.close()


def test_bobs_link_re_pointed_while_wcached_runs_waits(tmp_path):
    """rev213's control: the same re-pointing while wcached runs waits
    (link_taken: bob owns neither the tree nor the files serving)."""
    v1, v2, bobs = alices_versions_by_bobs_link(tmp_path)
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    os.chmod(mgr.path, 0o666)
    d = Daemon(tmp_path, {"llama": os.path.join(bobs, "llama")}, user=USER, nofile=1024)
    start(d, mgr, user=USER)
    try:
        stored(d, mgr)
        as_bob(BOBS_TREE, bobs)
        print(llama_waits(d, "re-pointed while wcached runs"))
    finally:
        d.stop()
        mgr.close()


@pytest.mark.parametrize("upgrade", [False, True])
def test_a_restart_with_nothing_moved_restores_and_takes_alices_update(tmp_path, upgrade):
    """Control: the not-moved restart (a version 9 store, and the upgrade's
    without a tree recorded) restores alice's generation 1, and her own
    update renamed into her model's directory is generation 2."""
    parent = str(tmp_path)
    while parent != "/":
        os.chmod(parent, os.stat(parent).st_mode & 0o7777 | 0o011)
        parent = os.path.dirname(parent)
    llama = made_by(tmp_path / "llama", ALICE_UID, 0o755)
    for name, seed, layers in (("model.safetensors", 1, 2), (".new.tmp", 4, 4)):
        os.chown(mkmodel(os.path.join(llama, name), layers=layers, seed=seed), ALICE_UID,
                 GROUP)

    d, mgr = restart_stored(tmp_path, {"llama": llama},
                            lambda mgr: untreed(mgr) if upgrade else None)
    try:
        d.wait_for_log(r'model "llama": generation 1 restored', timeout=60)
        wait_until(lambda: ready(d, "llama"), what="ready")
        time.sleep(1)
        as_alice("mv .new.tmp model.safetensors", llama)
        _, line = d.wait_for_log(r'model "llama": (generation 2 from|.*wcachectl reload '
                                 r'llama)', timeout=60)
        assert "generation 2 from" in line, d.read_log()
    finally:
        d.stop()
        mgr.close()


@pytest.mark.parametrize("upgrade,into", [(True, "B"), (True, "v3"), (False, "B")])
def test_the_upgrade_restart_takes_no_tree_from_a_file_bob_moved_under_his_link(
        tmp_path, upgrade, into):
    """rev213 H2: the upgrade restart (a store before format version 9: no
    tree recorded). bob renames alice's file into his home (B: the check
    fails, not restored) and points his link at B: the path, walked, leads
    to the stored file, so B, his, was the tree, the restart loaded her
    file from it, and his own renamed over it was generation 3. A tree a
    stored file tells is now its owner's (or root's), reached through no
    one else's link: none here (B is his; alice's empty v3, where he may
    rename her file too, is reached through his link), so llama waits for
    the operator. With a version 9 store (upgrade False) it waits as
    before."""
    v1, v2, bobs = alices_versions_by_bobs_link(tmp_path)
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    os.chmod(mgr.path, 0o666)
    d = Daemon(tmp_path, {"llama": os.path.join(bobs, "llama")}, user=USER, nofile=1024)
    start(d, mgr, user=USER)
    stored(d, mgr)
    assert d.stop() == 0, d.read_log()
    if upgrade:
        untreed(mgr)
    to = "B" if into == "B" else made_by(tmp_path / "team" / "v3", ALICE_UID, 0o2775)
    as_bob("%s mv %s/model.safetensors %s/ && ln -s %s llama.new && mv -T llama.new llama" %
           ("mkdir -m 755 B &&" if into == "B" else "", v1, to, to), bobs)
    time.sleep(0.3)
    start(d, mgr, *mgr.listen_fds(), user=USER)
    try:
        print(llama_waits(d, "at the restart"))
        as_bob("mv evil.tmp %s/model.safetensors" % to, bobs)
        time.sleep(2)
        bobs_bytes_never_served(d, "after his file was renamed into %s" % into)
        if upgrade and into == "B":   # v3 (2775) is a place others rename entries in
            assert re.search(r"stored files tell none: the tree .*/B it is found in is "
                             r"uid %d's" % BOB_UID, d.read_log()), d.read_log()
    finally:
        d.stop()
        mgr.close()


def test_the_upgrade_restart_takes_no_tree_from_a_staged_copys_origin_bob_moved(tmp_path):
    """rev213 H2 for a staged copy (stage = yes): copy_origin finds the
    origin by its device and inode where bob's re-pointed link leads (B,
    his): his directory was the tree, his bytes generation 3. Now the
    tree, uid bob's, is not the origin's owner's (alice): none, it waits."""
    v1, v2, bobs = alices_versions_by_bobs_link(tmp_path)
    staged = made_by(tmp_path / "staged", DAEMON_UID, 0o700)
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    os.chmod(mgr.path, 0o666)
    d = Daemon(tmp_path, {"llama": (os.path.join(bobs, "llama"), {"stage": "yes"})},
               extra="stage_dir = %s\n" % staged, user=USER, nofile=1024)
    start(d, mgr, user=USER)
    stored(d, mgr)
    assert d.stop() == 0, d.read_log()
    untreed(mgr)
    as_bob("mkdir -m 755 B && mv %s/model.safetensors B/ && ln -s B llama.new && "
           "mv -T llama.new llama" % v1, bobs)
    time.sleep(0.3)
    start(d, mgr, *mgr.listen_fds(), user=USER)
    try:
        print(llama_waits(d, "at the restart"))
        as_bob("mv evil.tmp B/model.safetensors", bobs)
        time.sleep(2)
        bobs_bytes_never_served(d, "after his file was renamed into B")
        assert re.search(r"stored files tell none: the tree .*is uid %d's" % BOB_UID,
                         d.read_log()), d.read_log()
    finally:
        d.stop()
        mgr.close()


def test_a_warm_restart_takes_no_real_path_by_name_through_a_neighbours_link_to_his_mount(
        tmp_path):
    """h282: alice's one-file model straight in team/ (2775, bob a member),
    stored by wcached. While wcached restarts bob renames her file aside
    (llama.old) and puts his link llama.safetensors -> bobdir/x at its
    name, his FUSE server (answering INIT alone) mounted on bobdir. The
    restart's check (restore_work) took realpath(3) of the model's path
    before any judged walk: its readlink of the link and lookup of x asked
    his server (LOOKUP), never answered: the model was never listed and
    wcached did not stop. Now the real path is the kernel's name for what
    the judged walk reached (mountrule_realpath), the walk refuses his
    mount: no thread asks his server, llama's line comes, and wcached
    stops."""
    team, d, mgr = alices_team_model_stored(tmp_path)
    as_bob("mv llama.safetensors llama.old && ln -s bobdir/x llama.safetensors", team)
    fs = HangFS(os.path.join(team, "bobdir"), BOB_UID, GROUP)
    restarts_asking_no_server(d, mgr, fs, r'model "llama": not restored: .*: bobdir lies on fuse',
                              "llama's line")


def test_the_upgrade_restart_takes_no_real_path_by_name_of_a_moved_file_under_his_mount(
        tmp_path):
    """The upgrade restart (no tree recorded): bob removes v2's name of
    alice's file (the check passes: its link count changed), renames v1's
    into his home (C/B) and mounts his FUSE server (answering INIT alone)
    on C, over it. The generation is restored, moved; restore_moved_tree
    took the place /proc/self/fd names (C/B, the model is a directory) and
    its realpath(3): a LOOKUP of B to his server, never answered: llama never
    listed, wcached never stopped. Now the place's real path is taken by
    the judged walk, which refuses his mount: no tree; generation 1 serves
    and its path is reloaded (no model at bob's link now), and wcached
    stops."""
    v1, v2, bobs = alices_versions_by_bobs_link(tmp_path)
    d, mgr = stored_then_stopped(tmp_path, os.path.join(bobs, "llama"))
    untreed(mgr)
    as_bob("mkdir -m 755 C && " + moves_alices_file(v1, v2, into="C/B") + "true", bobs)
    fs = HangFS(os.path.join(bobs, "C"), BOB_UID, GROUP)
    restarts_asking_no_server(d, mgr, fs, r'model "llama": generation 1 serves, but its path '
                              r'leads to other files now', "llama's line")


@pytest.mark.parametrize("whose", ["bobs-own-model", "alices-model-by-bobs-link"])
def test_a_restart_checks_no_link_into_the_deployers_own_fuse_mount(tmp_path, whose):
    """rev216 H2: the model at bob's link home/bob/llama (to his own v1, or
    to alice's team/v1: rev213's layout). While wcached restarts bob
    renames his link llama -> C/x over it, C his directory with his FUSE
    server (answering INIT alone) mounted on it. The restart's last look,
    whether the path goes through a place others may rename in
    (registry_others_rename_on), walked it with registry_walk_links, which
    judged no mount: its fstat of C asked his server (GETATTR), never
    answered: llama was never listed and wcached could not stop. Now that
    walk judges each mount it steps onto as mountrule_open's does: his is
    refused before anything on it is asked, llama waits for the operator's
    reload with one line naming his mount, and wcached stops."""
    if whose == "bobs-own-model":
        home = neighbours_place(tmp_path, "home")
        bobs = made_by(os.path.join(home, "bob"), BOB_UID, 0o755)
        v1 = made_by(os.path.join(bobs, "v1"), BOB_UID, 0o755)
        f = mkmodel(os.path.join(v1, "model.safetensors"), seed=1)
        os.chown(f, BOB_UID, GROUP)
        as_bob("ln -s v1 llama", bobs)
    else:
        neighbours_place(tmp_path, "unused")
        _, _, bobs = alices_versions_by_bobs_link(tmp_path)
    d, mgr = stored_then_stopped(tmp_path, os.path.join(bobs, "llama"))
    as_bob("mkdir -m 755 C && ln -s C/x .n && mv -T .n llama", bobs)
    fs = HangFS(os.path.join(bobs, "C"), BOB_UID, GROUP)
    line = r'model "llama": not restored: .*: C lies on fuse \(device \d+:\d+\) mounted by uid %d' % (
        BOB_UID)
    restarts_asking_no_server(d, mgr, fs, line, "llama's wait", waits=True)
    lines = [l for l in d.read_log().split("\n") if 'model "llama": not restored' in l]
    assert len(lines) == 1 and "wcachectl reload llama" in lines[0], d.read_log()
    # said as a mount, not as a directory others may rename entries in
    assert "a mount the walk does not step onto" in lines[0], lines[0]
    assert "a directory others than its owner may rename" not in lines[0], lines[0]
    assert fs.ops == [], fs.ops   # nothing was asked of bob's server


# Review rev215 H1: after a warm restart a one-file model's path counted as
# having named no file (keep_named_file read from the restored generation's
# real path: NULL where its path moved, or outside the recorded tree), so
# rev191 F1 was off and alice's link to root's private model directory beside
# root's team place was served as her generation 2.
PRIV_SWAP = "ln -s ../priv .n && mv -T .n m.safetensors"


def alices_file_beside_roots_private_model(tmp_path):
    """rev191 F1's setup (test_tree_places): alice's one-file model straight
    in root's sticky team place shared (1775: its tree, root's); root's
    private sharded model priv beside it (wcached may read it, alice not);
    alice's own directory aplace. (shared, m, priv)."""
    shared = made_by(tmp_path / "shared", 0, 0o1775)
    m = mkmodel(os.path.join(shared, "m.safetensors"), seed=1)
    os.chown(m, ALICE_UID, GROUP)
    made_by(tmp_path / "aplace", ALICE_UID)
    return shared, m, roots_private_model(tmp_path / "priv", sharded=True)


def roots_model_never_alices(d, priv):
    """alice's next load waited for the operator ("a moved tree"): root's
    private model (its shard's size) never served as her generation 2."""
    _, line = d.wait_for_log(r'model "alice": (its path|generation 2 from)', timeout=60)
    time.sleep(2)   # anything wcached would load by itself comes meanwhile
    log = d.read_log()
    size = os.stat(os.path.join(priv, "s.safetensors")).st_size
    assert not re.search(r'model "alice": generation 2 from', log), \
        "root's private model (%d bytes) served as alice's generation 2:\n%s" % (size, log)
    assert "now resolves into %s" % priv in line and "a moved tree" in line, line
    assert "wcachectl reload alice" in line, line
    assert "waits_for_reload" in model_entry(d, "alice"), model_entry(d, "alice")


@pytest.mark.parametrize("down,after", [
    # restored, its path moved (her file's last name gone): no real path
    (PRIV_SWAP, None),
    # restored with its real path in aplace (hers), outside the recorded
    # tree (7fa2604 keeps it); her link to priv comes after the restart
    ("ln m.safetensors ../aplace/m.safetensors && ln m.safetensors ../aplace/keep && "
     "ln -s ../aplace/m.safetensors .n && mv -T .n m.safetensors", PRIV_SWAP),
    # not restored (the rename moves the ctime): the stored file now lies
    # in aplace, and the judged load's kept files told it named no file
    ("mv m.safetensors ../aplace/m.safetensors && ln -s ../priv m.safetensors", None),
], ids=["no-real-path", "real-path-out-of-tree", "not-restored"])
def test_a_one_file_models_link_to_roots_private_model_beside_its_place_at_a_restart_waits(
        tmp_path, down, after):
    """alice's one-file model in root's team place (1775). While wcached
    restarts (or just after) she renames her link to root's private model
    directory beside the place over her model's name: it waits for the
    operator's reload, as the same rename does while wcached runs (rev191
    F1). Before, keep_named_file came from a real path the restart could not
    tell (NULL, or outside the tree) as 0, and root's 275,384-byte model was
    served as her generation 2 (review rev215 H1)."""
    shared, m, priv = alices_file_beside_roots_private_model(tmp_path)

    def then(d, line):
        # a real path out of the recorded tree is dropped with the tree
        # found there (take_tree): it names a place that is not the model's
        assert "aplace" not in str(model_entry(d, "alice").get("resolved_path")), \
            model_entry(d, "alice")
        if after is not None:
            as_alice(after, shared)
        roots_model_never_alices(d, priv)
    tp_warm_restart(tmp_path, {"alice": m}, "alice", then, lambda: as_alice(down, shared))


def test_a_one_file_models_link_to_roots_private_model_after_a_plain_restart_waits(tmp_path):
    """Control: a plain warm restart keeps serving generation 1, and then her
    link to priv waits as while wcached runs."""
    shared, m, priv = alices_file_beside_roots_private_model(tmp_path)

    def then(d, line):
        assert "generation 1 restored" in line, line
        assert "generation 1" in d.attach("alice").stdout
        as_alice(PRIV_SWAP, shared)
        roots_model_never_alices(d, priv)
    tp_warm_restart(tmp_path, {"alice": m}, "alice", then, lambda: None)


@pytest.mark.parametrize("when", ["after", "while-down"])
def test_a_one_file_models_own_update_at_a_restart_still_loads(tmp_path, when):
    """Control: alice's own update of her file (a new file renamed over its
    name, README's way) after a plain restart, or while wcached is down
    (restored, its path moved: no real path), loads as her generation 2:
    failing closed on what the path named touches only swaps to a directory
    beside her place."""
    shared, m, priv = alices_file_beside_roots_private_model(tmp_path)
    new = mkmodel(os.path.join(shared, "m.tmp"), layers=2, seed=3)
    os.chown(new, ALICE_UID, GROUP)
    update = "mv m.tmp m.safetensors"

    def then(d, line):
        assert "generation 1 restored" in line, line
        if when == "after":
            as_alice(update, shared)
        _, line = d.wait_for_log(r'model "alice": (its path|generation 2 from)', timeout=60)
        assert 'generation 2 from %s: 1 file, %d bytes' % (m, os.stat(m).st_size) in line, line
        # its line comes once validated, before it is current (h293 saw an
        # attach served generation 1 there once)
        wait_until(lambda: "generation 2" in d.attach("alice").stdout,
                   what="alice's generation 2 current")
    tp_warm_restart(tmp_path, {"alice": m}, "alice", then,
                    lambda: as_alice(update, shared) if when == "while-down" else None)


# Review rev215 H1's cost, gone with format version 10: a restart that could
# not tell what a restored generation's path named took one of one file for
# a one-file model, so a directory model of one file had its swap to a
# sibling wait for the operator. The store now records what the path named.
def alices_one_file_directory_model(tmp_path):
    """alice's directory model of one file: her place (0755) holding her
    versions v1 and v2 (one model.safetensors each, v2's another model) and
    her link llama -> v1, the configured path. (place, llama)."""
    parent = str(tmp_path)
    while parent != "/":    # pytest's temporary root is 0700
        os.chmod(parent, os.stat(parent).st_mode & 0o7777 | 0o011)
        parent = os.path.dirname(parent)
    place = made_by(tmp_path / "place", ALICE_UID, 0o755)
    for v, seed, layers in (("v1", 1, 2), ("v2", 4, 4)):
        version = made_by(os.path.join(place, v), ALICE_UID)
        os.chown(mkmodel(os.path.join(version, "model.safetensors"), layers=layers, seed=seed),
                 ALICE_UID, GROUP)
    as_alice("ln -s v1 llama", place)
    return place, os.path.join(place, "llama")


@pytest.mark.parametrize("store", ["10", "9"])
def test_a_one_file_directory_models_swap_to_a_sibling_at_a_restart(tmp_path, store):
    """alice swaps her directory model of one file to its sibling v2 while
    wcached restarts (README's `ln -s v2 .next && mv -T .next llama`): the
    restored generation 1's path leads to v2 now (no real path in its
    recorded tree v1), and the store (format version 10) recorded that its
    path named a directory, so the swap loads as generation 2, as it does
    while wcached runs. Before, the restart failed closed on the layout (a
    generation of one file counted as having named a file: review rev215
    H1's cost) and the swap waited for `wcachectl reload llama`; from a
    version 9 store (the upgrade's) it still does."""
    place, llama = alices_one_file_directory_model(tmp_path)
    v2_size = os.stat(os.path.join(place, "v2", "model.safetensors")).st_size

    def while_down(mgr):
        if store == "9":
            untreed(mgr, "9")
        as_alice("ln -s v2 .next && mv -T .next llama", place)
    d, mgr = restart_stored(tmp_path, {"llama": llama}, while_down)
    try:
        d.wait_for_log(r'model "llama": generation 1 restored', timeout=60)
        _, line = d.wait_for_log(r'model "llama": (generation 2 from|.*wcachectl reload '
                                 r'llama)', timeout=60)
        if store == "10":
            assert "generation 2 from %s: 1 file, %d bytes" % (llama, v2_size) in line, \
                d.read_log()
            wait_until(lambda: "generation 2" in d.attach("llama").stdout,
                       what="generation 2 served")
        else:
            assert "a moved tree" in line and "wcachectl reload llama" in line, d.read_log()
            assert "waits_for_reload" in model_entry(d, "llama"), model_entry(d, "llama")
    finally:
        d.stop()
        mgr.close()
