"""serialize, serialize_file, deserialize and TensorSpec: safetensors'
low-level functions, writing exactly the bytes upstream writes.

The layout upstream's ``serialize`` produces (safetensors/src/tensor.rs,
``prepare``), which this module follows:

- tensors sorted by dtype, in *descending* order of upstream's ``Dtype``
  enumeration (U64, I64, F64, C64, F32, U32, I32, BF16, F16, U16, I16,
  F8_E5M2FNUZ, F8_E4M3FNUZ, F8_E8M0, F8_E4M3, F8_E5M2, I8, U8, F6_E3M2,
  F6_E2M3, F4, BOOL), then by name (byte order), so every tensor is aligned
  to its element size;
- data_offsets assigned in that order, back to back from 0;
- the header: compact JSON (no spaces), ``"__metadata__"`` first when
  metadata is given (even an empty dict; left out for None), then each
  tensor as ``{"dtype":..,"shape":[..],"data_offsets":[begin,end]}``;
  strings escaped as serde_json escapes them (``"``, ``\\``, control
  characters; other characters as UTF-8), which is what ``json.dumps(...,
  ensure_ascii=False)`` does;
- the header padded with spaces to a multiple of 8 bytes; its length as a
  little-endian u64 first; then the data.

One difference: upstream keeps metadata in a Rust HashMap, so with two or
more entries its key order changes from run to run; here keys are sorted,
so the output is reproducible (and equal to upstream's whenever upstream's
is determined: none or one entry).

``serialize_file`` writes to a temporary file in the destination's
directory, flushes it to disk (fsync), renames it over the destination and
syncs the directory: a reader, or wcached serving the old file, never sees
a half-written or truncated file, and a failure leaves the old file alone.
What upstream's write in place keeps is kept too: a symlink stays a
symlink (the file it points at is replaced, as in a Hugging Face cache's
snapshots/ -> blobs/), and a file replaced keeps its mode and, where this
user may give it, its owner and group.
"""
import ctypes
import errno
import json
import operator
import os
import stat
import struct

from . import _lib
from ._lib import INVALID_MODEL_ERRNOS as _INVALID
from ._lib import (InvalidArgument, InvalidTensorSpec, SafetensorError, WcacheError, check,
                   wc_tensor)

__all__ = ["TensorSpec", "serialize", "serialize_file", "deserialize", "DTYPES", "ST_BITS"]

# Upstream's Dtype enumeration, in its order; the sort is descending.
_ORDER = ("BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
          "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64",
          "F64", "I64", "U64")
_RANK = {name: i for i, name in enumerate(_ORDER)}

# Bits per element of each safetensors dtype.
ST_BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8,
           "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16,
           "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64,
           "F64": 64, "I64": 64, "U64": 64}

# The dtype names serialize accepts (torch's and numpy's spellings).
DTYPES = {"bool": "BOOL", "int8": "I8", "uint8": "U8", "int16": "I16", "uint16": "U16",
          "int32": "I32", "uint32": "U32", "int64": "I64", "uint64": "U64",
          "float16": "F16", "float32": "F32", "float64": "F64", "bfloat16": "BF16",
          "float8_e4m3fn": "F8_E4M3", "float8_e4m3fnuz": "F8_E4M3FNUZ",
          "float8_e5m2": "F8_E5M2", "float8_e5m2fnuz": "F8_E5M2FNUZ",
          "float8_e8m0fnu": "F8_E8M0", "float4_e2m1fn_x2": "F4", "complex64": "C64"}

MAX_HEADER = 100_000_000  # upstream's MAX_HEADER_SIZE
_WRITE_CHUNK = 1 << 30     # os.write writes at most 2 GiB - 4 KiB at once
# What libwcache's parser reads of a file before its header length is known
# (client/base/file.h FILE_PROBE_LEN): deserialize writes at least that much.
_PARSER_PROBE = 64 << 10
# A WEIG file's first four bytes, either byte order (proto/FORMAT.md).
_WEIG_MAGICS = (b"GIEW", b"WEIG")


