"""Derived artifacts in the operator's views of memory (review rev181 F5):
they count against memory_budget, and now the views say so. `wcachectl
status`'s memory line says what they take and how many workers hold,
status JSON's "fits" weighs them beside the models against the limit in
force, and the log warns once when the ones workers hold alone take more
than memory_budget (the budget evicts every model it may and is still
exceeded)."""
import os
import re

import pytest

from conftest import Daemon, mkmodel
from ctlutil import ctl, daemons, status
from test_derived import (DERIVE_CONF, Peer, build, expect_error, memfd_with, publish_held,
                          release, st_bytes)
from test_memlimit import cgroup, make  # noqa: F401 (cgroup: the fixture, used by name)
from test_regressions import ready
from test_regressions import start  # noqa: F401 (the fixture, used by name)

MiB = 1 << 20
OVER = (r"derived artifacts that workers hold take [0-9.]+ MiB, more than memory_budget "
        r"\(3\.0 MiB\) alone")


def mib(n):
    """A byte count as wcachectl shows one of a MiB or more."""
    return f"{n / MiB:.1f} MiB"


def memory_line(d):
    r = ctl(d, "status")
    assert r.returncode in (0, 3), r
    return next(line for line in r.stdout.splitlines() if line.startswith("memory: "))


def test_held_artifacts_on_the_memory_line_and_one_warning_over_the_budget(
        start, tmp_path):  # noqa: F811 (start: the fixture)
    d = start({"small": (mkmodel(tmp_path / "small.safetensors"), DERIVE_CONF)},
              extra="memory_budget = 3M")
    ready(d, "small")
    assert memory_line(d).endswith(", derived none"), memory_line(d)
    blob = st_bytes({"w": ("U8", [1100 * 1024], bytes(1100 * 1024))})
    a = Peer(d)
    k0 = publish_held(a, "k0", blob)
    release(a, publish_held(a, "k1", blob))
    mem = status(d)["memory"]
    assert (mem["derived_artifacts"], mem["derived_held"]) == (2, 1), mem
    line = memory_line(d)
    assert line.endswith(f", derived {mib(mem['derived_bytes'])} (2 artifacts, 1 held)"), line

    # k2 and k3 held: k1, unheld, goes for the budget, and the three held
    # take 3.2 MiB of its 3: one warning, not one per publication.
    held = [publish_held(a, k, blob) for k in ("k2", "k3", "k4")]
    d.wait_for_log(OVER)
    assert memory_line(d).endswith(" (4 artifacts, 4 held)"), memory_line(d)
    assert len(re.findall(OVER, d.read_log())) == 1

    # Released, then a publication's budget check drops them: within the
    # budget again, so the next time past it is said again.
    for rep in held:
        release(a, rep)
    held = [publish_held(a, k, blob) for k in ("k5", "k6", "k7")]
    d.wait_for_log(OVER)
    assert len(re.findall(OVER, d.read_log())) == 2, d.read_log()
    for rep in held + [k0]:
        release(a, rep)


@pytest.fixture
def in_cgroup(tmp_path, cgroup):  # noqa: F811 (cgroup: the fixture)
    """start(models, extra): a Daemon in the test's memory cgroup."""
    yield from daemons(lambda models, extra, **kw: Daemon(tmp_path, models, extra,
                                                          cgroup=cgroup[1], **kw))


def test_fits_counts_derived_artifacts_against_the_limit(in_cgroup, tmp_path, cgroup):
    """No budget, a 128 MiB limit: an 80 MiB model fits, and with 60 MiB of
    artifacts beside it no longer does. Before, "fits" weighed the models
    alone and stayed true."""
    set_limit = cgroup[4]
    set_limit(128 * MiB)
    d = in_cgroup({"small": (make(tmp_path, "small", 1, 80 * MiB), DERIVE_CONF)}, "")
    ready(d, "small")
    assert status(d)["memory"]["fits"] is True
    blob = st_bytes({"w": ("U8", [30 * MiB], bytes(30 * MiB))})
    a = Peer(d)
    held = [publish_held(a, k, blob) for k in ("k0", "k1")]
    mem = status(d)["memory"]
    assert mem["models_bytes"] <= mem["limit"] < mem["models_bytes"] + mem["derived_bytes"], mem
    assert mem["fits"] is False, mem
    out = ctl(d, "status").stdout
    assert ("warning: the models and derived artifacts do not fit under the memory limit: the "
            "kernel reclaims the models' pages") in out, out
    for rep in held:
        release(a, rep)


def test_a_publication_past_the_limit_with_the_artifacts_kept_is_refused(in_cgroup, tmp_path,
                                                                         cgroup):
    """Review rev183 F1: wcached's copy of an artifact is charged to its own
    memory cgroup, and without swap the kernel cannot reclaim it. In a 96 MiB
    cgroup, two 40 MiB artifacts are kept (one held, one not); a third would
    take 120 MiB: it is refused (ENOMEM) with one line naming what is kept and
    the limit, and wcached goes on serving. Before, the third copy ran the
    cgroup past its limit and its OOM killer killed wcached."""
    set_limit = cgroup[4]
    set_limit(96 * MiB)
    d = in_cgroup({"small": (mkmodel(tmp_path / "small.safetensors"), DERIVE_CONF)}, "")
    ready(d, "small")
    blob = st_bytes({"w": ("U8", [40 * MiB], bytes(40 * MiB))})
    a = Peer(d)
    held = publish_held(a, "k0", blob)
    release(a, publish_held(a, "k1", blob))
    r = build(a, key="k2")
    fd = memfd_with(blob)
    a.publish(r["token"], fd)
    os.close(fd)
    text = expect_error(a.reply(), "ENOMEM", "small", "k2",
                        "wcached keeps or is copying 80 MiB of derived artifacts, and this "
                        "one's 40 MiB would pass the memory limit in force (96 MiB,")
    assert "\n" not in text, text
    assert d.proc.poll() is None, d.read_log()
    assert status(d)["memory"]["derived_artifacts"] == 2
    release(a, held)
