"""Finding and loading libwcache, declaring its functions for ctypes, and
turning its negative errno returns into Python exceptions.

The library is loaded lazily, on the first call that needs it, so that
`import wcache` and `python3 -m wcache.convert` work on a machine without
libwcache. Lookup order:

1. ``$WCACHE_LIB``: the exact file to load. When it is set, nothing else is
   tried: an explicit choice that fails must not silently load another copy.
2. The build tree: walking up from this package's directory, every
   ``<ancestor>/build/lib/libwcache.so.0`` (then ``libwcache.so``), so a
   checkout works without installing anything.
3. The system's library path: ``ctypes.util.find_library("wcache")``, then
   ``libwcache.so.0`` through the dynamic loader (``LD_LIBRARY_PATH``,
   ``ld.so.cache``).

When all fail, :class:`LibraryNotFound` lists every candidate and why it
failed.
"""
import ctypes
import ctypes.util
import errno as _errno
import os
import threading
import weakref

__all__ = [
    "WcacheError", "DaemonUnavailable", "ModelNotFound", "LibraryNotFound", "SafetensorError",
    "lib", "library_path", "check",
]


class WcacheError(OSError):
    """A libwcache call failed. ``errno`` is the positive errno value and
    ``strerror`` the library's message, which names the file or model and the
    reason. str() is that message alone."""

    def __str__(self):
        return self.strerror if self.strerror else super().__str__()


class DaemonUnavailable(WcacheError, ConnectionError):
    """wcached cannot be reached on its client socket (not running, socket
    missing, connection refused or reset)."""


class ModelNotFound(WcacheError):
    """wcached is running but does not serve a model of that name or path."""


class NoSuchFile(ModelNotFound, FileNotFoundError):
    """safe_open of a path that does not exist and that wcached does not
    serve: a FileNotFoundError, as upstream raises, and the ModelNotFound
    wcache raised before."""


class CannotOpenFile(WcacheError, FileNotFoundError):
    """safe_open of a path that exists, or may, but cannot be opened
    (permission denied, a component that is not a directory, a symlink
    loop, a name too long): a FileNotFoundError, as upstream raises for
    every failure to open the file (bindings/python/src/lib.rs,
    Open::new), with this failure's errno and message."""


# The codes libwcache returns for a file that is not a valid model (as
# opposed to one that could not be read): safetensors' SafetensorError.
INVALID_MODEL_ERRNOS = (_errno.EINVAL, _errno.EBADMSG, _errno.ERANGE, _errno.EOVERFLOW,
                        _errno.E2BIG, _errno.EFBIG)


class SafetensorError(WcacheError):
    """What ``safetensors.SafetensorError`` is to safetensors: raised where
    upstream raises it (a file that is not valid safetensors, a missing
    tensor, a closed handle, an invalid slice index, an unknown framework,
    device or backend, an unknown dtype). A :class:`WcacheError` as well,
    so code that catches wcache's errors keeps working. str() is the
    message alone."""


class MissingTensor(SafetensorError, KeyError):
    """A tensor name the file does not have (also a KeyError, as
    ``wcache.Model`` raised before)."""

    def __str__(self):
        return SafetensorError.__str__(self)


class ClosedError(SafetensorError, ValueError):
    """A call on a closed ``safe_open`` handle (also a ValueError, as
    before)."""


class InvalidSlice(SafetensorError, IndexError):
    """An index of ``get_slice(name)[...]`` out of range or not supported
    (also an IndexError, as before)."""


class InvalidArgument(SafetensorError, ValueError):
    """An unknown framework, device, backend or dtype (also a ValueError,
    as before)."""


class InvalidTensorSpec(SafetensorError, TypeError):
    """serialize() input that is neither a TensorSpec nor a complete dict
    (upstream 0.7 raises SafetensorError here, 0.8 TypeError: this is
    both)."""


class LibraryNotFound(ImportError):
    """libwcache could not be loaded; the message lists what was tried."""


class wc_tensor(ctypes.Structure):
    """struct wc_tensor from client/lib/wcache.h."""
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_char_p),
        ("ndim", ctypes.c_uint32),
        ("shape", ctypes.POINTER(ctypes.c_uint64)),
        ("data", ctypes.c_void_p),
        ("nbytes", ctypes.c_uint64),
    ]


