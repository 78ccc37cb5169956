"""A file of a model wcached serves as a directory, opened by its own path.

README's configuration serves a Hugging Face model directory (``path =
/srv/models/llama``: wcached finds the shard index in it), but transformers,
and every loader of the hub's layout, opens the shards one by one by path:
``safe_open(DIR/model-00001-of-00004.safetensors)``. wcached serves a model
under its name and its configured path, so a shard's own path is not served.

served_file() finds the directory model that holds such a file: it attaches
the directory the path is in (its absolute spelling, then its real path: a
hub snapshot directory is real, while its shards are symlinks into blobs/,
so the directory of the shard's real path is not the snapshot), and when one
of the files wcached passed for that model is the file at the path (the
same device and inode), the shard is that file opened here and mapped by
wc_open_fd(): its own tensors and metadata, as upstream's safe_open(shard)
gives them, on the very pages wcached serves. The shard model holds the
directory model (wcache/model.py, _Handle.served), so the generation stays
attached, counted by wcached as in use, while the shard model or any tensor
made from it lives, and Model.generation and stale() are the directory's.

What wcached says of the directory is what a named attach would say: "not
served" and "wcached is down" fall back to mapping the file in this
process, as does a failed load (with one WARNING); any other refusal (the
generation modified in place, still loading, permission) is raised. A held
directory answers without asking wcached only for a file already found to
be one of its generation's files and unchanged since (size, ctime); for
any other file the directory is attached again, so wcached's refusal of a
generation written in place since it was attached is not bypassed. A
staged model's files (wcached maps its copy in stage_dir) are not the
files at their paths: they are mapped here, unshared.

One attached directory model per connection and directory, shared by every
shard model of it: an attach maps every file of the model, so an attach per
shard of a 163-shard model would map 163 x 163 files. The registry keeps it
by weak reference only: closing the last shard (and dropping its tensors)
releases it. A stale one (wcached serves a newer generation) or one made by
another connection (after a reconnect, or by the parent of a fork()) is not
used again: the directory is attached anew, and the old one stays with the
shards that hold it.

Which file is which: an attached model keeps no descriptor of its files
(libwcache maps them and closes them; wc_model_fd() lends one only for a
derived artifact), so the file is found by a tensor: the directory model's
tensor of the name of one of the shard's tensors lies in a mapping that
/proc/self/maps names by (device, inode). maps is read once per attach of
the directory (its mappings do not change while it is held; about 1 ms in
a process that imported torch, some 1,700 mappings) and searched by
address (µs). That is compared with the shard descriptor's fstat, and where
fstat names the file otherwise than maps (overlayfs before Linux 6.8, btrfs
subvolumes: see _sharedview.py), with the maps line of the shard's own new
mapping (maps read again), which the kernel names as it names the
directory model's. A file found to be one of the generation's files is
known for as long as the registry knows the generation, so attaching the
directory again for it (a loader that closes each shard before the next
releases the directory each time) reads no maps. A file that holds no
tensor data is not matched.

A directory that wcached does not serve is not asked again for
NOT_SERVED_FOR seconds (per connection), so that a loader opening many
files of a directory that is not served pays for one question (about 50 µs)
per second rather than one per file; where its real path is not served
either, that is remembered as long (served_file: about 3 µs a file).
"""
import ctypes
import errno
import logging
import os
import stat
import threading
import time
import weakref

from . import _lib
from ._device import _say_once
from ._lib import DaemonUnavailable, ModelNotFound, WcacheError, fork_safe_module
from .model import Model, _c_string, _Handle

__all__ = ["served_file", "NOT_SERVED_FOR"]

NOT_SERVED_FOR = 1.0   # seconds a "not served" answer for a directory is kept
_MAX_ENTRIES = 256     # past this, entries no longer of use are dropped

_lock = threading.Lock()
_dirs = {}  # directory (as asked) -> _Entry
fork_safe_module(globals(), "_lock")


