"""Copying a model into device memory: one allocation, batched copies, from the mapping.

A GPU worker's load time is the copy into device memory. Copying tensor by
tensor from a pageable file mapping is slow: the driver stages pageable
memory through small pinned buffers of its own, one tensor at a time. This
engine copies a whole set of tensors (a model, a shard, the tensors a caller
asked for) like this:

1. **Plan** (:func:`plan`): the tensors in the order of their data; a run of
   tensors that lie back to back in the mapping becomes one *run*, placed
   in ONE device buffer (a uint8 tensor) at an offset aligned to
   ``RUN_ALIGN`` bytes. Inside a run a tensor keeps its distance from the
   run's start, so one copy moves the whole run; a tensor whose place would
   not be a multiple of its element size (a misaligned source) starts a new
   run, padded in the device buffer. A tensor contained in the run being
   built (aliases) is a view of the same bytes. Runs are cut into batches
   of at most ``MAX_BATCH`` bytes.
2. **Register** the source: the page-aligned ranges the runs cover are
   registered with the device read-only (``cudaHostRegister`` with
   ``cudaHostRegisterReadOnly | cudaHostRegisterPortable``), so the DMA
   engine reads the shared page cache directly, and each batch is one
   asynchronous copy on one stream. Ranges are registered ahead of their
   copies, ``REGISTER_AHEAD`` at once on as many threads, so registering
   (pinning pages: CPU work, slower than the link) overlaps the copies in
   flight and other ranges' registration; a range's copies are issued once
   its own registration has returned. They are unregistered when the
   copies have finished (the caller's model keeps the mapping alive).
   What is registered is a MAP_SHARED read-only view of the same file
   pages (_sharedview.py), never libwcache's own MAP_PRIVATE mapping: the
   kernel (Linux 6.2+) copies pages of a private mapping that is pinned
   long-term, which would give every worker its own copy of the model.
   The file behind the ranges is found in /proc/self/maps, opened and
   checked once per model mapping (_sharedview.MappingFiles, one per model
   handle, kept until the handle goes), not once per range or per load: a
   loop of get_tensor(name) on a device, one load per tensor, reads maps
   once (each read parses every line: milliseconds). A derived artifact is
   a memfd with no path: its view is mapped through the descriptor
   libwcache keeps of it (wc_model_fd, model_descriptors), so any worker
   registers it.
3. **Or stage**, when registration is refused (an older driver; a part that
   has no read-only registration) or no shared view can be made (the worker
   may not open the model's path; it was renamed over, and the worker may
   not open /proc/self/map_files; a derived artifact's memfd under a
   libwcache that keeps no descriptor of it, without map_files either):
   two pinned buffers of ``STAGING_BYTES`` and two streams. Chunk k is
   copied (by a few threads, memcpy releases the GIL) from the mapping
   into buffer k % 2 once that
   buffer's previous copy has finished, then copied to the device
   asynchronously on stream k % 2, so the CPU fills one buffer while the
   other is in flight. A refusal after some ranges were registered stages
   only the batches left ("register+staging").

One log line (logger ``wcache``, once per process for each path and reason)
says which path ran and why: INFO for the registered path, WARNING for
staging after a refusal.

The device is a *backend* (:class:`Backend`): :class:`CudaBackend` does the
CUDA calls through torch (``torch.cuda.cudart()``, streams, ``copy_`` with
``non_blocking``); :class:`CpuBackend` runs the same engine on the CPU with
streams whose copies happen only when the stream is synchronised, so tests
see every batch, every registration, the staging buffers' reuse and the
error paths without a GPU.

``WCACHE_DEVICE_COPY=auto|register|staging|tensor`` forces a path (for
benchmarks and tests): "register" raises when registration is refused,
"staging" never registers, "tensor" is the old per-tensor ``.to(device)``.

Host registration of handles on the CPU (``WCACHE_HOST_REGISTER=1``) is in _hostreg.py.
"""
import collections
import contextlib
import ctypes
import errno
import logging
import mmap
import os
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor

from . import _lib
from ._lib import env_choice
from ._sharedview import MappingFiles, Unavailable

__all__ = ["plan", "Plan", "Engine", "Backend", "CudaBackend", "CpuBackend", "RegisterRefused",
           "copy_mode", "to_device", "tensor_to_device", "cudart_libraries",
           "cudart_runtimes"]

log = logging.getLogger("wcache")

CUDA_HOST_REGISTER_PORTABLE = 0x01
CUDA_HOST_REGISTER_READ_ONLY = 0x08
CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712

RUN_ALIGN = 256               # a run starts at a multiple of this in the device buffer
MAX_BATCH = 256 << 20         # bytes in one copy of the registered path
STAGING_BYTES = 64 << 20      # each of the two pinned staging buffers
HOST_COPY_PART = 8 << 20      # one thread's share of a staging memcpy
SMALL_COPY = 1 << 20          # below this, to_device copies tensor by tensor
REGISTER_AHEAD = 4            # ranges registered at once, on threads, ahead of their copies
MODES = ("auto", "register", "staging", "tensor")
PAGE = mmap.PAGESIZE

