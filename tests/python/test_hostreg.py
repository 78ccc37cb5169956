"""Host registration of CPU handles (wcache/_hostreg.py, WCACHE_HOST_REGISTER=1)
on a fake cudart: transformers 5's way of loading, emulated here and checked
on its own first (through install() and directly, with wcached), then with
registration on (one read-only range per mapping, held from the first tensor
to close); the setting's values, refusals, memory registered by someone else,
holders of one range, release exactly once, threads, fork, unregistration
errors, and how ranges are merged and cut at mappings."""
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import wcache
from wcache import _device, _hostreg

from pyhelpers import write_safetensors

torch = pytest.importorskip("torch")


# ---- transformers 5's way of loading, and host registration for it ----
#
# transformers 5 (core_model_loading.py, modeling_utils.py) never passes a
# device to safe_open: per shard it opens safe_open(file, framework="pt",
# device="cpu") (some versions add backend="mmap"), keeps every handle open
# until the load ends, takes get_slice(k) for every key, and on a pool of
# min(4, cpu_count) threads materialises each tensor: t = slice[...], then
# t.to(device=..., dtype=...) when either is given, Parameter(t,
# requires_grad=t.is_floating_point()), setattr on its module (some versions
# also index the parameter again or make it contiguous). The emulation below
# does exactly that; expected values come from numpy, not from wcache.

def _bf16_values(n, seed):
    """n float32 values that bfloat16 holds exactly (k/8, |k| < 256)."""
    return (np.random.default_rng(seed).integers(-255, 256, n).astype(np.float32) / 8)


def _bf16_bytes(values):
    return (values.view(np.uint32) >> 16).astype("<u2").tobytes()


@pytest.fixture
def shards(tmp_path):
    """A model in 3 safetensors shards (with the index upstream writes):
    BF16 matrices, F32 norms, an I64 and a 3-byte I8 tensor that leaves
    the next one misaligned. Returns (shard paths, {name: expected tensor})."""
    expected, files, weight_map = {}, [], {}
    seed = 100
    for s in range(3):
        tensors = []
        for layer in range(2 * s, 2 * s + 2):
            for name, shape in ((f"model.layers.{layer}.q.weight", (48, 32)),
                                (f"model.layers.{layer}.mlp.weight", (96, 32))):
                seed += 1
                v = _bf16_values(int(np.prod(shape)), seed).reshape(shape)
                tensors.append((name, "BF16", shape, _bf16_bytes(v)))
                expected[name] = torch.from_numpy(v.copy()).to(torch.bfloat16)
            if layer == 1:
                i8 = np.array([1, -2, 3], dtype=np.int8)
                tensors.append((f"model.layers.{layer}.odd", "I8", (3,), i8.tobytes()))
                expected[f"model.layers.{layer}.odd"] = torch.from_numpy(i8.copy())
            seed += 1
            norm = np.random.default_rng(seed).standard_normal(32).astype(np.float32)
            tensors.append((f"model.layers.{layer}.norm.weight", "F32", (32,), norm.tobytes()))
            expected[f"model.layers.{layer}.norm.weight"] = torch.from_numpy(norm.copy())
        if s == 2:
            pos = np.arange(64, dtype=np.int64)
            tensors.append(("model.position_ids", "I64", (1, 64), pos.tobytes()))
            expected["model.position_ids"] = torch.from_numpy(pos.reshape(1, 64).copy())
        path = tmp_path / f"model-{s + 1:05d}-of-00003.safetensors"
        write_safetensors(path, tensors, metadata={"format": "pt"})
        files.append(str(path))
        weight_map.update({t[0]: path.name for t in tensors})
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    return files, expected


