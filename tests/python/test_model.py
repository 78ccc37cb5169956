"""The Model API over wc_open_file: names, metadata, views, lifetime, and
writes that must fail (numpy) or stay private (torch)."""
import errno
import gc
import os
import subprocess
import textwrap

import numpy as np
import pytest
import torch

import wcache
from wcache._lib import MissingTensor
from pyhelpers import (PYDIR, cow_tensor, file_mappings, fstat_names_by_another_device,
                       other_thread_before, run_forked, run_python, write_safetensors)


@pytest.fixture
def f32_model(tmp_path):
    a = np.arange(12, dtype="<f4").reshape(3, 4)
    b = np.array([1, -2, 3], dtype="<i8")
    path = tmp_path / "f32.safetensors"
    write_safetensors(path, [("b.bias", "I64", (3,), b.tobytes()),
                             ("a.weight", "F32", (3, 4), a.tobytes())],
                      metadata={"format": "pt", "note": "héllo"})
    return str(path), {"a.weight": a, "b.bias": b}


def test_names_metadata_and_protocols(f32_model):
    path, arrays = f32_model
    with wcache.open_file(path) as m:
        assert m.keys() == ["a.weight", "b.bias"]          # byte order of names
        assert list(m) == m.keys()
        assert len(m) == 2
        assert "a.weight" in m and "nope" not in m and 3 not in m
        assert m.metadata() == {"format": "pt", "note": "héllo"}
        assert m.generation == 0
        assert m.source == "file"
        assert m.name == path
        info = m.info("a.weight")
        assert (info.name, info.dtype, info.shape, info.nbytes) == ("a.weight", "F32", (3, 4), 48)
        with pytest.raises(KeyError, match="nope"):
            m.numpy("nope")
        sd = m.state_dict("np")
        assert set(sd) == set(arrays)
        for k, v in arrays.items():
            assert np.array_equal(sd[k], v)
    assert m.closed
    with pytest.raises(ValueError, match="closed"):
        m.keys()
    with pytest.raises(ValueError, match="closed"):
        m.numpy("a.weight")


def test_numpy_writes_refused(f32_model):
    path, arrays = f32_model
    m = wcache.open_file(path)
    a = m.numpy("a.weight")
    with pytest.raises(ValueError, match="read-only"):
        a[0, 0] = 5
    with pytest.raises(ValueError):
        a += 1
    with pytest.raises(ValueError):
        a.flags.writeable = True
    with pytest.raises(ValueError):
        np.add(a, 1, out=a)
    c = a.copy()
    c[0, 0] = 5                      # a copy is writable
    assert a[0, 0] == 0 and c[0, 0] == 5
    assert np.array_equal(m.numpy("a.weight"), arrays["a.weight"])


# A process that writes through torch.from_numpy() of one of wcache's
# read-only numpy arrays (numpy's read-only flag is not torch's), then
# prints what it wrote. {path} and {how} are formatted in.
WRITE_THROUGH_NUMPY = textwrap.dedent("""
    import warnings, torch, wcache, wcache.numpy
    warnings.simplefilter("ignore", UserWarning)  # torch: "The given NumPy array is not writable"
    path, how = {path!r}, {how!r}
    if how == "load_file":
        a = wcache.numpy.load_file(path)["a.weight"]
    elif how == "safe_open":
        with wcache.safe_open(path, framework="np") as f:
            a = f.get_tensor("a.weight")
    elif how == "numpy":
        a = wcache.open_file(path).numpy("a.weight")
    elif how == "raw":
        a = wcache.open_file(path).raw("a.weight")
    else:  # attached through wcached, path is the model's name
        m = wcache.connect().attach(path)
        a = m.raw(m.keys()[0])
    assert not a.flags.writeable
    t = torch.from_numpy(a)
    t.add_(1)
    print("wrote", a.reshape(-1).view("u1")[:4].tobytes().hex())
""")


def _write_through_numpy(path, how):
    r = run_python(WRITE_THROUGH_NUMPY.format(path=path, how=how))
    assert r.returncode == 0 and "wrote" in r.stdout, (r.returncode, r.stdout, r.stderr)
    return bytes.fromhex(r.stdout.split()[-1])