last_load = None
_register_lock = threading.Lock()
# The MappingFiles of each model mapping copied from with a backend that
# pins long-term, by the model's handle (model.py's _Handle, which owns
# the mapping): its owner is this table, its lifetime the handle's (its
# descriptors are closed when the handle goes, with the mapping, by a
# weakref.finalize). Used under _register_lock.
_mapping_files = weakref.WeakKeyDictionary()
_logged = collections.OrderedDict()  # the last _LOGGED_MAX lines said, oldest first
_LOGGED_MAX = 256  # a line dropped from _logged may be said again
_logged_lock = threading.Lock()
# A child of fork() makes both locks anew: another thread may be copying or logging.
_lib.fork_safe_module(globals(), "_register_lock", "_logged_lock")


def copy_mode():
    """The path forced by $WCACHE_DEVICE_COPY ("auto" by default)."""
    return env_choice("WCACHE_DEVICE_COPY", MODES)


def first_time(seen, key, limit):
    """Whether key is new to seen, an OrderedDict of the last limit keys
    given, oldest first (a key dropped from it is new again); adds it. The
    caller holds the lock that guards seen."""
    if key in seen:
        seen.move_to_end(key)
        return False
    seen[key] = None
    if len(seen) > limit:
        seen.popitem(last=False)
    return True


def _say_once(level, text):
    with _logged_lock:
        new = first_time(_logged, text, _LOGGED_MAX)
    if new:
        log.log(level, "%s", text)


class RegisterRefused(Exception):
    """The device refused to register host memory (the reason is the message)."""


# -- planning --

