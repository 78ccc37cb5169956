"""A file of a model wcached serves as a directory, opened by its own path.

README's configuration serves a Hugging Face model directory (``path =
/srv/models/llama``: wcached finds the shard index in it), but transformers,
and every loader of the hub's layout, opens the shards one by one by path:
``safe_open(DIR/model-00001-of-00004.safetensors)``. wcached serves a model
under its name and its configured path, so a shard's own path is not served.

served_file() finds the directory model that holds such a file: it attaches
the directory the path is in (its absolute spelling, then its real path: a
hub snapshot directory is real, while its shards are symlinks into blobs/,
so the directory of the shard's real path is not the snapshot) with
wc_attach_fds(), reads the identity of each file wcached passed
(wc_model_file_identity: the fstat of its descriptor, at the attach) and
closes every descriptor but those of files that may be wcached's staged
copies of the files at their paths (wc_model_close_fd; _files), and finds
the file by NAME: file k of the model is the one whose index name
(wc_model_file_name: the shard's name in the weight map, or the file's base
name) is the path's name in the directory. Then k's identity and the fstat
of the file opened at the path tell:

(a) the same device and inode: the file at the path is the generation's
    file k; it is mapped by wc_open_fd() of that file, as opened here;
(b) another device, the same size and mtime (a staged copy keeps its
    source's: daemon/stage.c), and the file at the path is the one the
    copy was made from, unchanged: its device, inode, size, mtime and
    ctime are what wcached says it copied (wc_model_file_origin, _origin;
    with a wcached that does not say: the file at the path last changed
    (ctime) before the copy was made (_copy_of), and it is the file the
    path named when the connection first attached the generation
    (_source_seen: the two ctimes come from two clocks)): wcached serves
    its staged copy of the file
    (stage = yes, or auto on NFS/9p/FUSE, with stage_dir on another file
    system):
    the copy is mapped, by wc_open_fd() of k's descriptor (the one kind
    the directory model keeps: one per staged file), on the pages
    wcached warmed, not the remote file's; it is the generation's copy,
    which follows a replacement of the file at the path as a named attach
    does (wcached's poll and reload make a new generation);
(c) the same device and another inode, or another device and another
    size or mtime, or a ctime after the copy's: not a file of the generation (the file at the path was
    replaced since: on overlayfs a file renamed over lies in the upper
    layer, another device; or wcached's staged copy is on the model's own
    file system): it is mapped in this process, as is a file that no file
    of the model is named as.

In (a) and (b) the shard is that one file, with its own tensors and
metadata, as upstream's safe_open(shard) gives them. The shard model holds
the directory model (wcache/model.py, _Handle.served), so the generation
stays attached, counted by wcached as in use, while the shard model or any
tensor made from it lives, and Model.generation and stale() are the
directory's. No /proc/self/maps is read: an fstat() and a name.

What wcached says of the directory is what a named attach would say: "not
served" and "wcached is down" fall back to mapping the file in this
process, as does a failed load (with one WARNING); any other refusal (the
generation modified in place, still loading, permission) is raised. A held
directory answers without asking wcached for a file that is its
generation's file of that name as attached (_as_attached: (a) with the
same size, mtime and ctime, so not written since, or (b)), or that was
found to be one of its files after asking and is unchanged since (device,
inode, size, ctime): the first pass over a directory's files attaches it
once (review rev172: each file's first open attached it again, 5x-10x
what the same files cost as models of their own). For any other file the
directory is attached again, so wcached's refusal of a generation whose
file was written in place since the attach is not bypassed for that file;
a file of it that was not written is the held generation's, as bytes and
as a label.

One attached directory model per connection and directory, shared by every
shard model of it: an attach maps every file of the model (and receives a
descriptor per file, 163 for a 163-shard model, kept only for a staged
copy: a held directory that is not staged costs no descriptor, review
rev172 F2; attached anew after a generation with no staged copy, with
wc_attach(), which keeps none); an attach per shard would map 163 x 163
files. The registry keeps it by weak reference only: closing the last
shard (and dropping its tensors) releases it, kept descriptors included.
A stale one (wcached serves a newer generation) or one made by another
connection (after a reconnect, or by the parent of a fork()) is not used
again: the directory is attached anew, and the old one stays with the
shards that hold it. A file found to be one
of the generation's files is known, with its number k, for as long as the
registry knows the generation; k is checked against the name the attached
model gives file k each time it is used, so a generation number reused by
another model's index cannot hand out another file.

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
_attaching = {}  # directory -> threading.Event set when its attach in flight ends
fork_safe_module(globals(), "_lock")


def _after_fork_in_child():
    """A child asks its own wcached connection: the parent's entries name
    the parent's, and its attaches in flight are the parent's threads'."""
    global _dirs, _attaching
    _dirs = {}
    _attaching = {}


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class _Entry:
    """What the registry knows of one directory, for one connection: the
    attached model (a weak reference to its _Handle), its generation, the
    files found to be files of that generation (their _stamp() -> (k, the
    model's file number, and whether it is wcached's staged copy that is
    mapped)), the model's file names ({name: k}, read once per generation),
    each file's identity as attached (wc_model_file_identity), what wcached
    said a file that may be its staged copy was copied from ({k: the
    source's (device, inode, size, mtime, ctime), or False: not a staged
    copy}; none where wcached does not say: _origin), whether some
    file may be a staged copy (kept: the model keeps those descriptors),
    and for each that may be, the _stamp() of the file at its path when
    the generation was first attached through the connection (sources);
    or until when the directory is taken as not served, and, when its real
    path was found not served either, what served_file() said."""
    __slots__ = ("client", "handle", "generation", "known", "names", "ids", "origins", "kept",
                 "sources", "until", "why", "lost", "__weakref__")

    def __init__(self, client, handle=None, until=0.0):
        # weakly: a connection replaced after a restart closes once its
        # models are gone, whatever the registry still says of it
        self.client = weakref.ref(client)
        self.handle = None
        self.generation = None
        self.known = {}
        self.names = None
        self.ids = None
        self.origins = {}
        self.kept = True
        self.sources = {}
        self.until = until
        self.why = None
        self.lost = False  # a kept descriptor found to be another file's (_kept_fd)
        if handle is not None:
            self.generation = int(handle.lib.wc_model_generation(handle.ptr))
            self.handle = weakref.ref(handle)

    def attached(self):
        """The directory's _Handle when it is still held and current, and
        none of its kept descriptors was found lost, else None."""
        h = self.handle() if self.handle is not None else None
        if h is None or not h.ptr or self.lost or h.lib.wc_model_stale(h.ptr):
            return None
        return h


