"""wcache.safe_open: the interface of ``safetensors.safe_open`` over wcache.

    from wcache import safe_open          # was: from safetensors import safe_open
    with safe_open("/models/llama/model.safetensors", framework="pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}

Where the model comes from: when wcached (on $WCACHE_SOCKET, else
/run/wcached/wcached.sock) serves a model under this name, or under this
exact configured path, it is attached through the daemon and shares its warm
page cache with every other worker. A path given relative or through a
symlink is also tried as its absolute and its real path. A file none of
whose names is served, in a directory wcached serves as a model (README's
configuration of a Hugging Face directory, whose shards transformers opens
one by one), comes through that model when it is one of its files
(wcache/_shards.py). Only "wcached is not running" and "not served" fall
back to mapping the file in this process (with one INFO line per directory
when a wcached answered);
any other failure from the daemon (permission, a model being replaced in
place, a damaged reply) is raised, because silently bypassing the daemon
would hide it.

One connection per process is kept for these attaches and made again after
``fork()``.

Upstream's interface, all of it: ``keys()`` (byte order of names),
``offset_keys()`` (file order), ``get_tensor``, ``get_tensors`` (a dict in
file order), ``get_slice`` (``get_shape``, ``get_dtype``, indexing),
``metadata()`` (None without ``__metadata__``, ``{}`` for an empty one),
the context manager; framework "pt"/"torch"/"pytorch" or "np"/"numpy";
device a string or an int (a CUDA index, as torch reads it); ``backend``
"mmap" or "pread" (both mean the same here: tensors are views of the
mapping; only get_slice's checks differ, as upstream's do). Errors are
:class:`wcache.SafetensorError` where upstream raises it, each also the
exception type wcache raised before (KeyError for a missing tensor,
ValueError for a closed handle or a bad argument, IndexError for a bad
slice index), and FileNotFoundError for a path that
does not exist and is not served.

Speed: tensors are made run by run (wcache/_table.py), so a state dict of
200,000 tensors costs about what torch needs to make as many views.

With ``WCACHE_HOST_REGISTER=1`` and CUDA initialised, a handle on the CPU
registers its mapping with CUDA read-only from its first ``get_tensor``
(or ``get_slice(...)[...]``) until it is closed or collected, so loaders
that copy each tensor to the GPU themselves (transformers) copy from
page-locked memory (see wcache/_hostreg.py).
"""
import collections
import errno
import logging
import os
import stat
import struct
import threading

from ._lib import (INVALID_MODEL_ERRNOS, CannotOpenFile, ClosedError, DaemonUnavailable,
                   InvalidArgument, InvalidSlice, MissingTensor, ModelNotFound, NoSuchFile,
                   SafetensorError, WcacheError, fork_safe, fork_safe_module)
from ._device import _say_once, first_time, tensor_to_device, to_device
from ._hostreg import host_register, host_register_wanted
from ._serialize import MAX_HEADER
from ._shards import served_file
from .model import WIRE_MAX_NAME, Model, askable, connect, open_file

__all__ = ["safe_open", "open_model"]

_lock = threading.Lock()
_shared = None  # (pid, Client)
# A child of fork() gets its own lock: another thread of the parent may
# hold it at the fork (inside _client(), connecting, for up to the
# client's deadline), and no thread of the child would ever let it go.
fork_safe_module(globals(), "_lock")


def _after_fork_in_child():
    """A child makes its own connection: the parent's is the parent's."""
    global _shared
    _shared = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _client(failed=None):
    """This process's connection to wcached (made on first use). failed: a
    client whose attach found wcached gone; it is replaced unless another
    thread has replaced it already. A replaced one is dropped, not closed:
    another thread may be in an attach on it; it closes once nothing refers
    to it (each model holds its client)."""
    global _shared
    with _lock:
        if _shared is not None and (_shared[1] is failed or _shared[0] != os.getpid()
                                    or _shared[1].closed):
            _shared = None
        if _shared is None:
            _shared = (os.getpid(), connect())
        return _shared[1]


