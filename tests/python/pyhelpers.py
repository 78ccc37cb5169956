"""Helpers of the Python package's tests: the package from this tree, the
build's libwcache and binaries, safetensors files written here byte by byte
(struct + json, independent of the code under test), and a real wcached on
sockets in a temporary directory (tests/pyutil/wcached.py runs it).

Environment: WCACHE_BUILD (build directory; default <repo>/build), WCACHE_LIB
(the library; default <build>/lib/libwcache.so.0). Waits are conditions with
deadlines, never bare sleeps.
"""
import json
import os
import struct
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.append(os.path.join(REPO, "tests", "pyutil"))
from wcached import Wcached, build_binary, build_dir  # noqa: E402
from wcached import wait_until as _wait_until  # noqa: E402

PYDIR = os.path.join(REPO, "client", "python")
BUILD = build_dir()
BIN = os.path.join(BUILD, "bin")

if PYDIR not in sys.path:
    sys.path.insert(0, PYDIR)
if not os.environ.get("WCACHE_LIB"):
    _lib = os.path.join(BUILD, "lib", "libwcache.so.0")
    if os.path.exists(_lib):
        os.environ["WCACHE_LIB"] = _lib


def binary(name):
    return build_binary(name, BUILD)


def wait_until(cond, timeout=30.0, what="condition"):
    """Polls cond() until it is true or the deadline passes."""
    return _wait_until(cond, timeout, what)


def write_safetensors(path, tensors, metadata=None):
    """Writes a safetensors file. tensors: list of (name, dtype, shape, data
    bytes), stored in that order. Returns {name: (offset in file, bytes)}."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    off = 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [off, off + len(data)]}
        off += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    where = {}
    pos = 8 + len(text)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, _dtype, _shape, data in tensors:
            f.write(data)
            where[name] = (pos, data)
            pos += len(data)
    return where


def mkmodel(path, layers=2, hidden=64, ffn=128, vocab=100, seed=1, dtype="BF16"):
    subprocess.run([binary("mkmodel"), "--layers", str(layers), "--hidden", str(hidden),
                    "--ffn", str(ffn), "--vocab", str(vocab), "--seed", str(seed),
                    "--dtype", dtype, str(path)], check=True, stdout=subprocess.DEVNULL)
    return str(path)


def file_mappings(path):
    """How many of this process's mappings are of path (by /proc/self/maps)."""
    st = os.stat(path)
    n = 0
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and int(parts[4]) == st.st_ino and \
                    parts[5].rstrip("\n").startswith(os.path.realpath(path)):
                n += 1
    return n


class Daemon(Wcached):
    """A wcached with its config, sockets and log in one directory
    (tests/pyutil/wcached.py's Wcached, under the name the tests use)."""


def run_python(code, env=None, timeout=120):
    """Runs code in a fresh /usr/bin/python3 with this tree's package."""
    e = dict(os.environ)
    e["PYTHONPATH"] = PYDIR + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    if env:
        for k, v in env.items():
            if v is None:
                e.pop(k, None)
            else:
                e[k] = v
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True,
                          text=True, timeout=timeout)


def other_thread_before(code, k, first, other, opcodes=False, join=0.5):
    """Runs first() in this thread under a trace that runs other() whole, in
    another thread, just before the k-th line (or, with opcodes, the k-th
    bytecode) that this thread executes in code (a function's __code__), so
    a race between the two is made, not hoped for. The other thread is
    joined with a timeout, since it may wait on a lock first holds; it is
    joined fully at the end. Returns (what first raised, what other raised,
    whether other ran: False once k is past the last event of first's run,
    when every interleaving has been tried)."""
    import threading
    errors, other_errors, started, count = [], [], [], 0

    def run_other():
        try:
            other()
        except BaseException as e:
            other_errors.append(e)

    def each(frame, event, arg):
        nonlocal count
        if event == ("opcode" if opcodes else "line"):
            if count == k:
                t = threading.Thread(target=run_other)
                t.start()
                t.join(join)
                started.append(t)
            count += 1
        return each

    def calls(frame, event, arg):
        if frame.f_code is not code:
            return None
        if opcodes:
            frame.f_trace_opcodes = True
            frame.f_trace_lines = False
        return each

    sys.settrace(calls)
    try:
        first()
    except BaseException as e:
        errors.append(e)
    finally:
        sys.settrace(None)
    for t in started:
        t.join()
    return errors, other_errors, bool(started)
