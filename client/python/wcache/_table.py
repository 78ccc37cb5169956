"""Every tensor record of a model at once, and tensors made in bulk.

Per-tensor cost matters as much as per-byte cost: a mixture-of-experts
checkpoint has 50,000 to 200,000 tensors, and a Python loader touches every
one. One ctypes call per tensor costs about a microsecond, so a
:class:`Table` reads all records with one ``wc_model_tensors()`` call into
a C array, looks at it as a numpy structured array, and turns the columns
into Python objects with a few vectorised operations:

- names: every name pointer points into the index's string area, so that
  area is copied once (``ctypes.string_at``), split at its NULs, and each
  pointer is matched to the string that starts there (``searchsorted``);
  the selected names are decoded in one ``bytes.decode``. If any pointer
  does not start a string of that copy (an index laid out otherwise), the
  names are read one by one instead: slower, never wrong;
- dtypes: the few distinct dtype string pointers, read once each;
- shapes: the shape area copied once, one column per dimension.

Tensors are then made in *runs* (:meth:`Table.runs`): tensors of one dtype
and shape whose data addresses form an arithmetic progression (the same
tensor of every layer or expert, which real checkpoints lay out at a fixed
stride) are made by one strided view over the model's memory and one
``unbind`` (torch) or one iteration (numpy): one library call per run, not
several per tensor, so the cost per tensor is close to what torch itself
needs to make as many views.

Views are made over *parts* (:meth:`Table.parts`), never over the span
from the lowest tensor to the highest. The torch tensors of a part share
one storage, and whatever reads a whole storage (``torch.save``,
``copy.deepcopy``, ``share_memory_``, pickling for multiprocessing) reads
all of it. A sharded model's files are separate mappings, and the kernel
leaves unmapped gaps between them (or another mapping, which may go away):
a storage over a gap killed the process with SIGSEGV. So memory is cut
into blocks where a whole page lies between one tensor's bytes and the
next's: every page of a block holds bytes of some tensor of this model,
and is mapped, by this model, for as long as its handle lives. A part is
the tensors of one dtype in one block, from the first one's first byte to
the last one's end: one storage per dtype, because ``torch.save`` refuses
a state dict whose tensors view one storage as different types. A run
never crosses parts.
"""
import bisect
import ctypes
import gc
import mmap
import operator
import threading

import numpy as np

from . import _lib
from ._lib import check, wc_tensor


def _numpy_max_dims():
    """The most dimensions a numpy array may have: 32 before numpy 2, 64 since."""
    try:
        np.empty((1,) * 64, dtype=np.uint8)
    except ValueError:
        return 32
    return 64


NUMPY_MAX_DIMS = _numpy_max_dims()

__all__ = ["Table", "Runs", "NumpyRuns"]

_GC_PAUSE_MIN = 256  # runs at least this long are made with the collector paused

# struct wc_tensor as numpy sees it (64-bit hosts; checked below).
_RECORD = np.dtype([("name", "u8"), ("dtype", "u8"), ("ndim", "u4"), ("pad", "u4"),
                    ("shape", "u8"), ("data", "u8"), ("nbytes", "u8")])


def _records(h, n):
    """All n records of handle h as a numpy structured array."""
    lib = _lib.lib()
    recs = (wc_tensor * max(n, 1))()
    if ctypes.sizeof(wc_tensor) == _RECORD.itemsize and _lib.has("wc_model_tensors"):
        got = check(lib.wc_model_tensors(h.ptr, 0, recs, n))
        if got != n:
            raise _lib.WcacheError(0, f"model {h.label!r}: {got} of {n} tensor records read")
        return np.frombuffer(recs, dtype=_RECORD, count=n).copy()
    # An older library (or a 32-bit host): one call per tensor.
    out = np.zeros(n, dtype=_RECORD)
    for i in range(n):
        check(lib.wc_model_tensor(h.ptr, i, ctypes.byref(recs[0])))
        t = recs[0]
        out[i] = (ctypes.cast(t.name, ctypes.c_void_p).value or 0,
                  ctypes.cast(t.dtype, ctypes.c_void_p).value or 0, t.ndim, 0,
                  ctypes.cast(t.shape, ctypes.c_void_p).value or 0, t.data or 0, t.nbytes)
    return out