def _after_fork_in_child():
    """A child asks its own wcached connection: the parent's entries name
    the parent's."""
    global _dirs
    _dirs = {}


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class _Entry:
    """What the registry knows of one directory, for one connection: the
    attached model (a weak reference to its _Handle), its generation, the
    files (their fstat (device, inode), size and ctime: _stamp()) found to
    be files of that generation, and once read, /proc/self/maps as it was while the model was
    mapped; or until when the directory is taken as not served, and, when
    its real path was found not served either, what served_file() said."""
    __slots__ = ("client", "handle", "generation", "known", "maps", "until", "why",
                 "__weakref__")

    def __init__(self, client, handle=None, until=0.0):
        # weakly: a connection replaced after a restart closes once its
        # models are gone, whatever the registry still says of it
        self.client = weakref.ref(client)
        self.handle = None
        self.generation = None
        self.known = set()
        self.maps = None
        self.until = until
        self.why = None
        if handle is not None:
            self.generation = int(handle.lib.wc_model_generation(handle.ptr))
            me = weakref.ref(self)

            def gone(_ref):  # no lock: a garbage collection may run this anywhere
                entry = me()
                if entry is not None:
                    entry.maps = None
            self.handle = weakref.ref(handle, gone)

    def attached(self):
        """The directory's _Handle when it is still held and current, else None."""
        h = self.handle() if self.handle is not None else None
        if h is None or not h.ptr or h.lib.wc_model_stale(h.ptr):
            return None
        return h

    def identity_at(self, addr):
        """((major, minor), inode) of the file the attached model maps at
        addr, as /proc/self/maps names it, or None. Read once per attach:
        the model's own mappings do not change while it is held (another
        thread may read it too: the same)."""
        maps = self.maps
        if maps is None:
            maps = self.maps = _read_maps()
        return _identity_in(maps, addr)


def _read_maps():
    with open("/proc/self/maps", "rb") as f:
        return f.read()


