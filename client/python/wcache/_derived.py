"""wcache.derived: weights computed once from a model and shared by every worker.

    import wcache
    f32 = wcache.derived("llama", "f32-v1",
                         lambda src: {k: v.float() for k, v in src.items()})

The first worker that asks for (model, key) becomes the builder: it gets the
model's current generation as a state dict, calls ``build(source)``, and
wcached seals, validates and serves what it returns; every other worker
(and every later call) attaches that artifact like a model, zero-copy, and
``build`` never runs there (proto/PROTOCOL.md, "Derived artifacts"; the C
side is ``wc_derive()`` and ``wc_build_*()`` in wcache(3)).

Lifetimes: the tensors returned are views of the artifact's mapping, as
``Model.state_dict`` makes them (torch by default, numpy with
``framework="np"``); the mapping lives as long as one of them does. The
source state dict handed to ``build`` is made from an attach of the same
generation that this module owns (not from the build's own source, which
libwcache releases when the build ends), so a source tensor that ``build``
keeps somewhere stays valid; when the model has a newer generation by then,
it is a copy of the build's source (see _source). The result is a Derived,
a dict that also has ``generation`` and ``stale()``. The calls of a process share their
connections to wcached (as many as calls run at once, see _pool), each
result keeping the one it came through for its release; once the results
are gone, at most two stay open (per socket, whatever the timeouts).

Without a daemon (``DaemonUnavailable``), or when wcached does not serve the
model, the source is opened in this process as ``safe_open`` opens it,
``build`` runs here, and its result (made contiguous) is returned; a
RuntimeWarning says so, once per (model, key) and process. Any other
failure from the daemon is raised: a model with ``derive = no`` (EPERM), a
worker that may not build (EACCES), a build that failed elsewhere
(ECANCELED, EHOSTDOWN), or one that took longer than the caller's timeout
(ETIMEDOUT; without one, the wait lasts as long as wcached lets the build
run). A ``build`` that asks for the key it is building (in its own
thread) is refused at once (EDEADLK), with or without a daemon, under
whichever name of the model it asks: the served name, the configured path,
another path to the same file. Two names wcached serves are two models,
even on one file: a build of one may derive the other (see _refuse_own).

The key is the artifact's whole identity: wcached does not know what a
build does, so two transforms asked under one key share whichever was
published first. ``expect=`` lets a caller check what it got (tensor names,
dtypes, shapes, or a callable of its own) and raises DerivedMismatch
instead of handing it another transform's tensors (review rev181 F4; see
_Expect).
"""
import ctypes
import errno
import os
import re
import sys
import threading
import traceback
import warnings
import weakref
from collections.abc import Mapping

from . import _lib
from ._lib import DaemonUnavailable, ModelNotFound, WcacheError, check, wc_tensor
from ._device import to_device
from ._safe_open import _names, check_device, open_model
from ._dtypes import DTYPES as _ST_DTYPES, TORCH_TO_ST
from ._serialize import DTYPES as _NUMPY_DTYPES
from .model import Model, _Handle, _framework, connect, default_socket

__all__ = ["derived", "DerivedMismatch"]

_FUNCTIONS = ("wc_derive", "wc_build_source", "wc_build_publish", "wc_build_abandon")
_KEY = re.compile(r"[A-Za-z0-9._+-]{1,64}\Z")  # wire_key_valid() in proto/wire.c

_warned = set()
_warned_lock = threading.Lock()
_lib.fork_safe_module(globals(), "_warned_lock")  # a child of fork() makes it anew

# The connections derived() uses, shared by every call of this process:
# socket -> [(weak reference, Client or None)] of the ones not in use now,
# newest last. A call takes one (or connects when none is free), sets its
# deadline to the call's timeout (wc_set_timeout(), under the client's lock
# in libwcache), and gives it back when it returns; the artifact's handle
# keeps it too, for its RELEASE (sent under the deadline of the last call
# that took the connection). By socket only, not by (socket, timeout):
# a caller that passes what is left of its own deadline asks with a new
# timeout every time, and each would have had its two idle connections
# open for the life of the process (review rev155 #4). Not one per
# call: each result kept alive would hold a connection of its own, and
# wcached's max_clients_per_uid would lock every worker of the user out of
# attaching (review rev140 #2). Not one for all calls either: libwcache holds
# a client's lock for a whole DERIVE, which waits while another worker
# builds, and a builder must PUBLISH on the connection that got BUILD; so a
# call in use keeps its connection to itself until it returns (build
# included), and a burst of N calls at once needs N connections.
#
# Afterwards the pool holds only the newest _KEEP_IDLE free connections
# itself; the others it references weakly: each stays open (and reusable)
# as long as a result that came through it lives, and closes when the last
# one goes. Before, every connection of a burst stayed open for the life of
# the process, each counted by wcached against max_clients_per_uid (256 by
# default, often set lower for hosts of many workers), so one burst could
# lock the user's later connections out. Two: a process's calls mostly run
# one at a time, and a build that derives another key needs a second one
# (the builder's is in use); more at once just connect again.
# A child of fork() makes its own.
_KEEP_IDLE = 2
_pool = {}
_pool_pid = os.getpid()
_pool_lock = threading.Lock()
_lib.fork_safe_module(globals(), "_pool_lock")

