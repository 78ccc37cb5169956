"""Review rev198: a link's maker who owns the directory holding it (H1),
and a tree root renamed over in a group-writable place (M1), against the
real unprivileged wcached (as test_tree_links.py). Each served root's
private model as "llama" before the fix (89d0897). Review rev216 H1: a
link followed because its maker owns files serving (not the tree: root's)
renamed to root's private model beside the tree. Review rev218 H1: her
index renamed over hers in root's team place naming root's private file
beside it (no link moves). Review rev219 H1: her index (renamed over hers,
or rewritten in place in root's 0755 slot) naming root's private file
where root owns a file serving or alone writes the directory; L1: a
directory model's index named by its own path."""
import contextlib
import json
import os
import shutil
import signal
import struct
import subprocess

import pytest
import wcached as wcached_run

from conftest import Daemon, mkmodel, wait_until
from ctlutil import ctl
from test_restart_judged import restart_stored, untreed
from test_stage import write_safetensors
from test_tree_links import secret_not_served
from test_tree_places import (ALICE_UID, BOB_UID, DAEMON_UID, GROUP, WCACHED_GID, as_alice,
                              as_bob, as_user, made_by, pytestmark, roots_private_model, served,
                              sharded_model, warm_restart)
from test_warm_restart import ready

__all__ = ["pytestmark"]


@contextlib.contextmanager
def llama_warm(tmp_path, path, gid=WCACHED_GID):
    """wcached (the daemon's user, group gid) serving "llama" at path, until
    its generation 1 is warm: the daemon, stopped after the block (cleanly,
    exit status 0)."""
    d = Daemon(tmp_path, {"llama": path}, user=(DAEMON_UID, gid), nofile=1024).start()
    try:
        d.wait_for_log(r'model "llama": generation 1 warm')
        yield d
    finally:
        assert d.stop() == 0, d.read_log()


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
    with llama_warm(tmp_path, path) as d:
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
    with llama_warm(tmp_path, llama) as d:
        as_bob("mv llama llama.old && mv secret llama", shared)
        line = secret_not_served(d, secret, "after bob's renames",
                                 r"its path|.*symbolic link|generation 2 ")
        assert "another directory than the tree serving" in line, line


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
    with llama_warm(tmp_path, path) as d:
        as_alice("ln -s ../shared/secret .n && mv -T .n llama", deploy)
        line = secret_not_served(d, secret, "through alice's link in her directory",
                                 r"its path|.*symbolic link|generation 2 from")
        assert "made by uid %d" % ALICE_UID in line, line
        assert "wcachectl reload llama" in line, line


def her_file(path, seed=1):
    """A model file at path, alice's."""
    f = mkmodel(path, seed=seed)
    os.chown(f, ALICE_UID, GROUP)
    return f


def roots_slot_with_her_file(place, name, seed=1):
    """A model directory root made (1775) in place for alice to drop her
    model in, her model file in it."""
    slot = made_by(os.path.join(place, name), 0, 0o1775)
    her_file(os.path.join(slot, "model.safetensors"), seed)
    return slot


def roots_place_with_her_slot(tmp_path):
    """root's team place shared (1775) holding llama, a slot of root's with
    her file in it, and her link current -> llama: the place."""
    shared = made_by(tmp_path / "shared", 0, 0o1775)
    roots_slot_with_her_file(shared, "llama")
    as_alice("ln -s llama current", shared)
    return shared


@contextlib.contextmanager
def her_swap(tmp_path, path, target):
    """wcached serving "llama" at path, her link, until its generation 1 is
    warm (llama_warm); then her swap of that link to target: the daemon
    (stopped after the block)."""
    with llama_warm(tmp_path, path) as d:
        as_alice("ln -s %s .n && mv -T .n %s" % (target, os.path.basename(path)),
                 os.path.dirname(path))
        yield d


def roots_tree_reached_by_her_link(tmp_path, layout):
    """A model whose tree is root's, its files (or one of them) alice's,
    its path through her link; root's private sharded model beside the
    tree (review rev216 H1): (path, root's model beside the tree as her
    link would spell it, root's model). slot-in-team: root's team place
    shared (1775) holds llama, a slot root made for her file, her link
    current -> llama, and root's secret. team-place-as-dir: the model directory is root's team
    place team2 itself (her file straight in it), reached by her link
    aplace/cur in her own directory; root's priv beside team2.
    her-file-in-roots-v1: rev198 H1 (b)'s layout (her link deploy/llama ->
    ../shared/v1), v1's file hers. her-index-over-roots-shards: v1 is
    root's sharded model with her index over root's shard (the tree's owner
    owns files serving too)."""
    if layout == "team-place-as-dir":
        team2 = made_by(tmp_path / "team2", 0, 0o1775)
        her_file(os.path.join(team2, "model.safetensors"))
        secret = roots_private_model(tmp_path / "priv", sharded=True)
        aplace = made_by(tmp_path / "aplace", ALICE_UID)
        as_alice("ln -s ../team2 cur", aplace)
        return os.path.join(aplace, "cur"), "../priv", secret
    if layout == "slot-in-team":
        shared = roots_place_with_her_slot(tmp_path)
        secret = roots_private_model(os.path.join(shared, "secret"), sharded=True)
        return os.path.join(shared, "current"), "secret", secret
    shared = made_by(tmp_path / "shared", 0, 0o1775)
    secret = roots_private_model(os.path.join(shared, "secret"), sharded=True)
    v1 = made_by(os.path.join(shared, "v1"), 0)
    if layout == "her-file-in-roots-v1":
        her_file(os.path.join(v1, "model.safetensors"))
    else:
        sharded_model(v1, mkmodel(os.path.join(v1, "m.safetensors"), seed=1))
        os.chown(os.path.join(v1, "model.safetensors.index.json"), ALICE_UID, GROUP)
    deploy = made_by(tmp_path / "deploy", ALICE_UID, 0o755)
    as_alice("ln -s ../shared/v1 llama", deploy)
    return os.path.join(deploy, "llama"), "../shared/secret", secret


