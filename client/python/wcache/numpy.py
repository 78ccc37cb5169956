"""wcache.numpy: ``safetensors.numpy`` over wcache, same functions,
arguments, return values and errors: ``load_file(filename, *,
backend="mmap")`` (read-only views of the mapping, through wcached when it
serves the file), ``load(data)``, ``save_file(tensor_dict, filename,
metadata=None)`` (atomic) and ``save(tensor_dict, metadata=None)``, byte
for byte what upstream writes. One difference: an array that is not
C-contiguous is written as its contiguous copy (upstream writes its raw
memory, which is wrong for such arrays).
"""
import sys

import numpy as np

from ._lib import SafetensorError
from ._safe_open import safe_open
from ._serialize import TensorSpec, deserialize, serialize, serialize_file

__all__ = ["load_file", "load", "save_file", "save"]


def _specs(tensor_dict, keep):
    if not isinstance(tensor_dict, dict):
        raise ValueError(f"Expected a dict of [str, np.ndarray] but received "
                         f"{type(tensor_dict)}")
    specs = {}
    for k, v in tensor_dict.items():
        if not isinstance(v, np.ndarray):
            raise ValueError(f"Key `{k}` is invalid, expected np.ndarray but received "
                             f"{type(v)}")
        a = np.ascontiguousarray(v).reshape(v.shape)  # ascontiguousarray makes 0-d 1-d
        if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and sys.byteorder == "big"):
            a = a.byteswap().view(a.dtype.newbyteorder("<"))
        keep.append(a)
        specs[k] = TensorSpec(dtype=a.dtype.name, shape=list(a.shape),
                              data_ptr=a.ctypes.data if a.nbytes else 0, data_len=a.nbytes)
    return specs


def save(tensor_dict, metadata=None):
    """The safetensors bytes of {name: array} (and metadata)."""
    keep = []
    return serialize(_specs(tensor_dict, keep), metadata=metadata)


def save_file(tensor_dict, filename, metadata=None):
    """Writes {name: array} (and metadata) to filename, atomically."""
    keep = []
    serialize_file(_specs(tensor_dict, keep), filename, metadata=metadata)


def load_file(filename, *, backend="mmap"):
    """{name: array} of a safetensors file, in file order: read-only views of
    the mapping (``.copy()`` for a writable array)."""
    with safe_open(filename, framework="np", backend=backend) as f:
        return f.get_tensors()


_TYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
          "U64": np.uint64, "I32": np.int32, "U32": np.uint32, "I16": np.int16,
          "U16": np.uint16, "I8": np.int8, "U8": np.uint8, "BOOL": bool, "C64": np.complex64}


def load(data):
    """{name: array} of the safetensors bytes data."""
    result = {}
    for name, v in deserialize(data):
        dtype = _TYPES.get(v["dtype"])
        if dtype is None:
            raise SafetensorError(f"tensor {name!r}: numpy has no type for {v['dtype']}")
        result[name] = np.frombuffer(v["data"], dtype=np.dtype(dtype).newbyteorder("<")) \
            .reshape(v["shape"])
    return result
