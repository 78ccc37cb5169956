"""A derived artifact taken back at a warm restart obeys what a PUBLISH and
the configuration would let in now (review rev181 F10, F6; README,
"Derived weights", "Restarts"): an artifact whose compiled index or header
is over the limits a publication enforces (derive.h: DERIVE_MAX_INDEX,
DERIVE_MAX_HEAD, 16 MiB each), stored by a wcached without them, is
refused; so is every artifact of a model whose derive is off now, and one
whose builder may not build now (derive_groups narrowed). Each refusal is
one line naming the model, the key and the reason, and the artifact's
descriptors leave the store. Before, all of them were taken back.

Whether its builder may build now is judged by the gid and groups its
connection had when it published, which the store records (format version
7), as a connection of them would be judged now: a numeric uid that the
user database does not know (a Kubernetes pod's runAsUser) keeps its
artifact while its groups are allowed. Only an artifact of a version 6
store, which recorded the uid alone, has the user database asked.

The restarts are test_derived_restart.py's, under test_warm_restart.py's
fake service manager; the stored state is changed between the two
processes as a wcached without those rules, or another configuration,
would have left it (test_stage_restore.py's walk of the description)."""
import contextlib
import fcntl
import json
import os
import pwd
import struct

import pytest

from conftest import Daemon, mkmodel
from ctlutil import ctl, model_entry
from fakemanager import FakeManager
from test_derived import ARTIFACT, ATTACH_OK, ERRNO, ERROR, Peer, build, closing, \
    memfd_with, st_bytes, take_artifact
from test_derived_restart import KEY, artifact_names, derive_now, publish, restart
from test_regressions import ready
from test_stage_restore import older_version, walk
from test_warm_restart import start

MiB = 1 << 20
# The name the artifact's reader gives its one file in the compiled index
# (restore_job.c's label "<model> derived <key>"): a model file of this
# name compiles to the index the artifact's bytes compile to.
LABEL = f"small derived {KEY}"


def many_tensors():
    """A safetensors file whose compiled index is over 16 MiB (48-byte
    records, 8-byte shapes, names) while its header is under 16 MiB."""
    names = [f"t{i:06d}" for i in range(280000)]
    h = "{" + ",".join(f'"{n}":{{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}'
                       for n in names) + "}"
    h = h.encode() + b" " * (-len(h) % 8)
    assert len(h) < 16 * MiB
    return struct.pack("<Q", len(h)) + h


def padded_header():
    """A safetensors file of one small tensor whose header is padded with
    spaces past 16 MiB: its compiled index is small."""
    h = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}},
                   separators=(",", ":")).encode()
    h += b" " * (17 * MiB - len(h))
    return struct.pack("<Q", len(h)) + h + bytes(16)


def sealed(data, name):
    fd = memfd_with(data, name)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW |
                fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)
    return fd


def patched_description(names, fds, version=7, **fields):
    """Replaces the stored description (wc-desc) with one whose artifacts
    (KEY, and any other) have fields ({"size": n, ...}: u64; builder_uid,
    builder_gid u32; groups: each of the builder's groups becomes that
    u32) changed, written as version (6: without the builders' groups)."""
    at = names.index("wc-desc")
    desc = bytearray(os.pread(fds[at], os.fstat(fds[at]).st_size, 0))
    artifacts = walk(bytes(desc))[2]
    assert KEY in [a["key"] for a in artifacts], artifacts
    for a in artifacts:
        for field, value in fields.items():
            width = 4 if field in ("builder_uid", "builder_gid", "groups") else 8
            for off in a[field] if field == "groups" else [a[field]]:
                desc[off:off + width] = value.to_bytes(width, "little")
    if version != 7:
        desc = older_version(bytes(desc), version)
    fd = sealed(bytes(desc), "wcached-fdstore")
    os.dup2(fd, fds[at], inheritable=True)
    os.close(fd)


def refused(d, mgr, reason, builds_again=True, stored_as=1):
    """The log says once that the artifact was not restored, for reason;
    the model came back without it, and its names (artifact_names of
    stored_as) left the store."""
    log = d.read_log()
    line = f'model "small": derived "{KEY}" of generation 1 not restored: {reason}'
    line += "; the next DERIVE of it builds it again" if builds_again else "\n"
    assert log.count(line) == 1, log
    assert f'derived "{KEY}" of generation 1 taken back' not in log, log
    assert 'model "small": generation 1 restored from the file descriptor store' in log, log
    mgr.wait_for(lambda m: not any(n in m.store for n in artifact_names(stored_as)),
                 what="the refused artifact removed from the store")
    assert model_entry(d, "small")["derived"] == []


