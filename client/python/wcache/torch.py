"""wcache.torch: ``safetensors.torch`` over wcache, same functions, arguments,
return values and errors.

    from wcache.torch import load_file, save_file   # was: safetensors.torch
    state = load_file("/models/llama/model.safetensors")

- ``load_file(filename, device="cpu", *, backend="mmap")``: through wcached
  when it serves the file (zero-copy, shared with every worker), else the
  file mapped in this process; tensors are copy-on-write views (see
  wcache/_torch.py).
- ``load(data)``: from bytes (copies, as upstream).
- ``save_file(tensors, filename, metadata=None)`` and ``save(tensors,
  metadata=None)``: byte for byte what upstream writes (see
  wcache/_serialize.py); ``save_file`` replaces the file atomically.
- ``save_model(model, filename, metadata=None, force_contiguous=True)`` and
  ``load_model(model, filename, strict=True, device="cpu", *,
  backend="mmap")``: upstream's rules for tensors that share memory (one
  name of each group of shared tensors is kept, the others recorded in the
  metadata as name -> kept name) and its (missing, unexpected) report.
"""
import os
import sys
from collections import defaultdict

import torch

from . import _torch
from ._dtypes import torch_dtype
from ._lib import SafetensorError
from ._safe_open import safe_open
from ._serialize import TensorSpec, deserialize, serialize, serialize_file

__all__ = ["load_file", "load", "save_file", "save", "save_model", "load_model", "storage_ptr",
           "storage_size"]


def _untyped(tensor):
    return tensor.untyped_storage() if hasattr(tensor, "untyped_storage") else tensor.storage()


def storage_ptr(tensor):
    """The address of tensor's storage (0 when it has none: meta tensors)."""
    try:
        return _untyped(tensor).data_ptr()
    except (NotImplementedError, RuntimeError):
        return 0


def storage_size(tensor):
    """The size in bytes of tensor's storage (for meta tensors, of the
    tensor)."""
    try:
        return _untyped(tensor).nbytes()
    except (NotImplementedError, RuntimeError):
        return tensor.nelement() * tensor.element_size()


def _end_ptr(tensor):
    """One past the last byte of tensor's data (its last element, whatever
    its strides)."""
    if not tensor.nelement():
        return tensor.data_ptr()
    last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    return tensor.data_ptr() + (last + 1) * tensor.element_size()


def _find_shared_tensors(state_dict):
    """Sets of names whose tensors overlap in memory (upstream's
    _find_shared_tensors: grouped by device and storage, then split where
    the tensors' byte ranges do not overlap)."""
    by_storage = defaultdict(set)
    for name, t in state_dict.items():
        ptr, size = storage_ptr(t), storage_size(t)
        if t.device.type != "meta" and ptr and size:
            by_storage[(t.device, ptr, size)].add(name)
    groups = []
    for shared in sorted(by_storage.values()):
        if len(shared) < 2:
            groups.append(shared)
            continue
        areas = sorted((state_dict[n].data_ptr(), _end_ptr(state_dict[n]), n) for n in shared)
        _, last_stop, first = areas[0]
        groups.append({first})
        for start, stop, name in areas[1:]:
            if start >= last_stop:
                groups.append({name})
            else:
                groups[-1].add(name)
            last_stop = stop
    return groups


def _is_complete(tensor, span=None):
    """Whether tensor covers its whole storage, or is one of the tensors
    wcache made as views of one storage per part of a model's mapping
    (wcache/_table.py): upstream gives each of those a storage of its own,
    so a model holding them saves and loads as it would with upstream's.
    span: the (start, end) byte range of the tensors overlapping tensor (its
    group in _find_shared_tensors); in a part storage only a tensor that
    covers all of it counts, as only the whole tensor covers upstream's own
    storage: a caller's partial view of one (a Parameter made from w[:2])
    is never kept in place of w itself."""
    ptr, size = storage_ptr(tensor), storage_size(tensor)
    nbytes = tensor.nelement() * tensor.element_size()
    if tensor.data_ptr() == ptr and nbytes == size:
        return True
    if not _torch.is_part_view(ptr, size):
        return False
    if span is None:
        return True
    return (tensor.data_ptr(), tensor.data_ptr() + nbytes) == span


def _remove_duplicate_names(state_dict, *, preferred_names=None, discard_names=None):
    """{kept name: [names to drop]} for every group of shared tensors, as
    upstream's _remove_duplicate_names chooses them."""
    preferred_names = set(preferred_names or ())
    discard_names = set(discard_names or ())
    to_remove = defaultdict(list)
    for shared in _find_shared_tensors(state_dict):
        span = (min(state_dict[n].data_ptr() for n in shared),
                max(_end_ptr(state_dict[n]) for n in shared))
        complete = {n for n in shared if _is_complete(state_dict[n], span)}
        if not complete:
            raise RuntimeError(
                "Error while trying to find names to remove to save state dict, but found no "
                f"suitable name to keep for saving amongst: {shared}. None is covering the "
                "entire storage. Refusing to save/load the model since you could be storing "
                "much more memory than needed.")
        keep = sorted(complete)[0]
        preferred = complete - discard_names
        if preferred:
            keep = sorted(preferred)[0]
        if preferred_names and preferred_names & complete:
            keep = sorted(preferred_names & complete)[0]
        for name in sorted(shared):
            if name != keep:
                to_remove[keep].append(name)
    return to_remove


