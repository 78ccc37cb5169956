"""torch tensors on a model's mapping, and why their memory is copy-on-write.

The model files are mapped PROT_READ. numpy can say "read-only" (the
arrays of ``Model.numpy`` refuse writes with ValueError, and are on the
memory way 1 below makes copy-on-write, for whatever ignores that flag:
model.make_cow), but torch 1.13
has no read-only tensors: a tensor over the PROT_READ mapping would let
``t.add_(1)``, ``t[0] = 1`` or ``t.copy_(x)`` run, and the kernel would kill
the worker with SIGSEGV. Guarding torch's Python API (a tensor subclass)
cannot be complete (C++ extensions, storages, ``out=`` arguments) and slows
every operation. So ``Model.torch`` never hands out a tensor over PROT_READ
memory. It gives a tensor whose pages are mapped copy-on-write
(MAP_PRIVATE, writable): reads share the page cache with every other worker
exactly as the read-only mapping does (zero-copy, no extra memory); a write
makes a private copy of the page written, in this process only. Nothing can
reach the model file, the daemon or another worker, and nothing crashes.
That is also what ``torch.load`` and ``safetensors`` give: a tensor the
program may modify. Modifications are visible to later ``torch(name)``
calls on the same model in this process, like edits to a state dict; call
``.clone()`` first to keep the original.

Three ways to get such memory, tried in this order:

1. ``wc_model_cow()`` in libwcache (proposed C API, used when the library
   has it), called once per model: the library maps model files
   MAP_PRIVATE | MAP_NORESERVE, PROT_READ, and makes them writable in place
   (one mprotect per file); tensors are views of the library's own mapping.
2. A private mapping of the same file made here: the file backing the
   tensor's read-only mapping is found in /proc/self/maps, opened read-only
   through its path, mapped MAP_PRIVATE | MAP_NORESERVE, PROT_READ |
   PROT_WRITE, and checked to be the same inode (device and inode number)
   as _sharedview.py checks the device engine's shared view (fstat, or the
   new mapping's own /proc/self/maps line where fstat names the file by
   another device: overlayfs before Linux 6.8, btrfs subvolumes). It fails
   when this process cannot open the path (a daemon-served file it has no
   read permission for) or the path now names another file (renamed over).
3. A private copy of the tensor (not zero-copy), with a RuntimeWarning once
   per model saying why.

Ways 1 and 2 slice every tensor out of one array per model (way 1) or per
file (way 2), which keeps the per-tensor cost of ``Model.torch(name)`` to a
few numpy and torch calls; each such tensor gets its own storage
(torch.from_numpy of its slice), so saving one tensor saves only its bytes.
``safe_open`` goes further (TorchRuns, on way 1): it makes tensors run by
run as strided views of one torch tensor per *part* of the model's memory
(its tensors of one dtype in one file, or in files the kernel mapped side
by side), so the tensors of a part share its storage (see wcache/_table.py
and the README's list of differences from upstream). No storage covers
memory between files: ``torch.save`` and ``copy.deepcopy`` read a whole
storage, and one over the unmapped gap between two files' mappings crashed
the process.

The environment variable WCACHE_TORCH_COW=auto|c|remap|copy forces one way
(for tests and benchmarks); "auto" is the default.

Commit charge: MAP_NORESERVE keeps a writable private mapping from being
charged against the overcommit limit in the default overcommit modes (0 and
1). With vm.overcommit_memory=2 the kernel charges it anyway, and making a
very large model writable can fail with ENOMEM; then way 3 is used.
"""
import bisect
import mmap
import os
import platform
import sys
import threading
import warnings
import weakref

import numpy as np
import torch

from . import _lib, _table
from ._dtypes import PACKED, carrier_typestr, packed_torch_type, torch_dtype
from ._table import NUMPY_MAX_DIMS
from .model import TensorInfo, _ArrayOwner, _view, make_cow
from ._sharedview import Unavailable, _libc, file_mappings, map_mapped_file

_MODES = ("auto", "c", "remap", "copy")
_BIG_ENDIAN = sys.byteorder != "little"


def _mode():
    return _lib.env_choice("WCACHE_TORCH_COW", _MODES)


def _no_torch_type(label, info):
    return (f"model {label!r}: tensor {info.name!r} is {info.dtype}, which torch "
            f"{torch.__version__} has no type for; model.raw(name) gives its bytes")


_types = {}  # safetensors dtype -> (torch dtype, numpy carrier typestr)