class Plan:
    """Where every tensor goes in the device buffer and how to copy it.

    places: {name: offset in the buffer, or None for an empty tensor};
    runs: [(source address, buffer offset, bytes)], each one piece of
    memory on both sides; batches: the runs cut where the source address
    crosses a multiple of max_batch (a multiple of the page size), so each
    batch's pages are its own; total: the buffer's size; ranges: [(start,
    end, first batch, end batch)], the page-aligned source ranges to
    register, one per batch except where two batches share a page (runs
    that meet inside a page), which are merged."""

    def __init__(self, places, runs, total, max_batch):
        if max_batch % PAGE:
            max_batch += PAGE - max_batch % PAGE
        self.places = places
        self.runs = runs
        self.total = total
        self.batches = []
        for src, dst, n in runs:
            done = 0
            while done < n:
                cut = (src + done) // max_batch * max_batch + max_batch
                m = min(n - done, cut - (src + done))
                self.batches.append((src + done, dst + done, m))
                done += m
        self.ranges = []
        for k, (src, _, n) in enumerate(self.batches):
            lo = src - src % PAGE
            hi = -(-(src + n) // PAGE) * PAGE
            if self.ranges and lo < self.ranges[-1][1]:
                prev = self.ranges[-1]
                self.ranges[-1] = (prev[0], max(prev[1], hi), prev[2], k + 1)
            else:
                self.ranges.append((lo, hi, k, k + 1))

    @property
    def copied(self):
        """Bytes the copies move (the buffer minus padding)."""
        return sum(n for _, _, n in self.runs)


def plan(entries, align=RUN_ALIGN, max_batch=MAX_BATCH):
    """The :class:`Plan` for entries, a list of (name, address, nbytes,
    element size) in any order. Tensors back to back in memory share a run;
    every tensor's offset in the buffer is a multiple of its element size."""
    if align <= 0 or max_batch <= 0:
        raise ValueError("align and max_batch must be positive")
    places, runs = {}, []
    run_src = run_dst = run_end = None
    cursor = 0
    # by address, the larger first at one address (so aliases fall inside it)
    for name, addr, n, itemsize in sorted(entries, key=lambda e: (e[1], -e[2], e[0])):
        if n == 0:
            places[name] = None
            continue
        if n % itemsize:
            raise ValueError(f"tensor {name!r}: {n} bytes is not a multiple of its element "
                             f"size {itemsize}")
        if run_src is not None:
            dst = run_dst + (addr - run_src)
            if run_src <= addr and addr + n <= run_end and dst % itemsize == 0:
                places[name] = dst  # inside the run: the same bytes
                continue
            if addr == run_end and dst % itemsize == 0:
                run_end += n
                places[name] = dst
                continue
            runs.append((run_src, run_dst, run_end - run_src))
            cursor = run_dst + (run_end - run_src)
        run_dst = -(-cursor // align) * align
        run_src, run_end = addr, addr + n
        places[name] = run_dst
    if run_src is not None:
        runs.append((run_src, run_dst, run_end - run_src))
        cursor = run_dst + (run_end - run_src)
    return Plan(places, runs, cursor, max_batch)


# -- backends --

class Backend:
    """What the engine needs from a device. Streams are opaque objects;
    copy() is asynchronous on its stream and may read its source until
    synchronize(stream) returns."""

    name = "?"
    # Whether register() pins host memory long-term (cudaHostRegister does):
    # then the engine registers a shared view of the source, never a private
    # (copy-on-write) mapping, which the kernel would copy (_sharedview.py).
    pins_long_term = False

    def alloc(self, nbytes):
        """A uint8 tensor of nbytes on the device."""
        raise NotImplementedError

    def register(self, addr, nbytes):
        """Registers host memory read-only for copies. True: registered
        (unregister later); False: already registered (not ours to
        unregister; wcache cannot tell a live registration from one left
        behind at a reused address, so the engine and _hostreg.py refuse
        it). RegisterRefused: not usable.
        Called from any thread, several at once for disjoint ranges (the
        engine registers ahead of its copies on a few threads)."""
        raise NotImplementedError

    def unregister(self, addr):
        """Undoes a register() that returned True; raises on an error."""
        raise NotImplementedError

    def quiesce(self):
        """Waits for every copy queued on the device (before memory it may
        read is unregistered)."""

    def stream(self):
        raise NotImplementedError

    def copy(self, buffer, offset, src_addr, nbytes, stream):
        """Starts copying nbytes at host address src_addr to buffer[offset:]."""
        raise NotImplementedError

    def synchronize(self, stream):
        """Waits for every copy on stream."""
        raise NotImplementedError

    def pinned(self, nbytes):
        """(host address, owner) of a pinned host buffer; release(owner) frees it."""
        raise NotImplementedError

    def release(self, owner):
        pass


def _host_tensor(addr, nbytes):
    """A CPU uint8 tensor over host memory [addr, addr + nbytes) (no copy).
    Only ever read: the memory may be a read-only mapping."""
    import numpy as np
    import torch
    array = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(addr))
    return torch.from_numpy(array)


def cudart_libraries(maps="/proc/self/maps"):
    """[(path, address)] of the CUDA runtime libraries this process has
    loaded, in the order /proc/self/maps lists them, each file once:
    libcudart.so.N (pip's nvidia-cuda-runtime, a CUDA toolkit) and
    libcudart-HASH.so.N (a torch wheel that bundles its own, renamed). path
    is as maps names it, " (deleted)" included where the file was removed
    or replaced since it was loaded; address is the start of its first
    mapping, by which cudart_runtimes() finds the loaded copy."""
    found, seen = [], set()
    with open(maps, "rb") as f:
        for line in f:
            parts = line.rstrip(b"\n").split(None, 5)
            if len(parts) < 6 or not parts[5].startswith(b"/"):
                continue
            path = parts[5]
            name = path[:-len(b" (deleted)")] if path.endswith(b" (deleted)") else path
            base = name.rsplit(b"/", 1)[-1]
            key = (parts[3], parts[4], path)  # device, inode: a replaced file is another copy
            if base.startswith(b"libcudart") and b".so" in base and key not in seen:
                seen.add(key)
                found.append((os.fsdecode(path), int(parts[0].split(b"-")[0], 16)))
    return found


# The address of a loaded runtime's first mapping -> (its CDLL, load base).
# Each RTLD_NOLOAD open takes a reference the handle never gives back
# (ctypes has no dlclose): one per runtime, kept, rather than one per
# refused registration. That reference keeps the copy loaded, so nothing
# else is mapped at its address; its maps path is no key, since it gains
# " (deleted)" when the file is replaced (the case this exists for).
_runtime_handles = {}


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _loaded_object(addr):
    """(name, base) of the shared object the dynamic linker loaded at addr
    (dladdr(3): the name it was loaded under, its load address), or None;
    OSError where the C library has no dladdr."""
    dladdr = getattr(ctypes.CDLL(None), "dladdr", None)
    if dladdr is None:
        raise OSError("the C library has no dladdr")
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    info = _DlInfo()
    if not dladdr(addr, ctypes.byref(info)) or not info.dli_fname:
        return None
    return info.dli_fname, info.dli_fbase


def cudart_runtimes(maps="/proc/self/maps"):
    """(runtimes, unreachable): [(path, ctypes.CDLL)] of every CUDA runtime
    this process has loaded (cudart_libraries()), each the very copy that
    is loaded; [(path, reason)] of those that cannot be reached so.

    A copy is reached by the name the dynamic linker loaded it under
    (dladdr of its mapping), opened with RTLD_NOLOAD, which returns an
    object already loaded and never loads a file: glibc matches that name
    against each loaded object's before it opens anything. The path in
    /proc/self/maps would not do where the file was replaced on disk since
    it was loaded (a package upgrade while a worker runs): dlopen of the
    path finds a new inode there and loads it as a second copy, whose
    functions act on that copy's state. The handle's cudaGetLastError is
    checked to lie in the object found at the mapping."""
    runtimes, unreachable, bases = [], [], set()
    for path, addr in cudart_libraries(maps):
        known = _runtime_handles.get(addr)
        if known is not None:  # its reference keeps it loaded at addr
            if known[1] not in bases:
                bases.add(known[1])
                runtimes.append((path, known[0]))
            continue
        try:
            found = _loaded_object(addr)
        except OSError as e:
            unreachable.append((path, str(e)))
            continue
        if found is None:
            unreachable.append((path, "the dynamic linker loaded no object there (dladdr)"))
            continue
        name, base = found
        if base in bases:
            continue
        try:
            lib = ctypes.CDLL(os.fsdecode(name), mode=os.RTLD_NOLOAD)
            fn = ctypes.cast(lib.cudaGetLastError, ctypes.c_void_p).value
        except OSError as e:
            unreachable.append((path, f"not found loaded by its name {os.fsdecode(name)} "
                                      f"(RTLD_NOLOAD: {e})"))
            continue
        except AttributeError:
            unreachable.append((path, "it has no cudaGetLastError"))
            continue
        at = _loaded_object(fn)
        if at is None or at[1] != base:
            unreachable.append((path, f"its name {os.fsdecode(name)} finds another loaded copy"))
            continue
        bases.add(base)
        runtimes.append((path, lib))
        _runtime_handles[addr] = (lib, base)
    return runtimes, unreachable


def _clear_last_error():
    """Resets the CUDA runtime's last error after a failed call (a refused
    registration): torch's binding returns the code and leaves the error
    pending on this thread (C10_CUDA_ERROR_HANDLED), and the next kernel
    launch check in this thread (C10_CUDA_KERNEL_LAUNCH_CHECK calls
    cudaGetLastError) would raise it against an unrelated call. torch
    exposes no cudaGetLastError, so every runtime this process loaded
    (cudart_runtimes(); the last error is per runtime instance and per
    thread) is called through ctypes, in this thread: the loaded copy,
    never a file loaded again. A runtime that cannot be reached so is left
    alone, with one WARNING per path and reason. Best effort."""
    try:
        runtimes, unreachable = cudart_runtimes()
    except OSError:
        return
    for path, lib in runtimes:
        try:
            lib.cudaGetLastError()
        except (OSError, AttributeError):
            pass
    for path, why in unreachable:
        _say_once(logging.WARNING, f"wcache: a CUDA error may stay pending in {path}: "
                                   f"cannot reach the loaded copy: {why}")


class CudaBackend(Backend):
    """A CUDA device through torch."""

    name = "cuda"
    pins_long_term = True

    def __init__(self, device):
        import torch
        self.torch = torch
        self.device = torch.device(device)
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.cudart = torch.cuda.cudart()

    def alloc(self, nbytes):
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.device)

    def register(self, addr, nbytes):
        flags = CUDA_HOST_REGISTER_READ_ONLY | CUDA_HOST_REGISTER_PORTABLE
        try:
            with self.torch.cuda.device(self.device):
                err = self.cudart.cudaHostRegister(addr, nbytes, flags)
            code = int(err.value if hasattr(err, "value") else err)
        except Exception as e:  # a torch without the binding, a raised CUDA error
            _clear_last_error()
            raise RegisterRefused(f"cudaHostRegister: {type(e).__name__}: {e}") from None
        if code == 0:
            return True
        _clear_last_error()  # a failed runtime call is also "the last error"
        if code == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
            # Registered before: by the loader, or left behind at a reused
            # address, pinning other pages; the engine and _hostreg.py
            # refuse it (Engine._copy_registered).
            return False
        # No size in the reason: one log line per reason, not per range.
        raise RegisterRefused(f"cudaHostRegister(read-only): "
                              f"{self.cudart.cudaGetErrorString(err)} ({code})")

    def unregister(self, addr):
        err = self.cudart.cudaHostUnregister(addr)
        code = int(err.value if hasattr(err, "value") else err)
        if code != 0:
            _clear_last_error()
            raise RuntimeError(f"cudaHostUnregister: {self.cudart.cudaGetErrorString(err)} "
                               f"({code})")

    def quiesce(self):
        self.torch.cuda.synchronize(self.device)

    def stream(self):
        """A side stream that starts after the work queued so far on the
        current stream (the buffer may be memory that work just freed)."""
        s = self.torch.cuda.Stream(device=self.device)
        s.wait_stream(self.torch.cuda.current_stream(self.device))
        return s

    def copy(self, buffer, offset, src_addr, nbytes, stream):
        """One cudaMemcpyAsync on stream: torch's copy_ with non_blocking
        issues it for any CPU source without asking whether it is pinned
        (aten/src/ATen/native/cuda/Copy.cu; only a graph capture checks
        is_pinned()), and the driver makes it a DMA that returns at once
        when the source is registered or pinned (the registered view, a
        staging buffer), a staged copy when it is pageable."""
        src = _host_tensor(src_addr, nbytes)
        with self.torch.cuda.stream(stream):
            buffer[offset:offset + nbytes].copy_(src, non_blocking=True)

    def synchronize(self, stream):
        stream.synchronize()

    def pinned(self, nbytes):
        t = self.torch.empty(nbytes, dtype=self.torch.uint8, pin_memory=True)
        return t.data_ptr(), t


