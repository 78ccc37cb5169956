"""Finding libwcache: $WCACHE_LIB, the build tree, the system; and clear
errors when it is missing. Each case runs in a fresh interpreter."""
import os
import re
import shutil

import pytest

import wcache
from pyhelpers import PYDIR, REPO, other_thread_before, run_python


def test_wcache_lib_pointing_nowhere(tmp_path):
    # Every call that needs the library says where it looked; deserialize
    # (which parses with it) leaves no descriptor behind either.
    missing = str(tmp_path / "no" / "libwcache.so.0")
    r = run_python(
        "import os, wcache\n"
        "before = len(os.listdir('/proc/self/fd'))\n"
        "calls = [lambda: wcache.open_file('x.safetensors')] + \\\n"
        "    [lambda: wcache.deserialize(b'\\x02' + bytes(7) + b'{}')] * 3\n"
        "for call in calls:\n"
        "    try:\n"
        "        call()\n"
        "    except wcache.LibraryNotFound as e:\n"
        "        print('LibraryNotFound:', e)\n"
        "print('fds', before, len(os.listdir('/proc/self/fd')))\n", env={"WCACHE_LIB": missing})
    assert r.returncode == 0, r.stderr
    assert r.stdout.count(f"WCACHE_LIB={missing}") == 4, r.stdout
    fds = re.search(r"fds (\d+) (\d+)", r.stdout)
    assert fds and fds.group(1) == fds.group(2), r.stdout


def test_not_a_libwcache(tmp_path):
    r = run_python(
        "import wcache\n"
        "try:\n"
        "    wcache.connect()\n"
        "except wcache.LibraryNotFound as e:\n"
        "    print(e)\n", env={"WCACHE_LIB": "libm.so.6"})
    assert r.returncode == 0, r.stderr
    assert "libm.so.6 is not a usable libwcache" in r.stdout
    assert "wc_open_file" in r.stdout


def test_nothing_found_lists_what_was_tried(tmp_path):
    # a copy of the package outside any build tree, no WCACHE_LIB, no
    # library on the loader's path
    shutil.copytree(os.path.join(PYDIR, "wcache"), tmp_path / "pkg" / "wcache",
                    ignore=shutil.ignore_patterns("__pycache__"))
    r = run_python(
        f"import sys; sys.path.insert(0, {str(tmp_path / 'pkg')!r})\n"
        "import wcache\n"
        "assert wcache.__file__.startswith(sys.path[0]), wcache.__file__\n"
        "import ctypes.util; ctypes.util.find_library = lambda name: None\n"
        "try:\n"
        "    wcache.library_path()\n"
        "except wcache.LibraryNotFound as e:\n"
        "    print(e)\n",
        env={"WCACHE_LIB": None, "PYTHONPATH": None, "LD_LIBRARY_PATH": None})
    assert r.returncode == 0, r.stderr
    out = r.stdout
    if "cannot find libwcache" not in out:
        # libwcache is installed system-wide on this machine
        assert out == "" or "libwcache" in out
        return
    assert "$WCACHE_LIB (not set)" in out
    assert "build tree: none (" + os.path.join(str(tmp_path / "pkg"), "wcache") in out
    assert "libwcache.so.0 (dynamic loader)" in out


def test_an_installed_package_does_not_search_its_ancestors(tmp_path):
    """A package outside a checkout's client/python (site-packages, say)
    never loads a build/lib/libwcache.so.0 that one of its ancestors holds:
    anyone who can make such a directory (/tmp/build, /build in an image)
    would run code in every worker. Here the planted library is a real
    libwcache, so the only thing that tells is which path is loaded."""
    lib = wcache.library_path()
    site = tmp_path / "venv" / "lib" / "python3" / "site-packages"
    shutil.copytree(os.path.join(PYDIR, "wcache"), site / "wcache",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for d in (tmp_path, tmp_path / "venv"):
        (d / "build" / "lib").mkdir(parents=True)
        os.symlink(os.path.realpath(lib), d / "build" / "lib" / "libwcache.so.0")
    r = run_python(
        f"import sys; sys.path.insert(0, {str(site)!r})\n"
        "import wcache\n"
        "assert wcache.__file__.startswith(sys.path[0]), wcache.__file__\n"
        "import ctypes.util; ctypes.util.find_library = lambda name: None\n"
        "try:\n"
        "    print('loaded', wcache.library_path())\n"
        "except wcache.LibraryNotFound as e:\n"
        "    print(e)\n",
        env={"WCACHE_LIB": None, "PYTHONPATH": None, "LD_LIBRARY_PATH": None})
    assert r.returncode == 0, r.stderr
    assert str(tmp_path) not in r.stdout.replace(str(site), ""), r.stdout
    if "cannot find libwcache" in r.stdout:
        assert "build tree: none (" in r.stdout, r.stdout


def test_found_in_the_build_tree(tmp_path):
    """Walking up from the package: <repo>/build/lib/libwcache.so.0."""
    lib = wcache.library_path()
    repo = tmp_path / "repo"
    shutil.copytree(os.path.join(PYDIR, "wcache"), repo / "client" / "python" / "wcache",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "build" / "lib").mkdir(parents=True)
    os.symlink(os.path.realpath(lib), repo / "build" / "lib" / "libwcache.so.0")
    r = run_python(
        f"import sys; sys.path.insert(0, {str(repo / 'client' / 'python')!r})\n"
        "import wcache\n"
        "print(wcache.library_path())\n",
        env={"WCACHE_LIB": None, "PYTHONPATH": None})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(repo / "build" / "lib" / "libwcache.so.0")


def test_import_does_not_need_the_library():
    r = run_python("import wcache, wcache.convert; print('ok')",
                   env={"WCACHE_LIB": "/nonexistent/libwcache.so.0"})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_pip_install_offline(tmp_path):
    """`pip install ./client/python` works with no network: into a venv that
    sees Debian's numpy and torch, with no index at all. The venv is made
    without pip of its own (copying one in took half the test's 7 s), and
    Debian's pip (python3-pip, which ensurepip's copy is the same version
    as) installs into it, run by the venv's python."""
    import subprocess
    import sys
    src = os.path.join(os.path.dirname(__file__), "..", "..", "client", "python")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(venv)], check=True)
    r = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-index", src],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([str(venv / "bin" / "python"), "-c",
                        "import wcache, os; print(wcache.__file__)"],
                       capture_output=True, text=True, timeout=60, cwd=str(tmp_path), env=env)
    assert r.returncode == 0 and str(venv) in r.stdout, r.stdout + r.stderr