# The builds this thread runs now (inside build(), _Building): a derived()
# of one of them would wait for its own build (its connection is taken, so
# wcached cannot tell; review rev140 #3) and is refused at once. Also when
# asked under another name of the same model: wcached serves a model under
# its name and under its configured path, and a file has relative, absolute
# and real paths (review rev145 #1).
_building = threading.local()


def _after_fork_in_child():
    global _pool, _pool_pid
    _pool, _pool_pid = {}, os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _take(socket, timeout):
    """(pool key, a Client for one derived() call whose deadline is
    timeout, as connect() sets it): a free one of this process, else a new
    connection (DaemonUnavailable when none can be made). Hand it back with
    _give_back."""
    global _pool, _pool_pid
    key = os.fspath(socket) if socket is not None else default_socket()
    client = None
    with _pool_lock:
        if _pool_pid != os.getpid():
            _pool, _pool_pid = {}, os.getpid()
        free = _pool.get(key)
        while free and client is None:
            # The pool's own reference first: the entry dropped with its
            # only strong reference would close the client before the weak
            # one is read (every call connected anew, its idle connection
            # closed instead of reused).
            ref, client = free.pop()
            if client is None:
                client = ref()
            if client is not None and client.closed:
                client = None
    if client is None:
        return key, connect(socket, timeout)
    try:
        _set_deadline(client, timeout)
    except WcacheError:
        # A libwcache without wc_set_timeout() (older than wc_derive(), so
        # not seen here), or a socket that refuses the option: this one is
        # left to its results, and the call connects with its own deadline.
        return key, connect(socket, timeout)
    except BaseException:
        _give_back(key, client)  # a bad timeout: connect() refuses it the same way
        raise
    return key, client


def _set_deadline(client, timeout):
    """client's deadline for this call: timeout seconds (0: none), or as
    connect(timeout=None) sets it ($WCACHE_TIMEOUT, else libwcache's
    default); raises as connect() does for a bad one."""
    if timeout is not None:
        client.set_timeout(timeout)
        return
    if not _lib.has("wc_set_timeout"):
        raise WcacheError(errno.ENOTSUP, f"libwcache {_lib.library_path()} has no "
                          f"wc_set_timeout()")
    ptr = client._use()
    try:
        rc = _lib.lib().wc_set_timeout(ptr, -1)  # wc_connect()'s default, read now
    finally:
        client._done()
    check(rc)


def _give_back(key, client):
    """Puts client back in the pool, which keeps the newest _KEEP_IDLE free
    connections alive and the others only while something else (a result)
    holds them."""
    held = []  # strong references, dropped out of the lock
    with _pool_lock:
        if _pool_pid != os.getpid() or client.closed:
            return
        free = []
        for ref, strong in _pool.get(key, ()):
            alive = ref()
            if alive is not None:
                held.append(alive)
                free.append((ref, strong))
        free.append((weakref.ref(client), client))
        for i in range(len(free) - _KEEP_IDLE):
            free[i] = (free[i][0], None)
        _pool[key] = free
    # Out of the lock: one that nothing else holds disconnects here.
    del held


def _builds(key):
    """The _Building blocks of this thread that build key."""
    return [b for b in getattr(_building, "active", ()) if b.key == key]


def _builds_here(target, key):
    """Whether this thread is inside the build of (target, key), target as
    spelled (or as its absolute or real path) in the outer call. Costs
    nothing but a look at this thread's builds when it builds no such key
    (most calls): the paths (a stat, a realpath) only when it does."""
    builds = _builds(key)
    if not builds:
        return False
    names = _names(target)
    return any(n in b.names for b in builds for n in names)


def _identity(model):
    """What tells one model from another wherever it was attached or opened,
    whatever name it was asked under: (its generation, the (device, inode)
    of every file its tensor data lies in, as /proc/self/maps names them).
    A model's name and its configured path attach the same files of the
    same generation (wcached passes a reopen of the very inode it serves);
    two attaches of one model compare equal, as do a file opened under two
    paths (hard links included). None for a model with no tensor data.
    Reads the table and /proc/self/maps: only for a derived() of a key this
    thread is building under another name."""
    import numpy as np
    from ._sharedview import file_mappings
    table = model._tab()
    addrs = np.unique(table.addr[table.nbytes > 0])
    files = set()
    if len(addrs):
        for start, end, _offset, dev, ino, _path, _shared in file_mappings():
            i = int(np.searchsorted(addrs, np.uint64(start)))
            if i < len(addrs) and int(addrs[i]) < end:
                files.add((dev, ino))
    return (model.generation, frozenset(files)) if files else None


def _deadlock(target, key):
    return WcacheError(errno.EDEADLK, f"model {target!r}, key {key!r}: derived() called "
                       f"from that key's own build, which would wait for itself: build "
                       f"must not ask for the key it builds")


