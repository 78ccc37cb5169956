"""Loads wcached makes without the operator's word in places others may
rename entries in (review rev204): a config reload's retry of a model whose
load at a cold start a neighbour made find nothing to judge by (a link to
itself, or a dangling link whose text holds '..', at its name: H1), and a
warm restart of a model the previous process described with no current
generation (its load had failed, or its remote generation was gone: H3).
Each is judged now, and waits for the operator's `wcachectl reload NAME`
where its path goes through such a place; in a private place the
operator's own fix loads as before. wcached runs unprivileged, as in
test_reload_refused.py, whose layouts these tests share."""
import contextlib
import os
import re
import time

import pytest

from conftest import Daemon, mkmodel, wait_until
from ctlutil import ctl, model_entry
from remotefs import RemoteFS  # tests/pyutil, on the path conftest set
from test_reload_refused import (reload_while_bob_keeps_renaming, remote_place,
                                 roots_private_file, secret_never_served, team_layout)
from test_tree_places import (DAEMON_UID, WCACHED_GID, FakeManager, as_bob, made_by,
                              roots_private_model, served)
from test_warm_restart import ready, start

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root to run wcached and clients as other users")

JUDGED_RETRY = (r'model "llama": its load failed: .*; the reload loads it again as a reload '
                r'wcached makes by itself, judged against the tree the operator\'s last load')