@pytest.mark.parametrize("how", ["load_file", "safe_open", "numpy", "raw"])
def test_a_write_through_another_alias_of_a_numpy_view_stays_private(f32_model, no_daemon,
                                                                      how):
    """torch.from_numpy() of a numpy array wcache made, then an in-place
    op: numpy's read-only flag does not bind torch, and the write reaches
    the memory. It lands in a private copy of the page (the arrays are on
    the copy-on-write memory torch tensors use), never in the file or in
    another process reading the same model, which goes on reading the
    original bytes. Before, the arrays were on the PROT_READ mapping and
    the writer died of SIGSEGV (review rev140 #1)."""
    path, arrays = f32_model
    before = open(path, "rb").read()
    with wcache.open_file(path) as m:
        reader = m.numpy("a.weight")  # mapped (and read) before the write
        assert np.array_equal(reader, arrays["a.weight"])
        wrote = _write_through_numpy(path, how)
        assert wrote != arrays["a.weight"].tobytes()[:4], "the writer saw its own write"
        assert np.array_equal(reader, arrays["a.weight"])
    with wcache.open_file(path) as m:
        assert np.array_equal(m.numpy("a.weight"), arrays["a.weight"])
    assert open(path, "rb").read() == before


def test_a_write_through_an_alias_of_an_attached_view_stays_private(daemon, model_path):
    """The same for a model attached through wcached: another process
    attached to it, and every later attach, read the original bytes."""
    with wcache.connect(daemon.socket) as c:
        m = c.attach("small")
    first = m.keys()[0]
    original = m.raw(first).copy()
    reader = m.raw(first)
    wrote = _write_through_numpy("small", "attach")
    assert wrote[0] == (int(original[0]) + 1) % 256
    assert np.array_equal(reader, original)
    with wcache.connect(daemon.socket) as c:
        assert np.array_equal(c.attach("small").raw(first), original)


def _smaps_of(addr):
    """{field: kB} of the /proc/self/smaps entry holding addr, and its perms."""
    fields, perms, inside = {}, None, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                inside = lo <= addr < hi
                if inside:
                    perms = head[1]
            elif inside and head[0].endswith(":") and len(head) >= 2 and head[1].isdigit():
                fields[head[0][:-1]] = int(head[1])
    return fields, perms


