"""The steps of tests/gpu/run.sh: make a model, warm it, run wcached, time
each way into the device in a fresh process, load a Llama model under real
transformers plainly, through wcache by WCACHE_SAFETENSORS=1 (the import
hook of the package's wcache-safetensors.pth, which --site runs), and
through wcache.install() with WCACHE_HOST_REGISTER=1, and report with
PASS/MISS. Making the model and the steps that do not measure wcache need
no libwcache.

Where wcache registers a mapping with CUDA (the engine's register path,
and host registration), the rows also say how much of what was registered
became private memory ("private MiB": for the engine, the registered
ranges' pages that /proc/self/pagemap shows as this process's own, read
just after each range is registered, in one more load after the timed ones
and untimed, since the reads run inside the load; for host registration,
Anonymous in
/proc/self/smaps of the handles' mappings, kept until after a transformers
load, then let go, timed, and the unmapping added to the load's seconds, as
the plain load's is inside its timing). A row is judged only where
(nearly) every page registered was present when read, as a pin makes
them. libwcache
maps model files MAP_PRIVATE, and since Linux 6.2 a long-term read-only pin
of a private file mapping makes the kernel copy each pinned page ("mm/gup:
reliable R/O long-term pinning in COW mappings"); whether the NVIDIA
driver's pin is long-term decides whether registration reads the shared
page cache (0 MiB) or a private copy of it (the model's size). This is
measured, not assumed.

Two rows are informational, with no target: a get_tensor loop
(``{k: f.get_tensor(k) for k in f.keys()}`` of a safe_open on the device,
wcache's and upstream's: how loaders that ask tensor by tensor load), and
registration (``register-threads``: 8 ranges of the model's mapping
registered as the engine registers them, on 1 thread, then on 4, which
settles whether the driver pins in parallel; the engine registers
REGISTER_AHEAD ranges at once on as many threads).

Every step is a subcommand, so run.sh can bound each with a timeout. Results
are JSON lines appended to one file; ``report`` reads them. With ``--cpu``
the same code runs on the CPU (the engine on wcache._device.CpuBackend, the
"device" is host memory): that checks the script's logic, not speeds.
"""
import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "client", "python"))
sys.path.append(os.path.join(REPO, "tests", "pyutil"))

GIB = 1 << 30
MIB = 1 << 20


def log(text):
    print(text, file=sys.stderr, flush=True)


def emit(results, **row):
    with open(results, "a") as f:
        f.write(json.dumps(row) + "\n")
    log(f"  {row.get('method')}: " + ", ".join(f"{k}={v}" for k, v in row.items()
                                               if k != "method"))


# ---- the host ----

CUDA_DEV_ATTR_HOST_REGISTER_READ_ONLY_SUPPORTED = 113  # cudaDevAttrHostRegisterReadOnlySupported


def read_only_registration(torch):
    """("yes"/"no", how it was asked) for whether device 0 supports
    cudaHostRegisterReadOnly, or ("unknown", why): cuda-bindings' runtime
    first, then torch's cudart binding where it has cudaDeviceGetAttribute,
    then the libcudart this process loaded, through ctypes."""
    import ctypes
    failures = []
    try:
        from cuda.bindings import runtime as r
        err, value = r.cudaDeviceGetAttribute(
            r.cudaDeviceAttr.cudaDevAttrHostRegisterReadOnlySupported, 0)
        code = int(getattr(err, "value", err))
        if code == 0:
            return ("yes" if value else "no"), "cuda.bindings"
        failures.append(f"cuda.bindings: error {code}")
    except Exception as e:
        failures.append(f"cuda.bindings: {type(e).__name__}")
    try:
        get = getattr(torch.cuda.cudart(), "cudaDeviceGetAttribute", None)
        if get is None:
            failures.append("torch cudart: no cudaDeviceGetAttribute")
        else:
            got = get(CUDA_DEV_ATTR_HOST_REGISTER_READ_ONLY_SUPPORTED, 0)
            err, value = got if isinstance(got, tuple) else (0, got)
            code = int(getattr(err, "value", err))
            if code == 0:
                return ("yes" if value else "no"), "torch.cuda.cudart()"
            failures.append(f"torch cudart: error {code}")
    except Exception as e:
        failures.append(f"torch cudart: {type(e).__name__}")
    try:
        # libcudart.so.N, or libcudart-HASH.so.N where a torch wheel bundles it
        # (the loaded copy, never the file loaded again: cudart_runtimes)
        from wcache._device import cudart_runtimes
        runtimes, _ = cudart_runtimes()
        if not runtimes:
            raise OSError("no libcudart loaded")
        value = ctypes.c_int(-1)
        err = runtimes[0][1].cudaDeviceGetAttribute(
            ctypes.byref(value), CUDA_DEV_ATTR_HOST_REGISTER_READ_ONLY_SUPPORTED, 0)
        if err == 0:
            return ("yes" if value.value else "no"), "libcudart via ctypes"
        failures.append(f"libcudart: error {err}")
    except Exception as e:
        failures.append(f"libcudart: {type(e).__name__}")
    return "unknown", "; ".join(failures)


def room_plan(gib, llama_gib, work_free, shm_free, min_gib):
    """Where the model goes and how big, from the free GiB of the work
    directory and of /dev/shm (None: unknown): (place, gib, message), place
    "work" or "shm", gib 0 when no model of min_gib fits. The model and its
    torch.save copy take about 2.3x gib GiB, the Llama's shards llama_gib."""
    need = 2.3 * gib + llama_gib
    if work_free is None:
        return "work", gib, "the work directory's free space is unknown: going on"
    if work_free >= need:
        return "work", gib, ""
    short = f"the work directory has {work_free:.1f} GiB free of the {need:.1f} GiB needed"
    if shm_free is not None and shm_free >= need:
        return "shm", gib, f"{short}: working in /dev/shm ({shm_free:.1f} GiB free) instead"
    place, free = ("shm", shm_free) if shm_free is not None and shm_free > work_free \
        else ("work", work_free)
    smaller = int(max(0.0, free - llama_gib) / 2.3 / min_gib) * min_gib
    if smaller < min_gib:
        return place, 0, f"{short}, and /dev/shm too: no model, its measurements are skipped"
    where = "/dev/shm" if place == "shm" else "the work directory"
    return place, round(smaller, 6), f"{short}, and /dev/shm too: a {smaller:g} GiB model " \
        f"instead of {gib:g} GiB, in {where}"


def _free_gib(path):
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize / GIB


def _available_gib():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / (1 << 20)
    except OSError:
        pass
    return None


def cmd_room(a):
    """Prints, for run.sh to eval, where to work and the model's size
    (room_plan): work=DIR gib=N, and a line saying what it changed.
    /dev/shm holds its files in memory: its room is also bounded by the
    memory available, less one model for the pinned copy."""
    import shlex
    import tempfile
    shm_free = _free_gib(a.shm) if os.path.isdir(a.shm) and os.access(a.shm, os.W_OK) else None
    available = _available_gib()
    if shm_free is not None and available is not None:
        shm_free = min(shm_free, available - a.gib)
    work_free = float(os.environ["WORK_FREE_GIB"]) if os.environ.get("WORK_FREE_GIB") \
        else _free_gib(a.work)  # WORK_FREE_GIB: for the tests, a full disk
    place, gib, message = room_plan(a.gib, a.llama_gib, work_free, shm_free, a.min_gib)
    work = a.work
    if place == "shm":
        work = tempfile.mkdtemp(prefix="wcache-gpu.", dir=a.shm)
    if message:
        log(f"== room: {message}")
    print(f"work={shlex.quote(work)} gib={gib:g}")
    return 0


PACKAGES = (("numpy", "numpy"), ("safetensors", "safetensors"),
            ("transformers", "transformers"), ("accelerate", "accelerate"),
            ("cuda-bindings", "cuda.bindings"))


def package_versions(packages=PACKAGES):
    """"name version, ..." of the packages the check's steps depend on
    (from their metadata; a package without any, as Debian's may be, is
    "importable" or "absent"), nothing imported: without accelerate,
    transformers refuses device_map= and the loads run on the CPU, then
    .to(device)."""
    import importlib.util
    from importlib import metadata
    out = []
    for name, module in packages:
        try:
            out.append(f"{name} {metadata.version(name)}")
            continue
        except metadata.PackageNotFoundError:
            pass
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        out.append(f"{name} {'importable' if found else 'absent'}")
    return ", ".join(out)


def cmd_host_info(a):
    """The interpreter, torch, the device, and whether it supports
    read-only host registration (the registered path needs it)."""
    import torch
    cuda = False
    try:
        cuda = torch.cuda.is_available()
    except Exception:
        pass
    print("python", sys.version.split()[0], "torch", torch.__version__, "(CUDA runtime",
          f"{torch.version.cuda})", "cuda", cuda and torch.cuda.get_device_name(0),
          file=sys.stderr)
    print("packages:", package_versions(), file=sys.stderr)
    if cuda:
        try:
            torch.empty(1, device="cuda:0")  # a context, so libcudart is loaded and answers
        except Exception:
            pass
    try:
        answer, how = read_only_registration(torch) if cuda else ("unknown", "no CUDA device")
    except Exception as e:  # whatever happens, the run goes on
        answer, how = "unknown", f"{type(e).__name__}: {e}"
    print(f"read-only host registration (cudaDevAttrHostRegisterReadOnlySupported): "
          f"{answer} ({how})", file=sys.stderr)
    return 0


# ---- the model ----

