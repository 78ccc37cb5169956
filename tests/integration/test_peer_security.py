"""Security issue 18, items 4, 5 and 6, as an attacker would try them.

- HOLD after a warm restart (PROTOCOL.md, "Restarts"): a worker may say it
  holds a restored generation only while the daemon waits for its holders,
  at most as many times as it had holders when it was stored, and once per
  connection; replayed and forged HOLDs are refused with the model, the
  generation and the reason, and do not keep the generation open.
- A worker in 300 supplementary groups (more than the 256 the client socket
  used to read) attaches a model allowed to its 300th group, and the
  control socket sees that group too.
- A status page in the store that workers could reopen writable (mode 0666)
  is not reused: the daemon says why and makes a fresh one.

The restarts use tests/pyutil/fakemanager.py's fake service manager."""
import os
import shutil
import socket
import struct
import subprocess

import pytest

from conftest import Daemon, as_user, binary, mkmodel, open_to, root_daemon, wait_until
from test_restart import Worker
from test_restart_held import current, generations, swap
from test_warm_restart import FakeManager, ready, start  # FakeManager: tests/pyutil

MAGIC = 0x31504357
HOLD, HOLD_OK, ERROR = 3, 132, 255
EALREADY, EUSERS, ENOENT = 114, 87, 2


def hold(s, name, number, seq):
    """Sends HOLD on the raw connection s; returns (type, errno or handle, text)."""
    payload = struct.pack("<Q", number) + name.encode()
    s.send(struct.pack("<IHHII", MAGIC, 1, HOLD, len(payload), seq) + payload)
    data = s.recv(8192)
    _, _, mtype, length, rseq = struct.unpack("<IHHII", data[:16])
    assert rseq == seq and length == len(data) - 16
    if mtype == ERROR:
        return mtype, struct.unpack("<i", data[16:20])[0], data[20:].decode()
    assert mtype == HOLD_OK, mtype
    return mtype, struct.unpack("<Q", data[16:24])[0], ""


def raw(d):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(10)
    s.connect(d.socket)
    return s


def test_hold_replayed_and_forged_after_restart(tmp_path):
    a = mkmodel(tmp_path / "a.safetensors", seed=1)
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    # 8 s: the restart, the checks here and the worker's HOLD all fit on a
    # loaded machine under ASan (3 s left little room).
    d = Daemon(tmp_path, {"a": a}, extra="restart_hold_seconds = 8")
    w = None
    conns = []
    try:
        start(d, mgr)
        wait_until(lambda: ready(d, "a"), what="a ready")
        w = Worker(d, "a")              # the one holder of a's generation 1
        swap(a, 11)
        wait_until(lambda: current(d, "a") == 2, what="generation 2 of a")
        mgr.wait_for(lambda m: "wc-1-1-i" in m.store and "wc-1-2-i" in m.store,
                     what="both generations stored")
        assert d.stop() == 0, d.read_log()
        w.p.kill()                      # its HOLD is the attacker's to send now
        w.p.wait()
        w = None
        start(d, mgr, *mgr.listen_fds())
        wait_until(lambda: ready(d, "a"), what="a restored")
        assert 1 in generations(d)["a"], d.read_log()

        # The first HOLD of generation 1 is its one holder's.
        c1 = raw(d)
        conns.append(c1)
        assert hold(c1, "a", 1, 1)[0] == HOLD_OK
        # Replayed on the same connection.
        t, code, text = hold(c1, "a", 1, 2)
        assert (t, code) == (ERROR, EALREADY), text
        assert 'model "a": generation 1: this connection has said it holds it already' in text
        # More HOLDs than it had holders.
        c2 = raw(d)
        conns.append(c2)
        t, code, text = hold(c2, "a", 1, 1)
        assert (t, code) == (ERROR, EUSERS), text
        assert 'model "a": generation 1: all 1 of its holders before the restart have ' \
            "said so" in text
        # Forged: the current generation had no holder when it was stored.
        t, code, text = hold(c2, "a", 2, 2)
        assert (t, code) == (ERROR, ENOENT), text
        assert 'model "a": generation 2' in text
        assert generations(d)["a"][1]["attached"] == 1

        # After the wait: refused, and the generation closes with its
        # one real hold.
        wait_until(lambda: "hold_wait_ms" not in generations(d)["a"][1], timeout=30,
                   what="the wait for HOLDs over")
        c3 = raw(d)
        conns.append(c3)
        t, code, text = hold(c3, "a", 1, 1)
        assert (t, code) == (ERROR, ENOENT), text
        assert "the wait for its holders after the restart has ended" in text
        c1.close()
        wait_until(lambda: 1 not in generations(d)["a"], what="generation 1 closed")
        mgr.wait_for(lambda m: "wc-1-1-i" not in m.store, what="generation 1 left the store")
    finally:
        for s in conns:
            s.close()
        if w is not None:
            w.p.kill()
            w.p.wait()
        code = d.stop()
        mgr.close()
    assert code == 0, d.read_log()


