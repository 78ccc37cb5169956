"""The Python package across restarts of the real wcached: one Client keeps
working after SIGTERM or SIGKILL and a new wcached on the same socket; a
model from before stays readable, closing it reaches no daemon, and
safe_open's shared connection recovers the same way."""
import os
import sys

import numpy as np
import pytest

import wcache
from pyhelpers import binary, wait_until

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from restartutil import attached as count_attached, restart  # noqa: E402 (path set just above)


def checksums(model):
    return {k: int(model.raw(k).sum(dtype=np.uint64)) for k in model.keys()}


def attached(d):
    return count_attached(d, binary("wcachectl"))


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_client_survives_restart(daemon, how):
    c = wcache.connect(daemon.socket)
    before = c.attach("small")
    sums = checksums(before)
    restart(daemon, how)
    after = c.attach("small")            # no reconnect by hand
    assert checksums(after) == sums
    assert checksums(before) == sums     # the old mapping still reads
    wait_until(lambda: attached(daemon) == 1, what="the new attach to count")
    before.close()
    del before
    # Had the old model's release gone to the new daemon under a reused
    # handle, the new attach would be gone from the count.
    third = c.attach("small")
    wait_until(lambda: attached(daemon) == 2, what="the third attach to count")
    after.close()
    third.close()
    del after, third
    wait_until(lambda: attached(daemon) == 0, what="the releases to reach the new daemon")
    c.close()


def test_safe_open_after_restart(daemon):
    with wcache.safe_open("small") as f:
        assert f.model.source == "wcached"
        keys = f.keys()
    restart(daemon, "sigterm")
    with wcache.safe_open("small") as f:
        assert f.model.source == "wcached"
        assert f.keys() == keys


def test_daemon_gone_raises_unavailable(daemon):
    c = wcache.connect(daemon.socket)
    c.attach("small").close()
    assert daemon.stop() == 0
    with pytest.raises(wcache.DaemonUnavailable) as e:
        c.attach("small")
    assert "connecting again failed" in str(e.value)
    c.close()