@pytest.mark.parametrize("layout", ["slot-in-team", "team-place-as-dir", "her-file-in-roots-v1",
                                    "her-index-over-roots-shards"])
def test_her_link_from_roots_tree_to_roots_private_sibling_waits(tmp_path, layout):
    """rev216 H1. A tree that is root's, files serving alice's (all, or
    her index over root's shard), the path through her link, which is
    followed for her files: she renames it to root's private model beside
    the tree (`ln -s secret .n && mv -T .n current`). A sibling of the
    same owner (root) with files of the tree's owner was her swap, and
    root's private model (which she cannot read) was served as her
    generation 2 (275,384 bytes, the first three layouts; the fourth
    passed a sketch that asked only where the tree's owner owns none of
    the files serving). Her link moves the model only to files of hers."""
    path, target, secret = roots_tree_reached_by_her_link(tmp_path, layout)
    with her_swap(tmp_path, path, target) as d:
        line = secret_not_served(d, secret, "through alice's link (%s)" % layout,
                                 r"its path|.*symbolic link|generation 2 from")
        assert "now resolves into %s (was " % secret in line, line
        assert "made by uid %d, who owns files serving but not the model's tree (uid 0)" \
            % ALICE_UID in line, line
        assert "is owned by uid 0: such a link moves the model by itself only to files of " \
            "its maker" in line, line
        assert "wcachectl reload llama" in line and "generation 1 still serving" in line, line


def test_her_swap_between_roots_slots_with_her_files_loads(tmp_path):
    """The control of rev216 H1's fix: root's team place (1775) holds two
    slots of root's, llama and llama2, each with alice's model file; her
    link current -> llama. Her swap to llama2 (README's `ln -s v2 .next &&
    mv -T .next llama`) is taken by itself: her files, in a sibling of the
    same owner."""
    shared = roots_place_with_her_slot(tmp_path)
    llama2 = roots_slot_with_her_file(shared, "llama2", seed=3)
    roots_private_model(os.path.join(shared, "secret"), sharded=True)
    with her_swap(tmp_path, os.path.join(shared, "current"), "llama2") as d:
        _, line = d.wait_for_log(r'model "llama": (its path|.*symbolic link|generation 2 is '
                                 r'current)')
        assert "generation 2 is current" in line, d.read_log()
        assert "generation 2" in served(d, "llama")
        assert os.path.realpath(os.path.join(shared, "current")) == llama2


@pytest.mark.parametrize("beside", ["bobs-directory", "roots-slot-with-bobs-file"])
def test_her_link_from_roots_tree_to_another_users_model_beside_waits(tmp_path, beside):
    """rev216 H1's other targets: from root's slot llama (her file), her
    link renamed to bob's model beside it, in a directory of bob's (another
    owner than the tree's: no sibling of it) or in a slot root made for bob
    (the tree's owner, bob's file, readable: no file of the owner of the
    file it replaces): neither is hers, both wait (before rev216 H1's fix
    too)."""
    shared = roots_place_with_her_slot(tmp_path)
    bobs = made_by(os.path.join(shared, "bobs"), BOB_UID if beside == "bobs-directory" else 0)
    f = mkmodel(os.path.join(bobs, "model.safetensors"), layers=3, seed=2)
    os.chown(f, BOB_UID, GROUP)
    with her_swap(tmp_path, os.path.join(shared, "current"), "bobs") as d:
        line = secret_not_served(d, bobs, "through alice's link (%s)" % beside,
                                 r"its path|.*symbolic link|generation 2 from")
        assert "wcachectl reload llama" in line and "generation 1 still serving" in line, line
        if beside == "bobs-directory":
            assert "now resolves into %s (was " % bobs in line, line
        else:
            assert "names a file now owned by uid %d (was uid %d)" % (BOB_UID, ALICE_UID) \
                in line, line


def test_her_link_to_roots_private_sibling_while_down_waits(tmp_path):
    """rev216 H1 at a warm restart: the slot-in-team layout, her swap to
    root's private model made while wcached restarts. The restart restores
    generation 1 and loads what her path leads to now as wcached's own
    reload, through her link (no walk of a restored generation is
    recorded, so judged by its maker): root's private model waits."""
    path, target, secret = roots_tree_reached_by_her_link(tmp_path, "slot-in-team")

    def then(d, line):
        assert "generation 1 restored" in line, d.read_log()
        line = secret_not_served(d, secret, "through alice's link while down",
                                 r"its path|.*symbolic link|generation 2 from")
        assert "now resolves into %s (was " % secret in line, line
        assert "such a link moves the model by itself only to files of its maker" in line, line
    warm_restart(tmp_path, {"llama": path}, "llama", then,
                 lambda: as_alice("ln -s %s .n && mv -T .n current" % target,
                                  os.path.dirname(path)))


