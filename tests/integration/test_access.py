"""Per-model access control and connection limits, with clients running as
another user (setpriv). The model files are readable by root only: the
workers that are allowed still map them, through the descriptors wcached
passes."""
import os
import shutil
import socket
import subprocess
import struct
import tempfile

import pytest

from conftest import TEST_USER, Daemon, binary, mkmodel, parse_user, root_daemon, wait_until

SETPRIV = shutil.which("setpriv")
NOBODY = ["--reuid=nobody", "--regid=nogroup", "--clear-groups"]


@pytest.fixture
def shared_dir():
    """A directory other users can traverse (pytest's tmp_path is 0700)."""
    d = tempfile.mkdtemp(prefix="wcache-access-")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def served_connection(d):
    """A raw connection that the daemon has accepted and answered."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(10)
    s.connect(d.socket)
    s.send(struct.pack("<IHHII", 0x31504357, 1, 1, 5, 9) + b"small")
    data, fds, _, _ = socket.recv_fds(s, 4096, 8)
    for fd in fds:
        os.close(fd)
    return s, struct.unpack("<IHHII", data[:16])[2]


def as_nobody(*argv):
    return subprocess.run([SETPRIV, *NOBODY, *argv], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.skipif(SETPRIV is None, reason="setpriv (util-linux) is missing")
@root_daemon
def test_allowed_and_refused_attaches(shared_dir):
    from pathlib import Path
    tmp = Path(shared_dir)
    model = mkmodel(tmp / "m.safetensors")
    os.chmod(model, 0o600)  # nobody cannot read the file itself
    d = Daemon(tmp, {})
    d.write_config({}, "")
    with open(d.conf, "a") as f:
        f.write(f"[model open]\npath = {model}\n\n"
                f"[model team]\npath = {model}\nallow_users = nobody\n\n"
                f"[model staff]\npath = {model}\nallow_groups = root\n\n"
                f"[model bygid]\npath = {model}\nallow_groups = 65534\n")
    d.start()
    try:
        os.chmod(d.socket, 0o666)
        for name in ("open", "team", "bygid"):
            r = as_nobody(binary("wcachectl"), "attach", name, "--socket", d.socket,
                          "--touch")
            assert r.returncode == 0, (name, r.stderr)
        r = as_nobody(binary("wcachectl"), "attach", "staff", "--socket", d.socket)
        assert r.returncode == 1
        assert 'model "staff": access denied' in r.stderr
        # Root is always allowed.
        assert d.attach("staff").returncode == 0
        # Refused attaches are logged at most once a minute per uid (each
        # connection counted once before: a loop of refused attaches wrote
        # a line each), and every one is counted.
        for _ in range(5):
            r = as_nobody(binary("wcachectl"), "attach", "staff", "--socket", d.socket)
            assert r.returncode == 1
        log = d.read_log()
        assert log.count("refused by allow_users/allow_groups") == 1, log
        m = subprocess.run([binary("wcachectl"), "--control", d.control, "metrics"],
                           capture_output=True, text=True, timeout=30)
        assert m.returncode == 0, m.stderr
        assert any(line.startswith("wcached_model_access_denied_total") and
                   'model="staff"' in line and line.split()[-1] == "6"
                   for line in m.stdout.splitlines()), m.stdout
    finally:
        assert d.stop() == 0, d.read_log()


@pytest.mark.skipif(SETPRIV is None, reason="setpriv (util-linux) is missing")
def test_socket_mode_keeps_others_out(shared_dir):
    from pathlib import Path
    tmp = Path(shared_dir)
    model = mkmodel(tmp / "m.safetensors")
    d = Daemon(tmp, {"m": model}).start()
    try:
        assert oct(os.stat(d.socket).st_mode & 0o777) == "0o660"
        r = as_nobody(binary("wcachectl"), "attach", "m", "--socket", d.socket)
        assert r.returncode == 1 and "Permission denied" in r.stderr
    finally:
        assert d.stop() == 0


def test_max_clients_per_uid(tmp_path, model):
    d = Daemon(tmp_path, {"small": model}, "max_clients = 8\nmax_clients_per_uid = 3\n").start()
    held = []
    try:
        for _ in range(3):
            s, mtype = served_connection(d)
            held.append(s)
            assert mtype == 129  # ATTACH_OK
        r = d.attach("small")
        assert r.returncode == 1 and "max_clients_per_uid" in r.stderr, r.stderr
        held.pop().close()
        wait_until(lambda: d.attach("small").returncode == 0, what="a free slot again")
    finally:
        for s in held:
            s.close()
        assert d.stop() == 0, d.read_log()


@pytest.mark.skipif(SETPRIV is None or os.geteuid() != 0,
                    reason="needs root and setpriv (util-linux) to connect as nobody")
def test_max_clients(shared_dir):
    from pathlib import Path
    model = mkmodel(Path(shared_dir) / "m.safetensors")
    d = Daemon(Path(shared_dir), {"small": model},
               "max_clients = 2\nmax_clients_per_uid = 2\n").start()
    held = []
    try:
        os.chmod(d.socket, 0o666)
        for _ in range(2):
            s, mtype = served_connection(d)
            held.append(s)
            assert mtype == 129
        # The per-uid limit is checked first: a newcomer it refuses never
        # reaches max_clients (where it could close another user's idle
        # connection to make room, server.c on_accept; review 175, F10).
        r = d.attach("small")
        assert r.returncode == 1 and "max_clients_per_uid" in r.stderr, r.stderr
        # Another user, under its own limit, meets max_clients.
        r = as_nobody(binary("wcachectl"), "attach", "small", "--socket", d.socket)
        assert r.returncode == 1 and "too many clients" in r.stderr, r.stderr
        # The connected clients keep working.
        s = held[0]
        s.send(struct.pack("<IHHII", 0x31504357, 1, 1, 5, 10) + b"small")
        data, fds, _, _ = socket.recv_fds(s, 4096, 8)
        assert struct.unpack("<IHHII", data[:16])[2] == 129
        for fd in fds:
            os.close(fd)
    finally:
        for s in held:
            s.close()
        assert d.stop() == 0, d.read_log()


@root_daemon
def test_user_drops_privileges(shared_dir):
    from pathlib import Path
    tmp = Path(shared_dir)
    model = mkmodel(tmp / "m.safetensors")
    d = Daemon(tmp, {"small": model}, "user = nobody\n").start()
    try:
        def uids():
            with open(f"/proc/{d.proc.pid}/status") as f:
                return [l.split()[1:] for l in f if l.startswith("Uid:")][0]
        # The sockets exist a moment before the switch.
        wait_until(lambda: uids() == ["65534"] * 4, what="wcached to become nobody")
        st = os.stat(d.socket)
        assert st.st_uid == 65534 and oct(st.st_mode & 0o777) == "0o660"
        assert d.attach("small").returncode == 0
    finally:
        # Socket files in a root-owned directory: nobody cannot unlink them.
        assert d.stop() == 0, d.read_log()


def supplementary_member():
    """A user of this machine with a supplementary group (not its primary
    one), as (passwd entry, group entry), or None."""
    import grp
    import pwd
    for g in grp.getgrall():
        for name in g.gr_mem:
            try:
                pw = pwd.getpwnam(name)
            except KeyError:
                continue
            if pw.pw_gid != g.gr_gid and pw.pw_uid != 0:
                return pw, g
    return None


@root_daemon
def test_user_as_a_uid_keeps_its_supplementary_groups(shared_dir):
    """user = UID: initgroups() needs the user's name. Given the digits, it
    found no such user and left the daemon its primary group alone, and a
    model readable through a supplementary group failed to load."""
    from pathlib import Path
    found = supplementary_member()
    if found is None:
        pytest.skip("no user with a supplementary group on this machine")
    pw, g = found
    tmp = Path(shared_dir)
    model = mkmodel(tmp / "m.safetensors")
    os.chown(model, 0, g.gr_gid)
    os.chmod(model, 0o640)
    d = Daemon(tmp, {"small": model}, f"user = {pw.pw_uid}\n").start()
    try:
        def groups():
            with open(f"/proc/{d.proc.pid}/status") as f:
                return [l.split()[1:] for l in f if l.startswith("Groups:")][0]
        wait_until(lambda: str(g.gr_gid) in groups(), what=f"wcached in group {g.gr_name}")
        assert d.attach("small").returncode == 0, d.read_log()
    finally:
        assert d.stop() == 0, d.read_log()


def test_user_root_not_started_as_root_says_whom_it_stays(tmp_path):
    """user = root (or 0) in a wcached started as another user: it stays
    that user and says so, as with any other `user =`. Before, it logged
    "wcached keeps running as root" while it ran as that user, its sockets
    that user's (review rev223 L10)."""
    user = (65534, 65534) if os.geteuid() == 0 and TEST_USER is None else None
    uid = user[0] if user else parse_user(TEST_USER)[0] if TEST_USER else os.geteuid()
    model = mkmodel(tmp_path / "m.safetensors")
    for name in ("root", "0"):
        d = Daemon(tmp_path, {"small": model}, f"user = {name}\n", user=user).start()
        try:
            assert d.attach("small").returncode == 0, d.read_log()
            assert os.stat(d.control).st_uid == uid
            log = d.read_log()
            assert f"user = {name}: not started as root, staying uid {uid}" in log, log
            assert "running as root" not in log, log
        finally:
            assert d.stop() == 0, d.read_log()


@root_daemon
def test_user_root_keeps_running_as_root(shared_dir):
    """user = root (or 0): nothing to drop to; the daemon says so and
    serves, where it used to die ("could regain root after switching")."""
    from pathlib import Path
    tmp = Path(shared_dir)
    model = mkmodel(tmp / "m.safetensors")
    for user in ("root", "0"):
        d = Daemon(tmp, {"small": model}, f"user = {user}\n").start()
        try:
            assert d.attach("small").returncode == 0, d.read_log()
            assert f"user = {user}: that is root: wcached keeps running as root" in \
                d.read_log()
        finally:
            assert d.stop() == 0, d.read_log()