def taken_back(d):
    log = d.read_log()
    assert f'model "small": derived "{KEY}" of generation 1 taken back from the store' \
        in log, log
    r = derive_now(d)
    assert r["type"] == ATTACH_OK and take_artifact(r) == ARTIFACT, r


def publication_refused(d, data):
    """A PUBLISH of data (as key "big") is refused, EFBIG: its text."""
    peer = Peer(d)
    r = build(peer, key="big")
    fd = memfd_with(data)
    peer.publish(r["token"], fd)
    os.close(fd)
    r = closing(peer.reply(timeout=60))
    peer.close()
    assert r["type"] == ERROR and r["code"] == ERRNO["EFBIG"], r
    return r["text"]


@contextlib.contextmanager
def serving(tmp_path, models, keys=None, data=ARTIFACT):
    """Starts a daemon serving "small" (derive = yes, and keys) and models
    under a fake manager, publishes data as KEY and waits until it is
    stored: (d, mgr), which stop at the end (the daemon exiting 0: under
    ASan, nothing leaked)."""
    small = mkmodel(tmp_path / "small.safetensors")
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    conf = {"small": (small, dict({"derive": "yes"}, **(keys or {})))}
    d = Daemon(tmp_path, dict(conf, **models))
    try:
        start(d, mgr)
        ready(d, "small")
        publish(d, data)
        mgr.wait_for(lambda m: all(n in m.store for n in artifact_names(1)),
                     what="the artifact's memfd and index stored")
        yield d, mgr
    finally:
        code = d.stop()
        mgr.close()
    assert code == 0, d.read_log()


@pytest.mark.parametrize("limit", ["index", "header"])
def test_an_artifact_over_a_publications_limits_is_not_taken_back(tmp_path, limit):
    """The stored artifact becomes one a wcached without the limit would
    have kept: bytes a PUBLISH now refuses (EFBIG), with the index they
    compile to, which the daemon itself compiled for a model file of the
    artifact's label."""
    data = many_tensors() if limit == "index" else padded_header()
    os.mkdir(tmp_path / "forge")
    forge = tmp_path / "forge" / LABEL
    forge.write_bytes(data)
    with serving(tmp_path, {"forge": str(forge)}) as (d, mgr):
        ready(d, "forge")
        # A publication of these bytes is refused for that limit.
        text = publication_refused(d, data)
        assert f"its {'compiled index' if limit == 'index' else 'header'} " in text, text
        index = [n for n in mgr.store if n.startswith("wc-") and n.endswith("-1-i") and
                 n != "wc-1-1-i"]
        assert len(index) == 1, sorted(mgr.store)
        assert d.stop() == 0, d.read_log()

        index_size = []

        def forged(names, fds):
            memfd, index_at = names.index(artifact_names(1)[0]), names.index(index[0])
            fd = sealed(data, "artifact")
            os.dup2(fd, fds[memfd], inheritable=True)
            os.close(fd)
            os.dup2(fds[index_at], fds[names.index(artifact_names(1)[1])], inheritable=True)
            index_size.append(os.fstat(fds[index_at]).st_size)
            assert (index_size[0] > 16 * MiB) == (limit == "index"), index_size
            patched_description(names, fds, size=len(data), index_size=index_size[0])

        restart(d, mgr, forge=forged)
        if limit == "index":
            reason = (f"its compiled index is {index_size[0] / MiB:.1f} MiB, more than the 16 MiB "
                      "one derived artifact's index may be (a PUBLISH of it is refused)")
        else:
            reason = ("its header is 17.0 MiB, more than the 16 MiB a derived artifact's "
                      "header may be (a PUBLISH of it is refused)")
        refused(d, mgr, reason, builds_again=False)


def test_an_artifact_over_memory_budget_now_is_not_taken_back(tmp_path):
    """memory_budget set while no wcached ran below one artifact's size
    (its memfd and compiled index, as a PUBLISH weighs it, which refuses
    it then): the artifact is not taken back."""
    data = st_bytes({"w": ("U8", [2 * MiB], bytes(2 * MiB))})
    with serving(tmp_path, {}, data=data) as (d, mgr):
        with mgr.lock:
            index = mgr.store[artifact_names(1)[1]][0]
            index_kib = os.fstat(index).st_size >> 10
        assert d.stop() == 0, d.read_log()
        d.write_config({"small": (str(tmp_path / "small.safetensors"), {"derive": "yes"})},
                       "memory_budget = 1M\n")
        restart(d, mgr)
        refused(d, mgr, f"2 MiB (2 MiB of memfd and {index_kib} KiB of compiled index) is "
                "more than memory_budget (1 MiB) (a PUBLISH of it is refused)",
                builds_again=False)
        # As a publication of it now is.
        assert "more than memory_budget (1 MiB)" in publication_refused(d, data)


