"""A watched reload the model-tree rules refused (another user's tree at a
model's path) waits for the operator's `wcachectl reload NAME`: a config
reload that leaves the model's section unchanged does not approve it, as
its retry of failed models did (review rev195 M1), while a failure of
another kind is still retried by it; nor does a warm restart, which
serves the generation it restores and loads the files at its path as
wcached's own reload. wcached runs unprivileged, as in test_tree_places.py,
whose places these tests share. Nor, in a place others may rename entries
in (group-writable, not sticky: a team's 2775 directory), a warm restart
whose check of the stored generation failed, nor a config reload's retry
of a model whose watched reload failed otherwise (review rev201 H1, H4);
nor the next warm restart, nor one whose configured link leads into such
a place, nor a config reload's retry of a remote generation gone from its
server (review rev203 H1-H3). Then review rev201's model trees in such
places (a model whose load failed, one that is one file straight in one),
and a config reload's retry of a model a neighbour left nothing to judge
by at a cold start (review rev204 H1)."""
import contextlib
import os
import re
import subprocess
import time

import pytest

from conftest import Daemon, as_user, mkmodel, wait_until
from ctlutil import ctl, model_entry
from remotefs import RemoteFS, skip_reason  # tests/pyutil, on the path conftest set
from test_tree_places import (ALICE_UID, BOB_TAKES_V2, BOB_UID, DAEMON_UID, GROUP, WCACHED_GID,
                              after_a_warm_restart, alice_v2_beside_bobs_model, as_alice, as_bob,
                              made_by, roots_private_model, served, sharded_model, warm_restart)
from test_warm_restart import ready, start

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root to run wcached and clients as other users")

WAITS = ("is served only after the operator's `wcachectl reload alice` (a config reload that "
         "leaves the model's section unchanged does not load it)")


def operators_reload_serves_v2(d):
    """The operator's `wcachectl reload alice` loads bob's v2 as generation
    2, which serves once warm: the reload answers when it is loaded
    ("generation 2 is warming and becomes current when warm"), and an
    attach meanwhile still gets generation 1 (seen under load)."""
    r = ctl(d, "reload", "alice")
    assert r.returncode == 0, r.stdout + r.stderr
    d.wait_for_log(r'model "alice": generation 2 is current \(was 1\)')
    assert "generation 2" in served(d, "alice")


def bobs_v2_refused(tmp_path):
    """alice's model directory v2 in a shared place that is not sticky;
    bob renames it away and his own directory, his model in it, to v2. The
    watched reload is refused with one line: (the daemon, the place, the
    line). The caller stops the daemon."""
    shared, v2 = alice_v2_beside_bobs_model(tmp_path, 0o777)
    d = Daemon(tmp_path, {"alice": v2}, user=(DAEMON_UID, GROUP), nofile=1024).start()
    d.wait_for_log(r'model "alice": generation 1 warm')
    as_bob(BOB_TAKES_V2, shared)
    _, line = d.wait_for_log(r'model "alice": (its path .* still, but|generation 2 is current)')
    assert "now owned by uid %d" % BOB_UID in line and "generation 1 still serving" in line, line
    return d, shared, line


def config_with(d, shared, alice_keys=None):
    """Rewrites d's configuration with alice's model as it was (or with
    alice_keys in her section) and an unrelated new model "other"."""
    other = mkmodel(os.path.join(shared, "other.safetensors"), seed=3)
    alice = os.path.join(shared, "v2")
    d.write_config({"alice": (alice, alice_keys) if alice_keys else alice, "other": other})


