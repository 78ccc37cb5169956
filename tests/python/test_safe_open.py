"""wcache.safe_open has the interface of safetensors.safe_open."""
import gc
import os
import weakref

import numpy as np
import pytest
import torch

import wcache
from pyhelpers import file_mappings, other_thread_before, wait_child, write_safetensors


@pytest.fixture
def st_file(tmp_path):
    w = np.arange(24, dtype="<f4").reshape(4, 6)
    ids = np.array([5, 6, 7], dtype="<i4")
    path = tmp_path / "m.safetensors"
    write_safetensors(path, [("w", "F32", (4, 6), w.tobytes()),
                             ("ids", "I32", (3,), ids.tobytes())],
                      metadata={"format": "pt"})
    nometa = tmp_path / "nometa.safetensors"
    write_safetensors(nometa, [("x", "U8", (2,), b"\x01\x02")])
    return str(path), str(nometa), w, ids


@pytest.mark.parametrize("framework", ["pt", "torch", "pytorch", "np", "numpy"])
def test_frameworks(st_file, framework, no_daemon):
    path, _, w, ids = st_file
    with wcache.safe_open(path, framework=framework, device="cpu") as f:
        assert f.keys() == ["ids", "w"]
        assert f.metadata() == {"format": "pt"}
        t = f.get_tensor("w")
        if framework in ("pt", "torch", "pytorch"):
            assert isinstance(t, torch.Tensor)
            assert torch.equal(t, torch.from_numpy(w))
        else:
            assert isinstance(t, np.ndarray) and not t.flags.writeable
            assert np.array_equal(t, w)
        with pytest.raises(KeyError):
            f.get_tensor("nope")


def test_get_slice(st_file, no_daemon):
    path, _, w, _ = st_file
    with wcache.safe_open(path, framework="pt") as f:
        s = f.get_slice("w")
        assert s.get_shape() == [4, 6]
        assert s.get_dtype() == "F32"
        assert torch.equal(s[1:3], torch.from_numpy(w[1:3]))
        assert torch.equal(s[:, 2], torch.from_numpy(w[:, 2]))
        assert torch.equal(s[1:3, ::2], torch.from_numpy(w[1:3, ::2]))
        assert s[0, 0].item() == 0.0
    with wcache.safe_open(path, framework="np") as f:
        assert np.array_equal(f.get_slice("w")[..., 1:], w[..., 1:])


def test_metadata_none_when_absent(st_file, no_daemon):
    _, nometa, _, _ = st_file
    with wcache.safe_open(nometa, framework="np") as f:
        assert f.metadata() is None
        assert f.get_tensor("x").tolist() == [1, 2]


def test_bad_arguments(st_file, no_daemon):
    path, _, _, _ = st_file
    with pytest.raises(ValueError, match="framework"):
        wcache.safe_open(path, framework="tf")
    with pytest.raises(ValueError, match="Device cuda:0 is not supported for framework numpy"):
        wcache.safe_open(path, framework="np", device="cuda:0")
    with pytest.raises(wcache.SafetensorError, match="framework PT is invalid"):
        wcache.safe_open(path, framework="PT")  # upstream's names are exact


def test_closed_after_with(st_file, no_daemon):
    path, _, w, _ = st_file
    with wcache.safe_open(path) as f:
        t = f.get_tensor("w")
    with pytest.raises(ValueError, match="closed"):
        f.get_tensor("w")
    assert torch.equal(t, torch.from_numpy(w))


def test_close_from_two_threads_at_once(st_file, no_daemon):
    """Two threads closing one handle at once (a loader's thread and a
    finally in another) both return, and the handle is closed: for each
    line of close() in turn, another thread's whole close() runs just
    before that line (a line trace makes the interleaving, so every one is
    tried, every run; other_thread_before, which sees the other thread
    blocked on a lock this one holds within about 10 ms). Before, the one
    in the middle of close() could find
    the attribute it had just checked cleared (AttributeError on None)."""
    path, _, _, _ = st_file
    k = 0
    while True:
        f = wcache.safe_open(path, framework="np")
        f.get_tensors()  # the handle's runs exist: close() has them to close
        errors, other_errors, ran = other_thread_before(
            wcache.safe_open.close.__code__, k, f.close, f.close)
        assert not errors and not other_errors, \
            f"the other close() before line {k} of close(): {errors + other_errors!r}"
        with pytest.raises(ValueError, match="closed"):
            f.get_tensor("ids")
        if not ran:
            break  # k is past close()'s last line: every interleaving was tried
        k += 1
    assert k > 5


