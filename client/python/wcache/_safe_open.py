"""wcache.safe_open: the interface of ``safetensors.safe_open`` over wcache.

    from wcache import safe_open          # was: from safetensors import safe_open
    with safe_open("/models/llama/model.safetensors", framework="pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}

Where the model comes from: when wcached (on $WCACHE_SOCKET, else
/run/wcached/wcached.sock) serves a model under this name, or under this
exact configured path, it is attached through the daemon and shares its warm
page cache with every other worker. A path given relative or through a
symlink is also tried as its absolute and its real path. Only "wcached is not
running" and "not served" fall back to mapping the file in this process;
any other failure from the daemon (permission, a model being replaced in
place, a damaged reply) is raised, because silently bypassing the daemon
would hide it.

One connection per process is kept for these attaches and made again after
``fork()``.
"""
import errno
import os
import threading

from ._lib import DaemonUnavailable, ModelNotFound, WcacheError
from .model import _framework, connect, open_file

__all__ = ["safe_open", "open_model"]

_lock = threading.Lock()
_shared = None  # (pid, Client)


def _client(reconnect=False):
    """This process's connection to wcached (made on first use)."""
    global _shared
    with _lock:
        if _shared is not None and (reconnect or _shared[0] != os.getpid()
                                    or _shared[1].closed):
            if _shared[0] == os.getpid():
                _shared[1].close()
            _shared = None
        if _shared is None:
            _shared = (os.getpid(), connect())
        return _shared[1]


def _names(target):
    """The names to ask the daemon for: as given, then absolute and real
    paths when target names an existing file."""
    names = [target]
    if os.path.exists(target):
        for p in (os.path.abspath(target), os.path.realpath(target)):
            if p not in names:
                names.append(p)
    return names


def _attach(target):
    """Attaches target through wcached; returns (model, None) or (None, why
    it fell back). Raises for daemon errors other than down / not served."""
    try:
        client = _client()
    except DaemonUnavailable as e:
        return None, str(e)
    why = None
    for name in _names(target):
        for attempt in (0, 1):
            try:
                return client.attach(name), None
            except ModelNotFound as e:
                why = str(e)
                break
            except DaemonUnavailable as e:
                # A daemon restarted since we connected: connect once more.
                if attempt == 1:
                    return None, str(e)
                try:
                    client = _client(reconnect=True)
                except DaemonUnavailable as e2:
                    return None, str(e2)
    return None, why


def open_model(path_or_name):
    """The Model safe_open uses: attached through wcached when it serves
    path_or_name, else mapped in-process from the file."""
    target = os.fspath(path_or_name)
    if not isinstance(target, str):
        target = os.fsdecode(target)
    model, why = _attach(target)
    if model is not None:
        return model
    try:
        return open_file(target)
    except WcacheError as e:
        if e.errno == errno.ENOENT and not os.path.lexists(target):
            raise ModelNotFound(
                errno.ENOENT,
                f"{target}: no such file, and not served by wcached ({why})") from None
        raise


class _Slice:
    """What get_slice() returns: shape and dtype without touching data, and
    indexing that returns a view (zero-copy) of the selected part."""

    def __init__(self, owner, name):
        self._owner = owner
        self._name = name
        self._info = owner._model.info(name)

    def get_shape(self):
        return list(self._info.shape)

    def get_dtype(self):
        return self._info.dtype

    def get_ndim(self):
        return len(self._info.shape)

    def __getitem__(self, index):
        return self._owner.get_tensor(self._name)[index]

    def __repr__(self):
        return f"<wcache slice {self._name!r} {self._info.dtype} {list(self._info.shape)}>"


class safe_open:
    """``safetensors.safe_open`` over wcache. framework: "pt"/"torch" or
    "np"/"numpy". device: "cpu" gives views on the mapping; another torch
    device copies there (as safetensors does)."""

    def __init__(self, filename, framework="pt", device="cpu"):
        self._framework = _framework(framework)
        device = str(device)
        if self._framework == "np" and device != "cpu":
            raise ValueError(f"device {device!r}: numpy arrays live on the CPU")
        self._device = device
        self._model = open_model(filename)

    @property
    def model(self):
        """The underlying :class:`wcache.Model`."""
        return self._model

    def keys(self):
        return self._model.keys()

    def metadata(self):
        """The __metadata__ dict, or None when the file has none (as
        safetensors returns)."""
        meta = self._model.metadata()
        return meta or None

    def get_tensor(self, name):
        if self._framework == "np":
            return self._model.numpy(name)
        t = self._model.torch(name)
        if self._device != "cpu":
            t = t.to(self._device)
        return t

    def get_slice(self, name):
        return _Slice(self, name)

    def close(self):
        self._model.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<wcache.safe_open {self._model!r} framework={self._framework}>"

