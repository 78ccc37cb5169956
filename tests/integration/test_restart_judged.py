"""A warm restart's own loads are wcached's, never the operator's word
(review rev204 H2; H3's tests are test_rev204.py's): a model the restart
could not restore is loaded as a reload wcached makes by itself, judged
against the tree the file descriptor store recorded for it (format version
9): the tree its stored generation was loaded from. What the model's own
deployer put at its path while wcached was down (his link to root's
private model) waits for the operator's `wcachectl reload NAME`; the
deployer's own update in his tree loads as before. Run as root (wcached
and the neighbours run as other users)."""
import os
import re
import time

import pytest

from conftest import Daemon, mkmodel, wait_until
from ctlutil import ctl, model_entry
from test_reload_refused import SECRET_BYTES, secret_never_served
from test_tree_places import (BOB_UID, DAEMON_UID, GROUP, WCACHED_GID, FakeManager, as_bob,
                              made_by, roots_private_model)
from test_warm_restart import ready, start

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root to run wcached and clients as other users")

USER = (DAEMON_UID, WCACHED_GID)


def restart_with(tmp_path, models, started, while_down):
    """Starts wcached under a fake service manager, runs started(d) once
    the description is stored, stops it, runs while_down(), starts it again
    warm and returns (d, mgr) (the caller stops both)."""
    mgr = FakeManager(str(tmp_path / "notify.sock"))
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
        d.stop()
        mgr.close()


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
        d.stop()
        mgr.close()