class _CpuStream:
    def __init__(self, number):
        self.number = number
        self.pending = []


class CpuBackend(Backend):
    """The engine's device on the CPU, for tests: the buffer is a CPU
    tensor, and a stream's copies run only when it is synchronised (so a
    staging buffer reused too early shows up as wrong bytes). It records
    every call in ``calls``. refuse: a reason to refuse registration with;
    fail_copy: raise on the copy with this number (1-based)."""

    name = "cpu"

    def __init__(self, refuse=None, fail_copy=None, already_registered=False,
                 pins_long_term=False):
        import torch
        self.torch = torch
        self.pins_long_term = pins_long_term
        self.refuse = refuse
        self.fail_copy = fail_copy
        self.already_registered = already_registered
        self.calls = []
        self.registered = {}
        self.pinned_live = 0
        self.copies = 0
        self.streams = 0

    def alloc(self, nbytes):
        self.calls.append(("alloc", nbytes))
        return self.torch.full((nbytes,), 0xA5, dtype=self.torch.uint8)  # not zeros: padding shows

    def register(self, addr, nbytes):
        self.calls.append(("register", addr, nbytes))
        if addr % PAGE or nbytes % PAGE:
            raise RegisterRefused(f"range {addr:#x}+{nbytes} is not page-aligned")
        if self.refuse:
            raise RegisterRefused(self.refuse)
        if self.already_registered:
            return False
        if addr in self.registered:
            raise AssertionError(f"{addr:#x} registered twice")
        self.registered[addr] = nbytes
        return True

    def unregister(self, addr):
        self.calls.append(("unregister", addr))
        if addr not in self.registered:
            raise AssertionError(f"{addr:#x} unregistered but not registered")
        del self.registered[addr]

    def quiesce(self):
        self.calls.append(("quiesce",))

    def stream(self):
        self.streams += 1
        self.calls.append(("stream", self.streams))
        return _CpuStream(self.streams)

    def copy(self, buffer, offset, src_addr, nbytes, stream):
        self.copies += 1
        self.calls.append(("copy", stream.number, offset, nbytes))
        if self.fail_copy is not None and self.copies == self.fail_copy:
            raise RuntimeError(f"copy {self.copies} failed (injected)")
        if offset < 0 or offset + nbytes > buffer.numel():
            raise AssertionError(f"copy to [{offset}, {offset + nbytes}) outside the buffer")
        stream.pending.append((buffer, offset, src_addr, nbytes))

    def synchronize(self, stream):
        self.calls.append(("sync", stream.number))
        for buffer, offset, src_addr, nbytes in stream.pending:
            ctypes.memmove(buffer.data_ptr() + offset, src_addr, nbytes)
        stream.pending.clear()

    def pinned(self, nbytes):
        self.pinned_live += 1
        self.calls.append(("pinned", nbytes))
        t = self.torch.empty(nbytes, dtype=self.torch.uint8)
        return t.data_ptr(), t

    def release(self, owner):
        self.pinned_live -= 1
        self.calls.append(("release", owner.numel()))