def test_a_config_reload_that_adds_another_model_leaves_the_refusal_waiting(tmp_path):
    """The operator adds a model and reloads the configuration: bob's v2
    was loaded as alice's generation 2 by the retry of failed models, with
    an info line, nobody having decided. It waits for `wcachectl reload
    alice`, says so in the log and in status, and that reload serves it."""
    d, shared, line = bobs_v2_refused(tmp_path)
    try:
        config_with(d, shared)
        r = ctl(d, "reload")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "generation 1" in served(d, "other")
        assert "generation 1" in served(d, "alice"), d.read_log()
        assert WAITS in line, line
        log = d.read_log()
        assert 'model "alice": generation 2' not in log, log
        _, said = d.wait_for_log(r'model "alice": .*the reload does not load it')
        assert "its files wait for `wcachectl reload alice`" in said, said
        entry = model_entry(d, "alice")
        assert entry["generation"] == 1, entry
        assert "now owned by uid %d" % BOB_UID in entry["waits_for_reload"], entry
        r = ctl(d, "status", "alice")
        assert "waiting for the operator's reload:\n  alice: the files at its path are served " \
               "only after `wcachectl reload alice`" in r.stdout, r.stdout
        # The operator's word: her reload of the model serves bob's v2.
        operators_reload_serves_v2(d)
        assert "waits_for_reload" not in model_entry(d, "alice")
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_config_reload_that_changes_the_models_section_loads_it(tmp_path):
    """A change to the refused model's own section (here who may attach)
    is the operator's word on it: that config reload loads its files."""
    d, shared, _ = bobs_v2_refused(tmp_path)
    try:
        config_with(d, shared, {"allow_groups": str(GROUP)})
        r = ctl(d, "reload")
        assert r.returncode == 0, r.stdout + r.stderr
        _, said = d.wait_for_log(r'model "alice": .*the reload loads it again')
        assert "its section changed" in said, said
        d.wait_for_log(r'model "alice": generation 2 from ')
        assert "waits_for_reload" not in model_entry(d, "alice")
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_replacement_that_failed_otherwise_is_still_retried_by_a_config_reload(tmp_path):
    """alice's replacement that is no model (a truncated file renamed over
    hers) fails without any tree rule: a config reload that adds another
    model loads it again, as before, and fails again."""
    shared, v2 = alice_v2_beside_bobs_model(tmp_path, 0o777)
    d = Daemon(tmp_path, {"alice": v2}, user=(DAEMON_UID, GROUP), nofile=1024).start()
    try:
        d.wait_for_log(r'model "alice": generation 1 warm')
        as_alice("head -c 100 v2/model.safetensors > v2/.n && mv v2/.n v2/model.safetensors",
                 shared)
        d.wait_for_log(r'model "alice": .*generation 1 still serving')
        config_with(d, shared)
        r = ctl(d, "reload")
        assert r.returncode == 1 and "some models failed" in r.stderr + r.stdout, r
        _, said = d.wait_for_log(r'model "alice": its replacement failed .*the reload loads it '
                                 r'again')
        assert "waits_for_reload" not in model_entry(d, "alice")
        assert "generation 1" in served(d, "alice")
    finally:
        assert d.stop() == 0, d.read_log()


def test_another_users_tree_renamed_in_while_wcached_restarts_waits(tmp_path):
    """bob takes alice's v2 while wcached restarts warm: the restart found
    its stored generation's file replaced and loaded the model afresh, as
    the operator's load, so bob's model was her generation 2 with no rule
    asked. Now generation 1 is restored and serves, the files at the path
    are loaded as a reload wcached makes by itself, judged against the tree
    the store recorded (v2, hers), which is refused (v2 is bob's now), and
    only `wcachectl reload alice` serves them."""
    shared, v2 = alice_v2_beside_bobs_model(tmp_path, 0o777)

    def waits(d):
        _, line = d.wait_for_log(r'model "alice": (its path .*operator|generation 2 from)')
        # Her tree is the one the store recorded, v2 as she made it, not
        # where bob renamed it to (review rev213 H1): v2 is his now.
        assert "resolves into %s still, but that directory is now owned by uid %d (was uid " \
            "%d): a tree made again" % (v2, BOB_UID, ALICE_UID) in line, d.read_log()
        assert WAITS in line and "generation 1 still serving" in line, line
        assert "generation 1" in served(d, "alice")
        assert 'model "alice": generation 2' not in d.read_log(), d.read_log()
        assert "a tree made again" in model_entry(d, "alice")["waits_for_reload"]
        operators_reload_serves_v2(d)
    after_a_warm_restart(tmp_path, v2, waits, while_down=lambda: as_bob(BOB_TAKES_V2, shared))


# ---------------------------------------------------------------------------
# A place others may rename entries in: root's model beside root's private
# one (bob, of the place's group, cannot read it). A neighbour may make a
# warm restart's check fail, or a watched reload fail with no tree refusal,
# and rename the private one in where no watch sees it: what the model's
# path names then is not the operator's word (review rev201 H1, H4).

SECRET_BYTES = 275384   # mkmodel(layers=3, seed=2): root's private model's file


def roots_private_file(path):
    """root's private model file (0640 root:wcached): wcached may read it,
    bob may not."""
    f = mkmodel(path, layers=3, seed=2)
    os.chown(f, 0, WCACHED_GID)
    os.chmod(f, 0o640)
    r = subprocess.run(["setpriv", "--reuid=%d" % BOB_UID, "--regid=%d" % GROUP,
                        "--clear-groups", "cat", f], capture_output=True)
    assert r.returncode != 0, "bob may read root's private model"
    return f


def secret_never_served(d, what):
    """Root's private model is not "llama": not in the log, not attached."""
    log = d.read_log()
    assert "%d bytes" % SECRET_BYTES not in log, \
        "root's private model served as llama %s:\n%s" % (what, log)
    r = d.attach("llama")
    assert "%d" % SECRET_BYTES not in r.stdout, r.stdout