def _names(target):
    """The names to ask the daemon for. A target that names an existing
    regular file is that file: only its absolute and real paths are asked
    (as given, "m1" or "model.safetensors" in the cwd would get the model
    wcached serves under that NAME, another model's tensors). Anything else
    as given, then its absolute and real paths when it exists (a directory)."""
    names = [] if os.path.isfile(target) else [target]
    if os.path.exists(target):
        for p in (os.path.abspath(target), os.path.realpath(target)):
            if p not in names:
                names.append(p)
    # "" or a path over wcached's limit cannot be served: not asked (a long
    # path is still a file, opened here)
    return [n for n in names if askable(n)]


def _attach(target):
    """Attaches target through wcached; returns (model, None, True) or
    (None, why it fell back, whether a wcached answered "not served"). A
    regular file none of whose names is served may be a file of a model
    served as a directory (wcache/_shards.py). Raises for daemon errors
    other than down / not served."""
    try:
        client = _client()
    except DaemonUnavailable as e:
        return None, str(e), False
    why = f"its path is not one wcached can serve (1 to {WIRE_MAX_NAME} bytes)"
    for name in _names(target):
        for attempt in (0, 1):
            try:
                return client.attach(name), None, True
            except ModelNotFound as e:
                why = str(e)
                break
            except DaemonUnavailable as e:
                # A daemon restarted since we connected: connect once more.
                if attempt == 1:
                    return None, str(e), False
                try:
                    client = _client(failed=client)
                except DaemonUnavailable as e2:
                    return None, str(e2), False
            except WcacheError as e:
                if e.errno != errno.EIO or type(e) is not WcacheError:
                    raise
                # Served, but its load or warm-up failed ("failed to
                # load: REASON", whatever the reason: missing, unreadable,
                # not a valid model). A path is opened here instead, which
                # says what upstream would (NoSuchFile, SafetensorError) or
                # maps it, unshared; a served name has no file to try.
                if os.sep in target or os.path.exists(target):
                    _say_once(logging.WARNING, f"wcache: wcached could not serve {target}: "
                              f"{e}; opening it in this process")
                    return None, str(e), False
                raise SafetensorError(e.errno, e.strerror) from None
    if os.path.isfile(target):
        model, why_not = served_file(client, target)
        if model is not None:
            return model, None, True
        why = f"{why}, {why_not}" if why_not.startswith("nor") else f"{why}; {why_not}"
    return None, why, True


# the last _TOLD_MAX directories _not_served() has named a file of, oldest
# first (one dropped may be named again)
_told = collections.OrderedDict()
_TOLD_MAX = 256


def _not_served(target, why):
    """Says, at INFO, once per process and directory, that a file was mapped
    in this process, unshared, while a wcached was there and did not serve
    it (README's "Serving real models"): otherwise nothing would say so."""
    directory = os.path.dirname(os.path.abspath(target))
    with _lock:
        new = first_time(_told, directory, _TOLD_MAX)
    if new:
            _say_once(logging.INFO, f"wcache: {why}: {target} is mapped in this process, "
                  f"unshared (said once for the files of {directory})")


def _unopenable(path):
    """Whether path itself cannot be opened for reading, as upstream's
    File::open finds: stat fails (search permission on a directory on the
    way, a component that is not a directory, a loop, a name too long), or
    opening the regular file or directory it is fails (its own permission).
    Nothing else is opened: opening a FIFO or a device has effects of its
    own; O_NONBLOCK, so that no open waits."""
    try:
        st = os.stat(path)
        if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
            os.close(os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK))
    except OSError:
        return True
    return False


