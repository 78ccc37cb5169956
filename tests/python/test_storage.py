"""torch tensors on the CPU are views of storages that lie in mapped memory
only: torch.save, copy.deepcopy and share_memory_ read a tensor's whole
storage, and one storage over a sharded model's files took in the unmapped
gaps the kernel leaves between their mappings (SIGSEGV). Each check runs in
a process of its own, so a crash fails the test instead of killing pytest
(pyhelpers.run_forked: one interpreter imports torch, a child is forked for
each check).

The models are written byte by byte here (pyhelpers.write_safetensors) and
the expected values are numpy arrays of the files' bytes: what upstream's
safetensors gives."""
import json

import numpy as np
import pytest

from pyhelpers import run_forked, write_safetensors

_BIG = 1 << 20  # float32 elements: each shard holds 4 MiB, so the kernel aligns its mapping


def _tensors(shard, layers):
    """(name, dtype, numpy array) of one shard: interleaved per-layer
    tensors of several dtypes (runs at a fixed stride), one big tensor, and
    in odd shards a 3-byte tensor first, which puts the rest off their
    element alignment from the shard's start."""
    out = []
    if shard % 2:
        out.append((f"a.odd.{shard}", "U8", np.arange(3, dtype="u1") + shard))
    for layer in range(shard * layers, (shard + 1) * layers):
        out.append((f"m.layers.{layer}.q", "F32", np.full((8, 8), layer + 0.5, dtype="<f4")))
        out.append((f"m.layers.{layer}.k", "F16", np.full((4, 8), -layer, dtype="<f2")))
        out.append((f"m.layers.{layer}.ids", "I64", np.arange(3, dtype="<i8") * layer))
        out.append((f"m.layers.{layer}.norm", "F32", np.full((8,), layer * 2.0, dtype="<f4")))
    out.append((f"z.big.{shard}", "F32", np.arange(_BIG, dtype="<f4") + shard))
    return out


def _write(path, tensors):
    """Writes tensors to path; returns {name: [file, offset, dtype, shape]}."""
    where = write_safetensors(path, [(n, d, a.shape, a.tobytes()) for n, d, a in tensors])
    types = {n: (a.dtype.str, list(a.shape)) for n, _, a in tensors}
    return {n: [str(path), off, types[n][0], types[n][1]] for n, (off, _) in where.items()}


def sharded_model(directory, shards=4, layers=16):
    """A model of shards files, each of 4 MiB or more; returns (the index
    path, {name: [file, offset, numpy dtype, shape]})."""
    expect, weight_map = {}, {}
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        got = _write(directory / name, _tensors(s, layers))
        expect.update(got)
        weight_map.update({n: name for n in got})
    index = directory / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return str(index), expect


def single_model(directory):
    tensors = _tensors(0, 16) + _tensors(1, 16)
    path = directory / "model.safetensors"
    return str(path), _write(path, tensors)


