"""Host registration of ``safe_open`` handles on the CPU (``WCACHE_HOST_REGISTER``).

``WCACHE_HOST_REGISTER=1``, off by default: loaders that open files with
``device="cpu"`` and copy tensor by tensor themselves (transformers 5 does:
``get_slice(k)[...]`` then ``.to("cuda:0")`` on 4 threads) never reach the
copy engine (_device.py). For them :func:`host_register` registers the
whole mapping of a ``safe_open`` handle read-only with CUDA, range by range
(one per file mapping), so that each of their ``.to()`` copies reads
page-locked memory by DMA instead of going through the driver's pageable
staging. A handle holds its ranges from its first ``get_tensor`` (a handle
opened only for ``keys()`` or ``metadata()`` pins nothing) until
``close()``, ``__exit__`` or its garbage collection, whichever comes first;
the release runs exactly once. A process-wide :class:`_HostRegistry`
counts holders per range, so a range registered once is unregistered by its
last holder only. A range found registered already
(``cudaErrorHostMemoryAlreadyRegistered``) is refused, as the engine
refuses it on its views (_ALREADY_REGISTERED says why), and a mapping whose
unregistration failed stays mapped for the rest of the process. Nothing is
registered unless this process has already initialised CUDA; a refusal
logs one WARNING and the handle works unregistered; nothing about
registration makes a handle fail.

The hazard (documented with the variable in both READMEs): the handle's
tensors are copy-on-write views of libwcache's MAP_PRIVATE mapping, and
that mapping is what is registered. Where the pin does not copy the pages
(Linux before 6.2, or a pin that is not long-term), a loader that writes a
tensor in place gets a page of its own, but the DMA of its next ``.to()``
reads the pinned page-cache page: the device gets the file's bytes, not the
written ones. Not measured (it needs a device); the engine is immune, as it
registers a read-only shared view it never hands out.

The CUDA calls themselves (registering read-only, unregistering, waiting
for the device) are the copy engine's :class:`~wcache._device.CudaBackend`,
and the log lines go through _device.py's ``_say_once`` (each message once
per process): this module decides what to register, for how long, and who
undoes it.
"""
import bisect
import contextlib
import logging
import os
import sys
import threading
import weakref

from ._device import PAGE, CudaBackend, RegisterRefused, _kept_views, _say_once, _unregister

__all__ = ["host_register", "host_register_wanted", "host_ranges", "host_registrations"]

HOST_REGISTER_ENV = "WCACHE_HOST_REGISTER"
_HOST_REGISTER_VALUES = {"": False, "0": False, "off": False, "no": False, "false": False,
                         "1": True, "on": True, "yes": True, "true": True}


def host_register_wanted():
    """Whether $WCACHE_HOST_REGISTER asks for host registration (1, on,
    yes, true; default off). Another value logs one WARNING and means off:
    an environment variable must not make a handle fail to open."""
    value = os.environ.get(HOST_REGISTER_ENV, "")
    wanted = _HOST_REGISTER_VALUES.get(value.strip().lower())
    if wanted is None:
        _say_once(logging.WARNING, f"wcache: {HOST_REGISTER_ENV}={value!r} is not 0 or 1: "
                                   f"host registration stays off")
        return False
    return wanted


def host_backend():
    """(CudaBackend for the current device, None), or (None, why not): CUDA
    must already be initialised in this process. wcache never initialises
    it itself (a context costs time and device memory, and a forked child
    of a CUDA process cannot have one)."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return None, "CUDA is not initialised in this process when the file is read " \
                         "(initialise it first, e.g. torch.cuda.init())"
        if not torch.cuda.is_available():
            return None, "no CUDA device"
        return CudaBackend(torch.device("cuda", torch.cuda.current_device())), None
    except Exception as e:  # a torch without CUDA support, a broken driver
        return None, f"{type(e).__name__}: {e}"


def _mapped_areas():
    """[(start, end)] of this process's mappings, by address (/proc/self/maps)."""
    areas = []
    with open("/proc/self/maps", "rb") as f:
        for line in f:
            start, _, end = line.split(b" ", 1)[0].partition(b"-")
            areas.append((int(start, 16), int(end, 16)))
    areas.sort()
    return areas