def load_like_transformers5(open_fn, files, dtype=None, device=None, backend=None, threads=4):
    """The emulation (see above); threads: min(4, cpu_count) on any host of
    4 cores or more. Returns (root module, the handles)."""
    kwargs = {} if backend is None else {"backend": backend}
    pointers, slices = [], {}
    for file in files:
        fp = open_fn(file, framework="pt", device="cpu", **kwargs)
        pointers.append(fp)
        slices.update({k: fp.get_slice(k) for k in fp.keys()})

    def materialize(name):
        t = slices[name][...]
        cast = dtype if t.is_floating_point() else None
        if device is not None or cast is not None:
            t = t.to(device=device, dtype=cast)
        p = torch.nn.Parameter(t, requires_grad=t.is_floating_point())
        p[...]  # some versions index the parameter again
        return name, p

    root = torch.nn.Module()
    try:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            for name, param in pool.map(materialize, list(slices)):
                *path, leaf = name.split(".")
                module = root
                for part in path:
                    if not hasattr(module, part):
                        module.add_module(part, torch.nn.Module())
                    module = getattr(module, part)
                setattr(module, leaf, param)
    finally:
        for fp in pointers:
            fp.__exit__(None, None, None)
    return root, pointers


def _check_loaded(root, expected, dtype=None):
    state = root.state_dict()
    assert set(state) == set(expected)
    for name, want in expected.items():
        got = state[name].contiguous()  # and made contiguous, as some versions do
        if dtype is not None and want.is_floating_point():
            want = want.to(dtype)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert torch.equal(got, want), name


@pytest.fixture
def standin_safetensors(monkeypatch):
    """The stand-in safetensors package (tests/python/standin: upstream's
    names, each refusing to run) patched by wcache.install(); afterwards
    uninstalled and forgotten."""
    import importlib
    import sys
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(__file__), "standin"))
    saved = {k: sys.modules.pop(k) for k in list(sys.modules)
             if k == "safetensors" or k.startswith("safetensors.")}
    st = importlib.import_module("safetensors")
    importlib.import_module("safetensors.torch")
    wcache.install()
    try:
        yield st
    finally:
        wcache.uninstall()
        for k in [k for k in sys.modules if k == "safetensors" or k.startswith("safetensors.")]:
            del sys.modules[k]
        sys.modules.update(saved)


@pytest.mark.parametrize("via", ["install", "direct"])
@pytest.mark.parametrize("backend,dtype", [(None, None), ("mmap", torch.float32),
                                           ("pread", torch.bfloat16)])
def test_transformers5_pattern(shards, no_daemon, standin_safetensors, via, backend, dtype):
    files, expected = shards
    open_fn = standin_safetensors.safe_open if via == "install" else wcache.safe_open
    # install() patched the stand-in (whose safe_open would raise) with its
    # wcache.safe_open subclass (other frameworks go to upstream's)
    assert issubclass(open_fn, wcache.safe_open)
    root, pointers = load_like_transformers5(open_fn, files, dtype=dtype, device="cpu",
                                             backend=backend)
    _check_loaded(root, expected, dtype)
    with pytest.raises(ValueError, match="File is closed"):
        pointers[0].get_slice("model.layers.0.q.weight")[...]


def test_transformers5_pattern_through_wcached(shards, tmp_path, monkeypatch,
                                               standin_safetensors):
    """The shards served by a real wcached (each by its path, as transformers
    opens them): attached, not mapped in-process, and the same values."""
    import wcache._safe_open as so
    from pyhelpers import Daemon
    files, expected = shards
    os.makedirs(tmp_path / "d")
    d = Daemon(tmp_path / "d", {f"s{i}": f for i, f in enumerate(files)}).start()
    monkeypatch.setenv("WCACHE_SOCKET", d.socket)
    so._shared = None
    sources = []
    real = so.open_model
    monkeypatch.setattr(so, "open_model", lambda p: sources.append(real(p)) or sources[-1])
    try:
        root, _ = load_like_transformers5(standin_safetensors.safe_open, files)
        _check_loaded(root, expected)
        assert [m.source for m in sources] == ["wcached"] * 3
    finally:
        so._shared = None
        assert d.stop() == 0


class _CudaError:
    """What torch 2.x's cudart binding returns: a pybind enum (int() gives the code)."""

    def __init__(self, code):
        self.value = code

    def __int__(self):
        return self.value