def restart_waits(d, line, place):
    """A warm restart did not serve llama and loaded nothing: its line names
    the place others may rename entries in and waits for the operator,
    status says so, a config reload that changes nothing leaves it, and
    the operator's `wcachectl reload llama` is her word: what the path names
    now loads."""
    time.sleep(3)   # anything wcached would load by itself comes meanwhile
    secret_never_served(d, "after the restart (restore line: %s)" % line)
    assert "not restored" in line and "its path" in line and place in line, line
    assert ("a directory others than its owner may rename entries in" in line and
            "served only after the operator's `wcachectl reload llama`" in line), line
    assert d.attach("llama").returncode != 0, "llama served after the restart"
    assert "waits_for_reload" in model_entry(d, "llama")
    r = ctl(d, "reload")
    assert r.returncode == 0, r.stdout + r.stderr
    d.wait_for_log(r'model "llama": its load failed: .*the reload does not load it: its files '
                   r'wait for `wcachectl reload llama`')
    secret_never_served(d, "after a config reload")
    r = ctl(d, "reload", "llama")
    assert r.returncode == 0, r.stdout + r.stderr
    d.wait_for_log(r'model "llama": generation 2 from ')
    assert "waits_for_reload" not in model_entry(d, "llama")


@pytest.mark.parametrize("mode", [0o2775, 0o755], ids=["2775", "0755"])
def test_a_one_file_model_renamed_aside_while_down_waits_where_others_may_rename(tmp_path,
                                                                                 mode):
    """root's one-file model llama.safetensors straight in a place, root's
    private secret.safetensors beside it. While wcached restarts the stored
    file is renamed aside (its ctime moves: the restart's check says it was
    written in place) and secret renamed at its name. In a 2775 place bob
    may do that: the model was loaded afresh as the operator's load, and
    root's private file was "llama"; now nothing is loaded, and the files
    wait for the operator. In a 0755 place only root could have (here root
    does): loaded afresh, as before."""
    shared = made_by(tmp_path / "shared", 0, mode)
    f = mkmodel(os.path.join(shared, "llama.safetensors"), seed=1)
    roots_private_file(os.path.join(shared, "secret.safetensors"))
    renames = "mv llama.safetensors llama.old && mv secret.safetensors llama.safetensors"

    def then(d, line):
        if mode == 0o755:
            assert "; loading" in line, line
            d.wait_for_log(r'model "llama": generation 2 from .*%d bytes' % SECRET_BYTES)
            return
        restart_waits(d, line, "%s (uid 0, mode 2775)" % shared)

    def while_down():
        if mode == 0o755:
            subprocess.run(["/bin/sh", "-ec", renames], cwd=shared, check=True)
        else:
            as_bob(renames, shared)
    warm_restart(tmp_path, {"llama": f}, "llama", then, while_down)


def test_a_staged_model_renamed_over_while_down_in_a_2775_place_waits(tmp_path):
    """rev199 H1's layout with `stage = yes` (or `auto` on a team's NFS):
    root's model directory llama and root's private secret in a 2775 place.
    While wcached restarts bob does `mv llama llama.old && mv secret llama`:
    the restart finds the staged copy's origin replaced and loaded the model
    afresh, as the operator's load: root's private model was staged and
    served as "llama". Now nothing is loaded, and the files wait for the
    operator."""
    shared = made_by(tmp_path / "shared", 0, 0o2775)
    llama = made_by(os.path.join(shared, "llama"), 0)
    mkmodel(os.path.join(llama, "model.safetensors"), seed=1)
    roots_private_model(os.path.join(shared, "secret"))
    staged = os.path.join(str(tmp_path), "staged")
    os.makedirs(staged)
    os.chown(staged, DAEMON_UID, WCACHED_GID)
    os.chmod(staged, 0o700)

    def then(d, line):
        assert "was replaced since it was staged" in line, line
        restart_waits(d, line, "%s (uid 0, mode 2775)" % shared)
    warm_restart(tmp_path, {"llama": (llama, {"stage": "yes"})}, "llama", then,
                 lambda: as_bob("mv llama llama.old && mv secret llama", shared),
                 extra="stage_dir = %s\n" % staged)


def team_layout(tmp_path):
    """shared (2775) / team (2775, root's) / llama (root's model directory),
    and root's private model at shared/other/llama: (shared, team, llama)."""
    shared = made_by(tmp_path / "shared", 0, 0o2775)
    team = made_by(os.path.join(shared, "team"), 0, 0o2775)
    llama = made_by(os.path.join(team, "llama"), 0)
    mkmodel(os.path.join(llama, "model.safetensors"), seed=1)
    other = made_by(os.path.join(shared, "other"), 0)
    roots_private_model(os.path.join(other, "llama"))
    return shared, team, llama