def _is_path(spelling):
    """Whether wcached takes spelling (one it resolved) for a configured
    path rather than a model's name: a name never has a '/' (only A-Z a-z
    0-9 . _ -: model_name_valid() in proto/model_name.c), a
    configured path always has one (the config's relative paths are joined
    with its file's absolute directory; ADD takes absolute paths only)."""
    return "/" in spelling


def _refuse_own(model, target, key, served=None):
    """EDEADLK when model (the nested call's, as attached or opened) is the
    source of a build of key this thread runs. served: the spelling wcached
    resolved model under (None: opened in this process).

    wcached keys a build by its model entry (a configured name and its
    path), not by file: two names it serves are two models even on one
    file (the same path twice, hard links or symlinks to one blob), each
    with generations of its own, and the nested DERIVE of the other one
    would not wait for this build. So spellings that wcached resolved
    both as names, or both as paths, are one model only when they are the
    same string (it resolves a path by its exact configured spelling).
    The identity (generation and files) decides where one side is a name
    and the other a path, or where one side was opened in this process.
    A path that wcached resolves can belong to two models (configured
    twice, or a name on a hard link of the other's file): it resolves it
    to the first model in its registry with that path, which a client
    cannot see. So inside a build of "small" asked by its name, a path
    configured for both "small" and "copy" (or "copy"'s path, a hard link
    of "small"'s file) is refused even where wcached would resolve it to
    "copy" and not wait; asked by its name there, "copy" is not refused.
    Inside a build of "small" asked by a path, "copy" asked by its name is
    refused the same way (name against path: the identity decides, and
    both are generation 1 of one file; review rev159 #1)."""
    builds = _builds(key)
    ident = None
    for b in builds:
        if b.served is not None and served is not None and \
                _is_path(b.served) == _is_path(served):
            if b.served == served:
                raise _deadlock(target, key)
            continue
        if ident is None:
            ident = (_identity(model),)
        if ident[0] is not None and _same(b.identity(), ident[0]):
            raise _deadlock(target, key)


def _same(a, b):
    """Whether two _identity values name one model: the same files, of the
    same generation where both came from wcached (a model replaced in place
    keeps its files; generation 0 is a file opened in this process, the
    same file as wcached serves when their inodes are)."""
    if a is None or b is None or a[1] != b[1]:
        return False
    return a[0] == b[0] or not a[0] or not b[0]


def _refuse_own_through(client, target, key):
    """EDEADLK when this thread builds key for the model wcached serves as
    target (under whichever name it was asked for outside): attaches target
    as _derive will ask for it and compares. Nothing when this thread builds
    no such key, or when the attach fails (_derive meets that and says so)."""
    if not _builds(key):
        return
    for name in _names(target):
        try:
            model = client.attach(name)
        except ModelNotFound:
            continue
        except (DaemonUnavailable, WcacheError, ValueError):
            return
        try:
            _refuse_own(model, target, key, name)
        finally:
            model.close()
        return


class _Building:
    """Marks the build of key from model (the source, as attached or opened
    here), asked for as names, as run by this thread while the block runs.
    served: the spelling wcached resolved the model under (None: opened in
    this process; see _refuse_own)."""

    def __init__(self, names, key, model, served=None):
        self.names, self.key, self._model = frozenset(names), key, model
        self.served = served
        self._ident = None  # (_identity(model),) once found

    def identity(self):
        """_identity of the source, found on first use (a nested call under
        another name), while the block runs."""
        if self._ident is None and self._model is not None:
            self._ident = (_identity(self._model),)
        return self._ident[0] if self._ident else None

    def __enter__(self):
        active = getattr(_building, "active", None)
        if active is None:
            active = _building.active = []
        active.append(self)
        return self

    def __exit__(self, *exc):
        _building.active.remove(self)
        self._model = None


class _Unavailable(Exception):
    """The daemon cannot serve this derivation: compute it locally (why)."""


def _warn_once(target, key, why):
    with _warned_lock:
        if (target, key) in _warned:
            return
        _warned.add((target, key))
    warnings.warn(f"wcache.derived({target!r}, {key!r}): {why}; computed in this process "
                  f"and not shared with other workers", RuntimeWarning, stacklevel=3)