class wc_file_identity(ctypes.Structure):
    """struct wc_file_identity from client/lib/wcache.h."""
    _fields_ = [
        ("dev", ctypes.c_uint64),
        ("ino", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
        ("mtime_ns", ctypes.c_int64),
        ("ctime_ns", ctypes.c_int64),
    ]


_P = ctypes.c_void_p
_PP = ctypes.POINTER(ctypes.c_void_p)
_T = ctypes.POINTER(wc_tensor)

# name: (restype, argtypes). Every function in client/lib/wcache.h.
_REQUIRED = {
    "wc_open_file": (ctypes.c_int, [ctypes.c_char_p, _PP]),
    "wc_open_fd": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p, _PP]),
    "wc_release": (None, [_P]),
    "wc_model_count": (ctypes.c_size_t, [_P]),
    "wc_model_tensor": (ctypes.c_int, [_P, ctypes.c_size_t, _T]),
    "wc_model_find": (ctypes.c_int, [_P, ctypes.c_char_p, _T]),
    "wc_model_metadata": (ctypes.c_char_p, [_P, ctypes.c_char_p]),
    "wc_model_metadata_at": (ctypes.c_int, [_P, ctypes.c_size_t,
                                            ctypes.POINTER(ctypes.c_char_p),
                                            ctypes.POINTER(ctypes.c_char_p)]),
    "wc_model_generation": (ctypes.c_uint64, [_P]),
    "wc_model_stale": (ctypes.c_int, [_P]),
    "wc_errmsg": (ctypes.c_char_p, []),
    "wc_connect": (ctypes.c_int, [ctypes.c_char_p, _PP]),
    "wc_default_socket": (ctypes.c_char_p, []),
    "wc_attach": (ctypes.c_int, [_P, ctypes.c_char_p, _PP]),
    "wc_disconnect": (None, [_P]),
}

# Functions used when the library has them (feature checks).
_OPTIONAL = {
    # Proposed: makes a model's data writable copy-on-write in this process
    # (see wcache/_torch.py and client/python/README.md).
    "wc_model_cow": (ctypes.c_int, [_P]),
    # Client deadlines (libwcache with WCACHE_TIMEOUT support).
    "wc_connect_timeout": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_int, _PP]),
    "wc_set_timeout": (ctypes.c_int, [_P, ctypes.c_int]),
    # Every tensor record in one call (wcache/_table.py).
    "wc_model_tensors": (ctypes.c_int, [_P, ctypes.c_size_t, _T, ctypes.c_size_t]),
    # A derived artifact's memfd descriptor, lent (wcache/_device.py maps
    # its shared view through it: a memfd has no path to open).
    "wc_model_fd": (ctypes.c_int, [_P, ctypes.c_size_t]),
    # A model that keeps its files' descriptors, and the names its index
    # gives its files (wcache/_shards.py: which file at a path is which
    # file of a served directory).
    "wc_attach_fds": (ctypes.c_int, [_P, ctypes.c_char_p, _PP]),
    "wc_model_file_count": (ctypes.c_size_t, [_P]),
    "wc_model_file_name": (ctypes.c_char_p, [_P, ctypes.c_size_t]),
    # Each file's identity as attached, and dropping a kept descriptor
    # (wcache/_shards.py keeps none but a staged copy's: review rev172 F2).
    "wc_model_file_identity": (ctypes.c_int, [_P, ctypes.c_size_t,
                                              ctypes.POINTER(wc_file_identity)]),
    "wc_model_close_fd": (ctypes.c_int, [_P, ctypes.c_size_t]),
    # What a staged copy was copied from, as wcached says (wcache/_shards.py,
    # case (b)).
    "wc_model_file_origin": (ctypes.c_int, [_P, ctypes.c_size_t,
                                            ctypes.POINTER(wc_file_identity)]),
    # Derived artifacts (wcache/_derived.py).
    "wc_derive": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_char_p, _PP, _PP]),
    "wc_build_source": (_P, [_P]),
    "wc_build_publish": (ctypes.c_int, [_P, _T, ctypes.c_size_t,
                                        ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t, _PP]),
    "wc_build_publish_fd": (ctypes.c_int, [_P, ctypes.c_int, _PP]),
    # Publishing that hands each tensor back once written (wcache/_derived.py).
    "wc_build_publish_each": (ctypes.c_int, [_P, _T, ctypes.c_size_t,
                                             ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t,
                                             ctypes.c_void_p, ctypes.c_void_p, _PP]),
    "wc_build_abandon": (None, [_P, ctypes.c_char_p]),
}

_lock = threading.Lock()  # made anew in a child of fork() (fork_safe_module, below)
_lib = None
_lib_path = None

# The objects whose locks a child of fork() makes anew (see fork_safe).
_fork_safe = weakref.WeakSet()
# The same for modules: (a module's globals(), names) (see fork_safe_module).
_fork_safe_modules = []
_LockType = type(_lock)


def fork_safe(obj):
    """Has a child of fork() give obj new locks: one for each attribute
    its class names in ``_FORK_LOCKS``. Another thread of the parent may
    hold one at the fork (building a model's table, a handle's runs, its
    torch state: 0.35 s for 200,000 tensors), and no thread of the child
    would ever let it go: the child's first call that needs it would wait
    forever. What those locks guard is stored whole under them, or is
    still None, which the child then makes itself. Returns obj."""
    _fork_safe.add(obj)
    return obj


def fork_safe_module(module_globals, *names):
    """fork_safe for a module's own locks: has a child of fork() make anew
    each threading.Lock that module_globals (the module's globals()) holds
    under one of names, for the same reason (a thread of the parent may be
    loading the library, connecting to wcached or patching safetensors
    under one at the fork). The module must name such a lock through its
    global at each use (``with _lock:``), never keep the lock object
    itself. TypeError, at import, for a name that is not a Lock: a
    reentrant one would come back as a plain one."""
    for name in names:
        if type(module_globals.get(name)) is not _LockType:
            raise TypeError(f"fork_safe_module: {name!r} is not a threading.Lock")
    _fork_safe_modules.append((module_globals, names))


