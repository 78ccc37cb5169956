"""Client, Model and the zero-copy numpy views over libwcache.

Lifetime (the rule every view relies on): a :class:`Model` owns a
``_Handle``, the one Python object that owns the C ``wc_model``. Every array
or tensor made from the model holds a reference to that handle (through the
array's ``base``, the tensor's storage), or, for torch tensors made on a
private mapping of the file (wcache/_torch.py, way 2), to that mapping. ``Model.close()`` (or leaving a
``with`` block) closes the Python object: later calls on it raise
ValueError, and it drops its reference to the handle. The C model is
released (``wc_release``: unmapped, and the daemon told) when the last
reference goes, that is when the model and every view made from it are
gone. A view can never outlive its mapping, whatever order the program
drops things in; memory stays mapped as long as something can read it.

A handle also keeps the :class:`Client` it was attached through alive, so
the daemon hears about the release on the same connection; ``Client.close()``
still disconnects at once when asked (attached models stay valid, as the C
API promises).

Restarts of wcached (a crash, an upgrade, ``systemctl restart``) need
nothing from the caller: the next ``Client.attach()`` finds the connection
dead, connects again to the same socket once, within the client's deadline,
and sends the request again (libwcache does it, see wcache(3)). Models
attached before the restart stay valid and readable; closing them only
unmaps (the daemon that served them released them when it went away).

After ``os.fork()`` every model, view and tensor stays valid in the child
(mappings are inherited). A child that needs more models must ``connect()``
again; ``safe_open`` does that by itself.
"""
import ctypes
import errno
import numbers
import os
import threading

import numpy as np

from . import _lib
from ._dtypes import numpy_typestr
from ._lib import DaemonUnavailable, MissingTensor, ModelNotFound, check, wc_tensor
from ._table import NUMPY_MAX_DIMS, Table

__all__ = ["Client", "Model", "TensorInfo", "connect", "open_file"]

_torch = None  # wcache._torch, imported (with torch) on first Model.torch()


class TensorInfo(tuple):
    """(name, dtype, shape, nbytes) of one tensor, plus its address."""
    __slots__ = ()

    def __new__(cls, name, dtype, shape, nbytes, data):
        return tuple.__new__(cls, (name, dtype, shape, nbytes, data))

    name = property(lambda self: self[0], doc="tensor name")
    dtype = property(lambda self: self[1], doc='safetensors dtype, e.g. "BF16"')
    shape = property(lambda self: self[2], doc="shape as a tuple of ints")
    nbytes = property(lambda self: self[3], doc="size of the data in bytes")
    data = property(lambda self: self[4], doc="address of the first byte")

    def __repr__(self):
        return f"TensorInfo(name={self.name!r}, dtype={self.dtype!r}, shape={self.shape})"


# The longest model name or path wcached takes (proto/wire.h WIRE_MAX_NAME,
# which libwcache does not export: it refuses a longer one with EINVAL
# before asking). A name of 0 bytes or of more is one wcached cannot serve.
WIRE_MAX_NAME = 1024


def askable(name):
    """Whether wcached could serve a model under name (str or bytes): 1 to
    WIRE_MAX_NAME bytes. A file's path longer than that is still a file."""
    if isinstance(name, str):
        name = name.encode("utf-8", "surrogateescape")
    return 1 <= len(name) <= WIRE_MAX_NAME


def _c_string(value, what):
    """value (str or bytes) as bytes for a C string parameter; ValueError,
    as Python's open() raises, when it holds a NUL, which C would take for
    its end (and find or open what comes before it)."""
    if isinstance(value, str):
        value = value.encode("utf-8", "surrogateescape")
    if b"\0" in value:
        raise ValueError(f"{what} {value!r}: embedded null byte")
    return value


def _info(t):
    return TensorInfo(t.name.decode("utf-8", "surrogateescape"), t.dtype.decode("ascii"),
                      tuple(t.shape[:t.ndim]), t.nbytes, t.data or 0)