def _st_dtype(value):
    """(safetensors dtype, contiguous CPU tensor or array, its address, its
    byte count) of one value of build's result; TypeError or ValueError
    for what cannot be written."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.layout != torch.strided:
            raise ValueError("a sparse tensor (make it dense with .to_dense())")
        st = TORCH_TO_ST.get(str(value.dtype))
        if st is None:
            raise ValueError(f"dtype {value.dtype} has no safetensors spelling")
        # The same object when nothing changes (it is dropped as soon as it
        # is written: _publish).
        t = value.detach() if value.requires_grad else value
        if t.device.type != "cpu":
            t = t.to("cpu")
        # A conjugate or negative view (x.conj(), is_contiguous() True) keeps
        # x's bytes in its storage: materialise it, or the artifact would hold
        # x's values (the local fallback returns the view itself, right).
        # torch before 1.10 has neither bit nor these methods.
        if hasattr(t, "resolve_conj"):
            t = t.resolve_conj().resolve_neg()
        t = t.contiguous()
        if sys.byteorder == "big" and t.element_size() > 1:
            raise ValueError("a big-endian host (safetensors data is little-endian)")
        return st, t, tuple(t.shape), (t.data_ptr() if t.nelement() else 0), \
            t.nelement() * t.element_size()
    import numpy as np
    if isinstance(value, np.ndarray):
        a = np.ascontiguousarray(value).reshape(value.shape)  # 0-d stays 0-d
        if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and sys.byteorder == "big"):
            a = a.byteswap().view(a.dtype.newbyteorder("<"))
        st = _NUMPY_DTYPES.get(a.dtype.name)
        if st is None:
            raise ValueError(f"numpy dtype {a.dtype} has no safetensors spelling")
        return st, a, tuple(a.shape), (a.ctypes.data if a.nbytes else 0), a.nbytes
    raise TypeError(f"a {type(value).__module__}.{type(value).__name__}, not a torch "
                    f"tensor or a numpy array")


def _checked(result):
    """[(name, dtype, tensor, shape, address, nbytes)] of build's result, in
    its order; TypeError or ValueError naming the first bad entry."""
    if not isinstance(result, dict):
        raise TypeError(f"build returned a {type(result).__name__}, not a dict of "
                        f"name -> tensor")
    out = []
    for name, value in result.items():
        if not isinstance(name, str):
            raise TypeError(f"build returned a key {name!r} that is not a str")
        if "\0" in name:
            # libwcache takes names as C strings: it would publish the part
            # before the NUL (and no reader accepts a NUL in a name).
            raise ValueError(f"build returned a key {name!r} with a NUL character")
        try:
            st, t, shape, ptr, nbytes = _st_dtype(value)
        except (TypeError, ValueError) as e:
            raise type(e)(f"build returned {name!r}: {e}") from None
        out.append((name, st, t, shape, ptr, nbytes))
    return out


class DerivedMismatch(WcacheError, ValueError):
    """derived(expect=...) got tensors other than the caller expects
    (errno EBADMSG): attached, most likely another transform's artifact
    published first under the same key; built here, a build whose result
    fails the caller's own expect (abandoned, not published). The message
    names the model, the key and the first tensor that differs, with what
    was expected and what was found."""


def _st_spelling(name, dtype):
    """expect[name]'s dtype as safetensors spells it (None: any): given so
    ("I8"), or as a torch dtype, a numpy dtype or type, or a numpy dtype's
    name ("int8"). Not numpy's short codes: "i8" is int64 there, "f4"
    float32, where safetensors' I8 is int8 and F4 a 4-bit float."""
    if dtype is None or (isinstance(dtype, str) and dtype in _ST_DTYPES):
        return dtype
    torch = sys.modules.get("torch")
    st = None
    if isinstance(dtype, str):
        st = _NUMPY_DTYPES.get(dtype)
    elif torch is not None and isinstance(dtype, torch.dtype):
        st = TORCH_TO_ST.get(str(dtype))
    else:
        import numpy as np
        try:
            st = _NUMPY_DTYPES.get(np.dtype(dtype).name)
        except TypeError:
            pass
    if st is None:
        raise ValueError(f"expect[{name!r}]: dtype {dtype!r} is not a safetensors dtype "
                         f"(\"I8\", \"F32\", ...), a torch dtype or a numpy dtype")
    return st


def _shape_of(name, shape):
    """expect[name]'s shape as a tuple of ints (None: any)."""
    if shape is None:
        return None
    try:
        dims = tuple(shape)
        if all(int(d) == d and d >= 0 for d in dims):
            return tuple(int(d) for d in dims)
    except (TypeError, ValueError):
        pass
    raise ValueError(f"expect[{name!r}]: shape {shape!r} is not a sequence of sizes")


def _spelled(dtype, shape):
    return (dtype or "any dtype") + " " + \
        ("of any shape" if shape is None else str(list(shape)))