class FakeCudart:
    """torch.cuda.cudart() as wcache uses it, keeping the process's
    registered ranges as the CUDA runtime does: a range overlapping one
    already registered gets cudaErrorHostMemoryAlreadyRegistered (712),
    unregistering what is not registered cudaErrorHostMemoryNotRegistered
    (713). refuse: a code every registration gets instead;
    fail_unregister: a code every unregistration gets."""

    MESSAGES = {0: "no error", 712: "part or all of the requested memory range is already "
                "mapped", 713: "pointer does not correspond to a registered memory region",
                801: "operation not supported"}

    def __init__(self):
        import threading
        self.lock = threading.Lock()
        self.registered = {}  # address -> size
        self.calls = []
        self.refuse = None
        self.fail_unregister = None

    def cudaHostRegister(self, ptr, size, flags):
        with self.lock:
            self.calls.append(("register", ptr, size, flags))
            if self.refuse:
                return _CudaError(self.refuse)
            if any(a < ptr + size and ptr < a + n for a, n in self.registered.items()):
                return _CudaError(712)
            self.registered[ptr] = size
            return _CudaError(0)

    def cudaHostUnregister(self, ptr):
        with self.lock:
            self.calls.append(("unregister", ptr))
            if self.fail_unregister:
                return _CudaError(self.fail_unregister)
            if self.registered.pop(ptr, None) is None:
                return _CudaError(713)
            return _CudaError(0)

    def cudaGetErrorString(self, err):
        return self.MESSAGES[int(err)]

    def count(self, kind):
        return sum(1 for c in self.calls if c[0] == kind)


@pytest.fixture
def fake_cuda(monkeypatch):
    """An initialised CUDA in torch.cuda as far as wcache can tell, with a
    FakeCudart; WCACHE_HOST_REGISTER=1. At the end no range may be held."""
    import contextlib
    import gc
    fake = FakeCudart()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize",
                        lambda device=None: fake.calls.append(("synchronize", str(device))))
    monkeypatch.setenv("WCACHE_HOST_REGISTER", "1")
    _device._logged.clear()
    yield fake
    gc.collect()
    assert _hostreg.host_registrations() == [], "a handle's registration was never released"