def _specs(tensors, keep):
    """{name: TensorSpec} of a dict of tensors, checked as upstream checks
    it (ValueError for what is not a dense tensor or not contiguous,
    RuntimeError for tensors that share memory)."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    sparse = []
    for k, v in tensors.items():
        if not isinstance(v, torch.Tensor):
            raise ValueError(f"Key `{k}` is invalid, expected torch.Tensor but received "
                             f"{type(v)}")
        if v.layout != torch.strided:
            sparse.append(k)
    if sparse:
        raise ValueError(f"You are trying to save a sparse tensors: `{sparse}` which this "
                         "library does not support. You can make it a dense tensor before "
                         "saving with `.to_dense()` but be aware this might make a much larger "
                         "file than needed.")
    failing = [names for names in _find_shared_tensors(tensors) if len(names) > 1]
    if failing:
        raise RuntimeError(
            f"Some tensors share memory, this will lead to duplicate memory on disk and "
            f"potential differences when loading them again: {failing}. A potential way to "
            f"correctly save your model is to use `save_model`.")
    specs = {}
    for k, v in tensors.items():
        if not v.is_contiguous():
            raise ValueError(
                f"You are trying to save a non contiguous tensor: `{k}` which is not allowed. "
                "Call `.contiguous()` on your tensor to pack it before saving.")
        if v.device.type != "cpu":
            v = v.to("cpu")
        dtype = str(v.dtype).split(".")[-1]
        if v.nelement() == 0:
            data = b""
        else:
            data = v.reshape(-1).view(torch.uint8).numpy()
            if sys.byteorder == "big" and v.element_size() > 1:
                data = v.reshape(-1).numpy().byteswap().view("u1")
        keep.append((v, data))
        ptr = data.ctypes.data if len(data) else 0
        specs[k] = TensorSpec(dtype=dtype, shape=list(v.shape), data_ptr=ptr,
                              data_len=len(data))
    return specs


def save(tensors, metadata=None):
    """The safetensors bytes of {name: tensor} (and metadata)."""
    keep = []
    return serialize(_specs(tensors, keep), metadata=metadata)


def save_file(tensors, filename, metadata=None):
    """Writes {name: tensor} (and metadata) to filename, atomically."""
    keep = []
    serialize_file(_specs(tensors, keep), filename, metadata=metadata)


def load_file(filename, device="cpu", *, backend="mmap"):
    """{name: tensor} of a safetensors file, in file order (views of the
    mapping on the CPU, through wcached when it serves the file)."""
    with safe_open(filename, framework="pt", device=device, backend=backend) as f:
        return f.get_tensors()


def load(data):
    """{name: tensor} of the safetensors bytes data (copies, on the CPU).
    A dtype maps to a torch type as for Model.torch (wcache/_dtypes.py):
    whatever this torch has, F8_E8M0 (float8_e8m0fnu, torch 2.7) included."""
    result = {}
    for name, v in deserialize(data):
        dtype = torch_dtype(torch, v["dtype"])
        if dtype is None:
            raise SafetensorError(f"tensor {name!r}: torch {torch.__version__} has no type "
                                  f"for {v['dtype']}")
        if not v["data"]:
            result[name] = torch.empty(v["shape"], dtype=dtype)
            continue
        t = torch.frombuffer(v["data"], dtype=dtype).reshape(v["shape"])
        if sys.byteorder == "big":
            t = torch.from_numpy(t.numpy().byteswap(inplace=False))
        result[name] = t
    return result


def save_model(model, filename, metadata=None, force_contiguous=True):
    """Saves model's state dict to filename, dropping the duplicate names of
    shared tensors (recorded in the metadata as dropped -> kept)."""
    state_dict = model.state_dict()
    for kept, dropped in _remove_duplicate_names(state_dict).items():
        for name in dropped:
            if metadata is None:
                metadata = {}
            if name not in metadata:
                metadata[name] = kept
            del state_dict[name]
    if force_contiguous:
        state_dict = {k: v.contiguous() for k, v in state_dict.items()}
    try:
        save_file(state_dict, filename, metadata=metadata)
    except ValueError as e:
        raise ValueError(f"{e} Or use save_model(..., force_contiguous=True), read the docs "
                         "for potential caveats.") from None


def load_model(model, filename, strict=True, device="cpu", *, backend="mmap"):
    """Loads filename into model; returns (missing, unexpected) names, and
    with strict raises RuntimeError when either is not empty."""
    state_dict = load_file(filename, device=device, backend=backend)
    to_removes = _remove_duplicate_names(model.state_dict(), preferred_names=state_dict.keys())
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    missing = set(missing)
    for group in to_removes.values():
        for name in group:
            if name not in missing:
                unexpected.append(name)
            else:
                missing.remove(name)
    if strict and (missing or unexpected):
        error = f"Error(s) in loading state_dict for {model.__class__.__name__}:"
        if missing:
            error += "\n    Missing key(s) in state_dict: " + \
                ", ".join(f'"{k}"' for k in sorted(missing))
        if unexpected:
            error += "\n    Unexpected key(s) in state_dict: " + \
                ", ".join(f'"{k}"' for k in sorted(unexpected))
        raise RuntimeError(error)
    return missing, unexpected


del os