class _Expect:
    """derived()'s expect=, checked when it is given (TypeError or
    ValueError for one it cannot use): None (nothing is checked); a mapping
    {tensor name: (dtype, shape)}, dtype as safetensors spells it ("I8"),
    a torch dtype or a numpy dtype, shape a sequence of sizes, either one
    None for any, only the tensors it names checked (in its order); or a
    callable(state), state being the {name: tensor} derived() is about to
    return (in the process that builds: build's result as it is about to
    be published, contiguous, on the CPU), whose False (or an exception)
    is a mismatch (None or anything true passes).

    Not a fingerprint of the build recorded in the artifact's metadata and
    compared on attach: a caller-given fingerprint is a second key (callers
    who would give two builds two fingerprints can give them two keys, and
    the ones who forget to bump the key forget it too), one computed from
    build (its code) misses what build captures or imports, and neither
    tells a consumer anything about an artifact built without it (in C, by
    an older wcache). An expect checks what the consumer itself is about to
    read, whoever built it: the reported case, int8 tensors asked under a
    key that holds another build's float32 ones (review rev181 F4, its
    samekey.py), fails on the first tensor. It cannot tell a builder that
    publishes wrong numbers under the right names, dtypes and shapes: who
    may build is derive_groups (wcached's ATTACH_OK does not carry the
    builder's uid: a client cannot check it)."""

    def __init__(self, expect):
        self.fn = self.tensors = None
        if expect is None:
            return
        if isinstance(expect, Mapping):
            self.tensors = []
            for name, want in expect.items():
                if not isinstance(name, str):
                    raise TypeError(f"expect: tensor name {name!r} is not a str")
                if isinstance(want, (str, bytes)) or not hasattr(want, "__len__") or \
                        len(want) != 2:
                    raise TypeError(f"expect[{name!r}]: {want!r} is not a (dtype, shape) pair")
                self.tensors.append((name, _st_spelling(name, want[0]),
                                     _shape_of(name, want[1])))
        elif callable(expect):
            self.fn = expect
        else:
            raise TypeError(f"expect must be a mapping of tensor name -> (dtype, shape) or a "
                            f"callable(state), not {type(expect).__name__}")

    def __bool__(self):
        return self.fn is not None or self.tensors is not None

    def mismatch(self, found, names, state):
        """(what differs, the exception expect raised or None), or None
        when the result passes. found(name): (safetensors dtype, shape) of
        the result's tensor name, None without one; names(): the result's
        tensor names (for the message); state(): the {name: tensor} the
        callable is given (called only when the mapping passes)."""
        return self.tensors_mismatch(found, names) or self.state_mismatch(state)

    def tensors_mismatch(self, found, names):
        """mismatch() of the mapping form alone: it needs only the names,
        dtypes and shapes (an attached artifact's index), not the tensors."""
        for name, dtype, shape in self.tensors or ():
            got = found(name)
            if got is None:
                have = list(names())
                listed = ", ".join(repr(n) for n in have[:3]) + (", ..." if len(have) > 3 else "")
                return (f"tensor {name!r}: expected {_spelled(dtype, shape)}, found no such "
                        f"tensor (it has {len(have)}: {listed})", None)
            if (dtype is not None and got[0] != dtype) or \
                    (shape is not None and tuple(got[1]) != shape):
                return (f"tensor {name!r}: expected {_spelled(dtype, shape)}, found "
                        f"{_spelled(*got)}", None)
        return None

    def state_mismatch(self, state):
        """mismatch() of the callable form alone; state() is called only
        when there is one. The exception it raised is kept (chained to
        DerivedMismatch) without the locals of its frames: the callable's
        own held the state, which would stay alive (the artifact mapped, a
        builder's private result with it) while the caller holds the
        exception (review rev183 F2)."""
        if self.fn is None:
            return None
        what = getattr(self.fn, "__qualname__", None) or repr(self.fn)
        try:
            ok = self.fn(state())
        except Exception as e:
            _forget_locals(e.__traceback__.tb_next)  # this frame runs yet
            return f"expect {what}(state) raised {type(e).__name__}: {e}", e
        if ok is not None and not ok:
            return f"expect {what}(state) returned {ok!r}", None
        return None


def _forget_locals(tb):
    """Drops the locals of the (finished) frames of traceback tb, which an
    exception the caller holds keeps alive, the lines kept for its report:
    frame.clear(), and the dict a locals() call filled (pytest's rewritten
    assert calls it), which Python 3.11's clear() leaves (reading f_locals
    again empties it)."""
    traceback.clear_frames(tb)
    while tb is not None:
        tb.tb_frame.f_locals
        tb = tb.tb_next


def _entries_mismatch(expect, entries):
    """expect.mismatch() of build's checked result (entries, as _checked
    made them), or None."""
    if not expect:
        return None
    info = {e[0]: (e[1], e[3]) for e in entries}
    return expect.mismatch(info.get, lambda: list(info),
                           lambda: {e[0]: e[2] for e in entries})


def _built_mismatch(target, key, what):
    return DerivedMismatch(errno.EBADMSG, f"model {target!r}, key {key!r}: build's result "
                           f"is not what expect= says: {what}")


# wc_written_fn: void (*)(size_t index, void *arg)
_WRITTEN = ctypes.CFUNCTYPE(None, ctypes.c_size_t, ctypes.c_void_p)
_TRIM_EVERY = 64 << 20  # bytes freed between two malloc_trim()s while publishing


