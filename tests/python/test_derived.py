"""wcache.derived: one builder per (model generation, key) through a real
wcached, every other caller attaching the artifact; the builder's failures
reaching the daemon as ABANDON; and the local fallback without a daemon.

The daemon serves the model with ``derive = yes`` (its section in
wcached.conf); a model without it refuses (EPERM). Builds are counted in a
file each build function appends to, so a test can tell which process
built, across processes.
"""
import errno
import json
import os
import pickle
import re
import subprocess
import textwrap
import threading
import warnings

import numpy as np
import pytest

import wcache
from pyhelpers import Daemon, binary, mkmodel, run_python, wait_until


def to_f32(src):
    """The build of most tests: every tensor as float32."""
    return {k: v.float() for k, v in src.items()}


@pytest.fixture
def derive_daemon(tmp_path, model_path, monkeypatch):
    """wcached serving model_path (BF16) as "small" and an F32 model as
    "wide", both with derived artifacts, and "plain" without;
    $WCACHE_SOCKET points at it."""
    import wcache._safe_open as so
    f32_path = mkmodel(tmp_path / "wide.safetensors", seed=3, dtype="F32")
    d = Daemon(tmp_path, {"small": (model_path, {"derive": "yes"}),
                          "wide": (f32_path, {"derive": "yes"}),
                          "plain": mkmodel(tmp_path / "plain.safetensors", seed=2)}).start()
    d.f32_path = f32_path
    monkeypatch.setenv("WCACHE_SOCKET", d.socket)
    so._shared = None
    yield d
    so._shared = None
    status = d.stop()
    assert status == 0, f"wcached exited with {status}:\n{d.read_log()}"


def counting(fn, calls):
    def build(src):
        calls.append(sorted(src))
        return fn(src)
    return build


# ---- through wcached ----

def test_first_call_builds_then_attaches(derive_daemon, model_path):
    import torch
    calls = []
    first = wcache.derived("small", "f32-v1", counting(to_f32, calls))
    assert len(calls) == 1
    source = wcache.open_file(model_path)
    assert calls[0] == sorted(source.keys())
    again = wcache.derived("small", "f32-v1", counting(to_f32, calls))
    assert len(calls) == 1, "the artifact existed: build must not run again"
    assert sorted(first) == sorted(again) == sorted(source.keys())
    for name in source.keys():
        want = source.torch(name).float()
        assert first[name].dtype == torch.float32
        assert torch.equal(first[name], want)
        assert torch.equal(again[name], want)


def _publishing():
    """Whether wcache's _publish is on this thread's stack."""
    import sys
    f = sys._getframe()
    while f is not None:
        if f.f_code.co_name == "_publish" and f.f_globals.get("__name__") == "wcache._derived":
            return True
        f = f.f_back
    return False


def test_built_tensors_are_freed_while_publishing(derive_daemon, model_path):
    """Each tensor build returned is dropped as soon as libwcache has
    written it into the artifact (wc_build_publish_each), while publishing
    goes on: the builder never holds its whole result and the whole
    artifact at once. Before, every tensor lived until the publication
    had ended (died after _publish returned). The artifact is unchanged."""
    import weakref
    deaths = []

    def build(src):
        out = {k: v.float() for k, v in src.items()}
        for k, t in out.items():
            weakref.finalize(t, lambda k=k: deaths.append((k, _publishing())))
        return out
    art = wcache.derived("small", "f32-freed-v1", build)
    source = wcache.open_file(model_path)
    assert sorted(k for k, _ in deaths) == sorted(source.keys())
    assert all(during for _, during in deaths), [d for d in deaths if not d[1]]
    # In the order the artifact holds them: by name.
    assert [k for k, _ in deaths] == sorted(source.keys(), key=lambda k: k.encode())
    for k in source.keys():
        assert torch_equal(art[k], source.torch(k).float())
    # A caller that keeps build's result keeps its tensors: nothing breaks.
    kept = {}

    def build_kept(src):
        kept.update({k: v.float() for k, v in src.items()})
        return kept
    art2 = wcache.derived("small", "f32-kept-v1", build_kept)
    for k in source.keys():
        assert torch_equal(art2[k], kept[k])


def torch_equal(a, b):
    import torch
    return torch.equal(a, b)


def test_numpy_framework(derive_daemon, tmp_path):
    src = wcache.open_file(derive_daemon.f32_path)
    out = wcache.derived("wide", "np-neg-v1", lambda s: {k: -v for k, v in s.items()},
                         framework="np")
    for k in src.keys():
        assert isinstance(out[k], np.ndarray)
        assert not out[k].flags.writeable, "a view of the artifact's read-only mapping"
        assert (out[k] == -src.numpy(k)).all()


def test_path_names_the_model(derive_daemon, model_path):
    out = wcache.derived(model_path, "f32-v1", to_f32)
    again = wcache.derived("small", "f32-v1", lambda s: pytest.fail("built twice"))
    assert sorted(out) == sorted(again)


def test_non_contiguous_and_other_names(derive_daemon, model_path):
    import torch

    def build(src):
        w = src[sorted(src)[0]]
        return {"t": w.float().t(), "shape": torch.tensor(list(w.shape), dtype=torch.int64)}

    out = wcache.derived("small", "transposed-v1", build)
    src = wcache.open_file(model_path)
    first = src.torch(src.keys()[0]).float()
    assert torch.equal(out["t"], first.t().contiguous())
    assert out["shape"].tolist() == list(first.shape)


def test_build_exception_abandons_and_propagates(derive_daemon):
    def broken(src):
        raise ValueError("no tensor called lm_head")

    with pytest.raises(ValueError, match="lm_head"):
        wcache.derived("small", "f32-v1", broken)
    # The build ended for good: the next call builds again.
    calls = []
    wcache.derived("small", "f32-v1", counting(to_f32, calls))
    assert len(calls) == 1