def her_model_in_roots_team_place_beside_roots_file(tmp_path):
    """root's team place team2 (1775, GROUP) holding alice's sharded model
    straight in it (her index and shard) and root's private one-file model
    rootsecret.safetensors (0640 root:wcached's group: wcached reads it,
    alice may not), and .idx-alice, an index of hers naming root's file for
    each of its tensors (their names are no secret; root writes it here, as
    she cannot read the header): team2, root's file."""
    team2 = made_by(tmp_path / "team2", 0, 0o1775)
    sharded_model(team2, mkmodel(os.path.join(team2, "in.safetensors"), seed=1))
    for n in ("s.safetensors", "model.safetensors.index.json"):
        os.chown(os.path.join(team2, n), ALICE_UID, GROUP)
    secret = mkmodel(os.path.join(team2, "rootsecret.safetensors"), layers=3, seed=2)
    os.chown(secret, 0, WCACHED_GID)
    os.chmod(secret, 0o640)
    r = subprocess.run(as_user(ALICE_UID, GROUP) + ["cat", secret], capture_output=True)
    assert r.returncode != 0, "alice may read root's private file"
    with open(secret, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    idx = os.path.join(team2, ".idx-alice")
    with open(idx, "w") as f:
        json.dump({"weight_map": {n: "rootsecret.safetensors" for n in header
                                  if n != "__metadata__"}}, f)
    os.chown(idx, ALICE_UID, GROUP)
    return str(team2), secret


def assert_roots_file_waits(line, path, team2):
    """line is the refusal naming root's file (at path/, as opened) for its
    owner: the tree's, who owns none of the files serving."""
    secret = os.path.join(path, "rootsecret.safetensors")
    assert "its file %s is owned by uid 0, the owner of its tree %s, who owns none of " \
        "the files serving" % (secret, team2) in line, line


@pytest.mark.parametrize("how", ["through-her-link", "team-place-configured"])
def test_her_index_over_hers_naming_roots_file_in_roots_team_place_waits(tmp_path, how):
    """Review rev218 H1: no link moves (makers_move does not run), the
    tree is the same, and root owns it: same_owners took root's file as
    the tree owner's, and wcached's own reload served root's private model
    as her generation 2. A file of the tree's owner who owns no file
    serving, in a directory others may write in, waits for the operator."""
    team2, secret = her_model_in_roots_team_place_beside_roots_file(tmp_path)
    path = team2
    if how == "through-her-link":
        aplace = made_by(tmp_path / "aplace", ALICE_UID)
        as_alice("ln -s ../team2 cur", aplace)
        path = os.path.join(aplace, "cur")
    with llama_warm(tmp_path, path) as d:
        as_alice("mv .idx-alice model.safetensors.index.json", team2)
        line = secret_not_served(d, secret, how, r"its |.*symbolic link|generation 2 ")
        assert_roots_file_waits(line, path, team2)


def test_her_index_naming_roots_file_in_roots_team_place_while_down_waits(tmp_path):
    """rev218 H1 at a warm restart: her index renamed while wcached
    restarts; the restart's reload waits as the watched one does."""
    team2, secret = her_model_in_roots_team_place_beside_roots_file(tmp_path)

    def then(d, line):
        assert "generation 1 restored" in line, d.read_log()
        line = secret_not_served(d, secret, "while down", r"its |generation 2 ")
        assert_roots_file_waits(line, team2, team2)
    warm_restart(tmp_path, {"llama": team2}, "llama", then,
                 lambda: as_alice("mv .idx-alice model.safetensors.index.json", team2))


SECRET = "rootsecret.safetensors"


def roots_file_beside(directory, uid=0, mode=0o640):
    """uid's one-file model rootsecret.safetensors in directory (mode; 0640
    and group wcached's: wcached reads it, alice may not), and the text of
    an index naming it for each of its tensors (their names are no secret;
    written for her, as she cannot read the header): (its path, text)."""
    secret = mkmodel(os.path.join(directory, SECRET), layers=3, seed=2)
    os.chown(secret, uid, WCACHED_GID)
    os.chmod(secret, mode)
    up = os.path.dirname(directory)
    while up != "/":   # traversable, as the daemon's start makes them (open_to)
        os.chmod(up, os.stat(up).st_mode & 0o7777 | 0o011)
        up = os.path.dirname(up)
    r = subprocess.run(as_user(ALICE_UID, GROUP) + ["cat", secret], capture_output=True)
    assert (r.returncode == 0) == bool(mode & 0o004), "alice's read right to %s" % secret
    with open(secret, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    return secret, json.dumps({"weight_map": {n: SECRET for n in header
                                              if n != "__metadata__"}})


def her_index_layout(tmp_path, layout, mode=0o640):
    """rev219 H1's layouts, the model "llama" configured as its directory
    d0 (a sharded model: index hers, shard s.safetensors root's unless
    said), root's rootsecret.safetensors (mode) beside it, and her next
    index naming it in aplace/idx (hers): (d0, secret, the shell line by
    which she puts it at her index's name, run in d0).
    team-place-roots-shard: d0 is root's team place team2 (1775), which
    she may make entries in; she renames her next index over hers.
    roots-v1-in-place: root's slot shared/v1 (0755: only root may make
    entries in it), root's index chowned to her to update; she rewrites
    it in place. roots-v1-her-shard-in-place: the same, the shard hers too
    (root owns no file serving). roots-v1-acl: v1 (0755) with an ACL
    entry letting her write in it (u:alice:rwx, mask rwx), the shard hers;
    she renames her next index over hers."""
    if layout == "team-place-roots-shard":
        d0 = made_by(tmp_path / "team2", 0, 0o1775)
    else:
        made_by(tmp_path / "shared", 0, 0o1775)
        d0 = made_by(tmp_path / "shared" / "v1", 0, 0o755)
    sharded_model(d0, mkmodel(os.path.join(d0, "in.safetensors"), seed=1))
    os.chown(os.path.join(d0, "model.safetensors.index.json"), ALICE_UID, GROUP)
    if layout in ("roots-v1-her-shard-in-place", "roots-v1-acl"):
        os.chown(os.path.join(d0, "s.safetensors"), ALICE_UID, GROUP)
    if layout == "roots-v1-acl":
        acl = [(0x01, 7, 0xffffffff), (0x02, 7, ALICE_UID), (0x04, 5, 0xffffffff),
               (0x10, 7, 0xffffffff), (0x20, 5, 0xffffffff)]   # no setfacl here
        os.setxattr(d0, "system.posix_acl_access",
                    struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in acl))
    secret, text = roots_file_beside(d0, mode=mode)
    aplace = made_by(tmp_path / "aplace", ALICE_UID)
    idx = os.path.join(aplace, "idx")
    with open(idx, "w") as f:
        f.write(text)
    os.chown(idx, ALICE_UID, GROUP)
    if layout.endswith("-in-place"):
        return d0, secret, "cat %s > model.safetensors.index.json" % idx
    return d0, secret, "cp %s .n && mv .n model.safetensors.index.json" % idx


def assert_her_index_refused(line, d0, secret, serving=True):
    """line is linked_in's refusal of root's private file secret named by
    her index in d0 (named by its own path, not d0's: review rev219 L1),
    and generation 1 still serves (serving)."""
    assert "%s is owned by uid 0 (mode 0640, group %d), which uid %d, the owner of its " \
        "shard index %s, may not read: an index names only files its owner could read" % (
            secret, WCACHED_GID, ALICE_UID,
            os.path.join(d0, "model.safetensors.index.json")) in line, line
    assert ("generation 1 still serving" in line) == serving, line


HER_INDEX_LAYOUTS = ["team-place-roots-shard", "roots-v1-in-place",
                     "roots-v1-her-shard-in-place"]


@pytest.mark.parametrize("layout", HER_INDEX_LAYOUTS)
def test_her_index_naming_roots_private_file_beside_it_is_refused(tmp_path, layout):
    """Review rev219 H1: same_owners took any file of the tree's owner once
    that owner owned a file serving (her index over root's shard) or alone
    might write in the directory (root's 0755 slot: she rewrites her index
    in place): root's private file (275,384 bytes) was served as her
    generation 2 in all three layouts. A shard index names only files its
    owner could read, whoever owns the tree: refused, at the operator's
    reload too (her index is hers to rewrite), generation 1 serving."""
    d0, secret, put = her_index_layout(tmp_path, layout)
    with llama_warm(tmp_path, d0) as d:
        as_alice(put, d0)
        line = secret_not_served(d, secret, layout, r"its |.* may not read|generation 2 ")
        assert_her_index_refused(line, d0, secret)
        r = ctl(d, "reload", "llama")
        assert r.returncode != 0 and "may not read" in r.stdout + r.stderr, r
        assert 'model "llama": generation 2' not in d.read_log(), d.read_log()
        assert "generation 1" in served(d, "llama")


@pytest.mark.parametrize("layout", HER_INDEX_LAYOUTS)
def test_her_index_naming_roots_file_she_may_read_loads(tmp_path, layout):
    """The control of rev219 H1's fix: the same layouts, root's file beside
    the model 0644 (she may read it): her index naming it is her model, as
    her index over root's shards (each layout's generation 1) was."""
    d0, secret, put = her_index_layout(tmp_path, layout, mode=0o644)
    with llama_warm(tmp_path, d0) as d:
        as_alice(put, d0)
        _, line = d.wait_for_log(r'model "llama": (its |.* may not read|generation 2 is current)')
        assert "generation 2 is current" in line, d.read_log()
        assert "generation 2, 30 tensors" in served(d, "llama")


def test_roots_own_index_naming_his_private_file_loads(tmp_path):
    """The control of rev219 H1's fix: in root's slot v1 (0755), root's own
    next index (his: he chose its names) naming his private file beside the
    model is his update: loaded, whoever owned the index it replaces."""
    d0, secret, _ = her_index_layout(tmp_path, "roots-v1-in-place")
    with llama_warm(tmp_path, d0) as d:
        subprocess.run(["sh", "-ec", "cp %s .n && mv .n model.safetensors.index.json"
                        % os.path.join(tmp_path, "aplace", "idx")], cwd=d0, check=True)
        _, line = d.wait_for_log(r'model "llama": (its |.* may not read|generation 2 is current)')
        assert "generation 2 is current" in line, d.read_log()
        assert "generation 2, 30 tensors" in served(d, "llama")


@pytest.mark.parametrize("layout", ["team-place-roots-shard", "roots-v1-in-place"])
def test_her_index_naming_roots_private_file_while_down_waits(tmp_path, layout):
    """rev219 H1 at a warm restart: her change made while wcached restarts.
    The restart's reload keeps the owners of the files it served from their
    stored descriptors (root's shard), which lack her index's: it waits, and
    its line names her index by its own path, not by the model's directory
    (review rev219 L1: `its file .../team2 is owned by uid 64104`)."""
    d0, secret, put = her_index_layout(tmp_path, layout)
    index = os.path.join(d0, "model.safetensors.index.json")

    def then(d, line):
        assert "generation 1 restored" in line, d.read_log()
        line = secret_not_served(d, secret, "while down", r"its |.* may not read|generation 2 ")
        assert "its file %s is owned by uid %d, not by the owner of its tree %s (uid 0)" % (
            index, ALICE_UID, d0) in line, line
    warm_restart(tmp_path, {"llama": d0}, "llama", then, lambda: as_alice(put, d0))


def test_her_index_in_roots_slot_she_may_write_by_an_acl_waits(tmp_path):
    """rev219's check of an ACL: root's v1 (0755) with an entry letting her
    write in it, her index and shard: her next index naming root's private
    file. The ACL's mask shows in the group bits (0775): root does not
    alone write there, so same_owners waits for the operator (before the
    fix too), and the index rule refuses it at the operator's reload."""
    d0, secret, put = her_index_layout(tmp_path, "roots-v1-acl")
    assert os.stat(d0).st_mode & 0o7777 == 0o775
    with llama_warm(tmp_path, d0) as d:
        as_alice(put, d0)
        line = secret_not_served(d, secret, "acl", r"its |.* may not read|generation 2 ")
        assert "its file %s is owned by uid 0, the owner of its tree %s, who owns none of " \
            "the files serving" % (secret, d0) in line, line


def test_her_index_naming_bobs_private_file_beside_it_waits(tmp_path):
    """rev219's other kept owner: her index over bob's shard in root's team
    place (1775), bob's private bobsecret (0640 bob:wcached) beside; her
    next index names it. bob owns a file serving (same_owners takes his),
    but its tree's owner (root) may not read it by its mode: refused by
    linked_in's older rule (before the fix too)."""
    d0 = made_by(tmp_path / "team2", 0, 0o1775)
    sharded_model(d0, mkmodel(os.path.join(d0, "in.safetensors"), seed=1))
    os.chown(os.path.join(d0, "model.safetensors.index.json"), ALICE_UID, GROUP)
    os.chown(os.path.join(d0, "s.safetensors"), BOB_UID, GROUP)
    secret, text = roots_file_beside(d0, uid=BOB_UID)
    with open(os.path.join(d0, ".n"), "w") as f:
        f.write(text.replace(SECRET, "bobsecret.safetensors"))
    os.chown(os.path.join(d0, ".n"), ALICE_UID, GROUP)
    os.rename(secret, os.path.join(d0, "bobsecret.safetensors"))
    secret = os.path.join(d0, "bobsecret.safetensors")
    with llama_warm(tmp_path, d0) as d:
        as_alice("mv .n model.safetensors.index.json", d0)
        line = secret_not_served(d, secret, "bob's", r"its |.* may not read|generation 2 ")
        assert "%s is owned by uid %d (mode 0640, group %d), which uid 0 (the owner of the " \
            "model's tree %s) may not read" % (secret, BOB_UID, WCACHED_GID, d0) in line, line


def test_her_index_naming_roots_private_file_with_owners_untold_is_refused(tmp_path):
    """rev219 H1 where the restart cannot tell whose the files it served
    were (a store with no room for the generation, written by a wcached of
    format version 9): root's slot v1 (0755) lets the restart's reload take
    every file (no one but root may write there), and her index rewritten in
    place while wcached was down named root's private file: the index rule
    asks no owner of the files serving, so it is refused all the same."""
    d0, secret, put = her_index_layout(tmp_path, "roots-v1-in-place")

    def until(d, mgr):
        wait_until(lambda: ready(d, "llama"), what="llama ready")
        mgr.wait_for(lambda m: "wc-desc" in m.store, what="the description stored")
        d.wait_for_log(r'not stored: models left out whole: "llama"', timeout=60)

    def down(mgr):
        untreed(mgr, "9")
        as_alice(put, d0)
    d, mgr = restart_stored(tmp_path, {"llama": d0}, down, until, max_fds=2)
    try:
        _, line = d.wait_for_log(r'model "llama": (generation \d+ from|.* may not read|its )')
        log = d.read_log()
        assert "1 file, %d bytes" % os.path.getsize(secret) not in log, \
            "root's private %s served as llama:\n%s" % (secret, log)
        assert_her_index_refused(line, d0, secret, serving=False)
        r = d.attach("llama")
        assert r.returncode != 0 and "30 tensors" not in r.stdout, r.stdout + r.stderr
    finally:
        status = d.stop()
        mgr.close()
    assert status == 0, d.read_log()


def writers_index_layout(tmp_path, place, secret_mode=0o640, secret_gid=WCACHED_GID):
    """rev222 H1's layouts: the model "llama" configured as its directory
    d0, its index and shard s.safetensors 0664 OWNER:GROUP (umask 002),
    OWNER's rootsecret.safetensors (secret_mode, secret_gid) beside it, and
    alice's index naming it in aplace/idx. bobs-0755-dir: bob's own 0755
    directory, bob the OWNER; roots-0755-slot: root's slot v1 (0755), root
    the OWNER (its index asked nothing of its owner). alice, of GROUP, may
    make no entry there, but may rewrite the index in place by its group w
    bit: (d0, secret, the shell line by which she does, run in d0)."""
    owner = BOB_UID if place == "bobs-0755-dir" else 0
    d0 = made_by(tmp_path / ("bob" if owner else "v1"), owner, 0o755)
    sharded_model(d0, mkmodel(os.path.join(d0, "in.safetensors"), seed=1))
    for n in ("model.safetensors.index.json", "s.safetensors"):
        os.chown(os.path.join(d0, n), owner, GROUP)
        os.chmod(os.path.join(d0, n), 0o664)
    secret, text = roots_file_beside(d0, uid=owner, mode=secret_mode)
    os.chown(secret, owner, secret_gid)
    aplace = made_by(tmp_path / "aplace", ALICE_UID)
    idx = os.path.join(aplace, "idx")
    with open(idx, "w") as f:
        f.write(text)
    os.chown(idx, ALICE_UID, GROUP)
    return d0, secret, "cat %s > model.safetensors.index.json" % idx


@pytest.mark.parametrize("place", ["bobs-0755-dir", "roots-0755-slot"])
def test_group_writable_index_naming_owners_private_file_waits(tmp_path, place):
    """Review rev222 H1: the index rule asked its OWNER, but whoever may
    WRITE the index chooses the names: alice (GROUP) rewrote bob's 0664
    index in his 0755 directory (no entry needed) to name his private file
    beside it (0640 bob:wcached), and root's (exempt) in root's slot: both
    served as llama's generation 2 (275,384 bytes). An index its group may
    write names only files its group may read: refused, generation 1
    serving, at the operator's reload too."""
    d0, secret, put = writers_index_layout(tmp_path, place)
    owner = BOB_UID if place == "bobs-0755-dir" else 0
    with llama_warm(tmp_path, d0) as d:
        as_alice(put, d0)
        assert os.stat(os.path.join(d0, "model.safetensors.index.json")).st_uid == owner
        line = secret_not_served(d, secret, place, r"its |.* may not read|.* may write|"
                                 r"generation 2 ")
        assert "%s (mode 0640, group %d) is named by the shard index %s (mode 0664, group %d), " \
            "which users who may not read that file may write: an index names only files " \
            "whoever may write it could read" % (
                secret, WCACHED_GID, os.path.join(d0, "model.safetensors.index.json"),
                GROUP) in line, line
        assert "generation 1 still serving" in line, line
        r = ctl(d, "reload", "llama")
        assert r.returncode != 0 and "may write" in r.stdout + r.stderr, r
        assert 'model "llama": generation 2' not in d.read_log(), d.read_log()


@pytest.mark.parametrize("place", ["bobs-0755-dir", "roots-0755-slot"])
def test_group_writable_index_naming_a_file_its_group_may_read_loads(tmp_path, place):
    """The control of rev222 H1's fix: the same layouts, the owner's file
    beside the model 0640 OWNER:GROUP (the index's group may read it, no
    ACL; wcached runs in GROUP to read it): alice's rewrite naming it is
    generation 2."""
    d0, secret, put = writers_index_layout(tmp_path, place, secret_gid=GROUP)
    with llama_warm(tmp_path, d0, gid=GROUP) as d:
        as_alice(put, d0)
        _, line = d.wait_for_log(r'model "llama": (its |.* may not read|.* may write|'
                                 r'generation 2 is current)')
        assert "generation 2 is current" in line, d.read_log()
        assert "generation 2, 30 tensors" in served(d, "llama")


def set_acl(path, entries):
    """path's access ACL: (tag, perm, id) entries (no setfacl here)."""
    os.setxattr(path, "system.posix_acl_access",
                struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries))


