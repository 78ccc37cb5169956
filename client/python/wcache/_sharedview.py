"""A shared read-only view of the file behind a model's private mapping, for a device to pin.

libwcache maps model files MAP_PRIVATE, so that torch tensors can be
copy-on-write (see _torch.py). On Linux 6.2 and later a long-term read-only
pin of a page in a private (copy-on-write) mapping makes the kernel give the
process its own copy of the page first ("mm/gup: reliable R/O long-term
pinning in COW mappings"), and cudaHostRegister pins long-term (NVIDIA's
driver does, on x86): registering the model's own mapping could copy the
whole model into this worker's memory, the opposite of what wcache is for.
A MAP_SHARED, PROT_READ mapping of a descriptor opened read-only is not
copy-on-write (the kernel gives it no VM_MAYWRITE): pinning it pins the page
cache pages that every worker shares.

So the copy engine (_device.py) registers such a mapping of the same file
instead: the file behind a range is found in /proc/self/maps, opened
read-only through its path, mapped shared over the same file offsets, and
checked to be the same inode (device and inode number) by MappedFile,
which _torch.py's copy-on-write remap uses too (map_mapped_file); the
engine's views of one mapping share one MappedFile (MappingFiles), so the
file is opened and checked once per mapping, not once per view. /proc/self/maps and
fstat(2) can name one file differently: overlayfs before Linux 6.8 shows
the underlying (upper or lower) inode in maps and the overlay's st_dev in
stat (a container's /tmp), btrfs the superblock's device in maps and the
subvolume's in stat. Where fstat disagrees, the new mapping's own line in
/proc/self/maps decides: the kernel names both mappings the same way, and
the same (device, inode) there is the same file. A mapping whose file has
no path any more (maps says " (deleted)": a file renamed over or removed,
or a memfd, which is what a derived artifact is: "/memfd:wcache-artifact
(deleted)") is mapped through a descriptor the model keeps of it where it
keeps one: libwcache keeps a derived artifact's (wc_model_fd(): the
read-only descriptor of the sealed memfd wcached sent), which any worker
may use; the engine maps a duplicate of it, checked by fstat to be the
(device, inode) maps names. Otherwise it is opened through
/proc/self/map_files, which opens the mapped inode itself; Linux lets only
a process with CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN do that. Where no
view can be made (the worker may not open the path: a file only the daemon
can read, unless the model keeps a descriptor of it, as a served
directory's model does of its staged copies (_shards.py); it was renamed
over without those capabilities, or is a memfd the model keeps no
descriptor of (a libwcache without wc_model_fd); the range is not one
file's), :class:`Unavailable` says why, and the engine
stages through pinned buffers instead, which keeps the page cache shared
too.

The engine keeps one :class:`MappingFiles` per model mapping (_device.py),
so a model loaded tensor by tensor (safe_open's get_tensor on a device)
reads /proc/self/maps and opens and checks its file once, not once per
tensor.
"""
import bisect
import ctypes
import errno
import mmap
import os

__all__ = ["Unavailable", "NotMapped", "SharedView", "shared_view", "file_mappings",
           "map_mapped_file", "mapped_identity", "MappedFile", "MappingFiles"]

_PROT_READ = 0x1
_MAP_SHARED = 0x01

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value
_DELETED = b" (deleted)"


class Unavailable(Exception):
    """No shared view can be made of this range (the message says why)."""


class NotMapped(Unavailable):
    """The range lies in no one file mapping of the list searched (a list
    read before the mapping was made would say so too: read it again)."""


def file_mappings():
    """Sorted [(start, end, offset, (major, minor), inode, path, shared)] of
    this process's file mappings (/proc/self/maps)."""
    entries = []
    with open("/proc/self/maps", "rb") as f:
        for line in f:
            parts = line.rstrip(b"\n").split(None, 5)
            if len(parts) < 6 or parts[4] == b"0" or not parts[5].startswith(b"/"):
                continue
            start, end = (int(x, 16) for x in parts[0].split(b"-"))
            major, minor = (int(x, 16) for x in parts[3].split(b":"))
            entries.append((start, end, int(parts[2], 16), (major, minor), int(parts[4]),
                            parts[5], parts[1][3:4] == b"s"))
    entries.sort()
    return entries