def test_numpy_views_stay_zero_copy_on_copy_on_write_memory(tmp_path):
    """numpy views are on the copy-on-write memory (rw-p) where libwcache
    can make it, yet reading every byte of them copies nothing: the pages
    mapped are the file's page cache (no anonymous memory), as the README
    promises (zero-copy, the PSS of a shared mapping)."""
    import mmap
    import wcache._lib as L
    data = np.arange(64 * mmap.PAGESIZE // 4, dtype="<f4")
    path = tmp_path / "big.safetensors"
    write_safetensors(path, [("w", "F32", data.shape, data.tobytes())])
    with wcache.open_file(path) as m:
        a = m.numpy("w")
        assert float(a.sum(dtype=np.float64)) == float(data.sum(dtype=np.float64))
        assert int(m.raw("w").sum(dtype=np.uint64)) == int(data.view("u1").sum(dtype=np.uint64))
        fields, perms = _smaps_of(a.ctypes.data)
        if getattr(L.lib(), "wc_model_cow", None) is not None:
            assert perms == "rw-p", perms
        assert fields["Rss"] >= 64 * mmap.PAGESIZE // 1024, fields
        assert fields["Anonymous"] == 0, fields  # (Private_Dirty: the file written just now)


def test_views_outlive_close(f32_model):
    path, arrays = f32_model
    m = wcache.open_file(path)
    a = m.numpy("a.weight")
    part = a[1:, 2:]                 # a view of a view
    t = m.torch("b.bias")
    raw = m.raw("a.weight")
    base = file_mappings(path)
    assert base >= 1
    m.close()
    del m
    gc.collect()
    # the mapping stays while views exist, and they read the right bytes
    assert file_mappings(path) >= 1
    assert np.array_equal(a, arrays["a.weight"])
    assert np.array_equal(part, arrays["a.weight"][1:, 2:])
    assert torch.equal(t, torch.from_numpy(arrays["b.bias"]))
    assert raw.tobytes() == arrays["a.weight"].tobytes()
    del a, raw
    gc.collect()
    assert np.array_equal(part, arrays["a.weight"][1:, 2:])
    del part, t
    gc.collect()
    # the last view gone: libwcache released the model and unmapped it
    assert file_mappings(path) == 0


def test_mapping_released_without_views(f32_model):
    path, _ = f32_model
    m = wcache.open_file(path)
    assert file_mappings(path) >= 1
    m.close()
    gc.collect()
    assert file_mappings(path) == 0


# check(path, mode) writes through torch tensors of the model at path with
# WCACHE_TORCH_COW=mode (a RuntimeWarning an error, but in copy mode).
TORCH_WRITES = textwrap.dedent("""
    import os, warnings, torch, numpy as np, wcache

    def check(path, mode):
        os.environ["WCACHE_TORCH_COW"] = mode
        warnings.simplefilter("ignore" if mode == "copy" else "error", RuntimeWarning)
        before = open(path, "rb").read()
        for table in (False, True):
            m = wcache.open_file(path)
            if table:
                m.keys()               # views become slices of one array
            t = m.torch("a.weight")
            orig = t.clone()
            t.add_(1)                  # in-place ops
            t[0, 0] = 100
            t.copy_(t * 2)
            torch.nn.init.zeros_(m.torch("b.bias"))
            torch.add(t, 1, out=t)
            assert open(path, "rb").read() == before, "the file changed"
            other = wcache.open_file(path)  # another mapping of the file sees no change
            assert torch.equal(other.torch("a.weight"), orig)
            assert np.array_equal(other.numpy("a.weight"), orig.numpy())
            c = orig.clone(); c.add_(1)    # clone is independent
            assert torch.equal(other.torch("a.weight"), orig)
""")
_TORCH_MODES = ["auto", "remap", "copy", "c"]


@pytest.fixture(scope="module")
def torch_writes(tmp_path_factory):
    """run_forked's results and output of TORCH_WRITES in every mode, run
    once for the module's tests (they only read the model)."""
    path = str(tmp_path_factory.mktemp("writes") / "f32.safetensors")
    write_safetensors(path, [("b.bias", "I64", (3,), np.array([1, -2, 3], "<i8").tobytes()),
                             ("a.weight", "F32", (3, 4), np.arange(12, dtype="<f4").tobytes())],
                      metadata={"format": "pt", "note": "héllo"})  # f32_model's file
    return run_forked(TORCH_WRITES, [(mode, (path, mode)) for mode in _TORCH_MODES],
                      env={"WCACHE_TORCH_COW": None})


@pytest.mark.parametrize("mode", _TORCH_MODES)
def test_torch_writes_never_reach_the_file(torch_writes, mode):
    """torch has no read-only tensors: writes must neither crash the process
    (the mapping is PROT_READ) nor reach the file or other mappings. Run in
    a process of its own (pyhelpers.run_forked), so a regression shows as a
    failure, not a dead pytest."""
    import wcache._lib as L
    if mode == "c" and getattr(L.lib(), "wc_model_cow", None) is None:
        pytest.skip("libwcache has no wc_model_cow()")
    results, output = torch_writes
    status = results.get(mode, (None, None))[0]
    assert status == 0, f"{mode}: exit status {status}\n{output}"


@pytest.mark.parametrize("mode", ["auto", "remap"])
def test_first_torch_from_two_threads_at_once(f32_model, monkeypatch, mode):
    """Two threads taking their first torch tensor of one model at once get
    views of the same copy-on-write memory, so a write through either is in
    what later torch(name) calls return (as the module comment of
    wcache/_torch.py promises). Another thread's whole torch(name) runs
    before each line of wcache._torch.tensor in turn (a line trace).
    Before, each thread made the model's torch state: with a private
    mapping of the file (way 2: WCACHE_TORCH_COW=remap, or a model wcached
    maps shared), the loser's tensor was on a mapping of its own, and its
    writes were lost (remap fails at line 5)."""
    from wcache import _torch
    monkeypatch.setenv("WCACHE_TORCH_COW", mode)
    path, arrays = f32_model
    k = 0
    while True:
        model = wcache.open_file(path)
        got = []
        errors, other_errors, ran = other_thread_before(
            _torch.tensor.__code__, k, lambda: got.append(model.torch("a.weight")),
            lambda: got.append(model.torch("a.weight")))
        assert not errors and not other_errors, (k, errors, other_errors)
        for j, t in enumerate(got):
            t[0, j] = 100 + j
        later = model.torch("a.weight")
        for j in range(len(got)):
            assert later[0, j].item() == 100 + j, \
                f"torch() in another thread before line {k} of tensor(): a write lost"
        model.close()
        if not ran:
            break
        k += 1
    assert k > 5


# What a Model keeps between calls; close() drops all of it.
_KEPT = ("_table", "_names", "_span", "_region", "_torch_state")


def _calls_that_keep_state():
    """(name, call on a model, the function of it that stores state on the
    model): each call a test races with close()."""
    from wcache import _torch
    from wcache.model import Model
    return {
        "keys": (lambda m: m.keys(), Model._tab),
        "info": (lambda m: m.info("a.weight"), Model.info),
        "numpy": (lambda m: (m.keys(), m.numpy("a.weight"))[1], Model._slice),
        "raw_region": (lambda m: m._raw_region(), Model._raw_region),
        "torch": (lambda m: m.torch("a.weight"), _torch._state_of),
        "torch_c_region": (lambda m: (m.keys(), m.torch("a.weight"))[1], _torch._State._via_c),
    }


@pytest.mark.parametrize("call", ["keys", "info", "numpy", "raw_region", "torch",
                                  "torch_c_region"])
def test_a_model_closed_mid_call_keeps_nothing(f32_model, call):
    """A call on a model that another thread closes meanwhile raises
    ValueError "closed" or returns its result, and once close() and the
    call have returned (and the result is dropped) the closed model holds
    nothing: no table, region, infos or torch state, and no mapping of the
    file is left while the closed Model object lives. Another thread's
    close() runs before each bytecode of the function that stores that
    state in turn. Before, a call that had made its table (Model._tab), its
    region (_slice, _raw_region), a TensorInfo (info) or its torch state
    (wcache._torch._state_of) stored it after close() had cleared the
    model, so the closed model kept the table, or kept the mapping (and,
    attached, the daemon's model) alive through the region or the torch
    state's writable view; and close() left _span behind."""
    path, arrays = f32_model
    fn, code = _calls_that_keep_state()[call]
    k = 0
    while True:
        model = wcache.open_file(path)
        got = []
        errors, other_errors, ran = other_thread_before(
            code.__code__, k, lambda: got.append(fn(model)), model.close, opcodes=True)
        assert not other_errors, (k, other_errors)
        assert all(isinstance(e, ValueError) and "closed" in str(e) for e in errors), \
            f"{call} with close() before bytecode {k} of {code.__qualname__}: {errors!r}"
        if call in ("numpy", "torch", "torch_c_region") and got:
            assert np.array_equal(np.asarray(got[0]), arrays["a.weight"])
        model.close()  # once k is past the call's last bytecode, close() ran after it
        del got, errors
        if file_mappings(path):
            gc.collect()  # only then: it takes 60 ms or more with torch loaded
        left = [a for a in _KEPT if getattr(model, a) is not None]
        assert not left and not model._infos, \
            f"{call} with close() before bytecode {k} of {code.__qualname__}: the closed " \
            f"model keeps {left or 'infos'}"
        assert file_mappings(path) == 0, \
            f"{call} with close() before bytecode {k} of {code.__qualname__}: the closed " \
            f"model keeps the mapping"
        if not ran:
            break
        k += 1
    assert k > 10


def test_torch_is_zero_copy_and_shares_page_cache(f32_model):
    """The torch tensor's memory is a file mapping (shared page cache), not
    anonymous memory: its address lies in a mapping of the model's inode."""
    path, _ = f32_model
    st = os.stat(path)
    with wcache.open_file(path) as m:
        t = m.torch("a.weight")
        addr = t.data_ptr()
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                if lo <= addr < hi:
                    assert int(parts[4]) == st.st_ino, line
                    break
            else:
                pytest.fail("tensor memory is in no mapping")


def test_each_tensor_has_its_own_storage(f32_model, tmp_path):
    """Tensors are slices of one big array internally, but each has a
    storage of its own bytes: saving one tensor saves only it."""
    path, arrays = f32_model
    with wcache.open_file(path) as m:
        m.keys()
        t = m.torch("b.bias")
        # untyped_storage(): torch 2 warns that storage() (a TypedStorage) is deprecated
        storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
        assert storage.nbytes() == m.info("b.bias").nbytes
        torch.save(t, tmp_path / "one.pt")
        assert torch.equal(torch.load(tmp_path / "one.pt", weights_only=True),
                           torch.from_numpy(arrays["b.bias"]))
        a = m.numpy("a.weight")
        assert a.base is not None and a.nbytes == 48


def test_copy_mode_warns_when_asked_for_views(f32_model, monkeypatch):
    """When no copy-on-write mapping can be made, torch() copies and says so."""
    import wcache._torch as T
    path, arrays = f32_model
    monkeypatch.setenv("WCACHE_TORCH_COW", "remap")
    monkeypatch.setattr(T._Remapper, "_map", staticmethod(lambda p, d, i: "no access"))
    with wcache.open_file(path) as m:
        with pytest.warns(RuntimeWarning, match="private copies.*no access"):
            t = m.torch("a.weight")
        assert torch.equal(t, torch.from_numpy(arrays["a.weight"]))


def test_torch_from_renamed_over_file_still_right(tmp_path):
    """After the path is renamed over, the remapper must not map the new
    file: the tensor still has the old contents."""
    path = tmp_path / "m.safetensors"
    old = np.arange(4, dtype="<f4")
    write_safetensors(path, [("w", "F32", (4,), old.tobytes())])
    with wcache.open_file(path) as m:
        new = tmp_path / "new.safetensors"
        write_safetensors(new, [("w", "F32", (4,), (old + 10).tobytes())])
        os.replace(new, path)
        with _nowarn_unless_copy():
            t = m.torch("w")
        assert torch.equal(t, torch.from_numpy(old))



def test_torch_remap_of_a_file_stat_names_differently(f32_model, monkeypatch):
    """fstat(2) can name the mapped file by another device than
    /proc/self/maps does (overlayfs before Linux 6.8, e.g. a container's
    /tmp; btrfs subvolumes): the remap (way 2) then asks the new mapping's
    own line in /proc/self/maps, as the device engine's shared view does.
    The same file gives copy-on-write views of it, without a warning; where
    that line names another file, the mapping is unmapped and torch()
    copies, saying why. Before, the remap refused the very file as
    "renamed over" and torch() copied."""
    from wcache import _sharedview
    path, arrays = f32_model
    before = open(path, "rb").read()
    fstat_names_by_another_device(monkeypatch, path)
    monkeypatch.setenv("WCACHE_TORCH_COW", "remap")

    def writable_mappings():
        with open("/proc/self/maps") as f:
            return [line for line in f if " rw-p " in line
                    and line.rstrip().endswith(os.path.realpath(path))]
    with monkeypatch.context() as other_file:
        other_file.setattr(_sharedview, "mapped_identity", lambda addr: ((0, 0), 0))
        with wcache.open_file(path) as m:
            with pytest.warns(RuntimeWarning, match="private copies.*no longer the mapped file"):
                t = m.torch("a.weight")
            assert torch.equal(t, torch.from_numpy(arrays["a.weight"]))
            assert writable_mappings() == [], "the refused mapping is unmapped"
    with wcache.open_file(path) as m:
        t = cow_tensor(m, "a.weight", path)
        t.add_(1)
        assert torch.equal(m.torch("a.weight"), torch.from_numpy(arrays["a.weight"] + 1))
    assert open(path, "rb").read() == before


# The remap and the device engine's shared view of a model in argv[1], a
# new directory on a filesystem (argv[2]: btrfs, a subvolume; overlay, the
# merged directory) where fstat and /proc/self/maps may name a file by two
# devices (test_remap_on_a_real_filesystem). Exit status 77: they name it
# alike here (overlayfs since Linux 6.8).
REAL_FS_REMAP = textwrap.dedent("""
    import json, os, subprocess, sys, warnings, numpy as np, torch, wcache
    from wcache import _sharedview
    from pyhelpers import cow_tensor, mapping_at, write_safetensors

    os.environ["WCACHE_TORCH_COW"] = "remap"
    sub, fs = sys.argv[1:3]
    if fs == "btrfs":
        # two shards with one inode number: the subvolume's first file, and
        # the first of a subvolume nested in it, which maps names by the
        # same device
        x, y = np.zeros(256, "<f4"), np.ones(256, "<f4")
        write_safetensors(os.path.join(sub, "a.safetensors"), [("x", "F32", (256,), x.tobytes())])
        subprocess.run(["btrfs", "-q", "subvolume", "create", os.path.join(sub, "s2")], check=True)
        write_safetensors(os.path.join(sub, "s2", "b.safetensors"),
                          [("y", "F32", (256,), y.tobytes())])
        os.symlink("s2/b.safetensors", os.path.join(sub, "b.safetensors"))
        assert os.stat(os.path.join(sub, "a.safetensors")).st_ino == \\
            os.stat(os.path.join(sub, "b.safetensors")).st_ino
        with open(os.path.join(sub, "model.safetensors.index.json"), "w") as f:
            json.dump({"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}}, f)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            sharded = wcache.open_file(os.path.join(sub, "model.safetensors.index.json"))
            assert torch.equal(sharded.torch("x"), torch.from_numpy(x))
            assert torch.equal(sharded.torch("y"), torch.from_numpy(y)), "y is x's bytes"

    path = os.path.join(sub, "m.safetensors")
    w = np.arange(4096, dtype="<f4")
    write_safetensors(path, [("w", "F32", (4096,), w.tobytes())])
    m = wcache.open_file(path)
    data = m._tab().info(0).data
    entry = [e for e in _sharedview.file_mappings() if e[0] <= data < e[1]][0]
    st = os.stat(path)
    if entry[3:5] == ((os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino):
        print("fstat and /proc/self/maps name the file alike:", entry[3:5])
        sys.exit(77)
    t = cow_tensor(m, "w", path)
    t.add_(1)
    assert torch.equal(m.torch("w"), torch.from_numpy(w + 1))
    view = _sharedview.shared_view(entry[0], entry[1])
    assert view.own and mapping_at(view.addr)[0] == "r--s", mapping_at(view.addr)
    view.close()

    other = wcache.open_file(path)
    new = os.path.join(sub, "new.safetensors")
    write_safetensors(new, [("w", "F32", (4096,), (w + 10).tobytes())])
    subprocess.run(["mount", "--bind", new, path], check=True)  # path names another file
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        t = other.torch("w")
    assert [str(x.message) for x in seen if "no longer the mapped file" in str(x.message)], \
        [str(x.message) for x in seen]
    assert torch.equal(t, torch.from_numpy(w))
    try:
        _sharedview.shared_view(entry[0], entry[1])
        raise AssertionError("a shared view of another file")
    except _sharedview.Unavailable as e:
        assert "no longer the mapped file" in str(e), e
    subprocess.run(["umount", path], check=True)
""")

# Runs "$@" DIR FS in a mount namespace of its own, DIR a new directory on
# a filesystem of type $2 made in $1: btrfs (a subvolume on the image $1/img)
# or overlay (the merged directory); exit status 77 where none can be made.
_MOUNT_SETUP = """
d=$1; fs=$2; shift 2
mount --make-rprivate / || exit 77
mkdir "$d/mnt" || exit 1
if [ "$fs" = btrfs ]; then
    mkfs.btrfs -q "$d/img" >/dev/null 2>&1 || exit 77
    mount -o loop "$d/img" "$d/mnt" || exit 77
    btrfs -q subvolume create "$d/mnt/sub" >/dev/null || exit 1
    dir=$d/mnt/sub
else
    mkdir "$d/lower" "$d/upper" "$d/work" || exit 1
    mount -t overlay overlay -o "lowerdir=$d/lower,upperdir=$d/upper,workdir=$d/work" \\
        "$d/mnt" || exit 77
    dir=$d/mnt
fi
"$@" "$dir" "$fs"
rc=$?
umount "$d/mnt"
exit $rc
"""


@pytest.mark.parametrize("fs", ["btrfs", "overlay"])
def test_remap_on_a_real_filesystem(tmp_path, fs):
    """fstat names a file in a btrfs subvolume by the subvolume's device
    and /proc/self/maps by the superblock's (any Linux), and one in an
    overlayfs by the overlay's device and the upper or lower file's (before
    Linux 6.8): the remap and the device engine's shared view both make
    their mapping of the very file, and refuse the file a bind mount puts
    at its path. On btrfs the remap also tells apart two shards of one
    model that maps names alike (one in a nested subvolume, with the same
    inode number). Needs root (mount(8) in a mount namespace of its own);
    btrfs also a loop device and btrfs-progs. Skips without them, and where
    fstat and maps name the file alike (overlayfs since 6.8)."""
    import shutil
    if os.geteuid() != 0:
        pytest.skip("mounting a filesystem needs root")
    tools = ("unshare", "mkfs.btrfs", "btrfs") if fs == "btrfs" else ("unshare",)
    missing = [c for c in tools if shutil.which(c) is None]
    if missing:
        pytest.skip(f"no {', '.join(missing)}")
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("no mount namespace of our own (unshare -m)")
    if fs == "btrfs":
        with open(tmp_path / "img", "wb") as f:
            f.truncate(128 << 20)  # sparse; mkfs.btrfs wants 114 MiB
    here = os.path.dirname(os.path.abspath(__file__))
    r = run_python(REAL_FS_REMAP, env={"PYTHONPATH": f"{PYDIR}{os.pathsep}{here}"},
                   wrap=("unshare", "-m", "sh", "-c", _MOUNT_SETUP, "sh", str(tmp_path), fs))
    if r.returncode == 77:
        pytest.skip(f"no {fs} where fstat and maps disagree here: {r.stdout}{r.stderr}")
    assert r.returncode == 0, r.stdout + r.stderr


class _nowarn_unless_copy:
    """Context manager that tolerates the copy warning (the old inode can no
    longer be reopened by path) but nothing else."""

    def __enter__(self):
        import warnings
        self._cm = warnings.catch_warnings(record=True)
        self.records = self._cm.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self._cm.__exit__(*exc)
        for r in self.records:
            assert issubclass(r.category, RuntimeWarning) and "private copies" in str(r.message)


def test_open_file_errors(tmp_path):
    with pytest.raises(wcache.WcacheError) as e:
        wcache.open_file(tmp_path / "missing.safetensors")
    assert "missing.safetensors" in str(e.value)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    with pytest.raises(wcache.WcacheError) as e:
        wcache.open_file(bad)
    assert "bad.safetensors" in str(e.value)
    assert e.value.errno > 0


def test_open_file_of_a_missing_path_is_a_file_not_found_error(tmp_path, no_daemon):
    """open_file() of a path that does not exist raised a plain WcacheError,
    which ``except FileNotFoundError`` missed, while safe_open raised
    NoSuchFile for the same path (review rev140 #5). Now NoSuchFile as
    well (a FileNotFoundError, errno ENOENT, the path as its filename,
    libwcache's message naming it); a directory with no model in it
    CannotOpenFile (a FileNotFoundError too)."""
    missing = tmp_path / "missing.safetensors"
    with pytest.raises(FileNotFoundError) as e:
        wcache.open_file(missing)
    assert isinstance(e.value, wcache.NoSuchFile) and isinstance(e.value, wcache.WcacheError)
    assert e.value.errno == errno.ENOENT and e.value.filename == str(missing)
    assert str(missing) in str(e.value)
    with pytest.raises(wcache.NoSuchFile):
        wcache.safe_open(missing, framework="np")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError) as e:
        wcache.open_file(empty)
    assert isinstance(e.value, wcache.CannotOpenFile) and e.value.errno == errno.ENOENT
    assert "no model found" in str(e.value)