def host_ranges(table, areas=None):
    """[(start, end)] to register for the tensors of table (a
    wcache._table.Table): the pages their bytes lie in, merged where they
    touch, and cut where one mapping ends and another begins, so each range
    lies in one file's mapping (a sharded model's files are separate
    mappings that the kernel may place side by side). areas: the process's
    mappings as _mapped_areas() gives them. ValueError for tensor data
    outside every mapping (it cannot be registered)."""
    import numpy as np
    keep = table.nbytes > 0
    if not keep.any():
        return []
    start = table.addr[keep].astype(np.int64)  # user addresses are below 2**63
    end = start + table.nbytes[keep].astype(np.int64)
    start -= start % PAGE
    end = (end + PAGE - 1) // PAGE * PAGE
    order = np.argsort(start, kind="stable")
    start, end = start[order], end[order]
    reach = np.maximum.accumulate(end)
    first = np.ones(len(start), dtype=bool)
    first[1:] = start[1:] > reach[:-1]  # a gap before it: a new piece
    heads = np.flatnonzero(first)
    pieces = zip(start[heads].tolist(), reach[np.append(heads[1:] - 1, len(start) - 1)].tolist())
    areas = _mapped_areas() if areas is None else areas
    starts = [a for a, _ in areas]
    out = []
    for lo, hi in pieces:
        at = lo
        k = bisect.bisect_right(starts, at) - 1
        while at < hi:
            if k < 0 or k >= len(areas) or not areas[k][0] <= at < areas[k][1]:
                raise ValueError(f"tensor data at {at:#x} is not in any mapping")
            cut = min(hi, areas[k][1])
            out.append((at, cut))
            at, k = cut, k + 1
    return out


# Why a range found registered already (cudaErrorHostMemoryAlreadyRegistered)
# is refused: the model's mapping was made by libwcache in this process,
# after any registration at its address, so one found there is either the
# loader's own (of the same pages: registering nothing more loses nothing)
# or left behind at an address reused since (a registration whose
# unregistration failed, of a mapping then closed), pinning the pages of
# the old mapping; wcache cannot tell them apart, and never takes such a
# range for its own. The engine refuses the same answer on its views.
_ALREADY_REGISTERED = "the mapping is already registered with CUDA " \
    "(cudaErrorHostMemoryAlreadyRegistered): by the loader itself, or a registration left " \
    "behind at a reused address, which copies would read the old pages through; wcache " \
    "neither uses nor undoes it"


class _HostHold:
    """One handle's hold on its ranges (made by host_register). backend:
    the backend that registers and unregisters; keep: the model's handle,
    so the mapping cannot go before its registration does; done: released."""
    __slots__ = ("keys", "backend", "keep", "pid", "done")

    def __init__(self, keys, backend, keep):
        self.keys = keys
        self.backend = backend
        self.keep = keep
        self.pid = os.getpid()
        self.done = False