def test_default_socket_is_libwcaches():
    """wcache.default_socket() is the path wc_connect(NULL) uses, from the C
    library: proto/defaults.h's DEFAULT_SOCKET_PATH, or $WCACHE_SOCKET."""
    with open(os.path.join(REPO, "proto", "defaults.h")) as f:
        header = f.read()
    default = (re.search(r'#define DEFAULT_RUNTIME_DIR "([^"]+)"', header).group(1) +
               re.search(r'#define DEFAULT_SOCKET_PATH DEFAULT_RUNTIME_DIR "([^"]+)"',
                         header).group(1))
    r = run_python("import wcache; print(wcache.default_socket())",
                   env={"WCACHE_SOCKET": None})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == default
    r = run_python("import wcache; print(wcache.default_socket())",
                   env={"WCACHE_SOCKET": ""})
    assert r.stdout.strip() == default, r.stderr
    r = run_python("import os, wcache\n"
                   "print(wcache.default_socket())\n"
                   "os.environ['WCACHE_SOCKET'] = '/elsewhere/w.sock'\n"
                   "print(wcache.default_socket())\n",
                   env={"WCACHE_SOCKET": "/tmp/x/wcached.sock"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["/tmp/x/wcached.sock", "/elsewhere/w.sock"]


@pytest.mark.parametrize("where", ["WCACHE_LIB", "build tree"])
def test_library_path_while_another_thread_loads_the_library(monkeypatch, where):
    """library_path() in a thread while another loads the library (the
    first use of it in the process) is the path, never None: another
    thread's library_path() runs before each bytecode of _load in turn.
    Before, _load stored the library before its path, and a library_path()
    between the two stores found the library loaded and returned None
    (fails at bytecode 29 with WCACHE_LIB, 70 from the build tree)."""
    from wcache import _lib
    _lib.lib()
    monkeypatch.setattr(_lib, "_lib", None)
    monkeypatch.setattr(_lib, "_lib_path", None)
    if where == "build tree":
        monkeypatch.delenv("WCACHE_LIB", raising=False)
    path = _lib.library_path()
    k = 0
    while True:
        monkeypatch.setattr(_lib, "_lib", None)
        monkeypatch.setattr(_lib, "_lib_path", None)
        got = []
        errors, other_errors, ran = other_thread_before(
            _lib._load.__code__, k, _lib.lib, lambda: got.append(_lib.library_path()),
            opcodes=True, join=0.05)
        assert not errors and not other_errors, (k, errors, other_errors)
        assert got == ([path] if ran else []), f"library_path() before bytecode {k} of _load"
        assert _lib.lib()._name == path
        if not ran:
            break
        k += 1
    assert k > 10


def test_a_handle_finalized_while_the_library_lock_is_held_does_not_hang(monkeypatch,
                                                                         model_path):
    """A garbage collection can finalize a model (and a client) in a thread
    that holds _lib's lock, loading the library: the release must not take
    that lock. Before, _Handle.__del__ called _lib.lib(), which takes it
    whenever _lib is unset: a test that unsets it while handles were
    garbage (test_library_path_while_another_thread_loads_the_library run
    after test_torch) hung the whole suite."""
    import gc
    import threading
    from wcache import _lib
    model = wcache.open_file(model_path)
    cycle = [model]
    cycle.append(cycle)  # freed only by a collection
    del model, cycle
    done = threading.Event()

    def collect_under_the_lock():
        with _lib._lock:
            monkeypatch.setattr(_lib, "_lib", None)  # as while _load runs
            gc.collect()
        done.set()

    t = threading.Thread(target=collect_under_the_lock, daemon=True)
    t.start()
    t.join(10)
    assert done.is_set(), "a handle's release waited for _lib's lock"
