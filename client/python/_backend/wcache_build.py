"""PEP 517 build backend of the wcache package: setuptools' own backend
(setuptools.build_meta), taken from the interpreter's installation (on
Debian: python3-setuptools and python3-wheel) instead of from a package
index.

Why: pip builds in an isolated environment and installs the backend's
requirements there from an index; with ``requires = ["setuptools"]`` an
offline ``pip install ./client/python`` fails. With ``requires = []`` and
this module (``backend-path``), pip needs no index: the isolated build finds
the system's setuptools here. Where the system has none, the error says
which Debian packages to install.
"""
import os
import site
import sys


def _system_site_dirs():
    dirs = []
    for prefix in {sys.base_prefix, sys.prefix}:
        try:
            dirs += site.getsitepackages([prefix])
        except AttributeError:  # very old virtualenv site.py
            pass
    if sys.platform.startswith("linux"):
        dirs.append("/usr/lib/python3/dist-packages")  # Debian, Ubuntu
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


try:
    from setuptools import build_meta as _setuptools
except ImportError:
    for _d in _system_site_dirs():
        if _d not in sys.path:
            sys.path.append(_d)
    try:
        from setuptools import build_meta as _setuptools
    except ImportError:
        raise ImportError(
            "building wcache needs setuptools (and wheel): on Debian, "
            "apt-get install python3-setuptools python3-wheel") from None

build_wheel = _setuptools.build_wheel
build_sdist = _setuptools.build_sdist
prepare_metadata_for_build_wheel = _setuptools.prepare_metadata_for_build_wheel
build_editable = getattr(_setuptools, "build_editable", None)
prepare_metadata_for_build_editable = getattr(
    _setuptools, "prepare_metadata_for_build_editable", None)
if build_editable is None:
    del build_editable
if prepare_metadata_for_build_editable is None:
    del prepare_metadata_for_build_editable


def get_requires_for_build_wheel(config_settings=None):
    """Nothing to fetch: setuptools and wheel come from the system."""
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []
