"""python3 -m wcache.convert MODEL.pt MODEL.safetensors

Converts a PyTorch checkpoint to safetensors, the format wcache maps.

What it accepts (loaded with ``torch.load(..., map_location="cpu",
weights_only=True)``, which unpickles tensors and plain containers only):

- a state dict: a mapping of names to tensors;
- a training checkpoint holding one under "state_dict", "model" or
  "module" (the other entries, epoch counters and optimizer state, are
  listed on stderr and left out);
- nested mappings of tensors, flattened with "." ("encoder" -> {"w": t}
  becomes "encoder.w"); two entries that flatten to one name ("a.b" next
  to "a" -> {"b": t}) are refused, since the output could keep only one;
- a pickled ``nn.Module`` (``torch.save(model)``): its ``state_dict()``.
  Unpickling a module runs code named in the file, which
  ``weights_only=True`` refuses; pass ``--trust-pickle`` to load it anyway,
  only for files you trust.

``weights_only=True`` is a sandbox only on torch 2.6 or later: before it,
a crafted checkpoint runs code through it (CVE-2025-32434,
GHSA-53q9-r3pm-6pq6, fixed in 2.6.0), and torch before 2.10 has memory
corruption in that unpickler (CVE-2026-24747). On such a torch every
conversion is refused unless ``--trust-pickle`` (``trust_pickle=True``) is
given, and the command then says on stderr what that trusts; convert
checkpoints you did not make in a throwaway container, or with torch 2.10
or later.

Tensors are written contiguous, little-endian, in the order safetensors
writes them (largest element size first, then name, so every tensor's data
is aligned to its element size), with the header padded to 8 bytes.

Shared storage: tensors that share memory (tied embeddings, views of one
buffer) are each written as their own copy, so every name of the state
dict loads as an independent tensor, as ``safetensors.torch.save_file``
would load them. (safetensors' ``save_file`` refuses such dicts and
``save_model`` drops the aliases instead; duplicating is the choice that
keeps every name.) The aliases are listed on stderr.

The output is written to a temporary file in the same directory, flushed
to disk, and renamed over the destination, so a reader never sees half a
file and a failure leaves nothing behind; an output that exists and is not
a regular file (a FIFO, /dev/stdout, /dev/null) is written into instead,
as a shell redirection would. An output that is the input (the same path,
a symlink to it or a hard link of it) is refused, as ``wcachectl convert``
refuses it: the rename would replace the checkpoint by the part of it that
was converted. SIGINT, SIGTERM, SIGHUP and SIGQUIT (those not ignored)
remove the temporary file before the command ends by the same signal, as
``wcachectl convert`` does.
"""
import argparse
import os
import signal
import stat
import struct
import sys
import tarfile
import threading
import zipfile

from ._dtypes import TORCH_TO_ST

__all__ = ["convert", "collect_tensors", "write_safetensors", "main"]

_CHECKPOINT_KEYS = ("state_dict", "model", "module")


class ConvertError(Exception):
    """A checkpoint this converter cannot turn into safetensors."""


def _is_tensor(torch, x):
    return isinstance(x, torch.Tensor)


def _flatten(torch, obj, prefix, out, skipped):
    for key, value in obj.items():
        if not isinstance(key, str):
            raise ConvertError(f"key {key!r} under {prefix or 'the top level'!r} is not a "
                               "string; safetensors names are strings")
        name = f"{prefix}.{key}" if prefix else key
        if _is_tensor(torch, value):
            if name in out:
                raise ConvertError(f"two tensors are named {name!r} once nested names are "
                                   "joined with '.' (a key with a '.' and a nested mapping); "
                                   "safetensors names are unique, so one would be lost")
            out[name] = value
        elif isinstance(value, torch.nn.Module):
            _flatten(torch, value.state_dict(), name, out, skipped)
        elif isinstance(value, dict):
            _flatten(torch, value, name, out, skipped)
        else:
            skipped.append(name)


