"""The device copy engine (wcache/_device.py) on the CPU backend: planning of
runs, batches and alignment, the registered path, the double-buffered
staging path, fallback decisions, error paths, and the hooks in safe_open,
load_file and derived. Byte-exact against the file's own bytes. Host
registration of CPU handles (wcache/_hostreg.py) is tested in
test_hostreg.py; the cpu_device fixture is in conftest.py."""
import ctypes
import errno
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

import wcache
import wcache.torch
from wcache import _device, _sharedview
from wcache._device import CpuBackend, RegisterRefused, plan, to_device

from pyhelpers import PYDIR, fstat_names_by_another_device, mapping_at, write_safetensors

torch = pytest.importorskip("torch")


def _bytes(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


@pytest.fixture
def odd_model(tmp_path):
    """A file whose tensors are not all aligned to their element size: an
    I8 tensor of 3 bytes before F32 and F64 tensors, a scalar, an empty one."""
    tensors = [("a.f32", "F32", (4, 8), _bytes(128, 1)),
               ("b.i8", "I8", (3,), _bytes(3, 2)),
               ("c.f32", "F32", (5,), _bytes(20, 3)),
               ("d.f64", "F64", (2, 3), _bytes(48, 4)),
               ("e.empty", "F32", (0, 4), b""),
               ("f.scalar", "I64", (), _bytes(8, 5)),
               ("g.bf16", "BF16", (70, 33), _bytes(70 * 33 * 2, 6)),
               ("h.big", "F32", (300, 300), _bytes(360000, 7))]
    path = tmp_path / "odd.safetensors"
    where = write_safetensors(path, tensors)
    return str(path), {name: data for name, (_, data) in where.items()}


def _check_exact(out, raw):
    assert set(out) == set(raw)
    for name, data in raw.items():
        t = out[name]
        assert t.numel() * t.element_size() == len(data), name
        got = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        assert got == data, name


def _entries(model, names=None):
    tab = model._tab()
    out = []
    for name in names or model.offset_keys():
        info = tab.info(tab.position(name))
        out.append((name, info.data, info.nbytes,
                    {"F32": 4, "I8": 1, "F64": 8, "I64": 8, "BF16": 2}[info.dtype]))
    return out


# ---- planning ----

def test_plan_contiguous_is_one_run_and_batches_split_at_pages():
    page = _device.PAGE
    base = 10 * page + 100
    entries = [("x", base, 1000 * 4, 4), ("y", base + 4000, 2000 * 2, 2),
               ("z", base + 8000, 8, 8)]
    p = plan(entries, max_batch=page)
    assert p.runs == [(base, 0, 8008)]
    assert p.places == {"x": 0, "y": 4000, "z": 8000}
    # cut where the source crosses a page: each batch has its own pages
    assert p.batches[0] == (base, 0, page - 100)
    assert all((src % page == 0) for src, _, _ in p.batches[1:])
    assert sum(n for _, _, n in p.batches) == 8008
    assert p.total == 8008 and p.copied == 8008
    assert [(lo, hi) for lo, hi, _, _ in p.ranges] == \
        [(10 * page + k * page, 11 * page + k * page) for k in range(len(p.batches))]
    assert [(a, b) for _, _, a, b in p.ranges] == [(k, k + 1) for k in range(len(p.batches))]


def test_plan_misaligned_tensor_starts_a_padded_run():
    # 3 bytes of I8, then an F32 at an address that is 3 past a multiple of 4
    entries = [("i8", 1000, 3, 1), ("f32", 1003, 20, 4), ("f64", 1023, 16, 8)]
    p = plan(entries, align=256)
    assert p.places["i8"] == 0
    assert p.places["f32"] % 4 == 0 and p.places["f32"] >= 3
    assert p.places["f64"] % 8 == 0
    for name, _, n, size in entries:
        assert p.places[name] % size == 0
    # no two tensors overlap in the buffer, every tensor is inside it
    spans = sorted((p.places[name], p.places[name] + n) for name, _, n, _ in entries)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert spans[-1][1] <= p.total
    assert len(p.runs) == 3
    # the runs share a page: one range to register for all three batches
    assert len(p.ranges) == 1 and p.ranges[0][2:] == (0, 3)


def test_plan_aliases_empty_and_gaps():
    entries = [("whole", 8192, 64, 4), ("alias", 8192 + 16, 16, 4), ("empty", 0, 0, 4),
               ("far", 1 << 20, 32, 4)]
    p = plan(entries)
    assert p.places["alias"] == p.places["whole"] + 16
    assert p.places["empty"] is None
    assert len(p.runs) == 2  # a gap breaks the run
    assert p.places["far"] % _device.RUN_ALIGN == 0
    page = _device.PAGE
    assert [(lo, hi) for lo, hi, _, _ in p.ranges] == [(8192, 8192 + page),
                                                        (1 << 20, (1 << 20) + page)]


def test_plan_rejects_a_size_that_is_not_whole_elements():
    with pytest.raises(ValueError, match="element size"):
        plan([("bad", 0, 6, 4)])


# ---- the engine on the CPU backend ----

def test_registered_path_is_byte_exact_and_unregisters(odd_model):
    path, raw = odd_model
    model = wcache.open_file(path)
    backend = CpuBackend()
    out = to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                    backend=backend, mode="auto", small=0, max_batch=4096)
    _check_exact(out, raw)
    engine, p = _device.last_load
    assert engine.path == "register"
    assert engine.copies == len(p.batches) > len(p.runs)
    assert [c[0] for c in backend.calls].count("alloc") == 1
    assert backend.registered == {}, "every range registered is unregistered"
    registers = [c for c in backend.calls if c[0] == "register"]
    assert len(registers) == len(p.ranges)
    # one storage: every tensor is a view of the one buffer
    ptrs = [t.data_ptr() for t in out.values() if t.numel()]
    assert max(ptrs) - min(ptrs) < p.total
    for name, t in out.items():
        if t.numel():
            assert (t.storage_offset() * t.element_size()) % t.element_size() == 0
            assert t.data_ptr() % t.element_size() == 0


def test_a_long_term_pin_registers_a_shared_view_not_the_private_mapping(odd_model):
    """libwcache maps MAP_PRIVATE; a device that pins long-term gets a
    MAP_SHARED read-only mapping of the same file registered (pinning the
    private one would make Linux 6.2+ copy it), unmapped afterwards."""
    path, raw = odd_model
    model = wcache.open_file(path)
    tab = model._tab()
    private = mapping_at(tab.info(0).data)
    assert private is not None and private[0][3] == "p", private
    backend = CpuBackend(pins_long_term=True)
    seen = []
    real_register = backend.register

    def register(addr, n):
        seen.append((addr, n, mapping_at(addr)))
        return real_register(addr, n)
    backend.register = register
    out = to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                    backend=backend, mode="auto", small=0, max_batch=4096)
    _check_exact(out, raw)
    engine, p = _device.last_load
    assert engine.path == "register", engine.why
    assert seen and len(seen) == len(p.ranges)
    for addr, n, (perms, where) in seen:
        assert perms == "r--s", (perms, where)
        assert os.path.samefile(where, path)
        assert not any(lo <= addr < hi for lo, hi, _, _ in p.ranges), "not the private mapping"
    for addr, _, _ in seen:
        assert mapping_at(addr) is None or mapping_at(addr)[0] != "r--s" or \
            not os.path.samefile(mapping_at(addr)[1], path), "the view was unmapped"
    assert backend.registered == {}


def test_proc_maps_is_read_once_per_load(odd_model, monkeypatch):
    """The file behind every range is looked up in one read of
    /proc/self/maps per load (a parse costs milliseconds: one per range
    capped the registered path), not one per range (and later loads of the
    model read none: test_a_get_tensor_loop_reads_maps_once...); the engine
    says where its time went."""
    path, raw = odd_model
    model = wcache.open_file(path)
    reads = []
    real = _sharedview.file_mappings

    def counting():
        reads.append(1)
        return real()
    monkeypatch.setattr(_sharedview, "file_mappings", counting)
    out = to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                    backend=CpuBackend(pins_long_term=True), mode="register", small=0,
                    max_batch=4096)
    _check_exact(out, raw)
    engine, p = _device.last_load
    assert engine.path == "register" and len(p.ranges) > 3
    assert len(reads) == 1
    assert set(engine.seconds) == {"view", "register", "copy", "unregister"}
    assert all(s >= 0 for s in engine.seconds.values()) and engine.seconds["copy"] > 0