def _closed_error(e):
    """What a closed handle raises: upstream's SafetensorError, and the
    ValueError wcache raised before."""
    return isinstance(e, wcache.SafetensorError) and isinstance(e, ValueError) and \
        "closed" in str(e)


@pytest.mark.parametrize("framework", ["pt", "np"])
def test_first_get_tensor_while_another_thread_closes(st_file, no_daemon, framework):
    """A handle closed by one thread while another's first get_tensor makes
    its runs (_bulk) is closed once close() has returned: get_tensor raises
    ClosedError (SafetensorError and ValueError) "closed". Another thread's
    whole close() runs before each line of _bulk in turn (a line trace).
    Before, runs made after close() had taken the handle's were kept: the
    closed torch handle went on handing out tensors, and kept the mapping
    alive (fails at line 9); and a close() just before the runs were made
    gave Model's plain ValueError, which `except SafetensorError` misses."""
    path, _, _, _ = st_file
    k = 0
    while True:
        f = wcache.safe_open(path, framework=framework)
        errors, other_errors, ran = other_thread_before(
            wcache.safe_open._bulk.__code__, k, lambda: f.get_tensor("w"), f.close)
        assert not other_errors, f"close() before line {k} of _bulk: {other_errors!r}"
        assert all(_closed_error(e) for e in errors), \
            f"get_tensor with close() before line {k} of _bulk: {errors!r}"
        if not ran:
            break  # k is past _bulk's last line: every interleaving was tried
        try:
            f.get_tensor("ids")
        except ValueError as e:
            assert "closed" in str(e)
        else:
            pytest.fail(f"close() ran before line {k} of _bulk, and the closed handle still "
                        f"hands out tensors")
        k += 1
    assert k > 5


def test_numpy_get_tensor_while_another_thread_closes(st_file, no_daemon):
    """get_tensor of a numpy handle that another thread closes while it
    makes the view of the model's memory raises ValueError "closed" or
    returns the tensor: another thread's close() runs before each line of
    Model._raw_region in turn. Before, _raw_region read the model's region
    again after close() had cleared it, and get_tensor raised TypeError
    ('NoneType' object is not subscriptable)."""
    from wcache.model import Model
    path, _, w, _ = st_file
    k = 0
    while True:
        f = wcache.safe_open(path, framework="np")
        got = []
        errors, other_errors, ran = other_thread_before(
            Model._raw_region.__code__, k, lambda: got.append(f.get_tensor("w")), f.close)
        assert not other_errors, f"close() before line {k} of _raw_region: {other_errors!r}"
        assert all(_closed_error(e) for e in errors), \
            f"get_tensor with close() before line {k} of _raw_region: {errors!r}"
        assert all(np.array_equal(t, w) for t in got)
        if not ran:
            break
        k += 1
    assert k > 2


def test_pathlike(st_file, no_daemon):
    import pathlib
    path, _, _, ids = st_file
    with wcache.safe_open(pathlib.Path(path), framework="np") as f:
        assert np.array_equal(f.get_tensor("ids"), ids)