def test_a_config_reload_retries_a_failed_replacement_as_wcacheds_own_reload(tmp_path):
    """shared (2775) / team (2775, root's) / llama (root's model); other/llama
    root's private model. bob: (1) in team `mv llama llama.x`: the watched
    reload fails (No such file), no tree refusal; (2) in shared `mv team
    team.old && mv other team`: the directories watched moved with
    team.old, no event, no reload. The next config reload (one that
    changes nothing) retried the model as the operator's load: root's
    private model was "llama" generation 2. Now it retries it as a reload
    wcached makes by itself, judged against generation 1's tree: refused,
    generation 1 serves, and the files wait for `wcachectl reload llama`."""
    shared, team, llama = team_layout(tmp_path)
    d = Daemon(tmp_path, {"llama": llama}, user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
    try:
        d.wait_for_log(r'model "llama": generation 1 warm')
        as_bob("mv llama llama.x", team)
        d.wait_for_log(r'error: model "llama": .*No such file.*generation 1 still serving')
        assert "waits_for_reload" not in model_entry(d, "llama")
        as_bob("mv team team.old && mv other team", shared)
        r = ctl(d, "reload")
        _, line = d.wait_for_log(r'model "llama": (its path .*wcachectl reload llama|'
                                 r'generation 2 from)')
        secret_never_served(d, "by a config reload")
        assert r.returncode == 1 and "some models failed" in r.stderr + r.stdout, r
        d.wait_for_log(r'model "llama": its replacement failed .*the reload loads it again as a '
                       r'reload wcached makes by itself')
        assert "generation 1 still serving" in line, line
        assert "generation 1" in served(d, "llama")
        assert "waits_for_reload" in model_entry(d, "llama")
        r = ctl(d, "reload")
        d.wait_for_log(r'model "llama": its replacement failed .*the reload does not load it')
        secret_never_served(d, "by a second config reload")
    finally:
        assert d.stop() == 0, d.read_log()


# The wait outlives the restart that made it, the place is seen through a
# configured link whose target is gone, and a config reload retries a
# remote generation gone from its server as wcached's own reload (review
# rev203 H1-H3): no load wcached makes without the operator's word follows
# the path to what a neighbour renamed there.

def test_a_model_that_waits_after_a_restart_still_waits_after_the_next_restart(tmp_path):
    """root's one-file llama.safetensors in a 2775 place, root's private
    secret.safetensors beside it; bob renames secret at llama's name while
    wcached restarts: the restart makes llama wait. The wait was kept in
    memory only, so the next restart (an upgrade's, a crash's), with no
    word of the operator's between, found no stored generation and loaded
    the path afresh as the operator's load: root's private file was
    "llama". Now the store records the wait and the next restart keeps it,
    as often as it restarts, until the operator's `wcachectl reload
    llama`."""
    shared = made_by(tmp_path / "shared", 0, 0o2775)
    f = mkmodel(os.path.join(shared, "llama.safetensors"), seed=1)
    roots_private_file(os.path.join(shared, "secret.safetensors"))

    def then(d, first):
        assert "served only after the operator's `wcachectl reload llama`" in first, first
        for restart in range(2):
            assert d.stop() == 0, d.read_log()
            start(d, d.manager, *d.manager.listen_fds(), user=(DAEMON_UID, WCACHED_GID))
            pattern = (r'model "llama": (generation \d+ from |not restored; it waited for the '
                       r'operator\'s `wcachectl reload llama` before the restart)')
            _, line = d.wait_for_log(pattern)
            assert "not restored" in line, line
            # The refusal's own line, not one nested in another each restart.
            assert line.count("before the restart") == 1, line
            assert line.endswith(first.split('model "llama": ', 1)[1]), line
        restart_waits(d, line, "%s (uid 0, mode 2775)" % shared)
        # The operator's reload decided it: the next restart restores what
        # it loaded, and nothing waits.
        d.manager.wait_for(lambda m: "wc-1-2-i" in m.store, what="generation 2 stored")
        assert d.stop() == 0, d.read_log()
        start(d, d.manager, *d.manager.listen_fds(), user=(DAEMON_UID, WCACHED_GID))
        d.wait_for_log(r'model "llama": generation 2 restored from the file descriptor store')
        assert "waits_for_reload" not in model_entry(d, "llama")
    warm_restart(tmp_path, {"llama": f}, "llama", then,
                 lambda: as_bob("mv llama.safetensors llama.old && "
                                "mv secret.safetensors llama.safetensors", shared))


def test_a_link_into_a_2775_place_whose_target_was_renamed_aside_while_down_waits(tmp_path):
    """llama's configured path is root's link in root's 0755 directory to
    root's model directory in a 2775 place (a stable name pointing at a
    snapshot); root's private secret beside it. bob renames llama aside
    while wcached restarts: the restart's check fails, and only the
    directories above the path as spelled were asked whether others may
    rename entries there, not the one the walk stopped in: the model was
    loaded afresh as the operator's load (it failed: nothing there), and
    once bob renamed secret at llama, the next config reload's retry, the
    operator's kind too, served root's private model. Now the restart sees
    the place the walk stopped in, and the model waits."""
    links = made_by(tmp_path / "links", 0, 0o755)
    shared = made_by(tmp_path / "shared", 0, 0o2775)
    llama = made_by(os.path.join(shared, "llama"), 0)
    mkmodel(os.path.join(llama, "model.safetensors"), seed=1)
    roots_private_model(os.path.join(shared, "secret"))
    path = os.path.join(links, "llama")
    os.symlink(llama, path)

    def then(d, line):
        assert "goes through %s (uid 0, mode 2775)" % shared in line, line
        as_bob("mv secret llama", shared)
        restart_waits(d, line, "%s (uid 0, mode 2775)" % shared)
    warm_restart(tmp_path, {"llama": path}, "llama", then,
                 lambda: as_bob("mv llama llama.old", shared))


def remote_place(tmp_path):
    """A 2775 place, root's, on a remote filesystem: its backing and mount
    directories and the place in the backing one (tmp_path/d for the
    daemon's files made); skips without FUSE."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    backing, mnt = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    mnt.mkdir()
    os.chmod(tmp_path, 0o755)
    (tmp_path / "d").mkdir()
    return backing, mnt, made_by(backing / "shared", 0, 0o2775)


@contextlib.contextmanager
def remote_team_place(tmp_path, with_model=True):
    """root's model directory llama (2775; with no model in it unless
    with_model) in a 2775 place on a remote filesystem served in place
    (stage = no, polled every 2 s), root's private secret beside it; wcached
    started on it. Gives the daemon and the place."""
    backing, mnt, shared = remote_place(tmp_path)
    llama = made_by(os.path.join(shared, "llama"), 0, 0o2775)
    if with_model:
        mkmodel(os.path.join(llama, "model.safetensors"), seed=1)
    roots_private_model(os.path.join(shared, "secret"))
    with RemoteFS(backing, mnt, attr_timeout=0.1):
        d = Daemon(tmp_path / "d", {"llama": (str(mnt / "shared" / "llama"),
                                              {"poll_interval": "2", "stage": "no"})},
                   user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
        try:
            yield d, shared
        finally:
            assert d.stop() == 0, d.read_log()


@contextlib.contextmanager
def gone_remote_generation(tmp_path):
    """remote_team_place's llama served; bob removes its file, the poll
    finds generation 1 gone from the server."""
    with remote_team_place(tmp_path) as (d, shared):
        d.wait_for_log(r'model "llama": generation 1 warm')
        as_bob("rm llama/model.safetensors", shared)
        d.wait_for_log(r"model \"llama\": generation 1's files were replaced or removed",
                       timeout=60)
        yield d, shared


RETRIED_AS_WCACHEDS_OWN = (r'model "llama": generation 1\'s files were replaced .*the reload '
                           r'loads it again as a reload wcached makes by itself')


def retried_as_wcacheds_own(d):
    """A config reload (answered once the loads it started ended) retried
    llama, whose generation 1 is gone, as a reload wcached makes by itself:
    root's private model not served, refused, its files wait for the
    operator."""
    r = ctl(d, "reload")
    secret_never_served(d, "by a config reload after generation 1 was gone")
    log = d.read_log()
    assert re.search(RETRIED_AS_WCACHEDS_OWN, log), log
    assert re.search(r'model "llama": its path .*wcachectl reload llama', log), log
    assert r.returncode == 1 and "some models failed" in r.stderr + r.stdout, r
    assert "waits_for_reload" in model_entry(d, "llama")


def test_a_config_reload_retries_a_gone_remote_generation_as_wcacheds_own_reload(tmp_path):
    """bob renames root's private secret at llama just before a config
    reload, which comes before the next poll: it retried the model, whose
    generation 1 was gone, as the operator's load, and served root's
    private model. Now it is a reload wcached makes by itself, judged
    against generation 1's tree: refused."""
    with gone_remote_generation(tmp_path) as (d, shared):
        as_bob("mv llama llama.x && mv secret llama", shared)
        time.sleep(0.3)     # the mount's attribute cache (attr_timeout)
        retried_as_wcacheds_own(d)