def _mappings():
    """[(start, end, path)] of this process's file mappings."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6:
                a, b = (int(x, 16) for x in parts[0].split("-"))
                out.append((a, b, parts[5].strip()))
    return out


def _registered_covers(registers, extents):
    """Every registration is read-only, page-aligned, and lies in one
    mapping of a .safetensors file; every tensor's bytes (extents: [(name,
    address, nbytes)]) lie in one of them."""
    maps = _mappings()
    spans = []
    for _, ptr, size, flags in registers:
        assert flags == _device.CUDA_HOST_REGISTER_READ_ONLY | _device.CUDA_HOST_REGISTER_PORTABLE
        assert ptr % _device.PAGE == 0 and size % _device.PAGE == 0 and size > 0
        inside = [m for m in maps if m[0] <= ptr and ptr + size <= m[1]]
        assert len(inside) == 1 and inside[0][2].endswith(".safetensors"), (hex(ptr), size)
        spans.append((ptr, ptr + size))
    for name, data, nbytes in extents:
        if nbytes:
            assert any(a <= data and data + nbytes <= b for a, b in spans), name


def test_host_register_in_the_transformers5_pattern(shards, no_daemon, fake_cuda, caplog,
                                                    monkeypatch):
    """WCACHE_HOST_REGISTER=1: each shard's handle registers its mapping
    once (at its first tensor, before any of its copies), read-only, and
    unregisters it once when transformers closes it; tensors stay right."""
    files, expected = shards
    extents, registered_before = {}, []
    real = wcache.safe_open._register_host

    def spy(self, runs):  # every thread's first get_tensor of a handle comes here
        real(self, runs)
        model = self.model
        registered_before.append(len(fake_cuda.registered))
        extents.update({k: (k, model.info(k).data, model.info(k).nbytes) for k in model.keys()})
    monkeypatch.setattr(wcache.safe_open, "_register_host", spy)
    with caplog.at_level(logging.INFO, logger="wcache"):
        root, pointers = load_like_transformers5(wcache.safe_open, files, device="cpu")
    _check_loaded(root, expected)
    registers = [c for c in fake_cuda.calls if c[0] == "register"]
    assert len(registers) == 3  # one range per shard file, each once
    assert len(extents) == len(expected) and min(registered_before) >= 1
    _registered_covers(registers, extents.values())  # root's tensors keep the files mapped
    unregisters = [c[1] for c in fake_cuda.calls if c[0] == "unregister"]
    assert sorted(unregisters) == sorted(c[1] for c in registers)
    assert fake_cuda.registered == {}
    # the device was waited for before each unregistration
    for k, c in enumerate(fake_cuda.calls):
        if c[0] == "unregister":
            assert fake_cuda.calls[k - 1][0] == "synchronize"
    assert caplog.text.count("registered with cuda read-only") == 1


def _one_file(tmp_path, name="one.safetensors", mib=1):
    n = mib << 18  # F32 elements
    values = np.arange(n, dtype=np.float32)
    path = tmp_path / name
    write_safetensors(path, [("w", "F32", (n,), values.tobytes()),
                             ("b", "F32", (3,), np.ones(3, np.float32).tobytes())])
    return str(path), torch.from_numpy(values)


@pytest.mark.parametrize("value", [None, "0", "off"])
def test_host_register_is_off_by_default(tmp_path, no_daemon, fake_cuda, monkeypatch, value):
    path, want = _one_file(tmp_path)
    if value is None:
        monkeypatch.delenv("WCACHE_HOST_REGISTER")
    else:
        monkeypatch.setenv("WCACHE_HOST_REGISTER", value)
    with wcache.safe_open(path, framework="pt") as f:
        assert torch.equal(f.get_tensor("w"), want)
    assert fake_cuda.calls == []


def test_host_register_bad_value_warns_once_and_stays_off(tmp_path, no_daemon, fake_cuda,
                                                          monkeypatch, caplog):
    path, want = _one_file(tmp_path)
    monkeypatch.setenv("WCACHE_HOST_REGISTER", "always")
    with caplog.at_level(logging.WARNING, logger="wcache"):
        for _ in range(2):
            with wcache.safe_open(path, framework="pt") as f:
                assert torch.equal(f.get_tensor("w"), want)
    assert fake_cuda.calls == []
    assert [r.getMessage() for r in caplog.records] == [
        "wcache: WCACHE_HOST_REGISTER='always' is not 0 or 1: host registration stays off"]


def test_host_register_needs_cuda_initialised(tmp_path, no_daemon, fake_cuda, monkeypatch,
                                              caplog):
    path, want = _one_file(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    with caplog.at_level(logging.WARNING, logger="wcache"):
        for _ in range(2):
            with wcache.safe_open(path, framework="pt") as f:
                assert torch.equal(f.get_tensor("w"), want)
    assert fake_cuda.calls == []
    assert len(caplog.records) == 1
    assert "nothing registered: CUDA is not initialised" in caplog.records[0].getMessage()


def test_host_register_only_for_tensors_read_on_the_cpu(tmp_path, no_daemon, fake_cuda,
                                                         cpu_device, monkeypatch, caplog):
    """keys()/metadata() alone, numpy handles, device handles (the engine),
    get_tensors() (what load_file returns before closing) and torch
    tensors that are not views of the mapping register nothing."""
    path, want = _one_file(tmp_path)
    with wcache.safe_open(path, framework="pt") as f:
        f.keys(), f.metadata(), f.get_slice("w").get_shape()
    with wcache.safe_open(path, framework="np") as f:
        f.get_tensor("w")
    with wcache.safe_open(path, framework="pt") as f:
        assert torch.equal(f.get_tensors()["w"], want)
    assert fake_cuda.calls == []
    with wcache.safe_open(path, framework="pt", device="cuda:0") as f:
        assert torch.equal(f.get_tensors()["w"], want)  # cpu_device: the engine, on the CPU
    assert fake_cuda.calls == []
    monkeypatch.setenv("WCACHE_TORCH_COW", "copy")
    with caplog.at_level(logging.WARNING, logger="wcache"):
        with wcache.safe_open(path, framework="pt") as f:
            assert torch.equal(f.get_tensor("w"), want)
    assert fake_cuda.calls == []
    assert "nothing registered: torch tensors are not views of the mapping" in caplog.text


def test_host_register_refused_warns_once_and_works(tmp_path, no_daemon, fake_cuda, caplog):
    path, want = _one_file(tmp_path)
    fake_cuda.refuse = 801
    with caplog.at_level(logging.WARNING, logger="wcache"):
        for _ in range(3):
            with wcache.safe_open(path, framework="pt") as f:
                assert torch.equal(f.get_slice("w")[...], want)
    assert fake_cuda.count("register") == 3 and fake_cuda.count("unregister") == 0
    assert [r.getMessage() for r in caplog.records] == [
        "wcache: WCACHE_HOST_REGISTER=1: registration refused, tensors are copied from "
        "pageable memory: cudaHostRegister(read-only): operation not supported (801)"]


def test_host_register_a_raising_binding_never_fails_the_handle(tmp_path, no_daemon,
                                                                fake_cuda, caplog):
    path, want = _one_file(tmp_path)

    def broken(ptr, size, flags):
        raise RuntimeError("no such binding")
    fake_cuda.cudaHostRegister = broken
    with caplog.at_level(logging.WARNING, logger="wcache"):
        with wcache.safe_open(path, framework="pt") as f:
            assert torch.equal(f.get_tensor("w"), want)
    assert "registration refused, tensors are copied from pageable memory: " \
        "cudaHostRegister: RuntimeError: no such binding" in caplog.text


def test_host_register_memory_registered_by_someone_else(tmp_path, no_daemon, fake_cuda,
                                                         caplog):
    """cudaErrorHostMemoryAlreadyRegistered (712) on the model's mapping,
    which libwcache made in this process after any registration there:
    the loader's own registration, or one left behind at a reused address
    (pinning the old mapping's pages), which wcache cannot tell apart. It
    is refused, as the engine refuses it on its views, with one WARNING;
    the handle works unregistered, and wcache never unregisters it. Before,
    it was taken as usable and held."""
    path, want = _one_file(tmp_path)
    f = wcache.safe_open(path, framework="pt")
    lo, hi = _hostreg.host_ranges(f.model._tab())[0]
    fake_cuda.registered[lo] = hi - lo  # registered before
    with caplog.at_level(logging.WARNING, logger="wcache"):
        assert torch.equal(f.get_tensor("w"), want)
    assert _hostreg.host_registrations() == []
    assert "registration refused, tensors are copied from pageable memory: the mapping is " \
        "already registered with CUDA (cudaErrorHostMemoryAlreadyRegistered): by the loader " \
        "itself, or a registration left behind at a reused address" in caplog.text
    f.close()
    assert fake_cuda.count("unregister") == 0 and fake_cuda.registered == {lo: hi - lo}
    fake_cuda.registered.clear()


def test_host_register_counts_holders_of_one_range(tmp_path, no_daemon, fake_cuda):
    """Two handles holding the same range (one model): registered by the
    first, unregistered by the last, whichever order they close in."""
    path, _ = _one_file(tmp_path)
    model = wcache.open_file(path)
    for order in ((0, 1), (1, 0)):
        fake_cuda.calls.clear()

        class Owner:
            pass
        owners = [Owner(), Owner()]
        releases = [_hostreg.host_register(o, model) for o in owners]
        assert all(releases)
        assert fake_cuda.count("register") == 1
        (lo, hi, holders, ours), = _hostreg.host_registrations()
        assert holders == 2 and ours
        releases[order[0]]()
        assert fake_cuda.count("unregister") == 0
        assert _hostreg.host_registrations() == [(lo, hi, 1, True)]
        releases[order[1]]()
        assert fake_cuda.count("unregister") == 1 and fake_cuda.registered == {}
        releases[order[1]]()  # again: nothing
        assert fake_cuda.count("unregister") == 1


def test_host_register_released_exactly_once(tmp_path, no_daemon, fake_cuda):
    """close() twice, __exit__ after close(), collection after close(), and
    collection of a handle never closed: one unregistration each."""
    import gc
    path, want = _one_file(tmp_path)
    with wcache.safe_open(path, framework="pt") as f:
        t = f.get_tensor("w")
        f.close()
        f.close()
    del f
    gc.collect()
    assert fake_cuda.count("register") == 1 and fake_cuda.count("unregister") == 1
    f = wcache.safe_open(path, framework="pt")
    t = f.get_slice("w")[...]
    assert fake_cuda.count("register") == 2 and len(fake_cuda.registered) == 1
    del f  # never closed: collected
    gc.collect()
    assert fake_cuda.count("unregister") == 2 and fake_cuda.registered == {}
    assert torch.equal(t, want)  # the mapping outlives the registration


def test_host_register_keeps_the_mapping_until_released(tmp_path, no_daemon, fake_cuda):
    """The registration holds the model's handle: the mapping cannot be
    unmapped while registered, even when the caller dropped everything
    else; once released, it goes."""
    import gc
    import weakref
    from pyhelpers import file_mappings
    path, _ = _one_file(tmp_path)
    f = wcache.safe_open(path, framework="pt")
    f.get_tensor("w")
    handle = weakref.ref(f.model._h())
    release = f._host_release
    f._host_release = None  # as if the handle were gone but its finalizer not yet run
    f.close()
    gc.collect()
    assert handle() is not None and file_mappings(path) == 1
    release()
    gc.collect()
    assert handle() is None and file_mappings(path) == 0
    assert fake_cuda.count("unregister") == 1


def test_host_register_threads(tmp_path, no_daemon, fake_cuda):
    """8 threads at the first get_slice of one handle: one registration,
    and every copy waits for it; then handles opened, read and closed on 8
    threads at once, some closed from another thread than the reader:
    registrations and unregistrations pair up."""
    import threading
    path, want = _one_file(tmp_path)
    f = wcache.safe_open(path, framework="pt")
    seen = []
    barrier = threading.Barrier(8)

    def first():
        barrier.wait()
        t = f.get_slice("w")[...]
        seen.append((len(fake_cuda.registered), torch.equal(t, want)))
    threads = [threading.Thread(target=first) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [(1, True)] * 8 and fake_cuda.count("register") == 1
    closer = threading.Thread(target=f.close)
    closer.start()
    closer.join()
    assert fake_cuda.count("unregister") == 1 and fake_cuda.registered == {}

    errors = []

    def churn(k):
        try:
            for _ in range(15):
                g = wcache.safe_open(path, framework="pt")
                assert torch.equal(g.get_tensor("b"), torch.ones(3))
                if k % 2:
                    c = threading.Thread(target=g.close)
                    c.start()
                    c.join()
                else:
                    del g  # collected
        except BaseException as e:  # reported below
            errors.append(e)
    threads = [threading.Thread(target=churn, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    import gc
    gc.collect()
    assert fake_cuda.count("register") == fake_cuda.count("unregister") == 1 + 8 * 15
    assert fake_cuda.registered == {}


def test_host_register_release_during_a_registration(tmp_path, no_daemon, fake_cuda):
    """A handle collected while its own thread is inside the registry (a
    garbage collection run by an allocation there): its release is queued
    and done before the registry is let go, without deadlock."""
    import threading
    path, _ = _one_file(tmp_path)
    other, _ = _one_file(tmp_path, "two.safetensors")
    f = wcache.safe_open(path, framework="pt")
    f.get_tensor("w")
    release_f = f._host_release
    real = fake_cuda.cudaHostRegister

    def register_and_collect(ptr, size, flags):
        got = real(ptr, size, flags)
        release_f()  # what the collector would run here
        assert fake_cuda.count("unregister") == 0, "deferred, not done inside"
        return got
    fake_cuda.cudaHostRegister = register_and_collect
    done = []
    t = threading.Thread(target=lambda: done.append(
        wcache.safe_open(other, framework="pt").get_tensor("w") is not None), daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "deadlock"
    assert done == [True]
    assert fake_cuda.count("unregister") == 2  # f's, on the way out; then the other's (collected)
    f.close()
    assert fake_cuda.count("unregister") == 2


def test_host_register_a_forked_child_leaves_the_parent_s(tmp_path, no_daemon, fake_cuda):
    """After fork() the child's handles are its parent's registrations:
    closing them there unregisters nothing (the child has no CUDA context),
    and the parent still releases its own once."""
    path, _ = _one_file(tmp_path)
    f = wcache.safe_open(path, framework="pt")
    f.get_tensor("w")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            f.close()
            code = 0 if fake_cuda.count("unregister") == 0 and \
                not _hostreg.host_registrations() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert len(_hostreg.host_registrations()) == 1
    f.close()
    assert fake_cuda.count("unregister") == 1 and fake_cuda.registered == {}


def test_host_register_unregister_error_is_logged_not_raised(tmp_path, no_daemon, fake_cuda,
                                                             caplog):
    path, _ = _one_file(tmp_path)
    fake_cuda.fail_unregister = 713
    with caplog.at_level(logging.WARNING, logger="wcache"):
        with wcache.safe_open(path, framework="pt") as f:
            f.get_tensor("w")
    assert "unregistering host memory failed: RuntimeError: cudaHostUnregister: pointer does " \
        "not correspond to a registered memory region (713)" in caplog.text
    assert _hostreg.host_registrations() == []
    fake_cuda.registered.clear()


def test_a_mapping_whose_unregistration_failed_stays_mapped(tmp_path, no_daemon, fake_cuda):
    """A registration left in a closed handle's mapping (its unregistration
    failed) would pin the pages of whatever the kernel maps next at that
    address, and copies from the new mapping would read the old pages: the
    mapping stays for the rest of the process. Before, it was unmapped at
    the handle's collection."""
    import gc
    path, _ = _one_file(tmp_path)
    fake_cuda.fail_unregister = 713
    kept = len(_device._kept_views)
    with wcache.safe_open(path, framework="pt") as f:
        f.get_tensor("w")
        lo, _ = _hostreg.host_ranges(f.model._tab())[0]
    del f
    gc.collect()
    try:
        assert any(a <= lo < b and p == path for a, b, p in _mappings()), \
            "the mapping left registered was unmapped"
        assert len(_device._kept_views) == kept + 1
    finally:
        del _device._kept_views[kept:]
        fake_cuda.registered.clear()