def open_model(path_or_name):
    """The Model safe_open uses: attached through wcached when it serves
    path_or_name, else mapped in-process from the file. Raises
    FileNotFoundError when neither (:class:`wcache.NoSuchFile`), or when
    the file cannot be opened (:class:`wcache.CannotOpenFile`, as upstream
    raises FileNotFoundError for any failure to open it), and
    :class:`wcache.SafetensorError` for a file that is not a valid model."""
    target = os.fspath(path_or_name)
    if not isinstance(target, str):
        target = os.fsdecode(target)
    model, why, answered = _attach(target)
    if model is not None:
        return model
    try:
        model = open_file(target)
    except WcacheError as e:
        if e.errno == errno.ENOENT and not os.path.exists(target):
            # upstream's message exactly (upstream checks that the path exists,
            # through symlinks: a dangling one, a Hugging Face snapshot link
            # whose blob was removed, is this too); why wcached did not serve
            # it in a note
            err = NoSuchFile(errno.ENOENT, f"No such file or directory: {target}", target)
            err.reason = f"wcached does not serve {target!r}: {why}"
            if hasattr(err, "add_note"):
                err.add_note(err.reason)
            raise err from None
        if _unopenable(target):
            raise CannotOpenFile(e.errno, e.strerror, target) from None
        if e.errno in INVALID_MODEL_ERRNOS:
            raise SafetensorError(e.errno, e.strerror) from None
        raise
    if answered:
        _not_served(target, why)
    return model


# Host registration of a handle (safe_open._host_state): tried on the first
# get_tensor of a "pt" handle on the CPU, once; close() ends it in any state.
_HOST_UNTRIED = "untried"   # -> held, none or closed
_HOST_HELD = "held"         # registered; _host_release lets go -> closed
_HOST_NONE = "none"         # off, refused or not applicable -> closed
_HOST_CLOSED = "closed"     # final

FRAMEWORKS = {"pt": "pt", "torch": "pt", "pytorch": "pt", "np": "np", "numpy": "np"}
BACKENDS = ("mmap", "pread")


def check_framework(framework):
    """"pt" or "np" for an upstream framework name; SafetensorError else."""
    f = FRAMEWORKS.get(framework) if isinstance(framework, str) else None
    if f is None:
        raise InvalidArgument(
            f"framework {framework} is invalid: wcache supports \"pt\" (also \"torch\", "
            f"\"pytorch\") and \"np\" (also \"numpy\")")
    return f


def check_backend(backend):
    if backend not in BACKENDS:
        raise InvalidArgument(
            f"backend {backend!r} is invalid (expected one of: \"mmap\", \"pread\")"
            .replace("'", '"'))
    return backend


def check_device(framework, device):
    """The device to copy tensors to, or None for the CPU (views)."""
    if device is None or device == "cpu":
        return None
    if isinstance(device, bool) or not isinstance(device, (str, int)):
        raise InvalidArgument(f"device {device!r} is invalid")
    if framework != "pt":
        raise InvalidArgument(f"Device {device} is not supported for framework numpy")
    if isinstance(device, int) and device < 0:
        raise InvalidArgument(f"device {device} is invalid")
    import torch
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise InvalidArgument(f"device {device} is invalid") from None
    return None if d.type == "cpu" else d


def _header_has_metadata(path):
    """For a file with no metadata entries: {} when its header has an empty
    "__metadata__" object, None when it has none (or path is no regular
    file, as a served model's name, or cannot be read)."""
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                return None
            n = struct.unpack("<Q", raw)[0]
            # Not a safetensors file (a shard index), or not one wcached
            # served: the file at path may have changed since.
            if n > min(os.fstat(f.fileno()).st_size - 8, MAX_HEADER):
                return None
            header = f.read(n)
    except OSError:
        return None
    pos = header.find(b'"__metadata__"')
    while pos >= 0:
        before = header[:pos].rstrip()
        after = header[pos + 14:].lstrip()
        if before[-1:] in (b"{", b",") and after[:1] == b":" and \
                after[1:].lstrip()[:1] == b"{":
            return {}
        pos = header.find(b'"__metadata__"', pos + 1)
    return None


def _slice_text(index):
    def one(x):
        if isinstance(x, slice):
            text = f"{'' if x.start is None else x.start}:{'' if x.stop is None else x.stop}"
            return text if x.step is None else f"{text}:{x.step}"
        return "..." if x is Ellipsis else str(x)
    return "[" + ", ".join(one(x) for x in index) + "]"


