"""The warm restart (issue 12) without systemd: a fake service manager
listens on $NOTIFY_SOCKET, keeps what wcached stores with FDSTORE=1 (the
descriptors come with SCM_RIGHTS), drops what FDSTOREREMOVE=1 names, and
starts the next wcached with them at 3.. and LISTEN_FDS/LISTEN_FDNAMES/
LISTEN_PID, as systemd does after `systemctl restart`. The second process
must serve the same generation without reading the model (no "warm:" line,
the load log says restored), on the same status page, while a worker that
attached before the restart still reads correct bytes; a model whose
path changed loads afresh with the next generation number, one whose pin
changed (by a reload, or while no wcached ran) is restored and takes it."""
import contextlib
import json
import os
import re
import signal
import subprocess
import sys

import pytest

from conftest import Daemon, as_user, binary, mkmodel, wait_until, connectable

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from fakemanager import FakeManager  # noqa: E402 (path set just above)

# Run as the new process itself: put the stored descriptors at 3.., set
# LISTEN_PID to our pid (exec keeps it) and exec wcached.
WRAPPER = """
import os, sys
fds = [int(x) for x in sys.argv[1].split(",") if x]
for i, fd in enumerate(fds):
    os.dup2(fd, 3 + i)
for fd in fds:
    if fd >= 3 + len(fds):
        os.close(fd)
os.environ["LISTEN_PID"] = str(os.getpid())
os.execv(sys.argv[2], sys.argv[2:])
"""


def start(d, mgr, fds=(), names=(), user=None, prefix=()):
    """Starts d's wcached as mgr's service, with the stored fds (named
    names); user (uid, gid) runs it as that user, unprivileged (as_user);
    prefix: a command it runs under (argv ending where wcached's begins)."""
    env = dict(os.environ)
    env.pop("FDSTORE", None)
    env.update(mgr.env())   # $NOTIFY_SOCKET, and $FDSTORE for a manager with a limit
    env.pop("LISTEN_PID", None)
    if fds:
        env.update(LISTEN_FDS=str(len(fds)), LISTEN_FDNAMES=":".join(names))
    d.logf = open(d.log, "w")
    d.lines, d._log_offset, d._log_tail = [], 0, b""  # a new log: wait_for_log starts over
    cmd = [*prefix, *(as_user(*user) if user else ()), sys.executable, "-c", WRAPPER,
           ",".join(map(str, fds)), binary("wcached"), "-c", d.conf]
    d.proc = subprocess.Popen(cmd, stderr=d.logf, env=env, pass_fds=list(fds))
    for fd in fds:
        os.close(fd)
    wait_until(lambda: d.proc.poll() is not None or connectable(d.socket),
               what="wcached to listen")
    assert d.proc.poll() is None, d.read_log()


