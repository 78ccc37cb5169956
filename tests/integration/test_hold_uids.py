"""HOLD places per uid across warm restarts (review rev173 F10, c76bcef;
PROTOCOL.md "HOLD"), with real uids: wcached runs as an unprivileged user
under tests/pyutil/fakemanager.py's fake service manager, and workers of
two uids, A and B, hold generation 1 of two models when it is replaced and
wcached restarts warm. The store records each generation's holders by uid,
and the restarted wcached gives each uid only its own places: A and B take
theirs back (libwcache's HOLD when the worker reconnects), neither can take
the other's place while it is still free, a third uid C that may attach the
models can take none, and a uid past its own places is refused (EUSERS).
A second restart in the middle of the wait keeps the places as they were:
those taken (now the HOLDs' references, by uid) and those not yet taken.

Needs root (setpriv switches users); the workers are
tests/tools/restart_worker.c, the refused HOLDs raw ones (test_peer_security's
hold) on connections made by a process of the uid."""
import errno
import os
import shutil
import socket
import subprocess
import sys

import pytest

from conftest import TEST_USER, Daemon, as_user, binary, mkmodel, parse_user, wait_until
from test_peer_security import ERROR, hold
from test_restart import Worker
from test_restart_held import current, generations, swap
from test_stage_restore import description_in, walk
from test_warm_restart import FakeManager, ready, start  # FakeManager: tests/pyutil

# The daemon's user, and the workers' (uids no other test uses; they need
# not exist).
DAEMON = parse_user(TEST_USER) if TEST_USER else (64131, 64100)
A, B, C = (64132, 64100), (64133, 64100), (64134, 64100)

# Run as a uid: connects the socket passed at argv[1] to the path argv[2],
# so that its peer credentials are that uid's; the caller keeps it.
CONNECT = "import socket, sys; socket.socket(fileno=int(sys.argv[1])).connect(sys.argv[2])"