def collect_tensors(obj):
    """The {name: tensor} a loaded checkpoint holds, and the names of
    entries left out (not tensors). Raises ConvertError when there is none."""
    import torch
    if isinstance(obj, torch.nn.Module):
        obj = obj.state_dict()
    if not isinstance(obj, dict):
        raise ConvertError(f"the checkpoint holds a {type(obj).__name__}, not a state dict "
                           "or a module")
    for key in _CHECKPOINT_KEYS:
        inner = obj.get(key)
        if isinstance(inner, torch.nn.Module):
            inner = inner.state_dict()
        if isinstance(inner, dict) and inner and any(
                _is_tensor(torch, v) for v in inner.values()) and not any(
                _is_tensor(torch, v) for v in obj.values()):
            skipped = [k for k in obj if k != key]
            out = {}
            _flatten(torch, inner, "", out, [])
            return out, skipped
    out, skipped = {}, []
    _flatten(torch, obj, "", out, skipped)
    if not out:
        raise ConvertError("the checkpoint holds no tensors")
    return out, skipped


def _storage_key(t):
    try:
        storage = t.untyped_storage()
    except AttributeError:  # torch < 2
        storage = t.storage()
    return storage.data_ptr(), storage.nbytes() if hasattr(storage, "nbytes") else None


def shared_groups(tensors):
    """Lists of names whose tensors share storage (each list has 2+ names)."""
    groups = {}
    for name, t in tensors.items():
        if t.numel() == 0:
            continue
        groups.setdefault(_storage_key(t)[0], []).append(name)
    return [sorted(g) for g in groups.values() if len(g) > 1]


def write_safetensors(tensors, out_path, metadata=None):
    """Writes {name: tensor} to out_path as safetensors, byte for byte as
    safetensors' save_file would (wcache.torch.save_file: upstream's order
    and padding, through a temporary file renamed into place). Tensors that
    share storage are each written as their own copy. Returns the size of
    the data in bytes."""
    import torch

    from . import torch as wtorch
    shared = {name for group in shared_groups(tensors) for name in group}
    out = {}
    for name, t in tensors.items():
        if name == "__metadata__":  # the header's metadata key: no reader could read it
            raise ConvertError(f"tensor {name!r} cannot be written to safetensors (the name "
                               "is reserved)")
        if TORCH_TO_ST.get(str(t.dtype)) is None:
            raise ConvertError(f"tensor {name!r}: safetensors has no type for {t.dtype}")
        if t.is_sparse or getattr(t, "is_quantized", False):
            raise ConvertError(f"tensor {name!r}: sparse and quantized tensors are not "
                               "supported; convert them to dense first")
        t = t.detach().to("cpu").contiguous()
        out[name] = t.clone() if name in shared else t
    meta = {str(k): str(v) for k, v in metadata.items()} if metadata else None
    wtorch.save_file(out, out_path, metadata=meta)
    return sum(t.numel() * t.element_size() for t in out.values() if isinstance(t, torch.Tensor))


def _last_line(e):
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    return lines[-1] if lines else repr(e)


def _is_safetensors(head, size):
    """Whether a file of size bytes that starts with head starts as a
    safetensors file does (a plausible header length, then a JSON object):
    torch's unpickler would call it pickled objects to trust."""
    if len(head) < 9:
        return False
    n = struct.unpack("<Q", head[:8])[0]
    # JSON whitespace may lead the header (upstream and the C reader accept
    # it: client/format/diagnose.c), within the n bytes the length names.
    text = head[8:8 + min(n, 4096)].lstrip(b" \t\r\n")
    return text[:1] == b"{" and 2 <= n <= size - 8


# What torch.save writes first in its legacy format (before torch 1.6): the
# magic number 0x1950a86a20f9469cfc6c pickled, with protocol 2 (the default)
# or, given pickle_protocol=0 or 1, as a LONG in decimal.
_LEGACY_TEXT_MAGIC = b"L119547037146038801333356L"