def test_stored_status_page_with_wrong_mode_is_not_reused(tmp_path):
    a = mkmodel(tmp_path / "a.safetensors", seed=1)
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    d = Daemon(tmp_path, {"a": a})
    try:
        start(d, mgr)
        wait_until(lambda: ready(d, "a"), what="a ready")
        mgr.wait_for(lambda m: "wc-status" in m.store and "wc-desc" in m.store,
                     what="the status page and the description stored")
        assert d.stop() == 0, d.read_log()
        # Anyone could reopen this page writable through the read-only
        # descriptor a worker gets, and announce false generations.
        os.fchmod(mgr.store["wc-status"][0], 0o666)
        start(d, mgr, *mgr.listen_fds())
        wait_until(lambda: ready(d, "a"), what="a loaded")
        log = d.read_log()
        assert "stored status page: mode 0666 is group- or world-writable (a fresh page is " \
            "0600); a new status page" in log, log
        assert 'model "a": not restored: the stored status page was not usable' in log, log
        # The fresh page went into the store in place of the old one.
        mgr.wait_for(lambda m: len(m.store.get("wc-status", [])) >= 1 and
                     any(os.fstat(fd).st_mode & 0o777 == 0o600 for fd in m.store["wc-status"]),
                     what="a fresh status page stored")
    finally:
        code = d.stop()
        mgr.close()
    assert code == 0, d.read_log()


GROUPS = list(range(200000, 200300))   # need not exist


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) is missing")
@root_daemon
def test_worker_in_300_groups(tmp_path):
    open_to(tmp_path, 0, 0)
    model = mkmodel(tmp_path / "m.safetensors")
    d = Daemon(tmp_path, {})
    d.write_config({}, f"control_group = {GROUPS[-1]}\n")
    with open(d.conf, "a") as f:
        f.write(f"[model m]\npath = {model}\nallow_groups = {GROUPS[-1]}\n")
    d.start()
    try:
        os.chmod(d.socket, 0o666)
        os.chmod(d.control, 0o666)     # only SO_PEERCRED/SO_PEERGROUPS stand in the way
        user = as_user(65534, 65534, GROUPS)
        r = subprocess.run([*user, binary("wcachectl"), "attach", "m", "--socket", d.socket,
                            "--touch"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr + d.read_log()
        r = subprocess.run([*user, binary("wcachectl"), "--control", d.control, "status"],
                           capture_output=True, text=True, timeout=60)
        # Answered: exit 3 only says m still warms (the attach does not wait
        # for that); the table has m's row.
        assert r.returncode in (0, 3), r.stderr + d.read_log()
        assert any(line.split()[:1] == ["m"] for line in r.stdout.splitlines()), r.stdout
        # Without that group: refused by both.
        other = as_user(65534, 65534, GROUPS[:-1])
        r = subprocess.run([*other, binary("wcachectl"), "attach", "m", "--socket",
                            d.socket], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "access denied" in r.stderr, r.stderr
        r = subprocess.run([*other, binary("wcachectl"), "--control", d.control, "status"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "may not control" in r.stderr, r.stderr
    finally:
        assert d.stop() == 0, d.read_log()