class _Handle:
    """Owns one C wc_model; releases it when the last reference goes,
    through the library that made it (kept here: a finalizer may run, by a
    garbage collection, in a thread that holds _lib's lock, loading the
    library, and must not take that lock)."""
    __slots__ = ("ptr", "label", "client", "lib", "cow", "served", "__weakref__")

    def __init__(self, ptr, label, client=None, served=None):
        self.ptr = ptr
        self.label = label
        self.client = client      # keeps the connection open for RELEASE
        self.lib = _lib.lib()     # loaded already: ptr came from it
        self.cow = None           # make_cow(): not tried, True, or why not (str)
        # A file of a model wcached serves as a directory, mapped here
        # (wcache/_shards.py): that model's _Handle, kept attached (its
        # generation held) as long as this one, released after it.
        self.served = served

    def daemon_ptr(self):
        """The wc_model wcached counts for this one: the served directory's
        for a file of it, else this one's."""
        return self.ptr if self.served is None else self.served.ptr

    def __del__(self):
        ptr, self.ptr = self.ptr, None
        if ptr:
            try:
                self.lib.wc_release(ptr)
            except Exception:  # interpreter shutdown: the process unmaps anyway
                pass


class _ArrayOwner:
    """The base object of a view: exposes the memory to numpy and keeps the
    handle (and so the mapping) alive as long as the array exists."""
    __slots__ = ("__array_interface__", "handle")

    def __init__(self, handle, data, shape, typestr, readonly):
        self.handle = handle
        self.__array_interface__ = {
            "version": 3, "shape": shape, "typestr": typestr,
            "data": (data, readonly), "strides": None,
        }


def _view(handle, data, shape, typestr, readonly=True):
    """A numpy array over [data, data + size) that keeps handle alive."""
    return np.asarray(_ArrayOwner(handle, data, shape, typestr, readonly))


def make_cow(handle):
    """Makes the handle's model memory copy-on-write in this process
    (wc_model_cow(): one mprotect per file, no memory until a page is
    written), once per handle; True when it is, else why not (a str).

    Every view of a model's memory is made on that memory, the read-only
    numpy arrays too (Model.numpy, raw, safe_open's and load_file's arrays):
    numpy refuses writes through them, but whatever ignores that flag
    (torch.from_numpy or as_tensor, ctypes, a C extension) writes through
    the address, and on the PROT_READ mapping the kernel kills the process
    with SIGSEGV. On the copy-on-write one such a write gives this process a
    private copy of the page and never reaches the file or another process;
    pages nobody writes stay the page cache every worker maps (same PSS,
    still zero-copy). Where the library cannot (no wc_model_cow, files
    mapped shared, ENOMEM under vm.overcommit_memory=2) the memory stays
    read-only, as before. Two threads may both call the library: mprotect
    to the same protection twice is harmless."""
    state = handle.cow
    if state is None:
        fn = getattr(handle.lib, "wc_model_cow", None)
        if fn is None or fn.argtypes is None:
            state = "libwcache has no wc_model_cow()"
        else:
            rc = fn(handle.ptr)
            state = True if rc >= 0 else (_lib.errmsg() or os.strerror(-rc))
        handle.cow = state
    return state


def _ro_view(handle, data, shape, typestr):
    """A read-only numpy array over [data, data + size), on memory made
    copy-on-write first (make_cow), that keeps handle alive."""
    make_cow(handle)
    return _view(handle, data, shape, typestr)


