"""Review rev201: model trees in places others may rename entries in (a team's
2775 directory), against the real unprivileged wcached (as test_rev199.py):
a model whose load failed, a model that is one file straight in such a place
(or whose directory is one), and groups that are not private after all."""
import os
import subprocess

from conftest import Daemon, mkmodel
from ctlutil import model_entry
from test_tree_places import (DAEMON_UID, WCACHED_GID, as_bob, made_by, pytestmark,
                              roots_private_model, sharded_model)

__all__ = ["pytestmark"]

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


def roots_private_file(path):
    """root's private model file (0640 root:wcached): wcached may read it,
    bob may not."""
    f = mkmodel(path, layers=3, seed=2)
    os.chown(f, 0, WCACHED_GID)
    os.chmod(f, 0o640)
    r = subprocess.run(["setpriv", "--reuid=64103", "--regid=64100", "--clear-groups",
                        "cat", f], capture_output=True)
    assert r.returncode != 0, "bob may read root's private model"
    return f


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