def _stamp(st):
    """What entry.known is keyed by: a file's (device, inode), and its size
    and ctime, which a write in place changes (mtime can be set back: rsync
    --inplace --times)."""
    return st.st_dev, st.st_ino, st.st_size, st.st_ctime_ns


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


def _directory(client, directory, name, st):
    """(the registry's entry for the model wcached serves as directory,
    attached through client, and its _Handle), or (None, None) when wcached
    does not serve it, or (None, why) when it cannot answer (down, a client
    that another thread's reconnect closed) or its load failed (EIO "failed
    to load", said once at WARNING), which the caller falls back from by
    opening its file in this process, as _safe_open._attach does for a path.
    Any other daemon error (the generation modified in place, still
    loading, permission, a deadline) is raised, as for a named attach.

    A held entry answers at once for the file named name (bytes) whose
    fstat is st only when that file is the generation's file of its name
    as it was attached, not written since (_as_attached), or was found to
    be one of its files after wcached was asked, unchanged since (its
    _stamp() in known): for any other, wcached is asked again, so that a
    generation it no longer gives (that file written in place since) is
    refused here too. So the first pass over a held directory's files asks
    wcached nothing (review rev172's bench MISS: it attached the directory
    anew for each file)."""
    while True:
        entry, h = _held(client, directory, name, st)
        if h is not None or _not_served(client, directory):
            return entry, h
        del h  # an error raised below must not hold the directory (its traceback)
        # One attach in flight per directory: a thread that finds one
        # waits for it and looks again (review rev174 F3: transformers'
        # loader threads each attached the directory on the first pass,
        # N + 2 descriptors and N mappings each).
        with _lock:
            busy = _attaching.get(directory)
            if busy is None:
                busy = _attaching[directory] = threading.Event()
                break
        busy.wait()
    try:
        return _attach_anew(client, directory)
    finally:
        with _lock:
            if _attaching.get(directory) is busy:
                del _attaching[directory]
        busy.set()


