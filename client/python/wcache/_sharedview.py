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
engine's views of one file in one copy share one MappedFile (OpenFile), so
the file is opened and checked once per copy, not once per view. /proc/self/maps and
fstat(2) can name one file differently: overlayfs before Linux 6.8 shows
the underlying (upper or lower) inode in maps and the overlay's st_dev in
stat (a container's /tmp), btrfs the superblock's device in maps and the
subvolume's in stat. Where fstat disagrees, the new mapping's own line in
/proc/self/maps decides: the kernel names both mappings the same way, and
the same (device, inode) there is the same file. Where that cannot be
done (the worker may not open the path: a file only the daemon can read; it
was renamed over; the range is not one file's), :class:`Unavailable` says
why, and the engine stages through pinned buffers instead, which keeps the
page cache shared too.
"""
import bisect
import ctypes
import mmap
import os

__all__ = ["Unavailable", "NotMapped", "SharedView", "shared_view", "file_mappings",
           "map_mapped_file", "mapped_identity", "MappedFile", "OpenFile"]

_PROT_READ = 0x1
_MAP_SHARED = 0x01

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


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
    Unavailable when no view can be made. opened, an OpenFile, keeps the
    file open and checked for the caller's next view of it."""
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
        addr, _ = map_mapped_file(path, dev, ino, span, _PROT_READ, _MAP_SHARED)
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


class MappedFile:
    """The file a /proc/self/maps entry names (path, dev as (major, minor),
    inode), opened read-only through its path, to be mapped again by map().
    Unavailable where the entry says the file was deleted or renamed over,
    or the path cannot be opened.

    Whether it is that file is checked once: by fstat at the first map(), or
    where fstat names it by another device or inode (overlayfs before Linux
    6.8, btrfs: see the module comment), by the first mapping's own line in
    /proc/self/maps. Every later mapping is made through the same
    descriptor, so it maps the same file and needs no check: a caller that
    maps many ranges of one file reads maps once, not once per range.
    close() closes the descriptor (idempotent); mappings made stay."""

    def __init__(self, path, dev, ino):
        self.name = os.fsdecode(path)
        self.dev, self.ino = dev, ino
        if path.endswith(b" (deleted)"):
            raise Unavailable(f"{self.name}: the mapped file was deleted or renamed over")
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
        except OSError as e:
            raise Unavailable(f"cannot open {self.name}: {e.strerror}") from None
        self.checked = None  # by the first fstat, else by a mapping's line in maps

    def map(self, span, prot, flags):
        """(addr, length) of a new mapping (mmap(2) with prot and flags) of
        the file; span(stat) gives the file offset and length to map, or
        raises Unavailable. Unavailable where span refuses, mmap fails, the
        file is not the one the entry names, or /proc/self/maps cannot be
        read to check it; then nothing stays mapped. The caller unmaps addr."""
        if self.fd is None:
            raise Unavailable(f"{self.name}: closed")
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
                raise Unavailable(f"{self.name} is no longer the mapped file (renamed over)")
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


class OpenFile:
    """The MappedFile of the last file mapping a caller's shared views were
    made of (one at a time: a copy's ranges come in address order, so one
    mapping's ranges follow each other), so that the file is opened and
    checked once per mapping and copy, not once per view. Keyed by the
    whole /proc/self/maps entry, the mapping itself: two mappings that maps
    names alike (btrfs subvolumes' files with one inode number, at one path
    through a bind mount) are each checked. Held by the caller for one copy,
    while the mappings its ranges lie in cannot change. close() closes it
    (idempotent)."""

    def __init__(self):
        self.entry = self.opened = None

    def file(self, entry):
        """The MappedFile of entry, a file_mappings() entry: the one held,
        or opened now; Unavailable as MappedFile."""
        if self.entry != entry:
            self.close()
            _start, _end, _offset, dev, ino, path, _shared = entry
            self.opened = MappedFile(path, dev, ino)
            self.entry = entry
        return self.opened

    def close(self):
        opened, self.opened, self.entry = self.opened, None, None
        if opened is not None:
            opened.close()


def map_mapped_file(path, dev, ino, span, prot, flags):
    """(addr, length) of a new mapping (mmap(2) with prot and flags) of the
    file a /proc/self/maps entry names (path, dev as (major, minor),
    inode), opened read-only through its path; span(stat) gives the file
    offset and length to map, or raises Unavailable. It is checked to be
    that file (MappedFile). Unavailable where the entry says the file was
    deleted or renamed over, the path cannot be opened, span refuses, mmap
    fails, the path names another file, or /proc/self/maps cannot be read
    to check it; then nothing stays mapped. The caller unmaps addr."""
    opened = MappedFile(path, dev, ino)
    try:
        return opened.map(span, prot, flags)
    finally:
        opened.close()