def test_an_artifact_of_a_model_whose_derive_is_off_now_is_not_taken_back(tmp_path):
    """derive = no while no wcached ran: the artifact is not taken back, as
    a reload that turns derive off drops it (348cb04), and no DERIVE builds
    it again (the line says nothing of that)."""
    with serving(tmp_path, {}) as (d, mgr):
        assert d.stop() == 0, d.read_log()
        d.write_config({"small": str(tmp_path / "small.safetensors")})
        restart(d, mgr)
        refused(d, mgr, "derive is off now (derive = no), as a reload that turns it off "
                "drops the model's artifacts", builds_again=False)


def stored_builders(m):
    """The builder of each artifact in the description m stores now: {key:
    (uid, gid, [groups])}, gid and groups None in a version 6 one; {}
    while none is stored (between the removal of one and the next)."""
    if not m.store.get("wc-desc"):
        return {}
    fd = m.store["wc-desc"][0]
    desc = os.pread(fd, os.fstat(fd).st_size, 0)

    def u32(at):
        return int.from_bytes(desc[at:at + 4], "little")
    return {a["key"]: (u32(a["builder_uid"]),
                       u32(a["builder_gid"]) if "builder_gid" in a else None,
                       [u32(g) for g in a["groups"]] if "groups" in a else None)
            for a in walk(desc)[2]}


def stored_as(mgr, key, builder, what):
    mgr.wait_for(lambda m: stored_builders(m).get(key) == builder, what=what)


def test_a_builder_is_judged_by_the_groups_stored_with_its_artifact(tmp_path):
    """The store records the gid and groups the publishing connection had
    (its peer credentials); a warm restart judges derive_groups by them,
    not by the user database: an artifact whose builder is a numeric uid
    the database does not know is taken back while its stored groups are
    allowed (before, the unknown uid was refused at every restart, its
    groups untold), stored again with them, and refused once they are not
    (a gid not in derive_groups, and no supplementary group that is)."""
    allowed, other = 64250, 64251
    stranger = next(u for u in range(64302, 64400) if not known(u))
    keys = {"derive_groups": str(allowed)}
    with serving(tmp_path, {}, keys) as (d, mgr):
        # Root published it (root may always build): recorded as its
        # connection had it.
        mine = (os.geteuid(), os.getegid(), sorted(os.getgroups()))
        # (Asked once per look: the store may be between descriptions.)
        def stored_mine(m):
            b = stored_builders(m).get(KEY)
            return b is not None and b[:2] == mine[:2] and sorted(b[2] or []) == mine[2]
        mgr.wait_for(stored_mine, what="the publisher's uid, gid and groups stored")
        assert d.stop() == 0, d.read_log()
        # As a pod of an unknown uid whose gid and groups are allowed had.
        restart(d, mgr, forge=lambda names, fds: patched_description(
            names, fds, builder_uid=stranger, builder_gid=allowed, groups=allowed))
        taken_back(d)
        assert "user database" not in d.read_log(), d.read_log()
        (art,) = model_entry(d, "small")["derived"]
        assert art["builder_uid"] == stranger, art
        # Stored again with those groups: the next restart keeps it too.
        groups = [allowed] * len(mine[2])
        stored_as(mgr, KEY, (stranger, allowed, groups), "the builder's groups stored again")
        assert d.stop() == 0, d.read_log()
        restart(d, mgr)
        taken_back(d)
        assert d.stop() == 0, d.read_log()
        # Its gid and groups not allowed: refused, naming them.
        restart(d, mgr, forge=lambda names, fds: patched_description(
            names, fds, builder_gid=other, groups=other))
        refused(d, mgr, f"its builder uid {stranger} may not build it now: none of its "
                f"groups (gid {other} and {len(groups)} supplementary, as its connection "
                "had them when it published) is in derive_groups")