def test_a_range_missing_from_the_maps_read_is_looked_up_again(odd_model, monkeypatch):
    """A range that the one read of /proc/self/maps lacks (a mapping made
    after it) is looked up in a fresh read, once, not refused."""
    path, raw = odd_model
    model = wcache.open_file(path)
    reads = []
    real = _sharedview.file_mappings
    first = {}

    def stale():
        reads.append(1)
        entries = real()
        if len(reads) > 1:
            return entries
        # the first read: the model's mapping ends after the first range
        lo, hi = first["range"]
        return [e[:1] + (hi,) + e[2:] if e[0] <= lo < e[1] else e for e in entries]
    monkeypatch.setattr(_sharedview, "file_mappings", stale)
    p = plan(_entries(model), max_batch=4096)
    first["range"] = p.ranges[0][:2]
    out = to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                    backend=CpuBackend(pins_long_term=True), mode="register", small=0,
                    max_batch=4096)
    _check_exact(out, raw)
    assert _device.last_load[0].path == "register"
    assert len(reads) == 2


def test_a_fresh_view_already_registered_is_refused(odd_model):
    """cudaErrorHostMemoryAlreadyRegistered for a view mapped just now is a
    registration left behind at a reused address: it pins other pages, so
    the engine stages instead of copying through it (and forced to
    register, raises)."""
    path, raw = odd_model
    model = wcache.open_file(path)
    backend = CpuBackend(pins_long_term=True, already_registered=True)
    out = to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                    backend=backend, mode="auto", small=0, max_batch=4096)
    _check_exact(out, raw)
    engine, _ = _device.last_load
    assert engine.path == "staging", engine.why
    assert "stale registration" in engine.why, engine.why
    assert not [c for c in backend.calls if c[0] == "unregister"]
    with pytest.raises(RegisterRefused, match="stale registration"):
        to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                  backend=CpuBackend(pins_long_term=True, already_registered=True),
                  mode="register", small=0)


def _recording_backend():
    """(a CpuBackend that pins long-term, [(perms, path) of the mapping at
    each address it is asked to register])."""
    backend = CpuBackend(pins_long_term=True)
    seen = []
    real_register = backend.register

    def register(addr, n):
        seen.append(mapping_at(addr))
        return real_register(addr, n)
    backend.register = register
    return backend, seen


@pytest.fixture
def no_map_files(monkeypatch):
    """Opening /proc/self/map_files/* fails with EPERM, as it does for a
    process without CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN (most workers)."""
    real_open = os.open

    def refusing(name, *args, **kwargs):
        if os.fsdecode(name).startswith("/proc/self/map_files/"):
            raise OSError(errno.EPERM, os.strerror(errno.EPERM))
        return real_open(name, *args, **kwargs)
    monkeypatch.setattr(os, "open", refusing)


def _map_files_opens():
    """Whether this process may open /proc/self/map_files/* (root with
    CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE)."""
    entry = _sharedview.file_mappings()[0]
    try:
        os.close(os.open(f"/proc/self/map_files/{entry[0]:x}-{entry[1]:x}", os.O_RDONLY))
    except OSError:
        return False
    return True


def test_no_shared_view_stages_and_says_why(odd_model, tmp_path, caplog, no_map_files):
    """The path now names another file (renamed over) and the old one
    cannot be opened through /proc/self/map_files: no view of it can be
    made, so the engine stages (the page cache stays shared) and says why."""
    path, raw = odd_model
    model = wcache.open_file(path)
    write_safetensors(str(tmp_path / "new.safetensors"), [("x", "F32", (1,), _bytes(4, 9))])
    os.rename(str(tmp_path / "new.safetensors"), path)
    backend = CpuBackend(pins_long_term=True)
    with caplog.at_level(logging.INFO, logger="wcache"):
        out = to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                        backend=backend, mode="auto", small=0, max_batch=4096)
    _check_exact(out, raw)
    engine, _ = _device.last_load
    assert engine.path == "staging"
    assert "no shared view to register" in engine.why and "deleted or renamed over" in \
        engine.why and "needs CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN" in engine.why, engine.why
    assert not [c for c in backend.calls if c[0] == "register"]
    with pytest.raises(RegisterRefused, match="renamed over"):
        to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                  backend=CpuBackend(pins_long_term=True), mode="register", small=0)


@pytest.mark.skipif(not _map_files_opens(), reason="/proc/self/map_files needs "
                    "CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN")
def test_a_renamed_over_file_is_viewed_through_map_files(odd_model, tmp_path):
    """A file renamed over (maps: "PATH (deleted)") is still the inode the
    model maps: a process that may open /proc/self/map_files gets its
    shared view through it, and registers that (no staging)."""
    path, raw = odd_model
    model = wcache.open_file(path)
    write_safetensors(str(tmp_path / "new.safetensors"), [("x", "F32", (1,), _bytes(4, 9))])
    os.rename(str(tmp_path / "new.safetensors"), path)
    backend, seen = _recording_backend()
    out = to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                    backend=backend, mode="register", small=0, max_batch=4096)
    _check_exact(out, raw)
    assert _device.last_load[0].path == "register"
    assert seen and all(m == ("r--s", f"{os.path.realpath(path)} (deleted)") for m in seen), seen
    assert backend.registered == {}


def test_a_file_renamed_over_after_maps_was_read_is_looked_up_again(tmp_path):
    """Two files mapped; a view of the first reads /proc/self/maps (both
    lines), then the second is renamed over (a hot swap of one shard while
    another is copied): its line read before names its path, which opens
    the new file. The lines are read again and the mapped inode is viewed
    as a file renamed over is (here through /proc/self/map_files), and its
    bytes are the old file's. Before, that file was "no longer the mapped
    file" for the handle's life: every copy from it staged."""
    import mmap
    from wcache._sharedview import MappingFiles
    page = mmap.PAGESIZE
    maps = []
    for i, name in enumerate(("a", "b")):
        with open(tmp_path / name, "wb") as f:
            f.write(_bytes(2 * page, 20 + i))
        with open(tmp_path / name, "rb") as f:
            maps.append(mmap.mmap(f.fileno(), 2 * page, access=mmap.ACCESS_COPY))
    addrs = [ctypes.addressof(ctypes.c_char.from_buffer(m)) for m in maps]
    files = MappingFiles()
    views = []
    try:
        views.append(files.view(addrs[0], addrs[0] + 2 * page))
        with open(tmp_path / "new", "wb") as f:
            f.write(_bytes(2 * page, 99))
        os.rename(tmp_path / "new", tmp_path / "b")
        views.append(files.view(addrs[1], addrs[1] + 2 * page))
        assert files.reads == 2
        got = ctypes.string_at(views[1].addr, 2 * page)
        assert got == _bytes(2 * page, 21)
    finally:
        for v in views:
            v.close()
        files.close()
        for m in maps:
            m.close()


def _fd_count():
    return len(os.listdir("/proc/self/fd"))