class Model:
    """A model mapped through wcache: a read-only set of named tensors.

    Get one with :func:`open_file` (in-process) or :meth:`Client.attach`
    (through wcached). Iterating yields tensor names in byte order;
    ``len()`` and ``in`` work on names.
    """

    _FORK_LOCKS = ("_lock",)  # made anew in a child of fork() (_lib.fork_safe)

    def __init__(self, handle, source):
        self._handle = handle
        self._source = source
        self._infos = {}
        self._names = None
        self._table = None        # wcache._table.Table, read on first use
        self._span = None         # (lowest, highest) address of tensor data
        self._region = None       # read-only uint8 array over the span
        self._torch_state = None  # see _torch.py
        self._lock = threading.Lock()
        self._label = handle.label
        _lib.fork_safe(self)

    # -- identity and state --

    @property
    def name(self):
        """The model name (attached) or the path (opened in-process)."""
        return self._label

    @property
    def source(self):
        """"wcached" when attached through the daemon, "file" when mapped in
        this process. A file of a model wcached serves as a directory,
        opened by its own path (safe_open(DIR/shard)), is "wcached": it is
        this process's own open and mapping of that path (the same inode and
        page cache as wcached's mapping, opened with this process's
        credentials), or of a staged model, wcached's staged copy of it
        mapped through the descriptor wcached passed; the directory's
        generation stays attached, counted as in use by wcached, while it
        lives (wcache/_shards.py)."""
        return self._source

    @property
    def closed(self):
        return self._handle is None

    @property
    def generation(self):
        """The generation wcached served this model as (for a file of a
        served directory, the directory's); 0 in-process."""
        return int(_lib.lib().wc_model_generation(self._h().daemon_ptr()))

    def stale(self):
        """True when wcached now serves a newer generation under this
        model's name (or no longer serves it); always False in-process.
        No system call: it reads the daemon's status page. A stale model
        stays valid; attach again for the new generation, then close this
        one.

        The page is the daemon's that served the model. After wcached
        crashed (SIGKILL, a fault) and was started again without systemd's
        descriptor store, that page is never written again: stale() stays
        False for good, even when the new daemon serves other weights under
        the name, and the new daemon's generation numbers start again (they
        can equal this model's). A worker that must pick up new weights
        after such a restart cannot rely on stale() or generation: it has
        to attach again. A daemon that exits on SIGTERM marks its models
        stale; under systemd's store a restarted daemon keeps the page
        (proto/PROTOCOL.md, "Restarts")."""
        return bool(_lib.lib().wc_model_stale(self._h().daemon_ptr()))

    def _h(self):
        """The handle; ClosedError (a ValueError, and upstream's
        SafetensorError) once closed: safe_open's calls that another
        thread's close() overtakes reach here, and must raise what a closed
        handle raises."""
        h = self._handle
        if h is None:
            raise _lib.ClosedError(f"model {self._label!r} is closed")
        return h

    def close(self):
        """Closes this object. Arrays and tensors made from it stay valid;
        the mapping goes when the last of them does.

        Under the model's lock, which every call that keeps state on the
        model (_tab, _keep_region, wcache._torch._state_of) stores it under
        after checking the model is open: a call that another thread's
        close() overtakes returns what it made without keeping it, so a
        closed model holds nothing that keeps the mapping alive."""
        with self._lock:
            if self._handle is None:
                return
            self._handle = None
            self._infos = {}
            self._names = None
            self._table = None
            self._span = None
            self._region = None
            self._torch_state = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self.closed else f"{len(self)} tensors"
        return f"<wcache.Model {self.name!r} ({self._source}, {state})>"

    # -- tensors --

    def _tab(self):
        """The :class:`wcache._table.Table` of every tensor (read on first
        use, in one library call)."""
        h = self._h()
        table = self._table
        if table is None:
            with self._lock:
                table = self._table
                if table is None:
                    table = Table(h)
                    if self._handle is h:  # else closed meanwhile: keep nothing
                        self._table, self._span, self._names = table, table.span, table.names
        return table

    def _all(self):
        return self._tab().names

    def _slice(self, info, typestr, writable_region=None, shape=None):
        """Tensor info as an array sliced from one array over all tensor data
        (cheaper than one __array_interface__ per tensor), or None when the
        table of all tensors has not been read. The big array spans every
        tensor of the model (and whatever lies between files); it is never
        handed out, only slices of it that cover one tensor each."""
        span = self._span  # read once: close() in another thread clears it
        if span is None or not info.nbytes:
            return None
        lo, hi = span
        region = writable_region
        if region is None:
            region = self._region
            if region is None:
                region = self._keep_region(_ro_view(self._h(), lo, (hi - lo,), "|u1"))
        off = info.data - lo
        return region[off:off + info.nbytes].view(typestr).reshape(
            info.shape if shape is None else shape)

    def _raw_region(self):
        """The read-only uint8 array over the span of all tensor data."""
        region = self._region  # read once: close() in another thread clears it
        if region is None:
            lo, hi = self._tab().span
            region = self._keep_region(_ro_view(self._h(), lo, (hi - lo,), "|u1"))
        return region

    def _keep_region(self, region):
        """The model's region: region, now kept, unless another thread kept
        one first (then that one) or closed the model (then region, kept
        nowhere: it holds the handle, and so the mapping)."""
        with self._lock:
            if self._handle is None:
                return region
            if self._region is None:
                self._region = region
            return self._region

    def info(self, name):
        """The :class:`TensorInfo` of tensor name; KeyError if there is none."""
        # The dict before the handle: close() clears the handle first, then
        # replaces the dict, so a call close() overtakes fills the old one.
        infos = self._infos
        h = self._h()
        info = infos.get(name)
        if info is not None:
            return info
        if not isinstance(name, str):
            raise TypeError(f"tensor names are str, not {type(name).__name__}")
        table = self._table
        if table is not None:
            i = table.position(name)
            if i is None:
                raise MissingTensor(f"model {h.label!r} has no tensor {name!r}")
            info = infos[name] = table.info(i)
            return info
        if "\0" in name:
            # No file has such a name (the parser refuses it); C would look
            # up the part before the NUL.
            raise MissingTensor(f"model {h.label!r} has no tensor {name!r}")
        t = wc_tensor()
        rc = _lib.lib().wc_model_find(h.ptr, name.encode("utf-8", "surrogateescape"),
                                      ctypes.byref(t))
        if rc == -errno.ENOENT:
            raise MissingTensor(f"model {h.label!r} has no tensor {name!r}")
        check(rc)
        info = infos[name] = _info(t)
        return info

    def keys(self):
        """Tensor names, in byte order."""
        return list(self._all())

    def __iter__(self):
        return iter(self.keys())

    def __len__(self):
        return int(_lib.lib().wc_model_count(self._h().ptr))

    def offset_keys(self):
        """Tensor names in the order of their data (file order)."""
        return self._tab().offset_keys()

    def __contains__(self, name):
        if not isinstance(name, str):
            return False
        try:
            self.info(name)
        except KeyError:
            return False
        return True

    def metadata(self):
        """The safetensors __metadata__ as a dict of str (empty if none)."""
        h = self._h()
        lib = _lib.lib()
        key, value = ctypes.c_char_p(), ctypes.c_char_p()
        out = {}
        i = 0
        while True:
            rc = lib.wc_model_metadata_at(h.ptr, i, ctypes.byref(key), ctypes.byref(value))
            if rc == -errno.ERANGE:  # past the end
                return out
            check(rc)
            out[key.value.decode("utf-8", "surrogateescape")] = \
                value.value.decode("utf-8", "surrogateescape")
            i += 1

    def raw(self, name):
        """The bytes of tensor name as a read-only 1-D uint8 array (zero-copy),
        for any dtype, including those numpy has no type for."""
        info = self.info(name)
        a = self._slice(info, "|u1", shape=(info.nbytes,))
        return a if a is not None else _ro_view(self._h(), info.data, (info.nbytes,), "|u1")

    def numpy(self, name):
        """Tensor name as a read-only numpy array on the mapping (zero-copy).

        Writing to it raises ValueError; ``.copy()`` gives a writable copy.
        A tensor of more dimensions than numpy allows (32 before numpy 2)
        raises ValueError naming it.
        BF16, FP8, FP4 and FP6 tensors raise TypeError: numpy has no such
        types (``raw(name)`` gives the bytes; for BF16
        ``raw(name).view(numpy.uint16).reshape(shape)`` gives the bit
        patterns, still zero-copy, and ``torch(name)`` a torch.bfloat16)."""
        info = self.info(name)
        typestr = numpy_typestr(info.dtype)
        if typestr is None:
            raise TypeError(_no_numpy_type(self._h().label, info))
        if len(info.shape) > NUMPY_MAX_DIMS:
            raise too_many_dims(self._h().label, info)
        a = self._slice(info, typestr)
        return a if a is not None else _ro_view(self._h(), info.data, info.shape, typestr)

    def torch(self, name):
        """Tensor name as a torch tensor on the mapping (zero-copy, CPU).

        torch has no read-only tensors, so the tensor's memory is made
        copy-on-write for this process (see wcache/_torch.py): reads share
        the page cache with every other worker; an in-place write gives this
        process a private copy of the pages it touches and never reaches the
        file or another process. ``.clone()`` gives an independent copy."""
        global _torch
        if _torch is None:
            from . import _torch
        return _torch.tensor(self, self.info(name))

    def state_dict(self, framework="pt"):
        """Every tensor, as {name: torch tensor} ("pt") or numpy array ("np")."""
        get = self.torch if _framework(framework) == "pt" else self.numpy
        return {name: get(name) for name in self.keys()}