def test_a_reload_that_narrows_derive_groups_drops_what_a_restart_would_refuse(tmp_path):
    """A reload that narrows derive_groups (derive staying on) drops the
    artifacts whose builder may no longer build, by the groups stored with
    them, as a warm restart refuses them; before, the reload kept them
    (served to every DERIVE) while the next restart dropped them. One whose
    builder's groups are still allowed stays."""
    allowed, other = 64250, 64251
    stranger = next(u for u in range(64302, 64400) if not known(u))
    keys = {"derive_groups": f"{allowed} {other}"}
    with serving(tmp_path, {}, keys) as (d, mgr):
        publish(d, key="other")
        mgr.wait_for(lambda m: all(n in m.store for n in artifact_names(2)),
                     what="the second artifact stored")
        assert d.stop() == 0, d.read_log()

        def forged(names, fds):
            """KEY as built by the stranger in group allowed, "other" in
            group other (each the builder's gid and every group)."""
            at = names.index("wc-desc")
            desc = bytearray(os.pread(fds[at], os.fstat(fds[at]).st_size, 0))
            for a in walk(bytes(desc))[2]:
                gid = allowed if a["key"] == KEY else other
                for off, value in [(a["builder_uid"], stranger), (a["builder_gid"], gid)] + \
                        [(g, gid) for g in a["groups"]]:
                    desc[off:off + 4] = value.to_bytes(4, "little")
            fd = sealed(bytes(desc), "wcached-fdstore")
            os.dup2(fd, fds[at], inheritable=True)
            os.close(fd)

        restart(d, mgr, forge=forged)
        derived = model_entry(d, "small")["derived"]
        assert sorted(a["key"] for a in derived) == [KEY, "other"], derived
        small = {"small": (str(tmp_path / "small.safetensors"),
                           {"derive": "yes", "derive_groups": str(allowed)})}
        d.write_config(small)
        r = ctl(d, "reload")
        assert r.returncode == 0, r
        d.wait_for_log(r'model "small": derive_groups changed: 1 derived artifact whose '
                       r'builder may no longer build dropped \(0 of them held by workers: '
                       r'they go when released\)')
        assert 'derived "other" of generation 1 dropped (derive_groups)' in d.read_log()
        assert [a["key"] for a in model_entry(d, "small")["derived"]] == [KEY]
        mgr.wait_for(lambda m: not any(n in m.store for n in artifact_names(2)),
                     what="the dropped artifact removed from the store")
        taken_back(d)


def test_a_version_6_artifact_has_its_builders_groups_asked_of_the_user_database(tmp_path):
    """Two artifacts of a version 6 store (which recorded the builder's uid
    alone), built by a user the database knows (nobody), in derive_groups
    by its primary group: taken back while it is (the database asked once
    for both), and stored again as version 7 with their groups "not
    recorded", so that the next restart asks again; refused once
    derive_groups no longer holds that group, and when their builder is a
    uid the database does not know (its groups then cannot be told)."""
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody in the user database")
    keys = {"derive_groups": str(nobody.pw_gid)}
    unrecorded = (nobody.pw_uid, 0xffffffff, [])
    with serving(tmp_path, {}, keys) as (d, mgr):
        small = {"small": (str(tmp_path / "small.safetensors"), dict(keys, derive="yes"))}
        publish(d, key="other")
        mgr.wait_for(lambda m: all(n in m.store for n in artifact_names(2)),
                     what="the second artifact stored")
        assert d.stop() == 0, d.read_log()
        # Root published it (root may always build): as nobody had, in a
        # version 6 store.
        restart(d, mgr, forge=lambda names, fds: patched_description(
            names, fds, version=6, builder_uid=nobody.pw_uid))
        taken_back(d)
        derived = model_entry(d, "small")["derived"]
        assert sorted(a["key"] for a in derived) == [KEY, "other"], derived
        assert all(a["builder_uid"] == nobody.pw_uid for a in derived), derived
        stored_as(mgr, KEY, unrecorded, "the artifact stored again, its groups not recorded")
        stored_as(mgr, "other", unrecorded, "the other stored again, its groups not recorded")
        assert d.stop() == 0, d.read_log()
        # derive_groups narrowed to a group nobody is not in.
        small["small"][1]["derive_groups"] = "64200"
        d.write_config(small)
        restart(d, mgr)
        groups = len(os.getgrouplist("nobody", nobody.pw_gid))
        refused(d, mgr, f"its builder uid {nobody.pw_uid} may not build it now: none of its "
                f"groups (primary {nobody.pw_gid} and {groups} in all, by the user "
                "database) is in derive_groups")
        assert 'derived "other" of generation 1 not restored: its builder uid' in \
            d.read_log(), d.read_log()
        mgr.wait_for(lambda m: not any(n in m.store for n in artifact_names(2)),
                     what="the second refused artifact removed from the store")
        # Built again (by root), and stored (version 6) as built by a uid
        # nobody knows.
        publish(d)
        mgr.wait_for(lambda m: all(n in m.store for n in artifact_names(3)),
                     what="the rebuilt artifact stored")
        assert d.stop() == 0, d.read_log()
        stranger = next(u for u in range(64302, 64400) if not known(u))
        small["small"][1]["derive_groups"] = str(nobody.pw_gid)
        d.write_config(small)
        restart(d, mgr, forge=lambda names, fds: patched_description(
            names, fds, version=6, builder_uid=stranger))
        refused(d, mgr, f"its builder uid {stranger} may not build it now: the user database "
                "has no entry for it, so no group of it is in derive_groups (the groups it "
                "built with are not stored)", stored_as=3)


def known(uid):
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False