class _HostRegistry:
    """The ranges this process registered for open handles.

    entries: {(start, end): [holders, backend that registered it]}. A range
    is registered by its first holder and unregistered when its last holder
    lets go, after the device has finished what was queued.

    Threads: one lock. A release can be asked for by a garbage collection
    that runs inside this lock's own critical section (a finalizer fired
    by an allocation here); such a release is queued in pending and done
    before the lock is let go, never waited for (that would deadlock).
    After fork() the child starts empty: its holds are its parent's, whose
    registrations the child neither sees nor undoes."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.lock = threading.Lock()
        self.holder = None  # the thread in the critical section
        self.entries = {}
        self.pending = []

    @contextlib.contextmanager
    def _held(self):
        self.lock.acquire()
        self.holder = threading.get_ident()
        try:
            yield
        finally:
            try:
                while self.pending:
                    self._release_locked(self.pending.pop())
            finally:
                self.holder = None
                self.lock.release()

    def acquire(self, backend, ranges, keep):
        """A _HostHold on every range (registering those nobody holds).
        RegisterRefused (or another error) undoes this call's holds and
        is raised."""
        hold = _HostHold([], backend, keep)
        with self._held():
            try:
                for key in ranges:
                    entry = self.entries.get(key)
                    if entry is None:
                        if not backend.register(key[0], key[1] - key[0]):
                            raise RegisterRefused(_ALREADY_REGISTERED)
                        entry = self.entries[key] = [0, backend]
                    entry[0] += 1
                    hold.keys.append(key)
            except BaseException:
                self._release_locked(hold)
                raise
        return hold

    def release(self, hold):
        """Lets go of hold's ranges, once; never raises (a finalizer calls it)."""
        if hold.pid != os.getpid():
            hold.done = True  # a forked child: its parent's registration
            return
        if self.holder == threading.get_ident():
            self.pending.append(hold)  # a collection inside _held(): done on its way out
            return
        with self._held():
            self._release_locked(hold)

    def _release_locked(self, hold):
        if hold.done:
            return
        hold.done = True
        drop = []
        for key in hold.keys:
            entry = self.entries[key]
            entry[0] -= 1
            if entry[0] == 0:
                del self.entries[key]
                if entry[1] is not None:
                    drop.append((key[0], entry[1]))
        hold.keys = []
        left = False
        if drop:
            try:
                drop[0][1].quiesce()  # no copy may still read what is unregistered
            except Exception as e:
                _say_once(logging.WARNING, f"wcache: waiting for the device before "
                                           f"unregistering failed: {type(e).__name__}: {e}")
            for addr, backend in drop:
                left = not _unregister(backend, addr) or left
        if left:
            # A registration is left in the model's mapping: the mapping
            # stays for the rest of the process, so that its address is
            # never given to another mapping, whose copies would read
            # these pages through it.
            _kept_views.append(hold.keep)
        hold.keep = None  # now the mapping may go

    def snapshot(self, timeout=10.0):
        """[(start, end, holders, registered here)] of every range held;
        TimeoutError when the registry stays busy (a diagnostic must not hang)."""
        if not self.lock.acquire(timeout=timeout):
            raise TimeoutError(f"wcache: the host registry stayed busy for {timeout} s")
        try:
            return sorted((k[0], k[1], e[0], e[1] is not None) for k, e in self.entries.items())
        finally:
            self.lock.release()


_host_registry = _HostRegistry()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_host_registry.reset)


def host_registrations():
    """[(start, end, holders, registered by wcache)] of the ranges this
    process's handles hold (tests, benchmarks)."""
    return _host_registry.snapshot()


def host_register(owner, model, backend=None):
    """Registers model's mapping with CUDA read-only for as long as owner
    (a safe_open handle on the CPU) holds it, when $WCACHE_HOST_REGISTER
    asks for it. Returns a callable that releases the registration, once
    (calling it again does nothing), and that also runs by itself when
    owner is garbage collected; or None when nothing was registered (off,
    CUDA not initialised, refused; each said once on the ``wcache``
    logger). Never raises: registration must not make a handle fail.
    backend: for tests; by default :func:`host_backend`'s."""
    if not host_register_wanted():
        return None
    why = None
    if backend is None:
        backend, why = host_backend()
    if backend is None:
        _say_once(logging.WARNING, f"wcache: {HOST_REGISTER_ENV}=1: nothing registered: {why}")
        return None
    try:
        hold = _host_registry.acquire(backend, host_ranges(model._tab()), model._h())
    except RegisterRefused as e:
        _say_once(logging.WARNING, f"wcache: {HOST_REGISTER_ENV}=1: registration refused, "
                                   f"tensors are copied from pageable memory: {e}")
        return None
    except Exception as e:
        _say_once(logging.WARNING, f"wcache: {HOST_REGISTER_ENV}=1: nothing registered: "
                                   f"{type(e).__name__}: {e}")
        return None
    _say_once(logging.INFO, f"wcache: {HOST_REGISTER_ENV}=1: files opened on the CPU are "
                            f"registered with {backend.name} read-only while their handle is "
                            f"open")
    release = weakref.finalize(owner, _host_registry.release, hold)
    release.atexit = False  # at exit the process's registrations go with it
    return release