def _publish(lib, build, entries, framework):
    """Sends entries as the artifact (wc_build_publish_each, or
    wc_build_publish, ends the build); returns the artifact's wc_model
    pointer. entries is emptied as it goes: each tensor is dropped as soon
    as libwcache has written it into the artifact, so that (unless the
    caller keeps build's result) the builder never holds the whole result
    and the whole artifact at once, and the artifact's pages reuse the ones
    just freed."""
    n = len(entries)
    arr = (wc_tensor * max(n, 1))()
    keep = []  # names and shapes must outlive the call; the tensors are in entries
    for i, entry in enumerate(entries):
        name, st, shape, ptr, nbytes = entry[0], entry[1], entry[3], entry[4], entry[5]
        cname = name.encode("utf-8", "surrogateescape")
        cshape = (ctypes.c_uint64 * max(len(shape), 1))(*shape)
        keep.append((cname, cshape))
        arr[i].name, arr[i].dtype = cname, st.encode("ascii")
        arr[i].ndim, arr[i].shape = len(shape), ctypes.cast(cshape, ctypes.POINTER(ctypes.c_uint64))
        arr[i].data, arr[i].nbytes = ptr or None, nbytes
    entry = None  # the loop's last tensor: nothing but entries may hold one
    meta = (ctypes.c_char_p * 2)(b"format", framework.encode("ascii"))
    out = ctypes.c_void_p()
    if not _lib.has("wc_build_publish_each"):
        check(lib.wc_build_publish(build, arr, n, meta, 1, ctypes.byref(out)))
        entries.clear()
        return out.value
    freed = 0

    def written(index, _arg):
        # Never raises (ctypes would only print it): the tensor's data has
        # been read, the entry's reference goes.
        nonlocal freed
        try:
            freed += entries[index][5]
            entries[index] = None
            if freed >= _TRIM_EVERY:
                freed = 0
                _trim()
        except BaseException:
            pass
    callback = _WRITTEN(written)
    try:
        check(lib.wc_build_publish_each(build, arr, n, meta, 1, callback, None,
                                        ctypes.byref(out)))
    finally:
        entries.clear()
    del keep
    return out.value


def _abandon(lib, build, reason):
    # libwcache cuts the reason at 1024 bytes, at a character boundary.
    lib.wc_build_abandon(build, reason.encode("utf-8", "replace").replace(b"\0", b" "))


class _Borrowed(_Handle):
    """A handle of the build's source (wc_build_source()), which libwcache
    releases when the build ends: never released here."""
    __slots__ = ()

    def __del__(self):
        self.ptr = None


def _copied(model, framework):
    """model's state dict as copies in this process's memory, one tensor
    at a time (each view of the mapping dropped once copied)."""
    if framework == "pt":
        return {name: model.torch(name).clone() for name in model.keys()}
    import numpy as np
    return {name: np.array(model.numpy(name)) for name in model.keys()}


def _source(client, name, build_ptr, framework):
    """(model, state dict) of the build's source generation, the one the
    BUILD answer gave, whatever wcached serves now. Normally an attach of
    its own of that generation, so that the state dict's tensors live as
    long as Python keeps them (the build's source is released when the
    build ends). When the model has moved on to a newer generation since
    the BUILD (a swap in between), no attach gives that generation any
    more: the tensors are copies of the build's own source, which is valid
    until the build ends (this costs the source's size in this process
    while it builds). Before, the builder abandoned the build and derived
    again, and every worker waiting for it got ECANCELED (review rev181
    F1)."""
    lib = _lib.lib()
    ptr = lib.wc_build_source(build_ptr)
    generation = int(lib.wc_model_generation(ptr))
    own = client.attach(name)
    if own.generation == generation:
        return own, own.state_dict(framework)
    own.close()
    borrowed = Model(_Borrowed(ptr, f"{name} (generation {generation})", client), "wcached")
    try:
        return borrowed, _copied(borrowed, framework)
    except BaseException:
        borrowed.close()
        raise


def _build_here(lib, client, target, name, key, build_ptr, build, framework, expect):
    """This process is the builder: runs build on the source generation the
    BUILD answer gave (_source), publishes, returns the artifact's Model;
    abandons (with the reason) and raises when anything fails, a result
    that fails expect included (DerivedMismatch: not published, so no
    other caller of the key gets it).
    _Unavailable only when attaching the source failed (daemon down, model
    no longer served), before build ran; whatever build raises propagates as
    it is, even a DaemonUnavailable or a ModelNotFound (a safe_open of a
    missing file inside build): it must not be mistaken for the daemon's
    answer and run build again."""
    try:
        own, source = _source(client, name, build_ptr, framework)
    except (DaemonUnavailable, ModelNotFound) as e:
        # The attach of the source, not build: build has not run, so it
        # may run here instead.
        _abandon(lib, build_ptr, f"{type(e).__name__}: {e}")
        raise _Unavailable(str(e)) from e
    except BaseException as e:
        _abandon(lib, build_ptr, f"{type(e).__name__}: {e}")
        raise
    try:
        # Not all of target's paths (_names): another of them may be
        # configured as another model (a symlink's target), which only an
        # attach tells (_refuse_own_through).
        with _Building({name, target}, key, own, name):
            result = build(source)
    except BaseException as e:
        _abandon(lib, build_ptr, f"{type(e).__name__}: {e}")
        raise
    del source
    own.close()
    try:
        entries = _checked(result)
    except (TypeError, ValueError) as e:
        _abandon(lib, build_ptr, f"{type(e).__name__}: {e}")
        raise
    del result
    try:
        failed = _entries_mismatch(expect, entries)
    except BaseException as e:  # an interrupt in expect: Exceptions are its answer
        _abandon(lib, build_ptr, f"{type(e).__name__}: {e}")
        raise
    if failed is not None:
        entries.clear()
        e = _built_mismatch(target, key, failed[0] + "; not published")
        _abandon(lib, build_ptr, f"{type(e).__name__}: {e}")
        raise e from failed[1]
    ptr = _publish(lib, build_ptr, entries, framework)
    del entries
    _trim()
    return Model(_Handle(ptr, f"{target} [{key}]", client), "wcached")


