"""wcache against a real wcached: connect and attach, safe_open choosing the
daemon or the file, clear errors, and forked workers sharing one attach."""
import os
import textwrap
import time

import numpy as np
import pytest
import torch

import wcache
from pyhelpers import Daemon, mkmodel, other_thread_before, run_python, wait_child


def checksums(model):
    """{name: sum of the tensor's bytes} read through numpy views."""
    return {k: int(model.raw(k).sum(dtype=np.uint64)) for k in model.keys()}


def test_connect_attach(daemon, model_path):
    with wcache.connect(daemon.socket) as c:
        m = c.attach("small")
    # the model outlives its client
    assert m.source == "wcached"
    assert m.generation >= 1
    assert m.name == "small"
    with wcache.open_file(model_path) as local:
        assert m.keys() == local.keys()
        assert m.metadata() == local.metadata()
        for k in m.keys():
            assert m.raw(k).tobytes() == local.raw(k).tobytes()
            assert torch.equal(m.torch(k), local.torch(k))
    m.close()


@pytest.mark.parametrize("opcodes", [False, True])
def test_attach_while_another_thread_closes_the_client(daemon, opcodes):
    """An attach on a client that another thread closes meanwhile returns
    the model (valid: models outlive their client) or raises ValueError
    "closed", never a library error, and the client is never used after
    wc_disconnect(): another thread's close() runs before each line (then
    each bytecode) of Client.attach in turn. Before, an attach that had
    checked the client open passed the cleared pointer to wc_attach(),
    which failed with EINVAL "no client or model name" (line 1)."""
    k = 0
    while True:
        c = wcache.connect(daemon.socket)
        got = []
        errors, other_errors, ran = other_thread_before(
            wcache.Client.attach.__code__, k, lambda: got.append(c.attach("small")), c.close,
            opcodes=opcodes)
        assert not other_errors, f"close() before event {k} of attach: {other_errors!r}"
        assert all(isinstance(e, ValueError) and "closed" in str(e) for e in errors), \
            f"attach with close() before event {k}: {errors!r}"
        assert c.closed == ran
        for m in got:
            assert m.keys() and m.raw(m.keys()[0]) is not None
            m.close()
        c.close()
        if not ran:
            break
        k += 1
    assert k > 3


def test_attach_by_configured_path(daemon, model_path):
    with wcache.connect() as c:  # $WCACHE_SOCKET
        with c.attach(model_path) as m:
            assert m.source == "wcached" and len(m) > 0


def test_safe_open_daemon_served_path(daemon, model_path, monkeypatch):
    # by the exact configured path, by name, and by a relative path
    for target in (model_path, "small"):
        with wcache.safe_open(target) as f:
            assert f.model.source == "wcached", target
            assert f.metadata()["generator"] == "wcache mkmodel"
    monkeypatch.chdir(os.path.dirname(model_path))
    with wcache.safe_open(os.path.basename(model_path), framework="pt") as f:
        assert f.model.source == "wcached"
        t = f.get_tensor("lm_head.weight")
        assert t.dtype == torch.bfloat16
    assert t.shape == (100, 64)       # valid after the with block


