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
import platform
import struct
import subprocess
import sys
import time
import traceback

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.append(os.path.join(REPO, "tests", "pyutil"))
from wcached import Wcached, build_binary, build_dir, parse_user  # noqa: E402
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


def wait_child(pid, timeout=30.0):
    """The wait status of child pid once it has exited, or None when it
    has not within timeout seconds (it is then killed and reaped: a child
    that hangs fails its test, not the run)."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.05)


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


def mapping_at(addr):
    """(perms, path) of the /proc/self/maps entry holding addr, or None."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= addr < hi:
                return parts[1], parts[5].strip() if len(parts) > 5 else ""
    return None


def fstat_names_by_another_device(monkeypatch, path):
    """Makes os.fstat of a descriptor of path say another st_dev (the inode
    and the rest kept), as overlayfs before Linux 6.8 and btrfs subvolumes
    do next to /proc/self/maps, until monkeypatch undoes it."""
    real_fstat = os.fstat

    def fstat(fd):
        st = real_fstat(fd)
        if os.readlink(f"/proc/self/fd/{fd}") != os.path.realpath(path):
            return st
        fields = list(st[:10])
        fields[2] = os.makedev(os.major(st.st_dev) + 100, os.minor(st.st_dev))  # st_dev
        return os.stat_result(fields)
    monkeypatch.setattr(os, "fstat", fstat)