class SharedView:
    """[lo, hi) of a private file mapping, mapped again MAP_SHARED read-only
    at ``addr``: ``translate(a)`` is where the byte at a is in the view.
    ``own`` is False when [lo, hi) is already a shared mapping (then the
    view is the range itself). close() unmaps it (idempotent)."""

    def __init__(self, lo, hi, addr, own):
        self.lo, self.hi, self.addr, self.own = lo, hi, addr, own

    def translate(self, a, n):
        if not (self.lo <= a and a + n <= self.hi):
            raise Unavailable(f"[{a:#x}, {a + n:#x}) is not inside the view "
                              f"[{self.lo:#x}, {self.hi:#x})")
        return self.addr + (a - self.lo)

    def close(self):
        addr, self.addr = self.addr, None
        if addr is not None and self.own:
            _libc.munmap(addr, self.hi - self.lo)


def shared_view(lo, hi, entries=None, opened=None):
    """A SharedView of the page-aligned range [lo, hi), which must lie in
    one file mapping of entries (file_mappings(), read now when None: a
    caller with many ranges reads it once and passes it, since each read
    parses every line of /proc/self/maps); NotMapped when it lies in none,
    Unavailable when no view can be made. opened, a MappingFiles, keeps
    the file open and checked for the caller's next view of it."""
    if lo % mmap.PAGESIZE or hi % mmap.PAGESIZE or hi <= lo:
        raise Unavailable(f"range [{lo:#x}, {hi:#x}) is not page-aligned")
    entries = file_mappings() if entries is None else entries
    i = bisect.bisect_right([e[0] for e in entries], lo) - 1
    if i < 0 or not (entries[i][0] <= lo and hi <= entries[i][1]):
        raise NotMapped(f"range [{lo:#x}, {hi:#x}) is not inside one file mapping")
    start, _end, offset, dev, ino, path, shared = entries[i]
    if shared:
        return SharedView(lo, hi, lo, False)

    def span(st):
        file_off = offset + (lo - start)
        if file_off + (hi - lo) > st.st_size + mmap.PAGESIZE - 1:
            raise Unavailable(f"{os.fsdecode(path)} is shorter than its mapping")
        return file_off, hi - lo
    if opened is None:
        addr, _ = map_mapped_file(path, dev, ino, span, _PROT_READ, _MAP_SHARED,
                                  at=(start, _end))
    else:
        addr, _ = opened.file(entries[i]).map(span, _PROT_READ, _MAP_SHARED)
    return SharedView(lo, hi, addr, True)


def mapped_identity(addr):
    """((major, minor), inode) of the file mapping at addr as
    /proc/self/maps names it (read now), or None where none is."""
    entries = file_mappings()
    i = bisect.bisect_right([e[0] for e in entries], addr) - 1
    if i < 0 or not entries[i][0] <= addr < entries[i][1]:
        return None
    return entries[i][3], entries[i][4]


def _deleted_reason(name, path, error, kept):
    """Why no view can be made of a mapping whose file has no path (maps
    names it "PATH (deleted)"), /proc/self/map_files having refused with
    error (an OSError); kept is None, or why the model kept no descriptor
    of it."""
    if path.startswith(b"/memfd:"):
        what = f"{name}: a memfd (a derived artifact is one), which has no path to open"
        if kept is not None:
            what += f", libwcache keeps no descriptor of it ({kept})"
    else:
        what = f"{name}: the mapped file was deleted or renamed over"
    if error.errno == errno.EPERM:
        how = "opening it through /proc/self/map_files needs CAP_CHECKPOINT_RESTORE or " \
              "CAP_SYS_ADMIN"
    else:
        how = f"/proc/self/map_files: {error.strerror}"
    return f"{what}, and {how}"


