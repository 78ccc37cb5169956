"""Derived artifacts across a warm restart (issue 20): under the fake service
manager of test_warm_restart.py, a worker builds and publishes an artifact;
wcached hands the manager its sealed memfd and index (wc-<slot>-d<n>-a and
-i) with the model's generation, and the next process takes them back.
A DERIVE of the same key is then answered at once (ATTACH_OK, no BUILD) with
the same bytes, and status lists the artifact with its builder. An artifact
whose stored memfd is not what wcached sealed is refused in one line naming
the model, the key and the reason, and the next DERIVE builds it again.

The raw wire client is test_derived.py's; the restart is
test_warm_restart.py's (a wrapper execs wcached with the stored descriptors
at 3.. and LISTEN_FDS/LISTEN_FDNAMES)."""
import os

from conftest import Daemon, mkmodel, wait_until
from ctlutil import model_entry
from fakemanager import FakeManager
from test_derived import ARTIFACT, ATTACH_OK, BUILD, Peer, artifact_bytes, build, closing, \
    memfd_with
from test_regressions import ready
from test_warm_restart import start

KEY = "f32-v1"
SLOT = 1  # the only model: status slot 1


def artifact_names(n):
    return f"wc-{SLOT}-d{n}-a", f"wc-{SLOT}-d{n}-i"


def publish(d, data=ARTIFACT, key=KEY):
    """Builds key of "small" and publishes data; the builder's attach
    is released when its connection closes."""
    peer = Peer(d)
    r = build(peer, key=key)  # asserts a BUILD
    assert r["type"] == BUILD and r["generation"] == 1, r
    fd = memfd_with(data)
    peer.publish(r["token"], fd)
    os.close(fd)
    mine = peer.reply(timeout=60)
    assert artifact_bytes(mine) == data
    closing(mine)
    peer.close()


def derive_now(d):
    """A DERIVE of KEY that must not wait: its reply."""
    peer = Peer(d)
    peer.derive("small", KEY, wait_ms=0)
    r = peer.reply()
    peer.close()
    return r


def started_with_artifact(tmp_path):
    """A daemon under mgr that published KEY and stopped: (d, mgr)."""
    model = mkmodel(tmp_path / "small.safetensors")
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    d = Daemon(tmp_path, {"small": (model, {"derive": "yes"})})
    start(d, mgr)
    ready(d, "small")
    publish(d)
    mgr.wait_for(lambda m: all(n in m.store for n in artifact_names(1)),
                 what="the artifact's memfd and index stored")
    assert d.stop() == 0, d.read_log()
    return d, mgr


def restart(d, mgr, forge=None):
    """Starts d again with the store; forge(names, fds) may change it first."""
    fds, names = mgr.listen_fds()
    if forge is not None:
        forge(names, fds)
    start(d, mgr, fds, names)
    ready(d, "small")


def test_an_artifact_survives_a_warm_restart(tmp_path):
    d, mgr = started_with_artifact(tmp_path)
    try:
        restart(d, mgr)
        log = d.read_log()
        assert 'model "small": generation 1 restored from the file descriptor store' in log, log
        assert f'model "small": derived "{KEY}" of generation 1 taken back from the store' \
            in log, log
        assert "not restored" not in log, log
        # Served at once, the same bytes, nobody asked to build.
        r = derive_now(d)
        assert r["type"] == ATTACH_OK and r["generation"] == 1, r
        assert artifact_bytes(r) == ARTIFACT
        closing(r)
        (art,) = model_entry(d, "small")["derived"]
        assert art["key"] == KEY and art["state"] == "ready", art
        assert art["source_generation"] == 1 and art["bytes"] == len(ARTIFACT), art
        assert art["builder_pid"] == os.getpid(), art
        # It stays in the store under its names, for the next restart.
        assert all(n in mgr.store for n in artifact_names(1)), sorted(mgr.store)
        assert d.stop() == 0, d.read_log()
        restart(d, mgr)
        r = derive_now(d)
        assert r["type"] == ATTACH_OK and artifact_bytes(r) == ARTIFACT, r
        closing(r)
    finally:
        code = d.stop()
        mgr.close()
    assert code == 0, d.read_log()


def unsealed(names, fds):
    """The artifact's memfd in the store becomes one with the same bytes,
    never sealed."""
    at = names.index(artifact_names(1)[0])
    fake = memfd_with(ARTIFACT, "unsealed")
    os.dup2(fake, fds[at], inheritable=True)
    os.close(fake)


def test_an_unsealed_stored_artifact_is_refused_and_built_again(tmp_path):
    d, mgr = started_with_artifact(tmp_path)
    try:
        restart(d, mgr, forge=unsealed)
        log = d.read_log()
        line = (f'model "small": derived "{KEY}" of generation 1 not restored: its memfd is '
                "not sealed against writing, shrinking, growing and unsealing; the next "
                "DERIVE of it builds it again")
        assert log.count(line) == 1, log
        assert log.count(f'derived "{KEY}"') == 1, log
        # The model itself came back.
        assert 'model "small": generation 1 restored from the file descriptor store' in log, log
        # Both of its names left the store (the index was not used either).
        mgr.wait_for(lambda m: not any(n in m.store for n in artifact_names(1)),
                     what="the refused artifact removed from the store")
        assert model_entry(d, "small")["derived"] == []
        # Built again on demand (a BUILD, not an ATTACH_OK), and stored
        # under a name not used before.
        publish(d)
        mgr.wait_for(lambda m: all(n in m.store for n in artifact_names(2)),
                     what="the rebuilt artifact stored")
        wait_until(lambda: model_entry(d, "small")["derived"][0]["state"] == "ready",
                   what="the rebuilt artifact served")
    finally:
        code = d.stop()
        mgr.close()
    assert code == 0, d.read_log()