def _not_served(client, directory):
    """Whether the registry takes directory as not served (for client) now."""
    with _lock:
        entry = _dirs.get(directory)
    return entry is not None and entry.client() is client and entry.handle is None and \
        time.monotonic() < entry.until


def _held(client, directory, name, st):
    """(the registry's entry, its _Handle) when it holds the directory for
    client and answers for the file named name whose fstat is st without
    asking wcached (_directory); else (None, None)."""
    with _lock:
        entry = _dirs.get(directory)
    if entry is not None and entry.client() is client and entry.handle is not None:
        h = entry.attached()
        if h is not None and (_still_known(entry, h, st) or _as_attached(entry, h, name, st)):
            return entry, h
    return None, None


def _attach_anew(client, directory):
    """_directory's attach, with no other thread attaching directory."""
    with _lock:
        entry = _dirs.get(directory)
    prior = entry if entry is not None and entry.client() is client and \
        entry.names is not None else None
    try:
        entry, h = _attach(client, directory, prior)
    except ModelNotFound:
        _remember(directory, _Entry(client, until=time.monotonic() + NOT_SERVED_FOR))
        return None, None
    except (DaemonUnavailable, ValueError) as e:
        return None, str(e)  # not remembered
    except WcacheError as e:
        if e.errno not in (errno.EIO, errno.EMFILE, errno.ENFILE) or type(e) is not WcacheError:
            raise
        # a failed load, or no room for the reply's descriptors (one per
        # file, closed at once but a staged copy's: review rev172 F2): the
        # file itself needs one only while it is mapped here
        _say_once(logging.WARNING, f"wcache: wcached could not serve the directory "
                  f"{directory}: {e}; its files are opened in this process")
        return None, str(e)
    return _remember(directory, entry, h)


def _attach(client, directory, prior):
    """(a new registry entry for the directory, attached through client,
    and its _Handle). prior: the registry's former entry of it for this
    connection, or None. With wc_attach_fds() unless prior found no file
    that may be a staged copy (then wc_attach(), which keeps none: nothing
    to close); a generation found then to have some is attached again with
    them. The names of a generation are read once (carried from prior when
    it is the same generation; _file_number checks them), the identities
    at each attach."""
    keep = prior is None or prior.kept
    while True:
        model = client.attach(directory, _keep_fds=keep)
        h = model._h()
        model.close()  # h is kept by the shard models, and weakly by the registry
        entry = _Entry(client, h)
        same = prior is not None and prior.generation == entry.generation
        entry.names, entry.ids, entry.origins, entry.sources, entry.kept = _files(
            directory, h, prior.names if same else None, keep, prior.sources if same else {})
        if keep or not entry.kept:
            return entry, h
        keep = True


def _names(h):
    """{name (bytes): k} of the files of the directory model h."""
    names = {}
    for k in range(int(h.lib.wc_model_file_count(h.ptr))):
        name = h.lib.wc_model_file_name(h.ptr, k)
        if name is not None:
            names.setdefault(name, k)
    return names