def _dtype(name):
    st = DTYPES.get(name)
    if st is None:
        raise InvalidArgument(f"Unknown dtype {name!r}. Supported dtypes: "
                              + ", ".join(DTYPES))
    return st


_U64 = 1 << 64  # upstream's TensorSpec fields are u64/usize


def _unsigned(value, what):
    """value as upstream's extraction to u64/usize takes it (pyo3 calls
    __index__: a float or a str is a TypeError), or OverflowError in
    CPython's words, naming the argument, for one outside [0, 2**64)."""
    n = operator.index(value)
    if n < 0:
        raise OverflowError(f"TensorSpec {what}: can't convert negative int to unsigned")
    if n >= _U64:
        raise OverflowError(f"TensorSpec {what}: int too big to convert")
    return n


class TensorSpec:
    """One tensor for :func:`serialize`: its dtype (a torch or numpy name,
    e.g. "float32"), its shape, and its bytes at data_ptr (data_len of
    them), which must stay valid while serialize runs. As upstream, a
    float4_e2m1fn_x2 shape is the storage shape (two values per byte) and
    is recorded with its last dimension doubled.

    As upstream's (a frozen pyclass of u64/usize fields): the attributes are
    read-only (assigning one raises AttributeError); each dimension,
    data_ptr and data_len is an integer in [0, 2**64) (OverflowError
    otherwise, at construction); ``dtype`` is the safetensors format code
    written in the header ("F32", "BF16"), not the name given."""
    __slots__ = ("_st", "_shape", "_data_ptr", "_data_len")

    def __init__(self, *, dtype, shape, data_ptr, data_len):
        dims = [_unsigned(x, "shape") for x in shape]
        ptr, size = _unsigned(data_ptr, "data_ptr"), _unsigned(data_len, "data_len")
        st = _dtype(dtype)
        dims = _storage_shape(st, dims)
        if st == "F4" and dims and dims[-1] >= _U64:  # upstream's checked_mul
            raise SafetensorError(f"F4 last-dim {dims[-1] // 2} doubled to logical shape "
                                  "overflows usize")
        for attr, value in (("_st", st), ("_shape", dims), ("_data_ptr", ptr),
                            ("_data_len", size)):
            object.__setattr__(self, attr, value)

    @property
    def dtype(self):
        """The safetensors format code ("F32", "BF16", "F8_E5M2FNUZ")."""
        return self._st

    @property
    def shape(self):
        """The shape recorded in the header (a new list each time)."""
        return list(self._shape)

    @property
    def data_ptr(self):
        return self._data_ptr

    @property
    def data_len(self):
        return self._data_len

    def __setattr__(self, name, value):
        raise AttributeError(f"TensorSpec is frozen: cannot set {name!r}")

    def __delattr__(self, name):
        raise AttributeError(f"TensorSpec is frozen: cannot delete {name!r}")

    # Frozen, so a copy is the same object (as a tuple's). Not picklable, as
    # upstream's (a pyclass without __reduce__): data_ptr is an address in
    # this process. Before, copying and unpickling failed on the frozen
    # __setattr__, naming an assignment the caller never made.
    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        raise TypeError("cannot pickle 'TensorSpec' object")

    def __repr__(self):
        return (f"TensorSpec(dtype={self._st!r}, shape={self._shape}, "
                f"data_ptr={self._data_ptr}, data_len={self._data_len})")


def _storage_shape(st, shape):
    """The shape recorded for a tensor of safetensors dtype st given the
    shape a caller passed: each dimension an integer (operator.index: int,
    a numpy integer, a torch.Size entry; a float or a str is a TypeError, as
    upstream's extraction to Vec<usize> refuses them), and for F4 the last
    dimension doubled (two values per byte), as upstream does for a
    TensorSpec and for the dict form alike."""
    shape = [operator.index(x) for x in shape]
    if st == "F4" and shape:
        shape[-1] *= 2
    return shape