def too_many_dims(label, info):
    """The ValueError for a tensor numpy cannot have (more dimensions than
    NUMPY_MAX_DIMS): one line naming the model, the tensor and why, rather
    than numpy's own, which names neither."""
    return ValueError(f"model {label!r}: tensor {info.name!r} has {len(info.shape)} "
                      f"dimensions, more than numpy's limit of {NUMPY_MAX_DIMS}; "
                      f"model.torch(name) gives it as a torch tensor, model.raw(name) its "
                      f"bytes")


def _no_numpy_type(label, info):
    if info.dtype == "BF16":
        return (f"model {label!r}: tensor {info.name!r} is BF16 and numpy has no bfloat16; "
                f"use model.torch(name) for a torch.bfloat16 tensor, or "
                f"model.raw(name).view(numpy.uint16).reshape({info.shape}) for its bit "
                f"patterns (zero-copy)")
    return (f"model {label!r}: tensor {info.name!r} is {info.dtype}, which numpy has no "
            f"type for; model.raw(name) gives its bytes")


def _framework(framework):
    f = str(framework).lower()
    if f in ("pt", "torch", "pytorch"):
        return "pt"
    if f in ("np", "numpy"):
        return "np"
    raise ValueError(f"framework {framework!r} is not supported: use \"pt\" (torch) or "
                     f"\"np\" (numpy)")