_FILE_TYPES = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _describe(head, size):
    """What a file that is not a PyTorch checkpoint is, as far as its first
    bytes tell, for the message that refuses it."""
    if size == 0:
        return "the file is empty"
    if head.startswith(b"PK\x03\x04"):
        return "a zip archive without torch.save's data.pkl (or cut short)"
    if head.startswith(b"version https://git-lfs"):
        return "a Git LFS pointer (run `git lfs pull` to fetch the file)"
    for magic, what in ((b"GGUF", "a GGUF file (llama.cpp)"), (b"\x93NUMPY", "a NumPy .npy array"),
                        (b"\x89HDF\r\n\x1a\n", "an HDF5 file"),
                        (b"GIEW", "a WEIG file"), (b"WEIG", "a WEIG file")):
        if head.startswith(magic):
            return what
    sample = head[:64]
    if all(32 <= b < 127 or b in b"\t\r\n" for b in sample):
        return f"a text file (it starts {sample[:24].decode()!r})"
    return f"it starts with bytes {sample[:8].hex(' ')}, neither a zip archive nor a pickle"


def _check_source(src):
    """Raises ConvertError unless src is a regular file that may be a
    PyTorch checkpoint: torch.save's zip archive (torch 1.6 and later, with
    a data.pkl), a pickle (the legacy format, or pickled tensors) or the
    legacy tar format. Checked before the torch version, so that a typo or
    a file of another format is named as such rather than refused as a
    pickle to trust."""
    try:
        st = os.stat(src)
    except OSError as e:
        raise ConvertError(f"{src}: {e.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ConvertError(f"{src}: is a directory, not a checkpoint file")
    if not stat.S_ISREG(st.st_mode):
        what = next((w for test, w in _FILE_TYPES if test(st.st_mode)), "not a regular file")
        raise ConvertError(f"{src}: is {what}, not a checkpoint file (a regular file)")
    try:
        with open(src, "rb") as f:
            head = f.read(8 + 4096)
            size = os.fstat(f.fileno()).st_size
    except OSError as e:
        raise ConvertError(f"{src}: {e.strerror}") from None
    if _is_safetensors(head, size):
        raise ConvertError(f"{src}: not a PyTorch checkpoint: it is a safetensors file "
                           f"already (nothing to convert)")
    if (len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5
            or head.startswith(_LEGACY_TEXT_MAGIC)):
        return  # a pickle: torch.load says whether it holds a state dict
    if head.startswith(b"PK\x03\x04"):
        try:
            with zipfile.ZipFile(src) as z:
                if any(n.endswith(".pkl") for n in z.namelist()):
                    return
        except (zipfile.BadZipFile, OSError):
            pass
    elif tarfile.is_tarfile(src):
        return
    raise ConvertError(f"{src}: not a PyTorch checkpoint: {_describe(head, size)}")


def _refuse_same_file(src, dst):
    """Raises ConvertError when dst names the file src names (the same
    path, a symlink to it, a hard link of it), as wcachectl convert's
    refuse_same_file() does: writing dst would replace the checkpoint."""
    try:
        out = os.stat(dst)
    except OSError:
        return  # dst does not exist yet (or cannot be seen): not src
    try:
        inp = os.stat(src)
    except OSError:
        return  # torch.load names the problem
    if (inp.st_dev, inp.st_ino) == (out.st_dev, out.st_ino):
        raise ConvertError(f"{dst}: the output is the input {src}: write the conversion "
                           "to another path")


# The first torch whose weights_only=True unpickler runs no code from a
# crafted file (CVE-2025-32434, fixed in 2.6.0; the docs also name 2.10,
# the first without CVE-2026-24747's memory corruption there).
_SAFE_WEIGHTS_ONLY = (2, 6)


def _torch_version(version):
    """(major, minor) of a torch.__version__ ("1.13.0a0", "2.6.0+cu124");
    (0, 0) when it cannot be read (treated as old)."""
    parts = str(version).split("+")[0].split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        return (0, 0)


def weights_only_unsafe(torch):
    """A one-line warning when torch's weights_only=True is no sandbox (torch
    before 2.6), else None."""
    if _torch_version(torch.__version__) >= _SAFE_WEIGHTS_ONLY:
        return None
    return (f"torch {torch.__version__}: torch.load(weights_only=True) runs code from a "
            f"crafted checkpoint before torch 2.6 (CVE-2025-32434): convert only files you "
            f"trust, or use torch 2.10 or later")


def convert(src, dst, trust_pickle=False, log=None):
    """Converts the checkpoint src to the safetensors file dst. Returns the
    tensor dict that was written. log(msg) receives notes (skipped entries,
    shared storage, what trust_pickle trusts on torch before 2.6). A src
    that is missing, not a regular file or not a checkpoint at all raises
    ConvertError before the torch version is looked at."""
    import pickle
    import torch
    log = log or (lambda msg: None)
    _check_source(src)
    _refuse_same_file(src, dst)
    unsafe = weights_only_unsafe(torch)
    if unsafe is not None and not trust_pickle:
        raise ConvertError(f"{src}: refused: {unsafe}; pass --trust-pickle (trust_pickle=True) "
                           f"to convert it anyway")
    if unsafe is not None:
        log(unsafe)  # what --trust-pickle trusts
    try:
        try:
            obj = torch.load(src, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            if not trust_pickle:
                raise ConvertError(
                    f"{src}: torch.load(weights_only=True) refused it: it holds pickled "
                    f"objects that torch's restricted unpickler does not allow (a whole "
                    f"nn.Module, for instance; torch 1.13 also refuses plain floats). If you "
                    f"trust this file, pass --trust-pickle to unpickle it (that runs code named "
                    f"in the file). torch said: {_last_line(e)}") from None
            obj = torch.load(src, map_location="cpu", weights_only=False)
    except (ConvertError, OSError):
        raise
    except Exception as e:
        # Not a checkpoint at all (text, a truncated file, safetensors): torch's
        # unpickler fails with whatever it met first (KeyError, EOFError, ...).
        raise ConvertError(f"{src}: not a PyTorch checkpoint torch.load can read "
                           f"({type(e).__name__}: {_last_line(e)})") from None
    tensors, skipped = collect_tensors(obj)
    if skipped:
        log(f"left out {len(skipped)} entries that are not tensors: "
            + ", ".join(sorted(skipped)[:20]) + (" ..." if len(skipped) > 20 else ""))
    for group in shared_groups(tensors):
        log("shared storage, written as separate copies: " + ", ".join(group))
    write_safetensors(tensors, dst, metadata={"format": "pt"})
    return tensors


# The signals that end a conversion; main() turns each into _Interrupted so
# that the temporary file is removed (write_atomically unlinks it on any
# exception), then ends the process by the same signal.
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class _Interrupted(BaseException):
    """A signal of _SIGNALS arrived (a BaseException, as KeyboardInterrupt
    is, so that no except Exception swallows it)."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


def _on_signal(signum, frame):
    raise _Interrupted(signum)


def _catch_signals():
    """Installs _on_signal for the signals of _SIGNALS not ignored (nohup's
    SIGHUP stays ignored) and returns the handlers to restore; none in a
    thread other than the main one, where Python cannot install them."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    old = {}
    for sig in _SIGNALS:
        handler = signal.getsignal(sig)
        if handler != signal.SIG_IGN:
            old[sig] = signal.signal(sig, _on_signal)
    return old


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python3 -m wcache.convert",
        description="Convert a PyTorch checkpoint (.pt, .bin) to safetensors.")
    ap.add_argument("src", help="checkpoint written by torch.save")
    ap.add_argument("dst", help="safetensors file to write (replaced atomically)")
    ap.add_argument("--trust-pickle", action="store_true",
                    help="unpickle objects other than tensors (whole modules), and convert "
                         "at all on torch before 2.6; runs code from the file")
    args = ap.parse_args(argv)

    def log(msg):
        print(f"wcache.convert: {args.src}: {msg}", file=sys.stderr)

    try:
        import torch
    except ImportError as e:
        print(f"wcache.convert: {args.src}: needs torch: {e}", file=sys.stderr)
        return 1
    old = _catch_signals()
    try:
        tensors = convert(args.src, args.dst, trust_pickle=args.trust_pickle, log=log)
    except ConvertError as e:
        print(f"wcache.convert: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # one line naming the file, not "[Errno 2] ..."
        print(f"wcache.convert: {e.filename or args.src}: {e.strerror or e}", file=sys.stderr)
        return 1
    except _Interrupted as e:
        # The temporary file is gone; end as the signal's default action
        # would, so the caller sees the signal in the exit status.
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(e.signum, signal.SIG_DFL)
        signal.raise_signal(e.signum)
        return 128 + e.signum  # the default action of each of _SIGNALS ends the process
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    print(f"{args.dst}: {len(tensors)} tensors, {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