class MappedFile:
    """The file a /proc/self/maps entry names (path, dev as (major, minor),
    inode), opened read-only through its path, to be mapped again by map().
    Where the entry says the file has no path (" (deleted)": renamed over,
    removed, a memfd), or the path may not be opened (EACCES, EPERM: a
    staged copy in wcached's stage_dir), it is a duplicate of the model's
    own descriptor of that inode where descriptors (a callable: the
    descriptors the model lends, see _device.model_descriptors) gives one
    whose fstat names the entry's (dev, inode), else, for no path, where
    at, the entry's (start, end), is given, the mapped inode opened
    through /proc/self/map_files/START-END. Unavailable where none of them
    can be had.

    Whether it is that file is checked once: by fstat at the first map(), or
    where fstat names it by another device or inode (overlayfs before Linux
    6.8, btrfs: see the module comment), by the first mapping's own line in
    /proc/self/maps. Every later mapping is made through the same
    descriptor, so it maps the same file and needs no check: a caller that
    maps many ranges of one file reads maps once, not once per range.
    close() closes the descriptor (idempotent); mappings made stay."""

    def __init__(self, path, dev, ino, at=None, descriptors=None):
        self.name = os.fsdecode(path)
        self.dev, self.ino = dev, ino
        self.fd = None
        self.wrong = None  # why the descriptor is not the mapped file, once seen
        self.kept = False  # a duplicate of the model's own descriptor (tests)
        flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY
        if path.endswith(_DELETED):
            kept = None
            if descriptors is not None:
                self.fd, kept = self._kept(descriptors)
                if self.fd is not None:
                    self.kept = True
                    self.checked = None
                    return
            if at is None:
                raise Unavailable(f"{self.name}: the mapped file was deleted or renamed over")
            try:
                self.fd = os.open(f"/proc/self/map_files/{at[0]:x}-{at[1]:x}", flags)
            except OSError as e:
                raise Unavailable(_deleted_reason(self.name, path, e, kept)) from None
        else:
            try:
                self.fd = os.open(path, flags)
            except OSError as e:
                # A file this worker may not open (a staged shard's copy in
                # wcached's stage_dir, 0700: review rev172 F3) is mapped
                # through the descriptor the model keeps of it, where it
                # keeps one.
                if e.errno in (errno.EACCES, errno.EPERM) and descriptors is not None:
                    self.fd, _ = self._kept(descriptors)
                if self.fd is None:
                    raise Unavailable(f"cannot open {self.name}: {e.strerror}") from None
                self.kept = True
        self.checked = None  # by the first fstat, else by a mapping's line in maps

    def _kept(self, descriptors):
        """(a duplicate of the descriptor descriptors() lends of this
        entry's (dev, inode), or None; why there is none, or None). The
        duplicate (close-on-exec) is this object's, so the model may close
        its own whenever it goes."""
        fds = descriptors()
        if fds is None:
            return None, "this libwcache has no wc_model_fd"
        for fd in fds:
            try:
                st = os.fstat(fd)
            except OSError:
                continue
            if (os.major(st.st_dev), os.minor(st.st_dev)) == self.dev and \
                    st.st_ino == self.ino:
                try:
                    return os.dup(fd), None
                except OSError as e:
                    return None, f"dup: {e.strerror}"
        return None, "none of the model's descriptors is this file" if fds else \
            "the model keeps none"

    def map(self, span, prot, flags):
        """(addr, length) of a new mapping (mmap(2) with prot and flags) of
        the file; span(stat) gives the file offset and length to map, or
        raises Unavailable. Unavailable where span refuses, mmap fails, the
        file is not the one the entry names, or /proc/self/maps cannot be
        read to check it; then nothing stays mapped. The caller unmaps addr."""
        if self.fd is None:
            raise Unavailable(f"{self.name}: closed")
        if self.wrong is not None:
            raise Unavailable(self.wrong)
        try:
            st = os.fstat(self.fd)
        except OSError as e:
            raise Unavailable(f"cannot stat {self.name}: {e.strerror}") from None
        if self.checked is None:
            self.checked = (os.major(st.st_dev), os.minor(st.st_dev)) == self.dev and \
                st.st_ino == self.ino
        file_off, length = span(st)
        addr = _libc.mmap(None, length, prot, flags, self.fd, file_off)
        if addr is None or addr == _MAP_FAILED:
            e = ctypes.get_errno()
            kind = "shared" if flags & _MAP_SHARED else "private"
            raise Unavailable(f"{self.name}: {kind} mmap: {os.strerror(e)}")
        if not self.checked:
            try:
                identity = mapped_identity(addr)
            except OSError as e:  # /proc/self/maps unreadable (EMFILE, ENOMEM): not mapped here
                _libc.munmap(addr, length)
                raise Unavailable(f"{self.name}: cannot read /proc/self/maps: "
                                  f"{e.strerror}") from None
            if identity != (self.dev, self.ino):
                _libc.munmap(addr, length)
                # What a descriptor is never changes: say so at once next time.
                self.wrong = f"{self.name} is no longer the mapped file (renamed over)"
                raise Unavailable(self.wrong)
            self.checked = True
        return addr, length

    def close(self):
        fd, self.fd = self.fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                # Linux releases the descriptor whatever close(2) returns
                # (a FUSE flush error, EINTR), and nothing was written
                # through it: there is nothing to retry or report.
                pass


