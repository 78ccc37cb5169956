"""Review rev198: a link's maker who owns the directory holding it (H1),
and a tree root renamed over in a group-writable place (M1), against the
real unprivileged wcached (as test_tree_links.py). Each served root's
private model as "llama" before the fix (89d0897)."""
import os
import subprocess

from conftest import Daemon, mkmodel
from test_tree_links import secret_not_served
from test_tree_places import (ALICE_UID, BOB_UID, DAEMON_UID, WCACHED_GID, as_alice, as_bob,
                              made_by, pytestmark, roots_private_model)

__all__ = ["pytestmark"]


def test_bobs_directory_with_his_link_on_the_path_waits(tmp_path):
    """rev198 H1. The model "llama" is shared/llama/current (root's
    directory llama holding root's link current -> ../v2; v2 root's model),
    in the team's sticky place (root's, 1775). The operator removes llama to
    redeploy; bob makes llama a directory of his own with his link
    current -> ../secret (root's private model beside v2). The walk judges
    bob's link as an entry of a directory bob owns, and secret is a sibling
    of v2 owned by root (a swap): owning the directory must not approve his
    link, which waits for the operator's reload."""
    shared = made_by(tmp_path / "shared", 0, 0o1775)
    v2 = made_by(os.path.join(shared, "v2"), 0)
    mkmodel(os.path.join(v2, "model.safetensors"), seed=1)
    llama = made_by(os.path.join(shared, "llama"), 0)
    os.symlink("../v2", os.path.join(llama, "current"))
    secret = roots_private_model(os.path.join(shared, "secret"))
    path = os.path.join(llama, "current")
    d = Daemon(tmp_path, {"llama": path}, user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
    try:
        d.wait_for_log(r'model "llama": generation 1 warm')
        as_bob("mkdir .x && chmod 0755 .x && ln -s ../secret .x/current", shared)
        # The operator's redeploy frees the name (rm -rf llama), bob's
        # directory is renamed in at once; the operator then removes v2
        # (an event in the watched tree, as README's `rm -rf v1`).
        subprocess.run(["rm", "-rf", llama], check=True)
        as_bob("mv -T .x llama", shared)
        subprocess.run(["rm", "-rf", v2], check=True)
        line = secret_not_served(d, secret, "through bob's directory",
                                 r"its path|.*symbolic link|generation 2 from")
        assert "made by uid %d" % BOB_UID in line, line
        assert "owning the directory it is in does not count" in line, line
    finally:
        assert d.stop() == 0, d.read_log()


def test_roots_private_directory_renamed_over_in_a_2775_place_waits(tmp_path):
    """rev198 M1. A team place its group may write, not sticky (2775):
    root's model directory llama ("llama") and root's private secret.
    bob renames them (`mv llama llama.old && mv secret llama`): no link,
    the same path, the same owner, but another inode in a place others may
    rename in: it waits for the operator's reload."""
    shared = made_by(tmp_path / "shared", 0, 0o2775)
    llama = made_by(os.path.join(shared, "llama"), 0)
    mkmodel(os.path.join(llama, "model.safetensors"), seed=1)
    secret = roots_private_model(os.path.join(shared, "secret"))
    d = Daemon(tmp_path, {"llama": llama}, user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
    try:
        d.wait_for_log(r'model "llama": generation 1 warm')
        as_bob("mv llama llama.old && mv secret llama", shared)
        line = secret_not_served(d, secret, "after bob's renames",
                                 r"its path|.*symbolic link|generation 2 ")
        assert "another directory than the tree serving" in line, line
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_deployers_link_in_her_own_directory_to_roots_private_model_waits(tmp_path):
    """rev198 H1 (b). alice, a deployer, keeps her link llama -> root's v1
    in a directory of her own (deploy/, hers), the model "llama" configured
    as deploy/llama; v1 and root's private secret are root's, side by side
    in the team's place (1775). Her swap `ln -s ../shared/secret .n &&
    mv -T .n llama`: the same swap with her link in root's place waits
    (test_tree_links), and so must it here, in the directory she owns:
    root's private model (which she cannot read) is not "llama"."""
    shared = made_by(tmp_path / "shared", 0, 0o1775)
    v1 = made_by(os.path.join(shared, "v1"), 0)
    mkmodel(os.path.join(v1, "model.safetensors"), seed=1)
    secret = roots_private_model(os.path.join(shared, "secret"))
    deploy = made_by(tmp_path / "deploy", ALICE_UID, 0o755)
    as_alice("ln -s ../shared/v1 llama", deploy)
    path = os.path.join(deploy, "llama")
    d = Daemon(tmp_path, {"llama": path}, user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
    try:
        d.wait_for_log(r'model "llama": generation 1 warm')
        as_alice("ln -s ../shared/secret .n && mv -T .n llama", deploy)
        line = secret_not_served(d, secret, "through alice's link in her directory",
                                 r"its path|.*symbolic link|generation 2 from")
        assert "made by uid %d" % ALICE_UID in line, line
        assert "wcachectl reload llama" in line, line
    finally:
        assert d.stop() == 0, d.read_log()
