"""Connections that hold nothing cost the others nothing: when max_clients
are connected, a connection that has attached nothing and sent nothing for
a few seconds is closed to let a new worker in. Before, four users who may
attach no model, each holding max_clients_per_uid idle connections, kept
every worker out for as long as they stayed connected (review 173, F4)."""
import os
import time

from conftest import mkmodel, wait_until
from test_regressions import (ATTACH_OK, ERROR, SMALL, attach_or_refusal, attach_raw,
                              raw_client, ready, receive)
from test_regressions import start  # noqa: F401 (the fixture, used by name)


def attached(d, name):
    """A new connection with name attached on it, or None when wcached
    refused it (the refusal is read and the socket closed)."""
    s = raw_client(d)
    reply = attach_or_refusal(s, name)
    if reply[0] == ATTACH_OK:
        return s
    assert reply[0] == ERROR, reply
    s.close()
    return None


def test_an_idle_connection_makes_room_for_a_worker(start, tmp_path):
    d = start({"small": mkmodel(tmp_path / "small.safetensors", **SMALL)},
              extra="max_clients = 4\nmax_clients_per_uid = 4")
    ready(d, "small")
    worker = raw_client(d)
    assert attach_raw(worker, "small")[0] == ATTACH_OK
    hogs = [raw_client(d), raw_client(d), raw_client(d)]
    # One hog asks for something it may not have, then idles too.
    assert attach_raw(hogs[2], "nosuch")[0] == ERROR
    # Full, and nobody idle long enough yet: refused, as before.
    refused = raw_client(d)
    assert receive(refused)[0] == ERROR
    refused.close()
    # Within seconds a new worker gets in (before: refused for as long as
    # the idle connections stayed).
    newcomer = wait_until(lambda: attached(d, "small"), timeout=30, interval=0.5,
                          what="a new worker to be served while max_clients are connected")
    # The one idle the longest went, and was told why; the others stay.
    mtype, payload = receive(hogs[0])
    assert mtype == ERROR and b"this connection was idle with nothing attached" in payload, \
        payload
    assert hogs[0].recv(1) == b""
    for s in hogs[1:]:
        s.setblocking(False)
        try:
            s.recv(1)
            raise AssertionError("an idle connection that was not needed was closed")
        except BlockingIOError:
            pass
    # The worker that holds an attach is never taken for idle.
    assert attach_raw(worker, "small")[0] == ATTACH_OK
    assert attach_raw(newcomer, "small")[0] == ATTACH_OK
    log = d.read_log()
    assert f"uid {os.geteuid()}: idle for" in log and "closing the connection to make room" in log, log
    for s in [worker, newcomer] + hogs:
        s.close()


def test_when_every_connection_holds_something_the_newcomer_is_refused(start, tmp_path):
    d = start({"small": mkmodel(tmp_path / "small.safetensors", **SMALL)},
              extra="max_clients = 2\nmax_clients_per_uid = 2")
    ready(d, "small")
    held = [raw_client(d), raw_client(d)]
    for s in held:
        assert attach_raw(s, "small")[0] == ATTACH_OK
    # Past the idle time (5 s, daemon/server.c IDLE_EVICT_MS) nothing has
    # changed: what is waited for is time, no event.
    time.sleep(6)
    s = raw_client(d)
    mtype, payload = receive(s)
    assert mtype == ERROR and b"(max_clients)" in payload, payload
    s.close()
    for s in held:
        assert attach_raw(s, "small")[0] == ATTACH_OK
        s.close()
