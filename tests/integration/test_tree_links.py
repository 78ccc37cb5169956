"""Which symbolic links a watched reload follows: every link on a model's
path, not only its last entry, is asked who made it, and a link the
generation serving was loaded through, unchanged, is followed whoever
made it (review rev195 H1, L1). wcached runs unprivileged, as in
test_tree_places.py, whose helpers these tests use."""
import os
import re
import subprocess

from conftest import Daemon, mkmodel
from test_tree_places import (ALICE_UID, BOB_UID, DAEMON_UID, WCACHED_GID, as_alice, as_bob,
                              made_by, pytestmark, roots_private_model, served)

__all__ = ["pytestmark"]


def secret_not_served(d, secret, how, ends=r".*symbolic link|generation 2 "):
    """Waits for the watched reload of "llama" to end (a line matching
    ends) and asserts root's private model secret was not served as its
    generation 2 (how: through what), generation 1 still is; the line."""
    _, line = d.wait_for_log(r'model "llama": (%s)' % ends)
    log = d.read_log()
    assert 'model "llama": generation 2' not in log, \
        "root's private %s served as llama %s:\n%s" % (secret, how, log)
    assert "generation 1" in served(d, "llama")
    return line


def test_another_users_link_above_a_configured_file_waits(tmp_path):
    """The model "llama" is configured by its file,
    shared/llama/model.safetensors (README's layout), in a team's sticky
    place (root's, 1775: fs.protected_symlinks does not apply). The
    operator removes llama to redeploy; bob, first, makes the name his link
    to secret, root's private model directory beside it (readable by
    wcached only). The watched reload opened the file through bob's link:
    the same owner's tree beside the old one, a file root's, and the link
    check looked only at the path's last entry (model.safetensors, no
    link): root's private model was "llama"'s generation 2."""
    shared = made_by(tmp_path / "shared", 0, 0o1775)
    llama = made_by(os.path.join(shared, "llama"), 0)
    f = mkmodel(os.path.join(llama, "model.safetensors"), seed=1)
    secret = roots_private_model(os.path.join(shared, "secret"))
    d = Daemon(tmp_path, {"llama": f}, user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
    try:
        d.wait_for_log(r'model "llama": generation 1 warm')
        subprocess.run(["rm", "-rf", llama], check=True)
        as_bob("ln -s secret llama", shared)
        # The next watched reload (or, where it came between the two, the
        # failed reload's poll): a refusal naming bob's link, or generation 2.
        _, line = d.wait_for_log(r'model "llama": (.*symbolic link|generation 2 )')
        log = d.read_log()
        assert 'model "llama": generation 2' not in log, \
            "root's private %s served as llama through bob's link:\n%s" % (secret, log)
        assert re.search(r"symbolic link %s \(to secret\) made by uid %d" %
                         (re.escape(llama), BOB_UID), line), line
        assert "wcachectl reload llama" in line and "generation 1 still serving" in line, line
        assert "generation 1" in served(d, "llama")
    finally:
        assert d.stop() == 0, d.read_log()


def test_bobs_link_after_the_failed_reload_of_a_removed_directory_waits(tmp_path):
    """As above, but the watched reload comes between the operator's
    `rm -rf llama` and bob's link (a slow redeploy, or a loaded machine), and
    fails: no such file. The watch of llama went with the directory, and
    nothing watched the place its path now names: no reload came again,
    bob's link was never judged and llama's error stayed (the first test
    failed so on a loaded machine). Such a model's path is polled now, and
    the reload that follows refuses bob's link."""
    shared = made_by(tmp_path / "shared", 0, 0o1775)
    llama = made_by(os.path.join(shared, "llama"), 0)
    f = mkmodel(os.path.join(llama, "model.safetensors"), seed=1)
    roots_private_model(os.path.join(shared, "secret"))
    d = Daemon(tmp_path, {"llama": f}, user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
    try:
        d.wait_for_log(r'model "llama": generation 1 warm')
        subprocess.run(["rm", "-rf", llama], check=True)
        d.wait_for_log(r'error: model "llama": .*No such file or directory')
        as_bob("ln -s secret llama", shared)
        _, line = d.wait_for_log(r'model "llama": (.*symbolic link|generation 2 )')
        assert 'model "llama": generation 2' not in d.read_log(), d.read_log()
        assert re.search(r"symbolic link %s \(to secret\) made by uid %d" %
                         (re.escape(llama), BOB_UID), line), line
        assert "generation 1" in served(d, "llama")
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_removed_directory_made_again_after_the_failed_reload_loads(tmp_path):
    """The operator's redeploy of a model configured by its file, slower
    than the settle time: `rm -rf llama`, the watched reload fails (no such
    file), then llama is made again with the new model. The watch of llama
    went with it: the model stayed at generation 1 with its error for good.
    Its path is polled while it is gone, and the new files load."""
    shared = made_by(tmp_path / "shared", 0, 0o1775)
    llama = made_by(os.path.join(shared, "llama"), 0)
    f = mkmodel(os.path.join(llama, "model.safetensors"), seed=1)
    d = Daemon(tmp_path, {"llama": f}, user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
    try:
        d.wait_for_log(r'model "llama": generation 1 warm')
        subprocess.run(["rm", "-rf", llama], check=True)
        d.wait_for_log(r'error: model "llama": .*No such file or directory')
        made_by(os.path.join(shared, ".new"), 0)
        size = os.path.getsize(mkmodel(os.path.join(shared, ".new", "model.safetensors"),
                                       seed=2, layers=3))
        os.rename(os.path.join(shared, ".new"), llama)
        d.wait_for_log(r'model "llama": generation 2 from .*: 1 file, %d bytes' % size)
        d.wait_for_log(r'model "llama": generation 2 warm')
        assert "generation 2" in served(d, "llama")
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_deployers_link_above_a_configured_file_to_roots_private_model_waits(tmp_path):
    """The deployer's form: llama is alice's link to root's v1 (README's
    `llama -> v2` swap, trees root's), the model configured by its file.
    alice swaps her link to root's private secret (`ln -s secret .n &&
    mv -T .n llama`) and the operator then removes v1 (README: "`rm -rf
    models/v1` may follow at once"), which reloads the model (the swap of a
    link above a configured file makes no event wcached watches): root's
    private model was served as "llama"."""
    shared = made_by(tmp_path / "shared", 0, 0o1775)
    v1 = made_by(os.path.join(shared, "v1"), 0)
    mkmodel(os.path.join(v1, "model.safetensors"), seed=1)
    secret = roots_private_model(os.path.join(shared, "secret"))
    as_alice("ln -s v1 llama", shared)
    f = os.path.join(shared, "llama", "model.safetensors")
    d = Daemon(tmp_path, {"llama": f}, user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
    try:
        d.wait_for_log(r'model "llama": generation 1 warm')
        as_alice("ln -s secret .n && mv -T .n llama", shared)
        subprocess.run(["rm", "-rf", v1], check=True)
        line = secret_not_served(d, secret, "through alice's link")
        assert re.search(r"symbolic link %s \(to secret\) made by uid %d" %
                         (re.escape(os.path.join(shared, "llama")), ALICE_UID), line), line
        assert "wcachectl reload llama" in line and "generation 1 still serving" in line, line
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_deployers_unchanged_link_lets_roots_updates_load(tmp_path):
    """README's deployer link in root's team place: llama -> v2 made by
    alice (a member of the team), v2 and its file root's (installed as
    root), loaded by the operator. root's update inside v2 (a new file
    renamed over the old) waited for the operator's reload, as every update
    would: alice owns neither the tree, the files nor the place. Her link
    is the one generation 1 was loaded through, unchanged: followed."""
    shared = made_by(tmp_path / "shared", 0, 0o1775)
    v2 = made_by(os.path.join(shared, "v2"), 0)
    mkmodel(os.path.join(v2, "model.safetensors"), seed=1)
    as_alice("ln -s v2 llama", shared)
    llama = os.path.join(shared, "llama")
    d = Daemon(tmp_path, {"llama": llama}, user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
    try:
        d.wait_for_log(r'model "llama": generation 1 warm')
        new = mkmodel(os.path.join(v2, "new.tmp"), layers=3, seed=2)
        os.rename(new, os.path.join(v2, "model.safetensors"))
        _, line = d.wait_for_log(r'model "llama": (its path|generation 2 is current)')
        assert "generation 2 is current" in line, d.read_log()
        assert "generation 2" in served(d, "llama")
    finally:
        assert d.stop() == 0, d.read_log()