def test_host_ranges_merge_and_cut_at_mappings():
    """Pages of tensors that touch or overlap are one range; a range is cut
    where a mapping ends (shards side by side); data outside any mapping
    is an error."""
    page = _device.PAGE

    class T:  # the columns of wcache._table.Table that host_ranges reads
        def __init__(self, pieces):
            self.addr = np.array([a for a, _ in pieces], dtype=np.uint64)
            self.nbytes = np.array([n for _, n in pieces], dtype=np.uint64)
    base = 1000 * page
    areas = [(base, base + 4 * page), (base + 4 * page, base + 10 * page),
             (base + 20 * page, base + 30 * page)]
    table = T([(base + 21 * page + 1, 10),             # another file (order does not matter)
               (base + 100, 50), (base + 150, page),   # sharing a page: one piece
               (base + 2 * page, 3 * page - 10),       # touching it, into the next mapping
               (base + 7 * page, 0),                   # empty: ignored
               (base + 8 * page + 5, 10)])             # a page apart: a piece of its own
    assert _hostreg.host_ranges(table, areas) == [
        (base, base + 4 * page), (base + 4 * page, base + 5 * page),
        (base + 8 * page, base + 9 * page), (base + 21 * page, base + 22 * page)]
    with pytest.raises(ValueError, match="not in any mapping"):
        _hostreg.host_ranges(T([(base + 12 * page, 8)]), areas)
    assert _hostreg.host_ranges(T([(0, 0)]), areas) == []