@pytest.fixture
def users_known(tmp_path, monkeypatch):
    """Runs wcached in a private mount namespace whose /etc/passwd and
    /etc/group name the suite's uids (alice and bob in GROUP), so that it
    can tell alice's groups: without them every group path of
    owner_may_read refuses (review rev222 L3). The host's files are left
    as they are."""
    nss = tmp_path / "nss"
    nss.mkdir()
    with open("/etc/passwd") as f, open(nss / "passwd", "w") as out:
        out.write(f.read() + "".join("wct%d:x:%d:%d::/nonexistent:/usr/sbin/nologin\n" % u for u in
                                     ((DAEMON_UID, DAEMON_UID, WCACHED_GID),
                                      (BOB_UID, BOB_UID, GROUP), (ALICE_UID, ALICE_UID, GROUP))))
    with open("/etc/group") as f, open(nss / "group", "w") as out:
        out.write(f.read() + "wctg%d:x:%d:\nwctg%d:x:%d:\n" % (GROUP, GROUP, WCACHED_GID,
                                                               WCACHED_GID))
    os.chmod(nss, 0o755)
    wrap = ["unshare", "-m", "--propagation", "private", "sh", "-c",
            'mount --bind "$0/passwd" /etc/passwd && mount --bind "$0/group" /etc/group && '
            'exec "$@"', str(nss)]
    plain = wcached_run.as_user
    monkeypatch.setattr(wcached_run, "as_user", lambda *a, **k: wrap + plain(*a, **k))