# The longest tensor name every wcache reader takes (proto/bounds.h
# INDEX_MAX_NAME, in bytes of UTF-8).
_MAX_NAME = 4096


def _name_unreadable(name):
    """Why no wcache reader (safe_open, load, deserialize, wcached) could read
    a file holding tensor name, or None. Upstream writes and reads these;
    wcache refuses them when writing, rather than write a file it refuses."""
    if not name:
        return "an empty name, which wcache's readers refuse"
    if "\0" in name:
        return "name contains a NUL character, which wcache's readers refuse"
    n = len(name.encode("utf-8", "surrogatepass"))
    if n > _MAX_NAME:
        return f"name of {n} bytes is longer than {_MAX_NAME}, which wcache's readers refuse"
    return None


def _entry(name, value):
    """(safetensors dtype, shape, buffer) of one serialize input: a
    TensorSpec or upstream 0.7's {"dtype", "shape", "data"} dict."""
    if not isinstance(name, str):
        raise TypeError(f"tensor names are str, not {type(name).__name__}")
    if name == "__metadata__":
        # The header's metadata key: the file would hold no metadata, or two
        # entries of that name, and no reader could read it. The C writer
        # refuses it in these words (upstream writes such a file: its issue
        # #849).
        raise SafetensorError(f"Error while serializing: tensor {name!r} cannot be written "
                              "to safetensors (the name is reserved)")
    why = _name_unreadable(name)
    if why:
        raise SafetensorError(f"Error while serializing: tensor {name!r}: {why}")
    if isinstance(value, TensorSpec):
        data = (ctypes.c_char * value._data_len).from_address(value._data_ptr) \
            if value._data_len else b""
        st, shape = value._st, value.shape
    elif isinstance(value, dict):
        if not {"dtype", "shape", "data"} <= value.keys():
            raise InvalidTensorSpec(f"tensor {name!r}: a dict needs dtype, shape and data "
                                    f"(upstream 0.7's form), or pass a TensorSpec; got keys "
                                    f"{sorted(value)}")
        st = _dtype(value["dtype"])
        shape = _storage_shape(st, value["shape"])
        data = value["data"]
    else:
        raise TypeError(f"tensor {name!r}: expected a TensorSpec or a dict of dtype, shape "
                        f"and data, not {type(value).__name__}")
    n = 1
    for x in shape:
        if x < 0:
            raise SafetensorError(f"Error while serializing: tensor {name!r}: negative "
                                  f"dimension in shape {shape}")
        n *= x
    bits = n * ST_BITS[st]
    size = len(memoryview(data).cast("B")) if not isinstance(data, bytes) else len(data)
    if bits % 8 or bits // 8 != size:
        raise SafetensorError(
            f"Error while serializing: tensor {name!r}: {size} bytes, but dtype {st} and "
            f"shape {shape} need {bits / 8:g}")
    return st, shape, data


