"""Connections that hold nothing cost the others nothing: when max_clients
are connected, a connection that has attached nothing and sent nothing for
a few seconds is closed to let a new worker in. Before, four users who may
attach no model, each holding max_clients_per_uid idle connections, kept
every worker out for as long as they stayed connected (review 173, F4).

The per-uid limit is checked before max_clients, so the connections here
are of two users: root's, and HOG_UID's, made by this process with its
effective ids switched (the kernel takes a connection's credentials at
connect(2))."""
import os
import time

import pytest

from conftest import mkmodel, wait_until
from test_regressions import (ATTACH_OK, ERROR, SMALL, attach_or_refusal, attach_raw,
                              raw_client, ready, receive)
from test_regressions import start  # noqa: F401 (the fixture, used by name)
from test_neighbours import metric

# Ids no account uses (as in test_neighbours.py): wcached's user, another
# user, and the group whose members may connect to the 0660 socket.
DAEMON_UID, HOG_UID, GROUP = 64101, 64102, 64100

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root to connect as another user")


def start_as_user(start, tmp_path, extra):
    """wcached as DAEMON_UID with the model small, ready."""
    d = start({"small": mkmodel(tmp_path / "small.safetensors", **SMALL)}, extra=extra,
              user=(DAEMON_UID, GROUP))
    ready(d, "small")
    return d


def client_of(d, uid):
    """A new connection whose peer is uid (GROUP)."""
    os.setegid(GROUP)
    os.seteuid(uid)
    try:
        return raw_client(d)
    finally:
        os.seteuid(0)
        os.setegid(0)


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


def still_open(s):
    """Whether s has nothing to read and is not closed."""
    s.setblocking(False)
    try:
        s.recv(1)
        return False
    except BlockingIOError:
        return True
    finally:
        s.setblocking(True)


def test_an_idle_connection_makes_room_for_a_worker(start, tmp_path):
    d = start_as_user(start, tmp_path, "max_clients = 4\nmax_clients_per_uid = 4")
    worker = raw_client(d)
    assert attach_raw(worker, "small")[0] == ATTACH_OK
    hogs = [client_of(d, HOG_UID) for _ in range(3)]
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
    assert all(still_open(s) for s in hogs[1:]), \
        "an idle connection that was not needed was closed"
    # The worker that holds an attach is never taken for idle.
    assert attach_raw(worker, "small")[0] == ATTACH_OK
    assert attach_raw(newcomer, "small")[0] == ATTACH_OK
    log = d.read_log()
    assert f"uid {HOG_UID}: idle for" in log and "closing the connection to make room" in log, log
    assert metric(d, "wcached_clients_closed_idle_total") == 1
    for s in [worker, newcomer] + hogs:
        s.close()


def test_when_every_connection_holds_something_the_newcomer_is_refused(start, tmp_path):
    d = start_as_user(start, tmp_path, "max_clients = 2\nmax_clients_per_uid = 2")
    held = [raw_client(d), raw_client(d)]
    for s in held:
        assert attach_raw(s, "small")[0] == ATTACH_OK
    # Past the idle time (5 s, daemon/server.c IDLE_EVICT_MS) nothing has
    # changed: what is waited for is time, no event.
    time.sleep(6)
    # Another user's newcomer (root's own meets max_clients_per_uid first).
    s = client_of(d, HOG_UID)
    mtype, payload = receive(s)
    assert mtype == ERROR and b"(max_clients)" in payload, payload
    s.close()
    for s in held:
        assert attach_raw(s, "small")[0] == ATTACH_OK
        s.close()


def test_a_refused_newcomer_closes_no_idle_connection(start, tmp_path):
    """A newcomer refused for max_clients_per_uid had another user's idle
    connection closed for it first (make_room ran before the per-uid
    check): a user at its limit, connecting in a loop while max_clients
    were connected, closed one idle connection of others per connect and
    got nothing for it (review 175, F10)."""
    d = start_as_user(start, tmp_path, "max_clients = 3\nmax_clients_per_uid = 2")
    idle = client_of(d, HOG_UID)  # idle: the one make_room would take
    greedy = [raw_client(d), raw_client(d)]  # root at its max_clients_per_uid, busy
    for s in greedy:
        assert attach_raw(s, "small")[0] == ATTACH_OK
    # max_clients are connected. Past the idle time (5 s, daemon/server.c
    # IDLE_EVICT_MS) the idle connection may be taken to make room: what is
    # waited for is time, no event.
    time.sleep(6)
    for _ in range(3):
        s = raw_client(d)
        mtype, payload = receive(s)
        assert mtype == ERROR and b"(max_clients_per_uid)" in payload, payload
        s.close()
    assert still_open(idle), "the idle connection was closed for a refused newcomer"
    assert attach_raw(idle, "small")[0] == ATTACH_OK
    assert "closing the connection to make room" not in d.read_log()
    assert metric(d, "wcached_clients_closed_idle_total") == 0
    for s in [idle] + greedy:
        s.close()
