"""A model's owner against the other tenants of wcached (review rev173):
what she can change of her own model's path must not reach another model's
files, nor wcached's descriptors. wcached runs unprivileged, as the
neighbour tests do (test_neighbours.py)."""
import hashlib
import os
import subprocess

import pytest

from conftest import Daemon, as_user, binary, mkmodel

# Ids no account uses: the daemon's user and a model's owner, in GROUP.
DAEMON_UID, ALICE_UID, GROUP = 64101, 64104, 64100

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root to run wcached and clients as other users")


def control(d, *words):
    r = subprocess.run([binary("wcachectl"), "--control", d.control, *words],
                       capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


def as_alice(script, cwd):
    subprocess.run(as_user(ALICE_UID, GROUP) + ["/bin/sh", "-ec", script], cwd=cwd, check=True)


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def served_generation(d, name):
    """The generation of name an attach gets (wcachectl attach's line)."""
    r = d.attach(name)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def owned_dir(path, uid):
    os.makedirs(path)
    os.chown(path, uid, GROUP)
    os.chmod(path, 0o755)
    return str(path)


def test_a_link_renamed_over_a_model_directory_waits_for_the_operator(tmp_path):
    """F1: alice owns the directory holding her model's directory; she renames
    a symbolic link to bob's model over it. wcached saw the rename (inotify)
    and served bob's files as alice's model generation 2, past bob's
    allow_users. Now the watched reload is refused with one line naming both
    trees, generation 1 serves on, and an operator's reload takes the new
    tree. A hub snapshot switch (the tree stays models--X) still passes."""
    alice = owned_dir(tmp_path / "alice", ALICE_UID)
    os.makedirs(tmp_path / "bob" / "m")
    mkmodel(os.path.join(alice, "m.tmp"), seed=1)
    as_alice("mkdir m && cp m.tmp m/model.safetensors && rm m.tmp", alice)
    mkmodel(tmp_path / "bob" / "m" / "model.safetensors", seed=2)
    hub = tmp_path / "hub" / "models--o--n"
    for rev, seed in (("rev1", 3), ("rev2", 4)):
        os.makedirs(hub / "snapshots" / rev)
        mkmodel(hub / "snapshots" / rev / "model.safetensors", seed=seed)
    os.symlink("rev1", hub / "snapshots" / "cur")
    models = {"alice": os.path.join(alice, "m"), "bob": str(tmp_path / "bob" / "m"),
              "hub": str(hub / "snapshots" / "cur")}
    d = Daemon(tmp_path, models, user=(DAEMON_UID, GROUP), nofile=1024).start()
    try:
        d.wait_for_log(r'model "hub": generation 1 warm')
        d.wait_for_log(r'model "alice": generation 1 warm')
        assert "generation 1" in served_generation(d, "alice")

        as_alice("ln -s ../bob/m m.new && mv m m.old && mv m.new m", alice)
        _, line = d.wait_for_log(r'model "alice": its path .* now resolves into')
        assert str(tmp_path / "bob" / "m") in line and os.path.join(alice, "m") in line, line
        assert "wcachectl reload alice" in line and "generation 1 still serving" in line, line
        assert "generation 1" in served_generation(d, "alice")
        assert 'model "alice": generation 2' not in d.read_log()

        # A hub snapshot switch inside models--o--n is the same tree.
        os.symlink("rev2", hub / "snapshots" / "cur.new")
        os.rename(hub / "snapshots" / "cur.new", hub / "snapshots" / "cur")
        d.wait_for_log(r'model "hub": generation 2 is current')

        # The operator's reload resolves the path anew: her act.
        code, out = control(d, "reload", "alice")
        assert code == 0, out
        d.wait_for_log(r'model "alice": generation 2 is current')
        assert "generation 2" in served_generation(d, "alice")
        assert digest(os.path.join(alice, "m", "model.safetensors")) == \
            digest(tmp_path / "bob" / "m" / "model.safetensors")
    finally:
        assert d.stop() == 0, d.read_log()
