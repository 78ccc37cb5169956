"""The import hook behind WCACHE_SAFETENSORS=1: patches ``safetensors`` and
``safetensors.torch`` (wcache/_install.py) when something imports them.

wcache-safetensors.pth runs in every Python process that inherits the
variable (the worker's helper scripts, pip, health checks), so it loads
this file alone, by its path, as ``wcache._hook``, without the package's
``__init__`` (which imports all of wcache and numpy: about 0.3-0.9 s, and a
traceback at every start where numpy is not importable yet, as in a venv
whose own site-packages holds the .pth). Nothing of wcache is imported
until safetensors is; so this module imports only the standard library at
its top, and never from the package there.
"""
import importlib
import os
import sys

ENV = "WCACHE_SAFETENSORS"
HOOKED = ("safetensors", "safetensors.torch")  # the modules _install patches


def wanted():
    """Whether $WCACHE_SAFETENSORS asks for the patch (1, yes, true, on)."""
    return os.environ.get(ENV, "").strip().lower() in ("1", "yes", "true", "on")


class _PatchingLoader:
    """Runs the real loader, then patches the module it made (an
    importlib Loader by its methods)."""

    def __init__(self, loader, patch):
        self.loader = loader
        self.patch = patch

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.patch(module.__name__)

    def __getattr__(self, name):  # get_resource_reader, is_package, ...
        return getattr(self.loader, name)


def _patch(module_name):
    """Patches module_name, imported just now: the first import of wcache."""
    importlib.import_module("wcache._install")._patch_if_hooked(module_name)


class _Hook:
    """Patches safetensors and safetensors.torch when they are imported (a
    meta path finder by its find_spec method)."""
    def find_spec(self, name, path=None, target=None):
        if name not in HOOKED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, _patch)
                return spec
        return None


def hooked():
    """Whether a _Hook is on sys.meta_path."""
    return any(isinstance(f, _Hook) for f in sys.meta_path)


def add_hook():
    """Puts a _Hook first on sys.meta_path, once. Called by the .pth at
    start-up (one thread) or under _install's lock."""
    if not hooked():
        sys.meta_path.insert(0, _Hook())


def from_pth():
    """What wcache-safetensors.pth runs when wanted(): the hook, and the
    patch at once of what is already imported (which, at start-up, is
    nothing but a sitecustomize's doing)."""
    add_hook()
    for name in HOOKED:
        if name in sys.modules:
            _patch(name)