# Guards every Client's pointer, closing flag and count of calls in progress
# (Client._use). Held for a few loads and stores only, never while calling
# the library. Reentrant: a garbage collection that runs while it is held
# may run another Client's __del__ (close()) in the same thread. fork()
# waits for it to be free, so a child never inherits it held.
_clients_lock = threading.RLock()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_clients_lock.acquire, after_in_parent=_clients_lock.release,
                        after_in_child=_clients_lock.release)


class Client:
    """A connection to wcached's client socket. Use :func:`connect`.

    Threads: any number may attach at once (libwcache takes turns). close()
    in one thread while another attaches is allowed: the attach returns its
    model or raises ValueError, and the connection is closed when the last
    call using it returns (wc_disconnect() must not run while a call can
    still reach the C client)."""

    def __init__(self, ptr, socket):
        self._ptr = ptr
        self._lib = _lib.lib()  # ptr's library, for wc_disconnect (see _Handle)
        self._closing = False  # close() was called
        self._users = 0        # calls using _ptr now (in process _users_pid)
        self._users_pid = os.getpid()
        self.socket = socket

    @property
    def closed(self):
        return not self._ptr or self._closing

    def _use(self):
        """The C client for one call, which must end with _done(); ValueError
        once close() was called."""
        with _clients_lock:
            ptr = None if self._closing else self._ptr
            if ptr:
                if self._users_pid != os.getpid():  # calls of a parent's threads
                    self._users, self._users_pid = 0, os.getpid()
                self._users += 1
        if not ptr:
            raise ValueError(f"client of wcached at {self.socket} is closed")
        return ptr

    def _done(self):
        """Ends a call _use() began; the last one after close() disconnects."""
        ptr = None
        with _clients_lock:
            self._users -= 1
            if self._closing and self._users == 0:
                ptr, self._ptr = self._ptr, None
        if ptr:
            self._lib.wc_disconnect(ptr)

    def attach(self, name, *, _keep_fds=False):
        """Attaches the model wcached serves as name (a configured name or the
        exact configured path). Raises ModelNotFound when it serves none.

        After wcached restarted, the first attach reconnects to the same
        socket by itself (once, within the deadline) and retries; it raises
        DaemonUnavailable only when no wcached answers there.

        _keep_fds: attach with wc_attach_fds(), the model keeping a
        descriptor of each of its files (wcache/_shards.py)."""
        name = _c_string(os.fspath(name), "model name")
        if not askable(name):
            # what libwcache would refuse as EINVAL cannot be served: the
            # caller (safe_open of a long path) goes on to the file
            shown = name[:64].decode("utf-8", "replace")
            raise ModelNotFound(errno.ENOENT, f"model \"{shown}\"{'...' if len(name) > 64 else ''}: "
                                f"not served: wcached serves names and paths of 1 to "
                                f"{WIRE_MAX_NAME} bytes, not {len(name)}")
        ptr = self._use()
        try:
            out = ctypes.c_void_p()
            call = _lib.lib().wc_attach_fds if _keep_fds else _lib.lib().wc_attach
            rc = call(ptr, name, ctypes.byref(out))
        finally:
            self._done()
        if rc == -errno.ENOENT:
            check(rc, ModelNotFound)
        if -rc in _lib._DAEMON_DOWN:
            check(rc, DaemonUnavailable)
        check(rc)
        label = name.decode("utf-8", "surrogateescape")
        return Model(_Handle(out.value, label, self), "wcached")

    def set_timeout(self, timeout):
        """Changes this client's deadline (seconds, 0 for none), as
        connect(timeout=) sets it. Needs wc_set_timeout() in libwcache."""
        if self.closed:
            raise ValueError(f"client of wcached at {self.socket} is closed")
        if not _lib.has("wc_set_timeout"):
            raise _lib.WcacheError(errno.ENOTSUP, f"libwcache {_lib.library_path()} has no "
                                   "wc_set_timeout()")
        ms = _timeout_ms(timeout)
        ptr = self._use()
        try:
            rc = _lib.lib().wc_set_timeout(ptr, min(ms, 2**31 - 1))
        finally:
            self._done()
        check(rc)

    def close(self):
        """Disconnects (once no call of another thread uses the connection).
        Models attached through this client stay valid."""
        ptr = None
        with _clients_lock:
            if self._users_pid != os.getpid():
                self._users, self._users_pid = 0, os.getpid()
            self._closing = True
            if self._users == 0:
                ptr, self._ptr = self._ptr, None
        if ptr:
            self._lib.wc_disconnect(ptr)

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<wcache.Client {self.socket} ({'closed' if self.closed else 'open'})>"


