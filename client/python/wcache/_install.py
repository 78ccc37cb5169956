"""wcache.install(): an installed ``safetensors`` package goes through wcache.

For servers whose loading code calls safetensors directly or through
transformers, diffusers, vLLM or SGLang, and that cannot be changed:

    import wcache; wcache.install()      # in the program, before loading, or
    WCACHE_SAFETENSORS=1 python3 serve.py  # set by the process manager

``install()`` replaces, in the installed package, ``safetensors.safe_open``
(and the reference ``safetensors.torch`` holds), ``safetensors.torch.
load_file`` and ``safetensors.torch.load_model`` by wcache's, which serve
a file through wcached when it serves it and map it in-process otherwise.
The ``safe_open`` put in place (this module's ``safe_open``, a subclass of
``wcache.safe_open``) serves the frameworks wcache serves ("pt", "torch",
"pytorch", "np", "numpy"); a call with any other framework ("tf", "flax",
"jax", "mlx", "paddle", or a name upstream refuses too) goes, arguments
unchanged, to the package's own ``safe_open``, so its ``safetensors.flax``,
``tensorflow``, ``mlx`` and ``paddle`` modules (which bind ``safe_open``
when imported, often after the patch) keep working.
``safetensors.torch.save_model`` (and its ``_remove_duplicate_names``) are
wcache's too: upstream's refuses a model whose tied weights are tensors
wcache loaded (one storage per dtype and file, which none of them covers).
``wcache.SafetensorError`` is made a subclass of the package's own
``SafetensorError``, so ``except safetensors.SafetensorError`` still
catches what wcache raises. Everything else (``save_file``, ``serialize``)
stays upstream's. Code that did ``from safetensors import safe_open``
before ``install()`` keeps the object it imported: call it first.

The environment variable works without touching the program: the
python3-wcache package installs ``wcache-safetensors.pth`` in
dist-packages, which Python runs at start-up; when WCACHE_SAFETENSORS is
set to 1 (or yes, true, on) it loads wcache/_hook.py alone (not the
package) and registers its import hook, which patches ``safetensors`` and
``safetensors.torch`` as soon as something imports them: wcache, numpy
and torch are imported only then. Unset, or set to anything else (0, no),
the .pth costs one environment lookup and imports nothing.
"""
import importlib
import inspect
import sys
import threading

from . import _hook, _lib, _safe_open
from ._hook import _Hook

__all__ = ["install", "uninstall", "ENV"]

ENV = _hook.ENV
# Guards _saved, the patched modules' attributes and the hook's place in
# sys.meta_path: install(), uninstall() and the hook's patching each change
# them as one step. Never held while importing: an import under it could
# wait for a module another thread is importing through the hook, whose
# patching waits for the lock.
_lock = threading.Lock()
_saved = {}  # (module name, attribute) -> upstream's object
# The package's own safe_open, to which the installed safe_open hands the
# frameworks wcache does not serve: the last one install() replaced. Kept
# after uninstall(), for modules that imported the installed safe_open.
_upstream_safe_open = None
_lib.fork_safe_module(globals(), "_lock")  # a child of fork() makes it anew


def _patch(module_name, attrs):
    """Puts attrs on module_name, saving upstream's objects the first time.
    The caller holds _lock."""
    module = sys.modules[module_name]
    if module_name == "safetensors":
        _adopt_error_class(getattr(module, "SafetensorError", None))
    for attr, value in attrs.items():
        key = (module_name, attr)
        if key not in _saved and hasattr(module, attr):
            _saved[key] = getattr(module, attr)
            if key == ("safetensors", "safe_open"):
                _remember_upstream(_saved[key])
        setattr(module, attr, value)


def _remember_upstream(obj):
    """Records obj, the package's safe_open, for the installed safe_open
    to delegate to; never the installed one itself (it would call itself)."""
    global _upstream_safe_open
    if not (isinstance(obj, type) and issubclass(obj, safe_open)):
        _upstream_safe_open = obj


def _adopt_error_class(upstream):
    """Makes wcache.SafetensorError also an upstream SafetensorError."""
    ours = _lib.SafetensorError
    if upstream is None or issubclass(ours, upstream):
        return
    try:
        ours.__bases__ = ours.__bases__ + (upstream,)
    except TypeError:  # incompatible layout: leave the classes apart
        pass


class safe_open(_safe_open.safe_open):
    """What install() puts in place of ``safetensors.safe_open``:
    wcache's safe_open for a framework wcache serves (``FRAMEWORKS``), the
    package's own for any other (see the module comment). Upstream's
    signature: ``safe_open(filename, framework, device="cpu", *,
    backend="mmap")``; a call without a framework is wcache's ("pt")."""

    def __new__(cls, *args, **kwargs):
        framework = kwargs.get("framework", args[1] if len(args) > 1 else "pt")
        upstream = _upstream_safe_open
        if upstream is not None and not (isinstance(framework, str)
                                         and framework in _safe_open.FRAMEWORKS):
            return upstream(*args, **kwargs)  # not an instance: __init__ is not run
        return super().__new__(cls)


# What inspect.signature() reports is wcache's safe_open's, not __new__'s
# (*args, **kwargs): code that checks for pread support with
# `"backend" in inspect.signature(safetensors.safe_open).parameters` found
# none under install().
safe_open.__signature__ = inspect.signature(_safe_open.safe_open)


def _top_attrs():
    return {"safe_open": safe_open}


def _torch_attrs():
    from . import torch as wtorch
    # save_model and its _remove_duplicate_names too: wcache's tensors of
    # one dtype and file share one storage, which upstream's take for tied
    # weights none of which covers its storage, and refuse (rev176 F4);
    # wcache's know a part view of a loaded file (wcache/torch.py).
    return {"safe_open": safe_open, "load_file": wtorch.load_file,
            "load_model": wtorch.load_model, "save_model": wtorch.save_model,
            "_remove_duplicate_names": wtorch._remove_duplicate_names}


# module -> what install() puts on it (imported when called)
_ATTRS = {"safetensors": _top_attrs, "safetensors.torch": _torch_attrs}


def _patch_if_hooked(module_name):
    """The hook's patching of module_name, once imported: skipped when
    uninstall() has removed the hook meanwhile."""
    attrs = _ATTRS[module_name]()
    with _lock:
        if _hook.hooked():
            _patch(module_name, attrs)


def install():
    """Patches the installed safetensors package (see the module comment).
    Raises ModuleNotFoundError when there is none. Idempotent."""
    importlib.import_module("safetensors")
    names = ["safetensors"]
    try:
        importlib.import_module("safetensors.torch")
        names.append("safetensors.torch")
    except ImportError:  # no torch: the top-level safe_open is patched
        pass
    attrs = [(name, _ATTRS[name]()) for name in names]
    with _lock:
        for name, what in attrs:
            _patch(name, what)


def uninstall():
    """Puts upstream's objects back."""
    with _lock:
        for (module_name, attr), value in _saved.items():
            module = sys.modules.get(module_name)
            if module is not None:
                setattr(module, attr, value)
        _saved.clear()
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Hook)]


def install_from_environment():
    """When $WCACHE_SAFETENSORS asks for it, patches safetensors now if it
    is already imported, else when it is (what wcache-safetensors.pth does
    through wcache/_hook.py alone, without importing the package)."""
    if not _hook.wanted():
        return False
    with _lock:
        _hook.add_hook()
    for name in _ATTRS:
        if name in sys.modules:
            _patch_if_hooked(name)
    return True