def status(d):
    r = subprocess.run([binary("wcachectl"), "status", "--json", "--control", d.control],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode in (0, 3), r.stderr
    return {m["name"]: m for m in json.loads(r.stdout)["models"]}


def ready(d, name):
    m = status(d).get(name)
    return m is not None and m.get("state") == "ready" and m


def worker(d, path, name):
    p = subprocess.Popen([binary("demo_worker"), "--socket", d.socket, "--verify", path,
                          "--sync", name], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert "attached_us" in line, line + p.stderr.read()
    return p


def finish(p):
    """Lets a --sync worker verify every byte; returns its report."""
    out, err = p.communicate("go\n", timeout=120)
    assert p.returncode == 0, err
    return json.loads(out.splitlines()[-1])


def generation(d, name):
    return status(d)[name]["generation"]


def start_stored(d, mgr):
    """Starts d's first process with model "a" and waits until its
    generation 1 and the description are in mgr's store."""
    start(d, mgr)
    wait_until(lambda: ready(d, "a"), what="a ready")
    mgr.wait_for(lambda m: "wc-desc" in m.store and "wc-1-1-i" in m.store,
                 what="a's generation and the description stored")


@contextlib.contextmanager
def stopped_after(d, mgr):
    """Runs the block, then stops d and closes mgr, whatever the block did;
    after a block that ended without an error, d must have stopped cleanly
    (exit status 0)."""
    try:
        yield
    finally:
        status_code = d.stop()
        mgr.close()
    assert status_code == 0, d.read_log()


def test_warm_restart(tmp_path):
    a = mkmodel(tmp_path / "a.safetensors", seed=1)
    b = mkmodel(tmp_path / "b.safetensors", seed=2)
    b2 = mkmodel(tmp_path / "b2.safetensors", seed=3)
    c = mkmodel(tmp_path / "c.safetensors", seed=4)
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    d = Daemon(tmp_path, {"a": a, "b": b, "c": c})
    try:
        start(d, mgr)
        wait_until(lambda: ready(d, "a") and ready(d, "b") and ready(d, "c"),
                   what="the models ready")
        mgr.wait_for(lambda m: "wc-desc" in m.store and "wc-status" in m.store and
                     sum(k.startswith("wc-") and k.endswith("-i") for k in m.store) == 3,
                     what="the generations and the description stored")
        before = worker(d, a, "a")
        ga, gb = generation(d, "a"), generation(d, "b")
        slot_a = 1  # slots go in configuration order, from 1
        assert f"wc-{slot_a}-{ga}-i" in mgr.store, sorted(mgr.store)
        # The next configuration keeps a and points b elsewhere.
        d.write_config({"a": a, "b": b2, "c": c})
        assert d.stop() == 0, d.read_log()
        # c changes while no daemon runs: same inode, another mtime.
        st = os.stat(c)
        os.utime(c, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        first_log = d.read_log()
        assert f'model "a": generation {ga} warm:' in first_log   # the first process read it
        # The old process left the status page as it was.
        assert mgr.status_slot(slot_a) == ga
        fds, names = mgr.listen_fds()
        start(d, mgr, fds, names)
        wait_until(lambda: ready(d, "a") and ready(d, "b") and ready(d, "c"),
                   what="the models after the restart")
        log = d.read_log()
        assert f'model "a": generation {ga} restored from the file descriptor store' in log, log
        # Neither opened and parsed ("generation N from PATH") nor warmed.
        assert f'model "a": generation {ga} from ' not in log, log
        assert f'model "a": generation {ga} warm:' not in log, log
        assert 'model "b": not restored: its path changed' in log, log
        assert generation(d, "a") == ga
        assert generation(d, "b") == gb + 1     # numbers continue
        assert 'model "c": not restored: file c.safetensors: not the inode, size and mtime' \
            in log, log
        assert generation(d, "c") == 2
        # The worker from before and one from after both read right bytes.
        assert finish(before)["generation"] == ga
        after = finish(worker(d, a, "a"))
        assert after["generation"] == ga and after["verified"] > 0
        assert finish(worker(d, b2, "b"))["generation"] == gb + 1
        assert mgr.status_slot(slot_a) == ga
        # b's old generation left the store; b's new one went in.
        mgr.wait_for(lambda m: sorted(k for k in m.store if k.endswith("-i")) ==
                     [f"wc-{slot_a}-{ga}-i", f"wc-2-{gb + 1}-i", "wc-3-2-i"],
                     what="the new generations of b and c stored")
        assert mgr.status_slot(2) == gb + 1
    finally:
        status_code = d.stop()
        mgr.close()
    assert status_code == 0, d.read_log()


def wcachectl(d, *args):
    return subprocess.run([binary("wcachectl"), "--control", d.control, *args],
                          capture_output=True, text=True, timeout=120)


def test_restart_frees_the_slots_of_names_it_does_not_carry(tmp_path):
    """A status slot belongs to a model name for the daemon's life (so a
    name unloaded and loaded again keeps numbering up), but a warm restart
    carries only the names loaded when it stopped: the slot of one unloaded
    before is free again, and a new name that takes it numbers above the
    old name's last generation, which the slot's word keeps (2^63 + it)
    while nobody serves there, so that a worker still holding the old
    name's generation reads stale (the word never becomes its number).
    Before, such slots came back as gaps nobody reused (a page filled by
    8,191 names stayed full until a cold start), and a new name took the
    next never-used slot, numbered from 1."""
    a = mkmodel(tmp_path / "a.safetensors", seed=1)
    b = mkmodel(tmp_path / "b.safetensors", seed=2)
    c = mkmodel(tmp_path / "c.safetensors", seed=3)
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    d = Daemon(tmp_path, {"a": a, "b": b})
    try:
        start(d, mgr)
        wait_until(lambda: ready(d, "a") and ready(d, "b"), what="the models ready")
        r = wcachectl(d, "load", "b", b)    # b: generation 2, in slot 2
        assert r.returncode == 0 and "generation 2" in r.stdout, r.stdout + r.stderr
        wait_until(lambda: ready(d, "b") and generation(d, "b") == 2, what="b's generation 2")
        d.write_config({"a": a})
        assert wcachectl(d, "reload").returncode == 0, d.read_log()
        wait_until(lambda: "b" not in status(d), what="b unloaded")
        assert mgr.status_slot(2) == (1 << 63) | 2    # not served; last was 2
        mgr.wait_for(lambda m: not any(k.startswith("wc-2-") for k in m.store),
                     what="b gone from the store")
        assert d.stop() == 0, d.read_log()
        start(d, mgr, *mgr.listen_fds())
        wait_until(lambda: ready(d, "a"), what="a restored")
        r = wcachectl(d, "load", "c", c)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "generation 3" in r.stdout, r.stdout + d.read_log()
        wait_until(lambda: ready(d, "c"), what="c ready")
        mgr.wait_for(lambda m: "wc-2-3-i" in m.store, what="c stored in slot 2")
        assert mgr.status_slot(2) == 3 and mgr.status_slot(3) == 0
        assert finish(worker(d, c, "c"))["generation"] == 3
    finally:
        status_code = d.stop()
        mgr.close()
    assert status_code == 0, d.read_log()


def left_out_whole(d, limit):
    """The models the latest store-limit warning names as left out whole
    ([] before any)."""
    lines = [x for x in d.read_log().splitlines()
             if f"warm restart: the file descriptor store holds at most {limit} descriptors" in x]
    m = re.search(r'models left out whole: ((?:"[^"]+"(?:, )?)+)', lines[-1] if lines else "")
    return re.findall(r'"([^"]+)"', m.group(1)) if m else []


def restarts_as_described(d, mgr, names, left):
    """Starts d (stopped) again on mgr's store and checks that each model
    named in left loads afresh (generation 2, nothing of it stored) and
    every other one in names is restored (generation 1), and that nothing
    described was missing from the store."""
    start(d, mgr, *mgr.listen_fds())
    wait_until(lambda: all(ready(d, x) for x in names), what="the models ready again")
    log = d.read_log()
    for x in names:
        if x in left:
            assert f'model "{x}": not restored: no current generation was stored (none ' \
                'served it, or the file descriptor store had no room for its descriptors: ' \
                'raise FileDescriptorStoreMax= in the unit); loading' in log, log
            assert generation(d, x) == 2
        else:
            assert f'model "{x}": generation 1 restored from the file descriptor store' \
                in log, log
            assert generation(d, x) == 1
    assert "is not in the store" not in log, log


@pytest.mark.parametrize("n", [4, 5])
def test_store_limit_from_fdstore(tmp_path, n):
    """Under a unit whose FileDescriptorStoreMax= is 8 ($FDSTORE=8, a
    manager that refuses every descriptor past 8 without a reply, as
    systemd does), n one-file models (2 descriptors each): the status page
    and the description take 2, so 3 generations are stored, and the
    warning names the n - 3 models left out whole, which are not stored at
    all. Nothing is refused; after a restart the 3 described come back and
    the others load afresh. Before, $FDSTORE was read as on or off, the
    limit was 16384 and left out wc-status and wc-desc, and every
    generation was stored: the manager refused the last ones, models
    described as stored lost their warm restart without a word (with 4: no
    warning at all, one model loaded afresh; with 5: the warning named a
    model whose generation took store space, and only 2 came back)."""
    names = "abcde"[:n]
    models = {x: mkmodel(tmp_path / f"{x}.safetensors", seed=i + 1)
              for i, x in enumerate(names)}
    mgr = FakeManager(str(tmp_path / "notify.sock"), max_fds=8)
    d = Daemon(tmp_path, models)
    try:
        start(d, mgr)
        wait_until(lambda: all(ready(d, x) for x in names), what="the models ready")
        mgr.wait_for(lambda m: "wc-desc" in m.store and "wc-status" in m.store and
                     sum(k.endswith("-i") for k in m.store) == 3,
                     what="three generations and the description stored")
        assert d.stop() == 0, d.read_log()   # everything sent: nothing was refused
        assert mgr.refused == [], mgr.refused
        assert mgr.fds() == 8
        left = left_out_whole(d, 8)
        assert len(left) == n - 3 and set(left) <= set(names), d.read_log()
        for x in left:   # slots go in configuration order, from 1
            assert not any(k.startswith(f"wc-{names.index(x) + 1}-") for k in mgr.store), \
                sorted(mgr.store)
        restarts_as_described(d, mgr, names, left)
        assert d.stop() == 0, d.read_log()
        assert mgr.refused == [], mgr.refused
    finally:
        status_code = d.stop()
        mgr.close()
    assert status_code == 0, d.read_log()


def test_generation_no_longer_fitting_leaves_the_store(tmp_path):
    """With FileDescriptorStoreMax=8, 3 one-file models fill the store
    (status page, description, 3 x 2). A fourth added by a reload takes the
    place of one of them (the registry's order decides which): the warning
    names that one, its descriptors are removed from the store
    (FDSTOREREMOVE), the new one is stored, and nothing is refused; a
    restart restores the 3 described. Before, the new generation was
    stored past the limit and refused without a word."""
    names = "abc"
    models = {x: mkmodel(tmp_path / f"{x}.safetensors", seed=i + 1)
              for i, x in enumerate(names)}
    mgr = FakeManager(str(tmp_path / "notify.sock"), max_fds=8)
    d = Daemon(tmp_path, models)
    try:
        start(d, mgr)
        wait_until(lambda: all(ready(d, x) for x in names), what="the models ready")
        mgr.wait_for(lambda m: "wc-desc" in m.store and
                     sum(k.endswith("-i") for k in m.store) == 3,
                     what="the three generations stored")
        assert "left out" not in d.read_log(), d.read_log()
        models["d"] = mkmodel(tmp_path / "d.safetensors", seed=4)
        d.write_config(models)
        d.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: ready(d, "d"), what="d ready")
        assert d.stop() == 0, d.read_log()   # everything sent: nothing was refused
        assert mgr.refused == [], mgr.refused
        assert mgr.fds() == 8
        left = left_out_whole(d, 8)
        assert len(left) == 1 and left[0] in names, d.read_log()
        slot = names.index(left[0]) + 1
        assert "wc-4-1-i" in mgr.store and \
            not any(k.startswith(f"wc-{slot}-") for k in mgr.store), sorted(mgr.store)
        with mgr.lock:
            assert any(m.get("FDSTOREREMOVE") == "1" and m.get("FDNAME") == f"wc-{slot}-1-i"
                       for m in mgr.messages), mgr.messages
        restarts_as_described(d, mgr, names + "d", left)
        assert d.stop() == 0, d.read_log()
        assert mgr.refused == [], mgr.refused
    finally:
        status_code = d.stop()
        mgr.close()
    assert status_code == 0, d.read_log()


def test_broken_store_loads_afresh(tmp_path):
    """A description that does not decode: every model loads as usual, the
    stored descriptors are closed, one line says why."""
    a = mkmodel(tmp_path / "a.safetensors", seed=1)
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    d = Daemon(tmp_path, {"a": a})
    try:
        fd = os.memfd_create("fake", os.MFD_ALLOW_SEALING)
        os.write(fd, b"WCFDSTOR" + b"\xff" * 40)
        import fcntl
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK |
                    fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        mgr.store["wc-desc"] = [fd]    # as if an older wcached had stored it
        start(d, mgr, *mgr.listen_fds())
        wait_until(lambda: ready(d, "a"), what="a loaded afresh")
        log = d.read_log()
        assert "warm restart: the stored description:" in log, log
        assert generation(d, "a") == 1
        # The broken description was replaced, not joined, by a good one.
        mgr.wait_for(lambda m: len(m.store.get("wc-desc", [])) == 1 and
                     "wc-1-1-i" in m.store, what="one description and a's generation stored")
        assert d.stop() == 0, d.read_log()
        start(d, mgr, *mgr.listen_fds())
        wait_until(lambda: ready(d, "a"), what="a restored")
        assert 'model "a": generation 1 restored' in d.read_log(), d.read_log()
    finally:
        status_code = d.stop()
        mgr.close()
    assert status_code == 0, d.read_log()


def write_in_place_keeping_mtime(path):
    """Writes the last 64 bytes of path in place (a tensor's bytes, the
    size kept) and puts its mtime back (utimensat); only its ctime moves."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(st.st_size - 64)
        f.write(bytes(255 - b for b in open(path, "rb").read()[-64:]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    now = os.stat(path)
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
    assert now.st_ctime_ns != st.st_ctime_ns


def test_a_file_written_in_place_with_its_mtime_put_back_while_down_loads_afresh(tmp_path):
    """README, "Updating a model safely": a write in place is told by the
    ctime too, which a writer cannot put back. While no wcached ran, the
    restart compared the inode, size and mtime only, restored the stored
    generation and took the written file's stat as its baseline, so it was
    never marked modified (rev110 defect 2). The description records the
    ctime (version 5): the model loads afresh as the next generation. A
    restore that passed keeps the compared stat as its baseline: the same
    write while it runs marks it modified."""
    a = mkmodel(tmp_path / "a.safetensors", seed=1)
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    d = Daemon(tmp_path, {"a": a})
    with stopped_after(d, mgr):
        start_stored(d, mgr)
        assert d.stop() == 0, d.read_log()
        write_in_place_keeping_mtime(a)
        start(d, mgr, *mgr.listen_fds())
        wait_until(lambda: ready(d, "a") and generation(d, "a") == 2,
                   what="a loaded afresh as generation 2")
        log = d.read_log()
        assert ('model "a": not restored: file a.safetensors: written in place since it was '
                'stored (its ctime moved, its mtime was put back); loading') in log, log
        assert "generation 1 restored" not in log, log
        assert finish(worker(d, a, "a"))["generation"] == 2
        # Generation 2 is stored; unchanged, it is restored, then the same
        # write while this process runs is seen against the restored stat.
        mgr.wait_for(lambda m: "wc-1-2-i" in m.store and "wc-desc" in m.store,
                     what="generation 2 stored")
        assert d.stop() == 0, d.read_log()
        start(d, mgr, *mgr.listen_fds())
        wait_until(lambda: ready(d, "a"), what="a restored")
        assert 'model "a": generation 2 restored from the file descriptor store' in \
            d.read_log(), d.read_log()
        write_in_place_keeping_mtime(a)
        wait_until(lambda: status(d)["a"].get("state") == "modified",
                   what="generation 2 marked modified")


def test_a_changed_pin_keeps_the_restart_warm(tmp_path):
    """A pin changed by a reload makes no new generation, but it reaches the
    stored description; and a configured pin other than the stored one does
    not stop a restore: the generation comes back warm (its files not read
    again), then takes the configured pin. Before, the description kept the
    old pin and the next start said 'not restored: its pin changed (was
    metadata); loading'."""
    a = mkmodel(tmp_path / "a.safetensors", seed=1)
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    d = Daemon(tmp_path, {"a": a})
    try:
        start_stored(d, mgr)
        wait_until(lambda: status(d)["a"]["pin_applied"] == "metadata", what="a pinned")
        # pin = none by a reload: no new generation.
        d.write_config({"a": (a, {"pin": "none"})})
        d.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "configuration reloaded" in d.read_log(), what="the reload")
        wait_until(lambda: status(d)["a"]["pin_applied"] == "none", what="a unpinned")
        assert d.stop() == 0, d.read_log()
        start(d, mgr, *mgr.listen_fds())
        wait_until(lambda: ready(d, "a"), what="a after the restart")
        log = d.read_log()
        assert 'model "a": generation 1 restored from the file descriptor store' in log, log
        assert 'model "a": generation 1 warm:' not in log, log
        assert "its pin changed" not in log, log   # the description had the new pin
        assert status(d)["a"]["pinned"] == "none"
        # pin = metadata again, while no wcached runs: restored all the same,
        # then its full check locks the metadata as configured.
        assert d.stop() == 0, d.read_log()
        d.write_config({"a": (a, {"pin": "metadata"})})
        start(d, mgr, *mgr.listen_fds())
        wait_until(lambda: ready(d, "a"), what="a after the second restart")
        log = d.read_log()
        assert 'model "a": generation 1 restored from the file descriptor store' in log, log
        assert 'model "a": its pin changed (was none, now metadata)' in log, log
        assert 'model "a": generation 1 warm:' not in log, log
        wait_until(lambda: status(d)["a"]["pin_applied"] == "metadata",
                   what="a pinned as configured")
        assert status(d)["a"]["pinned"] == "metadata"
        assert generation(d, "a") == 1
    finally:
        status_code = d.stop()
        mgr.close()
    assert status_code == 0, d.read_log()