def _files(directory, h, names, keep, sources):
    """(names: {name (bytes): k}, read unless given; [file k's identity as
    attached: (device, inode, size, mtime, ctime in ns), or None]; {k: what
    wcached says file k was copied from (_origin)} for the files that may
    be staged copies; {k:
    the _stamp() of the file at k's path} for each file k that may be, or
    was found by an earlier attach to be, wcached's staged copy of the file
    at its path; whether some file may be one now) of the directory model
    h, just attached (keep: with wc_attach_fds()) and not yet seen by
    another thread. sources: what an earlier attach of the same generation
    through the connection found (_stamp() of k's path then), kept over
    what the path holds now: a file put at the path since is not the one
    the copy was made from, whatever the clocks say (_copy_of). With keep,
    closes every descriptor h keeps but those of files that may be staged
    copies (another device than the path's file, the same size and mtime:
    case (b)), the only ones a shard is mapped through: a held directory
    that is not staged keeps no descriptor (review rev172 F2). A file on
    the directory's own device is not a staged copy of one in it, and
    needs no stat."""
    lib, ptr = h.lib, h.ptr
    if names is None:
        names = _names(h)
    by_k = {k: name for name, k in names.items()}
    ids, origins, found, kept = [], {}, dict(sources), False
    try:
        here = os.stat(directory).st_dev
    except OSError:
        here = None
    ident = _lib.wc_file_identity()
    for k in range(int(lib.wc_model_file_count(ptr))):
        i = None
        if lib.wc_model_file_identity(ptr, k, ctypes.byref(ident)) >= 0:
            i = (ident.dev, ident.ino, ident.size, ident.mtime_ns, ident.ctime_ns)
        ids.append(i)
        o = None
        if i is not None and i[0] != here and k in by_k:
            o = _origin(h, k)
            if o is not None:
                origins[k] = o
        st = _may_be_staged(directory, by_k[k], i, o) \
            if i is not None and i[0] != here and k in by_k else None
        if st is not None and found.setdefault(k, _stamp(st)) == _stamp(st):
            kept = True
        elif keep:
            lib.wc_model_close_fd(ptr, k)
    return names, ids, origins, found, kept


def _origin(h, k):
    """What wcached says file k of the directory model h was copied from:
    the source's (device, inode, size, mtime, ctime in ns) when it was
    copied, False when k is not a staged copy, None when wcached does not
    say (older than wc_model_file_origin, or it could not be asked: the
    clock-based test of _copy_of stands then)."""
    if not _lib.has("wc_model_file_origin"):
        return None
    o = _lib.wc_file_identity()
    rc = h.lib.wc_model_file_origin(h.ptr, k, ctypes.byref(o))
    if rc == 0:
        return o.dev, o.ino, o.size, o.mtime_ns, o.ctime_ns
    return False if rc == -errno.ENOENT else None


def _may_be_staged(directory, name, i, o=None):
    """The stat of the file of that name in directory (bytes; its symlink
    followed, as a loader opens it) when it may be the source that the
    file of identity i is wcached's staged copy of (_served_as, case
    (b); o: what wcached says it was copied from, _origin), else None."""
    if b"/" in name:
        return None
    try:
        st = os.stat(os.path.join(os.fsencode(directory), name))
    except OSError:
        return None
    return st if _copy_of(i, st, o) else None


_SECOND = 1_000_000_000


def _copy_of(i, st, o=None):
    """Whether wcached's file of identity i (the fstat of its descriptor at
    the attach) may be its staged copy of the file whose (f)stat is st:
    on another device, with st's size and mtime (stage.c gives the copy
    its source's), and st last changed (ctime) before the copy was made.
    stage.c checks after the copy that the path still names the source,
    unchanged; a file put at the path since (renamed over, linked) or
    written there since (its mtime put back or not) has a later ctime,
    which no one can set back (review rev174 F1: size and mtime alone took
    such a replacement for the source, and served the old copy's bytes).
    A ctime of whole seconds (a file system that keeps no more) must be a
    full second before the copy's. Both ctimes come from clocks: the
    source's file system's (an NFS server's) and this host's, so a
    replacement within the source clock's lag behind this host's, after
    the copy was made, still passes (README), unless the path was seen to
    name another file or change since the generation was attached
    (_source_seen). With o, what wcached says the copy was copied from
    (_origin), no clock is asked: st must be that file, unchanged (device,
    inode, size, mtime and ctime, all on the source's file system); o False
    (not a staged copy) is never one."""
    if st.st_dev == i[0] or (st.st_size, st.st_mtime_ns) != (i[2], i[3]):
        return False
    if o is not None:
        return o is not False and \
            (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) == o
    c = st.st_ctime_ns
    return c + _SECOND <= i[4] if c % _SECOND == 0 else c < i[4]