@pytest.mark.parametrize("layout", ["roots-v1-in-place", "team-place-roots-shard"])
@pytest.mark.parametrize("acl", [True, False], ids=["acl-mask", "group-reads"])
def test_her_index_naming_roots_file_given_to_wcached_by_an_acl_waits(tmp_path, users_known,
                                                                     layout, acl):
    """Review rev222 H2: root's private file 0600 root:GROUP given to
    wcached alone by `setfacl -m u:wcached:r` (group::---, mask::r--) reads
    0640: the mode's group bits are the ACL's mask, and owner_may_read took
    it as readable to alice (in GROUP, known to the user database here): her
    index naming it was served. A file with an ACL is readable to another
    user only where both classes may read it: refused. The control
    (group-reads): 0640 root:GROUP with no ACL, which she may read, loads
    (wcached runs in GROUP to read it)."""
    d0, secret, put = her_index_layout(tmp_path, layout, mode=0o640)
    os.chown(secret, 0, GROUP)
    if acl:
        os.chmod(secret, 0o600)
        set_acl(secret, [(0x01, 6, 0xffffffff), (0x02, 4, DAEMON_UID), (0x04, 0, 0xffffffff),
                         (0x10, 4, 0xffffffff), (0x20, 0, 0xffffffff)])
    assert os.stat(secret).st_mode & 0o7777 == 0o640
    r = subprocess.run(as_user(ALICE_UID, GROUP) + ["cat", secret], capture_output=True)
    assert (r.returncode == 0) != acl, r
    with llama_warm(tmp_path, d0, gid=WCACHED_GID if acl else GROUP) as d:
        as_alice(put, d0)
        if acl:
            line = secret_not_served(d, secret, layout, r"its |.* may not read|generation 2 ")
            assert "%s is owned by uid 0 (mode 0640, group %d), which uid %d, the owner of " \
                "its shard index" % (secret, GROUP, ALICE_UID) in line, line
        else:
            _, line = d.wait_for_log(r'model "llama": (its |.* may not read|'
                                     r'generation 2 is current)')
            assert "generation 2 is current" in line, d.read_log()