# bob's exchanges, run as bob in shared: renameat2(RENAME_EXCHANGE) swaps
# two names in one step, so llama is never missing, and moves the ctime of
# both directories.
EXCHANGER = """
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
def exchange(a, b):
    if libc.renameat2(-100, a.encode(), -100, b.encode(), 2) != 0:
        sys.exit("renameat2 %s %s: %s" % (a, b, os.strerror(ctypes.get_errno())))
exchange("llama", "secret")
while True:
    time.sleep(0.02)
    exchange("llama", "twin")
"""


def reload_while_bob_keeps_renaming(d, shared):
    """bob swaps root's private secret in at llama and keeps swapping it
    with its twin, another private model of root's (its ctime moves every
    20 ms), so that the poll never sees it settle; once wcached says so, a
    config reload (its answer returned) while he does. llama is never
    missing, as it was for a moment at each `mv llama .t && mv .t llama`:
    two polls that both found it missing agreed, the poll's reload ran
    first (ci53), and the config reload's retry found it missing or
    refused already. Now no poll agrees with the one before unless bob's
    process made no swap for the whole half second between them
    (poll_interval / 4): the config reload retries the model."""
    roots_private_model(os.path.join(shared, "twin"))
    loop = subprocess.Popen(as_user(BOB_UID, GROUP) + ["/usr/bin/python3", "-c", EXCHANGER],
                            cwd=shared, stderr=subprocess.PIPE, text=True)
    try:
        d.wait_for_log(r'model "llama": .*is still changing', timeout=60)
        r = ctl(d, "reload")
        assert loop.poll() is None, loop.stderr.read()
        return r
    finally:
        loop.kill()
        loop.wait()
        loop.stderr.close()