def _source_seen(entry, k, st):
    """Whether st (the fstat of the file at the path of file k of the
    registry's entry) is what that path held when the generation was first
    attached through the connection (_files): a file renamed over it or
    written there since has another inode or ctime, whichever clock set
    it. Not needed where wcached said what k was copied from (_copy_of with
    entry.origins[k] compares st with that)."""
    return k in entry.origins or entry.sources.get(k) == _stamp(st)


def _kept_fd(entry, h, k):
    """The descriptor h (the registry's entry's _Handle) keeps of its file
    k while fstat still names k's identity as attached (device, inode,
    size), else -1: a number this process closed behind libwcache's back
    (closefrom() in a daemonizing child) and gave to another file since is
    not wcached's copy (review rev174 F2). The entry is then lost: the
    directory is attached anew, not found held again."""
    fd = h.lib.wc_model_fd(h.ptr, k)
    i = entry.ids[k]
    if fd < 0 or i is None:
        return -1
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino, st.st_size) == i[:3]:
            return fd
    except OSError:
        pass
    entry.lost = True
    return -1


def _still_known(entry, h, st):
    """Whether the file whose fstat is st was found to be one of the files
    of the registry's entry (h its _Handle) and, when that is wcached's
    staged copy, the descriptor of the copy is still kept (_kept_fd)."""
    k, staged = entry.known.get(_stamp(st), (None, False))
    return k is not None and (not staged or _kept_fd(entry, h, k) >= 0)


def _open_fd(fd, label):
    """The C model of the one file open as fd (wc_open_fd), or None when it
    is not a valid model (the caller's in-process open then says what
    upstream says)."""
    out = ctypes.c_void_p()
    rc = _lib.lib().wc_open_fd(fd, _c_string(label, "path"), ctypes.byref(out))
    return out.value if rc >= 0 else None