def _fd_targets():
    """[(descriptor, what it is)] of this process (/proc/self/fd)."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            out.append((int(name), os.readlink(f"/proc/self/fd/{name}")))
        except FileNotFoundError:  # listdir's own, closed since
            pass
    return out


def test_a_memfd_is_viewed_through_the_models_descriptor(no_map_files):
    """A memfd mapped privately ("/memfd:wcache-artifact (deleted)", as a
    derived artifact is) has no path, and map_files is refused: its view is
    mapped through a duplicate of the descriptor the model lends of it, the
    one whose fstat names the inode maps names (not another memfd's). The
    duplicate is the view's own (the model may close its descriptor), and
    goes with close(). Where the model lends none of that inode, the reason
    says so."""
    from wcache._sharedview import _PROT_READ, MappingFiles, Unavailable, _libc
    page = _device.PAGE
    data = _bytes(3 * page, 12)
    fd = os.memfd_create("wcache-artifact", os.MFD_CLOEXEC)
    other = os.memfd_create("wcache-artifact", os.MFD_CLOEXEC)
    os.write(fd, data)
    os.write(other, bytes(3 * page))
    addr = _libc.mmap(None, 3 * page, _PROT_READ, 0x02, fd, 0)  # MAP_PRIVATE
    assert addr not in (None, ctypes.c_void_p(-1).value)
    try:
        assert mapping_at(addr) == ("r--p", "/memfd:wcache-artifact (deleted)")
        before = _fd_count()
        files = MappingFiles(addr, addr + 3 * page, lambda: [other, fd])
        view = files.view(addr + page, addr + 3 * page)
        assert mapping_at(view.addr) == ("r--s", "/memfd:wcache-artifact (deleted)")
        assert ctypes.string_at(view.addr, 2 * page) == data[page:]
        (opened,) = files.files.values()
        assert opened.kept and opened.fd not in (fd, other)
        assert _fd_count() == before + 1
        os.close(fd)  # the model's own goes: the view's duplicate stays
        fd = None
        again = files.view(addr, addr + page)
        assert ctypes.string_at(again.addr, page) == data[:page]
        for v in (view, again):
            v.close()
        files.close()
        assert _fd_count() == before - 1
        for lends, why in (([other], "none of the model's descriptors is this file"),
                           ([], "the model keeps none"),
                           (None, "this libwcache has no wc_model_fd")):
            files = MappingFiles(addr, addr + 3 * page, lambda: lends)
            with pytest.raises(Unavailable) as e:
                files.view(addr, addr + page)
            assert str(e.value) == "/memfd:wcache-artifact (deleted): a memfd (a derived " \
                f"artifact is one), which has no path to open, libwcache keeps no " \
                f"descriptor of it ({why}), and opening it through /proc/self/map_files " \
                f"needs CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN"
            files.close()
    finally:
        _libc.munmap(addr, 3 * page)
        for d in (fd, other):
            if d is not None:
                os.close(d)


def test_shared_view_of_memory_that_is_no_file_is_unavailable():
    from wcache._sharedview import Unavailable, shared_view
    buf = torch.zeros(3 * 4096 * 4, dtype=torch.uint8)
    lo = -(-buf.data_ptr() // 4096) * 4096
    with pytest.raises(Unavailable, match="not inside one file mapping"):
        shared_view(lo, lo + 4096)
    with pytest.raises(Unavailable, match="not page-aligned"):
        shared_view(lo + 1, lo + 4096)


def test_refused_registration_stages_through_two_buffers(odd_model, caplog):
    path, raw = odd_model
    model = wcache.open_file(path)
    backend = CpuBackend(refuse="read-only registration unsupported (test)")
    _device._logged.clear()
    with caplog.at_level(logging.INFO, logger="wcache"):
        out = to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                        backend=backend, mode="auto", small=0, staging_bytes=4096, threads=3)
    _check_exact(out, raw)
    engine, p = _device.last_load
    assert engine.path == "staging" and "unsupported (test)" in engine.why
    assert [c[0] for c in backend.calls].count("pinned") == 2
    assert backend.streams == 2
    assert backend.pinned_live == 0
    copies = [(i, c) for i, c in enumerate(backend.calls) if c[0] == "copy"]
    assert engine.copies == len(copies) > 2
    assert sum(c[3] for _, c in copies) == p.copied
    # a buffer holds several pieces: consecutive copies from one buffer form
    # a group of at most 4096 bytes, groups alternate between the streams,
    # and a stream is synchronised before its buffer is filled again
    groups = []
    for i, c in copies:
        if groups and groups[-1][0] == c[1]:
            groups[-1][1].append((i, c))
        else:
            groups.append((c[1], [(i, c)]))
    assert len(groups) > 2
    assert [g[0] for g in groups] == [groups[k % 2][0] for k in range(len(groups))]
    assert groups[0][0] != groups[1][0]
    for g in groups:
        assert sum(c[3] for _, c in g[1]) <= 4096
    assert any(len(g[1]) > 1 for g in groups), "small pieces share a buffer"
    for k in range(2, len(groups)):
        before, after = groups[k - 2][1][-1][0], groups[k][1][0][0]
        assert ("sync", groups[k][0]) in backend.calls[before:after]
    warnings_ = [r for r in caplog.records if "staging path" in r.getMessage()]
    assert len(warnings_) == 1 and warnings_[0].levelno == logging.WARNING
    # the same reason again: no second line
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="wcache"):
        to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                  backend=CpuBackend(refuse="read-only registration unsupported (test)"),
                  small=0, staging_bytes=4096)
    assert not [r for r in caplog.records if "staging path" in r.getMessage()]


def test_one_log_line_per_path_and_reason_whatever_the_load_size(odd_model, monkeypatch,
                                                                  caplog):
    """Loads of different sizes (the shards of one model) register
    different numbers of ranges, and a refusal may come after a different
    number of batches: the engine's why says so, the log line does not, so
    it is written once per process for each path and reason."""
    path, raw = odd_model
    model = wcache.open_file(path)
    names = model.offset_keys()
    _device._logged.clear()
    with caplog.at_level(logging.INFO, logger="wcache"):
        for some in (names, names[:3], names[-2:]):
            to_device(model, some, torch.device("cpu"), model.torch, backend=CpuBackend(),
                      small=0, max_batch=_device.PAGE)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("wcache: register path into cpu: "), lines
    assert "range(s)" in _device.last_load[0].why
    ranges = plan(_entries(model), max_batch=_device.PAGE).ranges
    refused = [None]
    real = CpuBackend.register

    def refuse_later(self, addr, n):
        if addr == refused[0]:
            raise RegisterRefused("refused part way (test)")
        return real(self, addr, n)
    monkeypatch.setattr(CpuBackend, "register", refuse_later)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="wcache"):
        for k in (1, 2, 3):  # the load's second, third, fourth range
            refused[0] = ranges[k][0]
            to_device(model, names, torch.device("cpu"), model.torch, backend=CpuBackend(),
                      small=0, max_batch=_device.PAGE, staging_bytes=4096)
            assert _device.last_load[0].path == "register+staging"
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["wcache: register+staging path into cpu: registration refused: "
                     "refused part way (test)"], lines


def test_staging_without_waiting_would_be_caught(odd_model, monkeypatch):
    """The CPU backend copies only at synchronize(): an engine that refilled
    a staging buffer before its copy finished would produce wrong bytes."""
    path, raw = odd_model
    model = wcache.open_file(path)
    import sys
    real = CpuBackend.synchronize
    skipped = []

    def lazy(self, stream):  # skip the waits before a buffer is refilled only
        if sys._getframe(1).f_code.co_name == "flush":
            skipped.append(stream.number)
            return None
        return real(self, stream)
    monkeypatch.setattr(CpuBackend, "synchronize", lazy)
    out = to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                    backend=CpuBackend(refuse="x"), small=0, staging_bytes=4096, threads=1)
    assert skipped, "the engine waits before refilling a buffer"
    with pytest.raises(AssertionError):
        _check_exact(out, raw)


def test_register_mode_raises_when_refused(odd_model):
    path, _ = odd_model
    model = wcache.open_file(path)
    backend = CpuBackend(refuse="no")
    with pytest.raises(RegisterRefused, match="no"):
        to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                  backend=backend, mode="register", small=0)
    assert backend.registered == {}


def test_staging_mode_never_registers(odd_model):
    path, raw = odd_model
    model = wcache.open_file(path)
    backend = CpuBackend()
    out = to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                    backend=backend, mode="staging", small=0)
    _check_exact(out, raw)
    assert not [c for c in backend.calls if c[0] == "register"]
    assert _device.last_load[0].path == "staging"


def test_already_registered_memory_is_refused_and_left_registered(odd_model):
    """cudaErrorHostMemoryAlreadyRegistered on the model's own mapping (not
    a view: a backend that does not pin long-term registers the mapping
    itself): libwcache made it in this process, so the registration found
    there is the loader's or one left behind at a reused address, pinning
    other pages; the engine cannot tell them apart and stages, as it does
    for a fresh view and as _hostreg.py does. Before, it copied through it.
    Nothing is unregistered."""
    path, raw = odd_model
    model = wcache.open_file(path)
    backend = CpuBackend(already_registered=True)
    _check_exact(to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                           backend=backend, small=0), raw)
    engine = _device.last_load[0]
    assert engine.path == "staging" and "the model's mapping is already registered" in \
        engine.why, engine.why
    assert not [c for c in backend.calls if c[0] == "unregister"]


@pytest.mark.parametrize("refuse", [None, "refused"])
@pytest.mark.parametrize("fail_copy", [1, 3])
def test_an_error_mid_copy_frees_everything(odd_model, refuse, fail_copy, caplog):
    path, raw = odd_model
    model = wcache.open_file(path)
    # A forced path raises the error...
    backend = CpuBackend(refuse=refuse, fail_copy=fail_copy)
    with pytest.raises(RuntimeError, match="injected"):
        to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                  backend=backend, small=0, max_batch=4096, staging_bytes=4096,
                  mode="register" if refuse is None else "staging")
    assert backend.registered == {}
    assert backend.pinned_live == 0
    # every stream was synchronised after the failure (no copy left reading the source)
    assert backend.calls[-1][0] in ("unregister", "release", "sync")
    # ...and "auto" (the default) loads tensor by tensor instead, saying so once.
    backend = CpuBackend(refuse=refuse, fail_copy=fail_copy)
    _device._logged.clear()
    with caplog.at_level(logging.WARNING, logger="wcache"):
        out = to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                        backend=backend, small=0, max_batch=4096, staging_bytes=4096,
                        mode="auto")
    _check_exact(out, raw)
    assert backend.registered == {} and backend.pinned_live == 0
    assert f"the batched copy into cpu failed (RuntimeError: copy {fail_copy} failed (injected))" \
        in caplog.text


def test_the_fallback_copies_after_the_failed_buffer_is_freed(odd_model):
    """After a failed batched copy (mode auto), the whole model's device
    buffer is freed before the tensor-by-tensor fallback copies anything:
    it ran inside the except block before, where the error's traceback
    kept the engine's frames, and with them the buffer, alive (on a GPU,
    twice the model's memory: an out-of-memory error from the fallback
    itself for a model over half the device)."""
    import gc
    import weakref
    path, raw = odd_model
    model = wcache.open_file(path)
    buffers = []

    class Tracked(CpuBackend):
        def alloc(self, nbytes):
            t = super().alloc(nbytes)
            buffers.append(weakref.ref(t))
            return t
    alive = []

    def per_tensor(name):
        gc.collect()
        alive.append(buffers[0]() is not None)
        return model.torch(name)
    out = to_device(model, model.offset_keys(), torch.device("cpu"), per_tensor,
                    backend=Tracked(fail_copy=2), mode="auto", small=0, max_batch=4096)
    _check_exact(out, raw)
    assert alive and not any(alive), alive


def test_a_backend_that_cannot_be_made_falls_back(odd_model, monkeypatch, caplog):
    """Making the backend (torch.cuda.cudart() for CUDA) is part of the
    batched copy: where it raises, mode auto copies tensor by tensor with
    one WARNING, as after any other failure of the engine; before, every
    device= load failed. A forced path raises."""
    path, raw = odd_model
    model = wcache.open_file(path)

    def no_binding(device):
        raise AttributeError("module 'torch.cuda' has no attribute 'cudart'")
    monkeypatch.setattr(_device, "backend_for", no_binding)
    _device._logged.clear()
    with caplog.at_level(logging.WARNING, logger="wcache"):
        out = to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                        mode="auto", small=0)
        t = _device.tensor_to_device(model.torch(model.offset_keys()[0]), torch.device("cpu"),
                                     mode="auto")
    _check_exact(out, raw)
    assert torch.equal(t, model.torch(model.offset_keys()[0]))
    assert caplog.text.count("no batched copy into cpu (AttributeError: module 'torch.cuda' "
                             "has no attribute 'cudart'); copying tensor by tensor") == 1, \
        caplog.text
    for mode in ("register", "staging"):
        with pytest.raises(AttributeError, match="cudart"):
            to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                      mode=mode, small=0)


def test_every_view_is_mapped_before_the_first_registration(odd_model, monkeypatch):
    """Mapping a view takes the process's mmap_lock for writing, which waits
    for every registration in flight (the driver pins holding it for
    reading) and holds up those after it: every range's view is mapped
    before the first registration starts, where before each was mapped
    just ahead of its own, among the registrations of the ranges before."""
    from wcache import _sharedview
    path, raw = odd_model
    model = wcache.open_file(path)
    backend = CpuBackend(pins_long_term=True)
    real = _sharedview.MappingFiles.view

    def view(self, lo, hi):
        backend.calls.append(("view", lo, hi))
        return real(self, lo, hi)
    monkeypatch.setattr(_sharedview.MappingFiles, "view", view)
    out = to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                    backend=backend, mode="register", small=0, max_batch=4096)
    _check_exact(out, raw)
    n = len(_device.last_load[1].ranges)
    assert n > _device.REGISTER_AHEAD
    assert [c[0] for c in backend.calls if c[0] in ("view", "register")] == \
        ["view"] * n + ["register"] * n, backend.calls
    assert backend.registered == {}


def test_a_view_whose_unregistration_failed_stays_mapped(odd_model):
    """A registration left behind (cudaHostUnregister failed) pins the
    pages of the view: unmapped, its address could be mapped again (a
    user's file mapping, the next load's view) and a copy from there would
    read the old pages through it. Such a view stays mapped for the rest of
    the process (_kept_views); the others are unmapped as before."""
    path, raw = odd_model
    model = wcache.open_file(path)

    class FailingUnregister(CpuBackend):
        def unregister(self, addr):
            super().unregister(addr)
            if len([c for c in self.calls if c[0] == "unregister"]) == 1:
                raise RuntimeError("cudaHostUnregister: injected (999)")
    backend = FailingUnregister(pins_long_term=True)
    kept = len(_device._kept_views)
    try:
        out = to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                        backend=backend, mode="register", small=0, max_batch=4096)
        _check_exact(out, raw)
        left = _device._kept_views[kept:]
        assert len(left) == 1, left
        failed = next(c[1] for c in backend.calls if c[0] == "unregister")
        assert left[0].addr == failed
        with open("/proc/self/maps") as f:
            maps = [tuple(int(x, 16) for x in line.split()[0].split("-")) for line in f]
        assert any(a <= failed < b for a, b in maps)
    finally:
        for view in _device._kept_views[kept:]:
            view.close()
        del _device._kept_views[kept:]


def _copies_follow_their_registration(backend, p):
    """Checks backend.calls (a CpuBackend that does not pin long-term, so
    a range is registered at its own address, and that records
    ("registered", addr) when a registration returns): every copy of the
    registered path is issued after its range's registration returned, and
    every range is unregistered after the last synchronisation of a copy
    stream. The registered ranges' indices, in the order they returned."""
    first_batch = {dst: k for k, (_, dst, _) in enumerate(p.batches)}
    range_of = {k: r for r, (_, _, first, end) in enumerate(p.ranges) for k in range(first, end)}
    returned = {}
    for at, call in enumerate(backend.calls):
        if call[0] == "registered":
            returned[call[1]] = at
        elif call[0] == "copy" and call[1] == 1 and call[2] in first_batch:
            lo = p.ranges[range_of[first_batch[call[2]]]][0]
            assert lo in returned and returned[lo] < at, (call, lo, returned)
    syncs = [at for at, c in enumerate(backend.calls) if c[0] == "sync" and c[1] == 1]
    unregisters = [at for at, c in enumerate(backend.calls) if c[0] == "unregister"]
    assert not unregisters or (syncs and max(syncs) < min(unregisters)), backend.calls
    starts = [lo for lo, _, _, _ in p.ranges]
    return [starts.index(lo) for lo in sorted(returned, key=returned.get)]


class _RecordingBackend(CpuBackend):
    """A CpuBackend that records ("registered", addr) when a registration
    returns, and whose first meet registrations (by call) wait for each
    other: they return only if they run at once (BrokenBarrierError
    after 10 s otherwise)."""

    def __init__(self, meet=1, **kwargs):
        import threading
        super().__init__(**kwargs)
        self.lock = threading.Lock()
        self.calls_made = 0
        self.meet = meet
        self.barrier = threading.Barrier(meet, timeout=10) if meet > 1 else None

    def register(self, addr, nbytes):
        with self.lock:
            self.calls_made += 1
            waits = self.calls_made <= self.meet
        got = super().register(addr, nbytes)
        if waits and self.barrier is not None:
            self.barrier.wait()
        self.calls.append(("registered", addr))
        return got


def test_refusal_after_some_ranges_stages_the_rest(odd_model, monkeypatch):
    """A refusal of the third range stages its batches and the rest;
    ranges registered ahead of it (on the engine's threads) are waited for
    and unregistered too."""
    path, raw = odd_model
    model = wcache.open_file(path)
    third = plan(_entries(model), max_batch=_device.PAGE).ranges[2][0]
    real = _RecordingBackend.register

    def third_refused(self, addr, n):
        if addr == third:
            self.calls.append(("register", addr, n))
            raise RegisterRefused("third range refused")
        return real(self, addr, n)
    monkeypatch.setattr(_RecordingBackend, "register", third_refused)
    backend = _RecordingBackend()
    out = to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                    backend=backend, small=0, max_batch=_device.PAGE, staging_bytes=1000)
    _check_exact(out, raw)
    engine, p = _device.last_load
    assert len(p.ranges) > 3
    assert engine.path == "register+staging" and "third range refused" in engine.why
    assert f"after {p.ranges[2][2]} of {len(p.batches)} batches" in engine.why, engine.why
    assert backend.registered == {} and backend.pinned_live == 0
    assert 0 in _copies_follow_their_registration(backend, p)


def test_ranges_are_registered_ahead_of_their_copies_on_threads(odd_model):
    """Registering pins pages (CPU work, ~0.1 s/GB, slower than the link):
    the engine registers REGISTER_AHEAD ranges at once on threads, ahead of
    their copies, so they overlap each other and the copies in flight.
    Here the first two registrations return only if they run at once
    (before: one at a time, the first waited 10 s and the load raised
    BrokenBarrierError). Each range's copies are still issued only after
    its own registration returned, and unregistered after the stream's
    last synchronisation; every byte is exact."""
    path, raw = odd_model
    model = wcache.open_file(path)
    backend = _RecordingBackend(meet=2)
    out = to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                    backend=backend, mode="register", small=0, max_batch=_device.PAGE)
    _check_exact(out, raw)
    engine, p = _device.last_load
    assert engine.path == "register" and len(p.ranges) > _device.REGISTER_AHEAD, engine.why
    assert sorted(_copies_follow_their_registration(backend, p)) == list(range(len(p.ranges)))
    assert backend.registered == {}


def test_small_loads_and_tensor_mode_copy_tensor_by_tensor(odd_model, monkeypatch):
    path, raw = odd_model
    model = wcache.open_file(path)
    backend = CpuBackend()
    out = to_device(model, ["a.f32", "c.f32"], torch.device("cpu"), model.torch,
                    backend=backend)  # 148 bytes < SMALL_COPY
    assert backend.calls == []
    _check_exact(out, {k: raw[k] for k in ("a.f32", "c.f32")})
    monkeypatch.setenv("WCACHE_DEVICE_COPY", "tensor")
    out = to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                    backend=backend, small=0)
    assert backend.calls == []
    monkeypatch.setenv("WCACHE_DEVICE_COPY", "bogus")
    with pytest.raises(ValueError, match="WCACHE_DEVICE_COPY"):
        to_device(model, ["a.f32"], torch.device("cpu"), model.torch, backend=backend)


def test_missing_tensor_is_a_key_error(odd_model):
    path, _ = odd_model
    model = wcache.open_file(path)
    with pytest.raises(KeyError):
        to_device(model, ["nope"], torch.device("cpu"), model.torch, backend=CpuBackend())


# ---- the hooks: safe_open, load_file, load_model, derived ----

def test_safe_open_get_tensors_on_device_uses_one_buffer(odd_model, cpu_device, no_daemon):
    path, raw = odd_model
    with wcache.safe_open(path, framework="pt", device="cuda:0") as f:
        out = f.get_tensors()
        assert list(out) == f.offset_keys()
        one = f.get_tensor("g.bf16")
    _check_exact(out, raw)
    assert torch.equal(one.view(torch.uint8), out["g.bf16"].view(torch.uint8))
    assert len(cpu_device) == 2
    assert [c[0] for c in cpu_device[0].calls].count("alloc") == 1
    assert cpu_device[0].registered == {}


@pytest.fixture
def pinning_device(cpu_device):
    """As cpu_device, with backends that pin long-term as CUDA's does, so
    the engine registers shared views of the file."""
    for made in cpu_device:
        made.pins_long_term = True
    real = _device.backend_for

    def backend_for(device):
        backend = real(device)
        backend.pins_long_term = True
        return backend
    _device.backend_for = backend_for
    yield cpu_device
    _device.backend_for = real


def _shared_views(path):
    """The shared (r--s) mappings of path in /proc/self/maps."""
    with open("/proc/self/maps") as f:
        return [line for line in f if " r--s " in line and line.rstrip().endswith(path)]


def test_a_get_tensor_loop_reads_maps_once_and_keeps_one_descriptor(tmp_path, pinning_device,
                                                                    no_daemon, monkeypatch):
    """for k in f.keys(): f.get_tensor(k) on a device is one copy per
    tensor. The model's line in /proc/self/maps is read and its file
    opened and checked at the first, and kept for the others (before: a
    read of maps, an open and an fstat per tensor; 4 ms a read at 1,700
    lines of maps, 22 ms at 4,700); the one descriptor is closed when the
    handle closes, and no view stays mapped."""
    path = str(tmp_path / "many.safetensors")
    raw = {f"t{k:02}": _bytes(64 << 10, 20 + k) for k in range(24)}
    write_safetensors(path, [(name, "F32", (128, 128), data) for name, data in raw.items()])
    real_path = os.path.realpath(path)
    reads, opens = [], []
    real_maps, real_open = _sharedview.file_mappings, os.open

    def counting_maps():
        reads.append(1)
        return real_maps()

    def counting_open(name, *args, **kwargs):
        if os.fsdecode(name) == real_path:
            opens.append(name)
        return real_open(name, *args, **kwargs)
    monkeypatch.setattr(_sharedview, "file_mappings", counting_maps)
    monkeypatch.setattr(os, "open", counting_open)
    fds = len(os.listdir("/proc/self/fd"))
    out = {}
    with wcache.safe_open(path, framework="pt", device="cuda:0") as f:
        for k in f.keys():
            out[k] = f.get_tensor(k)
            assert _device.last_load[0].path == "register", _device.last_load[0].why
        assert (len(reads), len(opens)) == (1, 1), (len(reads), len(opens))
        assert len(os.listdir("/proc/self/fd")) == fds + 1
    _check_exact(out, raw)
    assert len(os.listdir("/proc/self/fd")) == fds, "the descriptor closed with the handle"
    assert _shared_views(real_path) == []
    assert len(pinning_device) == 24 and all(b.registered == {} for b in pinning_device)


def test_save_model_of_parameters_loaded_onto_a_device(tmp_path, cpu_device, no_daemon):
    """A device load's tensors are views of one buffer: a model whose
    parameters are those tensors saves and loads with save_model and
    load_model (not 'None is covering the entire storage'), for as long as
    the buffer lives, the buffer tensor itself gone; a caller's own part of
    a storage is still refused, as upstream refuses it."""
    path = tmp_path / "two.safetensors"
    wcache.torch.save_file({"a.weight": torch.randn(4, 4), "b.weight": torch.randn(4, 4)},
                           path)
    state = wcache.torch.load_file(path, device="cuda:0")
    assert len(cpu_device) == 1, "the device path ran"
    assert wcache.torch.storage_ptr(state["a.weight"]) == \
        wcache.torch.storage_ptr(state["b.weight"])
    model = torch.nn.Sequential()
    model.add_module("a", torch.nn.Linear(4, 4, bias=False))
    model.add_module("b", torch.nn.Linear(4, 4, bias=False))
    model.a.weight = torch.nn.Parameter(state["a.weight"])
    model.b.weight = torch.nn.Parameter(state["b.weight"])
    want = {k: v.clone() for k, v in state.items()}
    del state
    out = tmp_path / "saved.safetensors"
    wcache.torch.save_model(model, out)
    again = wcache.torch.load_file(out)
    assert torch.equal(again["a.weight"], want["a.weight"])
    assert torch.equal(again["b.weight"], want["b.weight"])
    assert wcache.torch.load_model(model, out) == (set(), [])
    lone = torch.nn.Linear(2, 2, bias=False)
    lone.weight = torch.nn.Parameter(torch.zeros(8)[:4].view(2, 2))
    with pytest.raises(RuntimeError, match="None is covering the entire storage"):
        wcache.torch.save_model(lone, tmp_path / "lone.safetensors")


def test_get_slice_on_device_copies_and_holds_only_the_slice(odd_model, cpu_device, no_daemon):
    """get_slice(name)[...] on a device handle (tensor-parallel loaders take
    one rank's rows or columns this way): the slice alone is copied, and the
    result holds device memory for the slice, not for the whole tensor."""
    path, raw = odd_model
    whole = torch.frombuffer(bytearray(raw["h.big"]), dtype=torch.float32).reshape(300, 300)
    with wcache.safe_open(path, framework="pt", device="cuda:0") as f:
        for index in ((slice(0, 2),), (slice(None), slice(10, 20)), (5,), (Ellipsis, 7),
                      (slice(3, 3),)):
            part = f.get_slice("h.big")[index]
            want = whole[index]
            assert part.shape == want.shape, index
            assert part.contiguous().numpy().tobytes() == want.contiguous().numpy().tobytes()
            assert part.storage().nbytes() == want.numel() * 4, index
        scalar = f.get_slice("f.scalar")[...]
        assert scalar.shape == () and scalar.reshape(1).numpy().tobytes() == \
            raw["f.scalar"]
    copies = [c for b in cpu_device for c in b.calls if c[0] == "copy"]
    # the bytes of each selection, never the 360,000 of the whole tensor
    assert [c[3] for c in copies] == [2 * 300 * 4, 300 * 10 * 4, 300 * 4, 300 * 4, 8]


def test_load_file_and_load_model_on_device(odd_model, cpu_device, no_daemon):
    path, raw = odd_model
    _check_exact(wcache.torch.load_file(path, device="cuda:0"), raw)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.h = torch.nn.Module()
            self.h.register_buffer("big", torch.zeros(300, 300))
    m = M()
    wcache.torch.load_model(m, path, strict=False, device="cuda:0")
    assert m.h.big.numpy().tobytes() == raw["h.big"]
    assert cpu_device, "load_model went through the engine"


def test_derived_device_is_checked(tmp_path, no_daemon):
    path = tmp_path / "src.safetensors"
    write_safetensors(path, [("w", "F32", (64, 64), _bytes(64 * 64 * 4, 9))])
    with pytest.raises(ValueError, match="not supported for framework numpy"):
        wcache.derived(str(path), "neg-v1", lambda s: s, framework="np", device="cuda:0")
    with pytest.warns(RuntimeWarning):
        out = wcache.derived(str(path), "neg-v1", lambda s: {k: -v for k, v in s.items()},
                             device="cpu")
    assert out["w"].numpy().tobytes() == \
        (-wcache.open_file(str(path)).torch("w")).numpy().tobytes()


def _derive_through_wcached(tmp_path, monkeypatch, build_first=True):
    """wcache.derived(..., device="cuda:0") of a source served by a real
    wcached with derive = yes, its result checked byte for byte; with
    build_first, built first on the CPU, so the device call attaches the
    artifact (a sealed memfd, "/memfd:wcache-artifact (deleted)" in
    /proc/self/maps). [(perms, path) of the mapping at each address the
    backend was asked to register]."""
    import wcache._safe_open as so
    from pyhelpers import Daemon
    path = tmp_path / "src.safetensors"
    write_safetensors(path, [("w", "F32", (512, 512), _bytes(512 * 512 * 4, 10)),
                             ("v", "F32", (7,), _bytes(28, 11))])
    d = Daemon(tmp_path, {"src": (str(path), {"derive": "yes"})}).start()
    monkeypatch.setenv("WCACHE_SOCKET", d.socket)
    so._shared = None
    seen = []
    real_register = CpuBackend.register

    def register(self, addr, n):
        seen.append(mapping_at(addr))
        return real_register(self, addr, n)
    try:
        src = wcache.open_file(str(path))
        negate = lambda s: {k: -v for k, v in s.items()}  # noqa: E731
        if build_first:
            wcache.derived("src", "neg-v1", negate)
        monkeypatch.setattr(CpuBackend, "register", register)
        out = wcache.derived("src", "neg-v1", negate, device="cuda:0")
        want = {name: (-src.torch(name)).numpy().tobytes() for name in ("w", "v")}
    finally:
        so._shared = None
        assert d.stop() == 0
    for name in ("w", "v"):  # random bytes hold NaNs: compare bytes
        assert out[name].numpy().tobytes() == want[name], name
    return seen


def test_derived_on_device_through_wcached(tmp_path, cpu_device, monkeypatch):
    _derive_through_wcached(tmp_path, monkeypatch, build_first=False)
    assert cpu_device and cpu_device[-1].registered == {}
    assert _device.last_load[0].path == "register"


@pytest.mark.skipif(not _map_files_opens(), reason="/proc/self/map_files needs "
                    "CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN")
def test_derived_on_device_registers_a_shared_view_of_the_memfd(tmp_path, pinning_device,
                                                                monkeypatch):
    """A derived artifact is a sealed memfd with no path: a process that
    may open /proc/self/map_files registers a shared view of it (the copy
    takes the registered path). Before, every derived call on a device
    staged, blaming a rename."""
    seen = _derive_through_wcached(tmp_path, monkeypatch)
    engine = _device.last_load[0]
    assert engine.path == "register", engine.why
    assert seen and all(m == ("r--s", "/memfd:wcache-artifact (deleted)") for m in seen), seen
    assert pinning_device[-1].registered == {}


def test_derived_on_device_without_map_files_registers_through_the_kept_descriptor(
        tmp_path, pinning_device, no_map_files, monkeypatch):
    """Where /proc/self/map_files is refused (most workers: it needs
    CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN), the derived call still takes
    the registered path: the view of the artifact's memfd is mapped through
    the descriptor libwcache keeps of it (wc_model_fd). Before, it staged
    ("... which has no path to open, and opening it through
    /proc/self/map_files needs ..."). Nothing of it stays open afterwards:
    not the view's duplicate, nor (the artifact released) libwcache's."""
    opened = []
    real_init = _sharedview.MappedFile.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        opened.append((self.name, self.kept))
    monkeypatch.setattr(_sharedview.MappedFile, "__init__", init)
    seen = _derive_through_wcached(tmp_path, monkeypatch)
    engine = _device.last_load[0]
    assert engine.path == "register", engine.why
    assert seen and all(m == ("r--s", "/memfd:wcache-artifact (deleted)") for m in seen), seen
    assert opened == [("/memfd:wcache-artifact (deleted)", True)], opened
    assert pinning_device[-1].registered == {}
    import gc
    gc.collect()
    assert [n for n, target in _fd_targets() if target.startswith("/memfd:wcache-artifact")] \
        == []


def test_derived_on_device_with_an_older_libwcache_and_no_map_files_stages_naming_the_memfd(
        tmp_path, pinning_device, no_map_files, monkeypatch, caplog):
    """Under a libwcache that keeps no descriptor of an artifact (no
    wc_model_fd) and without /proc/self/map_files, the derived call
    stages, and its reason names the memfd and what it lacks, not a rename
    (before f6613dd: "the mapped file was deleted or renamed over")."""
    real_has = wcache._lib.has
    monkeypatch.setattr(wcache._lib, "has", lambda name: name != "wc_model_fd" and
                        real_has(name))
    with caplog.at_level(logging.INFO, logger="wcache"):
        seen = _derive_through_wcached(tmp_path, monkeypatch)
    engine = _device.last_load[0]
    assert engine.path == "staging" and seen == [], (engine.path, seen)
    assert "/memfd:wcache-artifact (deleted): a memfd (a derived artifact is one), which has " \
        "no path to open, libwcache keeps no descriptor of it (this libwcache has no " \
        "wc_model_fd), and opening it through /proc/self/map_files needs " \
        "CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN" in engine.why, engine.why
    assert "renamed" not in engine.why