class MappingFiles:
    """The files behind one model's mapping, opened and checked once for
    every shared view made of it while it is mapped: the lines of
    /proc/self/maps that overlap [lo, hi) (the model's tensor data; all
    lines when None), read at the first view, and one MappedFile per line,
    opened at its first view. A model loaded tensor by tensor (safe_open's
    get_tensor on a device: one copy per tensor) then reads maps and opens
    its file once, not once per tensor: a read parses every line of maps
    (4 ms at 1,700 lines, 22 ms at 4,700, as a CUDA process has).

    The lines read stay true while the model is mapped, and its owner keeps
    this no longer than that (the copy engine: one per model handle, closed
    when the handle goes; or one per copy): the kernel may split a line
    since (every address in it still has its file offset), never give its
    addresses to another file while it is mapped. A range no line read
    covers is looked up in a fresh read. Keyed by the whole line, the
    mapping itself: two mappings that maps names alike (btrfs subvolumes'
    files with one inode number, at one path through a bind mount) are
    each checked. One thread at a time (the engine's registration lock).
    descriptors: where a line names a file with no path, what MappedFile
    asks for the model's own descriptors (None: the model lends none).
    close() closes every descriptor (idempotent); views made stay."""

    def __init__(self, lo=None, hi=None, descriptors=None):
        self.lo, self.hi = lo, hi
        self.descriptors = descriptors
        self.entries = None
        self.files = {}
        self.reads = 0  # reads of /proc/self/maps (tests)

    def _read(self):
        entries = file_mappings()
        if self.lo is not None:
            entries = [e for e in entries if e[0] < self.hi and self.lo < e[1]]
        self.entries = entries
        self.reads += 1

    def view(self, lo, hi):
        """A SharedView of the page-aligned range [lo, hi) (shared_view),
        looked up in the lines read before, else (the first view, or a
        range they lack) in a fresh read."""
        fresh = self.entries is None
        if fresh:
            self._read()
        try:
            return shared_view(lo, hi, self.entries, self)
        except NotMapped:
            if fresh:
                raise
            self._read()
            return shared_view(lo, hi, self.entries, self)
        except Unavailable:
            # A file renamed over since the lines were read (a hot swap
            # of one shard while another was copied): its line named its
            # path, which opens the new file now. Read again: the line
            # says "(deleted)" now, and the mapped inode is looked for as
            # such (the model's descriptor, /proc/self/map_files).
            if fresh or not self._drop_wrong():
                raise
            self._read()
            return shared_view(lo, hi, self.entries, self)

    def _drop_wrong(self):
        """Closes and forgets the files found not to be their line's (a
        path renamed over since maps was read); True when there was one."""
        wrong = [e for e, f in self.files.items() if f.wrong is not None]
        for e in wrong:
            self.files.pop(e).close()
        return bool(wrong)

    def file(self, entry):
        """The MappedFile of entry, a file_mappings() line: the one held,
        or opened now; Unavailable as MappedFile (not kept: a file the
        worker may not open now is tried again at the next view)."""
        opened = self.files.get(entry)
        if opened is None:
            start, end, _offset, dev, ino, path, _shared = entry
            opened = self.files[entry] = MappedFile(path, dev, ino, at=(start, end),
                                                    descriptors=self.descriptors)
        return opened

    def close(self):
        files, self.files, self.entries = self.files, {}, None
        for opened in files.values():
            opened.close()


def map_mapped_file(path, dev, ino, span, prot, flags, at=None):
    """(addr, length) of a new mapping (mmap(2) with prot and flags) of the
    file a /proc/self/maps entry names (path, dev as (major, minor),
    inode), opened read-only through its path (or, with at, the entry's
    (start, end), through /proc/self/map_files where it has no path: see
    MappedFile); span(stat) gives the file offset and length to map, or
    raises Unavailable. It is checked to be that file (MappedFile).
    Unavailable where the entry says the file was deleted or renamed over
    and it cannot be opened so, the path cannot be opened, span refuses,
    mmap fails, the path names another file, or /proc/self/maps cannot be
    read to check it; then nothing stays mapped. The caller unmaps addr."""
    opened = MappedFile(path, dev, ino, at)
    try:
        return opened.map(span, prot, flags)
    finally:
        opened.close()