def _as_attached(entry, h, name, st):
    """Whether the file named name whose fstat is st is the file of that
    name of the registry's entry (h its _Handle) as it was when wcached
    passed it: (a) the same device and inode, and the same size, mtime and
    ctime (a write in place changes ctime, whatever it does to mtime); or
    (b) another device with the same size and mtime as wcached's staged
    copy, changed last before it (_copy_of), still the file seen at the
    path at the attach (_source_seen), whose descriptor h keeps."""
    k = _file_number(entry, h, name)
    i = entry.ids[k] if k is not None else None
    if i is None:
        return False
    if i[:2] == (st.st_dev, st.st_ino):
        return i[2:] == (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return _copy_of(i, st, entry.origins.get(k)) and _source_seen(entry, k, st) and \
        _kept_fd(entry, h, k) >= 0


def _file_number(entry, h, name):
    """The number of the file of h (the registry's entry's _Handle) that
    its index names name (bytes), or None. The names are read once per
    generation (_files), and checked here: a generation number that another
    index of the directory had (a model removed and configured again
    numbers anew) reads them again. The index's own strings are checked by
    libwcache (NUL-terminated, inside the index), and a name only selects
    which identity to compare."""
    k = entry.names.get(name)
    if k is not None and h.lib.wc_model_file_name(h.ptr, k) != name:
        entry.names = _names(h)
        k = entry.names.get(name)
    return k


def _served_as(target, fd, st, entry, h):
    """(a Model of the file at target, holding the directory model h (the
    registry's entry), None) when target is one of h's files, by name and
    fstat (the module's docstring: (a) the file itself, (b) wcached's
    staged copy of it); else (None, why not, as words that follow
    "wcached serves its directory DIR, but"). fd is open at target and st
    its fstat. A file found to be one is known for the rest of the
    generation while its device, inode, size and ctime stay; the
    generation keeps its files open in wcached, so no other file can have
    their inode numbers meanwhile."""
    if not stat.S_ISREG(st.st_mode):
        return None, "not this file, which is not a regular file"
    name = os.fsencode(os.path.basename(target))
    stamp = _stamp(st)
    k, staged = entry.known.get(stamp, (None, False))
    if k is None or h.lib.wc_model_file_name(h.ptr, k) != name:
        k = _file_number(entry, h, name)
        if k is None:
            return None, ("not this file: no file of that model is named so (not listed in "
                          "its index)")
        theirs = entry.ids[k]
        if theirs is None:
            return None, "not this file: libwcache gave no identity of that model's file"
        if theirs[:2] == (st.st_dev, st.st_ino):
            staged = False
        elif theirs[0] == st.st_dev:
            return None, ("not this file: that model's file of its name is another file on "
                          "the same file system (this one replaced since, or served from a "
                          "staged copy in a stage_dir on this file system)")
        elif _copy_of(theirs, st, entry.origins.get(k)):
            # wcached's staged copy keeps its source's size and mtime
            # (stage.c); another device alone is not a copy (overlayfs
            # gives a file renamed over in its upper layer another st_dev)
            if not _source_seen(entry, k, st):
                return None, ("not this file: it is not the file its path named when this "
                              "generation was attached (renamed over or written since), so "
                              "not the one wcached staged")
            staged = True
            if h.lib.wc_model_fd(h.ptr, k) < 0:
                return None, ("not this file: it was not its staged copy's size and mtime "
                              "when the directory was attached (no descriptor of the copy "
                              "was kept)")
        else:
            return None, ("not this file: that model's file of its name is on another file "
                          "system, with another size or mtime, or older than this file's "
                          "last change (this one replaced since wcached opened or staged "
                          "it)")
    if staged:
        fd = _kept_fd(entry, h, k)
        if fd < 0:
            entry.known.pop(stamp, None)
            return None, ("not this file: the descriptor kept of its staged copy is no "
                          "longer that copy (closed by this process since)")
    ptr = _open_fd(fd, target)
    if ptr is None:
        return None, "not this file, which is not a valid model"
    entry.known[stamp] = (k, staged)
    if staged:
        _say_once(logging.INFO, f"wcache: the files of {os.path.dirname(target)} come "
                  f"through wcached from its staged copy of generation {entry.generation} "
                  f"(stage_dir): a file replaced at its path is served once wcached reloads "
                  f"the model")
    return Model(_Handle(ptr, target, served=h), "wcached"), None


def served_file(client, target):
    """(a Model of the regular file at target, through the model wcached
    serves as the directory holding it, or None; why not, as words that
    follow "PATH is not served"). Tries the directory as target's absolute
    path names it, then its real path; when neither is served, the next
    file of the directory is answered at once (NOT_SERVED_FOR), without
    looking the real path up again (15 µs: an lstat per component)."""
    if not _lib.has("wc_model_file_identity"):
        return None, (f"this libwcache ({_lib.library_path()}) has no "
                      "wc_model_file_identity()")
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
            entry, h = _directory(client, d, os.fsencode(os.path.basename(target)), st)
            if entry is None:
                whys.append(f"nor is its directory {d}" if h is None else
                            f"its directory {d}: {h}")
                nothing = nothing and h is None
                continue
            model, why = _served_as(target, fd, st, entry, h)
            if model is not None:
                return model, None
            nothing = False
            whys.append(f"wcached serves its directory {d}, but {why}")
    finally:
        os.close(fd)
    why = "; ".join(whys)
    if nothing:
        with _lock:
            entry = _dirs.get(directory)
            if entry is not None and entry.handle is None and entry.client() is client:
                entry.why = why
    return None, why