def _strings(pointers):
    """The NUL-terminated UTF-8 strings at pointers (a uint64 array), read
    with one copy of the area they lie in: the area is decoded and split at
    its NULs once, and each pointer that starts right after a NUL (or at the
    start) is the string of that piece. If any pointer does not, they are
    read one by one instead."""
    n = len(pointers)
    if n == 0:
        return []
    lo, hi = int(pointers.min()), int(pointers.max())
    raw = ctypes.string_at(lo, hi - lo + len(ctypes.string_at(hi)) + 1)
    nuls = np.flatnonzero(np.frombuffer(raw, dtype=np.uint8) == 0)
    offsets = (pointers - lo).astype(np.int64)
    piece = np.searchsorted(nuls, offsets)  # NULs before each string
    starts = np.where(piece > 0, nuls[np.maximum(piece - 1, 0)] + 1, 0)
    if not (starts == offsets).all():
        return [ctypes.string_at(p).decode("utf-8", "surrogateescape")
                for p in pointers.tolist()]
    pieces = raw.decode("utf-8", "surrogateescape").split("\0")
    if n == 1:
        return [pieces[int(piece[0])]]
    return list(operator.itemgetter(*piece.tolist())(pieces))


def _distinct(values):
    """(distinct values in order of first appearance, number of each
    element's value): cheaper than np.unique for the few dtypes a model has."""
    of = np.full(len(values), -1, dtype=np.int64)
    distinct = []
    while True:
        left = np.flatnonzero(of < 0)
        if not len(left):
            return distinct, of
        v = values[left[0]]
        of[values == v] = len(distinct)
        distinct.append(int(v))


def contiguous_strides(shape):
    """Row-major strides, in elements, of shape."""
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(int(dim), 1)
    return tuple(reversed(strides))