def _after_fork_in_child():
    """New locks in a child: every fork_safe module's and object's."""
    for module_globals, names in _fork_safe_modules:
        for name in names:
            module_globals[name] = threading.Lock()
    for obj in list(_fork_safe):
        for name in type(obj)._FORK_LOCKS:
            setattr(obj, name, threading.Lock())


fork_safe_module(globals(), "_lock")  # another thread may be loading the library at the fork
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _checkout():
    """The wcache checkout this package is part of (the directory whose
    client/python/wcache it is), or None for a package installed elsewhere.
    Only a checkout's own build/ is searched: walking up from an installed
    package would load whatever build/lib/libwcache.so.0 an ancestor holds
    (/build, /tmp/build, ... in a container image, or one another user
    made), not a library of ours."""
    here = os.path.dirname(os.path.abspath(__file__))
    python = os.path.dirname(here)
    client = os.path.dirname(python)
    if os.path.basename(python) == "python" and os.path.basename(client) == "client":
        return os.path.dirname(client)
    return None


def _candidates():
    """Yields (path, where) pairs in lookup order, after $WCACHE_LIB."""
    repo = _checkout()
    if repo is not None:
        for leaf in ("libwcache.so.0", "libwcache.so"):
            yield os.path.join(repo, "build", "lib", leaf), "build tree"
    found = ctypes.util.find_library("wcache")
    if found:
        yield found, "find_library"
    yield "libwcache.so.0", "dynamic loader"


def _declare(cdll, path):
    for name, (res, args) in _REQUIRED.items():
        try:
            fn = getattr(cdll, name)
        except AttributeError:
            raise LibraryNotFound(
                f"{path} is not a usable libwcache: it has no function {name}()") from None
        fn.restype, fn.argtypes = res, args
    for name, (res, args) in _OPTIONAL.items():
        fn = getattr(cdll, name, None)
        if fn is not None:
            fn.restype, fn.argtypes = res, args


def _load():
    global _lib, _lib_path
    tried = []
    env = os.environ.get("WCACHE_LIB")
    if env:
        try:
            cdll = ctypes.CDLL(env)
        except OSError as e:
            raise LibraryNotFound(
                f"cannot load libwcache from WCACHE_LIB={env}: {e}\n"
                "(WCACHE_LIB names the library file to load; unset it to search the "
                "build tree and the system library path)") from None
        _declare(cdll, env)
        # The path first: a thread that finds _lib set reads it without the lock.
        _lib_path = env
        _lib = cdll
        return
    seen = set()
    missing_build = 0
    for path, where in _candidates():
        if path in seen:
            continue
        seen.add(path)
        if os.sep in path and not os.path.exists(path):
            missing_build += 1
            continue
        try:
            cdll = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"  {path} ({where}): {e}")
            continue
        _declare(cdll, path)
        _lib_path = getattr(cdll, "_name", path)
        _lib = cdll
        return
    here = os.path.dirname(os.path.abspath(__file__))
    if missing_build:
        tried.insert(0, f"  build tree: no build/lib/libwcache.so.0 or build/lib/libwcache.so "
                        f"in {_checkout()}, the checkout {here} is in")
    elif _checkout() is None:
        tried.insert(0, f"  build tree: none ({here} is not in a checkout's client/python/, "
                        f"and no other directory is searched)")
    raise LibraryNotFound(
        "cannot find libwcache. Set WCACHE_LIB to the path of libwcache.so.0, build the "
        "tree (make), or install the library. Tried, in order:\n  $WCACHE_LIB (not set)\n"
        + "\n".join(tried))


def lib():
    """The loaded library (loads it on first use)."""
    if _lib is None:
        with _lock:
            if _lib is None:
                _load()
    return _lib


def library_path():
    """The path the library was loaded from (loads it on first use)."""
    lib()
    return _lib_path


def has(name):
    """Whether the loaded library has the optional function name."""
    return getattr(lib(), name, None) is not None and name in _OPTIONAL


def errmsg():
    msg = lib().wc_errmsg()
    return msg.decode("utf-8", "replace") if msg else ""


_DAEMON_DOWN = {_errno.ENOENT, _errno.ECONNREFUSED, _errno.ECONNRESET, _errno.EPIPE,
                _errno.ENOTCONN, _errno.ECONNABORTED}


def check(rc, cls=WcacheError):
    """Raises cls(errno, wc_errmsg()) when rc is a negative errno."""
    if rc >= 0:
        return rc
    code = -rc
    msg = errmsg() or os.strerror(code)
    raise cls(code, msg)


def env_choice(variable, choices):
    """The value of environment variable variable, one of choices (the
    first is the default when it is unset or empty); ValueError else."""
    value = os.environ.get(variable, choices[0]) or choices[0]
    if value not in choices:
        raise ValueError(f"{variable}={value!r}: use one of {', '.join(choices)}")
    return value