@pytest.mark.parametrize("mode", ["auto", "remap", "copy"])
def test_tensors_of_more_dimensions_than_numpy_allows(tmp_path, no_daemon, monkeypatch, mode):
    """A tensor of 33 dimensions (the format allows up to 64): numpy()
    and safe_open's "np" arrays raised numpy's bare ValueError ("maximum
    supported dimension for an ndarray is 32, found 33"), naming neither
    model nor tensor, and so did torch() (made through numpy), although
    torch has such tensors and safe_open's "pt" made them (review rev140
    #6). Now numpy's refusal is one line naming the model, the tensor and
    the limit, and torch() gives the tensor, on the same memory as the
    others, in every WCACHE_TORCH_COW mode."""
    import warnings
    from wcache import _table
    NUMPY_MAX_DIMS = getattr(_table, "NUMPY_MAX_DIMS", 32)
    monkeypatch.setenv("WCACHE_TORCH_COW", mode)
    shape = (1,) * NUMPY_MAX_DIMS + (2, 3)
    data = np.arange(6, dtype="<f4")
    path = tmp_path / "dims.safetensors"
    write_safetensors(path, [("deep", "F32", shape, data.tobytes()),
                             ("flat", "F32", (6,), data.tobytes())])
    want = torch.from_numpy(data).reshape(shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # copy mode says it copies
        with wcache.open_file(path) as m:
            with pytest.raises(ValueError) as e:
                m.numpy("deep")
            text = str(e.value)
            assert "\n" not in text and str(path) in text and "'deep'" in text, text
            assert f"{len(shape)} dimensions" in text and f"numpy's limit of {NUMPY_MAX_DIMS}" \
                in text, text
            assert m.raw("deep").tobytes() == data.tobytes()
            t = m.torch("deep")
            assert t.shape == shape and torch.equal(t, want)
            t.add_(1)  # copy-on-write (a copy in copy mode): the file keeps its bytes
            assert torch.equal(m.torch("flat"), torch.from_numpy(data))
        with wcache.safe_open(path, framework="np") as f:
            with pytest.raises(ValueError, match="'deep' has .* more than numpy's limit"):
                f.get_tensor("deep")
            with pytest.raises(ValueError, match="'deep' has .* more than numpy's limit"):
                f.get_tensors()
            assert np.array_equal(f.get_tensor("flat"), data)
        with wcache.safe_open(path, framework="pt") as f:
            assert torch.equal(f.get_tensor("deep"), want)
    assert open(path, "rb").read().endswith(data.tobytes() * 2)


def test_nul_in_tensor_names_and_paths(f32_model, no_daemon):
    """C strings end at a NUL: a name or a path holding one must not find
    or open what comes before it. A tensor name is missing (no file has
    such a name: the parser refuses it); a path is a ValueError, as
    Python's open() raises."""
    path, arrays = f32_model
    with wcache.open_file(path) as m:  # info() before the table is read: wc_model_find
        assert "a.weight\0junk" not in m
        with pytest.raises(KeyError):
            m.info("a.weight\0junk")
        with pytest.raises(MissingTensor):
            m.numpy("a.weight\0junk")
        assert "a.weight" in m
    with wcache.safe_open(path, framework="np") as f:
        with pytest.raises(MissingTensor):
            f.get_slice("a.weight\0junk")
        with pytest.raises(MissingTensor):
            f.get_tensor("a.weight\0junk")
    for bad in (path + "\0junk", os.fsencode(path) + b"\0junk"):
        with pytest.raises(ValueError, match="null"):
            wcache.open_file(bad)
    with pytest.raises(ValueError, match="null"):
        wcache.safe_open(path + "\0junk", framework="np")