def test_a_reconnect_leaves_the_old_client_to_threads_still_using_it(daemon, model_path):
    # safe_open reconnects when an attach finds wcached gone; it closed the
    # shared client while other threads could be attaching on it (the C
    # client freed under them). Here one thread forces reconnects while
    # four open and read the model: none fails, the process does not crash.
    code = textwrap.dedent(f"""
        import sys, threading
        import wcache
        from wcache import _safe_open
        errors, stop = [], threading.Event()
        sys.setswitchinterval(1e-5)

        def reader():
            try:
                for _ in range(300):
                    with wcache.safe_open({"small"!r}, framework="pt") as f:
                        assert f.model.source == "wcached"
                        f.get_tensor("lm_head.weight").sum()
            except Exception as e:
                errors.append(repr(e))

        def reconnector():
            # Paced: wcached counts a connection until it sees it close.
            while not stop.wait(0.002):
                _safe_open._client(failed=_safe_open._client())

        r = threading.Thread(target=reconnector)
        r.start()
        ts = [threading.Thread(target=reader) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        stop.set()
        r.join()
        print("errors", errors)
        sys.exit(1 if errors else 0)
    """)
    r = run_python(code, env={"WCACHE_SOCKET": daemon.socket}, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_safe_open_plain_path_with_daemon_running(daemon, tmp_path):
    other = mkmodel(tmp_path / "other.safetensors", seed=9)
    with wcache.safe_open(other) as f:
        assert f.model.source == "file"
        assert len(f.keys()) == len(wcache.open_file(other))


def test_safe_open_without_daemon(no_daemon, model_path):
    with wcache.safe_open(model_path) as f:
        assert f.model.source == "file"
        assert "lm_head.weight" in f.keys()


def test_only_a_daemon_that_is_not_running_means_fall_back(tmp_path, monkeypatch, model_path):
    """safe_open and derived map the file themselves only when no wcached
    runs at the socket (DaemonUnavailable). A socket that does not accept
    within the deadline (a hung daemon; here a full backlog), or that is
    not wcached's kind, is an error to see, as the same failures of an
    attach are: falling back silently would hide it."""
    import socket
    import wcache._safe_open as so
    hung = str(tmp_path / "hung.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(hung)
    listener.listen(0)
    queued = []
    while True:  # fill the backlog: the next connect is not accepted
        c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        c.setblocking(False)
        try:
            c.connect(hung)
        except BlockingIOError:
            c.close()
            break
        queued.append(c)
    stream = str(tmp_path / "stream.sock")
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(stream)
    other.listen(8)
    try:
        for path, code in ((hung, "ETIMEDOUT"), (stream, "EPROTOTYPE")):
            with pytest.raises(wcache.WcacheError) as e:
                wcache.connect(path, timeout=0.2)
            assert not isinstance(e.value, wcache.DaemonUnavailable), e.value
            assert e.value.errno == getattr(__import__("errno"), code) and path in str(e.value)
            monkeypatch.setenv("WCACHE_SOCKET", path)
            monkeypatch.setenv("WCACHE_TIMEOUT", "0.2")
            so._shared = None
            with pytest.raises(wcache.WcacheError) as e:
                wcache.safe_open(model_path)
            assert not isinstance(e.value, wcache.DaemonUnavailable) and path in str(e.value)
            with pytest.raises(wcache.WcacheError):
                wcache.derived(model_path, "k-v1", lambda src: src)
        monkeypatch.setenv("WCACHE_SOCKET", str(tmp_path / "nobody.sock"))
        so._shared = None
        with wcache.safe_open(model_path) as f:
            assert f.model.source == "file"
    finally:
        so._shared = None
        for c in queued:
            c.close()
        listener.close()
        other.close()


def test_missing_daemon_error(no_daemon):
    with pytest.raises(wcache.DaemonUnavailable) as e:
        wcache.connect()
    assert no_daemon in str(e.value)
    assert "not running" in str(e.value)
    with pytest.raises(wcache.DaemonUnavailable):
        wcache.connect("/nonexistent/dir/wcached.sock")
    # safe_open of a name that is no file: upstream's message and exception
    # type, and why wcached did not serve it in .reason (and the traceback)
    with pytest.raises(wcache.ModelNotFound) as e:
        wcache.safe_open("llama-70b")
    assert str(e.value) == "No such file or directory: llama-70b"
    assert isinstance(e.value, FileNotFoundError)
    assert "llama-70b" in e.value.reason and "not running" in e.value.reason


def test_unknown_model_error(daemon):
    with wcache.connect() as c:
        with pytest.raises(wcache.ModelNotFound) as e:
            c.attach("nope")
        assert '"nope"' in str(e.value) and "not served" in str(e.value)
        assert e.value.errno == 2
        # the connection survives an unknown name
        with c.attach("small") as m:
            assert len(m) > 0
    with pytest.raises(wcache.ModelNotFound) as e:
        wcache.safe_open("nope")
    # str() is upstream's message; why in .reason and the traceback's note
    assert str(e.value) == "No such file or directory: nope"
    assert "not served" in e.value.reason and e.value.reason in e.value.__notes__


def test_a_served_file_that_failed_to_load_raises_as_upstream(tmp_path, monkeypatch, caplog):
    """A path wcached serves but could not load raises what upstream raises
    for that file (the daemon answers EIO "failed to load: REASON" whatever
    the reason, so the path is opened in this process to find out, with one
    WARNING): SafetensorError for one that is not valid safetensors,
    FileNotFoundError for one that is gone, and a file mended since is
    mapped. A served name that failed is a SafetensorError with the
    daemon's errno and message. Before, a plain WcacheError that
    `except SafetensorError` and `except FileNotFoundError` missed."""
    import errno
    import logging
    import struct
    import wcache._device as dev
    import wcache._safe_open as so
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", 16) + b"{" * 15)
    gone = tmp_path / "gone.safetensors"
    d = Daemon(tmp_path, {"bad": str(bad), "gone": str(gone)}).start()
    monkeypatch.setenv("WCACHE_SOCKET", d.socket)
    so._shared = None
    dev._logged.clear()
    try:
        with caplog.at_level(logging.WARNING, logger="wcache"):
            with pytest.raises(wcache.SafetensorError) as e:
                wcache.safe_open(str(bad), framework="np")
            assert not isinstance(e.value, FileNotFoundError)
            assert "wcached could not serve" in caplog.text and "failed to load" in caplog.text
            with pytest.raises(wcache.SafetensorError) as e:
                wcache.safe_open("bad", framework="np")
            assert e.value.errno == errno.EIO, e.value
            assert "failed to load" in str(e.value) and "bad" in str(e.value), e.value
            with pytest.raises(FileNotFoundError):
                wcache.safe_open(str(gone), framework="np")
            mkmodel(gone)  # there now: mapped here, unshared, as upstream would
            with wcache.safe_open(str(gone), framework="np") as f:
                assert f.keys() and f.model.source != "wcached"
    finally:
        so._shared = None
        d.stop()


def test_nul_in_model_name_or_socket(daemon):
    """A NUL would cut the name at it ("small\\0junk" attached "small"):
    ValueError, as Python's open() raises for such a path."""
    with wcache.connect() as c:
        for bad in ("small\0junk", b"small\0junk"):
            with pytest.raises(ValueError, match="null"):
                c.attach(bad)
        with c.attach("small") as m:  # the connection is still fine
            assert len(m) > 0
    with pytest.raises(ValueError, match="null"):
        wcache.safe_open("small\0junk", framework="np")
    with pytest.raises(ValueError, match="null"):
        wcache.connect(daemon.socket + "\0junk")


def test_safe_open_reconnects_after_daemon_restart(tmp_path, model_path, monkeypatch):
    import wcache._safe_open as so
    d = Daemon(tmp_path, {"small": model_path}).start()
    monkeypatch.setenv("WCACHE_SOCKET", d.socket)
    so._shared = None
    try:
        with wcache.safe_open("small") as f:
            assert f.model.source == "wcached"
        assert d.stop() == 0
        d = Daemon(tmp_path, {"small": model_path}).start()
        with wcache.safe_open("small") as f:
            assert f.model.source == "wcached"
    finally:
        so._shared = None
        d.stop()


FORK_WORKERS = textwrap.dedent("""
    import os, sys, json, numpy as np, torch, wcache
    m = wcache.connect().attach("small")      # one attach, before fork
    expect = {k: int(m.raw(k).sum(dtype=np.uint64)) for k in m.keys()}
    tsum = {k: float(m.torch(k).float().sum()) for k in m.keys()}
    pids = []
    for i in range(4):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            ok = True
            try:
                got = {k: int(m.raw(k).sum(dtype=np.uint64)) for k in m.keys()}
                gott = {k: float(m.torch(k).float().sum()) for k in m.keys()}
                ok = got == expect and gott == tsum
                t = m.torch("lm_head.weight"); t.add_(1)   # private to this child
                # a child can attach more through its own connection
                with wcache.safe_open("small") as f:
                    ok = ok and f.model.source == "wcached"
                os.write(w, json.dumps({"pid": os.getpid(), "ok": ok,
                                        "gen": m.generation}).encode())
            finally:
                os._exit(0 if ok else 1)
        os.close(w)
        pids.append((pid, r))
    results = []
    for pid, r in pids:
        data = b""
        while True:
            chunk = os.read(r, 4096)
            if not chunk:
                break
            data += chunk
        _, status = os.waitpid(pid, 0)
        results.append((json.loads(data) if data else None, status))
    # the parent's view is untouched by the children's writes
    assert float(m.torch("lm_head.weight").float().sum()) == tsum["lm_head.weight"]
    print(json.dumps(results))
""")


def test_fork_while_another_thread_connects(no_daemon, model_path):
    """A thread of the parent inside safe_open's connect (it holds the
    module's lock for up to the client's deadline) when another forks: the
    child's first safe_open must not wait for a lock no thread of it will
    ever let go."""
    import wcache._safe_open as so
    with so._lock:  # what that thread holds at the fork
        pid = os.fork()
        if pid == 0:
            code = 2
            try:
                with wcache.safe_open(model_path) as f:
                    code = 0 if f.keys() else 3
            finally:
                os._exit(code)
    status = wait_child(pid, 30)
    assert status is not None, "the child hung on the lock a parent thread held at fork"
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_four_forked_workers_share_one_attach(daemon):
    import json
    r = run_python(FORK_WORKERS)
    assert r.returncode == 0, r.stderr
    results = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(results) == 4
    for res, status in results:
        assert status == 0 and res is not None and res["ok"], results
        assert res["gen"] >= 1


def test_views_outlive_close_attached(daemon):
    with wcache.connect() as c:
        m = c.attach("small")
        a = m.raw("lm_head.weight")
        t = m.torch("model.norm.weight")
        expect = a.tobytes()
        m.close()
    assert a.tobytes() == expect
    assert t.shape == (64,)


def test_stale_after_rename(daemon, model_path, tmp_path):
    with wcache.connect(daemon.socket) as c:
        old = c.attach("small")
        assert not old.stale()
        with wcache.open_file(model_path) as local:
            assert not local.stale()
        new_file = tmp_path / ".replacement.safetensors"
        mkmodel(str(new_file), seed=99)
        os.rename(new_file, model_path)
        deadline = time.monotonic() + 60
        while not old.stale() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert old.stale()
        new = c.attach("small")
        assert new.generation == old.generation + 1 and not new.stale()
        assert old.raw(old.keys()[0]) is not None  # the old generation stays readable
        old.close()
        new.close()