def test_threads_loading_neighbours_do_not_register_a_page_twice(odd_model):
    """Two threads loading tensors that share a page: registered copies run
    one at a time, so no page is registered twice (the CPU backend raises
    if it is) and both get the right bytes."""
    import threading
    import time
    path, raw = odd_model
    model = wcache.open_file(path)

    class Slow(CpuBackend):  # lets the other thread run between register and unregister
        def register(self, addr, nbytes):
            got = super().register(addr, nbytes)
            time.sleep(0.002)
            return got
    backend = Slow()
    names = model.offset_keys()
    results, errors = {}, []

    def load(part):
        try:
            for _ in range(20):
                results.update(to_device(model, part, torch.device("cpu"), model.torch,
                                         backend=backend, small=0))
        except BaseException as e:  # reported below
            errors.append(e)
    threads = [threading.Thread(target=load, args=(names[k::2],)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    _check_exact(results, raw)
    assert backend.registered == {}


def test_a_model_closed_while_its_copy_is_in_flight(odd_model):
    """to_device keeps the model's mapping until its copies are done, even
    when another thread closes the model meanwhile and per_tensor (here a
    function that holds nothing of the model) keeps nothing alive:
    another thread's close() runs before each line of Engine.copy_plan in
    turn, and every load is byte-exact. In a child process: before, close()
    dropped the last reference to the handle, the file was unmapped, and
    the CPU backend's copies (run when the stream is synchronised) read
    unmapped memory (SIGSEGV at line 0)."""
    from pyhelpers import run_python
    path, _ = odd_model
    code = f"""
import sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
import torch, wcache
from pyhelpers import other_thread_before
from wcache._device import CpuBackend, Engine, to_device
ref = wcache.open_file({path!r})  # a handle of its own: the expected bytes
k = 0
while True:
    model = wcache.open_file({path!r})
    names = model.offset_keys()
    got = []
    load = lambda: got.append(to_device(model, names, torch.device("cpu"), lambda name: None,
                                        backend=CpuBackend(), small=0, max_batch=4096))
    errors, other_errors, ran = other_thread_before(Engine.copy_plan.__code__, k, load,
                                                    model.close)
    assert not errors and not other_errors, (k, errors, other_errors)
    for name, t in got[0].items():
        b = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        assert b == ref.raw(name).tobytes(), (k, name)
    if not ran:
        break
    k += 1
assert k > 5
print("ok", k)
"""
    r = run_python(code)
    assert r.returncode == 0 and r.stdout.startswith("ok"), (r.returncode, r.stderr[-2000:])


# ---- the CUDA backend's error handling (a fake cudart) ----

def test_cudart_libraries_finds_every_runtime_loaded(tmp_path):
    """pip's libcudart.so.13, a torch wheel's bundled libcudart-HASH.so.12
    (which "libcudart.so" does not match) and a file deleted or replaced
    since it was loaded (named as maps names it: the file at that path now
    is not what is loaded), each once with its first mapping's address;
    nothing else."""
    maps = tmp_path / "maps"
    lines = [
        "7f0000000000-7f0000001000 r--p 00000000 08:01 11 /venv/nvidia/cu13/lib/libcudart.so.13",
        "7f0000001000-7f0000002000 r-xp 00001000 08:01 11 /venv/nvidia/cu13/lib/libcudart.so.13",
        "7f0000003000-7f0000004000 r--p 00000000 08:01 12 /venv/torch/lib/libcudart-d0da41ae.so.12",
        "7f0000005000-7f0000006000 r--p 00000000 08:01 13 /opt/cuda/lib64/libcudart.so.12.4 "
        "(deleted)",
        "7f0000007000-7f0000008000 r--p 00000000 08:01 14 /venv/nvidia/cudnn/lib/libcudnn.so.9",
        "7f0000009000-7f000000a000 r--p 00000000 08:01 15 /data/libcudart notes.txt",
        "7f000000b000-7f000000c000 rw-p 00000000 00:00 0 ",
        "7ffd00000000-7ffd00001000 rw-p 00000000 00:00 0 [stack]",
    ]
    maps.write_text("\n".join(lines) + "\n")
    assert _device.cudart_libraries(str(maps)) == [
        ("/venv/nvidia/cu13/lib/libcudart.so.13", 0x7f0000000000),
        ("/venv/torch/lib/libcudart-d0da41ae.so.12", 0x7f0000003000),
        ("/opt/cuda/lib64/libcudart.so.12.4 (deleted)", 0x7f0000005000)]
    assert all(isinstance(p, str) for p, _ in _device.cudart_libraries())  # this process's


# A stand-in for a CUDA runtime: its last error is its own static state,
# and COPY says which build of the file is loaded.
_FAKE_CUDART = r"""
static int pending;
int cudaSetError(int e) { pending = e; return 0; }
int cudaGetLastError(void) { int e = pending; pending = 0; return e; }
int copyId(void) { return COPY; }
"""

# argv[1]: a directory with libcudart.so.99 (a link to libcudart.so.99.1,
# copy 1, whose soname is libcudart.so.99) and new.so (copy 2). Loads copy
# 1 through the link as a DT_NEEDED would find it, leaves an error pending
# in it, renames copy 2 over its file (a package upgrade), and clears the
# last error as a refused registration does; then, where a file named
# libcudart.so.98 is mapped without the dynamic linker, again.
_REPLACED_CUDART = """
import ctypes, logging, mmap, os, sys
from wcache import _device, _sharedview
d = sys.argv[1]
logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stdout)
lib = ctypes.CDLL(os.path.join(d, "libcudart.so.99"))
assert lib.copyId() == 1
_device._clear_last_error()  # a handle kept while its file is as it was loaded
lib.cudaSetError(801)
os.rename(os.path.join(d, "new.so"), os.path.join(d, "libcudart.so.99.1"))
_device._clear_last_error()
inodes = {line.split()[4] for line in open("/proc/self/maps") if "libcudart.so.99" in line}
print("copies", len(inodes), "pending", lib.cudaGetLastError())
runtimes, unreachable = _device.cudart_runtimes()
print("reached", [(os.path.basename(p), r.copyId()) for p, r in runtimes], unreachable)
with open(os.path.join(d, "libcudart.so.98"), "w+b") as f:
    f.truncate(4096)
    m = mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ)
lib.cudaSetError(801)
_device._clear_last_error()
_device._clear_last_error()
print("pending", lib.cudaGetLastError())
for _ in range(10):
    _device._clear_last_error()
# The references the loaded copy holds: dlclose until RTLD_NOLOAD finds it
# no more (its functions are not called after this).
dl = ctypes.CDLL(None)
dl.dlopen.restype, dl.dlopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_int]
dl.dlclose.argtypes = [ctypes.c_void_p]
refs = 0
while refs < 100:
    h = dl.dlopen(b"libcudart.so.99", os.RTLD_NOLOAD | os.RTLD_LAZY)
    if not h:
        break
    dl.dlclose(h)
    dl.dlclose(h)
    refs += 1
print("references", refs)
"""


def test_a_replaced_cuda_runtime_is_cleared_in_the_copy_loaded(tmp_path):
    """A runtime whose file was replaced on disk since it was loaded (maps
    says " (deleted)"): its pending error is cleared in the copy that is
    loaded, and the new file is never loaded as a second copy (dlopen of
    the path would, and clear that copy's error instead). A libcudart
    mapped without the dynamic linker cannot be reached: it is skipped
    with one WARNING naming it and why, and the others are still cleared.
    Each clearing reuses one handle of the copy, rather than taking one
    more reference to it each time. A real shared object, built here (cc)."""
    import shutil
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (cc) to build a stand-in runtime")
    (tmp_path / "rt.c").write_text(_FAKE_CUDART)
    for copy, out in ((1, "libcudart.so.99.1"), (2, "new.so")):
        subprocess.run([cc, "-shared", "-fPIC", f"-DCOPY={copy}", "-Wl,-soname,libcudart.so.99",
                        "-o", str(tmp_path / out), str(tmp_path / "rt.c")], check=True)
    os.symlink("libcudart.so.99.1", tmp_path / "libcudart.so.99")
    r = subprocess.run([sys.executable, "-c", _REPLACED_CUDART, str(tmp_path)],
                       env=dict(os.environ, PYTHONPATH=PYDIR), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "copies 1 pending 0", lines  # cleared in the loaded copy, no second one
    assert lines[1] == "reached [('libcudart.so.99.1 (deleted)', 1)] []", lines
    warned = [x for x in lines[2:] if x.startswith("wcache: a CUDA error may stay pending in ")]
    assert warned == [f"wcache: a CUDA error may stay pending in {tmp_path}/libcudart.so.98: "
                      f"cannot reach the loaded copy: the dynamic linker loaded no object there "
                      f"(dladdr)"], lines  # once, however many refusals
    assert lines[-2] == "pending 0", lines
    # The runtime's own load and one kept handle, the same before and after
    # its file was replaced (maps then says " (deleted)"): not one per
    # clearing (15), nor one per name it had.
    assert lines[-1] == "references 2", lines


class _Cudart:
    """torch.cuda.cudart() as CudaBackend uses it: each call returns what
    torch's binding does (a pybind enum of cudaError_t: .value, int())."""

    class Error:
        def __init__(self, code):
            self.value = code

        def __int__(self):
            return self.value

    def __init__(self, register=0, unregister=0, raises=None):
        self.codes = {"register": register, "unregister": unregister}
        self.raises = raises
        self.calls = []

    def cudaHostRegister(self, ptr, size, flags):
        self.calls.append(("register", ptr, size, flags))
        if self.raises:
            raise self.raises
        return self.Error(self.codes["register"])

    def cudaHostUnregister(self, ptr):
        self.calls.append(("unregister", ptr))
        return self.Error(self.codes["unregister"])

    def cudaGetErrorString(self, err):
        return {801: "operation not supported", 712: "already mapped",
                713: "not registered", 1: "invalid argument"}.get(int(err), "?")


@pytest.fixture
def fake_cudart(monkeypatch):
    """(install, drained): install(cudart) makes CudaBackend("cuda:0") use
    it; drained lists, per cudaGetLastError call, the runtime it went to
    (two are loaded, as where pip's and a toolkit's are both mapped)."""
    import contextlib
    drained = []

    class Runtime:
        def __init__(self, path):
            self.path = path

        def cudaGetLastError(self):
            drained.append(self.path)
            return 0
    monkeypatch.setattr(_device, "cudart_runtimes", lambda: (
        [(p, Runtime(p)) for p in ("/a/libcudart.so.13", "/b/libcudart-1234abcd.so.12")], []))
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())

    def install(cudart):
        monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
        return _device.CudaBackend("cuda:0")
    return install, drained


def test_a_refused_registration_leaves_no_cuda_error_pending(fake_cudart):
    """torch's binding returns the code and leaves the error pending in the
    runtime (C10_CUDA_ERROR_HANDLED): a refusal, a range someone else
    registered (712) and a failed unregistration each drain it in every
    runtime loaded; a success calls nothing more."""
    install, drained = fake_cudart
    flags = _device.CUDA_HOST_REGISTER_READ_ONLY | _device.CUDA_HOST_REGISTER_PORTABLE
    cudart = _Cudart()
    backend = install(cudart)
    assert backend.register(1 << 20, 1 << 16) is True
    backend.unregister(1 << 20)
    assert cudart.calls == [("register", 1 << 20, 1 << 16, flags), ("unregister", 1 << 20)]
    assert drained == []
    backend = install(_Cudart(register=801))
    with pytest.raises(RegisterRefused, match=r"read-only\): operation not supported \(801\)"):
        backend.register(1 << 20, 1 << 16)
    assert drained == ["/a/libcudart.so.13", "/b/libcudart-1234abcd.so.12"]
    drained.clear()
    assert install(_Cudart(register=712)).register(1 << 20, 1 << 16) is False
    assert len(drained) == 2
    drained.clear()
    with pytest.raises(RuntimeError, match=r"cudaHostUnregister: not registered \(713\)"):
        install(_Cudart(unregister=713)).unregister(1 << 20)
    assert len(drained) == 2
    drained.clear()
    with pytest.raises(RegisterRefused, match="cudaHostRegister: TypeError: no binding"):
        install(_Cudart(raises=TypeError("no binding"))).register(1 << 20, 1 << 16)
    assert len(drained) == 2


def test_a_file_stat_names_differently_gets_its_view(odd_model, monkeypatch):
    """fstat(2) can name the mapped file by another device than
    /proc/self/maps does (overlayfs before Linux 6.8, e.g. a container's
    /tmp; btrfs subvolumes): the view's own line in /proc/self/maps then
    decides. The same file is registered; where that line names another
    file, the view is unmapped and the load staged, saying why."""
    from wcache import _sharedview
    path, raw = odd_model
    model = wcache.open_file(path)
    fstat_names_by_another_device(monkeypatch, path)
    backend, seen = _recording_backend()
    out = to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                    backend=backend, mode="register", small=0, max_batch=4096)
    _check_exact(out, raw)
    assert _device.last_load[0].path == "register"
    assert seen and all(perms == "r--s" and os.path.samefile(where, path)
                        for perms, where in seen), seen
    monkeypatch.setattr(_sharedview, "mapped_identity", lambda addr: ((0, 0), 0))
    # A model attached anew: its file is opened and checked anew.
    _stages_leaving_no_view(wcache.open_file(path), path, raw, "no longer the mapped file")


def test_a_file_stat_names_differently_is_checked_once_per_copy(odd_model, monkeypatch):
    """Where fstat names the file by another device, a view's own line in
    /proc/self/maps is read to check it: for the mapping's first view, not
    for every view (each read parses every line of maps; a model has one
    view per 256 MiB) nor for every copy of the model (a get_tensor loop
    is one copy per tensor). The other views are mapped through the
    descriptor that was checked, so they are the same file. Another
    mapping of the file (the model opened again) is opened and checked
    again."""
    from wcache import _sharedview
    path, raw = odd_model
    model = wcache.open_file(path)
    fstat_names_by_another_device(monkeypatch, path)
    checks, opens = [], []
    real_identity, real_open = _sharedview.mapped_identity, os.open

    def identity(addr):
        checks.append(addr)
        return real_identity(addr)

    def counting_open(name, *args, **kwargs):
        if os.fsdecode(name) == os.path.realpath(path):
            opens.append(name)
        return real_open(name, *args, **kwargs)
    monkeypatch.setattr(_sharedview, "mapped_identity", identity)
    monkeypatch.setattr(_sharedview.os, "open", counting_open)
    again = wcache.open_file(path)
    for copy, (m, mappings) in enumerate([(model, 1), (model, 1), (again, 2)]):
        out = to_device(m, m.offset_keys(), torch.device("cpu"), m.torch,
                        backend=CpuBackend(pins_long_term=True), mode="register", small=0,
                        max_batch=4096)
        _check_exact(out, raw)
        engine, p = _device.last_load
        assert engine.path == "register" and len(p.ranges) > 10, (engine.why, p.ranges)
        assert (len(checks), len(opens)) == (mappings, mappings), \
            (copy, len(p.ranges), checks, opens)


def _stages_leaving_no_view(model, path, raw, why):
    """Loads model onto the CPU backend in auto mode: the engine stages,
    its reason says why, and no shared view of path is left mapped."""
    out = to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                    backend=CpuBackend(pins_long_term=True), mode="auto", small=0,
                    max_batch=4096)
    _check_exact(out, raw)
    engine = _device.last_load[0]
    assert engine.path == "staging" and why in engine.why, engine.why
    with open("/proc/self/maps") as f:
        views = [line for line in f if " r--s " in line and line.rstrip().endswith(
            os.path.realpath(path))]
    assert views == [], "a view refused or not checked is unmapped"