def test_a_gone_remote_generation_kept_changing_is_not_served_by_a_config_reload(tmp_path):
    """The same, bob keeping llama's path "still changing" (swapped with a
    twin: its ctime moves), so that the poll never sees it settle and no
    poll's reload judges it, however long before the config reload."""
    with gone_remote_generation(tmp_path) as (d, shared):
        r = reload_while_bob_keeps_renaming(d, shared)
        secret_never_served(d, "by a config reload while bob kept renaming")
        log = d.read_log()
        assert re.search(RETRIED_AS_WCACHEDS_OWN, log), log
        assert "the reload does not load it" not in log, log
        assert r.returncode == 1, r
        assert "waits_for_reload" in model_entry(d, "llama")


def test_a_model_nothing_serves_kept_changing_is_not_served_by_a_config_reload(tmp_path):
    """A model whose load at start failed (its directory llama, in a 2775
    place on a remote filesystem, holds no model yet) serves nothing; bob
    renames root's private secret at llama and keeps the path "still
    changing", so that no poll's reload judges it. The next config reload
    retried the model as the operator's load and served root's private
    model; now it is a reload wcached makes by itself, judged against the
    tree the operator's load at start found: another directory at the same
    path, refused."""
    with remote_team_place(tmp_path, with_model=False) as (d, shared):
        d.wait_for_log(r'model "llama": .*no model found')
        r = reload_while_bob_keeps_renaming(d, shared)
        secret_never_served(d, "by a config reload while bob kept renaming")
        assert re.search(r'model "llama": its load failed: .*the reload loads it again as a '
                         r'reload wcached makes by itself', d.read_log()), d.read_log()
        assert r.returncode == 1, r
        assert "waits_for_reload" in model_entry(d, "llama")


# Review rev201: model trees in places others may rename entries in (a
# team's 2775 directory): a model whose load failed, a model that is one
# file straight in such a place (or whose directory is one), and groups
# that are not private after all.

def refused(d, reason, what, number=2):
    """wcached's own load of "llama" waits for the operator with reason in
    its line: no generation number of it (root's private model) is made."""
    _, line = d.wait_for_log(r'model "llama": (.*its path|.*its file|generation %d from)'
                             % number, timeout=60)
    log = d.read_log()
    assert 'model "llama": generation %d from' % number not in log, \
        "root's private model served as llama %s:\n%s" % (what, log)
    assert reason in line and "wcachectl reload llama" in line, line
    assert "waits_for_reload" in model_entry(d, "llama")
    return line