# check(model, expected layout JSON, WCACHE_TORCH_COW) runs every check on
# the model and returns how many storages its state dict's tensors view.
_CHECK = r'''
import copy, io, json, os
import numpy as np
import torch
import wcache
from wcache.torch import load_file

def expected(name):
    path, off, dtype, shape = expect[name]
    n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    with open(path, "rb") as f:
        f.seek(off)
        return np.frombuffer(f.read(n), dtype=dtype).reshape(shape)

def same(t, name, plus=0):
    want = expected(name) + np.array(plus, dtype=expected(name).dtype)
    assert tuple(t.shape) == want.shape, (name, t.shape, want.shape)
    assert np.array_equal(t.numpy(), want), name

def readable():
    """[(start, end)] of readable memory, adjacent areas merged."""
    out = []
    for line in open("/proc/self/maps"):
        span, perms = line.split()[:2]
        lo, hi = (int(x, 16) for x in span.split("-"))
        if perms[0] != "r":
            continue
        if out and out[-1][1] == lo:
            out[-1][1] = hi
        else:
            out.append([lo, hi])
    return out

def storages_mapped(tensors):
    areas = readable()
    seen = set()
    for name, t in tensors.items():
        s = t.storage()
        lo, n = s.data_ptr(), s.nbytes()
        if not n or (lo, n) in seen:
            continue
        seen.add((lo, n))
        assert any(a <= lo and lo + n <= b for a, b in areas), \
            f"{name}: storage [{lo:#x}, {lo + n:#x}) is not all mapped readable"
    return len(seen)

def round_trip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf)

def check_state_dict(sd, how):
    assert sorted(sd) == sorted(expect), how
    for name, t in sd.items():
        same(t, name)
    first, big = min(sd), max(sd)
    same(round_trip(sd[first]), first)
    same(round_trip({big: sd[big]})[big], big)
    same(copy.deepcopy(sd[first]), first)
    same(copy.deepcopy(sd[big]), big)
    for name, t in round_trip(sd).items():
        same(t, name)
    return storages_mapped(sd)

def check(target, layout, mode):
    global expect
    os.environ["WCACHE_TORCH_COW"] = mode
    with open(layout) as f:
        expect = json.load(f)
    count = check_state_dict(load_file(target), "load_file")
    with wcache.safe_open(target, framework="pt") as f:
        names = f.keys()
        check_state_dict({n: f.get_tensor(n) for n in names}, "get_tensor")
        check_state_dict(f.get_tensors(), "get_tensors")
        # Copy-on-write: a tensor written here saves what was written; the
        # file and a new handle keep the original.
        w = f.get_tensor(names[1])
        w.add_(1)
        same(round_trip(w), names[1], plus=1)
        same(copy.deepcopy(w), names[1], plus=1)
        m = f.get_tensor(names[-1])
        m.share_memory_()  # moves its whole storage to shared memory
        same(m, names[-1])
    with wcache.safe_open(target, framework="pt") as f:
        same(f.get_tensor(names[1]), names[1])
    return count
'''
_MODES = ["auto", "remap", "copy"]


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """_CHECK over the 4-shard model in every mode and over the single file
    in "auto", run once for the module's tests (the checks write only to
    private copy-on-write memory: the files stay as written). Returns
    (run_forked's results, its output, {check: its model's tensor count})."""
    top = tmp_path_factory.mktemp("storage")
    (top / "sharded").mkdir()
    (top / "single").mkdir()
    sharded = sharded_model(top / "sharded")
    models = {f"sharded-{mode}": sharded + (mode,) for mode in _MODES}
    models["single"] = single_model(top / "single") + ("auto",)
    cases = []
    for name, (target, expect, mode) in models.items():
        layout = top / f"{name}.json"
        layout.write_text(json.dumps(expect))
        cases.append((name, (target, str(layout), mode)))
    results, output = run_forked(_CHECK, cases, env={"WCACHE_SOCKET": str(top / "nobody.sock"),
                                                     "WCACHE_TORCH_COW": None})
    return results, output, {name: len(m[1]) for name, m in models.items()}


def _storages(checked, name):
    """How many storages check name counted; fails unless it passed."""
    results, output, _ = checked
    status, count = results.get(name, (None, None))
    assert status == 0, f"{name}: exit status {status} (-11 is SIGSEGV)\n{output}"
    return int(count)


@pytest.mark.parametrize("mode", _MODES)
def test_sharded_model_save_and_deepcopy(checked, mode):
    """A 4-shard model through load_file and safe_open: torch.save of one
    tensor and of the state dict, copy.deepcopy and share_memory_ work and
    give the file's values, in every WCACHE_TORCH_COW mode; the views of
    "auto" share no storage across the shards' mappings."""
    storages = _storages(checked, f"sharded-{mode}")
    if mode == "auto":
        assert storages >= 4  # at least one per dtype; storages_mapped: none spans a gap


def test_single_file_save_and_deepcopy(checked):
    """The same checks on one file (4 dtypes; half its tensors off their
    element alignment, so each has a storage of its own)."""
    storages = _storages(checked, "single")
    # a storage per dtype, shared by the aligned tensors
    assert 4 <= storages < checked[2]["single"]


def test_parts_cut_at_page_gaps_and_dtypes():
    """Table.parts: tensors that touch, or whose pages touch, are one block,
    a whole page between two tensors starts a new one; a part is one
    dtype of one block; no data, no part."""
    from wcache._table import Table

    t = Table.__new__(Table)  # the fields parts() reads, no model
    page = 4096
    # a, b (touches a, another dtype), c (the next page), d (a page between), empty
    t.addr = np.array([0x10000, 0x10010, 0x11000 + 8, 0x13000, 0x20000], dtype=np.uint64)
    t.nbytes = np.array([0x10, 0xfe0, 16, 32, 0], dtype=np.uint64)
    t.dtype_of = np.array([0, 1, 0, 0, 0])
    t.dtype_names = ["F32", "F16"]
    t.count, t._parts, t._offset_order = 5, None, None
    part_of, lo, hi = Table.parts(t, page=page)
    assert part_of.tolist() == [0, 1, 0, 2, -1]
    assert lo == [0x10000, 0x10010, 0x13000] and hi == [0x11018, 0x10ff0, 0x13020]