class UidWorker(Worker):
    """test_restart's Worker (restart_worker, libwcache) run as user."""

    def __init__(self, d, name, user):
        self.p = subprocess.Popen([*as_user(*user), binary("restart_worker"), "--socket",
                                   d.socket, name], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.first = self.answer()


def hold_as(d, user, name, number):
    """A HOLD of name's generation number on a new connection of user's;
    returns (type, errno or handle, text). The connection is closed after."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        subprocess.run([*as_user(*user), sys.executable, "-c", CONNECT, str(s.fileno()),
                        d.socket], pass_fds=[s.fileno()], check=True, timeout=60)
        s.settimeout(60)
        return hold(s, name, number, 1)
    finally:
        s.close()


def attached(d, name, number):
    return generations(d)[name][number]["attached"]


def restart(d, mgr):
    """Stops d and starts it again warm, as DAEMON, with mgr's store."""
    assert d.stop() == 0, d.read_log()
    start(d, mgr, *mgr.listen_fds(), user=DAEMON)
    os.chmod(d.socket, 0o666)   # the models' allow_users decide
    wait_until(lambda: ready(d, "a") and ready(d, "b"), what="a and b restored")
    log = d.read_log()
    for name in ("a", "b"):
        assert (f'model "{name}": generation 1, held by workers before the restart, '
                "restored") in log, log


def take_back(d, worker, name, count):
    """worker reconnects (its next attach) and HOLDs name's generation 1,
    which is accepted: count references to it then."""
    assert worker.ask("attach")[1] == "2"
    assert attached(d, name, 1) == count, generations(d)[name]


def refused(d, user, name, code, text):
    t, got, said = hold_as(d, user, name, 1)
    assert (t, got) == (ERROR, code), (t, got, said)
    assert said == text, said


def not_theirs(d, user, name):
    refused(d, user, name, errno.EPERM,
            f'model "{name}": generation 1: uid {user[0]} did not hold it before the restart')


def all_theirs(d, user, name, places):
    refused(d, user, name, errno.EUSERS,
            f'model "{name}": generation 1: all {places} of its holders before the restart '
            f"have said so (those of uid {user[0]})")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv (util-linux) to run workers of other uids")
def test_hold_places_are_per_uid(tmp_path):
    a = mkmodel(tmp_path / "a.safetensors", seed=1)
    b = mkmodel(tmp_path / "b.safetensors", seed=2)
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    os.chmod(mgr.path, 0o666)   # wcached, as DAEMON, sends to it
    # Every HOLD below comes long before the wait ends (the test never
    # waits for its end), on a loaded machine too.
    who = {"allow_users": ",".join(str(u[0]) for u in (A, B, C))}
    d = Daemon(tmp_path, {"a": (a, who), "b": (b, who)}, extra="restart_hold_seconds = 300",
               user=DAEMON)
    workers = []
    try:
        start(d, mgr, user=DAEMON)
        assert os.stat(f"/proc/{d.proc.pid}").st_uid == DAEMON[0]
        os.chmod(d.socket, 0o666)
        wait_until(lambda: ready(d, "a") and ready(d, "b"), what="a and b ready")
        # a's generation 1: A twice, B once; b's: A once, B twice.
        wa1, wa2, wb1 = (UidWorker(d, "a", u) for u in (A, A, B))
        va1, vb1, vb2 = (UidWorker(d, "b", u) for u in (A, B, B))
        workers = [wa1, wa2, wb1, va1, vb1, vb2]
        assert all(w.first[1] == "1" for w in workers), [w.first for w in workers]
        swap(a, 11)
        swap(b, 12)
        wait_until(lambda: current(d, "a") == 2 and current(d, "b") == 2,
                   what="generation 2 of a and b")
        assert attached(d, "a", 1) == 3 and attached(d, "b", 1) == 3, generations(d)
        mgr.wait_for(lambda m: all(f"wc-{s}-{n}-i" in m.store for s in (1, 2) for n in (1, 2)),
                     what="both generations of a and b stored")
        # and described: the descriptors stored come before the description
        # that names them, and a stop that found the manager's queue full
        # (a loaded machine: ci68) left the one before it (b's generation 1
        # alone, restored as current and not held)
        mgr.wait_for(lambda m: "wc-desc" in m.store and
                     [g for g, _, _ in walk(description_in(m.store))[0]].count(2) == 2,
                     what="generation 2 of a and b described")
        restart(d, mgr)
        assert attached(d, "a", 1) == 0 and attached(d, "b", 1) == 0, generations(d)

        # a: A takes both its places back; a third HOLD of A's is refused
        # though B's place is free, and C, allowed the model, gets none.
        take_back(d, wa1, "a", 1)
        take_back(d, wa2, "a", 2)
        all_theirs(d, A, "a", 2)
        not_theirs(d, C, "a")
        # b: the same the other way round.
        take_back(d, vb1, "b", 1)
        take_back(d, vb2, "b", 2)
        all_theirs(d, B, "b", 2)
        not_theirs(d, C, "b")
        # B's place of a and A's of b are still free: nobody else took them.
        assert attached(d, "a", 1) == 2 and attached(d, "b", 1) == 2, generations(d)

        # Restarted again before they are taken: the store recorded the
        # places by uid again, those taken (the HOLDs') and those not.
        restart(d, mgr)
        not_theirs(d, C, "a")
        take_back(d, wb1, "a", 1)
        all_theirs(d, B, "a", 1)        # A's two places are still free
        take_back(d, wa1, "a", 2)
        take_back(d, wa2, "a", 3)
        take_back(d, va1, "b", 1)
        all_theirs(d, A, "b", 1)        # B's two places are still free
        take_back(d, vb1, "b", 2)
        take_back(d, vb2, "b", 3)
        # Every place taken: refused to anyone, C included.
        for user in (A, B, C):
            t, code, text = hold_as(d, user, "a", 1)
            assert (t, code) == (ERROR, errno.EUSERS), (t, code, text)
            assert text == ('model "a": generation 1: all 3 of its holders before the '
                            "restart have said so"), text
        # A HOLD's reference is the worker's: its release reaches wcached.
        assert wa1.ask("release 0") == ["released", "0"]
        assert attached(d, "a", 1) == 2, generations(d)["a"]
        for w in workers:
            w.quit()
        workers = []
        wait_until(lambda: attached(d, "a", 1) == 0 and attached(d, "b", 1) == 0,
                   what="the workers' references to generation 1 of a and b released")
    finally:
        for w in workers:
            w.p.kill()
            w.p.wait()
        code = d.stop()
        mgr.close()
    assert code == 0, d.read_log()