def renamed_while_served(tmp_path, path, rename, reason, what, number=2,
                         served=r'model "llama": generation 1 warm'):
    """wcached serves "llama" from path (or failed to: served, the line to
    wait for); rename() (bob's) then makes its own load wait (refused)."""
    d = Daemon(tmp_path, {"llama": path}, user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
    try:
        d.wait_for_log(served)
        rename()
        return refused(d, reason, what, number)
    finally:
        assert d.stop() == 0, d.read_log()


def llama_beside_secret(shared):
    """root's model directory llama and root's private secret in shared."""
    llama = made_by(os.path.join(shared, "llama"), 0)
    mkmodel(os.path.join(llama, "model.safetensors"), seed=1)
    roots_private_model(os.path.join(shared, "secret"))
    return llama


def test_roots_private_dir_renamed_over_a_model_whose_first_load_failed_waits(tmp_path):
    """rev199 H1-H3 for a model with no generation: root's llama in a 2775
    team place holds a model not loadable yet (a deploy still copying: a
    truncated file), so the config's load fails and nothing serves. bob:
    `mv llama llama.old && mv secret llama`. The watched reload kept the
    tree the operator's load found (its path and owner, no inode) and bound
    nothing, as no generation serves: root's private model was "llama"
    generation 1. Now every directory and link in such a place must be one
    a generation serving was loaded through: none here, so it waits."""
    shared = made_by(tmp_path / "shared", 0, 0o2775)
    llama = llama_beside_secret(shared)
    with open(os.path.join(llama, "model.safetensors"), "r+b") as fh:
        fh.truncate(1000)
    line = renamed_while_served(tmp_path, llama,
                                lambda: as_bob("mv llama llama.old && mv secret llama", shared),
                                "goes through the directory %s" % llama,
                                "after its first load failed", 1, r'error: model "llama"')
    assert "or none serves" in line, line


def one_file_in_a_2775_place(tmp_path):
    """root's model that is one file, llama.safetensors, straight in a team
    place 2775, beside root's private secret.safetensors."""
    shared = made_by(tmp_path / "shared", 0, 0o2775)
    f = mkmodel(os.path.join(shared, "llama.safetensors"), seed=1)
    roots_private_file(os.path.join(shared, "secret.safetensors"))
    return shared, f


def test_roots_other_file_renamed_over_a_one_file_model_in_a_2775_place_waits(tmp_path):
    """bob renames root's private file over the model's name (`mv
    secret.safetensors llama.safetensors`): a file of the owner of the file
    serving, one link, in the same place (the tree of a model that is one
    file straight in it): it was served at once. Now a file in such a
    directory that is not one of the files serving waits, whoever owns it."""
    shared, f = one_file_in_a_2775_place(tmp_path)
    renamed_while_served(tmp_path, f,
                         lambda: as_bob("mv secret.safetensors llama.safetensors", shared),
                         "its file %s is not one of the files serving" % f,
                         "at run time (bob's rename over the model's file)")


def test_a_shard_renamed_over_in_a_2775_model_directory_waits(tmp_path):
    """The same for a sharded model whose directory is the team's 2775 one:
    bob renames root's private file over a shard."""
    shared = made_by(tmp_path / "shared", 0, 0o2775)
    f = mkmodel(os.path.join(shared, "model.safetensors"), layers=3, seed=1)
    sharded_model(shared, f)
    shard = os.path.join(shared, "s.safetensors")
    roots_private_file(os.path.join(shared, "secret.safetensors"))
    renamed_while_served(tmp_path, shared,
                         lambda: as_bob("mv secret.safetensors s.safetensors", shared),
                         "its file %s is not one of the files serving" % shard,
                         "after bob's rename over a shard")


def test_roots_0775_dir_of_group_root_is_a_place_others_rename_in(tmp_path):
    """A 0775 root:root directory (container images' `chgrp -R 0 && chmod -R
    g=u`; OpenShift's arbitrary uid always runs in group 0) was taken for one
    root alone may write, gid 0 being root's primary group, named root, with
    no member listed. But any process holding gid 0 may rename there (bob
    here, as a pod's user): `mv llama llama.old && mv secret llama` served
    root's private model as llama. Root's group is never private now."""
    shared = made_by(tmp_path / "shared", 0, 0o775)
    os.chown(shared, 0, 0)
    llama = llama_beside_secret(shared)
    renamed_while_served(
        tmp_path, llama,
        lambda: subprocess.run(["setpriv", "--reuid=64103", "--regid=0", "--clear-groups",
                                "/bin/sh", "-ec", "mv llama llama.old && mv secret llama"],
                               cwd=shared, check=True),
        "its path %s resolves into %s still, but that is another directory" % (llama, llama),
        "after a gid-0 process renamed it in")


# Loads wcached makes without the operator's word in places others may
# rename entries in (review rev204 H1): a config reload's retry of a model
# whose load at a cold start a neighbour made find nothing to judge by (a
# link to itself, or a dangling link whose text holds '..', at its name)
# is judged now, and waits for the operator's `wcachectl reload NAME` where
# its path goes through such a place; in a private place the operator's
# own fix loads as before (the warm restarts of H3: test_restart_judged).

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


def alices_broken_file(directory):
    """alice's one-file model m.safetensors in directory, its header
    broken (a half-uploaded file: not JSON), and bob's model file b.tmp
    beside it: the path."""
    m = os.path.join(directory, "m.safetensors")
    with open(m, "wb") as f:
        f.write(b"\x08\x00\x00\x00\x00\x00\x00\x00not json" + b"\0" * 64)
    os.chown(m, ALICE_UID, GROUP)
    mkmodel(os.path.join(directory, "b.tmp"), layers=3, seed=2)
    os.chown(os.path.join(directory, "b.tmp"), BOB_UID, GROUP)
    return m


ALICE_LOADED_OR_WAITS = (r'model "alice": (generation \d+ from|its files .* lie in'
                         r'|its path .* named nothing|.*wcachectl reload alice)')


@contextlib.contextmanager
def moved_after_a_failed_load(tmp_path, m, moves):
    """wcached (unprivileged) with alice's model at m, whose load fails;
    moves() run then: yields (d, the line that says whether wcached's own
    reload loaded what m names then or waits for the operator)."""
    d = Daemon(tmp_path, {"alice": m}, user=(DAEMON_UID, GROUP), nofile=1024).start()
    try:
        d.wait_for_log(r'model "alice": .*not served', timeout=60)
        moves()
        _, line = d.wait_for_log(ALICE_LOADED_OR_WAITS, timeout=60)
        yield d, line
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_neighbours_file_at_the_name_of_a_model_whose_load_failed_waits(tmp_path):
    """alice's one-file model straight in a sticky place (1777, root's:
    its tree) fails its first load (her file is broken); she removes it to
    redeploy and bob renames his file at its name. Nothing serves alice,
    and whose her broken file was tells nothing of whose a later one is:
    wcached's own (watched) reload waits for `wcachectl reload alice`.
    Before, it kept the tree's root and owner only and served bob's file
    as alice's generation 1 (review rev209 H1)."""
    shared = made_by(tmp_path / "shared", 0, 0o1777)
    m = alices_broken_file(shared)
    with moved_after_a_failed_load(tmp_path, m, lambda: (
            as_alice("rm m.safetensors", shared),
            as_bob("mv b.tmp m.safetensors", shared))) as (d, line):
        assert os.stat(m).st_uid == BOB_UID
        assert "nothing served it since the operator's load of it failed" in line, \
            d.read_log()
        assert "served only after the operator's `wcachectl reload alice`" in line, line
        assert "waits_for_reload" in model_entry(d, "alice"), model_entry(d, "alice")
        r = ctl(d, "reload", "alice")   # the operator's word: bob's file is what she serves
        assert r.returncode == 0, r.stderr
        d.wait_for_log(r'model "alice": generation 1 from', timeout=60)


def test_a_neighbours_file_at_the_name_of_a_model_not_there_at_its_load_waits(tmp_path):
    """Control for the test above: alice's file is not there at all when
    wcached starts (the operator's load records a place, not a tree); bob's
    file renamed at its name waits as the first comer's (at_place)."""
    shared = made_by(tmp_path / "shared", 0, 0o1777)
    m = os.path.join(shared, "m.safetensors")
    mkmodel(os.path.join(shared, "b.tmp"), layers=3, seed=2)
    os.chown(os.path.join(shared, "b.tmp"), BOB_UID, GROUP)
    with moved_after_a_failed_load(tmp_path, m,
                                   lambda: as_bob("mv b.tmp m.safetensors", shared)) as (d, line):
        assert "served only after the operator's `wcachectl reload alice`" in line, \
            d.read_log()
        assert not re.search(r'model "alice": generation \d+ from', d.read_log())


def test_a_model_whose_load_failed_fixed_in_its_owners_directory_loads(tmp_path):
    """alice's broken model file in her own directory (0755: no one else
    may write there) fails its load; the good file she renames over it is
    loaded by wcached's own reload, with no operator's word: only she
    could have put it there."""
    home = made_by(tmp_path / "alice", ALICE_UID, 0o755)
    m = alices_broken_file(home)
    mkmodel(os.path.join(home, "good.tmp"), seed=1)
    os.chown(os.path.join(home, "good.tmp"), ALICE_UID, GROUP)
    with moved_after_a_failed_load(tmp_path, m,
                                   lambda: as_alice("mv good.tmp m.safetensors", home)) as (d, line):
        assert re.search(r'model "alice": generation 1 from', line), d.read_log()
        wait_until(lambda: ready(d, "alice"), what="alice ready")