class _Slice:
    """What get_slice() returns: shape and dtype without touching data, and
    indexing that returns a view (zero-copy) of the selected part, checked
    as upstream checks it. Upstream has two ways: for "np", and for "pt"
    with backend="pread", its own slicer, which refuses bounds past the end
    and lists (:meth:`_check` makes its checks, with its messages); for
    "pt" with the default backend, torch's own ``__getitem__`` on the whole
    tensor, which clamps slice bounds and takes lists and tensors, and
    whose errors are torch's (kept here, as an :class:`InvalidSlice` with
    torch's message, when an IndexError). Steps in slices and negative
    bounds work as in Python (upstream's slicer has neither)."""

    def __init__(self, owner, name):
        self._owner = owner
        self._name = name
        model = owner._model_open()
        try:
            self._info = model.info(name)
        except MissingTensor:
            raise MissingTensor(f"File does not contain tensor {name}") from None  # upstream's
        self._strict = owner._framework == "np" or owner._backend == "pread"
        # The mapping, for indexing after the handle is closed: upstream's
        # slice holds the storage (an Arc), and its handle's close drops
        # only the handle's own reference. A model's _Handle keeps the
        # mapping while anything holds it (wcache/model.py).
        self._keep = (model._h(), model.source)
        self._own = None  # a Model of the slice's own over that handle, made after close

    def get_shape(self):
        return list(self._info.shape)

    def get_dtype(self):
        return self._info.dtype

    def get_ndim(self):
        return len(self._info.shape)

    def _check(self, index):
        shape = self._info.shape
        items = index if isinstance(index, tuple) else (index,)
        if any(isinstance(x, list) and x for x in items):
            raise InvalidSlice("Non empty lists are not implemented")
        dims = [x for x in items if x is not None and x is not Ellipsis]
        if len(dims) > len(shape):
            raise InvalidSlice(f"Error during slicing {_slice_text(items)} with shape "
                               f"{list(shape)}: too many indices ({len(dims)}) for a tensor "
                               f"of {len(shape)} dimensions")
        text = _slice_text(items)
        ellipses = [k for k, x in enumerate(items) if x is Ellipsis]
        if ellipses:
            if len(ellipses) > 1 or any(x is None for x in items):
                return index  # torch says what is wrong with these
            # Checked at the dimensions the Ellipsis stands for (torch would
            # name a dimension counted from it: "dimension 1" for [..., 7]).
            k = ellipses[0]
            items = items[:k] + (slice(None),) * (len(shape) - len(dims)) + items[k + 1:]
        for axis, (x, size) in enumerate(zip(items, shape)):
            if isinstance(x, bool) or not isinstance(x, (int, slice, list)):
                if hasattr(x, "__index__"):
                    x = x.__index__()
                else:
                    raise InvalidSlice(f"Error during slicing {text}: "
                                       f"{type(x).__name__} is not a valid index")
            if isinstance(x, int):
                if x < 0 and x + size < 0:
                    raise InvalidSlice(f"Invalid index {x} for dimension {axis} of size {size}")
                if x >= size:
                    raise InvalidSlice(
                        f"Error during slicing {text} with shape {list(shape)}: "
                        f"index {x} out of bounds for tensor dimension #{axis} of size {size}")
            elif isinstance(x, slice):
                for bound, shown in ((x.stop, lambda v: v - 1), (x.start, lambda v: v)):
                    if isinstance(bound, int) and bound > size:
                        raise InvalidSlice(
                            f"Error during slicing {text} with shape "
                            f"{list(shape)}: index {shown(bound)} out of bounds for tensor "
                            f"dimension #{axis} of size {size}")
        return index

    def __getitem__(self, index):
        asked = index
        if self._strict:
            index = self._check(index)
        owner = self._owner
        if owner._framework == "np":
            # Every dimension indexed ([0, 1], or [()] of a 0-d tensor):
            # numpy gives a scalar, a copy; upstream a 0-d ndarray, and with
            # an Ellipsis numpy gives that, a view as every other result.
            items = index if isinstance(index, tuple) else (index,)
            if not any(x is Ellipsis for x in items):
                index = items + (Ellipsis,)
        try:
            try:
                if owner._device is None:
                    whole = owner.get_tensor(self._name)
                else:
                    # On a device: the part selected, copied alone
                    # (upstream's size), never the whole tensor copied and
                    # then sliced, which would keep the whole tensor's
                    # device memory for the slice.
                    whole = owner._bulk().get(self._name)
            except ClosedError:
                whole = self._whole_after_close()
            try:
                part = whole[index]
            except TypeError as e:  # torch's or numpy's, which name no index: "new(): ..."
                raise TypeError(f"get_slice({self._name!r})[{asked!r}]: indices are ints, "
                                f"slices, Ellipsis or None (for torch also lists and "
                                f"tensors): {e}") from None
        except IndexError as e:
            if not self._strict:
                raise InvalidSlice(str(e)) from None  # torch's, as upstream raises it
            raise InvalidSlice(f"Error during slicing with shape {list(self._info.shape)}: "
                               f"{e}") from None
        return part if owner._device is None else tensor_to_device(part, owner._device)

    def _whole_after_close(self):
        """The whole tensor, on the CPU, once the handle is closed: a view
        made by a Model of this slice's own over the handle it keeps (one
        per slice, made on first use), on the same memory as the handle's
        tensors (torch: the same copy-on-write pages)."""
        model = self._own
        if model is None:
            model = self._own = Model(*self._keep)
        if self._owner._framework == "np":
            return model.numpy(self._name)
        return model.torch(self._name)

    def __repr__(self):
        return f"<wcache slice {self._name!r} {self._info.dtype} {list(self._info.shape)}>"