def _identity_in(maps, addr):
    """((major, minor), inode) of the file mapping holding addr in maps
    (the bytes of /proc/self/maps), or None. A binary search: lines are in
    address order, and only the lines it lands on are parsed (a process
    that imported torch has some 1,700)."""
    lo, hi, found = 0, len(maps), None
    while lo < hi:
        line = maps.rfind(b"\n", 0, (lo + hi) // 2) + 1
        if int(maps[line:maps.index(b"-", line)], 16) <= addr:
            found = line
            end = maps.find(b"\n", line)
            lo = len(maps) if end < 0 else end + 1
        else:
            hi = line
    if found is None:
        return None
    end = maps.find(b"\n", found)
    parts = maps[found:None if end < 0 else end].split(None, 5)
    start, stop = (int(x, 16) for x in parts[0].split(b"-"))
    if len(parts) < 6 or not start <= addr < stop or parts[4] == b"0":
        return None
    major, minor = (int(x, 16) for x in parts[3].split(b":"))
    return (major, minor), int(parts[4])


def _stamp(st):
    """What entry.known holds of a file: its (device, inode) as maps names
    it, and its size and ctime, which a write in place changes (mtime can be
    set back: rsync --inplace --times)."""
    return (((os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino),
            st.st_size, st.st_ctime_ns)


def _remember(directory, entry, h=None):
    """Stores entry (h: the _Handle it refers to), unless another thread
    stored a usable one for the same connection meanwhile; returns the
    entry to use and its _Handle. The files found to be of the generation
    that a former entry of the same connection attached are kept."""
    with _lock:
        old = _dirs.get(directory)
        if old is not None and old.client() is entry.client() and h is not None:
            held = old.attached()
            if held is not None:
                return old, held
            if old.generation == entry.generation:
                entry.known = old.known
        if len(_dirs) >= _MAX_ENTRIES:
            now = time.monotonic()
            for k in [k for k, e in _dirs.items()
                      if (e.handle is None and e.until <= now) or
                      (e.handle is not None and e.handle() is None)]:
                del _dirs[k]
        _dirs[directory] = entry
        return entry, h


def _directory(client, directory, stamp):
    """(the registry's entry for the model wcached serves as directory,
    attached through client, and its _Handle), or (None, None) when wcached
    does not serve it, or (None, why) when it cannot answer (down, a client
    that another thread's reconnect closed) or its load failed (EIO "failed
    to load", said once at WARNING), which the caller falls back from by
    opening its file in this process, as _safe_open._attach does for a path.
    Any other daemon error (the generation modified in place, still
    loading, permission, a deadline) is raised, as for a named attach.

    A held entry answers at once only for a file already found to be one
    of its generation's files, unchanged since (stamp, _stamp()): for any
    other, wcached is asked again, so that a generation it no longer gives
    (a file of it written in place) is refused here too."""
    with _lock:
        entry = _dirs.get(directory)
    if entry is not None and entry.client() is client:
        if entry.handle is None:
            if time.monotonic() < entry.until:
                return None, None
        else:
            h = entry.attached()
            if h is not None and stamp in entry.known:
                return entry, h
            del h  # an error raised below must not hold the directory (its traceback)
    try:
        model = client.attach(directory)
    except ModelNotFound:
        _remember(directory, _Entry(client, until=time.monotonic() + NOT_SERVED_FOR))
        return None, None
    except (DaemonUnavailable, ValueError) as e:
        return None, str(e)  # not remembered
    except WcacheError as e:
        if e.errno != errno.EIO or type(e) is not WcacheError:
            raise
        _say_once(logging.WARNING, f"wcache: wcached could not serve the directory "
                  f"{directory}: {e}; its files are opened in this process")
        return None, str(e)
    h = model._h()
    model.close()  # h is kept by the shard models, and weakly by the registry
    return _remember(directory, _Entry(client, h), h)


def _open_fd(fd, label):
    """The C model of the one file open as fd (wc_open_fd), or None when it
    is not a valid model (the caller's in-process open then says what
    upstream says)."""
    out = ctypes.c_void_p()
    rc = _lib.lib().wc_open_fd(fd, _c_string(label, "path"), ctypes.byref(out))
    return out.value if rc >= 0 else None


def _with_data(h):
    """A wc_tensor of model h (a _Handle) that has data, or None: the first
    in byte order of names that has (one library call per tensor until
    then: no table of every tensor is read for it)."""
    t = _lib.wc_tensor()
    for i in range(int(h.lib.wc_model_count(h.ptr))):
        if h.lib.wc_model_tensor(h.ptr, i, ctypes.byref(t)) < 0:
            return None
        if t.nbytes:
            return t
    return None


def _served_as(target, fd, st, entry, h):
    """A Model of the file at target, holding the directory model h (the
    registry's entry), when target is one of h's files; else None. The file
    is one of them when h's tensor of the name of one of the file's tensors
    (one with data) lies in a mapping of the same (device, inode) as the
    file (fd, open at target; st, its fstat): its fstat, or where fstat
    names the file otherwise than maps, the maps line of the file's own
    mapping. A file found to be one is known for the rest of the
    generation while its size and ctime stay (a later attach of it reads
    no maps); the generation keeps its files open in wcached, so no other
    file can have their inode numbers meanwhile."""
    ptr = _open_fd(fd, target) if stat.S_ISREG(st.st_mode) else None
    if ptr is None:
        return None
    model = Model(_Handle(ptr, target, served=h), "wcached")
    stamp = _stamp(st)
    ident = stamp[0]
    if stamp in entry.known:
        return model
    mine = _with_data(model._h())
    if mine is not None:
        theirs = _lib.wc_tensor()
        rc = h.lib.wc_model_find(h.ptr, mine.name, ctypes.byref(theirs))
        try:
            served = entry.identity_at(theirs.data or 0) \
                if rc >= 0 and theirs.nbytes == mine.nbytes else None
            if served is not None and (
                    served == ident or served == _identity_in(_read_maps(), mine.data)):
                entry.known.add(stamp)
                return model
        except OSError:  # no /proc/self/maps to read: nothing tells the file
            pass
    model.close()
    return None


def served_file(client, target):
    """(a Model of the regular file at target, through the model wcached
    serves as the directory holding it, or None; why not, as words that
    follow "PATH is not served"). Tries the directory as target's absolute
    path names it, then its real path; when neither is served, the next
    file of the directory is answered at once (NOT_SERVED_FOR), without
    looking the real path up again (15 µs: an lstat per component)."""
    directory = os.path.dirname(os.path.abspath(target))
    with _lock:
        entry = _dirs.get(directory)
    if entry is not None and entry.why is not None and entry.client() is client and \
            time.monotonic() < entry.until:
        return None, entry.why
    try:
        fd = os.open(target, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as e:
        return None, f"it cannot be opened: {e.strerror}"
    whys, nothing = [], True
    try:
        st = os.fstat(fd)
        for d in (directory, None):
            if d is None:
                d = os.path.realpath(directory)
                if d == directory:
                    break
            entry, h = _directory(client, d, _stamp(st))
            if entry is None:
                whys.append(f"nor is its directory {d}" if h is None else
                            f"its directory {d}: {h}")
                nothing = nothing and h is None
                continue
            model = _served_as(target, fd, st, entry, h)
            if model is not None:
                return model, None
            nothing = False
            whys.append(f"wcached serves its directory {d}, but not this file as one of that "
                        f"model's files (not listed in it, replaced since, or served from a "
                        f"staged copy)")
    finally:
        os.close(fd)
    why = "; ".join(whys)
    if nothing:
        with _lock:
            entry = _dirs.get(directory)
            if entry is not None and entry.handle is None and entry.client() is client:
                entry.why = why
    return None, why