# -- the engine --

class Engine:
    """Copies planned tensors to a backend's device. After copy_plan():
    ``path`` ("register", "staging" or "register+staging"), ``why`` (the
    reason for that path, with this load's counts), ``reason`` (the same
    without counts: what the log line says, once per process for each
    path and reason, however many loads of different sizes follow),
    ``copies`` (copy calls issued) and ``seconds``
    ({"view", "register", "copy", "unregister"}: the wall time spent
    making and unmapping shared views, registering, issuing copies and
    waiting for them, and unregistering), so that a slow load says where
    its time went."""

    def __init__(self, backend, mode="auto", staging_bytes=STAGING_BYTES, threads=None):
        if mode not in ("auto", "register", "staging"):
            raise ValueError(f"mode {mode!r}: use auto, register or staging")
        if staging_bytes <= 0:
            raise ValueError("staging_bytes must be positive")
        self.backend = backend
        self.mode = mode
        self.staging_bytes = staging_bytes
        self.threads = threads or max(1, min(8, os.cpu_count() or 1))
        self.path = self.why = self.reason = None
        self.copies = 0
        self.seconds = dict.fromkeys(("view", "register", "copy", "unregister"), 0.0)

    @contextlib.contextmanager
    def _timed(self, what):
        """Adds the wall time of the block (raising or not) to seconds[what]."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[what] += time.perf_counter() - t0

    def copy_plan(self, p, buffer, files=None):
        """Copies every batch of plan p into buffer (from backend.alloc),
        synchronously: when it returns, the bytes are on the device and
        nothing refers to the source any more. Registered path: ranges
        registered ahead of their copies on a few threads (_copy_registered),
        so registering overlaps the copies in flight; a refusal of the first
        range stages everything, a later one stages the batches left.
        On an error, whatever was registered is unregistered and staging
        buffers are freed. files: the MappingFiles of the mapping the
        plan's sources lie in, which the caller keeps (and closes) for
        later copies of it; None: one for this copy alone."""
        self.copies = 0
        self.seconds = dict.fromkeys(self.seconds, 0.0)
        if not p.batches:
            self.path, self.why = "none", "nothing to copy"
            self.reason = self.why
            return
        done = 0
        why = reason = "WCACHE_DEVICE_COPY=staging"
        if self.mode != "staging":
            # One registered copy at a time in this process: two loads whose
            # page-rounded ranges share a page (neighbouring tensors asked
            # for by two threads) would otherwise register it twice, and
            # the first to finish would unregister it under the other's
            # copies. They share one link anyway.
            with _register_lock:
                done, why, reason = self._copy_registered(p, buffer, files)
            if done == len(p.batches):
                self.path = "register"
                self.reason = f"{self.backend.name}: source registered read-only"
                self.why = f"{self.reason} ({len(p.ranges)} range(s))"
                return
        self.path = "staging" if done == 0 else "register+staging"
        self.why, self.reason = why, reason
        with self._timed("copy"):
            self._copy_staged(p.batches[done:], buffer)

    def _copy_registered(self, p, buffer, files):
        """(batches copied, why it stopped early or None, the same without
        counts or None).

        Ranges are registered ahead of their copies, up to REGISTER_AHEAD
        at once on as many threads (registering pins pages: CPU work,
        slower than the link, and torch's binding lets go of the GIL), in
        address order: the main thread starts each range's registration,
        and issues a range's copies only once its own registration has
        returned. Every range's view is mapped before the first
        registration starts: an mmap takes the process's mmap_lock for
        writing, which waits for every registration in flight (the driver
        pins a range's pages holding that lock for reading), and the
        registrations after it wait behind it, so a view mapped among them
        would end the overlap. Whatever stops the loop (a refusal, no view,
        an error), registrations still running are waited for before
        anything is unregistered or unmapped, and those that succeeded are
        unregistered with the others. A view whose unregistration failed
        stays mapped (_kept_views): unmapped, its address could be mapped
        again, and a copy from the new mapping would read the old pages
        through the registration left behind."""
        registered, views, done, why, reason = [], [], 0, None, None
        stream = None
        own_files = None
        if files is None and self.backend.pins_long_term:
            files = own_files = MappingFiles()
        depth = max(1, min(REGISTER_AHEAD, len(p.ranges)))
        pool = ThreadPoolExecutor(depth, thread_name_prefix="wcache-register") if depth > 1 \
            else None
        # (range, view or None, address to register, batch sources), every
        # range's, mapped before any registration starts; or, last, (range,
        # None, None, None, the Unavailable that no view made)
        mapped = collections.deque()
        # (range, view or None, address registered, batch sources, Future
        # of backend.register, or the Unavailable that no view made)
        ahead = collections.deque()

        def map_views():
            """Maps the view of every range, in order, up to the first that
            cannot be viewed (nothing after it is registered)."""
            with self._timed("view"):
                for r in p.ranges:
                    lo, hi, first, end = r
                    try:
                        view, srcs = self._source(files, lo, hi, p.batches[first:end])
                    except Unavailable as e:
                        mapped.append((r, None, None, None, e))
                        return
                    if view is not None:
                        views.append(view)
                    mapped.append((r, view, view.addr if view is not None else lo, srcs))

        def start_next():
            """Starts registering the next range; False when no range is
            left or none of them may start (no view)."""
            if ahead and isinstance(ahead[-1][4], Exception):
                return False  # after a range without a view nothing starts
            if not mapped:
                return False
            r, view, addr, srcs, *unavailable = mapped.popleft()
            if unavailable:
                ahead.append((r, None, None, None, unavailable[0]))
                return False
            lo, hi, _, _ = r
            if pool is not None:
                registering = pool.submit(self.backend.register, addr, hi - lo)
            else:
                registering = Future()
                try:
                    registering.set_result(self.backend.register(addr, hi - lo))
                except Exception as e:
                    registering.set_exception(e)
            ahead.append((r, view, addr, srcs, registering))
            return True
        try:
            map_views()
            while len(ahead) < depth and start_next():
                pass
            while ahead:
                (lo, hi, first, end), view, addr, srcs, registering = ahead.popleft()
                try:
                    if isinstance(registering, Exception):
                        raise registering  # no view of this range
                    with self._timed("register"):
                        owned = registering.result()
                    if owned:
                        registered.append(addr)
                    elif view is not None and view.own:
                        # Registered already, yet mapped just now: a
                        # registration someone left behind at an address
                        # the kernel gave this view again. It pins the
                        # pages of the old mapping, not these: never copy
                        # through it (cudaErrorHostMemoryAlreadyRegistered).
                        raise RegisterRefused(
                            f"{self.backend.name}: a view mapped just now is already registered "
                            f"(a stale registration at a reused address)")
                    else:
                        # The model's own mapping (libwcache made it in
                        # this process, after any registration there):
                        # the loader's registration, or one left behind at
                        # a reused address, which cannot be told apart;
                        # never trusted, as _hostreg.py refuses it too.
                        raise RegisterRefused(
                            f"{self.backend.name}: the model's mapping is already registered "
                            f"(by the loader, or a stale registration at a reused address)")
                    if stream is None:
                        stream = self.backend.stream()
                except (RegisterRefused, Unavailable) as e:
                    if self.mode == "register":
                        raise RegisterRefused(str(e)) from None
                    what = "registration refused" if isinstance(e, RegisterRefused) else \
                        "no shared view to register"
                    reason = f"{what}: {e}"
                    why = reason if first == 0 else \
                        f"{what} after {first} of {len(p.batches)} batches: {e}"
                    break
                with self._timed("copy"):
                    for src, (_, dst, n) in zip(srcs, p.batches[first:end]):
                        self.backend.copy(buffer, dst, src, n, stream)
                        self.copies += 1
                done = end
                while len(ahead) < depth and start_next():
                    pass
        finally:
            try:
                # Registrations still running end first: what they
                # register is unregistered below, and their views must
                # outlive them.
                with self._timed("register"):
                    for _, _, addr, _, registering in ahead:
                        if isinstance(registering, Future) and \
                                registering.exception() is None and registering.result():
                            registered.append(addr)
                    ahead.clear()
                    if pool is not None:
                        pool.shutdown()
                if stream is not None:
                    with self._timed("copy"):
                        self.backend.synchronize(stream)  # the source must outlive every copy
            finally:
                with self._timed("unregister"):
                    still = {addr for addr in registered if not _unregister(self.backend, addr)}
                with self._timed("view"):
                    for view in views:
                        if view.addr in still:
                            _kept_views.append(view)  # never unmapped: see above
                        else:
                            view.close()
                    # Last: its views are closed, and nothing before it may
                    # be skipped by what its close says.
                    if own_files is not None:
                        own_files.close()
        return done, why, reason

    def _source(self, files, lo, hi, batches):
        """(view, source address of each batch) for the range [lo, hi):
        a SharedView of it made through files (a MappingFiles) when the
        backend pins long-term (a private mapping would be copied: see
        _sharedview.py), else (None, the addresses as they are).
        Unavailable when no view can be made.

        files looks the range up in /proc/self/maps as it read it for an
        earlier range (every range lies in the model's own mapping, which
        was made before the plan, and the views mapped here are never
        looked up, so one read serves every range of every copy of it),
        and opens and checks the file once (where fstat names it by
        another device than maps does, the check reads maps again: once
        per file mapping, not per view)."""
        if not self.backend.pins_long_term:
            return None, [src for src, _, _ in batches]
        view = files.view(lo, hi)
        try:
            return view, [view.translate(src, n) for src, _, n in batches]
        except Unavailable:
            view.close()
            raise

    def _host_copy(self, pool, dst_addr, src_addr, n):
        """memcpy from the mapping into a staging buffer, in parts on the pool."""
        if pool is None or n <= HOST_COPY_PART:
            ctypes.memmove(dst_addr, src_addr, n)
            return
        parts = [(k, min(HOST_COPY_PART, n - k)) for k in range(0, n, HOST_COPY_PART)]
        for f in [pool.submit(ctypes.memmove, dst_addr + k, src_addr + k, m) for k, m in parts]:
            f.result()

    def _copy_staged(self, pieces, buffer):
        """Copies pieces [(source, buffer offset, bytes)] through two pinned
        buffers and two streams. A staging buffer is filled with as many
        pieces (or parts of a piece) as fit, then one copy per piece is
        issued on its stream; before a buffer is filled again, its stream
        is synchronised (its previous copies have finished)."""
        size = min(self.staging_bytes, max(n for _, _, n in pieces))
        bufs, streams, used = [], [], [False, False]
        pool = ThreadPoolExecutor(self.threads) if self.threads > 1 and size > HOST_COPY_PART \
            else None
        side, fill, queued = 0, 0, []

        def flush():
            nonlocal side, fill, queued
            for off, dst, m in queued:
                self.backend.copy(buffer, dst, bufs[side][0] + off, m, streams[side])
                self.copies += 1
            used[side] = True
            side, fill, queued = 1 - side, 0, []
            if used[side]:
                self.backend.synchronize(streams[side])  # buffer free again

        try:
            for _ in range(2):
                bufs.append(self.backend.pinned(size))
                streams.append(self.backend.stream())
            for src, dst, n in pieces:
                done = 0
                while done < n:
                    if fill == size:
                        flush()
                    m = min(size - fill, n - done)
                    self._host_copy(pool, bufs[side][0] + fill, src + done, m)
                    queued.append((fill, dst + done, m))
                    fill += m
                    done += m
            if queued:
                flush()
        finally:
            try:
                for s in streams:
                    self.backend.synchronize(s)
            finally:
                for _, owner in bufs:
                    self.backend.release(owner)
                if pool is not None:
                    pool.shutdown()


# Host memory whose unregistration failed, kept mapped for the rest of the
# process (shared views; _hostreg.py keeps model handles): while a
# registration is left at an address, no other mapping may be given it.
_kept_views = []


def _unregister(backend, addr):
    """backend.unregister(addr): True where it did; an error is logged
    (once per reason) and False returned, not raised: every other range
    must still be unregistered, and the caller may be a finalizer. The
    caller keeps the memory at addr mapped where it failed."""
    try:
        backend.unregister(addr)
    except Exception as e:
        _say_once(logging.WARNING, f"wcache: unregistering host memory failed: "
                                   f"{type(e).__name__}: {e}; it stays mapped, so that its "
                                   f"address is never given to another mapping")
        return False
    return True


def _itemsize(torch, dtype, cache={}):
    size = cache.get(dtype)
    if size is None:
        size = cache[dtype] = torch.empty((), dtype=dtype).element_size()
    return size


def model_descriptors(handle):
    """A callable for MappingFiles: the descriptors the model of handle (a
    _Handle) lends of its files (wc_model_fd: a derived artifact's memfd;
    a model of files with paths keeps none), and those of the served
    directory's model it holds (handle.served: wcached's staged copies,
    which a worker of another user may not open by path: review rev172
    F3), [] once the handle has gone,
    or None where libwcache has no wc_model_fd. Borrowed: valid while the
    handle lives, so whoever keeps one dups it (MappedFile does) while
    holding the handle (to_device does, for its copies). Holds the handle
    weakly: MappingFiles lives as long as the handle, in a table keyed by
    it."""
    ref = weakref.ref(handle)

    def descriptors():
        h = ref()
        if h is None or not h.ptr:
            return []
        if not _lib.has("wc_model_fd"):
            return None
        fd_of = _lib.lib().wc_model_fd
        fds = []
        for ptr in (h.ptr, h.served.ptr if h.served is not None else None):
            file = 0
            while ptr:
                fd = fd_of(ptr, file)
                if fd >= 0:
                    fds.append(fd)
                elif fd != -errno.ENOENT:  # -ERANGE: past the last file
                    break
                file += 1
        return fds
    return descriptors


def mapping_files(handle, span):
    """The MappingFiles of the mapping behind handle (a model's _Handle),
    span (lo, hi) the addresses of its tensor data: made at the first copy
    from it, kept until the handle goes, then its descriptors closed. A
    file with no path (a derived artifact's memfd) is mapped through the
    model's own descriptor of it (model_descriptors)."""
    with _register_lock:
        files = _mapping_files.get(handle)
        if files is None:
            lo, hi = span if span is not None else (None, None)
            files = _mapping_files[handle] = MappingFiles(lo, hi, model_descriptors(handle))
            weakref.finalize(handle, files.close).atexit = False
    return files


def backend_for(device):
    """The backend for a torch device, or None (copied tensor by tensor)."""
    return CudaBackend(device) if device.type == "cuda" else None


def _backend_or_fallback(device, mode):
    """backend_for(device); where making it fails (a torch whose
    torch.cuda.cudart() raises: the binding absent from its build), None
    and one WARNING in mode auto, so that the load is copied tensor by
    tensor as after any other failure of the engine; raised where a path
    was forced."""
    try:
        return backend_for(device)
    except Exception as e:
        if mode != "auto":
            raise
        _say_once(logging.WARNING, f"wcache: no batched copy into {device} "
                                   f"({type(e).__name__}: {e}); copying tensor by tensor")
        return None


def tensor_to_device(tensor, device, mode=None):
    """A CPU tensor (what get_slice selected) copied to device as a tensor
    of its own, holding device memory for its bytes alone: a selection that
    is not contiguous is packed on the CPU first (upstream makes the slice
    there too), then one allocation and one copy on the device's backend;
    .to(device) where there is none (or WCACHE_DEVICE_COPY=tensor)."""
    import torch
    mode = copy_mode() if mode is None else mode
    backend = _backend_or_fallback(device, mode) if mode != "tensor" else None
    if backend is None:
        return tensor.to(device)
    t = tensor.contiguous()
    nbytes = t.numel() * t.element_size()
    buffer = backend.alloc(nbytes)
    if nbytes == 0:
        return torch.empty(t.shape, dtype=t.dtype, device=buffer.device)
    stream = backend.stream()
    try:
        backend.copy(buffer, 0, t.data_ptr(), nbytes, stream)
    finally:
        backend.synchronize(stream)  # t must outlive the copy
    return buffer.view(t.dtype).view(t.shape)


def to_device(model, names, device, per_tensor, backend=None, mode=None, small=SMALL_COPY,
              **engine_args):
    """{name: tensor on device} for names of model, in the order of names.

    One buffer on the device, views into it; see the module comment.
    per_tensor(name) gives the CPU tensor for the old path (mode "tensor",
    a device without a backend, or less than small bytes in all). The
    engine and plan of the last load are kept in ``last_load`` (tests)."""
    global last_load
    import torch
    from ._dtypes import PACKED, torch_dtype
    mode = copy_mode() if mode is None else mode
    if backend is None and mode != "tensor":
        backend = _backend_or_fallback(device, mode)
    # The mapping the copies read must outlive them: this load holds the
    # model's handle itself (another thread may close the model, and
    # per_tensor need not hold the handle).
    handle = model._h()
    table = model._tab()
    infos = []
    for name in names:
        i = table.position(name)
        if i is None:
            model.info(name)  # raises the model's own KeyError
        info = table.info(i)
        if info.dtype in PACKED:  # its storage shape (F4: float4_e2m1fn_x2)
            from ._torch import packed_type
            dtype, shape = packed_type(model.name, info)
        else:
            dtype, shape = torch_dtype(torch, info.dtype), info.shape
        if dtype is None:
            from ._torch import _no_torch_type
            raise TypeError(_no_torch_type(model.name, info))
        infos.append((info, dtype, shape))
    total = sum(info.nbytes for info, _, _ in infos)
    if backend is None or mode == "tensor" or total < small:
        return {name: per_tensor(name).to(device) for name in names}
    entries = [(info.name, info.data, info.nbytes, _itemsize(torch, dtype))
               for info, dtype, _ in infos]
    p = plan(entries, max_batch=engine_args.pop("max_batch", MAX_BATCH))
    engine = Engine(backend, mode=mode, **engine_args)
    files = mapping_files(handle, table.span) if backend.pins_long_term and mode != "staging" \
        else None
    failed = None
    try:
        buffer = backend.alloc(p.total)
        engine.copy_plan(p, buffer, files)
    except Exception as e:
        # The engine has freed what it held. Unless a path was forced, a
        # load that the batched copy could not do is done as before,
        # below: not in this block, where the error's traceback holds the
        # frames that refer to the whole model's device buffer, which would
        # stay allocated beside the copies (twice the model's memory).
        if mode != "auto":
            raise
        failed = f"{type(e).__name__}: {e}"
    if failed is not None:
        buffer = None  # the failed copy's device memory goes before the fallback's
        _say_once(logging.WARNING, f"wcache: the batched copy into {device} failed "
                                   f"({failed}); copying tensor by tensor")
        out = {name: per_tensor(name).to(device) for name in names}
        del handle  # the copies are done
        return out
    del handle  # the copies are done (or were never issued)
    # Its tensors share one storage only because this load made them views
    # of one buffer: wcache.torch's save_model takes each for a whole tensor.
    from ._torch import note_device_buffer
    note_device_buffer(buffer)
    level = logging.WARNING if "staging" in engine.path and mode == "auto" else logging.INFO
    _say_once(level, f"wcache: {engine.path} path into {device}: {engine.reason}")
    out = {}
    for info, dtype, shape in infos:
        off = p.places[info.name]
        if off is None:
            out[info.name] = torch.empty(shape, dtype=dtype, device=buffer.device)
        else:
            out[info.name] = buffer[off:off + info.nbytes].view(dtype).view(shape)
    last_load = (engine, p)
    return out