class safe_open:
    """``safetensors.safe_open`` over wcache (see the module comment).

    framework: "pt"/"torch"/"pytorch" or "np"/"numpy". device: "cpu" (the
    default) gives views on the mapping; another torch device, as a string
    or an int, copies tensors there (get_tensors() all at once, into one
    device buffer; see wcache/_device.py). backend:
    "mmap" or "pread", accepted for compatibility (tensors are views of the
    mapping either way; "pread" checks get_slice's indexing as "np" does,
    as upstream's does)."""

    _FORK_LOCKS = ("_host_lock", "_runs_lock")  # made anew in a child of fork() (fork_safe)

    def __init__(self, filename, framework="pt", device="cpu", *, backend="mmap"):
        self._model = None
        self._host_lock = threading.Lock()
        self._host_state = _HOST_UNTRIED
        self._host_release = None
        self._framework = check_framework(framework)
        self._device = check_device(self._framework, device)
        self._backend = check_backend(backend)
        self._filename = os.fspath(filename)
        self._model = open_model(filename)
        # metadata() of a file without entries, {} or None: read from the
        # header once, now, not at each call from whatever file is at the
        # path by then (renamed over, the handle still mapping the old one)
        self._empty_metadata = None if self._model.metadata() else \
            _header_has_metadata(self._filename)
        self._runs = None
        self._runs_lock = threading.Lock()
        fork_safe(self)

    def _model_open(self):
        model = self._model
        if model is None or model.closed:
            raise ClosedError("File is closed")
        return model

    @property
    def model(self):
        """The underlying :class:`wcache.Model`."""
        return self._model_open()

    def keys(self):
        """Tensor names, sorted (byte order)."""
        return self._model_open().keys()

    def offset_keys(self):
        """Tensor names in the order of their data in the file."""
        return self._model_open().offset_keys()

    def metadata(self):
        """The __metadata__ dict; None when the file has none, {} when it is
        empty (as safetensors returns)."""
        meta = self._model_open().metadata()
        if meta:
            return meta
        return None if self._empty_metadata is None else {}

    def _bulk(self):
        """This handle's one Runs (made on first use, by one thread: the
        others wait for it, so each tensor is handed out once)."""
        runs = self._runs
        if runs is None:
            with self._runs_lock:
                runs = self._runs
                if runs is None:
                    model = self._model_open()
                    if self._framework == "np":
                        from ._table import NumpyRuns
                        runs = NumpyRuns(model)
                    else:
                        from ._torch import TorchRuns
                        runs = TorchRuns(model)
                    self._runs = runs
        return runs

    def get_tensor(self, name):
        """Tensor name: a view of the mapping on the CPU (torch tensors
        copy-on-write, numpy arrays read-only), else a copy on device."""
        runs = self._runs
        if runs is None or self._model.closed:
            runs = self._bulk()
        if self._device is None:
            if self._host_state is _HOST_UNTRIED:
                self._register_host(runs)
            # From now on get_tensor is this closure: a loader calls it once
            # per tensor, and every layer of Python costs per tensor.
            ready_pop, slow = runs.ready.pop, runs.get

            def get_tensor(name):
                t = ready_pop(name, None)
                return slow(name) if t is None else t
            get_tensor.__doc__ = safe_open.get_tensor.__doc__
            self.get_tensor = get_tensor
            return get_tensor(name)
        return to_device(self._model_open(), [name], self._device, runs.get)[name]

    def get_tensors(self):
        """{name: tensor} of every tensor, in the order of the file. On a
        device: one buffer, tensors as views into it, batched copies (see
        wcache/_device.py)."""
        if self._device is not None:
            runs = self._bulk()
            return to_device(self._model_open(), self.offset_keys(), self._device, runs.get)
        every = self._bulk().every()
        return {k: every[k] for k in self.offset_keys()}

    def _register_host(self, runs):
        """WCACHE_HOST_REGISTER=1: registers this handle's mapping with CUDA
        read-only until close() or collection (wcache/_hostreg.py,
        host_register). Once per handle, whichever thread comes first;
        the others wait for it, so their copies find the memory
        registered. Never raises."""
        with self._host_lock:
            if self._host_state is not _HOST_UNTRIED:
                return
            release = None
            if self._framework == "pt" and host_register_wanted():
                if not getattr(runs, "views", False):
                    _say_once(logging.WARNING,
                              "wcache: WCACHE_HOST_REGISTER=1: nothing registered: torch "
                              "tensors are not views of the mapping here (WCACHE_TORCH_COW, "
                              "or a libwcache without wc_model_cow())")
                else:
                    release = host_register(self, self._model)
            # Untried until now: a thread that came in meanwhile waited on the lock.
            self._host_release = release
            self._host_state = _HOST_NONE if release is None else _HOST_HELD

    def get_slice(self, name):
        """A lazy handle on tensor name: get_shape(), get_dtype(), and
        indexing (``[:, :2]``) that returns the selected part."""
        return _Slice(self, name)

    def close(self):
        with self._host_lock:
            release, self._host_release = self._host_release, None
            self._host_state = _HOST_CLOSED
        if release is not None:
            release()  # before the model: the registration keeps the mapping until it is undone
        if self._model is not None:
            self._model.close()
        # Taken before it is used: another thread may close at the same time.
        # Under the lock: runs another thread's _bulk is making are kept
        # first, then taken here (else kept after, on a closed handle).
        with self._runs_lock:
            runs, self._runs = self._runs, None
        if runs is not None:
            runs.close()  # a get_tensor bound before close raises too
        self.__dict__.pop("get_tensor", None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<wcache.safe_open {self._model!r} framework={self._framework}>"


class _safe_open_handle(safe_open):
    """upstream's _safe_open_handle: safe_open of an open file object (a
    local file, an fsspec file). A file with a descriptor is opened through
    /proc/self/fd (and attached through wcached when it serves that file);
    any other file object is read into a memfd first. That path names the
    descriptor only while it is open (the memfd's is closed on return, the
    caller may close theirs), so what metadata() reads from the file is
    read here, at open."""

    def __init__(self, f, framework="pt", device="cpu", *, backend="mmap"):
        fd = None
        try:
            try:
                fileno = f.fileno()
            except (AttributeError, OSError, ValueError):
                f.seek(0)
                fd = os.memfd_create("wcache-handle", os.MFD_CLOEXEC)
                with os.fdopen(os.dup(fd), "wb") as out:
                    while True:
                        chunk = f.read(16 << 20)
                        if not chunk:
                            break
                        out.write(chunk)
                fileno = fd
            path = f"/proc/self/fd/{fileno}"
            super().__init__(path, framework, device, backend=backend)
        finally:
            if fd is not None:
                os.close(fd)  # the model keeps its own mapping
