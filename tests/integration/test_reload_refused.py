"""A watched reload the model-tree rules refused (another user's tree at a
model's path) waits for the operator's `wcachectl reload NAME`: a config
reload that leaves the model's section unchanged does not approve it, as
its retry of failed models did (review rev195 M1), while a failure of
another kind is still retried by it; nor does a warm restart, which
serves the generation it restores and loads the files at its path as
wcached's own reload. wcached runs unprivileged, as in test_tree_places.py,
whose places these tests share."""
import os

import pytest

from conftest import Daemon, mkmodel
from ctlutil import ctl, model_entry
from test_tree_places import (BOB_TAKES_V2, BOB_UID, DAEMON_UID, GROUP, after_a_warm_restart,
                              alice_v2_beside_bobs_model, as_alice, as_bob, served)

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
    are loaded as a reload wcached makes by itself, which is refused, and
    only `wcachectl reload alice` serves them."""
    shared, v2 = alice_v2_beside_bobs_model(tmp_path, 0o777)

    def waits(d):
        _, line = d.wait_for_log(r'model "alice": (its path .*operator|generation 2 from)')
        # Her tree is where her file is now, the directory bob renamed.
        assert "now resolves into %s (was %s): a moved tree" % (
            v2, os.path.join(shared, ".alices")) in line, d.read_log()
        assert WAITS in line and "generation 1 still serving" in line, line
        assert "generation 1" in served(d, "alice")
        assert 'model "alice": generation 2' not in d.read_log(), d.read_log()
        assert "a moved tree" in model_entry(d, "alice")["waits_for_reload"]
        operators_reload_serves_v2(d)
    after_a_warm_restart(tmp_path, v2, waits, while_down=lambda: as_bob(BOB_TAKES_V2, shared))