def test_get_tensor_from_many_threads(tmp_path, no_daemon):
    """Threads asking one handle for the same names at once (upstream's
    handles are used so) each get a tensor of their own with the right
    values, every time. The names are one run, so the first call for any
    of them makes all of them: a thread switch every microsecond lets the
    others ask while it does (before, one of them got a bare KeyError)."""
    import sys
    import threading
    count, threads = 16, 16
    path = tmp_path / "runs.safetensors"
    write_safetensors(path, [(f"layer.{i:03d}.w", "F32", (4, 4),
                              np.full((4, 4), i, dtype="<f4").tobytes()) for i in range(count)])
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for trial in range(300):
            f = wcache.safe_open(path, framework="np")
            names = f.keys()
            barrier = threading.Barrier(threads)
            got, errors = [], []

            def worker():
                barrier.wait()
                try:
                    got.extend((n, f.get_tensor(n)) for n in names)
                except BaseException as e:
                    errors.append(e)
            ts = [threading.Thread(target=worker) for _ in range(threads)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            f.close()
            assert not errors, f"trial {trial}: {errors[:3]!r}"
            assert len(got) == count * threads
            assert len({id(t) for _, t in got}) == len(got)  # no tensor handed out twice
            for n, t in got:
                assert (np.asarray(t) == int(n[6:9])).all(), n
    finally:
        sys.setswitchinterval(interval)


@pytest.mark.parametrize("framework", ["np", "pt"])
def test_get_tensor_while_another_takes_the_run(tmp_path, no_daemon, framework):
    """The interleaving the thread test above hits now and then, made
    every time: the moment the first call for a name has made its run,
    another request takes every tensor of the run that is ready. The first
    call still returns its own tensor (before, a KeyError)."""
    path = tmp_path / "runs.safetensors"
    write_safetensors(path, [(f"layer.{i}.w", "F32", (2,), np.full(2, i, dtype="<f4").tobytes())
                             for i in range(4)])
    with wcache.safe_open(path, framework=framework) as f:
        names, taken = f.keys(), []

        class Racing(dict):
            def update(self, *args):
                super().update(*args)
                for n in names:  # "another thread", between the update and the return
                    t = self.pop(n, None)
                    if t is not None:
                        taken.append((n, t))
        f._bulk().ready = Racing()
        first = f.get_tensor(names[0])
        assert first.tolist() == [0, 0]
        assert sorted(n for n, _ in taken) == names[1:]
        for n, t in taken:
            assert t.tolist() == [int(n[6])] * 2
        again = [f.get_tensor(n) for n in names]  # each made anew
        assert [t.tolist() for t in again] == [[i, i] for i in range(4)]


def _runs_file(tmp_path):
    """A file of two parts: four F32 tensors in one run, and an I32 one."""
    path = tmp_path / "runs.safetensors"
    write_safetensors(path, [(f"layer.{i}.w", "F32", (2,), np.full(2, i, dtype="<f4").tobytes())
                             for i in range(4)] +
                      [("ids", "I32", (3,), np.array([5, 6, 7], dtype="<i4").tobytes())])
    return str(path)


@pytest.mark.parametrize("framework,cow", [("np", None), ("pt", "auto"), ("pt", "remap")])
def test_a_closed_handle_keeps_no_mapping(tmp_path, no_daemon, monkeypatch, framework, cow):
    """Once a handle is closed, a loader that still holds its get_tensor
    (the closure the first call binds) keeps nothing mapped but what the
    tensors it was handed hold: those still read right, and once they go,
    the model's handle is collected and no mapping of the file is left.
    Later calls of the closure raise upstream's SafetensorError "File is
    closed". Before, the closure held the handle's Runs, whose typed base
    views (and, for torch, the model's handle and torch state, with its
    writable arrays or private mapping of the file) kept the whole model
    mapped for as long as the closure lived."""
    if cow:
        monkeypatch.setenv("WCACHE_TORCH_COW", cow)
    path = _runs_file(tmp_path)
    f = wcache.safe_open(path, framework=framework)
    first = f.get_tensor("layer.0.w")  # makes the run: layer.1-3 wait in ready
    get = f.get_tensor  # the closure a loader holds from now on
    handle = weakref.ref(f.model._handle)
    kept = [first, get("layer.2.w"), get("ids")]
    f.close()
    with pytest.raises(wcache.SafetensorError, match="^File is closed$") as e:
        get("layer.3.w")
    assert isinstance(e.value, ValueError)
    with pytest.raises(wcache.SafetensorError, match="^File is closed$"):
        get("ids")  # a part whose base was made
    assert [np.asarray(t).tolist() for t in kept] == [[0, 0], [2, 2], [5, 6, 7]]
    assert file_mappings(path) > 0  # the tensors handed out keep their memory
    del kept, first, e
    gc.collect()
    assert handle() is None, "the closed handle's get_tensor keeps the model's handle"
    assert file_mappings(path) == 0, "the closed handle's get_tensor keeps the file mapped"
    with pytest.raises(wcache.SafetensorError, match="^File is closed$"):
        get("layer.1.w")


def _many_file(tmp_path, count):
    """count F32 tensors of two shapes, alternating (two runs), and an I32
    one: a model whose table (names, shapes, runs) takes megabytes."""
    path = tmp_path / "many.safetensors"
    tensors = [(f"layer.{i:06d}.w", "F32", (1 + i % 2,), np.full(1 + i % 2, i, "<f4").tobytes())
               for i in range(count)]
    write_safetensors(path, tensors + [("ids", "I32", (3,), np.arange(3, dtype="<i4").tobytes())])
    return str(path)


@pytest.mark.parametrize("framework", ["np", "pt"])
def test_a_closed_handle_keeps_no_table(tmp_path, no_daemon, framework):
    """Once a handle of a model of 20,000 tensors is closed, a loader that
    still holds its get_tensor (the closure the first call binds) keeps
    nothing of the model's table: the Table is collected, and what the
    handle, its model and the closure still hold (tracemalloc) is a few
    KiB, not the megabytes the open handle held (names, shapes, runs, and
    the tensors of the run the first call made);
    the closure raises upstream's SafetensorError "File is closed", as
    upstream's closed handle does (it drops its whole state). Before, the
    closure held the handle's Runs, and through it the table."""
    import tracemalloc
    path = _many_file(tmp_path, 20_000)
    for attempt in range(2):  # the first one imports and caches what a handle uses once
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            f = wcache.safe_open(path, framework=framework)
            t = f.get_tensor("layer.000001.w")
            get = f.get_tensor
            assert np.asarray(get("ids")).tolist() == [0, 1, 2]
            table = weakref.ref(f.model._tab())
            opened = tracemalloc.get_traced_memory()[0] - before
            f.close()
            assert np.asarray(t).tolist() == [1, 1]  # the tensor handed out still reads
            del t
            gc.collect()
            kept = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    assert table() is None, "the closed handle's get_tensor keeps the model's table"
    assert opened > 2 << 20, f"the open handle holds {opened} bytes: the test's model is too small"
    assert kept < 64 << 10, f"the closed handle and its get_tensor keep {kept} bytes"
    with pytest.raises(wcache.SafetensorError, match="^File is closed$"):
        get("layer.000003.w")
    with pytest.raises(wcache.SafetensorError, match="^File is closed$"):
        get("nonexistent")
    assert f.get_tensor is not get
    with pytest.raises(wcache.SafetensorError, match="^File is closed$"):
        f.get_tensor("ids")


@pytest.mark.parametrize("framework", ["np", "pt"])
@pytest.mark.parametrize("traced,least", [("_typed", 8), ("get", 4), ("_make", 4), ("every", 4)])
def test_a_get_tensor_racing_close_keeps_no_mapping(tmp_path, no_daemon, framework, traced,
                                                    least):
    """A get_tensor (or get_tensors) that makes a run, or a part's base
    view, while another thread closes the handle returns its tensors or
    raises ValueError "closed", and once both have returned (and the
    tensors are dropped) the closed handle's get_tensor, still held, keeps
    no mapping and no table: a base made after close() is not kept, and
    every call works on the plan (table and runs) it read once. Another
    thread's close() runs before each line of Runs._typed, Runs.get,
    Runs._make and Runs.every in turn."""
    from wcache._table import Runs
    path = _runs_file(tmp_path)
    code = getattr(Runs, traced).__code__
    k = 0
    while True:
        f = wcache.safe_open(path, framework=framework)
        f.get_tensor("ids")  # binds the closure; the F32 part has no base yet
        get, got = f.get_tensor, []
        table = weakref.ref(f.model._tab())
        if traced == "every":
            first = lambda: got.extend(f._runs.every().items())  # noqa: E731
        else:
            first = lambda: got.append(("layer.1.w", get("layer.1.w")))  # noqa: E731
        errors, other_errors, ran = other_thread_before(code, k, first, f.close)
        assert not other_errors, (k, other_errors)
        assert all(_closed_error(e) for e in errors), \
            f"get_tensor with close() before line {k} of Runs.{traced}: {errors!r}"
        wrong = [n for n, t in got
                 if np.asarray(t).tolist() != ([5, 6, 7] if n == "ids" else [int(n[6])] * 2)]
        assert not wrong, f"close() before line {k} of Runs.{traced}: wrong values of {wrong}"
        f.close()  # once k is past the last line, close() ran after it
        del got, errors, first
        if table() is not None or file_mappings(path):
            gc.collect()  # only then: it takes 60 ms or more with torch loaded
        assert file_mappings(path) == 0, \
            f"close() before line {k} of Runs.{traced}: the closed handle keeps the mapping"
        assert table() is None, \
            f"close() before line {k} of Runs.{traced}: the closed handle keeps the table"
        with pytest.raises(ValueError, match="closed"):
            get("layer.2.w")
        if not ran:
            break
        k += 1
    assert k > least


def _held_at_fork(f, which):
    """The lock of handle f (or of what it uses) that case which holds at
    the fork, and what the child then does with f; each is a lock some
    thread of a loader holds while it builds what the handle needs."""
    import wcache._lib as lib
    import wcache._torch as wt
    if which == "runs":  # safe_open._runs_lock: the first get_tensor makes the runs
        return f._runs_lock, lambda: f.get_tensor("w")
    if which == "host":  # safe_open._host_lock: the first get_tensor registers the mapping
        return f._host_lock, lambda: f.get_tensor("w")
    if which == "model":  # Model._lock: the first get_tensor reads the table
        return f.model._lock, lambda: f.get_tensor("w")
    if which == "torch state":  # _State.lock: the first get_tensor makes the memory writable
        return wt._state_of(f.model).lock, lambda: f.get_tensor("w")
    if which == "run":  # Runs.lock: a get_tensor that makes a run of its own
        f.get_tensor("w")
        return f._runs.lock, lambda: f.get_tensor("ids")
    if which == "library":  # _lib._lock: the first call that loads libwcache
        def load():
            lib._lib = None
            lib.lib()
        return lib._lock, load
    raise AssertionError(which)


@pytest.mark.parametrize("which", ["runs", "host", "model", "torch state", "run", "library"])
def test_fork_while_another_thread_holds_a_lock_of_the_handle(st_file, no_daemon, which):
    """A thread of the parent inside a handle's first get_tensor (building
    its table, runs or torch state: 0.35 s for 200,000 tensors) when
    another forks: the child's get_tensor must not wait for a lock no
    thread of it will ever let go (os.register_at_fork makes every such
    lock anew in the child, _lib.fork_safe). Before, only safe_open's
    module lock was made anew, and the child hung on the others."""
    path, _, w, ids = st_file
    f = wcache.safe_open(path, framework="pt")
    lock, use = _held_at_fork(f, which)
    with lock:  # what that thread holds at the fork
        pid = os.fork()
        if pid == 0:
            code = 2
            try:
                use()
                code = 0 if torch.equal(f.get_tensor("ids"), torch.from_numpy(ids)) else 3
            finally:
                os._exit(code)
    status = wait_child(pid, 20)
    assert status is not None, f"the child hung on the {which} lock a parent thread held at fork"
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert torch.equal(f.get_tensor("w"), torch.from_numpy(w))  # the parent's lock is its own
    f.close()


def _module_lock(which, path):
    """(the module, the name of its lock) of case which, and the call of
    the package's code that takes that lock, which the child then makes;
    each lock is one a thread of the parent may hold at any time."""
    import logging
    import warnings
    from wcache import _derived, _device, _install, _safe_open
    import wcache._torch as wt
    if which == "install":  # install(), uninstall() and the import hook's patching
        return _install, "_lock", _install.uninstall
    if which == "derived":  # derived()'s warning that it computes locally

        def warn():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _derived._warn_once("target", "key", "fork test")
        return _derived, "_warned_lock", warn
    if which == "device copy":  # a load's registered copy (here on CpuBackend)
        return _device, "_register_lock", \
            lambda: wcache.safe_open(path, framework="pt", device="cuda:0").get_tensor("w")
    if which == "device log":  # a device load's messages, each logged once
        return _device, "_logged_lock", lambda: _device._say_once(logging.DEBUG, "fork test")
    if which == "torch buffers":  # whether a storage is one wcache made
        return wt, "_device_storages_lock", lambda: wt.is_part_view(1, 1)
    if which == "connect":  # safe_open's connection to wcached, while it connects
        return _safe_open, "_lock", lambda: wcache.safe_open(path, framework="pt").get_tensor("w")
    raise AssertionError(which)


@pytest.mark.parametrize("which", ["install", "derived", "device copy", "device log",
                                   "torch buffers", "connect"])
def test_fork_while_another_thread_holds_a_module_lock(st_file, no_daemon, cpu_device, which):
    """Another thread of the parent holds one of the package's module
    locks (_lib.fork_safe_module) when this one forks: the child's first
    call that takes it must not wait for a lock no thread of the child
    will ever let go. Before, only _safe_open's and _torch's were made
    anew, each by its own hook, and the child hung on the others."""
    import threading
    import traceback
    path = st_file[0]
    module, name, use = _module_lock(which, path)
    taken, done = threading.Event(), threading.Event()

    def hold():
        with getattr(module, name):
            taken.set()
            done.wait(60)
    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert taken.wait(10), "the holding thread never took the lock"
        pid = os.fork()
        if pid == 0:
            code = 2
            try:
                use()
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        status = wait_child(pid, 10)
    finally:
        done.set()
        holder.join()
    assert status is not None, f"the child hung on {module.__name__}.{name}, held at fork"
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