def test_view_whose_maps_line_cannot_be_read_stages(odd_model, monkeypatch):
    """Where fstat names the file by another device and /proc/self/maps
    cannot be read to check the new view (EMFILE, ENOMEM), the engine
    stages, saying why, and the view is unmapped: the OSError neither
    escapes the load nor leaves the mapping behind."""
    from wcache import _sharedview
    path, raw = odd_model
    model = wcache.open_file(path)
    fstat_names_by_another_device(monkeypatch, path)

    def unreadable(addr):
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
    monkeypatch.setattr(_sharedview, "mapped_identity", unreadable)
    _stages_leaving_no_view(model, path, raw, "cannot read /proc/self/maps")


def test_view_whose_file_cannot_be_stat_stages(odd_model, monkeypatch):
    """fstat of the file opened for a view failing (EIO) is no shared view
    to register: the engine stages, saying why, where the OSError made the
    batched load fail and copy tensor by tensor."""
    path, raw = odd_model
    model = wcache.open_file(path)
    real_fstat = os.fstat

    def fstat(fd):
        if os.readlink(f"/proc/self/fd/{fd}") == os.path.realpath(path):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_fstat(fd)
    monkeypatch.setattr(os, "fstat", fstat)
    _stages_leaving_no_view(model, path, raw, f"cannot stat {os.path.realpath(path)}: "
                                              f"{os.strerror(errno.EIO)}")


def test_a_failing_close_of_the_model_still_ends_the_copy(odd_model, monkeypatch):
    """close(2) of the descriptor the shared views were mapped through
    failing (a FUSE flush error; Linux releases the descriptor anyway)
    neither escapes the load nor skips what must follow a copy: the stream
    is synchronised, every range unregistered, every view unmapped. Closed
    first, its error once skipped all three, leaving host memory
    registered and copies in flight into a buffer the fallback dropped.
    An engine given no MappingFiles closes its own at the end of the copy;
    to_device's is closed when the model's handle goes, quietly too."""
    path, raw = odd_model
    model = wcache.open_file(path)
    real_close = os.close
    failed = []

    def close(fd):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = None
        real_close(fd)
        if target == os.path.realpath(path):
            failed.append(fd)
            raise OSError(errno.EIO, os.strerror(errno.EIO))
    monkeypatch.setattr(os, "close", close)
    backend = CpuBackend(pins_long_term=True)
    p = plan(_entries(model), max_batch=4096)
    buffer = backend.alloc(p.total)
    engine = _device.Engine(backend, mode="register")
    engine.copy_plan(p, buffer)
    monkeypatch.setattr(os, "close", real_close)
    out = {name: buffer[off:off + len(raw[name])] for name, off in p.places.items()
           if off is not None}
    _check_exact(out, {name: raw[name] for name in out})
    assert failed, "the model's descriptor was closed (and failed)"
    assert engine.path == "register" and len(p.ranges) > 1, engine.why
    assert any(c[0] == "sync" for c in backend.calls), backend.calls
    assert backend.registered == {}, "every range unregistered"
    with open("/proc/self/maps") as f:
        views = [line for line in f if " r--s " in line and line.rstrip().endswith(
            os.path.realpath(path))]
    assert views == [], "every view unmapped"
    failed.clear()
    out = to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                    backend=CpuBackend(pins_long_term=True), mode="register", small=0,
                    max_batch=4096)
    _check_exact(out, raw)
    assert not failed, "kept for the next copy of the model"
    monkeypatch.setattr(os, "close", close)
    model.close()
    del model
    monkeypatch.setattr(os, "close", real_close)
    assert failed, "closed with the model's handle (and failed, quietly)"