def _trim():
    """Gives the memory the build freed back to the system: build's result
    now lives in the artifact every worker shares, and the allocator would
    otherwise keep its private copy's pages (glibc's malloc_trim)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):
        pass


def _derive(client, target, key, build, framework, timeout, expect):
    """(the artifact's Model through wcached, whether this process built
    it, its result then checked against expect); raises _Unavailable when the
    daemon is down or does not serve target (compute locally), and only
    for what wc_derive() or the source's attach said, never for what build
    raised.

    The wait for another worker's build: timeout seconds when the caller
    gave one (0: none); with timeout None, as long as wcached lets that
    build run (each build is bounded by the model's derive_timeout), not
    the connection's default deadline ($WCACHE_TIMEOUT, else 30 s), which
    still bounds connecting, the builder's requests and the release. Before,
    a waiter of a 40 s build failed at 30 s (review rev181 F8)."""
    lib = _lib.lib()
    ckey = key.encode("utf-8")
    why = None
    for name in _names(target):
        cname = name.encode("utf-8", "surrogateescape")
        out, build_ptr = ctypes.c_void_p(), ctypes.c_void_p()
        if timeout is None:
            client.set_timeout(0)
        try:
            rc = lib.wc_derive(client._ptr, cname, ckey, ctypes.byref(out),
                               ctypes.byref(build_ptr))
            said = (_lib.errmsg() or os.strerror(-rc)) if rc < 0 else None
        finally:
            if timeout is None:  # the connection's own deadline again
                _set_deadline(client, None)
        if rc == 0:
            return Model(_Handle(out.value, f"{name} [{key}]", client), "wcached"), False
        if rc == 1:
            return _build_here(lib, client, target, name, key, build_ptr.value, build,
                               framework, expect), True
        if rc == -errno.ENOENT:
            why = said
            continue
        if -rc in _lib._DAEMON_DOWN:
            raise _Unavailable(said)
        if rc == -errno.ETIMEDOUT:
            if not timeout:  # None or 0: no limit of the client's
                said += " (derived() without a timeout waits as long as wcached lets " \
                        "the build run; wcached ends a wait after a day)"
            else:
                said += f" (derived(timeout={timeout!r}) waits {timeout:g} s for " \
                        f"another worker's build; timeout=None waits as long as " \
                        f"wcached lets the build run: the model's derive_timeout)"
        raise WcacheError(-rc, said)
    raise _Unavailable(why or f"wcached does not serve {target!r}")


def _local(target, key, build, framework, why, expect):
    """build run on the source opened in this process; its result checked
    (and made contiguous) like a publication, and against expect."""
    model = open_model(target)
    try:
        _refuse_own(model, target, key)
    except BaseException:
        # Not mapped while the caller holds the exception (its traceback
        # keeps this frame), and no warning: nothing is computed.
        model.close()
        raise
    _warn_once(target, key, why)
    with _Building(_names(target), key, model):
        result = build(model.state_dict(framework))
    entries = _checked(result)
    del result
    failed = _entries_mismatch(expect, entries)
    if failed is not None:
        entries.clear()
        model.close()  # as above: not mapped while the caller holds the exception
        raise _built_mismatch(target, key, failed[0]) from failed[1]
    return {name: t for name, _st, t, _shape, _ptr, _n in entries}


def derived(name, key, build, framework="pt", socket=None, timeout=None, device="cpu",
            expect=None):
    """The model ``name`` transformed by ``key``, as {tensor name: tensor}:
    a :class:`Derived`, a dict that also has ``generation`` and ``stale()``.

    name: a model wcached serves, or its configured path (or a path to the
    model, as ``safe_open`` takes it). key: names the transformation and its
    version, 1 to 64 letters, digits or ``._+-`` ("f32-v1",
    "int8-rowwise-v2"); it is the artifact's whole identity: two builds
    asked under one key share whichever was published first, so change it
    whenever build changes.

    build(source) is called only in the process that becomes the builder,
    with the source as a state dict, and returns a dict of torch tensors or
    numpy arrays (any device, any strides: they are copied out, contiguous,
    into the artifact). If it raises, the build is abandoned with
    "ExceptionType: message" (the waiting workers get that reason) and the
    exception propagates; a result that is not such a dict is abandoned and
    raised as TypeError or ValueError.

    framework: "pt" (torch, the default) or "np" (numpy), for both the
    source and the result. socket, timeout: as :func:`wcache.connect`; a
    timeout also bounds the wait for another worker's build (0: as long as
    it takes); without one (None) that wait lasts as long as wcached lets
    the build run (the model's derive_timeout, 600 s by default), not the
    connection's default deadline.

    device: "cpu" (the default) gives views of the artifact's mapping;
    another torch device copies the artifact there as ``safe_open``'s
    get_tensors() does (one device buffer, batched copies from the shared
    mapping; see wcache/_device.py).

    expect: None, or a check of what the call gets: a mapping {tensor
    name: (dtype, shape)} (dtype "I8" as safetensors spells it, a torch or
    a numpy dtype; shape a sequence of sizes; either None for any; the
    tensors it does not name are not checked), or a callable(state) that
    returns False or raises on a mismatch. It is checked on the attached
    artifact (a mapping on its index, before any tensor is made or copied
    to the device), and in the process that builds on build's result
    before it is published (so one that fails is abandoned, not shared).
    The artifact is released on a mismatch or any other error. A mismatch
    raises DerivedMismatch (a WcacheError and a ValueError) naming the
    model, the key, the first tensor that differs, what was expected and
    what was found; attached, it says the key may hold another transform's
    artifact: ask under a new key.

    Without wcached (or when it does not serve name) the source is opened
    in this process and build runs here, with a RuntimeWarning once.
    """
    fw = _framework(framework)
    dev = check_device("pt" if fw == "pt" else "np", device)
    if not callable(build):
        raise TypeError(f"build must be callable, not {type(build).__name__}")
    if not isinstance(key, str):
        raise TypeError(f"key must be a str, not {type(key).__name__}")
    expect = _Expect(expect)
    if not _KEY.match(key):
        raise ValueError(f"key {key!r}: 1 to 64 letters, digits or \"._+-\"")
    target = os.fspath(name)
    if not isinstance(target, str):
        target = os.fsdecode(target)
    if "\0" in target:
        # wc_derive() takes a C string: it would derive the model named by
        # the part before the NUL. Python's open() raises the same.
        raise ValueError(f"model name {target!r}: embedded null byte")
    if _builds_here(target, key):
        raise _deadlock(target, key)
    if not all(_lib.has(f) for f in _FUNCTIONS):
        return _moved(_local(target, key, build, fw, f"libwcache {_lib.library_path()} has "
                                                     f"no wc_derive()", expect), dev)
    try:
        where, client = _take(socket, timeout)
    except DaemonUnavailable as e:
        return _moved(_local(target, key, build, fw, str(e), expect), dev)
    try:
        _refuse_own_through(client, target, key)
        model, built = _derive(client, target, key, build, fw, timeout, expect)
    except _Unavailable as e:
        why = str(e)
    else:
        why = None
    finally:
        _give_back(where, client)
    if why is not None:
        return _moved(_local(target, key, build, fw, why, expect), dev)
    # The mapping form first, on the artifact's index: an artifact of
    # another transform is refused before it is converted or copied to the
    # device (where a tensor of a dtype the framework has no type for, or
    # the device's memory, would raise something else than DerivedMismatch;
    # review rev183 F2). The model is closed on every way out but the
    # result: not mapped while the caller holds the exception.
    checking = expect and not built
    state = None
    try:
        failed = expect.tensors_mismatch(lambda n: _info(model, n), model.keys) \
            if checking else None
        if failed is None:
            if dev is not None:
                state = to_device(model, model.keys(), dev, model.torch)
            else:
                state = model.state_dict(fw)
            if checking:
                failed = expect.state_mismatch(lambda: state)
    except BaseException as e:
        state = None
        model.close()
        _forget_locals(e.__traceback__.tb_next)  # what they made of the artifact
        raise
    if failed is not None:
        state = None
        model.close()
        raise DerivedMismatch(
            errno.EBADMSG, f"model {target!r}, key {key!r}: the artifact wcached serves is "
            f"not what expect= says: {failed[0]}; the key is the artifact's whole identity, "
            f"and another transform may have been published under it first: ask for this "
            f"one under a new key") from failed[1]
    # The tensors keep the mapping (and the shared connection) alive; the
    # result keeps the handle for stale().
    result = Derived(state, model._h())
    model.close()
    return result


class Derived(dict):
    """What derived() returns: a dict of {tensor name: tensor}, which also
    tells whether the copy went stale, as a Model does.

    generation: the source generation the artifact was computed from (0
    when it was computed in this process, without wcached). stale(): True
    once wcached serves a newer generation of the model (or no longer
    serves it): derive again for the new one (Model.stale() says what it
    cannot see after a crash of wcached). The result keeps the artifact
    attached as long as it lives, with device= too, where its tensors are
    copies. Pickled (torch.save) or copied, it is a plain dict."""
    __slots__ = ("_handle", "generation")

    def __init__(self, state, handle=None):
        super().__init__(state)
        self._handle = handle
        self.generation = 0 if handle is None else \
            int(handle.lib.wc_model_generation(handle.daemon_ptr()))

    def stale(self):
        """True when wcached now serves a newer generation of the source
        model (or no longer serves it); always False when computed here."""
        h = self._handle
        return h is not None and bool(h.lib.wc_model_stale(h.daemon_ptr()))

    def __reduce__(self):
        return dict, (dict(self),)


def _info(model, name):
    """(safetensors dtype, shape) of model's tensor name, None without one."""
    try:
        info = model.info(name)
    except KeyError:
        return None
    return info.dtype, info.shape


def _moved(state, device):
    """A locally built result on device (tensor by tensor: it is private
    memory of this process, not a shared mapping), as a Derived of
    generation 0."""
    if device is None:
        return Derived(state)
    return Derived({name: t.to(device) for name, t in state.items()})