def _prepare(tensor_dict, metadata):
    """(header bytes including the length prefix, buffers in file order)."""
    if not isinstance(tensor_dict, dict):
        raise TypeError(f"expected a dict of tensors, not {type(tensor_dict).__name__}")
    entries = [(name,) + _entry(name, value) for name, value in tensor_dict.items()]
    entries.sort(key=lambda e: e[0])
    entries.sort(key=lambda e: _RANK[e[1]], reverse=True)  # stable: names stay sorted
    header = {}
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise TypeError("metadata must be a dict of str to str")
        for k, v in metadata.items():
            if "\0" in k or "\0" in v:
                raise SafetensorError(
                    f"Error while serializing: __metadata__ {k!r}: "
                    f"{'key' if chr(0) in k else 'value'} contains a NUL character, "
                    f"which wcache's readers refuse")
        header["__metadata__"] = dict(sorted(metadata.items()))
    offset = 0
    buffers = []
    for name, st, shape, data in entries:
        size = len(data) if isinstance(data, bytes) else memoryview(data).nbytes
        header[name] = {"dtype": st, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
        buffers.append(data)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    if len(text) > MAX_HEADER:
        raise SafetensorError(f"Error while serializing: HeaderTooLarge ({len(text)} bytes, "
                              f"the maximum is {MAX_HEADER})")
    return struct.pack("<Q", len(text)) + text, buffers


def serialize(tensor_dict, metadata=None):
    """The safetensors file of tensor_dict ({name: TensorSpec}, or
    {name: {"dtype", "shape", "data"}}) and metadata, as bytes."""
    header, buffers = _prepare(tensor_dict, metadata)
    return b"".join([header] + [bytes(b) if not isinstance(b, bytes) else b for b in buffers])


def _replaced(path):
    """The os.stat_result of what path names (a regular file's mode and
    owner go to the file replacing it), or None: nothing there yet (the new
    file gets 0666 minus the umask, as open(O_CREAT) gives it). A directory
    is IsADirectoryError."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(st.st_mode):  # before the write, not at the rename after it
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    return st


def _write_all(f, chunks):
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        while view.nbytes:
            view = view[f.write(view):]


def _write_into(name, chunks):
    """Writes chunks into name, which stat() found to be neither a regular
    file nor a directory (a FIFO, a device), as client/lib/outfile.c does:
    opened without O_CREAT or O_TRUNC and with O_NOCTTY (a terminal never
    becomes this process's controlling one), then checked to be still no
    regular file, so that a file put there since the stat() is neither
    truncated nor written in place (ESTALE)."""
    fd = os.open(name, os.O_WRONLY | os.O_CLOEXEC | os.O_NOCTTY)
    with os.fdopen(fd, "wb", buffering=0) as f:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
            raise OSError(errno.ESTALE, f"{name}: changed while it was opened")
        _write_all(f, chunks)


def _take_over(fd, old):
    """Gives the temporary file fd the owner, group and mode of the file it
    replaces (the owner only where this user may: EPERM is no error, and
    then the group alone, which a member of it may give). Only the
    permission bits are kept: a write in place clears set-id bits too.
    outfile.c in libwcache does the same for wcachectl convert."""
    st = os.fstat(fd)
    if (st.st_uid, st.st_gid) != (old.st_uid, old.st_gid):
        try:
            os.fchown(fd, old.st_uid, old.st_gid)
        except PermissionError:
            if st.st_gid != old.st_gid:
                try:
                    os.fchown(fd, -1, old.st_gid)
                except PermissionError:
                    pass
    os.fchmod(fd, stat.S_IMODE(old.st_mode) & 0o777)


def write_atomically(filename, chunks):
    """Writes the byte chunks to filename through a temporary file in the
    same directory: written, fsync'ed, renamed over filename, directory
    synced. A symlink is followed (os.path.realpath): the file it points at
    is replaced and the link stays. A replaced file's mode (and owner, where
    this user may give it) is kept; a new file gets 0666 minus the umask.
    What is not a file (/dev/null, a FIFO, a terminal) is written to, as
    upstream writes: renaming a file over it would replace the device node
    (as root) or fail (a directory this user may not write)."""
    name = os.fsdecode(os.fspath(filename))
    old = _replaced(name)  # through /dev/stdout's /proc link too, which realpath cannot
    if old is not None and not stat.S_ISREG(old.st_mode):
        _write_into(name, chunks)
        return
    target = os.path.realpath(name)
    directory = os.path.dirname(target)
    base = os.path.basename(target)
    old = _replaced(target)
    for attempt in range(100):
        tmp = os.path.join(directory, f".{base}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(errno.EEXIST, f"{directory}: cannot create a temporary file")
    try:
        with os.fdopen(fd, "wb", buffering=0) as f:
            if old is not None:
                _take_over(f.fileno(), old)
            _write_all(f, chunks)
            os.fsync(f.fileno())
        os.rename(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def serialize_file(tensor_dict, filename, metadata=None):
    """Writes what :func:`serialize` returns to filename, atomically (see
    the module comment). Returns None."""
    header, buffers = _prepare(tensor_dict, metadata)
    try:
        write_atomically(filename, [header] + [b for b in buffers
                                               if len(memoryview(b).cast("B"))])
    except OSError as e:
        # Upstream: any I/O error is a SafetensorError ("I/O error: " and
        # Rust's io::Error); here also naming the file, not the temporary.
        why = f"{e.strerror} (os error {e.errno})" if e.errno else str(e)
        raise SafetensorError(e.errno or 0, f"Error while serializing: I/O error: "
                              f"{os.fspath(filename)}: {why}") from e


def deserialize(data):
    """[(name, {"shape": [...], "dtype": "F32", "data": bytearray}), ...] of
    a safetensors file's bytes, in file order (zero-byte tensors at one
    offset by name); SafetensorError when they are not a valid safetensors
    file.

    The header is parsed and checked by libwcache's parser, the fuzzed one
    every file goes through (wc_open_fd), so safetensors bytes and a file
    holding them are accepted and refused alike, with the same messages. It
    reads a private memfd as long as the bytes that holds a copy of their
    header (or, when they are not safetensors, of what the parser reads to
    say what they are) and holes for the rest: a safetensors parser never
    reads tensor data, and copying it twice would halve the speed. Each
    tensor's bytes are then copied from data at the offsets the parser
    checked; a buffer another process shares can change only the tensor
    bytes, never what was parsed."""
    view = memoryview(data).cast("B")
    n = struct.unpack("<Q", view[:8])[0] if view.nbytes >= 8 else 0
    head = min(view.nbytes, max(_PARSER_PROBE, 8 + n if n <= MAX_HEADER else 0))
    lib = _lib.lib()
    model = ctypes.c_void_p()
    try:
        fd = os.memfd_create("wcache-deserialize", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, view.nbytes)
            done = 0
            while done < head:
                done += os.write(fd, view[done:min(head, done + _WRITE_CHUNK)])
            # The parser reads the copy: what it says is about these bytes.
            copied = os.pread(fd, 8, 0)
            if copied[:4] in _WEIG_MAGICS:
                raise SafetensorError(errno.EINVAL, "Error while deserializing: bytes: is a "
                                      "WEIG file, not safetensors (wcache.open_file opens "
                                      "WEIG files)")
            check(lib.wc_open_fd(fd, b"bytes", ctypes.byref(model)))
        finally:
            os.close(fd)
        count = lib.wc_model_count(model)
        records = (wc_tensor * count)()
        check(lib.wc_model_tensors(model, 0, records, count))
        infos = sorted((t.data or 0, t.nbytes, t.name.decode("utf-8", "surrogateescape"),
                        t.dtype.decode("ascii"), list(t.shape[:t.ndim])) for t in records)
    except SafetensorError:
        raise
    except WcacheError as e:
        if e.errno in _INVALID:
            raise SafetensorError(e.errno, f"Error while deserializing: {e.strerror}") \
                from None
        raise
    finally:
        lib.wc_release(model)
    # The tensors tile the data from offset 0 (the parser checked), so the
    # lowest address of a tensor with bytes is the data's start, 8 + the
    # header length (of the copy the parser read) into the bytes. Sorted by
    # address, then size, then name: file order.
    base = min((data for data, nbytes, *_ in infos if nbytes), default=0)
    start = 8 + struct.unpack("<Q", copied)[0]
    return [(name, {"shape": shape, "dtype": dtype,
                    "data": bytearray(view[start + data - base:start + data - base + nbytes])})
            for data, nbytes, name, dtype, shape in infos]
