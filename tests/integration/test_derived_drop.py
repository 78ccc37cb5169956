"""`wcachectl drop NAME [KEY]` (review rev181 F6): the operator's way to take
back a derived artifact that turned out wrong. Unheld ones go at once
(derived_bytes falls, the next DERIVE builds anew); a held one is attached no
more, stays whole for its holder and goes when released."""
import os

import pytest

from conftest import mkmodel, wait_until
from ctlutil import ctl, model_entry
from test_derived import (ARTIFACT, BUILD, DERIVE_CONF, Peer, artifact_bytes, closing,
                          memfd_with, publish_held, release, st_bytes)
from test_neighbours import control
from test_regressions import ready
from test_regressions import start  # noqa: F401 (the fixture, used by name)


@pytest.fixture
def served(start, tmp_path):  # noqa: F811 (start: the fixture)
    """A daemon serving "small" with derive = yes."""
    return start({"small": (mkmodel(tmp_path / "small.safetensors"), DERIVE_CONF)})


def derived_bytes(d):
    return control(d, "status")["memory"]["derived_bytes"]


def keys(d):
    return sorted(x["key"] for x in model_entry(d, "small")["derived"])


def test_drop_takes_back_unheld_and_held_artifacts(served):
    d = served
    ready(d, "small")
    a = Peer(d)
    release(a, publish_held(a, "k1", ARTIFACT))    # nobody holds it
    release(a, publish_held(a, "k2", ARTIFACT))
    held = publish_held(a, "k3", ARTIFACT)          # a worker holds it
    before = derived_bytes(d)
    assert keys(d) == ["k1", "k2", "k3"]

    # Unknown model or key: one line, exit 1, nothing dropped.
    r = ctl(d, "drop", "nosuch")
    assert r.returncode == 1 and 'no model "nosuch" is served' in r.stderr, r
    r = ctl(d, "drop", "small", "nokey")
    assert r.returncode == 1 and 'no derived artifact or build of key "nokey"' in r.stderr, r
    assert derived_bytes(d) == before

    # One unheld key: gone from status, its bytes no longer counted.
    r = ctl(d, "drop", "small", "k1")
    assert r.returncode == 0 and "dropped 1 derived artifact" in r.stdout, r
    assert keys(d) == ["k2", "k3"]
    assert derived_bytes(d) < before
    d.wait_for_log(r'derived "k1" of generation 1 dropped \(wcachectl drop\)')
    # The next DERIVE of it builds again; a drop meanwhile leaves the build be.
    a.derive("small", "k1")
    r = closing(a.reply())
    assert r["type"] == BUILD, r
    out = ctl(d, "drop", "small", "k1")
    assert out.returncode == 0, out
    assert out.stdout == ("model small: dropped 0 derived artifacts; 1 build in progress "
                          "left alone: what it publishes is served\n"), out
    fd = memfd_with(ARTIFACT)
    a.publish(r["token"], fd)
    os.close(fd)
    release(a, a.reply())

    # Every key: k2 goes, the held k3 is withdrawn.
    r = ctl(d, "drop", "small")
    assert r.returncode == 0, r
    assert r.stdout == ("model small: dropped 3 derived artifacts (1 of them still held by "
                        "workers: it goes when released)\n"), r
    # A new DERIVE of k3 builds a new one; the holder still reads the old bytes.
    other = st_bytes({"w": ("F32", [2], bytes(8))})
    fresh = publish_held(a, "k3", other)
    assert artifact_bytes(fresh) == other
    assert artifact_bytes(held) == ARTIFACT
    # Status lists the withdrawn k3 beside its replacement, marked (before,
    # the two rows looked alike).
    rows = sorted((x["key"], x["withdrawn"]) for x in model_entry(d, "small")["derived"])
    assert rows == [("k3", False), ("k3", True)], rows
    lines = [x for x in ctl(d, "status").stdout.splitlines() if x.startswith("  small k3 ")]
    assert [x.endswith(", withdrawn: attached no more, goes when released")
            for x in lines].count(True) == 1 and len(lines) == 2, lines
    release(a, fresh)
    # Released, the withdrawn one goes; the new one stays.
    release(a, held)
    d.wait_for_log(r'derived "k3" of generation 1 dropped \(its last holder released it '
                   r'after a drop\)')
    wait_until(lambda: keys(d) == ["k3"], what="the withdrawn k3 gone")
    assert derived_bytes(d) < before


def test_a_reload_that_turns_derive_off_drops_the_models_artifacts(served, tmp_path):
    """`derive = no` by a configuration reload: the model's artifacts were
    kept, unusable (DERIVE refused), holding memory until an unload (review
    rev181 F6). Now the reload drops them as `wcachectl drop NAME` does: the
    unheld one at once, the held one when its holder releases it."""
    d = served
    ready(d, "small")
    a = Peer(d)
    release(a, publish_held(a, "k1", ARTIFACT))
    held = publish_held(a, "k2", ARTIFACT)
    assert keys(d) == ["k1", "k2"]
    d.write_config({"small": str(tmp_path / "small.safetensors")})  # derive = no
    r = ctl(d, "reload")
    assert r.returncode == 0, r
    d.wait_for_log(r'model "small": derive is off now: 2 derived artifacts dropped '
                   r'\(1 of them held by workers: it goes when released\)')
    assert keys(d) == ["k2"]
    assert artifact_bytes(held) == ARTIFACT
    release(a, held)
    wait_until(lambda: keys(d) == [], what="the held artifact gone when released")
    assert derived_bytes(d) == 0