def traced_by(pid):
    """The processes whose parent is pid (strace's tracee)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open("/proc/%s/stat" % entry) as f:
                stat = f.read()
        except (OSError, ValueError):
            continue
        if entry.isdigit() and int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry))
    return found


def test_each_shards_acl_is_asked_once_a_load(tmp_path, users_known):
    """The rules of a sharded model ask of a shard whether it has an
    access ACL (its group bits are then a mask): linked_in, as the tree's
    owner reads it, then index_owner_reads, as the writers of its index
    (its group's w bit) and its owner do. Each asked it of the file again,
    one fgetxattr of system.posix_acl_access each (58ebc92: 3 a shard,
    here); now asked once a load, the first time a rule needs it, then
    kept. alice's 0755 directory, her index 0664 alice:GROUP naming bob's
    three shards 0640 bob:GROUP, which she and her group may read: every
    rule asks, and the model loads. wcached runs under strace (-y names
    each descriptor's file), in GROUP to read the shards."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("no strace to count wcached's fgetxattr calls")
    d0 = made_by(tmp_path / "alice", ALICE_UID, 0o755)
    shards, weights = [], {}
    for k in range(3):
        shards.append(os.path.join(d0, "s%d.safetensors" % k))
        write_safetensors(shards[-1], {"t%d" % k: os.urandom(4096)})
        os.chown(shards[-1], BOB_UID, GROUP)
        os.chmod(shards[-1], 0o640)
        weights["t%d" % k] = os.path.basename(shards[-1])
    index = os.path.join(d0, "model.safetensors.index.json")
    with open(index, "w") as f:
        json.dump({"weight_map": weights}, f)
    os.chown(index, ALICE_UID, GROUP)
    os.chmod(index, 0o664)
    trace, wrap = tmp_path / "acl.strace", tmp_path / "strace-wcached"
    wrap.write_text('#!/bin/sh\nexec %s -f -qq -y -e trace=fgetxattr -o %s %s "$@"\n'
                    % (strace, trace, wcached_run.build_binary("wcached")))
    wrap.chmod(0o755)
    d = Daemon(tmp_path, {"llama": d0}, user=(DAEMON_UID, GROUP), nofile=1024)
    d.wcached = str(wrap)
    # LeakSanitizer cannot run under ptrace (an ASan build aborts at its
    # exit check): no leak check for this traced run.
    d.start(env=dict(os.environ, ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") +
                     ":detect_leaks=0"))
    try:
        d.wait_for_log(r'model "llama": generation 1 warm')
    finally:
        # strace blocks SIGTERM (-o FILE PROG): wcached, its child, gets it
        # and strace then exits with wcached's status.
        for pid in traced_by(d.proc.pid):
            os.kill(pid, signal.SIGTERM)
        assert d.stop() == 0, d.read_log()
    calls = [line for line in trace.read_text().splitlines()
             if 'fgetxattr(' in line and '"system.posix_acl_access"' in line]
    for path in shards + [index]:
        assert sum("<%s>" % path in line for line in calls) == 1, (path, calls)


# POSIX ACL entries (tag, perm, id) for set_acl: user::rw-, then those named, mask::r--.
ACL_OBJ = 0xffffffff


def alice_cat(path):
    """Whether alice (GROUP) may read path, as the kernel says."""
    return subprocess.run(as_user(ALICE_UID, GROUP) + ["cat", path],
                          capture_output=True).returncode == 0


@pytest.mark.parametrize("layout", ["team-place-roots-shard", "roots-v1-in-place"])
@pytest.mark.parametrize("acl", ["u-alice-none", "u-alice-r"])
def test_her_index_naming_a_file_its_acl_decides(tmp_path, users_known, layout, acl):
    """Review rev226 H1: root's 0644 file with `u:alice:---` (group::r--,
    mask::r--, other::r--) reads 0644, and the kernel refuses alice (the
    named entry comes before other): owner_may_read judged it by the mode's
    classes, which agree, and never read the ACL: her index naming it was
    served as her generation 2. The ACL is read as the kernel reads it:
    refused. The allow case (u-alice-r): root's 0640 root:wcached file with
    `u:alice:r--` (other::---), which she may read: before, an ACL meant
    "both classes must read" (refused); now it loads."""
    deny = acl == "u-alice-none"
    d0, secret, put = her_index_layout(tmp_path, layout, mode=0o644 if deny else 0o640)
    set_acl(secret, [(0x01, 6, ACL_OBJ), (0x02, 0 if deny else 4, ALICE_UID),
                     (0x04, 4, ACL_OBJ), (0x10, 4, ACL_OBJ), (0x20, 4 if deny else 0, ACL_OBJ)])
    assert os.stat(secret).st_mode & 0o7777 == (0o644 if deny else 0o640)
    assert alice_cat(secret) != deny
    with llama_warm(tmp_path, d0) as d:
        as_alice(put, d0)
        if deny:
            line = secret_not_served(d, secret, layout, r"its |.* may not read|generation 2 ")
            assert "%s is owned by uid 0 (mode 0644, group %d), which uid %d, the owner of " \
                "its shard index" % (secret, WCACHED_GID, ALICE_UID) in line, line
        else:
            _, line = d.wait_for_log(r'model "llama": (its |.* may not read|'
                                     r'generation 2 is current)')
            assert "generation 2 is current" in line, d.read_log()


@pytest.mark.parametrize("place", ["bobs-0755-dir", "roots-0755-slot"])
@pytest.mark.parametrize("acl", ["g-group-none", "g-group-r"])
def test_group_writable_index_naming_a_file_its_acl_decides(tmp_path, users_known, place, acl):
    """Review rev226 H1 through index_writers_read: the owner's 0644 file
    (OWNER:wcached) beside his 0664 OWNER:GROUP index, its ACL
    `group:GROUP:---`: alice, of GROUP, a writer of the index, may not
    read it; her in-place rewrite naming it was served (the mode's classes
    agree). Now refused. The allow case (g-group-r): a 0640 file
    (other::---) with `group:GROUP:r--`, which every member of GROUP may
    read: before, refused (an ACL and another group); now it loads."""
    deny = acl == "g-group-none"
    d0, secret, put = writers_index_layout(tmp_path, place, secret_mode=0o644 if deny else 0o640)
    set_acl(secret, [(0x01, 6, ACL_OBJ), (0x04, 4, ACL_OBJ), (0x08, 0 if deny else 4, GROUP),
                     (0x10, 4, ACL_OBJ), (0x20, 4 if deny else 0, ACL_OBJ)])
    assert os.stat(secret).st_mode & 0o7777 == (0o644 if deny else 0o640)
    assert alice_cat(secret) != deny
    with llama_warm(tmp_path, d0) as d:
        as_alice(put, d0)
        if deny:
            line = secret_not_served(d, secret, place, r"its |.* may not read|.* may write|"
                                     r"generation 2 ")
            assert "%s (mode 0644, group %d) is named by the shard index %s (mode 0664, " \
                "group %d), which users who may not read that file may write" % (
                    secret, WCACHED_GID, os.path.join(d0, "model.safetensors.index.json"),
                    GROUP) in line, line
        else:
            _, line = d.wait_for_log(r'model "llama": (its |.* may not read|.* may write|'
                                     r'generation 2 is current)')
            assert "generation 2 is current" in line, d.read_log()


@pytest.mark.parametrize("other", ["r", "none"])
def test_her_index_with_an_acl_is_judged_by_it(tmp_path, users_known, other):
    """A shard index's own ACL is read as the files' are: ac9aaec judged it
    untold (shards.c kept only whether it had one), so her index in root's
    team place refused to load wherever it had an ACL, as every new file
    gets where the place has a default ACL; before that, its mode's classes
    decided. Now shards.c keeps the bytes it read through the index's
    descriptor: `other::r--` lets root, the place's owner, read it (loads);
    `other::---` does not (refused, as a 0660 index of hers is), though a
    named entry lets wcached's user read it."""
    d0 = made_by(tmp_path / "team2", 0, 0o1775)
    sharded_model(d0, mkmodel(os.path.join(d0, "in.safetensors"), seed=1))
    index = os.path.join(d0, "model.safetensors.index.json")
    os.chown(index, ALICE_UID, GROUP)
    set_acl(index, [(0x01, 6, ACL_OBJ), (0x02, 6, BOB_UID), (0x02, 4, DAEMON_UID),
                    (0x04, 4, ACL_OBJ), (0x10, 6, ACL_OBJ),
                    (0x20, 4 if other == "r" else 0, ACL_OBJ)])
    d = Daemon(tmp_path, {"llama": d0}, user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
    try:
        _, line = d.wait_for_log(r'model "llama": (generation 1 warm|.* may not read)')
        if other == "r":
            assert "generation 1 warm" in line, d.read_log()
        else:
            assert "%s is owned by uid %d (mode 0660, group %d), which uid 0" % (
                index, ALICE_UID, GROUP) in line, line
    finally:
        assert d.stop() == 0, d.read_log()