@pytest.mark.parametrize("kind", ["missing-file", "daemon-down", "not-served"])
def test_build_raising_daemon_errors_propagates_once(derive_daemon, tmp_path, kind):
    """An exception build raises propagates once, even the kinds derived()
    takes from the daemon as "compute locally" (DaemonUnavailable,
    ModelNotFound, and NoSuchFile from a safe_open inside build): no
    second run of build here, no "not shared" warning."""
    calls = []

    def build(src):
        calls.append(1)
        if kind == "missing-file":
            wcache.safe_open(str(tmp_path / "missing.safetensors"), framework="np")
        elif kind == "daemon-down":
            wcache.connect(str(tmp_path / "nobody.sock"))
        raise wcache.ModelNotFound(errno.ENOENT, "tokenizer model not served")

    want = {"missing-file": FileNotFoundError, "daemon-down": wcache.DaemonUnavailable,
            "not-served": wcache.ModelNotFound}[kind]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with pytest.raises(want):
            wcache.derived("small", f"raise-{kind}-v1", build)
    assert len(calls) == 1, "build ran again after it raised"
    assert not [x for x in w if "computed in this process" in str(x.message)]
    # The build was abandoned: the next call builds through the daemon.
    again = []
    wcache.derived("small", f"raise-{kind}-v1", counting(to_f32, again))
    assert len(again) == 1

@pytest.mark.parametrize("result, kind, words", [
    ([1, 2], TypeError, "not a dict"),
    ({"w": "text"}, TypeError, "'w'"),
    ({3: np.zeros(2)}, TypeError, "not a str"),
])
def test_invalid_result_abandons(derive_daemon, result, kind, words):
    with pytest.raises(kind, match=words):
        wcache.derived("small", "bad-v1", lambda src: result)
    calls = []
    wcache.derived("small", "bad-v1", counting(to_f32, calls))
    assert len(calls) == 1



def test_nul_in_names(derive_daemon):
    """C strings end at a NUL: "small\\0junk" would derive "small", and a
    result key "w\\0x" would be published as "w"."""
    calls = []
    with pytest.raises(ValueError, match="null"):
        wcache.derived("small\0junk", "f32-v1", counting(to_f32, calls))
    assert not calls
    with pytest.raises(ValueError, match="NUL"):
        wcache.derived("small", "nul-v1", lambda src: {"w\0x": np.zeros(2, np.float32)})
    wcache.derived("small", "nul-v1", counting(to_f32, calls))  # abandoned: builds again
    assert len(calls) == 1

def test_model_without_derive_refuses(derive_daemon):
    with pytest.raises(wcache.WcacheError) as e:
        wcache.derived("plain", "f32-v1", to_f32)
    assert e.value.errno == errno.EPERM
    assert "plain" in str(e.value) and "f32-v1" in str(e.value)


def test_one_build_across_processes(derive_daemon, tmp_path):
    """Four processes ask at once: exactly one builds, all get the same
    bytes. They are forked, one after the other, by one python that has
    imported torch and wcache (and not connected): four new interpreters
    each took a second or more to import torch."""
    log = tmp_path / "builds.log"
    code = textwrap.dedent(f"""
        import os, hashlib, traceback, torch, wcache
        def build(src):
            with open({str(log)!r}, "a") as f:
                f.write(f"{{os.getpid()}}\\n")
            return {{k: v.float() * 3 for k, v in src.items()}}
        def ask():
            out = wcache.derived("small", "x3-v1", build, timeout=120)
            h = hashlib.sha256()
            for k in sorted(out):
                h.update(k.encode()); h.update(out[k].numpy().tobytes())
            return h.hexdigest()
        children = []
        for _ in range(4):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                status = 1
                try:
                    os.write(w, ask().encode())
                    status = 0
                except BaseException:
                    traceback.print_exc()
                finally:
                    os._exit(status)
            os.close(w)
            children.append((pid, r))
        for pid, r in children:
            with os.fdopen(r) as f:
                digest = f.read()
            status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            print(status, digest or "-", flush=True)
    """)
    r = run_python(code, timeout=300)
    assert r.returncode == 0, r.stderr
    outs = [line.split() for line in r.stdout.splitlines()]
    assert len(outs) == 4 and all(status == "0" for status, _ in outs), r.stdout + r.stderr
    assert len({digest for _, digest in outs}) == 1, outs
    assert len(log.read_text().split()) == 1, log.read_text()


def test_kept_results_share_the_connections_of_the_process(tmp_path, model_path, monkeypatch):
    """Every derived() result holds the connection it came through (for
    its RELEASE), and every call used to connect anew: with results kept,
    the (max_clients_per_uid + 1)th call, and every plain attach of the
    user after it, were refused ("too many connections from this user").
    The calls of a process now share their connections: as many as calls
    ran at once (review rev140 #2)."""
    import torch
    import wcache._derived as D
    d = Daemon(tmp_path, {"small": (model_path, {"derive": "yes"})},
               extra="max_clients_per_uid = 3").start()
    monkeypatch.setenv("WCACHE_SOCKET", d.socket)
    try:
        kept = [wcache.derived("small", f"k{i % 3}", to_f32) for i in range(8)]
        assert all(torch.equal(kept[i][k], kept[i % 3][k]) for i in range(8) for k in kept[0])
        free = D._pool[d.socket]
        assert len(free) == 1, free
        with wcache.connect() as c:
            assert c.attach("small").keys() == sorted(kept[0])
    finally:
        status = d.stop()
    assert status == 0, d.read_log()


def daemon_connections(socket):
    """The connections made to wcached's client socket now (every
    process's; the tests' only client is this process): the sockets that
    /proc/net/unix names by the listener's path, accepted (state 03) or
    still waiting in its backlog (02). Counting the accepted ones alone, a
    probe connection wcached had not yet accepted read as none (review
    rev161 F2)."""
    n = 0
    with open("/proc/net/unix") as f:
        next(f)
        for line in f:
            parts = line.split()
            if len(parts) >= 8 and parts[7] == socket and parts[5] in ("02", "03"):
                n += 1
    return n