def _types_of(label, info):
    entry = _types.get(info.dtype)
    if entry is None:
        tdtype = torch_dtype(torch, info.dtype)
        carrier = carrier_typestr(info.dtype)
        if tdtype is None or carrier is None:
            raise TypeError(_no_torch_type(label, info))
        entry = _types[info.dtype] = (tdtype, carrier)
    return entry


def packed_type(label, info):
    """(torch dtype, storage shape) of a tensor of a PACKED dtype (F4 as
    float4_e2m1fn_x2, its last dimension halved, as safetensors 0.8 gives
    it); TypeError when this torch has no such type, SafetensorError with
    upstream's message when its last dimension does not divide."""
    try:
        found = packed_torch_type(torch, info.dtype, info.shape)
    except ValueError as e:
        raise _lib.InvalidArgument(str(e)) from None
    if found is None:
        raise TypeError(_no_torch_type(label, info))
    return found


def tensor(model, info):
    """The torch tensor for one tensor of model (see the module comment)."""
    h = model._h()
    if info.dtype in PACKED:
        # Bytes made into the packed type: its storage shape, one byte an element.
        tdtype, shape = packed_type(h.label, info)
        info, carrier = TensorInfo(info.name, info.dtype, shape, info.nbytes, info.data), "|u1"
    else:
        tdtype, carrier = _types_of(h.label, info)
    if _BIG_ENDIAN:
        raise TypeError(f"model {h.label!r}: safetensors data is little-endian and this "
                        "host is not; torch tensors cannot be zero-copy views here")
    if info.nbytes == 0:
        return torch.empty(info.shape, dtype=tdtype)
    state = _state_of(model)
    shape = None
    if len(info.shape) > NUMPY_MAX_DIMS:
        # More dimensions than a numpy array may have (torch allows them,
        # as safe_open's TorchRuns makes them): a 1-D view, then torch's shape.
        shape = info.shape
        info = TensorInfo(info.name, info.dtype, (info.nbytes // np.dtype(carrier).itemsize,),
                          info.nbytes, info.data)
    t = torch.from_numpy(state.writable(model, h, info, carrier))
    if t.dtype != tdtype:
        t = t.view(tdtype)
    return t if shape is None else t.view(shape)


def _state_of(model):
    """model's _State, made by one thread on first use: the others wait for
    it, so every tensor of the model is on the same writable memory.
    ClosedError once the model is closed (checked under the lock close()
    takes: a state kept on a closed model would keep its mapping)."""
    state = model._torch_state
    if state is None:
        with model._lock:
            model._h()
            state = model._torch_state
            if state is None:
                state = model._torch_state = _State()
    return state


class TorchRuns(_table.Runs):
    """torch tensors on the model's copy-on-write memory (way 1 of the
    module comment), made run by run (see wcache/_table.py), each a view of
    its part's storage. Without way 1 (``views`` False) every tensor takes
    the per-tensor path of :func:`tensor`."""

    def __init__(self, model):
        self.h = h = model._h()
        table = model._tab()
        self.state = state = _state_of(model)
        self.views = not _BIG_ENDIAN and state.cow_ready(model, h)
        self.tdtype = [torch_dtype(torch, n) for n in table.dtype_names]
        itemsize = []
        for n, t in zip(table.dtype_names, self.tdtype):
            carrier = carrier_typestr(n)
            ok = self.views and t is not None and carrier is not None
            itemsize.append(np.dtype(carrier).itemsize if ok else 0)
        super().__init__(model, itemsize)

    def _drop(self):
        # The handle and the torch state (its writable arrays over the
        # model's memory) keep the mapping.
        self.h = self.state = None

    def base(self, plan, p, d, size):
        h, state = self.h, self.state  # read once: close() drops them
        if h is None or state is None:
            raise _lib.ClosedError("File is closed")
        u8 = torch.from_numpy(state.cow_part(h, plan.table, p))
        return u8[:len(u8) - len(u8) % size].view(self.tdtype[d])

    @staticmethod
    def view_one(base, shape, strides, offset):
        return base.as_strided(shape, strides, offset)

    @staticmethod
    def view_many(base, m, step, shape, strides, offset):
        return base.as_strided((m,) + shape, (step,) + strides, offset).unbind(0)

    def single(self, name):
        return self.model.torch(name)


# (address, bytes) of every part storage TorchRuns made (cow_part arrays),
# for as long as a storage over it lives (a torch storage made by
# from_numpy holds its array): wcache.torch's shared-tensor rules take a
# tensor that is a view of one for a complete tensor, since upstream's
# tensor would have had a storage of its own (see is_part_view).
_part_arrays = weakref.WeakValueDictionary()


# The same for the one buffer a device load copies a model's tensors into
# (wcache/_device.py): (address, bytes) -> a weak reference to its storage,
# which every tensor viewing it (a Parameter made from one too) keeps alive,
# while the buffer tensor itself may be gone; dead ones are dropped as new
# ones come.
_device_storages = {}
_device_storages_lock = threading.Lock()
_lib.fork_safe_module(globals(), "_device_storages_lock")  # a child of fork() makes it anew


def note_device_buffer(buffer):
    """Records buffer, a device allocation whose views to_device returned
    as a model's tensors, for is_part_view."""
    from torch.multiprocessing.reductions import StorageWeakRef
    storage = buffer.untyped_storage() if hasattr(buffer, "untyped_storage") else \
        buffer.storage().untyped()
    ref = StorageWeakRef(storage)
    with _device_storages_lock:
        for key in [k for k, r in _device_storages.items() if r.expired()]:
            del _device_storages[key]
        _device_storages[(storage.data_ptr(), storage.nbytes())] = ref


def is_part_view(ptr, nbytes):
    """Whether a storage at ptr of nbytes is one TorchRuns made over a part
    of a model's mapping, or one a device load copied a model into (its
    tensors share it only because wcache made them views of one storage,
    see wcache/_table.py and wcache/_device.py)."""
    if ptr == 0:
        return False
    if _part_arrays.get((ptr, nbytes)) is not None:
        return True
    with _device_storages_lock:
        ref = _device_storages.get((ptr, nbytes))
        return ref is not None and not ref.expired()


class _State:
    """Per-model choices and writable memory for torch tensors. Lives on the
    Model (not on the handle: arrays here reference the handle, and a cycle
    would delay wc_release() to the garbage collector)."""

    _FORK_LOCKS = ("lock",)  # made anew in a child of fork() (_lib.fork_safe)

    def __init__(self):
        self.lock = threading.Lock()
        _lib.fork_safe(self)
        self.mode = _mode()
        self.c_ok = None        # wc_model_cow: not tried / done / unusable
        self.c_region = None    # writable uint8 array over the model's span (sliced only)
        self.c_parts = {}       # (start, end) of a part -> writable uint8 array over it
        self.reason = ""        # why way 1 is unusable
        self.remap = None       # _Remapper, built on first use
        self.warned = False

    def writable(self, model, h, info, carrier):
        reasons = []
        if self.mode in ("auto", "c"):
            arr = self._via_c(model, h, info, carrier, reasons)
            if arr is not None:
                return arr
        if self.mode in ("auto", "remap"):
            with self.lock:
                if self.remap is None:
                    self.remap = _Remapper()
            arr = self.remap.array(info, carrier, reasons)
            if arr is not None:
                return arr
        if self.mode != "copy" and not self.warned:
            self.warned = True
            warnings.warn(
                f"wcache: model {h.label!r}: torch tensors are private copies, not views "
                f"of the shared mapping ({'; '.join(reasons)})", RuntimeWarning, stacklevel=4)
        ro = _view(h, info.data, info.shape, carrier)
        return np.array(ro, copy=True)

    def cow_ready(self, model, h):
        """Whether the model's memory is copy-on-write by wc_model_cow()
        (tried once): False when way 1 is not used (WCACHE_TORCH_COW, the
        library cannot, or the model has no tensor data)."""
        if self.mode not in ("auto", "c") or model._tab().span is None:
            return False
        if self.c_ok is None:
            with self.lock:
                if self.c_ok is None:
                    self._cow(h)
        return bool(self.c_ok)

    def cow_part(self, h, table, p):
        """A writable uint8 array over part p of table (wcache/_table.py,
        Table.parts), after cow_ready() said yes. One array per part, never
        one over several: torch.from_numpy of it is a storage of exactly
        that memory, which this model maps whole, starting at its own
        address (torch.save tells storages apart by address)."""
        _, lo, hi = table.parts()
        key = (lo[p], hi[p])
        arr = self.c_parts.get(key)
        if arr is None:
            arr = _view(h, lo[p], (hi[p] - lo[p],), "|u1", readonly=False)
            arr = self.c_parts.setdefault(key, arr)
            _part_arrays[(lo[p], hi[p] - lo[p])] = arr
        return arr

    def _via_c(self, model, h, info, carrier, reasons):
        if self.c_ok is None:
            with self.lock:
                if self.c_ok is None:
                    self._cow(h)
        if not self.c_ok:
            reasons.append(self.reason)
            return None
        region = self.c_region
        span = model._span  # read once: close() in another thread clears it
        if region is None and span is not None:
            lo, hi = span
            region = self.c_region = _view(h, lo, (hi - lo,), "|u1", readonly=False)
        if region is not None:
            arr = model._slice(info, carrier, writable_region=region)
            if arr is not None:  # None: the model was closed meanwhile
                return arr
        return _view(h, info.data, info.shape, carrier, readonly=False)

    def _cow(self, h):
        # Once per handle, shared with its numpy views (model.make_cow).
        state = make_cow(h)
        if state is True:
            self.c_ok = True
        else:
            self.c_ok, self.reason = False, state


# --- way 2: a private mapping of the same file ---

# MAP_NORESERVE differs between architectures; Python's mmap module does not
# export it. 0 (no flag) where unknown: still correct, only charged.
_MAP_NORESERVE = {
    "x86_64": 0x4000, "i386": 0x4000, "i686": 0x4000, "aarch64": 0x4000, "armv7l": 0x4000,
    "armv8l": 0x4000, "riscv64": 0x4000, "s390x": 0x4000, "loongarch64": 0x4000,
    "ppc64le": 0x40, "ppc64": 0x40, "sparc64": 0x40, "mips64": 0x400, "mips": 0x400,
}.get(platform.machine(), 0)


class _PrivateMapping:
    """A MAP_PRIVATE, writable mapping of a whole file (made by
    map_mapped_file; this owns it from then on); unmapped when the last
    array over it is gone (arrays hold it through _ArrayOwner)."""
    __slots__ = ("addr", "size", "__weakref__")

    def __init__(self, addr, size):
        self.addr, self.size = addr, size

    def __del__(self):
        addr, self.addr = self.addr, None
        if addr:
            _libc.munmap(addr, self.size)


def _parse_maps():
    """(starts, entries) of /proc/self/maps file mappings, sorted by start;
    an entry is (start, end, offset, (major, minor), inode, path, shared)."""
    entries = file_mappings()
    return [e[0] for e in entries], entries


class _Remapper:
    """Finds the file behind a tensor's read-only mapping and maps it again,
    privately and writable (one mapping per file, made on first use)."""

    _FORK_LOCKS = ("lock",)  # made anew in a child of fork() (_lib.fork_safe)

    def __init__(self):
        self.lock = threading.Lock()
        _lib.fork_safe(self)
        self.starts, self.entries = _parse_maps()
        # (dev, ino, path) as /proc/self/maps names a file -> _PrivateMapping,
        # or a reason string. Not (dev, ino) alone: maps names a btrfs file by
        # the superblock's device, and two subvolumes' files can share an inode
        # number (a shard symlinked into a subvolume nested in the model's)
        self.files = {}
        self.arrays = {}  # id(mapping) -> writable uint8 array over all of it

    def array(self, info, carrier, reasons):
        i = bisect.bisect_right(self.starts, info.data) - 1
        if i < 0 or not self.entries[i][0] <= info.data < self.entries[i][1]:
            reasons.append(f"tensor {info.name!r} is not in a file mapping")
            return None
        start, _end, offset, dev, ino, path, _shared = self.entries[i]
        with self.lock:
            m = self.files.get((dev, ino, path))
            if m is None:
                m = self.files[(dev, ino, path)] = self._map(path, dev, ino)
        if isinstance(m, str):
            reasons.append(m)
            return None
        off = offset + (info.data - start)
        if off + info.nbytes > m.size:
            reasons.append(f"{os.fsdecode(path)} is shorter than the mapping")
            return None
        whole = self.arrays.get(id(m))
        if whole is None:
            # one writable array over the whole private mapping; tensors are
            # slices of it (each slice keeps the mapping alive)
            whole = np.asarray(_ArrayOwner(m, m.addr, (m.size,), "|u1", False))
            with self.lock:
                self.arrays[id(m)] = whole
        return whole[off:off + info.nbytes].view(carrier).reshape(info.shape)

    @staticmethod
    def _map(path, dev, ino):
        """A _PrivateMapping of the whole file a /proc/self/maps entry
        names, or a string saying why none can be made."""
        try:
            addr, size = map_mapped_file(path, dev, ino, lambda st: (0, st.st_size),
                                         mmap.PROT_READ | mmap.PROT_WRITE,
                                         mmap.MAP_PRIVATE | _MAP_NORESERVE)
        except Unavailable as e:
            return str(e)
        return _PrivateMapping(addr, size)