def config_reload_judges(tmp_path, bobs_move, failed):
    """test_reload_refused's team layout; bob, before a cold start, runs
    bobs_move in team (llama renamed aside, maybe a link left at its name):
    the load at start fails (its line matching failed). bob renames team
    aside and root's private directory other at team, above the
    directories watched (no reload). A config reload that changes nothing
    must not serve root's private model: wcached's own reload, judged
    against the place the operator's load named, refused; the model
    waits."""
    shared, team, llama = team_layout(tmp_path)
    as_bob(bobs_move, team)
    d = Daemon(tmp_path, {"llama": llama}, user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
    try:
        d.wait_for_log(r'model "llama": .*' + failed)
        as_bob("mv team team.old && mv other team", shared)
        time.sleep(3)   # anything the watch would do by itself comes meanwhile
        secret_never_served(d, "by the watch")
        r = ctl(d, "reload")
        secret_never_served(d, "by a config reload")
        log = d.read_log()
        assert re.search(JUDGED_RETRY, log), log
        assert r.returncode == 1, r
        assert re.search(r'model "llama": its path .*team/llama goes through the directory '
                         r'.*wcachectl reload llama', log), log
        assert "waits_for_reload" in model_entry(d, "llama")
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_loop_link_at_a_cold_start_then_a_rename_above_is_not_served_by_a_config_reload(
        tmp_path):
    """bob's link to itself at llama: the load at start fails (Too many
    levels of symbolic links) and recorded neither a tree nor a place; the
    config reload retried it as the operator's load."""
    config_reload_judges(tmp_path, "mv llama llama.x && ln -s llama llama",
                         "Too many levels of symbolic links")


def test_a_dangling_dotdot_link_at_a_cold_start_then_a_rename_above_is_not_served(tmp_path):
    """bob's dangling link whose text holds '..' at llama: the load fails
    (No such file or directory), and the place its links lead to could not
    be told by their spelling."""
    config_reload_judges(tmp_path, "mv llama llama.x && ln -s nothing/../llama.y llama",
                         "No such file or directory")


def test_a_name_renamed_aside_at_a_cold_start_then_a_rename_above_waits(tmp_path):
    """The same with no link, llama just renamed aside before the start:
    the load records the place it named nothing at (as before)."""
    config_reload_judges(tmp_path, "mv llama llama.x", "No such file or directory")


def test_the_operators_loop_link_fixed_in_a_private_place_loads_at_a_config_reload(tmp_path):
    """Control: in root's own 0755 directory the operator's link at llama
    points at itself by mistake (the load at start fails); she puts the
    model directory there and reloads the configuration: it loads."""
    srv = made_by(tmp_path / "srv", 0)
    llama = os.path.join(srv, "llama")
    real = made_by(os.path.join(srv, "llama.real"), 0)
    mkmodel(os.path.join(real, "model.safetensors"), seed=1)
    os.symlink("llama", llama)
    d = Daemon(tmp_path, {"llama": llama}, user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
    try:
        d.wait_for_log(r'model "llama": .*Too many levels of symbolic links')
        os.unlink(llama)
        os.rename(real, llama)
        r = ctl(d, "reload")
        assert r.returncode == 0, r.stdout + r.stderr + d.read_log()
        wait_until(lambda: ready(d, "llama"), what="llama ready")
        assert "generation 1" in served(d, "llama")
        assert "waits_for_reload" not in model_entry(d, "llama")
    finally:
        assert d.stop() == 0, d.read_log()


def test_roots_file_renamed_at_a_one_file_model_whose_load_at_start_failed_waits(tmp_path):
    """root's one-file llama.safetensors straight in a 2775 place, root's
    private secret.safetensors beside it. bob renames llama aside before a
    cold start (the load fails: No such file; the place is recorded), then
    renames secret at its name: neither the watch nor a config reload
    serves root's private file."""
    shared = made_by(tmp_path / "shared", 0, 0o2775)
    f = mkmodel(os.path.join(shared, "llama.safetensors"), seed=1)
    roots_private_file(os.path.join(shared, "secret.safetensors"))
    as_bob("mv llama.safetensors llama.old", shared)
    d = Daemon(tmp_path, {"llama": f}, user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
    try:
        d.wait_for_log(r'model "llama": .*No such file or directory')
        as_bob("mv secret.safetensors llama.safetensors", shared)
        time.sleep(3)
        secret_never_served(d, "by the watch")
        ctl(d, "reload")
        secret_never_served(d, "by a config reload")
        assert "waits_for_reload" in model_entry(d, "llama")
    finally:
        assert d.stop() == 0, d.read_log()


REMOTE = {"poll_interval": "2", "stage": "no"}


def test_a_loop_link_at_a_cold_start_on_a_polled_remote_place_is_not_served_by_a_config_reload(
        tmp_path):
    """A 2775 place on a polled remote filesystem (stage = no): bob leaves a
    link to itself at llama before a cold start, then renames root's
    private secret at llama and keeps it "still changing": the config
    reload's retry is judged (it was the operator's load)."""
    backing, mnt, shared = remote_place(tmp_path)
    roots_private_model(os.path.join(shared, "secret"))
    as_bob("ln -s llama llama", shared)
    with RemoteFS(backing, mnt, attr_timeout=0.1):
        d = Daemon(tmp_path / "d", {"llama": (str(mnt / "shared" / "llama"), REMOTE)},
                   user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
        try:
            d.wait_for_log(r'model "llama": .*Too many levels of symbolic links')
            r = reload_while_bob_keeps_renaming(d, shared)
            secret_never_served(d, "by a config reload while bob kept renaming")
            assert re.search(JUDGED_RETRY, d.read_log()), d.read_log()
            assert r.returncode == 1, r
        finally:
            assert d.stop() == 0, d.read_log()


def warm_restart_waits(d, mgr):
    """wcached (with its fake manager) restarts warm; llama, described with
    no current generation, is loaded as a reload wcached makes by itself,
    judged against the tree or place the store recorded (review rev204 H3),
    and refused: status says it waits, root's private model is not served,
    and the operator's `wcachectl reload llama` is her word on what the
    path names."""
    start(d, mgr, *mgr.listen_fds(), user=(DAEMON_UID, WCACHED_GID))
    _, line = d.wait_for_log(r'model "llama": (generation \d+ from|not restored|not in the file)')
    assert re.search(r"not restored: no current generation was stored; loading it as a reload "
                     r"wcached makes by itself, judged against the (tree|place) ", line), line
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
        d.stop()
        mgr.close()


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
        d.wait_for_log(r'model "llama": not restored: no current generation was stored; '
                       r'loading')
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
            d.stop()
            mgr.close()


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
        d.wait_for_log(r'model "llama": not restored: no current generation was stored; ')
        d.wait_for_log(r'model "llama": generation \d+ from .*: 1 file, 275384 bytes')