@pytest.mark.parametrize("keep", [False, True])
def test_a_burst_of_calls_leaves_few_idle_connections(tmp_path, model_path, monkeypatch, keep):
    """A burst of N derived() calls at once needs N connections (each waits
    on its own); the pool kept all N for the life of the process, each
    counted by wcached against max_clients_per_uid, so that after the burst
    the user could not connect again (here max_clients_per_uid = N). Now
    the pool keeps at most two idle ones: the others close once the
    results that came through them are gone (keep: the results live on for
    a while, and their connections with them)."""
    import gc
    import wcache._derived as D
    from pyhelpers import wait_until
    n, cap = 5, D._KEEP_IDLE
    assert cap <= 2
    d = Daemon(tmp_path, {"small": (model_path, {"derive": "yes"})},
               extra=f"max_clients_per_uid = {n}").start()
    monkeypatch.setenv("WCACHE_SOCKET", d.socket)
    try:
        # Daemon.start()'s probe connection, until wcached has closed it
        wait_until(lambda: daemon_connections(d.socket) == 0, what="no connection")
        out, errors = [], []

        def build(src):
            # every caller of the burst connected: n connections at once
            wait_until(lambda: daemon_connections(d.socket) == n, what=f"{n} connections")
            return to_f32(src)

        def ask():
            try:
                out.append(wcache.derived("small", "burst-v1", build, timeout=60))
            except BaseException as e:
                errors.append(e)
        threads = [threading.Thread(target=ask) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors and len(out) == n, errors
        out0 = sorted(out[0])
        if keep:
            # the results hold their connections (for their RELEASE), and
            # the pool reuses them meanwhile: no new connection
            again = wcache.derived("small", "burst-v1", build, timeout=60)
            assert daemon_connections(d.socket) == n and sorted(again) == out0
            del again
        out.clear()
        gc.collect()
        wait_until(lambda: daemon_connections(d.socket) <= cap,
                   timeout=60, what=f"at most {cap} connections left")
        with wcache.connect() as c:  # refused before: n idle connections of this user
            assert sorted(c.attach("small").keys()) == sorted(wcache.open_file(model_path).keys())
        # and the kept ones serve the next calls
        assert sorted(wcache.derived("small", "burst-v1", build, timeout=60)) == sorted(out0)
        wait_until(lambda: daemon_connections(d.socket) <= cap, timeout=60,
                   what=f"at most {cap} connections")
    finally:
        status = d.stop()
    assert status == 0, d.read_log()


def test_calls_with_timeouts_of_their_own_share_the_idle_connections(tmp_path, model_path,
                                                                     monkeypatch):
    """The pool kept its two idle connections per (socket, timeout): a
    caller passing what is left of its own deadline made a new key on
    every call, and each call's connection stayed open for the life of the
    process, until wcached refused the user's next connection
    (max_clients_per_uid; review rev155 #4). Now the pool is per socket
    and each call sets the deadline of the connection it takes."""
    import gc
    import time
    import wcache._derived as D
    from pyhelpers import wait_until
    n = 5
    d = Daemon(tmp_path, {"small": (model_path, {"derive": "yes"})},
               extra=f"max_clients_per_uid = {n}").start()
    monkeypatch.setenv("WCACHE_SOCKET", d.socket)
    try:
        wait_until(lambda: daemon_connections(d.socket) == 0, what="no connection")
        deadline = time.monotonic() + 60
        for i in range(n + 1):
            out = wcache.derived("small", "left-v1", to_f32, timeout=deadline - time.monotonic())
            assert sorted(out) == sorted(wcache.open_file(model_path).keys())
            del out
        gc.collect()
        wait_until(lambda: daemon_connections(d.socket) <= D._KEEP_IDLE, timeout=60,
                   what=f"at most {D._KEEP_IDLE} connections")
        assert [k for k in D._pool if d.socket in str(k)] == [d.socket], list(D._pool)
        with wcache.connect() as c:  # refused before: n connections of this user
            assert sorted(c.attach("small").keys()) == sorted(wcache.open_file(model_path).keys())
    finally:
        status = d.stop()
    assert status == 0, d.read_log()


def test_an_idle_connection_is_reused(derive_daemon, monkeypatch):
    """The pool's idle connections were closed, not reused: taking one
    dropped the pool's only strong reference before reading the weak one,
    so the client was gone by then and every call connected anew (found
    while fixing review rev155 #4). Calls one after another now share one
    connection."""
    import gc
    import weakref
    import wcache._derived as D
    made = []  # weak: a reference here would keep the client alive
    real = D.connect

    def connect(*args):
        client = real(*args)
        made.append(weakref.ref(client))
        return client
    monkeypatch.setattr(D, "connect", connect)
    for _ in range(4):
        out = wcache.derived("small", "reuse-v1", to_f32, timeout=30)
        del out
        gc.collect()
    assert len(made) == 1 and made[0]() is not None, made


def test_a_shared_connection_takes_each_calls_timeout(derive_daemon, model_path):
    """A connection the pool hands out keeps no earlier call's deadline:
    a call with a short timeout that waits for another thread's build
    gives up after its own timeout (ETIMEDOUT), though the connection it
    took was made by a call with a long one; the next call with a long
    timeout gets the artifact."""
    import time
    import wcache._derived as D
    started, done = threading.Event(), threading.Event()
    errors = []

    def slow(src):
        started.set()
        done.wait(120)  # past the idle connection's 60 s: see took below
        return to_f32(src)

    def builder():
        try:
            wcache.derived("small", "slow-v1", slow, timeout=60)
        except BaseException as e:
            errors.append(e)
    t = threading.Thread(target=builder)
    t.start()
    try:
        assert started.wait(30)
        # the builder holds its connection: this makes a second one, of
        # 60 s, and leaves it idle for the next call
        wcache.derived("small", "warm-v1", to_f32, timeout=60)
        assert len(D._pool[derive_daemon.socket]) == 1
        start = time.monotonic()
        with pytest.raises(wcache.WcacheError) as e:
            wcache.derived("small", "slow-v1", to_f32, timeout=0.5)
        took = time.monotonic() - start
        # The pooled connection's 60 s would end it at 60 s at the soonest
        # (the build it waits for lasts 120 s): 30 s is for a loaded machine.
        assert e.value.errno == errno.ETIMEDOUT and took < 30, (e.value, took)
        # the caller's own timeout, with its figure and setting (review rev181 F8)
        assert "derived(timeout=0.5) waits 0.5 s" in str(e.value), e.value
    finally:
        done.set()
        t.join(60)
    assert not errors, errors
    assert sorted(wcache.derived("small", "slow-v1", to_f32, timeout=60)) == \
        sorted(wcache.open_file(model_path).keys())


def builder_then_waiter(call, started):
    """Runs call() in a thread (the builder) and, once started is set, in a
    second one (the waiter); returns ({"builder"/"waiter": its result},
    [the errors raised], the builder's thread, the waiter's)."""
    out, errors = {}, []

    def ask(who):
        try:
            out[who] = call()
        except BaseException as e:
            errors.append(e)
    builder = threading.Thread(target=ask, args=("builder",))
    builder.start()
    assert started.wait(30)
    waiter = threading.Thread(target=ask, args=("waiter",))
    waiter.start()
    return out, errors, builder, waiter


def test_a_thread_waits_for_another_threads_build(derive_daemon):
    """Two threads of one process ask for one key: one builds, the other
    waits for it on a connection of its own (the builder's is in use until
    it has published) and gets the artifact, not EDEADLK."""
    import torch
    started, done = threading.Event(), threading.Event()
    calls = []

    def slow(src):
        calls.append(1)
        started.set()
        done.wait(10)
        return to_f32(src)

    out, errors, builder, waiter = builder_then_waiter(
        lambda: wcache.derived("small", "two-threads-v1", slow, timeout=60), started)
    waiter.join(1.0)
    assert waiter.is_alive(), f"the waiter did not wait: {errors!r}"
    done.set()
    builder.join(60)
    waiter.join(60)
    assert not errors and len(calls) == 1, (errors, calls)
    for k in out["builder"]:
        assert torch.equal(out["builder"][k], out["waiter"][k])


def waiting(d, key, n, model="small"):
    """Waits until n connections wait in wcached for the build of model's
    key (their DERIVE was read)."""
    def check():
        r = subprocess.run([binary("wcachectl"), "--control", d.control, "--json", "status"],
                           capture_output=True, text=True, timeout=60)
        entry = [m for m in json.loads(r.stdout)["models"] if m["name"] == model]
        for x in entry[0].get("derived") or ():
            if x["key"] == key and x["state"] == "building":
                return x["waiting"] == n
        return False
    wait_until(check, what=f"{n} waiting for {key}")


def test_a_waiter_without_timeout_waits_as_long_as_the_build(derive_daemon, monkeypatch):
    """With no timeout, a worker waiting for another's build waits past the
    connection's default deadline ($WCACHE_TIMEOUT, 1 s here; 30 s by
    default) for as long as wcached lets the build run (derive_timeout),
    and gets the artifact. Before, it failed with ETIMEDOUT at 1 s ("after
    the wait the client asked for", though it asked for none; review
    rev181 F8). Costs about 3 s."""
    import torch
    monkeypatch.setenv("WCACHE_TIMEOUT", "1")
    started, done = threading.Event(), threading.Event()

    def slow(src):
        started.set()
        done.wait(60)
        return to_f32(src)

    out, errors, builder, waiter = builder_then_waiter(
        lambda: wcache.derived("small", "slow-default-v1", slow), started)
    try:
        waiting(derive_daemon, "slow-default-v1", 1)
        waiter.join(3.0)  # three times the default deadline
        assert waiter.is_alive(), f"the waiter stopped waiting: {errors!r}"
    finally:
        done.set()
        builder.join(60)
    waiter.join(60)
    assert not errors, errors
    for k in out["builder"]:
        assert torch.equal(out["builder"][k], out["waiter"][k])


@pytest.mark.parametrize("framework", ["pt", "np"])
def test_a_swap_as_the_build_starts_builds_the_generation_the_build_gave(
        derive_daemon, model_path, tmp_path, monkeypatch, framework):
    """The model is replaced between the BUILD answer and the builder's
    own attach of the source (a hook at _source: the swap is done and seen
    before the attach runs). The builder builds the generation the BUILD
    gave, and the worker waiting for that build gets it, stale at once:
    before, the builder abandoned ("changed generation while the build
    began") and built the new generation, and the waiter got ECANCELED
    (review rev181 F1). numpy: the F32 model "wide"."""
    import torch
    import wcache._derived as D
    original = D._source
    name, path = ("small", model_path) if framework == "pt" else ("wide", derive_daemon.f32_path)
    with wcache.open_file(path) as m:
        old_values = {k: torch.from_numpy(np.array(m.numpy(k))) if framework == "np" else
                      m.torch(k).float().clone() for k in m.keys()}
    build = to_f32 if framework == "pt" else (lambda src: {k: v * 2 for k, v in src.items()})
    want = old_values if framework == "pt" else {k: v * 2 for k, v in old_values.items()}
    client = wcache.connect(derive_daemon.socket)
    held = client.attach(name)  # generation 1, to see the swap by its stale()
    entered = threading.Event()
    calls = []

    def swap_first(*args):
        if entered.is_set():  # the next build, of the new generation
            return original(*args)
        entered.set()
        waiting(derive_daemon, "swap-v1", 1, name)
        new = tmp_path / ".replacement.safetensors"
        mkmodel(str(new), seed=42, dtype="BF16" if framework == "pt" else "F32")
        os.rename(new, path)
        wait_until(held.stale, what="the swap served")
        return original(*args)
    monkeypatch.setattr(D, "_source", swap_first)
    out, errors, builder, waiter = builder_then_waiter(
        lambda: wcache.derived(name, "swap-v1", counting(build, calls), framework=framework,
                               timeout=60), entered)
    builder.join(60)
    waiter.join(60)
    assert not errors, errors
    assert len(calls) == 1, calls
    for who in ("builder", "waiter"):
        r = out[who]
        assert r.generation == held.generation and r.stale(), (who, r.generation)
        assert sorted(r) == sorted(want)
        for k, v in want.items():
            got = torch.from_numpy(np.array(r[k])) if framework == "np" else r[k]
            assert torch.equal(got, v), (who, k)
    held.close()
    client.close()
    # the next call builds the new generation
    fresh = wcache.derived(name, "swap-v1", build, framework=framework)
    assert fresh.generation == out["builder"].generation + 1 and not fresh.stale()


def test_the_result_is_a_dict_with_generation_and_stale(derive_daemon, model_path, tmp_path):
    """derived() returns a dict that says its source generation and, with
    stale(), when wcached serves a newer one; pickled, it is a plain dict.
    Before, a plain dict with neither (review rev181 F9)."""
    import torch
    r = wcache.derived("small", "f32-stale-v1", to_f32)
    assert isinstance(r, dict) and isinstance(r, wcache._derived.Derived)
    with wcache.connect(derive_daemon.socket) as c:
        m = c.attach("small")
        assert r.generation == m.generation >= 1
        m.close()
    assert not r.stale()
    plain = pickle.loads(pickle.dumps(r))
    assert type(plain) is dict and sorted(plain) == sorted(r)
    assert all(torch.equal(plain[k], r[k]) for k in r)
    new = tmp_path / ".replacement.safetensors"
    mkmodel(str(new), seed=43)
    os.rename(new, model_path)
    wait_until(r.stale, what="the derived copy stale")
    again = wcache.derived("small", "f32-stale-v1", to_f32)
    assert again.generation == r.generation + 1 and not again.stale()


@pytest.mark.parametrize("daemon_up", [True, False])
def test_a_build_that_asks_for_its_own_key_is_told_at_once(tmp_path, model_path, monkeypatch,
                                                           daemon_up):
    """build() calling derived() for the key it builds waited for itself
    (its own connection is the builder's, so the call made another, which
    wcached cannot tell from another worker) until the deadline or the
    model's derive_timeout, then the daemon handed the build to the nested
    call and the outer publication failed. Without wcached it recursed
    until RecursionError. Now: WcacheError EDEADLK at once, naming the
    model and key, as the README promises (review rev140 #3); another key
    from inside build works."""
    import time
    import torch
    d = None
    if daemon_up:
        d = Daemon(tmp_path, {"small": (model_path, {"derive": "yes",
                                                      "derive_timeout": "20"})}).start()
        monkeypatch.setenv("WCACHE_SOCKET", d.socket)
    else:
        monkeypatch.setenv("WCACHE_SOCKET", str(tmp_path / "nobody.sock"))
    seen = {}

    def nested(src):
        start = time.monotonic()
        try:
            wcache.derived("small" if daemon_up else model_path, "self-v1", to_f32, timeout=5)
        except wcache.WcacheError as e:
            seen["error"], seen["took"] = e, time.monotonic() - start
        inner = wcache.derived("small" if daemon_up else model_path, "other-v1", to_f32,
                               timeout=30)
        return {k: v + 1 for k, v in inner.items()}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # without wcached: built here
            out = wcache.derived("small" if daemon_up else model_path, "self-v1", nested,
                                 timeout=30)
        e = seen["error"]
        assert e.errno == errno.EDEADLK and seen["took"] < 2, (e, seen["took"])
        assert "self-v1" in str(e) and ("small" if daemon_up else model_path) in str(e)
        src = wcache.open_file(model_path)
        for k in src.keys():
            assert torch.equal(out[k], src.torch(k).float() + 1)
    finally:
        if d is not None:
            status = d.stop()
            assert status == 0, d.read_log()


@pytest.mark.parametrize("daemon_up, outer, inner", [
    (True, "name", "path"), (True, "path", "name"), (True, "name", "symlink"),
    (True, "relative", "absolute"), (True, "path", "hardlink"),
    (False, "relative", "absolute"), (False, "path", "symlink"), (False, "path", "hardlink")])
def test_a_build_that_asks_for_its_own_key_under_another_name_is_told_at_once(
        tmp_path, model_path, monkeypatch, daemon_up, outer, inner):
    """The EDEADLK check compared the model as spelled (and its absolute
    and real paths): a build of derived("small", k) asking for
    derived("/path/small.safetensors", k), or the reverse, waited for
    itself (its timeout here, else the deadline or derive_timeout; review
    rev145 #1), and without wcached a nested call under another path built
    again. Now the check also compares the models themselves (generation
    and mapped files): EDEADLK at once, whichever name each call uses."""
    import time
    d = None
    if daemon_up:
        d = Daemon(tmp_path, {"small": (model_path, {"derive": "yes",
                                                      "derive_timeout": "20"})}).start()
        monkeypatch.setenv("WCACHE_SOCKET", d.socket)
    else:
        monkeypatch.setenv("WCACHE_SOCKET", str(tmp_path / "nobody.sock"))
    (tmp_path / "link.safetensors").symlink_to(model_path)
    os.link(model_path, tmp_path / "hard.safetensors")
    monkeypatch.chdir(tmp_path)
    spell = {"name": "small", "path": str(model_path), "absolute": str(model_path),
             "relative": os.path.basename(model_path),
             "symlink": str(tmp_path / "link.safetensors"),
             "hardlink": str(tmp_path / "hard.safetensors")}
    seen = {}

    def nested(src):
        start = time.monotonic()
        try:
            wcache.derived(spell[inner], "self-v1", to_f32, timeout=3)
            seen["error"] = None
        except wcache.WcacheError as e:
            seen["error"] = e
        seen["took"] = time.monotonic() - start
        return to_f32(src)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # without wcached: built here
            out = wcache.derived(spell[outer], "self-v1", nested, timeout=30)
        e = seen["error"]
        assert e is not None and e.errno == errno.EDEADLK and seen["took"] < 2, (e, seen)
        assert "self-v1" in str(e) and spell[inner] in str(e), e
        assert sorted(out) == sorted(wcache.open_file(model_path).keys())
    finally:
        if d is not None:
            status = d.stop()
            assert status == 0, d.read_log()


def test_another_model_under_the_same_key_is_not_refused(derive_daemon, model_path):
    """The check by identity refuses the build's own model only: a build of
    ("small", k) may ask for ("wide", k), a model of other files."""
    import torch
    got = {}

    def nested(src):
        got["wide"] = wcache.derived(derive_daemon.f32_path, "same-key-v1", to_f32, timeout=30)
        return to_f32(src)
    out = wcache.derived("small", "same-key-v1", nested, timeout=30)
    wide = wcache.open_file(derive_daemon.f32_path)
    assert sorted(got["wide"]) == sorted(wide.keys())
    for k in wide.keys():
        assert torch.equal(got["wide"][k], wide.torch(k))
    assert sorted(out) == sorted(wcache.open_file(model_path).keys())


@pytest.mark.parametrize("case", ["hardlink", "samepath", "paths", "symlink"])
def test_two_models_on_one_file_are_two_models(tmp_path, model_path, monkeypatch, case):
    """wcached serves two models on one file ("small" and "copy": one path
    configured twice, a hard link of it, or a symlink to it): each has
    generations and builds of its own. The EDEADLK check compared
    generation and files, which are the same (generation 1 of one inode),
    and refused a build of "small" that asked for "copy" under the same
    key, though wcached would not have made it wait (review rev155 #1); a
    build asked by a configured symlink refused its target's path as one
    of its own names. Two names, or two configured paths, that wcached
    serves are two models; the nested call builds."""
    import time
    import torch
    hard = tmp_path / "copy.safetensors"
    link = tmp_path / "link.safetensors"
    os.link(model_path, hard)
    link.symlink_to(os.path.basename(model_path))  # wcached refuses absolute ones here
    first, other = {"samepath": (model_path, model_path), "symlink": (link, model_path)}.get(
        case, (model_path, hard))
    d = Daemon(tmp_path, {"small": (first, {"derive": "yes", "derive_timeout": "20"}),
                          "copy": (other, {"derive": "yes", "derive_timeout": "20"})}).start()
    monkeypatch.setenv("WCACHE_SOCKET", d.socket)
    outer, inner = ("small", "copy") if case in ("hardlink", "samepath") else \
        (str(first), str(other))
    seen, calls = {}, []

    def nested(src):
        start = time.monotonic()
        try:
            seen["inner"] = wcache.derived(inner, "two-v1", counting(to_f32, calls), timeout=10)
        except wcache.WcacheError as e:
            seen["error"] = e
        seen["took"] = time.monotonic() - start
        return to_f32(src)
    try:
        out = wcache.derived(outer, "two-v1", counting(nested, calls), timeout=30)
        assert "error" not in seen and seen["took"] < 5, seen
        assert len(calls) == 2, calls  # one build per model
        src = wcache.open_file(model_path)
        for k in src.keys():
            assert torch.equal(seen["inner"][k], src.torch(k).float())
            assert torch.equal(out[k], src.torch(k).float())
    finally:
        status = d.stop()
    assert status == 0, d.read_log()


def _mappings_of(path):
    """How many mappings of path's inode this process has."""
    st = os.stat(path)
    n = 0
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 5 and parts[4] == str(st.st_ino):
                n += 1
    return n


@pytest.mark.parametrize("daemon_up", [True, False])
def test_a_refused_local_call_leaves_nothing_mapped_and_does_not_warn(
        tmp_path, model_path, monkeypatch, daemon_up):
    """A nested call that falls back to this process (here: a hard link
    wcached does not serve) and is refused with EDEADLK first warned that
    it was "computed in this process" (nothing was, and the (model, key)
    pair was then never warned about again) and kept the file it opened
    mapped for as long as the caller held the exception (review rev155
    #3). Now it checks before warning and closes what it opened."""
    hard = tmp_path / "hard.safetensors"
    os.link(model_path, hard)
    d = None
    if daemon_up:
        d = Daemon(tmp_path, {"small": (model_path, {"derive": "yes"})}).start()
        monkeypatch.setenv("WCACHE_SOCKET", d.socket)
    else:
        monkeypatch.setenv("WCACHE_SOCKET", str(tmp_path / "nobody.sock"))
    seen = {}

    def nested(src):
        seen["before"] = _mappings_of(model_path)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            try:
                wcache.derived(str(hard), "left-v1", to_f32, timeout=5)
            except wcache.WcacheError as e:
                seen["error"] = e  # kept: its traceback holds the call's frames
        seen["warned"] = [str(x.message) for x in w if "computed in this process"
                          in str(x.message)]
        seen["after"] = _mappings_of(model_path)
        return to_f32(src)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # without wcached: built here
            wcache.derived("small" if daemon_up else str(model_path), "left-v1", nested,
                           timeout=30)
        assert seen["error"].errno == errno.EDEADLK, seen
        assert seen["after"] == seen["before"], seen
        assert seen["warned"] == [], seen
        # the pair is still warned about when it is computed here
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            wcache.derived(str(hard), "left-v1", to_f32, timeout=5)
        assert [x for x in w if "computed in this process" in str(x.message)], \
            [str(x.message) for x in w]
    finally:
        if d is not None:
            status = d.stop()
            assert status == 0, d.read_log()


def test_no_paths_looked_up_unless_this_thread_builds_the_key(model_path, monkeypatch):
    """The EDEADLK check resolved the name's paths (a stat, a realpath:
    about 25 us) on every call before it looked whether this thread builds
    anything; now only when it builds the key asked for (review rev155
    #4)."""
    import wcache._derived as D

    def names(target):
        raise AssertionError(f"_names({target!r}) looked up")
    monkeypatch.setattr(D, "_names", names)
    assert D._builds_here(str(model_path), "k-v1") is False


def test_source_tensors_outlive_the_build(derive_daemon):
    """A source tensor build keeps stays readable after the build ended
    (it comes from an attach of its own, not the build's source)."""
    import torch
    kept = {}

    def build(src):
        kept.update(src)
        return to_f32(src)

    out = wcache.derived("small", "keep-v1", build)
    for k, v in kept.items():
        assert torch.equal(v.float(), out[k])


# ---- expect=: the key is the artifact's whole identity ----

def quantize_int8(src):
    """Another transform than to_f32: per-tensor int8 with a scale, under
    other names (review rev181 F4's samekey.py)."""
    out = {}
    for k, v in src.items():
        scale = np.float32(max(float(np.abs(v).max()), 1e-8) / 127)
        out[k + ".q"] = np.round(v / scale).astype(np.int8)
        out[k + ".scale"] = np.array(scale, dtype=np.float32)
    return out


def test_expect_tells_a_key_shared_by_another_transform(derive_daemon):
    """A float32 build published first under a key; a caller asking that key
    for int8 tensors, with expect=, gets DerivedMismatch naming the model,
    the key, the first tensor that differs and what it found, and its build
    never runs. Before, it got the float32 tensors, unwarned (derived() had
    no expect=: the call raised TypeError)."""
    src = wcache.open_file(derive_daemon.f32_path)
    first = src.keys()[0]
    shape = src.info(first).shape
    neg = wcache.derived("wide", "shared-v1", lambda s: {k: -v for k, v in s.items()},
                         framework="np")
    assert sorted(neg) == sorted(src.keys())
    calls = []
    with pytest.raises(wcache.DerivedMismatch) as e:
        wcache.derived("wide", "shared-v1", counting(quantize_int8, calls), framework="np",
                       expect={first + ".q": ("I8", shape)})
    assert not calls, "the artifact existed: build must not run"
    said = str(e.value)
    assert e.value.errno == errno.EBADMSG
    assert isinstance(e.value, wcache.WcacheError) and isinstance(e.value, ValueError)
    assert "model 'wide', key 'shared-v1'" in said, said
    assert f"tensor '{first}.q': expected I8 {list(shape)}, found no such tensor" in said, said
    assert "another transform may have been published under it first" in said, said
    assert "new key" in said, said
    # The same names with another dtype: what was expected and what was found.
    with pytest.raises(wcache.DerivedMismatch, match=re.escape(
            f"tensor '{first}': expected I8 {list(shape)}, found F32 {list(shape)}")):
        wcache.derived("wide", "shared-v1", counting(quantize_int8, calls), framework="np",
                       expect={first: (np.int8, shape)})
    # A matching expect (any spelling of the dtype, a shape or any) passes.
    ok = wcache.derived("wide", "shared-v1", counting(quantize_int8, calls), framework="np",
                        expect={first: ("F32", shape), src.keys()[1]: (np.float32, None)})
    assert not calls
    assert (ok[first] == -src.numpy(first)).all()
    # Under a key of its own, the int8 transform builds and passes its expect.
    q = wcache.derived("wide", "int8-v1", counting(quantize_int8, calls), framework="np",
                       expect={first + ".q": ("I8", shape), first + ".scale": ("F32", ())})
    assert len(calls) == 1 and q[first + ".q"].dtype == np.int8


def test_expect_callable(derive_daemon):
    """A callable expect is given the state derived() returns: False or an
    exception is a mismatch (the exception chained), None or True passes."""
    wcache.derived("wide", "f32-v1", lambda s: {k: -v for k, v in s.items()},
                   framework="np")

    def all_int8(state):
        return all(v.dtype == np.int8 for v in state.values())
    with pytest.raises(wcache.DerivedMismatch,
                       match=r"key 'f32-v1': .*expect .*all_int8\(state\) returned False; "):
        wcache.derived("wide", "f32-v1", quantize_int8, framework="np", expect=all_int8)

    def has_scales(state):
        assert any(k.endswith(".scale") for k in state), "no scales"
    with pytest.raises(wcache.DerivedMismatch,
                       match=r"has_scales\(state\) raised AssertionError: no scales") as e:
        wcache.derived("wide", "f32-v1", quantize_int8, framework="np", expect=has_scales)
    assert isinstance(e.value.__cause__, AssertionError)
    seen = []
    out = wcache.derived("wide", "f32-v1", quantize_int8, framework="np",
                         expect=lambda state: seen.append(sorted(state)))
    assert seen == [sorted(out)]
    wcache.derived("wide", "f32-v1", quantize_int8, framework="np",
                   expect=lambda state: all(v.dtype == np.float32 for v in state.values()))


def derived_attached(d, key, model="small"):
    """How many attaches wcached counts on model's artifact of key."""
    r = subprocess.run([binary("wcachectl"), "--control", d.control, "--json", "status"],
                       capture_output=True, text=True, timeout=60)
    entry = [m for m in json.loads(r.stdout)["models"] if m["name"] == model]
    return [x["attached"] for x in entry[0].get("derived") or () if x["key"] == key]


def released(d, key, model="small"):
    """Waits (a few seconds) until wcached counts no attach of model's
    artifact of key."""
    wait_until(lambda: derived_attached(d, key, model) == [0], timeout=5,
               what=f"{model} [{key}] released")


def test_expect_checks_names_before_converting_the_artifact(derive_daemon):
    """The mapping form of expect is checked on the artifact's index before
    the state is made: an artifact published under the key with a BF16
    tensor the caller does not name, asked for with framework="np" (numpy
    has no bfloat16), raises DerivedMismatch naming the tensor that
    differs. Before, derived() converted the whole artifact first and
    raised TypeError ("numpy has no bfloat16"), never checking expect, with
    the artifact still attached while the caller held the exception
    (review rev183 F2). After the mismatch the artifact is released."""
    wcache.derived("small", "bf16-extra-v1",
                   lambda s: {"w": next(iter(s.values())).float(),
                              "x": next(iter(s.values()))})
    released(derive_daemon, "bf16-extra-v1")
    calls = []
    with pytest.raises(wcache.DerivedMismatch, match=re.escape(
            "tensor 'w': expected I8 of any shape, found F32")) as e:
        wcache.derived("small", "bf16-extra-v1", counting(quantize_int8, calls),
                       framework="np", expect={"w": ("I8", None)})
    assert not calls
    assert "model 'small', key 'bf16-extra-v1'" in str(e.value), e.value
    released(derive_daemon, "bf16-extra-v1")  # the caller holds the exception
    # Names that match pass the mapping check; numpy's own limit is what
    # is left to raise then, and the artifact is released the same way.
    with pytest.raises(TypeError, match="numpy has no bfloat16") as t:
        wcache.derived("small", "bf16-extra-v1", quantize_int8, framework="np",
                       expect={"w": ("F32", None)})
    assert "tensor 'x' is BF16" in str(t.value), t.value
    released(derive_daemon, "bf16-extra-v1")


def test_a_failing_callable_expect_releases_the_artifact(derive_daemon):
    """A callable expect that raises is chained to DerivedMismatch, but its
    frame (which holds the state it was given: views of the artifact) is
    not kept with it: the artifact is released while the caller holds the
    exception (review rev183 F2, minor)."""
    wcache.derived("wide", "held-v1", lambda s: {k: -v for k, v in s.items()},
                   framework="np")

    def picky(state):
        assert not state, "not empty"
    with pytest.raises(wcache.DerivedMismatch, match="picky.*raised AssertionError") as e:
        wcache.derived("wide", "held-v1", quantize_int8, framework="np", expect=picky)
    assert isinstance(e.value.__cause__, AssertionError)
    released(derive_daemon, "held-v1", "wide")  # the caller holds the exception


def test_a_failing_callable_expect_frees_the_builders_result(derive_daemon):
    """In the builder, a callable expect that raises kept build's private
    result alive (its frame held the state it was given) for as long as
    the caller held the exception, though the build was abandoned (review
    rev183 F2, minor); now the result is freed."""
    import gc
    import weakref
    refs = []

    def build(src):
        out = {k: np.ascontiguousarray(v * 2) for k, v in src.items()}
        refs.extend(weakref.ref(v) for v in out.values())
        return out

    def picky(state):
        assert not state, "not empty"
    with pytest.raises(wcache.DerivedMismatch, match="picky.*raised AssertionError") as e:
        wcache.derived("wide", "picky-v1", build, framework="np", expect=picky)
    gc.collect()
    kept = sum(r() is not None for r in refs)
    assert refs and not kept, f"{kept} of build's {len(refs)} tensors kept by {e.value!r}"


def test_a_build_that_fails_its_own_expect_is_not_published(derive_daemon):
    """In the builder, expect is checked on build's result before it is
    published: one that fails is abandoned (the next call builds again),
    not shared under the key."""
    src = wcache.open_file(derive_daemon.f32_path)
    first = src.keys()[0]
    with pytest.raises(wcache.DerivedMismatch, match=re.escape(
            f"model 'wide', key 'q-v1': build's result is not what expect= says: tensor "
            f"'{first}': expected I8 of any shape, found F32")) as e:
        wcache.derived("wide", "q-v1", lambda s: dict(s), framework="np",
                       expect={first: ("I8", None)})
    assert "not published" in str(e.value)
    calls = []
    q = wcache.derived("wide", "q-v1", counting(quantize_int8, calls), framework="np",
                       expect={first + ".q": ("I8", None)})
    assert len(calls) == 1 and q[first + ".q"].dtype == np.int8


# ---- without wcached ----

def test_fallback_without_daemon(no_daemon, model_path):
    import torch
    calls = []
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = wcache.derived(model_path, "f32-fallback-v1", counting(to_f32, calls))
        again = wcache.derived(model_path, "f32-fallback-v1", counting(to_f32, calls))
    said = [x for x in w if issubclass(x.category, RuntimeWarning)
            and "computed in this process" in str(x.message)]
    assert len(said) == 1, [str(x.message) for x in w]
    assert len(calls) == 2  # no daemon to share it: each call builds
    assert out.generation == 0 and not out.stale()  # computed here, as Model's
    source = wcache.open_file(model_path)
    for name in source.keys():
        assert torch.equal(out[name], source.torch(name).float())
        assert torch.equal(again[name], out[name])


def test_fallback_makes_contiguous(no_daemon, model_path):
    def build(src):
        return {k: v.t() for k, v in src.items() if v.dim() == 2}

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = wcache.derived(model_path, "t-v1", build)
    assert out and all(v.is_contiguous() for v in out.values())


def test_fallback_numpy(no_daemon, tmp_path):
    path = mkmodel(tmp_path / "f32.safetensors", dtype="F32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = wcache.derived(path, "neg-v1", lambda s: {k: -v for k, v in s.items()},
                             framework="np")
    src = wcache.open_file(path)
    for k in src.keys():
        assert (out[k] == -src.numpy(k)).all()


def test_fallback_numpy_keeps_zero_dimensional_shapes(no_daemon, tmp_path):
    path = mkmodel(tmp_path / "f32.safetensors", dtype="F32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = wcache.derived(path, "scale-v1",
                             lambda s: {"scale": np.array(0.5, dtype=np.float32)},
                             framework="np")
    assert out["scale"].shape == () and out["scale"] == np.float32(0.5)


def test_fallback_build_errors_propagate(no_daemon, model_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(KeyError, match="nope"):
            wcache.derived(model_path, "err-v1", lambda s: s["nope"])
        with pytest.raises(TypeError, match="not a dict"):
            wcache.derived(model_path, "err-v1", lambda s: None)


def test_fallback_missing_file(no_daemon, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(FileNotFoundError):
            wcache.derived(str(tmp_path / "missing.safetensors"), "f32-v1", to_f32)


@pytest.mark.parametrize("key", ["", "a/b", "x" * 65, "sp ace", "é"])
def test_bad_keys(no_daemon, model_path, key):
    with pytest.raises(ValueError, match="key"):
        wcache.derived(model_path, key, to_f32)


def test_bad_arguments(no_daemon, model_path):
    with pytest.raises(TypeError, match="callable"):
        wcache.derived(model_path, "f32-v1", None)
    with pytest.raises(ValueError, match="framework"):
        wcache.derived(model_path, "f32-v1", to_f32, framework="tf")


def test_fallback_in_a_fresh_process(no_daemon, model_path):
    """The warning is a RuntimeWarning a script sees on stderr, once."""
    r = run_python(textwrap.dedent(f"""
        import wcache
        for _ in range(3):
            out = wcache.derived({model_path!r}, "f32-v1",
                                 lambda s: {{k: v.float() for k, v in s.items()}})
        print(len(out))
    """), env={"WCACHE_SOCKET": no_daemon})
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) > 0
    assert r.stderr.count("RuntimeWarning") == 1, r.stderr


def test_fallback_checks_expect(no_daemon, tmp_path):
    path = mkmodel(tmp_path / "f32.safetensors", dtype="F32")
    first = wcache.open_file(path).keys()[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(wcache.DerivedMismatch, match=re.escape(
                f"key 'f32-v1': build's result is not what expect= says: tensor "
                f"'{first}': expected I8")):
            wcache.derived(path, "f32-v1", lambda s: dict(s), framework="np",
                           expect={first: ("I8", None)})
        out = wcache.derived(path, "f32-v1", lambda s: dict(s), framework="np",
                             expect={first: ("F32", None)})
    assert first in out


@pytest.mark.parametrize("expect, kind, words", [
    ([("w", "I8")], TypeError, "mapping of tensor name"),
    ({"w": "I8"}, TypeError, "'w'.*not a \\(dtype, shape\\) pair"),
    ({"w": ("int4", None)}, ValueError, "dtype .int4."),
    ({"w": ("i8", None)}, ValueError, "dtype .i8."),
    ({"w": ("I8", (2, -1))}, ValueError, "shape"),
    ({"w": ("I8", 3)}, ValueError, "shape"),
    ({1: ("I8", None)}, TypeError, "not a str"),
])
def test_bad_expect(no_daemon, model_path, expect, kind, words):
    """A bad expect is refused before anything runs."""
    with pytest.raises(kind, match=words):
        wcache.derived(model_path, "f32-v1", lambda s: pytest.fail("built"), expect=expect)