def layout(total):
    """[(name, dtype, shape)] of a model of at least total bytes of tensor
    data (issue 23 asks for at least 8 GiB): per layer a big BF16 matrix, a
    smaller one, a norm vector (F32), and every 16th layer a 3-byte I8
    tensor that leaves the next tensor misaligned. The layer count is
    rounded up, and counts the layers without the I8 tensor, so the sum
    never falls short (it fell 14 MB short of 8 GiB when it was rounded
    down)."""
    big, small = (6144, 4096), (2048, 2048)
    if total < GIB:  # the CPU mode's small models
        big, small = (512, 256), (256, 128)
    per_layer = 2 * (big[0] * big[1] + small[0] * small[1]) + 4 * 4096
    out = []
    for i in range(max(1, -(-total // per_layer))):
        out.append((f"layers.{i}.big", "BF16", big))
        if i % 16 == 0:  # now and then a tensor that misaligns the next one
            out.append((f"layers.{i}.odd", "I8", (3,)))
        out += [(f"layers.{i}.norm", "F32", (4096,)), (f"layers.{i}.small", "BF16", small)]
    return out


DTYPE_SIZE = {"BF16": 2, "F32": 4, "I8": 1}


def tensor_bytes(dtype, shape):
    n = DTYPE_SIZE[dtype]
    for d in shape:
        n *= d
    return n


def layout_bytes(tensors):
    """The bytes of tensor data in a layout()."""
    return sum(tensor_bytes(dtype, shape) for _, dtype, shape in tensors)


def read_header(path):
    """(header dict, offset of the data) of a safetensors file, read with
    Python alone: the steps that need no libwcache (making model.pt,
    checking upstream's and torch.load's tensors) run where it cannot load."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


def read_tensor(torch, f, base, entry):
    """A tensor of its own (not a view of a mapping) with the bytes of one
    header entry, read from the open file f whose data starts at base."""
    dtype = {"BF16": torch.bfloat16, "F32": torch.float32, "I8": torch.int8}[entry["dtype"]]
    a, b = entry["data_offsets"]
    t = torch.empty(entry["shape"], dtype=dtype)
    raw = t.reshape(-1).view(torch.uint8)
    # os.preadv at its offset: callers on several threads share f
    view, done = memoryview(raw.numpy()), 0
    while done < b - a:
        got = os.preadv(f.fileno(), [view[done:]], base + a + done)
        if got <= 0:
            raise SystemExit(f"{f.name}: short read")
        done += got
    return t


def _workers():
    """Threads for making the model: the file's writes and reads let go of
    the GIL, so they run at once (the H200 host has 16 cores)."""
    return max(1, min(8, os.cpu_count() or 1))


def _write_tensor(fd, base, k, n, block):
    """Writes tensor k's n bytes at base: block's bytes (again and again),
    from a place in it of tensor k's own (an even one: the block's 16-bit
    values stay whole), the first 4 of them (fewer where n is) the tensor's
    number k, so that no two tensors are alike, and bytes moved from one
    place of the model to another are not the same bytes (the check
    compares page sums: check_state). os.pwrite: no file position shared
    among threads, and no copy of block to change those 4 bytes."""
    prefix = k.to_bytes(4, "little")[:min(n, 4)]
    os.pwrite(fd, prefix, base)
    done = len(prefix)
    phase = k * 2 * 1000003 % len(block)
    while done < n:
        lo = (done + phase) % len(block)
        m = min(n - done, len(block) - lo)
        done += os.pwrite(fd, memoryview(block)[lo:lo + m], base + done)


def cmd_gen(a):
    """Writes model.safetensors (and model.pt for torch.load) in a.dir,
    the tensors written (and read back for model.pt) on _workers()
    threads; model.pt without its zip records' CRC32 where torch can
    (set_crc32_options: torch.save computes it on one thread, and
    torch.load does not need it)."""
    import numpy as np
    from concurrent.futures import ThreadPoolExecutor
    tensors = layout(int(a.gib * GIB))
    header, off = {}, 0
    for name, dtype, shape in tensors:
        n = tensor_bytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    # bf16 values of small magnitude (no NaN, so equality checks hold):
    # a random block, its words masked to 0x3f.. patterns, reused from a
    # different place and with a different prefix per tensor; 64 MiB, more
    # than the largest tensor, so that no tensor repeats itself
    rng = np.random.default_rng(1)
    block = (rng.integers(0, 1 << 16, 32 * MIB, dtype=np.uint16) & 0x3fff).view(np.uint8)
    path = os.path.join(a.dir, "model.safetensors")
    base = 8 + len(text)
    t0 = time.monotonic()
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.pwrite(fd, len(text).to_bytes(8, "little") + text, 0)
        with ThreadPoolExecutor(_workers()) as pool:
            for done in [pool.submit(_write_tensor, fd, base + header[name]["data_offsets"][0],
                                     k, tensor_bytes(dtype, shape), block)
                         for k, (name, dtype, shape) in enumerate(tensors)]:
                done.result()
    finally:
        os.close(fd)
    os.rename(path + ".tmp", path)
    log(f"  {path}: {off / GIB:.2f} GiB, {len(tensors)} tensors, "
        f"{time.monotonic() - t0:.1f} s on {_workers()} threads")
    if a.pt:  # read with Python, not libwcache: torch.load's row needs no wcache
        import torch
        t0 = time.monotonic()
        header, base = read_header(path)
        with open(path, "rb", buffering=0) as f, ThreadPoolExecutor(_workers()) as pool:
            state = dict(zip([name for name, _, _ in tensors], pool.map(
                lambda name: read_tensor(torch, f, base, header[name]),
                [name for name, _, _ in tensors])))
        crc = getattr(torch.serialization, "set_crc32_options", None)
        if crc is not None:
            crc(False)
        torch.save(state, os.path.join(a.dir, "model.pt"))
        log(f"  model.pt: {time.monotonic() - t0:.1f} s"
            f"{'' if crc is not None else ' (with CRC32: this torch cannot leave it out)'}")


def cmd_warm(a):
    """Reads each file once, so it is in the page cache."""
    for path in a.files:
        t0, n = time.monotonic(), 0
        with open(path, "rb", buffering=0) as f:
            buf = bytearray(16 * MIB)
            while True:
                got = f.readinto(buf)
                if not got:
                    break
                n += got
        log(f"  {path}: {n / GIB:.2f} GiB read in {time.monotonic() - t0:.1f} s")


# ---- wcached ----

def shm_stage_dir(a):
    """The stage_dir in /dev/shm of the wcached of work directory a.dir,
    where that directory's filesystem is refused for one (cmd_daemon)."""
    return os.path.join("/dev/shm", f"wcached-stage-{os.path.basename(os.path.realpath(a.dir))}")


def cmd_daemon(a):
    """start: wcached serving every file given (name = its path), its pid
    in <dir>/wcached.pid; stop: SIGTERM to that pid."""
    pidfile = os.path.join(a.dir, "wcached.pid")
    if a.action == "stop":
        if os.path.exists(pidfile):
            pid = int(open(pidfile).read())
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            os.unlink(pidfile)
        with contextlib.suppress(OSError):  # start's stage_dir in /dev/shm, if any (empty)
            os.rmdir(shm_stage_dir(a))
        return
    from wcached import Wcached, WcachedError
    # stage = no: the bench measures copies from the page cache of the file
    # itself. Where the work directory looks remote (a gVisor sandbox's
    # gofer files report 9p), the default stage = auto would copy each model
    # to stage_dir first, or fail for want of one.
    models = {f"m{i}": (os.path.realpath(p), {"stage": "no"}) for i, p in enumerate(a.files)}
    # The libraries of the tree run.sh chose (a carried libuv, inih) are
    # wcached's alone: on LD_LIBRARY_PATH for every process they could
    # stand in for a newer copy that torch or another library loads.
    env = dict(os.environ)
    lib = os.path.join(os.environ.get("WCACHE_BUILD", ""), "lib")
    if os.environ.get("WCACHE_BUILD") and os.path.isdir(lib):
        env["LD_LIBRARY_PATH"] = lib + (":" + env["LD_LIBRARY_PATH"]
                                        if env.get("LD_LIBRARY_PATH") else "")
    # A stage_dir of its own: run.sh runs two at once, and the second would
    # warn (in the saved log) that the shared default one is locked by the
    # first; where it cannot write the default, each would warn of that.
    stage_dir = os.path.join(os.path.realpath(a.dir), "stage")
    try:
        d = Wcached(a.dir, models, f"stage_dir = {stage_dir}\n",
                    log_level="info").start(env=env, timeout=120)
    except WcachedError as e:
        # wcached refuses a stage_dir on a filesystem it takes for a network
        # or FUSE one (README, "Staging"), as a gVisor sandbox's gofer files
        # are (9p): one in /dev/shm (tmpfs) then, removed by stop.
        if "stage_dir must be on a local filesystem" not in str(e):
            raise
        stage_dir = shm_stage_dir(a)
        log(f"  stage_dir {os.path.join(os.path.realpath(a.dir), 'stage')} refused (not "
            f"local): {stage_dir} instead")
        d = Wcached(a.dir, models, f"stage_dir = {stage_dir}\n",
                    log_level="info").start(env=env, timeout=120)
    with open(pidfile, "w") as f:
        f.write(str(d.proc.pid))
    d.proc = None  # outlives this process; run.sh stops it
    log(f"  wcached pid {open(pidfile).read()} on {d.socket}, {len(models)} model(s)")


# ---- the ways into the device ----

def _sync(torch, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _cpu_engine():
    """--cpu: the engine's device is wcache._device.CpuBackend.
    GPUBENCH_REFUSE: a reason it refuses registration with.
    GPUBENCH_PIN_DELAY, GPUBENCH_PIN_SERIAL: see below.
    GPUBENCH_SHARED_VIEWS=1: it pins long-term, as CUDA does, so the engine
    registers shared views of the file, not the model's private mapping.
    GPUBENCH_COW=1: each registration does what Linux 6.2+ does at a
    long-term pin of a private file mapping: every page of the range is
    copied into the process (made writable, each byte written back, made
    read-only again); a shared view cannot be, and stays the page cache,
    its pages made present (read) as a pin makes them. (Without it the
    backend touches nothing: its pages are not present when read, and the
    target is n/a.)
    So the tests can show that the page-cache target fails when
    registration copies."""
    from wcache import _device
    refuse = os.environ.get("GPUBENCH_REFUSE") or None
    long_term = os.environ.get("GPUBENCH_SHARED_VIEWS") == "1"
    _device.backend_for = lambda device: _device.CpuBackend(refuse=refuse,
                                                            pins_long_term=long_term)
    # "cuda:0" is no device torch can .to() here: the tensors to_device
    # would copy plainly (under SMALL_COPY in all: a get_tensor loop's
    # small ones) go through the engine too, as tests/python/conftest.py's
    # cpu_device has them.
    defaults = _device.to_device.__defaults__
    if defaults[-1] != _device.SMALL_COPY:
        raise SystemExit("gpubench: to_device's last default is no longer small=SMALL_COPY")
    _device.to_device.__defaults__ = defaults[:-1] + (0,)
    # A registration that takes time (GPUBENCH_PIN_DELAY seconds each, the
    # GIL let go as torch's binding does), one at a time where
    # GPUBENCH_PIN_SERIAL=1 (a driver that serialises pinning): so the
    # tests can show register-threads telling parallel from serial.
    delay = float(os.environ.get("GPUBENCH_PIN_DELAY") or 0)
    if delay > 0:
        import threading
        serial = threading.Lock() if os.environ.get("GPUBENCH_PIN_SERIAL") == "1" else None
        slow = _device.CpuBackend.register

        def register_slowly(self, addr, nbytes):
            if serial is None:
                time.sleep(delay)
            else:
                with serial:
                    time.sleep(delay)
            return slow(self, addr, nbytes)
        _device.CpuBackend.register = register_slowly
    if os.environ.get("GPUBENCH_COW") == "1":
        real = _device.CpuBackend.register

        def register(self, addr, nbytes):
            owned = real(self, addr, nbytes)
            _unshare(addr, nbytes)
            return owned
        _device.CpuBackend.register = register


def _unshare(addr, nbytes):
    """Copies [addr, addr + nbytes) into private pages where the mapping
    allows it (a private mapping): one byte of each page written back as it
    is (a write fault copies the page); a shared mapping of a read-only
    file refuses PROT_WRITE (EACCES), and its pages are read instead,
    which maps them present and shared, as the pin does."""
    import ctypes
    import numpy as np
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    read, write = 1, 2  # PROT_READ, PROT_WRITE
    pages = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(addr))[::PAGE]
    if libc.mprotect(addr, nbytes, read | write) != 0:
        int(pages.sum())  # read faults: the page cache's pages, mapped
        return
    try:
        pages[:] = pages.copy()
    finally:
        libc.mprotect(addr, nbytes, read)


def anon_bytes(ranges):
    """Bytes of private (anonymous) pages in this process's mappings that
    overlap ranges [(start, end)], from /proc/self/smaps ("Anonymous:" of
    each such mapping)."""
    total, hit = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):
                a, b = (int(x, 16) for x in head.split("-"))
                hit = any(a < hi and lo < b for lo, hi in ranges)
            elif hit and head == "Anonymous:":
                total += int(line.split()[1]) * 1024
    return total


class _Watch:
    """What a hook measured (items). No timed load is watched: the
    measuring runs inside the load (on the engine's register threads, among
    its copies), where no subtraction can take it out again."""

    def __init__(self):
        self.items = []


PAGE = 4096


def private_pages(lo, hi, pagemap="/proc/self/pagemap"):
    """(pages present, pages that are this process's own) of [lo, hi), from
    /proc/self/pagemap: a page present and not "file-page or shared-anon"
    (bit 61) is an anonymous page of this process alone, which in a file
    mapping means a private copy of the file's page (copy-on-write). A page
    of the page cache, as a shared view or an untouched private mapping
    holds, is present and bit 61 is set. The flags are readable without
    privilege (only the frame numbers are hidden)."""
    import numpy as np
    first, n = lo // PAGE, (hi - lo + PAGE - 1) // PAGE
    with open(pagemap, "rb", buffering=0) as f:
        f.seek(first * 8)
        raw = f.read(n * 8)
    entries = np.frombuffer(raw, dtype=np.uint64)
    present = (entries >> np.uint64(63)) & np.uint64(1)
    shared = (entries >> np.uint64(61)) & np.uint64(1)
    return int(present.sum()), int((present & (shared ^ np.uint64(1))).sum())


def _watch_registrations(watch):
    """Records in watch, for every range a backend registers, while it is
    registered (after cudaHostRegister returned, before its copies): the
    bytes registered, how many of them are present and how many are this
    process's private copies (private_pages), whether the backend pins
    long-term (the engine then registers shared views), and why the
    pagemap could not be read (None where it could: a read that fails
    returns the registration all the same, so that the engine unregisters
    it, and the row says so instead of figures). That is what "registration
    left the page cache shared" asks of the memory registered itself,
    whichever mapping the engine registers (on CUDA a shared view, which
    the engine unmaps after the copy, so that reading the model's own
    mapping afterwards, as this did before, could never see a copy).
    The reads run inside the load, on the engine's register threads, so a
    watched load is never a timed one (cmd_bench: one more load, untimed).
    Returns what puts the backends' register back."""
    from wcache import _device
    reals = []
    for cls in (_device.CudaBackend, _device.CpuBackend):
        real = cls.register
        reals.append((cls, real))

        def register(self, addr, nbytes, real=real):
            owned = real(self, addr, nbytes)
            views = getattr(self, "pins_long_term", False)
            try:
                present, private = private_pages(addr, addr + nbytes)
            except Exception as e:  # registered: raising would leave it so, unknown
                watch.items.append((nbytes, None, None, views, f"{type(e).__name__}: {e}"))
                return owned
            watch.items.append((nbytes, present * PAGE, private * PAGE, views, None))
            return owned
        cls.register = register

    def restore():
        for cls, real in reals:
            cls.register = real
    return restore


def _registration_figures(items):
    """The row's figures from _watch_registrations' items: MiB registered,
    present and private (the copy-on-write the target judges), and views
    where every range was a shared view; where a pagemap read failed,
    "pagemap" says why in place of present and private."""
    if not items:
        return {}
    row = {"registered_mib": round(sum(i[0] for i in items) / MIB, 1)}
    failed = [i[4] for i in items if i[4] is not None]
    if failed:
        row["pagemap"] = f"unreadable ({failed[0]})"
    else:
        row.update(present_mib=round(sum(i[1] for i in items) / MIB, 1),
                   private_mib=round(sum(i[2] for i in items) / MIB, 1))
    if all(i[3] for i in items):
        row["views"] = True
    return row


def _check(torch, path, state, names=3):
    """The first, a middle and the last tensor (in the file's order) equal
    the file's bytes, read with Python (no libwcache: upstream's and
    torch.load's rows are checked where it cannot load). Where the model's
    checksums were not made (check_state)."""
    header, base = read_header(path)
    keys = sorted(header, key=lambda k: header[k]["data_offsets"][0])
    with open(path, "rb", buffering=0) as f:
        for name in {keys[0], keys[len(keys) // 2], keys[-1]}:
            want = read_tensor(torch, f, base, header[name])
            got = state[name].to("cpu")
            if got.dtype != want.dtype or not torch.equal(got.reshape(-1).view(torch.uint8),
                                                            want.reshape(-1).view(torch.uint8)):
                raise SystemExit(f"tensor {name!r}: bytes differ from the file")


CHECK_PIECE = 4096  # the bytes of one piece of tensor_sums


def tensor_sums(torch, raw):
    """[sum of the bytes, sum over the CHECK_PIECE-byte pieces of each
    piece's sum times its number (from 1)] of raw, a 1-D uint8 tensor on
    a device, as an int64 tensor there: a piece of bytes lost, doubled,
    zeroed or moved (a staging buffer refilled before its copy had read
    it, a range unregistered under its copy) changes one of them, and
    computing them is one pass over the bytes where they lie. array_sums
    computes the same integers on the CPU (torch's CPU sum of uint8 into
    int64 is ~50x slower than numpy's)."""
    n = raw.numel()
    whole = n // CHECK_PIECE * CHECK_PIECE
    pieces = raw[:whole].view(whole // CHECK_PIECE, CHECK_PIECE).sum(1, dtype=torch.int64)
    tail = raw[whole:].sum(dtype=torch.int64)
    number = torch.arange(1, pieces.numel() + 1, dtype=torch.int64, device=raw.device)
    return torch.stack([pieces.sum() + tail, (pieces * number).sum() + tail * (pieces.numel() + 1)])


def array_sums(a):
    """tensor_sums of a, a 1-D numpy uint8 array, as [int, int]."""
    import numpy as np
    whole = a.size // CHECK_PIECE * CHECK_PIECE
    pieces = a[:whole].reshape(whole // CHECK_PIECE, CHECK_PIECE).sum(1, dtype=np.int64)
    tail = int(a[whole:].sum(dtype=np.int64))
    number = np.arange(1, pieces.size + 1, dtype=np.int64)
    return [int(pieces.sum()) + tail, int((pieces * number).sum()) + tail * (pieces.size + 1)]


def sums_path(model):
    """Where cmd_sums keeps a model's checksums."""
    return model + ".sums.json"


def cmd_sums(a):
    """Writes array_sums of every tensor of the model, computed on the CPU
    from the file (its mapping: the page cache), once, for check_state; on
    _workers() threads (numpy's sums let go of the GIL)."""
    import numpy as np
    from concurrent.futures import ThreadPoolExecutor
    t0 = time.monotonic()
    header, base = read_header(a.model)
    data = np.memmap(a.model, dtype=np.uint8, mode="r")
    names = list(header)

    def sums(name):
        lo, hi = header[name]["data_offsets"]
        return array_sums(data[base + lo:base + hi])
    with ThreadPoolExecutor(_workers()) as pool:
        found = dict(zip(names, pool.map(sums, names)))
    with open(sums_path(a.model) + ".tmp", "w") as f:
        json.dump(found, f)
    os.rename(sums_path(a.model) + ".tmp", sums_path(a.model))
    log(f"  {sums_path(a.model)}: {len(found)} tensors in {time.monotonic() - t0:.1f} s on "
        f"{_workers()} threads")


def check_state(torch, path, state):
    """Checks state (a load of the model at path) against the file, outside
    the timing: every tensor's tensor_sums, computed where the tensor lies
    (the device), against those cmd_sums made from the file; where they
    were not made, the bytes of 3 tensors (_check). Returns what was
    checked, for the row; SystemExit naming the first tensor that differs."""
    try:
        with open(sums_path(path)) as f:
            want = json.load(f)
    except (OSError, ValueError) as e:
        _check(torch, path, state)
        return f"3 tensors (no checksums of the model: {type(e).__name__})"
    names = sorted(want)
    if sorted(state) != names:
        raise SystemExit(f"the load has {len(state)} tensors, the file {len(names)}")
    raws = [state[name].reshape(-1).view(torch.uint8) for name in names]
    on_device = [raw for raw in raws if raw.device.type != "cpu"]
    sums = iter(torch.stack([tensor_sums(torch, raw) for raw in on_device]).cpu().tolist()
                if on_device else [])  # one transfer for every tensor's sums
    got = [next(sums) if raw.device.type != "cpu" else array_sums(raw.numpy()) for raw in raws]
    for name, mine in zip(names, got):
        if mine != want[name]:
            raise SystemExit(f"tensor {name!r}: bytes differ from the file (sums {mine}, "
                             f"the file's {want[name]})")
    return f"all {len(names)} tensors"


def _engine_figures(engine):
    """The engine's why and its seconds registering, copying and
    unregistering (Engine.seconds), for a result row: one run then says
    why a path was slow or was not the one hoped for."""
    row = {"why": engine.why}
    row.update({f"{k}_s": round(v, 4) for k, v in engine.seconds.items()})
    return row


def _engines_copying(engines):
    """Records in engines every _device.Engine that copies from now on
    (its copy_plan called); returns what puts copy_plan back."""
    from wcache import _device
    real = _device.Engine.copy_plan

    def copy_plan(self, *args, **kwargs):
        engines.append(self)
        return real(self, *args, **kwargs)
    _device.Engine.copy_plan = copy_plan

    def restore():
        _device.Engine.copy_plan = real
    return restore


def _get_tensor_figures(engines, tensors):
    """(path, figures) of a get_tensor loop of tensors tensors, engines the
    Engines that copied (one per tensor through the engine; the others
    were copied plainly by .to(), to_device's path under SMALL_COPY): the
    paths taken ("tensor" among them for those), how many tensors went
    through the engine, their seconds summed by kind, and their reasons."""
    paths = {e.path for e in engines} | ({"tensor"} if len(engines) < tensors else set())
    figures = {"engine_tensors": len(engines)}
    if engines:
        figures.update({f"{k}_s": round(sum(e.seconds[k] for e in engines), 4)
                        for k in engines[0].seconds})
        figures["why"] = " | ".join(sorted({e.reason for e in engines if e.reason}))
    return ",".join(sorted(paths)), figures


def _load(method, a, torch, device):
    """One load by method; returns (state, path the engine took or "",
    the engine's figures for the row or {})."""
    target = "cuda:0" if a.cpu else str(device)
    if method == "upstream":
        import safetensors.torch
        return safetensors.torch.load_file(a.model, device=target if not a.cpu else "cpu"), \
            "", {}
    if method == "upstream_get_tensor":  # as loaders that ask tensor by tensor do
        from safetensors import safe_open
        with safe_open(a.model, framework="pt", device=target if not a.cpu else "cpu") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, "", {}
    if method == "torch_load":
        # weights_only=True: torch 2.6's default, said so for older ones (the
        # file holds tensors only)
        try:
            state = torch.load(a.pt, mmap=True, map_location="cpu", weights_only=True)
        except TypeError:  # torch < 2.1 (the CPU mode's old torch)
            state = torch.load(a.pt, map_location="cpu", weights_only=True)
        return {k: (v.to(device) if not a.cpu else v.clone()) for k, v in state.items()}, "", {}
    import wcache
    import wcache.torch
    from wcache import _device
    if method == "wcache_tensor":
        os.environ["WCACHE_DEVICE_COPY"] = "tensor"
        if a.cpu:
            return {k: v.clone() for k, v in wcache.torch.load_file(a.model).items()}, \
                "tensor", {}
        return wcache.torch.load_file(a.model, device=target), "tensor", {}
    os.environ["WCACHE_DEVICE_COPY"] = "staging" if method == "wcache_staging" else "auto"
    if method == "wcache_get_tensor":
        # one to_device per tensor: the engine for each (on the CPU: all),
        # .to() for those under SMALL_COPY
        engines = []
        restore = _engines_copying(engines)
        try:
            with wcache.safe_open(a.model, framework="pt", device=target) as f:
                state = {k: f.get_tensor(k) for k in f.keys()}
        finally:
            restore()
        return (state,) + _get_tensor_figures(engines, len(state))
    _device.last_load = None
    state = wcache.torch.load_file(a.model, device=target)
    engine = _device.last_load[0] if _device.last_load else None
    if engine is None:
        return state, "tensor", {}
    return state, engine.path, _engine_figures(engine)


def cmd_bench(a):
    """Times one method (best of a.reps) into the device; a JSON line."""
    import torch
    if a.cpu:
        _cpu_engine()
    device = torch.device("cpu" if a.cpu else "cuda:0")
    if device.type == "cuda":
        torch.empty(1, device=device)  # the context, outside the timing
    nbytes = os.path.getsize(a.model)
    # imports outside the timing (the concurrent loaders time one load)
    import importlib
    if a.method.startswith("wcache"):  # the others run where libwcache cannot load
        importlib.import_module("wcache.torch")
    if a.method == "upstream":
        importlib.import_module("safetensors.torch")
    if a.method == "upstream_get_tensor":
        importlib.import_module("safetensors")
    if a.method == "pinned":
        pinned_row(a, torch, device, nbytes)
        return
    if a.wait:
        with open(a.wait + ".ready." + str(os.getpid()), "w"):
            pass
        deadline = time.monotonic() + 120
        while not os.path.exists(a.wait):
            if time.monotonic() > deadline:
                raise SystemExit("no go signal in 120 s")
            time.sleep(0.001)
    # The timed loads are not watched: the pagemap reads would run inside
    # them (on the engine's register threads, overlapping one another and
    # the copies), and subtracting their sum made rows too fast, even
    # negative (rev134). The figures of what was registered come from one
    # more load, untimed (watched_load).
    best, path, starts, figures = None, "", [], {}
    for rep in range(a.reps):
        t0 = time.perf_counter()
        wall0 = time.time()
        state, path, engine = _load(a.method, a, torch, device)
        _sync(torch, device)
        dt = time.perf_counter() - t0
        starts.append((wall0, time.time()))
        if rep == 0:  # outside the timing: every tensor, where checksums were made
            first = dt
            checked = check_state(torch, a.model, state)
        moved = sum(t.numel() * t.element_size() for t in state.values())
        tensors = len(state)
        del state
        if best is None or dt < best:
            best, figures = dt, dict(engine)
    row = dict(method=a.method + (f"@{a.tag}" if a.tag else ""), bytes=moved,
               seconds=round(best, 4), gbps=round(moved / best / 1e9, 2),
               first_s=round(first, 4), first_gbps=round(moved / first / 1e9, 2), path=path,
               start=starts[0][0], end=starts[0][1], checked=checked, **figures)
    if a.method.endswith("_get_tensor"):
        row.update(tensors=tensors, ms_per_tensor=round(best * 1000 / tensors, 4))
    # Only where the engine registered (a staged or per-tensor load pins
    # nothing), and not in the concurrent loaders (--wait): their extra
    # load would overlap the others' timed ones.
    if "register" in path and not a.wait:
        row.update(watched_load(a, torch, device))
    emit(a.results, **row)


def watched_load(a, torch, device):
    """The registration figures (_registration_figures) of one more load by
    a.method, untimed, with every registration watched."""
    watch = _Watch()
    restore = _watch_registrations(watch)
    try:
        state, _, _ = _load(a.method, a, torch, device)
        _sync(torch, device)
        del state
    finally:
        restore()
    return _registration_figures(watch.items)


def pinned_size(nbytes):
    """The bytes the pinned row pins and copies: the largest power of two
    at most nbytes. torch's caching host allocator rounds a pinned
    allocation up to a power of two (CachingHostAllocator.h, allocate():
    PowerOf2Ceil), so the model's 8.04 GiB would pin 16 GiB; GB/s does not
    depend on the size at these sizes."""
    return 1 << (max(1, nbytes).bit_length() - 1)


LINK_QUERY = "pcie.link.gen.current,pcie.link.width.current"


def link_while(copy, seconds=10.0, smi="nvidia-smi"):
    """What `nvidia-smi --query-gpu=LINK_QUERY` says while copy() runs again
    and again (at most seconds, then it is killed): the link as the copy
    has it, not as an idle GPU reports it (Gen 1 to save power). A string
    ("5, 16"; one line per GPU, joined by "; "), or one saying why none."""
    import shutil
    if shutil.which(smi) is None:
        return f"{smi}: not here"
    try:
        p = subprocess.Popen([smi, f"--query-gpu={LINK_QUERY}", "--format=csv,noheader"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as e:
        return f"{smi}: {e}"
    deadline, copies = time.monotonic() + seconds, 0
    while p.poll() is None and time.monotonic() < deadline:
        copy()
        copies += 1
    if p.poll() is None:
        p.kill()
        p.wait()
        return f"{smi}: no answer in {seconds:g} s"
    said = "; ".join(x.strip() for x in p.stdout.read().splitlines() if x.strip())
    p.stdout.close()
    if p.returncode != 0:
        return f"{smi}: exit {p.returncode}: {said[:200]}"
    if copies == 0:  # it answered before a copy ran: the link may have been idle
        return said + " (read before the copy ran)"
    return said


def pinned_row(a, torch, device, nbytes):
    """The limit: pinned anonymous memory into the device, pinned_size(nbytes)
    bytes (best of a.reps); and the PCIe link read while it copies."""
    size = pinned_size(nbytes)
    src = torch.empty(size, dtype=torch.uint8, pin_memory=device.type == "cuda")
    src.fill_(1)
    dst = torch.empty(size, dtype=torch.uint8, device=device)

    def copy():
        dst.copy_(src, non_blocking=True)
        _sync(torch, device)
    best = first = None
    for _ in range(a.reps):
        t0 = time.perf_counter()
        copy()
        dt = time.perf_counter() - t0
        best = dt if best is None or dt < best else best
        first = dt if first is None else first
    try:
        link = link_while(copy)
    except Exception as e:  # the row, whatever happens to the reading
        link = f"not read: {type(e).__name__}: {e}"
    emit(a.results, method="pinned", bytes=size, model_bytes=nbytes, seconds=round(best, 4),
         gbps=round(size / best / 1e9, 2), first_s=round(first, 4),
         first_gbps=round(size / first / 1e9, 2), link=link)


# What each concurrent loader holds on the device beside the model: its
# CUDA context (~0.5 GiB with torch 2.x's lazy module loading), the
# caching allocator's rounding and the check's sums. 1 GiB, and 2% of the
# model, is the margin; the free figure is read with the probe's own
# context alive, one context more of it. --cpu: 256 MiB, what a Python
# with torch keeps resident in the host memory that stands for the device.
LOADER_OVERHEAD = GIB
CPU_LOADER_OVERHEAD = 256 * MIB


def loader_bytes(model_bytes, overhead=LOADER_OVERHEAD):
    """The device memory one concurrent loader of a model of model_bytes
    is allowed for: the model, 2% of it, and overhead."""
    return model_bytes + model_bytes // 50 + overhead


def concurrent_fit(n, model_bytes, free, overhead=LOADER_OVERHEAD):
    """How many of n concurrent loaders to run with free bytes of device
    memory: n where n fit, else the most that fit, 0 where not even 2 do
    (then the step is skipped: one process is the new path's own row)."""
    fit = min(n, free // loader_bytes(model_bytes, overhead))
    return fit if fit >= 2 else 0


def device_free(cpu):
    """(free bytes of the device, where the figure came from), or (None,
    why it is unknown). GPUBENCH_TEST_DEVICE_FREE (bytes) is a test's
    figure; --cpu: the host's MemAvailable (host memory stands for the
    device); else torch.cuda.mem_get_info() in a process of its own, so
    that no context of this one stays on the device beside the loaders'."""
    fake = os.environ.get("GPUBENCH_TEST_DEVICE_FREE")
    if fake:
        return int(fake), "GPUBENCH_TEST_DEVICE_FREE, a test's figure"
    if cpu:
        gib = _available_gib()
        return (None, "no MemAvailable in /proc/meminfo") if gib is None else \
            (int(gib * GIB), "--cpu: the host's MemAvailable")
    try:
        p = subprocess.run([sys.executable, __file__, "device-memory"], capture_output=True,
                           text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return None, "torch.cuda.mem_get_info() did not answer in 60 s"
    if p.returncode != 0:
        said = (p.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"torch.cuda.mem_get_info() failed (exit {p.returncode}: {said[:200]})"
    try:
        free, total = map(int, p.stdout.split())
    except ValueError:
        return None, f"torch.cuda.mem_get_info() said {p.stdout.strip()[:200]!r}"
    return free, f"torch.cuda.mem_get_info(): {free / GIB:.1f} of {total / GIB:.1f} GiB free"


def cmd_device_memory(a):
    """Prints device 0's free and total bytes (torch.cuda.mem_get_info())."""
    import torch
    free, total = torch.cuda.mem_get_info(0)
    print(free, total)
    return 0


def cmd_concurrent(a):
    """a.n processes load at once (method new, through wcached); the
    aggregate is all bytes over first start to last end. Fewer (at least
    2) where a.n copies of the model do not fit the device's free memory
    (loader_bytes each), none where 2 do not: one line says so, and the
    row (method concurrent<a.n>) says how many ran ("processes") and why
    ("fit"), so that the report and its judge line name what ran."""
    overhead = CPU_LOADER_OVERHEAD if a.cpu else LOADER_OVERHEAD
    try:
        model_bytes = os.path.getsize(a.model)
        free, how = device_free(a.cpu)
    except OSError as e:  # the loaders say what became of the model
        free, how = None, f"{a.model}: {e.strerror}"
    n, fit = a.n, ""
    if free is None:
        log(f"{a.n} processes at once: not checked against the device's free memory "
            f"({how}): running {a.n}")
    else:
        n = concurrent_fit(a.n, model_bytes, free, overhead)
        if n < a.n:
            fit = (f"{a.n} x {loader_bytes(model_bytes, overhead) / GIB:.2f} GiB (the model, "
                   f"its 2% and {overhead / GIB:g} GiB for each process's context) do not fit the "
                   f"device's {free / GIB:.2f} GiB free ({how}): ") + \
                (f"{n} processes instead" if n else "not even 2 do: skipped")
            log(f"{a.n} processes at once: {fit}")
    if n == 0:
        emit(a.results, method=f"concurrent{a.n}", processes=0, fit=fit)
        return 0
    go = os.path.join(a.dir, f"go.{os.getpid()}")
    tmp = a.results + ".concurrent"
    if os.path.exists(tmp):
        os.unlink(tmp)
    args = [sys.executable, __file__] + (["--cpu"] if a.cpu else []) + [
        "bench", "--method", "wcache", "--model", a.model, "--results", tmp, "--reps", "1",
        "--wait", go, "--tag", "concurrent"]
    procs = [subprocess.Popen(args) for _ in range(n)]
    deadline = time.monotonic() + 300
    while len([f for f in os.listdir(a.dir) if f.startswith(os.path.basename(go) + ".ready.")]) \
            < n:
        if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
            for p in procs:
                p.kill()
            for p in procs:
                p.wait()
            raise SystemExit("a concurrent loader failed before starting")
        time.sleep(0.01)
    open(go, "w").close()
    codes = [p.wait() for p in procs]  # every one, not up to the first that failed
    if any(codes):
        raise SystemExit(f"a concurrent loader failed (exit codes {codes})")
    rows = [json.loads(line) for line in open(tmp)]
    total = sum(r["bytes"] for r in rows)
    span = max(r["end"] for r in rows) - min(r["start"] for r in rows)
    # each process's first and only load: first is the row itself
    row = dict(method=f"concurrent{a.n}", processes=n, bytes=total, seconds=round(span, 4),
               gbps=round(total / span / 1e9, 2), first_s=round(span, 4),
               first_gbps=round(total / span / 1e9, 2),
               path=",".join(sorted({r["path"] for r in rows})))
    if fit:
        row["fit"] = fit
    for key in ("registered_mib", "present_mib", "private_mib"):  # per process, the most
        if any(key in r for r in rows):
            row[key] = max(r.get(key, 0) for r in rows)
    for key in ("view_s", "register_s", "copy_s", "unregister_s"):  # the slowest process's
        if any(key in r for r in rows):
            row[key] = max(r.get(key, 0) for r in rows)
    whys = sorted({r["why"] for r in rows if r.get("why")})
    if whys:
        row["why"] = " | ".join(whys)
    row["checked"] = " | ".join(sorted({r.get("checked", "nothing") for r in rows}))  # each load's
    emit(a.results, **row)


def cmd_cpu_engine(a):
    """The engine's own cost on the CPU backend against one plain memcpy of
    the same bytes (the buffer faulted in first, best of a.reps): what the
    planning, batching and double buffering add, without a device."""
    import ctypes
    import torch
    import wcache
    from wcache import _device
    model = wcache.open_file(a.model)
    names = model.offset_keys()
    entries = []
    for name in names:
        info = model.info(name)
        size = torch.empty((), dtype=_dtype_of(torch, info.dtype)).element_size()
        entries.append((name, info.data, info.nbytes, size))
    p = _device.plan(entries)
    lo = min(e[1] for e in entries if e[2])
    rows = {}
    for label, backend, mode in (("plain memcpy", None, None),
                                 ("engine, registered path", _device.CpuBackend(), "auto"),
                                 ("engine, staging path", _device.CpuBackend(refuse="cpu"),
                                  "auto")):
        buf = torch.zeros(p.total, dtype=torch.uint8)
        best = None
        for _ in range(a.reps):
            t0 = time.perf_counter()
            if backend is None:
                ctypes.memmove(buf.data_ptr(), lo, p.copied)
            else:
                _device.Engine(backend, mode=mode).copy_plan(p, buf)
            dt = time.perf_counter() - t0
            best = dt if best is None or dt < best else best
        rows[label] = p.copied / best / 1e9
        print(f"{label:28} {rows[label]:7.2f} GB/s  ({p.copied / 1e6:.0f} MB, "
              f"{len(p.batches)} batches, {len(names)} tensors)")
    model.close()


# ---- registration: does the driver pin in parallel? ----

def register_ranges(lo, hi, count=8, size=256 * MIB):
    """count page-aligned ranges [(start, end)] of size bytes, back to back
    from the first page boundary at or after lo, inside [lo, hi) (the
    model's tensor data): where that holds less, each an equal share of
    it in whole pages. SystemExit when not a page each is left."""
    first = -(-lo // PAGE) * PAGE
    size = min(size, max(0, hi - first) // count // PAGE * PAGE)
    if size <= 0:
        raise SystemExit(f"register-threads: the model's data ({hi - lo} bytes) holds "
                         f"no {count} whole pages")
    return [(first + k * size, first + (k + 1) * size) for k in range(count)]


def register_pass(backend, files, ranges, threads):
    """Registers every range of ranges as the engine does (backend.register;
    a shared view of it made through files, a MappingFiles, where the
    backend pins long-term, else the range itself), split among threads
    threads started together (thread k takes ranges k, k + threads, ...),
    then unregisters each from this thread. Returns a dict: seconds (from
    the threads' start to the last one's end), unregister_s, threads_used
    (the threads a registration returned on), and refused (the reason)
    where a registration was refused (RegisterRefused: the ranges
    registered before are unregistered). Making and unmapping the views is
    outside the times. Any other error is raised, after the cleanup."""
    import threading
    from wcache._device import RegisterRefused
    views, owned, errors, idents = [], [], [], set()
    lock = threading.Lock()
    out = {}
    try:
        addrs = []
        for lo, hi in ranges:
            if backend.pins_long_term:
                views.append(files.view(lo, hi))
                addrs.append((views[-1].addr, hi - lo))
            else:
                addrs.append((lo, hi - lo))
        gate = threading.Barrier(threads + 1, timeout=60)

        def work(share):
            gate.wait()
            for addr, n in share:
                try:
                    mine = backend.register(addr, n)
                except Exception as e:
                    with lock:
                        errors.append(e)
                    return
                with lock:
                    idents.add(threading.get_ident())
                    if mine:
                        owned.append(addr)
                    else:  # a view mapped just now: a stale registration (the engine's rule)
                        errors.append(RegisterRefused(
                            f"{backend.name}: a view mapped just now is already registered"))
                        return
        workers = [threading.Thread(target=work, args=(addrs[k::threads],))
                   for k in range(threads)]
        for w in workers:
            w.start()
        gate.wait()
        t0 = time.perf_counter()
        for w in workers:
            w.join()
        out["seconds"] = time.perf_counter() - t0
        out["threads_used"] = len(idents)
    finally:
        t0 = time.perf_counter()
        try:
            for addr in owned:
                backend.unregister(addr)
        finally:
            out["unregister_s"] = time.perf_counter() - t0
            for view in views:
                view.close()
    other = [e for e in errors if not isinstance(e, RegisterRefused)]
    if other:
        raise other[0]
    if errors:
        out["refused"] = str(errors[0])
    return out


def cmd_register_threads(a):
    """Registers a.count ranges of a.mib MiB of the model's mapping
    (register_ranges) on 1 thread, then on a.threads, a.reps times each
    in turn (fresh views each time, so no pass finds pages a former one
    faulted in), unregistering after each pass; one JSON line with the
    best seconds of each, their ratio (a.threads when the driver pins in
    parallel, 1 when it serialises) and GB/s pinned."""
    import torch
    import wcache
    from wcache import _device
    if a.cpu:
        _cpu_engine()
    device = torch.device("cpu" if a.cpu else "cuda:0")
    if device.type == "cuda":
        torch.empty(1, device=device)  # the context, outside the timing
    backend = _device.backend_for(torch.device("cuda:0"))
    model = wcache.open_file(a.model)
    table = model._tab()
    ranges = register_ranges(*table.span, count=a.count, size=a.mib * MIB)
    files = _device.mapping_files(model._h(), table.span) if backend.pins_long_term else None
    nbytes = sum(hi - lo for lo, hi in ranges)
    from wcache._sharedview import Unavailable
    row = {"method": "register_threads", "backend": backend.name, "ranges": len(ranges),
           "range_mib": round((ranges[0][1] - ranges[0][0]) / MIB, 2), "bytes": nbytes,
           "threads": a.threads, "views": bool(backend.pins_long_term)}
    best = {}
    for _ in range(a.reps):
        for threads in (1, a.threads):
            try:
                got = register_pass(backend, files, ranges, threads)
            except Unavailable as e:  # where the engine would stage
                got = {"refused": f"no shared view to register: {e}"}
            if "refused" in got:
                row["refused"] = got["refused"]
                emit(a.results, **row)
                return
            b = best.get(threads)
            if b is None or got["seconds"] < b["seconds"]:
                best[threads] = got
    if getattr(backend, "registered", None):  # the CPU backend's registry: all undone
        raise SystemExit(f"register-threads: {len(backend.registered)} ranges left registered")
    one, many = best[1], best[a.threads]
    row.update(seconds_1=round(one["seconds"], 6), seconds_n=round(many["seconds"], 6),
               unregister_s_1=round(one["unregister_s"], 6),
               unregister_s_n=round(many["unregister_s"], 6),
               gbps_1=round(nbytes / one["seconds"] / 1e9, 2),
               gbps_n=round(nbytes / many["seconds"] / 1e9, 2),
               ratio=round(one["seconds"] / many["seconds"], 2),
               threads_used=many["threads_used"])
    emit(a.results, **row)
    model.close()


def _dtype_of(torch, st_dtype):
    from wcache._dtypes import torch_dtype
    return torch_dtype(torch, st_dtype)


# ---- transformers ----

def cmd_llama_make(a):
    """A Llama model with random weights, saved in safetensors shards."""
    import torch
    import transformers
    if a.tiny:
        cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2,
                                       vocab_size=512)
    else:  # about 1.0e9 parameters
        cfg = transformers.LlamaConfig(hidden_size=2048, intermediate_size=5632,
                                       num_hidden_layers=20, num_attention_heads=32,
                                       num_key_value_heads=8, vocab_size=32000,
                                       tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(a.dir, **_save_arguments(model.save_pretrained,
                                                   "64KB" if a.tiny else "500MB"))
    shards = sorted(f for f in os.listdir(a.dir) if f.endswith(".safetensors"))
    log(f"  {a.dir}: {n / 1e9:.3f} B parameters, {len(shards)} shards")


def _save_arguments(save_pretrained, shard):
    """save_pretrained's keyword arguments for safetensors shards of at most
    shard: safe_serialization=True only where the signature has it.
    transformers 5 removed it (safetensors is all it writes) and takes
    **kwargs, which it hands to the hub when pushing: an argument it no
    longer knows is not an error to catch, it is passed along or ignored."""
    import inspect
    arguments = {"max_shard_size": shard}
    try:
        parameters = inspect.signature(save_pretrained).parameters
    except (TypeError, ValueError):  # no signature to read: the default is safetensors
        parameters = {}
    if "safe_serialization" in parameters:
        arguments["safe_serialization"] = True
    return arguments


def _watch_handles(watch):
    """Keeps in watch, once per safe_open handle, right after its first
    get_tensor (where WCACHE_HOST_REGISTER=1 registers it): whether it
    holds a registration, its model's table, and its model's handle, which
    keeps the mapping (and any private pages pinning made in it) until
    _handle_figures() has looked, after the timing. At registration, not at
    close: a loader may leave its handles to the garbage collector."""
    import threading
    import weakref
    import wcache._safe_open as so
    real = so.safe_open._register_host
    seen, lock = weakref.WeakSet(), threading.Lock()

    def register(self, runs):
        real(self, runs)
        with lock:
            if self in seen:
                return
            seen.add(self)
            model = self.model
            watch.items.append((self._host_state == so._HOST_HELD, model._tab(), model._h()))
    so.safe_open._register_host = register


def _handle_figures(watch):
    """(handles, registered, data bytes, bytes present or why the pagemap
    could not be read (str), private bytes, seconds unmapping) of the
    handles _watch_handles kept; then lets their mappings go, timed:
    without the watch they would have gone at transformers' close, inside
    the load's timing, as upstream's mappings go in the plain load's, so
    the load's seconds count them (cmd_llama_load)."""
    from wcache import _hostreg
    registered = nbytes = present = private = 0
    for item in watch.items:  # (not unpacked: a name left bound would keep a handle)
        ranges = _hostreg.host_ranges(item[1])
        registered += item[0]
        nbytes += sum(hi - lo for lo, hi in ranges)
        try:
            if not isinstance(present, str):
                present += sum(private_pages(lo, hi)[0] for lo, hi in ranges) * PAGE
        except Exception as e:
            present = f"{type(e).__name__}: {e}"
        private += anon_bytes(ranges)
    n = len(watch.items)
    item = None
    t0 = time.perf_counter()
    watch.items.clear()  # the last references to the handles: their mappings go
    return n, registered, nbytes, present, private, time.perf_counter() - t0


# What from_pretrained imports on first use (transformers imports lazily):
# imported before the timing, in every mode alike, so the load times are
# loads, not imports.
LOADING_MODULES = ("transformers.modeling_utils", "transformers.models.llama.modeling_llama",
                   "transformers.core_model_loading", "transformers.integrations.accelerate",
                   "safetensors", "safetensors.torch", "accelerate")


def _import_loading_code(transformers):
    """Imports the model code from_pretrained would import on its first
    call (AutoModelForCausalLM, LlamaForCausalLM and LOADING_MODULES, each
    where this version has it) and logs how long that took."""
    import importlib
    t0, done = time.perf_counter(), []
    for name in ("AutoModelForCausalLM", "LlamaForCausalLM", "LlamaConfig", "AutoConfig"):
        try:
            getattr(transformers, name)  # resolves the lazy module behind it
            done.append(name)
        except Exception:  # absent in this version: nothing to import
            pass
    for name in LOADING_MODULES:
        try:
            importlib.import_module(name)
            done.append(name)
        except Exception:
            pass
    log(f"  imported before the timing ({time.perf_counter() - t0:.2f} s): {', '.join(done)}")


class _DeferredCloses:
    """While it is in place, wcache's safe_open.__exit__ (what transformers
    calls to close its handles) only records the handle; run() puts
    __exit__ back and closes them all."""

    def __init__(self):
        import wcache._safe_open as so
        self.cls, self.real, self.handles = so.safe_open, so.safe_open.__exit__, []

        def later(handle, *exc):
            self.handles.append(handle)
        self.cls.__exit__ = later

    def run(self):
        self.cls.__exit__ = self.real
        handles, self.handles = self.handles, []
        for handle in handles:
            handle.close()


def cmd_llama_load(a):
    """from_pretrained plainly or through wcache (wcache_hostreg: with
    WCACHE_HOST_REGISTER=1, which the caller sets); logits of a fixed input
    saved to a.out; the load time as a JSON line."""
    import torch
    watch = _Watch()
    if a.mode == "wcache_hostreg" and os.environ.get("WCACHE_HOST_REGISTER") != "1":
        raise SystemExit("llama-load --mode wcache_hostreg: set WCACHE_HOST_REGISTER=1 "
                         "(run.sh does)")
    if a.mode != "plain":
        import wcache
        import wcache._safe_open as so
        from wcache import _device, _hostreg
        if a.mode == "wcache":
            # Through WCACHE_SAFETENSORS=1 alone: the import hook that
            # wcache-safetensors.pth registered at start-up (main's --site)
            # patches safetensors when transformers imports it.
            hook = _pth_hook_state()
        else:
            wcache.install()
            hook = "wcache.install()"
        sources = []
        real = so.open_model

        def recording(path):
            m = real(path)
            sources.append(m.source)
            return m
        so.open_model = recording
        _watch_handles(watch)
        if a.cpu:  # host registration on the engine's CPU backend
            _hostreg.host_backend = lambda: (_device.CpuBackend(), None)
    import transformers
    _import_loading_code(transformers)
    device = "cpu" if a.cpu else "cuda:0"
    if device != "cpu":
        torch.empty(1, device=device)
    how, closes = "device_map", None
    t0 = time.perf_counter()
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(a.dir, device_map=device,
                                                                  dtype=torch.bfloat16)
    except (ImportError, ValueError) as e:
        if "accelerate" not in str(e):
            raise
        # device_map needs accelerate (transformers 4.x and 5.x raise ValueError
        # naming it): load on the CPU, then move (every mode alike).
        how = "on the CPU, then .to(device): device_map needs accelerate"
        if a.mode == "wcache_hostreg":
            # transformers closes its handles before from_pretrained returns,
            # which would undo their registrations before .to() copies: the
            # closes wait until after the copies (inside the timing), as
            # they would with device_map=, whose copies come before them.
            closes = _DeferredCloses()
            how += "; handles closed after .to(), as with device_map="
        t0 = time.perf_counter()
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                a.dir, dtype=torch.bfloat16).to(device)
            if device != "cpu":
                torch.cuda.synchronize()
        finally:
            if closes is not None:
                held = len(_hostreg.host_registrations())
                closes.run()
    if device != "cpu":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    ids = torch.arange(1, 33, device=device).reshape(1, 32) % model.config.vocab_size
    with torch.no_grad():
        logits = model(ids).logits.float().cpu()
    torch.save(logits, a.out)
    row = {"method": f"transformers_{a.mode}", "seconds": round(dt, 3), "how": how}
    if a.mode != "plain":
        row["hook"] = hook
        row["sources"] = ",".join(sorted(set(sources))) or "none"
        n, registered, nbytes, present, private, unmap = _handle_figures(watch)
        # the unmapping the watch held back, counted as the plain load's is
        row.update(seconds=round(dt + unmap, 3), unmap_s=round(unmap, 4),
                   registered=registered, handles=n, mib=round(nbytes / MIB, 1),
                   private_mib=round(private / MIB, 1))
        if isinstance(present, str):
            row["pagemap"] = f"unreadable ({present})"
        else:
            row["present_mib"] = round(present / MIB, 1)
        if closes is not None:
            row["held_at_copy"] = held  # ranges registered while .to() copied
    emit(a.results, **row)


PTH = "wcache-safetensors.pth"


def add_site(directory):
    """Processes directory as Python does site-packages at start-up
    (site.addsitedir: its .pth files run), before anything has imported
    safetensors: with wcache-safetensors.pth there (what the python3-wcache
    package installs in dist-packages), WCACHE_SAFETENSORS=1 acts as on a
    host where the package is installed. Raises SystemExit when the .pth is
    missing or safetensors was imported first (the hook would then have
    nothing to catch)."""
    import site
    if not os.path.exists(os.path.join(directory, PTH)):
        raise SystemExit(f"--site {directory}: no {PTH} there")
    if "safetensors" in sys.modules:
        raise SystemExit(f"--site {directory}: safetensors was imported before the .pth ran")
    site.addsitedir(directory)


def _pth_hook_state():
    """How safetensors will be patched in this process: the .pth's import
    hook, or a SystemExit saying why it is not there (the variable unset or
    not 1, no --site, or the .pth not run)."""
    from wcache import _install
    if not any(isinstance(f, _install._Hook) for f in sys.meta_path):
        raise SystemExit(f"llama-load --mode wcache: no import hook from {PTH} in this "
                         f"process (WCACHE_SAFETENSORS={os.environ.get('WCACHE_SAFETENSORS')!r}; "
                         f"run.sh passes --site with the .pth and sets it to 1)")
    return f"WCACHE_SAFETENSORS=1 ({PTH})"


def cmd_llama_compare(a):
    import torch
    x, y = torch.load(a.a, weights_only=True), torch.load(a.b, weights_only=True)
    equal = bool(torch.equal(x, y))
    emit(a.results, method="logits" + (f"_{a.tag}" if a.tag else ""), equal=equal,
         max_abs_diff=float((x - y).abs().max()) if x.shape == y.shape else None)


# ---- the report ----

def targets(rows):
    """[(label, PASS/MISS/n/a, detail)] from the result rows."""
    by = {r["method"]: r for r in rows}

    def gbps(m):
        return by[m].get("gbps") if m in by else None
    limit, new, up, conc = gbps("pinned"), gbps("wcache"), gbps("upstream"), gbps("concurrent4")
    out = []

    def judge(label, ok, detail):
        out.append((label, "n/a" if ok is None else ("PASS" if ok else "MISS"), detail))
    judge("new path >= 0.8x pinned limit", None if new is None or limit is None
          else new >= 0.8 * limit, f"{new} vs {limit} GB/s")
    judge("new path >= 2x upstream safetensors", None if new is None or up is None
          else new >= 2 * up, f"{new} vs {up} GB/s")
    # Where 4 did not fit the device, the line names what ran, and why.
    c = by.get("concurrent4", {})
    ran, fit = c.get("processes", 4), c.get("fit")
    if ran == 0:
        judge("4 processes together >= 0.8x limit", None, f"skipped: {fit}")
    else:
        judge(f"{ran} processes together" + ("" if ran == 4 else " (4 do not fit the device)")
              + " >= 0.8x limit", None if conc is None or limit is None
              else conc >= 0.8 * limit, f"{conc} vs {limit} GB/s" + (f"; {fit}" if fit else ""))
    for suffix, label in (("", "transformers"),
                          ("_hostreg", "transformers + WCACHE_HOST_REGISTER=1")):
        lg = by.get("logits" + suffix)
        judge(f"{label} logits equal", None if lg is None else lg["equal"],
              "" if lg is None else f"max |diff| {lg['max_abs_diff']}")
    tw = by.get("transformers_wcache")
    judge("transformers loaded through wcached", None if tw is None
          else tw.get("sources") == "wcached", "" if tw is None else f"sources {tw['sources']}")
    th = by.get("transformers_wcache_hostreg")
    judge("transformers + WCACHE_HOST_REGISTER=1: every shard registered", None if th is None
          else th.get("sources") == "wcached" and th["registered"] == th["handles"] > 0,
          "" if th is None else f"{th['registered']} of {th['handles']} handles, "
                                f"sources {th['sources']}")
    # Registration must read the shared page cache, not make this process a
    # private copy of it (see the module comment): under 1% of what it read.
    # Judged only where something was registered (the engine's path says
    # "register", or handles registered): a staged load pins nothing, and
    # its 0 MiB would say nothing about registration.
    # The engine's rows measure the ranges it registered, while registered
    # (registered_mib, present_mib, private_mib: _watch_registrations); the
    # WCACHE_HOST_REGISTER=1 row the registered handles' mappings (mib,
    # present_mib), after the load. Judged only where (nearly) every page
    # was present when read, as a pin makes them: a page not present is
    # neither shared nor private, and 0 MiB private of nothing present
    # measured nothing (a driver that does not pin, a pagemap without
    # present bits, the CPU backend, which pins nothing).
    for key, label in (("wcache", "new path"),
                       ("transformers_wcache_hostreg", "WCACHE_HOST_REGISTER=1")):
        r = by.get(key)
        label += ": registration left the page cache shared"
        private = None if r is None else r.get("private_mib")
        size = None if r is None else r.get("registered_mib", r.get("mib"))
        present = None if r is None else r.get("present_mib")
        registered = r is not None and (r.get("registered_mib", 0) > 0
                                        or r.get("registered", 0) > 0)
        if r is not None and "pagemap" in r:
            judge(label, None, f"pagemap {r['pagemap']}: nothing measured")
        elif private is not None and not registered:
            judge(label, None, f"nothing registered (path {r.get('path') or '-'}, "
                               f"{r.get('registered', 0)} handles registered)")
        elif private is None or not size:
            judge(label, None, "")
        elif present is None or present < 0.99 * size:
            judge(label, None, f"pages not present when read: nothing measured ("
                               f"{'-' if present is None else present} MiB present of "
                               f"{size:.1f} MiB registered)")
        else:
            judge(label, private < 0.01 * size,
                  f"{private} MiB private of {size:.1f} MiB registered")
    return out


def engine_line(r):
    """The engine's figures of a row: where its time went and why it took
    its path ("register 0.012 s, copy 0.310 s, ...; why: ...")."""
    parts = [f"{k} {r[k + '_s']:.3f} s" for k in ("view", "register", "copy", "unregister")
             if k + "_s" in r]
    if "registered_mib" in r and "pagemap" in r:
        parts.append(f"registered {r['registered_mib']} MiB: pagemap {r['pagemap']}")
    elif "registered_mib" in r:  # the registered ranges, read while registered
        parts.append(f"registered {r['registered_mib']} MiB: {r.get('present_mib')} present, "
                     f"{r.get('private_mib')} private" +
                     (" (shared views: private 0 by construction)" if r.get("views") else ""))
    return ", ".join(parts) + (f"; why: {r['why']}" if r.get("why") else "")


def pinned_line(r):
    """The line under the pinned row: what it copied, and the PCIe link
    nvidia-smi read while it copied (gen, width)."""
    line = f"{r['bytes'] / MIB:.0f} MiB pinned and copied"
    if "model_bytes" in r:
        line += f" (the largest power of two <= the model's {r['model_bytes'] / MIB:.1f} MiB)"
    if "link" in r:
        line += f"; PCIe link while copying (gen, width): {r['link']}"
    return line


def registration_line(r):
    """The report's lines for the register_threads row (None: skipped): the
    seconds registering on 1 thread and on N, and how many times faster N
    were (N when the driver pins in parallel, 1 when it serialises), then
    what was registered, GB/s pinned, and the seconds unregistering."""
    if r is None:
        return f"{'registration, 1 thread vs 4':44} {'skipped':>8}"
    label = f"registration, 1 thread vs {r['threads']}"
    what = f"    {r['ranges']} x {r['range_mib']:g} MiB of the model's mapping" + \
        (" (shared views, as the engine registers)" if r["views"] else "")
    if "refused" in r:
        return f"{label:44} refused: {r['refused']}\n{what} (informational, no target)"
    return (f"{label:44} {r['seconds_1']:.3f} s vs {r['seconds_n']:.3f} s: {r['ratio']:.2f}x "
            f"({r['threads']}x if the driver pins in parallel, 1x if it serialises)\n"
            f"{what}; {r['gbps_1']} vs {r['gbps_n']} GB/s pinned; unregistering "
            f"{r['unregister_s_1']:.3f} s vs {r['unregister_s_n']:.3f} s "
            f"(informational, no target)")


def checked_line(checked):
    """The report's line saying how the rows' loads were checked against
    the file ([(row's label, what its check_state said)]): once where
    every row says the same."""
    said = {what for _, what in checked}
    if len(said) == 1:
        return f"bytes checked against the file (once per row, untimed): {said.pop()}"
    return "bytes checked against the file (once per row, untimed): " + \
        "; ".join(f"{label}: {what}" for label, what in checked)


def speedups(rows):
    """[(label, seconds, times faster than the plain transformers load)]."""
    by = {r["method"]: r for r in rows}
    plain = by.get("transformers_plain")
    out = []
    for key in ("transformers_wcache", "transformers_wcache_hostreg"):
        r = by.get(key)
        if r is not None and plain is not None and r["seconds"] > 0:
            out.append((key, r["seconds"], plain["seconds"] / r["seconds"]))
    return out


def cmd_report(a):
    rows = [json.loads(line) for line in open(a.results)] if os.path.exists(a.results) else []
    names = {"pinned": "pinned anonymous memory (the limit)",
             "upstream": "safetensors.torch.load_file(device=)",
             "torch_load": "torch.load(mmap=True) then .to()",
             "wcache_tensor": "wcache, old per-tensor path",
             "wcache": "wcache, new path",
             "wcache_staging": "wcache, new path, staging forced",
             "concurrent4": "wcache, new path, 4 processes together",
             # informational (no target): loaders that ask tensor by tensor
             "upstream_get_tensor": "get_tensor loop, safetensors safe_open",
             "wcache_get_tensor": "get_tensor loop, wcache.safe_open"}
    print(f"{'way into the device':44} {'GB/s':>8} {'first':>8} {'seconds':>9} "
          f"{'private MiB':>11}  path")
    for key, label in names.items():
        r = next((r for r in rows if r["method"] == key), None)
        fit = r.get("fit") if r is not None else None  # 4 did not fit the device
        if fit and not r["processes"]:
            print(f"{label:44} {'skipped':>8}\n    {fit}")
            continue
        if fit:  # the row names what ran
            label = f"wcache, new path, {r['processes']} processes together"
        if r is None:
            print(f"{label:44} {'skipped':>8}")
        else:
            private = r.get("private_mib")
            first = f"{r['first_gbps']:8.2f}" if "first_gbps" in r else f"{'-':>8}"
            print(f"{label:44} {r['gbps']:8.2f} {first} {r['seconds']:9.3f} "
                  f"{'-' if private is None else private:>11}  {r.get('path', '')}")
            if "tensors" in r:
                line = f"    {r['tensors']} tensors, {r['ms_per_tensor']:.3f} ms per tensor"
                if "engine_tensors" in r:
                    line += f", {r['engine_tensors']} of them through the engine"
                print(line + " (informational, no target)")
            if "copy_s" in r:
                print("    " + engine_line(r))
            if key == "pinned":
                print("    " + pinned_line(r))
            if fit:
                print("    " + fit)
    print("(GB/s, seconds: the best of 2 loads in one process; first: GB/s of its first, cold\n"
          " load (the device buffer allocated anew, each path's first calls), which is what a\n"
          " worker's one load pays; the 4 processes' row is each one's first and only load)")
    checked = [(names[r["method"]], r["checked"]) for r in rows
               if r["method"] in names and r.get("checked")]
    if checked:
        print(checked_line(checked))
    print()
    print(registration_line(next((r for r in rows if r["method"] == "register_threads"), None)))
    print()
    faster = {key: x for key, _, x in speedups(rows)}
    for key, label in (("transformers_plain", "transformers, plain"),
                       ("transformers_wcache", "transformers, wcache"),
                       ("transformers_wcache_hostreg",
                        "transformers, wcache, WCACHE_HOST_REGISTER=1")):
        r = next((r for r in rows if r["method"] == key), None)
        if r is None:
            print(f"{label:44} load skipped")
            continue
        line = f"{label:44} load {r['seconds']:7.3f} s"
        if key in faster:
            line += f"  {faster[key]:5.2f}x plain"
        if "private_mib" in r:
            line += (f"  ({r['registered']} of {r['handles']} handles registered, "
                     f"{r['private_mib']} MiB private of {r['mib']} MiB"
                     + (f", {r['present_mib']} present)" if "present_mib" in r else ")"))
        if "unmap_s" in r:  # held back by the watch, counted as the plain load's is
            line += f"  (unmapping {r['unmap_s'] * 1000:.0f} ms of it)"
        if "held_at_copy" in r:
            line += f"  ({r['held_at_copy']} ranges registered during .to())"
        if r.get("how", "device_map") != "device_map":
            line += f"  [{r['how']}]"  # not what device_map= measures: said on the line
        print(line)
        if "hook" in r:
            print(f"    safetensors patched by {r['hook']}")
    print()
    misses = 0
    for label, verdict, detail in targets(rows):
        print(f"{verdict:5} {label}  ({detail})")
        misses += verdict == "MISS"
    if a.cpu:
        print("(--cpu: host memory stands for the device; the figures check the script, "
              "not the link)")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--site", help="a directory processed as site-packages first (add_site)")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("host-info")
    s = sub.add_parser("room")
    s.add_argument("--work", required=True)
    s.add_argument("--gib", type=float, required=True)
    s.add_argument("--llama-gib", type=float, default=3.0)
    s.add_argument("--min-gib", type=float, default=0.25)
    s.add_argument("--shm", default="/dev/shm")
    s = sub.add_parser("gen")
    s.add_argument("--dir", required=True)
    s.add_argument("--gib", type=float, default=8.0)
    s.add_argument("--pt", action="store_true")
    s = sub.add_parser("warm")
    s.add_argument("files", nargs="+")
    s = sub.add_parser("sums")
    s.add_argument("model")
    s = sub.add_parser("daemon")
    s.add_argument("action", choices=("start", "stop"))
    s.add_argument("--dir", required=True)
    s.add_argument("--files", nargs="+", default=[])
    s = sub.add_parser("bench")
    s.add_argument("--method", required=True, choices=("pinned", "upstream", "torch_load",
                                                       "wcache_tensor", "wcache",
                                                       "wcache_staging", "upstream_get_tensor",
                                                       "wcache_get_tensor"))
    s.add_argument("--model", required=True)
    s.add_argument("--pt")
    s.add_argument("--results", required=True)
    s.add_argument("--reps", type=int, default=2)
    s.add_argument("--wait")
    s.add_argument("--tag")
    s = sub.add_parser("concurrent")
    s.add_argument("--n", type=int, default=4)
    s.add_argument("--model", required=True)
    s.add_argument("--dir", required=True)
    s.add_argument("--results", required=True)
    sub.add_parser("device-memory")
    s = sub.add_parser("register-threads")
    s.add_argument("--model", required=True)
    s.add_argument("--results", required=True)
    s.add_argument("--count", type=int, default=8)
    s.add_argument("--mib", type=int, default=256)
    s.add_argument("--threads", type=int, default=4)
    s.add_argument("--reps", type=int, default=2)
    s = sub.add_parser("cpu-engine")
    s.add_argument("--model", required=True)
    s.add_argument("--reps", type=int, default=3)
    s = sub.add_parser("llama-make")
    s.add_argument("--dir", required=True)
    s.add_argument("--tiny", action="store_true")
    s = sub.add_parser("llama-load")
    s.add_argument("--dir", required=True)
    s.add_argument("--mode", choices=("plain", "wcache", "wcache_hostreg"), required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--results", required=True)
    s = sub.add_parser("llama-compare")
    s.add_argument("a")
    s.add_argument("b")
    s.add_argument("--tag")
    s.add_argument("--results", required=True)
    s = sub.add_parser("report")
    s.add_argument("--results", required=True)
    a = p.parse_args(argv)
    a.cpu = a.cpu or os.environ.get("GPUBENCH_CPU") == "1"
    if a.site:
        add_site(a.site)
    return {"host-info": cmd_host_info, "room": cmd_room, "gen": cmd_gen, "warm": cmd_warm,
            "sums": cmd_sums, "daemon": cmd_daemon, "bench": cmd_bench,
            "concurrent": cmd_concurrent, "device-memory": cmd_device_memory,
            "llama-make": cmd_llama_make,
            "llama-load": cmd_llama_load, "cpu-engine": cmd_cpu_engine,
            "register-threads": cmd_register_threads,
            "llama-compare": cmd_llama_compare,
            "report": cmd_report}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