def sealed_memfd(data):
    """A memfd holding data, sealed as wcached seals an index."""
    import fcntl
    fd = os.memfd_create("index", os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK |
                fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    return fd


def test_index_damaged_past_its_header_is_withdrawn(tmp_path):
    """A stored index whose header is fine but whose records are not (two
    tensor records swapped: each valid, the order broken) is served at once,
    as restoring checks only what is O(1), then fails the full check on the
    work queue: one error line, withdrawn, loaded afresh as the next
    generation. The other model's index passes that check."""
    a = mkmodel(tmp_path / "a.safetensors", seed=1)
    b = mkmodel(tmp_path / "b.safetensors", seed=2)
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    d = Daemon(tmp_path, {"a": a, "b": b})
    try:
        start(d, mgr)
        wait_until(lambda: ready(d, "a") and ready(d, "b"), what="the models ready")
        mgr.wait_for(lambda m: "wc-1-1-i" in m.store and "wc-2-1-i" in m.store and
                     "wc-desc" in m.store, what="both generations stored")
        assert d.stop() == 0, d.read_log()
        with mgr.lock:
            old = mgr.store["wc-1-1-i"]
            blob = bytearray(os.pread(old[0], os.fstat(old[0]).st_size, 0))
            tensor_offset = int.from_bytes(blob[16:24], "little")
            first, second = tensor_offset, tensor_offset + 48   # name_offset of records 0, 1
            blob[first:first + 8], blob[second:second + 8] = \
                blob[second:second + 8], blob[first:first + 8]
            mgr.store["wc-1-1-i"] = [sealed_memfd(bytes(blob))]
            for fd in old:
                os.close(fd)
        start(d, mgr, *mgr.listen_fds())
        line = ('model "a": generation 1 restored from the file descriptor store failed its '
                'full check (index: tensor record 1')
        wait_until(lambda: line in d.read_log(), what="the full check of a to fail")
        log = d.read_log()
        assert 'model "a": generation 1 restored from the file descriptor store:' in log, log
        assert "the records are not sorted by name); withdrawn, loading afresh" in log, log
        assert log.count("failed its full check") == 1, log
        wait_until(lambda: ready(d, "a") and generation(d, "a") == 2, what="a loaded afresh")
        assert 'model "a": generation 2 from ' in d.read_log()
        assert finish(worker(d, a, "a"))["generation"] == 2
        wait_until(lambda: 'model "b": generation 1: restored index checked in full, every '
                   'page mapped' in d.read_log(), what="b checked in full")
        assert generation(d, "b") == 1
        assert 'model "b": generation 1 restored from the file descriptor store failed' \
            not in d.read_log()
        assert mgr.status_slot(1) == 2 and mgr.status_slot(2) == 1
        mgr.wait_for(lambda m: "wc-1-2-i" in m.store and "wc-1-1-i" not in m.store,
                     what="a's new generation stored in place of the damaged one")
    finally:
        status_code = d.stop()
        mgr.close()
    assert status_code == 0, d.read_log()


def test_index_file_name_not_a_plain_name_is_refused(tmp_path):
    """A stored index whose file record names "/.safetensors" (a path, not a
    file name in the model's directory): the model is not restored, one line
    says why, and it loads afresh as the next generation."""
    a = mkmodel(tmp_path / "a.safetensors", seed=1)
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    d = Daemon(tmp_path, {"a": a})
    try:
        start(d, mgr)
        wait_until(lambda: ready(d, "a"), what="a ready")
        mgr.wait_for(lambda m: "wc-1-1-i" in m.store and "wc-desc" in m.store,
                     what="a's generation stored")
        assert d.stop() == 0, d.read_log()
        with mgr.lock:
            old = mgr.store["wc-1-1-i"]
            blob = bytearray(os.pread(old[0], os.fstat(old[0]).st_size, 0))
            file_offset = int.from_bytes(blob[32:40], "little")
            name_offset = int.from_bytes(blob[file_offset:file_offset + 8], "little")
            assert blob[name_offset:name_offset + 13] == b"a.safetensors"
            blob[name_offset] = ord("/")
            mgr.store["wc-1-1-i"] = [sealed_memfd(bytes(blob))]
            for fd in old:
                os.close(fd)
        start(d, mgr, *mgr.listen_fds())
        wait_until(lambda: ready(d, "a") and generation(d, "a") == 2, what="a loaded afresh")
        log = d.read_log()
        assert ('model "a": not restored: file 0: the stored index names it "/.safetensors", '
                "not a file name; loading") in log, log
        assert finish(worker(d, a, "a"))["generation"] == 2
    finally:
        status_code = d.stop()
        mgr.close()
    assert status_code == 0, d.read_log()


def shard_files(tmp_path, v, n=2, layers=2):
    """Version v of a model (of layers layers) split into n shards: [(name,
    bytes)] of its shards, under names of their own
    (model-vV-0000K-of-0000N.safetensors), and its shard index's text."""
    import struct
    full = mkmodel(tmp_path / f"full{v}.safetensors", seed=v, layers=layers, hidden=32,
                   ffn=64, vocab=16)
    data = open(full, "rb").read()
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + size])
    meta = header.pop("__metadata__")
    body = data[8 + size:]
    names = sorted(header, key=lambda k: header[k]["data_offsets"][0])
    shards, weight_map = [], {}
    for i in range(n):
        part = names[i * len(names) // n:(i + 1) * len(names) // n]
        out, off, blob = {"__metadata__": meta}, 0, b""
        for k in part:
            a, b = header[k]["data_offsets"]
            out[k] = dict(header[k], data_offsets=[off, off + b - a])
            blob += body[a:b]
            off += b - a
        h = json.dumps(out).encode()
        h += b" " * (-len(h) % 8)
        fname = f"model-v{v}-{i + 1:05d}-of-{n:05d}.safetensors"
        shards.append((fname, struct.pack("<Q", len(h)) + h + blob))
        weight_map.update((k, fname) for k in part)
    return shards, json.dumps({"metadata": {"total_size": len(body)}, "weight_map": weight_map})


def write_shards(tmp_path, shard_dir, v):
    """Writes version v of a model of two shards into shard_dir the README's
    way ("Updating a model safely"): the shards under names of their own
    (model-vV-0000K-of-00002.safetensors), then the shard index renamed over
    model.safetensors.index.json last, the older shards left in place."""
    shards, index = shard_files(tmp_path, v)
    for fname, data in shards:
        with open(shard_dir / fname, "wb") as f:
            f.write(data)
    tmp = shard_dir / ".index.tmp"
    tmp.write_text(index)
    os.rename(tmp, shard_dir / "model.safetensors.index.json")


def start_stored_model(d, mgr, name="m"):
    """start_stored() for the one model name of d's configuration."""
    start(d, mgr)
    wait_until(lambda: ready(d, name), what=f"{name} ready")
    mgr.wait_for(lambda m: "wc-desc" in m.store and "wc-1-1-i" in m.store,
                 what=f"{name}'s generation and the description stored")


def restart_restored(d, mgr, name="m"):
    """Starts d's first process with the one model name, stops it once its
    generation 1 is stored, starts the next with the store and waits until
    that serves it, restored."""
    start_stored_model(d, mgr, name)
    assert d.stop() == 0, d.read_log()
    start(d, mgr, *mgr.listen_fds())
    wait_until(lambda: ready(d, name), what=f"{name} after the restart")
    assert f'model "{name}": generation 1 restored from the file descriptor store' \
        in d.read_log(), d.read_log()


def test_sharded_model_updated_while_down_loads_afresh(tmp_path):
    """A sharded model updated the README's way while no wcached ran (new
    shards under new names, the new index renamed over the old one last):
    every stored shard is still there and unchanged, but the index lists
    the new ones, so the restart loads them (generation 2), as a running
    wcached would have: generation 1 serves meanwhile, and the new files
    load as a reload wcached makes by itself, in generation 1's tree
    (review rev195 M1: before, as the operator's load, whoever made them).
    Before, restore_check.c stat'ed only the stored shards and restored
    generation 1, which served the old shards for good."""
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    index = shard_dir / "model.safetensors.index.json"
    write_shards(tmp_path, shard_dir, 1)
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    d = Daemon(tmp_path, {"m": str(index)})
    try:
        start_stored_model(d, mgr)
        assert d.stop() == 0, d.read_log()
        write_shards(tmp_path, shard_dir, 2)
        start(d, mgr, *mgr.listen_fds())
        wait_until(lambda: ready(d, "m") and generation(d, "m") == 2,
                   what="generation 2 of m after the restart")
        log = d.read_log()
        assert (f'model "m": generation 1 serves, but its path leads to other files now (its '
                f'shard index {index} now lists other files (file 1 of 2 is '
                'model-v2-00001-of-00002.safetensors; model-v1-00001-of-00002.safetensors was '
                'stored)): they are loaded as a reload wcached makes by itself') in log, log
        r = d.attach("m", "--touch", "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["generation"] == 2, r.stdout
    finally:
        status_code = d.stop()
        mgr.close()
    assert status_code == 0, d.read_log()


def test_restored_sharded_model_sees_a_later_index_rename(tmp_path):
    """A sharded model restored as stored (nothing changed while no wcached
    ran) is watched as a loaded one is: its shard index renamed over later
    makes generation 2."""
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    write_shards(tmp_path, shard_dir, 1)
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    d = Daemon(tmp_path, {"m": str(shard_dir / "model.safetensors.index.json")})
    try:
        restart_restored(d, mgr)
        write_shards(tmp_path, shard_dir, 2)
        wait_until(lambda: generation(d, "m") == 2, what="generation 2 of the restored model")
        r = d.attach("m", "--touch", "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["generation"] == 2, r.stdout
    finally:
        status_code = d.stop()
        mgr.close()
    assert status_code == 0, d.read_log()


def test_restored_model_attaches_by_the_real_path_of_its_symlink(tmp_path):
    """A model configured through a symlink to a snapshot directory (README
    "Serving real models"), restored from the store, attaches by the
    directory's real path as a loaded one does: the restart's check
    resolves the path off the loop for the generation it serves."""
    snap = tmp_path / "snapshots" / "rev1"
    snap.mkdir(parents=True)
    write_shards(tmp_path, snap, 1)
    link = tmp_path / "m"
    link.symlink_to(snap)
    real = os.path.realpath(snap)
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    d = Daemon(tmp_path, {"m": str(link)})
    try:
        restart_restored(d, mgr)
        r = d.attach(real, "--touch", "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["generation"] == 1, r.stderr
        assert status(d)["m"]["resolved_path"] == real
    finally:
        status_code = d.stop()
        mgr.close()
    assert status_code == 0, d.read_log()


def test_directory_model_changed_while_down_loads_afresh(tmp_path):
    """A model configured as a directory, of one file when stored: the
    directory that gained a shard index while no wcached ran loads the
    index (generation 2) as a reload wcached makes by itself, generation 1
    serving meanwhile; one whose stored shards were removed loads its one
    file again the same way, judged against the tree the store recorded
    (their own files no longer tell it: before format version 9 that
    reload waited for the operator's); one
    that gained a second .safetensors (no index) serves its generation, and
    the reload says why it fails. Before, both restored generation 1 for
    good (its one file was unchanged); then each loaded afresh, as the
    operator's load (review rev195 M1)."""
    model_dir = tmp_path / "dir"
    model_dir.mkdir()
    mkmodel(model_dir / "a.safetensors", seed=1)
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    d = Daemon(tmp_path, {"m": str(model_dir)})
    try:
        start_stored_model(d, mgr)
        assert d.stop() == 0, d.read_log()
        write_shards(tmp_path, model_dir, 2)
        start(d, mgr, *mgr.listen_fds())
        wait_until(lambda: ready(d, "m") and generation(d, "m") == 2,
                   what="generation 2 of m, from its new shard index")
        log = d.read_log()
        assert (f'model "m": generation 1 serves, but its path leads to other files now (its '
                f'directory {model_dir} holds the shard index model.safetensors.index.json, '
                'which now lists other files (2 files; 1 was stored)): they are loaded as a '
                'reload wcached makes by itself') in log, log
        mgr.wait_for(lambda m: "wc-1-2-i" in m.store, what="generation 2 stored")
        assert d.stop() == 0, d.read_log()
        # Back to one file (its shards gone: restore_check.c says so), then
        # a second one beside it: no model to load.
        for f in model_dir.iterdir():
            if f.name != "a.safetensors":
                f.unlink()
        start(d, mgr, *mgr.listen_fds())
        wait_until(lambda: ready(d, "m") and generation(d, "m") == 3,
                   what="generation 3 of m, its one file again")
        log = d.read_log()
        assert re.search(r'model "m": generation 2 serves, but its path leads to other files '
                         r'now .*: they are loaded as a reload wcached makes by itself', log), log
        assert "no load of it by the operator found its tree" not in log, log
        mgr.wait_for(lambda m: "wc-1-3-i" in m.store, what="generation 3 stored")
        assert d.stop() == 0, d.read_log()
        mkmodel(model_dir / "b.safetensors", seed=2)
        start(d, mgr, *mgr.listen_fds())
        d.wait_for_log(r'model "m": .*2 \*.safetensors files.*; generation 3 still serving')
        log = d.read_log()
        assert (f'model "m": generation 3 serves, but its path leads to other files now (its '
                f'directory changed since it was stored: {model_dir}: 2 *.safetensors files '
                '(a.safetensors, b.safetensors) and no *.safetensors.index.json') in log, log
        assert generation(d, "m") == 3
    finally:
        status_code = d.stop()
        mgr.close()
    assert status_code == 0, d.read_log()
