"""Review rev201: model trees in places others may rename entries in (a team's
2775 directory), against the real unprivileged wcached (as test_rev199.py):
a model whose load failed, a model that is one file straight in such a place,
a warm restart that could not restore a generation, a config reload's retry,
and groups that are not private after all."""
import os
import subprocess

from conftest import Daemon, mkmodel
from test_tree_places import (DAEMON_UID, WCACHED_GID, as_bob, made_by, pytestmark,
                              roots_private_model, served)

__all__ = ["pytestmark"]

SECRET_BYTES = 275384   # mkmodel(layers=3, seed=2): roots_private_model's file


def refused(d, reason, what):
    """wcached's own load of "llama" waits for the operator with reason in
    its line, and root's private model is not served as llama."""
    _, line = d.wait_for_log(r'model "llama": (.*its path|.*its file|generation \d+ from)',
                             timeout=60)
    log = d.read_log()
    assert "%d bytes" % SECRET_BYTES not in log, \
        "root's private model served as llama %s:\n%s" % (what, log)
    assert reason in line and "wcachectl reload llama" in line, line
    return line


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
    llama = made_by(os.path.join(shared, "llama"), 0)
    f = mkmodel(os.path.join(llama, "model.safetensors"), seed=1)
    with open(f, "r+b") as fh:
        fh.truncate(1000)
    roots_private_model(os.path.join(shared, "secret"))
    d = Daemon(tmp_path, {"llama": llama}, user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
    try:
        d.wait_for_log(r'error: model "llama"')
        as_bob("mv llama llama.old && mv secret llama", shared)
        line = refused(d, "goes through the directory %s" % llama,
                       "after its first load failed")
        assert "or none serves" in line, line
    finally:
        assert d.stop() == 0, d.read_log()