def default_socket():
    """The socket wc_connect(NULL) uses: $WCACHE_SOCKET, else the default
    (/run/wcached/wcached.sock), as libwcache's wc_default_socket() says."""
    return os.fsdecode(_lib.lib().wc_default_socket())


def _timeout_ms(timeout):
    """A deadline of timeout seconds (0: none) in the milliseconds libwcache
    takes: a positive one is 1 ms at least, a long one 2**31 - 1 ms at most.
    TypeError for what is not a number, ValueError for a negative one or
    NaN, each naming the argument."""
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):  # numpy's too
        raise TypeError(f"timeout={timeout!r}: seconds (a number), 0 for none, not "
                        f"{type(timeout).__name__}")
    if not timeout >= 0:
        raise ValueError(f"timeout={timeout!r}: seconds, 0 for none")
    ms = round(min(timeout, 2**31) * 1000)
    return min(max(int(ms), 1 if timeout > 0 else 0), 2**31 - 1)


def connect(socket=None, timeout=None):
    """Connects to wcached (socket None: $WCACHE_SOCKET, else
    /run/wcached/wcached.sock). Raises DaemonUnavailable when no wcached
    runs there (no socket, connection refused), WcacheError for any other
    failure (permission denied, not accepted within the deadline, a socket
    of another kind at the path).

    timeout: the client's deadline in seconds for the connect and every
    later wait on the daemon (an attach, a release), 0 for none; past it a
    call raises WcacheError with errno ETIMEDOUT and the connection is
    closed (the next attach connects again by itself). None: $WCACHE_TIMEOUT seconds (0: none), else libwcache's
    default of 30 s. Needs a libwcache with wc_connect_timeout() when
    given."""
    lib = _lib.lib()
    path = os.fspath(socket) if socket is not None else None
    out = ctypes.c_void_p()
    where = _c_string(os.fsencode(path), "socket path") if path is not None else None
    if timeout is None:
        rc = lib.wc_connect(where, ctypes.byref(out))
    else:
        if not _lib.has("wc_connect_timeout"):
            raise _lib.WcacheError(errno.ENOTSUP, f"timeout={timeout!r}: libwcache "
                                   f"{_lib.library_path()} has no wc_connect_timeout(); set "
                                   "WCACHE_TIMEOUT instead")
        rc = lib.wc_connect_timeout(where, _timeout_ms(timeout), ctypes.byref(out))
    if rc < 0:
        # Only "nobody listens there" is DaemonUnavailable, which safe_open
        # and derived take for "map the file here instead"; a socket this
        # user may not use, a daemon that does not accept within the
        # deadline, or something else at the path is an error to see.
        check(rc, DaemonUnavailable if -rc in _lib._DAEMON_DOWN else _lib.WcacheError)
    return Client(out.value, path if path is not None else default_socket())


def open_file(path):
    """Maps and validates a model in this process, without the daemon: a
    safetensors file, a shard index (model.safetensors.index.json), a
    directory holding one of those, or a WEIG file.

    A path that does not exist raises :class:`wcache.NoSuchFile`, and a
    file it needs that is missing (a shard, a directory's model file)
    :class:`wcache.CannotOpenFile`: both FileNotFoundError, as safe_open
    raises; any other failure WcacheError (SafetensorError's errnos for a
    file that is not a valid model)."""
    path = os.fspath(path)
    out = ctypes.c_void_p()
    rc = _lib.lib().wc_open_file(_c_string(os.fsencode(path), "path"), ctypes.byref(out))
    if rc == -errno.ENOENT:
        msg = _lib.errmsg() or os.strerror(errno.ENOENT)
        cls = _lib.CannotOpenFile if os.path.exists(path) else _lib.NoSuchFile
        raise cls(errno.ENOENT, msg, path)
    check(rc)
    return Model(_Handle(out.value, path if isinstance(path, str) else os.fsdecode(path)),
                 "file")

