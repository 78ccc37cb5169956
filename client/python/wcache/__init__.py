"""wcache: zero-copy numpy and torch tensors from wcached's shared page cache.

    import wcache
    with wcache.connect() as client:              # wcached's client socket
        model = client.attach("llama")            # shared with every worker
    w = model.torch("lm_head.weight")             # a view, not a copy

    model = wcache.open_file("model.safetensors") # in-process, no daemon

    from wcache import safe_open                  # drop-in for safetensors
    with safe_open("model.safetensors", framework="pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}

    from wcache.torch import load_file, save_file # safetensors.torch

    f32 = wcache.derived("llama", "f32-v1",       # computed once, by one worker,
        lambda src: {k: v.float() for k, v in src.items()})  # shared by all
    wcache.install()                              # or WCACHE_SAFETENSORS=1: an
                                                  # installed safetensors uses wcache

numpy arrays are read-only views of the mapping; torch tensors are views
whose pages are copy-on-write (torch has no read-only tensors; see
wcache/_torch.py). Arrays and tensors keep the model mapped after
``close()``; the mapping goes with the last of them (see wcache/model.py).

Pure Python over libwcache with ctypes; see wcache/_lib.py for how the
library is found ($WCACHE_LIB, the build tree, the system library path).
"""
from ._lib import (CannotOpenFile, DaemonUnavailable, LibraryNotFound, ModelNotFound,
                   NoSuchFile, SafetensorError, WcacheError, library_path)
from ._safe_open import _safe_open_handle, open_model, safe_open
from ._serialize import TensorSpec, deserialize, serialize, serialize_file
from ._derived import DerivedMismatch, derived
from ._install import install, uninstall
from .model import Client, Model, TensorInfo, connect, default_socket, open_file

__version__ = "0.1.0"

__all__ = [
    "Client", "Model", "TensorInfo", "connect", "open_file", "open_model", "safe_open",
    "default_socket", "library_path", "WcacheError", "DaemonUnavailable", "ModelNotFound",
    "LibraryNotFound", "NoSuchFile", "CannotOpenFile", "SafetensorError", "TensorSpec", "serialize",
    "serialize_file", "deserialize", "install", "uninstall", "derived", "DerivedMismatch",
    "_safe_open_handle",
]