def cow_tensor(model, name, path):
    """model.torch(name), which must come without a RuntimeWarning as a view
    of a private writable (copy-on-write) mapping of the file at path."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        t = model.torch(name)
    perms, where = mapping_at(t.data_ptr())
    assert perms == "rw-p" and os.path.samefile(where, path), (perms, where)
    return t


# WCACHE_TEST_USER=UID:GID runs every test daemon as that unprivileged user,
# without capabilities, as wcached.service does (root hides limits that
# bite); the ctest entries python and python_2 set it (tests/CMakeLists.txt).
# Switching users needs root: a suite run by another user runs its daemons
# as itself.
TEST_USER = os.environ.get("WCACHE_TEST_USER") if os.geteuid() == 0 else None


class Daemon(Wcached):
    """A wcached with its config, sockets and log in one directory
    (tests/pyutil/wcached.py's Wcached, under the name the tests use), run
    as $WCACHE_TEST_USER where that is set and this is root."""

    def __init__(self, directory, models, extra="", **kw):
        if TEST_USER and "user" not in kw:
            kw["user"] = parse_user(TEST_USER)
        super().__init__(directory, models, extra, **kw)


def run_python(code, env=None, timeout=120, wrap=()):
    """Runs code in a fresh /usr/bin/python3 with this tree's package (the
    command wrap runs it, given its argv as arguments, where wrap is given)."""
    e = dict(os.environ)
    e["PYTHONPATH"] = PYDIR + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    if env:
        for k, v in env.items():
            if v is None:
                e.pop(k, None)
            else:
                e[k] = v
    return subprocess.run([*wrap, sys.executable, "-c", code], env=e, capture_output=True,
                          text=True, timeout=timeout)


# futex(2)'s number, where a thread waiting for a lock or a condition
# sleeps (see _blocked_state); None elsewhere: then only the thread's CPU
# time and its frame say it waits.
_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())


def _blocked_state(t):
    """What says whether thread t is making progress, or None when it is
    not waiting in futex(2): (its Python frame and instruction, its CPU
    time in ns from /proc/self/task/TID/schedstat). A thread that waits for
    a lock, a condition or the import lock sleeps in futex with the same
    state; a running one, one waiting for the GIL that it is then given,
    or one in another system call (a socket, a pipe, sleep) changes it or
    is not in futex."""
    frame = sys._current_frames().get(t.ident)
    if frame is None:
        return None
    where = (id(frame), frame.f_lasti)
    del frame  # never keep another thread's frame: it holds that thread's locals
    task = f"/proc/self/task/{t.native_id}/"
    try:
        with open(task + "syscall") as f:
            call = f.read().split(None, 1)[0]
        with open(task + "schedstat") as f:
            cpu = f.read().split(None, 1)[0]
    except (OSError, IndexError):
        return None  # the thread has ended (or no such file: never "blocked")
    if _FUTEX is not None and call != str(_FUTEX):
        return None
    return where, cpu


def wait_done_or_blocked(t, limit, settle=0.01):
    """Joins thread t until it has ended or is blocked, at most limit
    seconds. Blocked: for settle seconds (polled about every millisecond),
    t has waited in futex(2), its Python frame on the same instruction and
    its CPU time unchanged: it waits for something another thread holds (a
    lock the caller holds while paused in a trace), and joining longer
    cannot change what it has done. Returns "done", "blocked" or "limit"."""
    deadline = time.monotonic() + limit
    last, since = None, None
    while True:
        t.join(0.001)
        if not t.is_alive():
            return "done"
        now = time.monotonic()
        if now >= deadline:
            return "limit"
        state = _blocked_state(t)
        if state is None or state != last:
            last, since = state, now
        elif now - since >= settle:
            return "blocked"


def other_thread_before(code, k, first, other, opcodes=False, join=0.5):
    """Runs first() in this thread under a trace that runs other() whole, in
    another thread, just before the k-th line (or, with opcodes, the k-th
    bytecode) that this thread executes in code (a function's __code__), so
    a race between the two is made, not hoped for. The other thread is
    joined until it ends or is blocked (wait_done_or_blocked), since it may
    wait on a lock first holds, at most join seconds; it is joined fully at
    the end. Returns (what first raised, what other raised,
    whether other ran: False once k is past the last event of first's run,
    when every interleaving has been tried). The exceptions' frames are
    cleared of their locals (traceback.clear_frames; their tracebacks
    still name each line): through the frame that called first(), which
    holds the list of errors, each would be in a reference cycle keeping
    every object those calls used (a model's table, a mapping) alive until
    the cyclic collector ran."""
    import threading
    errors, other_errors, started, count = [], [], [], 0

    def run_other():
        try:
            other()
        except BaseException as e:
            traceback.clear_frames(e.__traceback__)
            other_errors.append(e)

    def each(frame, event, arg):
        nonlocal count
        if event == ("opcode" if opcodes else "line"):
            if count == k:
                t = threading.Thread(target=run_other)
                t.start()
                wait_done_or_blocked(t, join)
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
        traceback.clear_frames(e.__traceback__)
        errors.append(e)
    finally:
        sys.settrace(None)
    for t in started:
        t.join()
    return errors, other_errors, bool(started)


# The end of run_forked's script: fork_each runs check(*args) of each case
# in a child of its own and says how each ended on lines of its own.
_FORK_EACH = '''
def fork_each(check, cases):
    import os, sys, traceback
    for name, args in cases:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                result = check(*args)
                print(f"fork_each: {name} result {result}", flush=True)
                status = 0
            except BaseException:
                print(f"{name}:", file=sys.stderr)
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(status)
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        print(f"fork_each: {name} exit {status}", flush=True)
'''


def run_forked(script, cases, env=None, timeout=300):
    """Runs script in one fresh python (as run_python), where it imports
    what the cases need and defines check(*args), then check(*args) for
    each (name, args) of cases in a child forked for it: each case in a
    process of its own (a crash is that case's exit status, -11 for
    SIGSEGV), without each paying for a new interpreter and its imports
    (torch: a second or more). Returns ({name: (exit status, str of what
    check returned, or None)}, the script's output); a case that never
    ran is missing."""
    r = run_python(script + _FORK_EACH + f"\nfork_each(check, {list(cases)!r})\n", env=env,
                   timeout=timeout)
    results = {}
    for line in r.stdout.splitlines():
        if line.startswith("fork_each: "):
            name, what, value = line[len("fork_each: "):].split(" ", 2)
            status, result = results.get(name, (None, None))
            results[name] = (int(value), result) if what == "exit" else (status, value)
    return results, f"exit status {r.returncode}\n{r.stdout}\n{r.stderr}"