class Table:
    """Names, dtypes, shapes, addresses and sizes of every tensor of a model,
    in the byte order of names (the order of ``keys()``)."""

    def __init__(self, h):
        n = int(_lib.lib().wc_model_count(h.ptr))
        recs = _records(h, n)
        self.count = n
        self.names = _strings(recs["name"])
        self._index = None
        dtype_ptrs, self.dtype_of = _distinct(recs["dtype"])
        self.dtype_names = [ctypes.string_at(p).decode("ascii") for p in dtype_ptrs]
        self.ndim = recs["ndim"].astype(np.int64)
        self.addr = recs["data"].astype(np.uint64)
        self.nbytes = recs["nbytes"].astype(np.uint64)
        width = int(self.ndim.max()) if n else 0
        self.dims = np.zeros((n, width), dtype=np.int64)
        if width:
            shape_ptrs = recs["shape"]
            used = self.ndim > 0
            lo = int(shape_ptrs[used].min())
            hi = int((shape_ptrs[used] + 8 * self.ndim[used].astype(np.uint64)).max())
            area = np.frombuffer(ctypes.string_at(lo, hi - lo), dtype="<u8").astype(np.int64)
            first = ((shape_ptrs - lo) // 8).astype(np.int64)
            for d in range(width):
                rows = self.ndim > d
                self.dims[rows, d] = area[first[rows] + d]
        data = self.nbytes > 0
        if data.any():
            self.span = (int(self.addr[data].min()),
                         int((self.addr[data] + self.nbytes[data]).max()))
        else:
            self.span = None
        self._runs = None
        self._parts = None
        self._offset_order = None
        self.bulk = None  # set by runs(): whether tensor i may be in a run

    @property
    def index(self):
        """{name: tensor number}, made on first use (a loader that takes
        every tensor in runs never needs it for most of them)."""
        if self._index is None:
            self._index = dict(zip(self.names, range(self.count)))
        return self._index

    def position(self, name):
        """The number of tensor name, or None: a binary search of the sorted
        names (no dictionary of every name needed), checked against the
        name index when it misses (names whose byte order and str order
        differ, with surrogate escapes)."""
        i = bisect.bisect_left(self.names, name)
        if i < self.count and self.names[i] == name:
            return i
        return self.index.get(name)

    def info(self, i):
        """The wcache.TensorInfo of tensor number i."""
        from .model import TensorInfo
        return TensorInfo(self.names[i], self.dtype(i), self.shape(i), int(self.nbytes[i]),
                          int(self.addr[i]))

    def shape(self, i):
        return tuple(self.dims[i, :self.ndim[i]].tolist())

    def dtype(self, i):
        return self.dtype_names[self.dtype_of[i]]

    def _by_offset(self):
        """Tensor numbers ordered by where their data lies (then by size,
        then number); made once, for offset_keys() and parts()."""
        if self._offset_order is None:
            end = self.addr + self.nbytes
            self._offset_order = np.lexsort((np.arange(self.count), end, self.addr))
        return self._offset_order

    def offset_keys(self):
        """Names ordered by where their data lies (then by size, then name):
        the order of the file for a single safetensors file."""
        order = self._by_offset().tolist()
        return list(operator.itemgetter(*order)(self.names)) if len(order) > 1 else \
            [self.names[i] for i in order]

    def parts(self, page=mmap.PAGESIZE):
        """(part_of, lo, hi): the tensors' data cut into parts (see the
        module comment). part_of[i] is tensor i's part (-1 for a tensor
        without data); part p is [lo[p], hi[p]) (lists of int). Tensors
        next to each other by address are in one block unless a whole
        page lies between them: within a file they touch, so a file is one
        block; two files are one block only where their mappings are
        adjacent, with no page of anything else between them."""
        if self._parts is not None:
            return self._parts
        part_of = np.full(self.count, -1, dtype=np.int64)
        has = self._by_offset()
        has = has[self.nbytes[has] > 0]
        if not len(has):
            self._parts = (part_of, [], [])
            return self._parts
        start = self.addr[has].astype(np.int64)  # user addresses are below 2**63
        end = start + self.nbytes[has].astype(np.int64)
        reach = np.maximum.accumulate(end)  # aliases may overlap
        new = np.ones(len(start), dtype=bool)
        new[1:] = start[1:] // page > (reach[:-1] - 1) // page + 1
        key = (np.cumsum(new) - 1) * len(self.dtype_names) + self.dtype_of[has]
        # by block and dtype, by address within each (a radix sort for few keys)
        order = np.argsort(key.astype(np.int16) if key.max() < 1 << 15 else key, kind="stable")
        key, start, end, has = key[order], start[order], end[order], has[order]
        new[0], new[1:] = True, key[1:] != key[:-1]
        heads = np.flatnonzero(new)
        part_of[has] = np.cumsum(new) - 1
        self._parts = (part_of, start[heads].tolist(), np.maximum.reduceat(end, heads).tolist())
        return self._parts

    @staticmethod
    def _interleaved(order, group_start, start, rel, bulk, max_period=64):
        """Finds runs the greedy pass splits: a group whose members repeat
        with a period of k (q, k, v and o of one shape in every layer: each
        layer holds k of them at the same places) is k runs, member j, j + k,
        j + 2k, ... each. Reorders order and sets start in place for every
        group of 8 or more members where such a k (up to max_period) exists."""
        bounds = np.append(np.flatnonzero(group_start), len(order)).tolist()
        for g0, g1 in zip(bounds[:-1], bounds[1:]):
            size = g1 - g0
            if size < 8 or not bulk[order[g0]] or not start[g0 + 1:g1].any():
                continue
            # A few members at either end may stand apart (embeddings and
            # lm_head of one shape with the layers' projections): they
            # become runs of one.
            for head, tail in ((0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (0, 2), (2, 1),
                               (1, 2), (2, 2)):
                if Table._periodic(order, start, rel, g0 + head, g1 - tail, max_period):
                    start[g0:g0 + head] = True
                    start[g1 - tail:g1] = True
                    break

    @staticmethod
    def _periodic(order, start, rel, g0, g1, max_period):
        """Regroups order[g0:g1] into k runs when its addresses repeat with a
        period of k members; True when it did."""
        size = g1 - g0
        members = order[g0:g1].copy()
        addr = rel[members]
        for k in range(1, min(max_period, size // 2) + 1):
            gaps = addr[k:] - addr[:-k]
            if gaps[0] > 0 and (gaps == gaps[0]).all():
                order[g0:g1] = np.concatenate([members[j::k] for j in range(k)])
                start[g0:g1] = False
                for j in range(k):
                    start[g0 + j * (size // k) + min(j, size % k)] = True
                return True
        return False

    def runs(self, itemsize_of):
        """(order, run_start, run_of): tensors grouped into runs of one dtype
        and shape at addresses in arithmetic progression. itemsize_of[d] is
        the element size of dtype number d, or 0 for a dtype that cannot be
        made in bulk (those tensors, and empty ones, are runs of one).
        order lists tensor numbers run after run; run r is
        order[run_start[r]:run_start[r + 1]]; run_of[i] is tensor i's run.
        A run lies in one part (:meth:`parts`)."""
        if self._runs is not None:
            return self._runs
        n = self.count
        size = np.asarray(itemsize_of, dtype=np.int64)[self.dtype_of] if n else \
            np.zeros(0, dtype=np.int64)
        lo = self.span[0] if self.span else 0
        rel = (self.addr.astype(np.int64) - lo) if n else np.zeros(0, dtype=np.int64)
        part_of, part_lo, _ = self.parts()
        # In a run: data, a dtype made in bulk, and aligned to its element
        # size from the start of its part (safetensors writers align every
        # tensor; one that is not is made on its own).
        bulk = (size > 0) & (self.nbytes > 0)
        if len(part_lo):
            from_part = rel - (np.asarray(part_lo, dtype=np.int64) - lo)[np.maximum(part_of, 0)]
            bulk &= from_part % np.maximum(size, 1) == 0
        # Tensors that cannot be in a run get a key of their own. The part
        # says the dtype too.
        alone = np.where(bulk, -1, np.arange(n))
        keys = [rel] + [self.dims[:, d] for d in reversed(range(self.dims.shape[1]))] + \
            [self.ndim, part_of, alone]
        order = np.lexsort(keys)
        if n == 0:
            self.bulk = bulk
            self._runs = (order, np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64))
            return self._runs
        same = np.ones(n, dtype=bool)
        same[0] = False
        for k in keys[1:]:
            ks = k[order]
            same[1:] &= ks[1:] == ks[:-1]
        rs = rel[order]
        delta = np.zeros(n, dtype=np.int64)
        delta[1:] = rs[1:] - rs[:-1]
        start = ~same
        # i continues the run of i - 1 when it is of the same group and, if
        # i - 1 is not the first of its run, at the same distance.
        start[2:] |= same[1:-1] & ~start[1:-1] & (delta[2:] != delta[1:-1])
        start[1:] |= delta[1:] <= 0
        self._interleaved(order, ~same, start, rel, bulk)
        run_start = np.append(np.flatnonzero(start), n)
        run_sorted = np.cumsum(start) - 1
        run_of = np.empty(n, dtype=np.int64)
        run_of[order] = run_sorted
        self.bulk = bulk
        self._runs = (order, run_start, run_of)
        return self._runs


class _Plan:
    """What a :class:`Runs` makes tensors from: the model's table and the
    runs and parts cut from it. Its size grows with the tensor count (names,
    shapes, addresses and the run lists: tens of MB for 200,000 tensors), so
    a closed Runs drops it whole (see :meth:`Runs.close`)."""

    __slots__ = ("table", "order_list", "start_list", "run_of", "done",
                 "part_of", "part_lo", "part_hi")

    def __init__(self, table, itemsize_of):
        order, run_start, self.run_of = table.runs(itemsize_of)
        self.table = table
        self.order_list = order.tolist()
        self.start_list = run_start.tolist()
        self.done = bytearray(len(self.start_list) - 1)  # run r made for get(): under lock
        self.part_of, self.part_lo, self.part_hi = table.parts()


class Runs:
    """Makes the tensors of one model run by run, for ``safe_open``.

    ``get(name)`` hands out each tensor it makes once: the first request for
    a tensor makes its whole run, returns that tensor and keeps the others
    until they are asked for; a second request for the same name makes a
    new view of its own (so every call returns a new object, as upstream's
    ``get_tensor`` does). ``every()`` makes all of them afresh.

    Threads: upstream's handles are used from many threads at once, and so
    are these. Which caller makes run r is decided under a lock (``done``);
    that caller keeps its own tensor from what it made and puts only the
    others in ``ready``, from which each is taken once (``dict.pop`` is
    atomic), so no two calls get the same object and none misses: a name
    not (or no longer) in ``ready`` whose run is made gets a view of its
    own. Every call reads ``plan`` once and works on what it read, so a
    close() in another thread (which sets it to None) makes the call
    return its tensor or raise ClosedError, never fail otherwise.
    Subclasses say how to make views: :meth:`base` (a 1-D view of part p
    of the model's memory, typed as dtype number d), :meth:`view_one`,
    :meth:`view_many`, and :meth:`single` (the per-tensor path, for what
    cannot be made in bulk)."""

    _FORK_LOCKS = ("lock",)  # made anew in a child of fork() (_lib.fork_safe)

    # Tensors of more dimensions than this take single() (which for numpy
    # raises the error naming the model and the tensor: numpy's limit).
    max_ndim = 1 << 30

    def __init__(self, model, itemsize_of):
        self.model = model
        self.itemsize_of = itemsize_of
        self.plan = _Plan(model._tab(), itemsize_of)  # None once closed
        self.lock = threading.Lock()
        _lib.fork_safe(self)
        self.ready = {}
        self.bases = {}  # part -> its typed base view (it keeps the mapping); None once closed

    def _plan(self):
        plan = self.plan  # read once: close() sets it to None
        if plan is None:
            raise _lib.ClosedError("File is closed")
        return plan

    def _typed(self, plan, i):
        """(typed base view of tensor i's part, the offset of tensor i in
        it, in elements). A base made while another thread closes is
        returned without being kept: a closed Runs keeps no view."""
        t = plan.table
        d = int(t.dtype_of[i])
        p = int(plan.part_of[i])
        size = self.itemsize_of[d]
        bases = self.bases  # read once: close() sets it to None
        if bases is None:
            raise _lib.ClosedError("File is closed")
        base = bases.get(p)
        if base is None:  # one base per part, whichever thread made it first
            base = self.base(plan, p, d, size)
            with self.lock:
                if self.bases is not None:
                    base = self.bases.setdefault(p, base)
        return base, (int(t.addr[i]) - plan.part_lo[p]) // size

    def _make(self, plan, r):
        a, b = plan.start_list[r], plan.start_list[r + 1]
        t = plan.table
        i = plan.order_list[a]
        if not t.bulk[i] or t.ndim[i] > self.max_ndim:
            return self.single(t.names[i]),
        base, offset = self._typed(plan, i)
        shape = t.shape(i)
        strides = contiguous_strides(shape)
        if b - a == 1:
            return self.view_one(base, shape, strides, offset),
        step = (int(t.addr[plan.order_list[a + 1]]) - int(t.addr[i])) // \
            self.itemsize_of[int(t.dtype_of[i])]
        if b - a < _GC_PAUSE_MIN or not gc.isenabled():
            return self.view_many(base, b - a, step, shape, strides, offset)
        # Thousands of new tensors at once: without a pause, the cyclic
        # collector runs every 700 of them and now and then walks every
        # object of the process (tens of ms with torch loaded). Paused, it
        # runs once afterwards over the new objects.
        gc.disable()
        try:
            return self.view_many(base, b - a, step, shape, strides, offset)
        finally:
            gc.enable()

    def close(self):
        """Drops the tensors not handed out, every view of the model's
        memory kept to make more (subclasses drop theirs in :meth:`_drop`)
        and the plan (the model's table and runs), so that a loader still
        holding get() (safe_open's get_tensor closure) keeps neither the
        mapping nor the table: only the tensors handed out hold memory.
        Later get() calls raise ClosedError, as upstream's closed handle
        does (it drops its whole state on close too)."""
        with self.lock:
            self.plan = None
            self.ready.clear()
            self.bases = None
            self._drop()

    def _drop(self):
        """Drops what a subclass keeps that holds the model's memory
        (called by close(), under the lock)."""

    def get(self, name):
        t = self.ready.pop(name, None)
        if t is not None:
            return t
        plan = self._plan()
        if not isinstance(name, str):  # upstream's is a TypeError too (PyO3's &str)
            raise TypeError(f"argument 'name': tensor names are str, not {type(name).__name__}")
        i = plan.table.position(name)
        if i is None:
            raise _lib.MissingTensor(f"File does not contain tensor {name}")
        r = int(plan.run_of[i])
        with self.lock:
            mine = not plan.done[r]
            plan.done[r] = 1
        if not mine:
            # Made by another call: its tensor for name is in ready until
            # someone takes it, or already taken. Either way, a view of its own.
            t = self.ready.pop(name, None)
            return self._make_alone(plan, i) if t is None else t
        made = self._make(plan, r)
        if len(made) == 1:
            return made[0]
        a, b = plan.start_list[r], plan.start_list[r + 1]
        members = plan.order_list[a:b]
        k = members.index(i)
        names = operator.itemgetter(*members)(plan.table.names)
        # Every tensor of the run but this call's own: the others may be
        # taken from ready by other threads the moment they are there. Not
        # once the handle is closed: close() dropped what was ready.
        with self.lock:
            if self.plan is not None:
                self.ready.update(zip(names[:k], made[:k]))
                self.ready.update(zip(names[k + 1:], made[k + 1:]))
        return made[k]

    def _make_alone(self, plan, i):
        """A new view of tensor i alone."""
        t = plan.table
        if not t.bulk[i] or t.ndim[i] > self.max_ndim:
            return self.single(t.names[i])
        base, offset = self._typed(plan, i)
        shape = t.shape(i)
        return self.view_one(base, shape, contiguous_strides(shape), offset)

    def every(self):
        """{name: tensor} of every tensor, in byte order of names."""
        plan = self._plan()
        made = []
        for r in range(len(plan.done)):
            made.extend(self._make(plan, r))
        names = plan.table.names
        if len(made) > 1:
            by_run = operator.itemgetter(*plan.order_list)(names)
        else:
            by_run = [names[i] for i in plan.order_list]
        return dict(zip(by_run, made))


def _np_many(base, m, step, shape, strides, offset):
    size = base.itemsize
    arr = np.lib.stride_tricks.as_strided(
        base[offset:], shape=(m,) + shape, strides=tuple(x * size for x in (step,) + strides),
        writeable=False)
    if shape:
        return list(arr)
    return [arr[j, ...] for j in range(m)]


class NumpyRuns(Runs):
    """Read-only numpy arrays on the model's mapping, made run by run."""

    max_ndim = NUMPY_MAX_DIMS

    def __init__(self, model):
        from ._dtypes import numpy_typestr
        self.typestr = [numpy_typestr(n) for n in model._tab().dtype_names]
        itemsize = [np.dtype(ts).itemsize if ts else 0 for ts in self.typestr]
        super().__init__(model, itemsize)

    def base(self, plan, p, d, size):
        # numpy arrays are never read beyond their own elements (pickle,
        # np.save and copy take only the view): slices of the one array
        # over the model's span do.
        region = self.model._raw_region()
        lo = plan.table.span[0]
        part = region[plan.part_lo[p] - lo:plan.part_hi[p] - lo]
        return part[:len(part) - len(part) % size].view(self.typestr[d])

    @staticmethod
    def view_one(base, shape, strides, offset):
        return _np_many(base, 1, 0, shape, strides, offset)[0]

    view_many = staticmethod(_np_many)

    def single(self, name):
        return self.model.numpy(name)
