"""Files of a STAGED directory model opened by their own paths, as
transformers opens shards (review rev165 F2; wcache/_shards.py). wcached
serves a staged generation from its copy in stage_dir; with stage_dir on
another file system than the model (here /dev/shm, a tmpfs, against
tmp_path), each shard comes through wcached as the generation's staged
copy, found by name (wc_attach_fds, wc_model_file_name) and fstat: its
pages are the copy's, not the source file's. Before, every shard was
mapped from the source path in the worker (Model.source "file"). A file
renamed over a shard on the model's own file system is not taken for the
old generation's, and no /proc/self/maps is read to tell files apart."""
import builtins
import errno
import logging
import os
import resource
import shutil
import tempfile

import pytest
import torch

import wcache
import wcache._shards as shards
from pyhelpers import (Daemon, file_mappings, mapping_at, run_python, wait_until,
                       write_safetensors)
from test_served_directory import (SHARDS, attached, same_as_the_file, serve_big, use,
                                   write_model)
from wcached import open_to  # tests/pyutil, on the path pyhelpers sets

SHM = "/dev/shm"


@pytest.fixture
def staged(tmp_path, monkeypatch):
    """wcached serving tmp_path/llama as "llama" with stage = yes and its
    stage_dir on /dev/shm; yields (daemon, shard paths, stage_dir)."""
    if not os.path.isdir(SHM) or os.stat(SHM).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip(f"needs {SHM} on another file system than {tmp_path}")
    files = write_model(str(tmp_path / "llama"))
    os.makedirs(tmp_path / "d")
    top = tempfile.mkdtemp(prefix="wcache-staged-", dir=SHM)
    stage_dir = os.path.join(top, "stage")
    d = Daemon(tmp_path / "d", {"llama": (str(tmp_path / "llama"), {"stage": "yes"})},
               extra=f"stage_dir = {stage_dir}")
    if d.user is not None:  # $WCACHE_TEST_USER's daemon makes stage_dir in top
        open_to(top, *d.user)
    d.start()
    use(monkeypatch, d)
    try:
        d.wait_for_log(r"generation 1 staged from \S+ to ")
        yield d, files, stage_dir
    finally:
        import wcache._safe_open as so
        so._shared = None
        rc = d.stop()
        shutil.rmtree(top, ignore_errors=True)
        assert rc == 0, d.read_log()


def test_each_shard_of_a_staged_directory_maps_wcacheds_copy(staged, caplog, monkeypatch):
    from wcache.model import Client
    d, files, stage_dir = staged
    copy = os.path.join(stage_dir, "llama.1")
    asked = []
    real = Client.attach
    monkeypatch.setattr(Client, "attach",
                        lambda self, name, **kw: asked.append(name) or real(self, name, **kw))
    with caplog.at_level(logging.INFO, logger="wcache"):
        handles = [wcache.safe_open(p, framework="pt") for p in files]
    # the held directory's staged copies answer for the files not yet opened
    # (review rev172: before, each file's first open attached it again)
    assert asked.count(os.path.dirname(files[0])) == 1, asked
    try:
        for i, (f, p) in enumerate(zip(handles, files)):
            assert f.model.source == "wcached", p
            assert f.model.name == p and f.model.generation == 1
            assert f.metadata() == {"format": "pt", "shard": str(i)}
            same_as_the_file(f, p)
            # the data lies in wcached's copy, not in the source file
            t = f.get_tensor(f"model.layers.{i}.w")
            assert mapping_at(t.data_ptr())[1] == os.path.join(copy, SHARDS[i])
            del t
        assert [file_mappings(p) for p in files] == [0, 0, 0]
        assert attached(d) == 1
    finally:
        for f in handles:
            f.close()
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(said) == 1 and "staged copy of generation 1" in said[0], said
    wait_until(lambda: attached(d) == 0, what="the directory's release")


def test_a_staged_shard_has_a_shared_view_in_a_worker_of_another_user(staged):
    """Review rev172 F3: the device engine maps a shared view of the file
    behind a tensor (wcache/_sharedview.py) by opening its path; a staged
    shard's is wcached's copy in stage_dir (0700, wcached's), which a
    worker of another user may not open. The view is made through the
    descriptor the directory model keeps of that copy. Before: Unavailable
    "cannot open ...: Permission denied", and the engine staged through
    pinned buffers."""
    d, files, stage_dir = staged
    if d.user is None or not shutil.which("setpriv"):
        pytest.skip("needs root, $WCACHE_TEST_USER and setpriv (a worker of a third user)")
    code = f'''
import ctypes, mmap, os
import wcache, wcache._device as dev
f = wcache.safe_open({files[1]!r}, framework="pt")
assert f.model.source == "wcached", f.model.source
t = f.get_tensor("model.layers.1.w")
assert {stage_dir!r} in open("/proc/self/maps").read()
try:
    os.open({os.path.join(stage_dir, "llama.1", SHARDS[1])!r}, os.O_RDONLY)
    print("OPENED")
except PermissionError:
    pass
lo = t.data_ptr() & ~(mmap.PAGESIZE - 1)
view = dev.mapping_files(f.model._h(), None).view(lo, lo + mmap.PAGESIZE)
got = ctypes.string_at(view.translate(t.data_ptr(), 64), 64)
print("VIEW", got == t.numpy().tobytes()[:64])
'''
    # another user of wcached's group: the socket lets it in, stage_dir not
    r = run_python(code, env={"WCACHE_SOCKET": d.socket},
                   wrap=("setpriv", "--reuid=65534", f"--regid={d.user[1]}", "--clear-groups"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["VIEW", "True"], (r.stdout, r.stderr)


def test_no_proc_self_maps_is_read(staged, monkeypatch):
    """Files are told apart by name and fstat, not by /proc/self/maps (a
    read of some 1,700 lines in a process that imported torch)."""
    d, files, _ = staged
    assert not hasattr(shards, "_read_maps")
    real = builtins.open

    def no_maps(path, *a, **kw):
        assert os.fspath(path) != "/proc/self/maps", "read /proc/self/maps"
        return real(path, *a, **kw)
    monkeypatch.setattr(builtins, "open", no_maps)
    for p in files + files:
        with wcache.safe_open(p) as f:
            assert f.model.source == "wcached"


def test_a_file_renamed_over_a_staged_shard_is_not_the_staged_copy(staged):
    """Review rev172 F1: another device alone does not make wcached's file a
    copy of the file at the path (overlayfs gives a file renamed over in
    its upper layer another st_dev). A shard replaced by a file wcached
    refuses (a tensor not in the weight_map: generation 1 keeps serving,
    staged on /dev/shm) is another file, with its own size and mtime: it is
    mapped here with its own tensors, never the staged copy of the old one.
    Before, any other device was taken for the staged copy."""
    d, files, _ = staged
    held = wcache.safe_open(files[2])  # the held directory does not take it either
    assert held.model.source == "wcached"
    new = files[1] + ".new"
    write_safetensors(new, [("model.layers.1.stray", "F32", (8, 16), b"\1" * 512)],
                      metadata={"format": "pt", "shard": "new"})
    os.rename(new, files[1])
    d.wait_for_log(r"generation 1 (still serving|keeps serving)|not in the weight_map")
    for _ in range(2):
        with wcache.safe_open(files[1], framework="pt") as f:
            assert f.model.source == "file", f.model
            assert f.metadata()["shard"] == "new"
            assert list(f.keys()) == ["model.layers.1.stray"]
        held.close()
    with wcache.safe_open(files[0], framework="pt") as f:  # the others still are
        assert f.model.source == "wcached" and f.model.generation == 1


def test_out_of_descriptors_maps_the_files_here(tmp_path, monkeypatch, caplog):
    """Review rev172 F2: an attach receives one descriptor per file of the
    model (all but a staged copy's are closed at once). Where the process
    has fewer free than that, wcached's reply loses its descriptors
    (EMFILE): each file is mapped here, with one WARNING, instead of the
    load failing. (Before 16dceac safe_open raised.)"""
    n = 40
    d, files = serve_big(tmp_path, monkeypatch, n)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    tensors = []
    try:
        in_use = len(os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + n // 2, hard))
        with caplog.at_level(logging.WARNING, logger="wcache"):
            sources = []
            for i, p in enumerate(files):
                with wcache.safe_open(p, framework="pt") as f:
                    tensors.append(f.get_tensor(f"model.layers.{i}.b"))
                    sources.append(f.model.source)
        assert sources == ["file"] * n, sources
        assert all(torch.equal(t, torch.arange(4)) for t in tensors)
        said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(said) == 1 and "out of file descriptors" in said[0], said
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        del tensors
        import wcache._safe_open as so
        so._shared = None
        assert d.stop() == 0, d.read_log()


def test_a_staged_directory_keeps_its_copies_descriptors_only(staged):
    """Review rev172 F2: a staged shard is mapped through wcached's
    descriptor of its copy (stage_dir is wcached's, 0700), so the held
    directory keeps those, one per staged file, and no other: after
    transformers' loop with the state dict kept, 3 for 3 staged shards,
    none once the tensors are gone."""
    d, files, _ = staged
    with wcache.safe_open(files[0]) as f:  # connects
        assert f.model.source == "wcached"
    wait_until(lambda: attached(d) == 0, what="the directory's release")
    before = len(os.listdir("/proc/self/fd"))
    state = {}
    for p in files:
        with wcache.safe_open(p, framework="pt") as f:
            assert f.model.source == "wcached"
            state.update({k: f.get_tensor(k) for k in f.keys()})
    assert len(os.listdir("/proc/self/fd")) == before + len(files)
    state.clear()
    wait_until(lambda: attached(d) == 0, what="the release after the tensors went")
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_file_renamed_over_a_shard_is_not_the_old_generations(tmp_path, monkeypatch):
    """Not staged: a file renamed over a shard (the same file system, so
    the same device) while the directory is held is another inode than the
    generation's file of that name: it is mapped here, with its own
    tensors, never the old generation's (wcached may have made a
    generation of it by then: then that one)."""
    files = write_model(str(tmp_path / "llama"))
    os.makedirs(tmp_path / "d")
    d = Daemon(tmp_path / "d", {"llama": str(tmp_path / "llama")}).start()
    use(monkeypatch, d)
    try:
        with wcache.safe_open(files[0]) as held:
            assert held.model.source == "wcached" and held.model.generation == 1
            new = str(tmp_path / "new.safetensors")
            write_safetensors(new, [("model.layers.1.w", "F32", (8, 16), b"\1" * 512),
                                    ("model.layers.1.b", "I64", (4,), b"\2" * 32)],
                              metadata={"format": "pt", "shard": "new"})
            os.rename(new, files[1])
            with wcache.safe_open(files[1], framework="pt") as f:
                assert f.model.source == "file" or f.model.generation > 1, f.model
                assert f.metadata()["shard"] == "new"
                assert torch.equal(f.get_tensor("model.layers.1.b"),
                                   torch.full((4,), 0x0202020202020202, dtype=torch.int64))
    finally:
        import wcache._safe_open as so
        so._shared = None
        assert d.stop() == 0, d.read_log()


def test_a_kept_descriptor_given_to_another_file_is_not_the_staged_copy(staged, tmp_path):
    """Review rev174 F2: a process that closes the held directory's kept
    descriptor of a staged copy behind libwcache's back (closefrom() in a
    daemonizing child) and opens another file on that number does not get
    that file's bytes as the shard: the kept descriptor is fstat'ed against
    the copy's identity as attached before it is mapped, and the directory
    is attached again. Before, the other file was mapped, labelled
    "wcached"."""
    d, files, _ = staged
    other = str(tmp_path / "other.safetensors")
    write_safetensors(other, [("model.layers.2.w", "F32", (8, 16), b"\0" * 512),
                              ("model.layers.2.b", "I64", (4,), b"\0" * 32)],
                      metadata={"format": "pt", "shard": "OTHER"})
    held = wcache.safe_open(files[0])
    assert held.model.source == "wcached"
    entry = shards._dirs[os.path.dirname(files[0])]
    h = entry.handle()
    kept = h.lib.wc_model_fd(h.ptr, entry.names[os.path.basename(files[2]).encode()])
    del h
    assert kept >= 0
    fd = os.open(other, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.dup2(fd, kept)  # closes the model's copy; the number is another file's
        for _ in range(2):
            with wcache.safe_open(files[2], framework="pt") as f:
                assert f.model.source == "wcached" and f.model.generation == 1
                same_as_the_file(f, files[2])
        held.close()
        assert os.readlink(f"/proc/self/fd/{kept}") == other  # the release left it
    finally:
        os.close(fd)
        os.close(kept)


def test_origins_of_a_model_of_many_shards(tmp_path):
    """wc_model_file_origin() of a staged directory of 120 shards: wcached
    says what it copied in two replies (ORIGINS from file 0, then from 100,
    on one connection of libwcache's own), each file's origin being the
    fstat of its source (device, inode, size, mtime, ctime), which the
    copy is not; asked once per attach (one "origins of" line per reply)."""
    import ctypes
    from wcache import _lib
    if not os.path.isdir(SHM) or os.stat(SHM).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip(f"needs {SHM} on another file system than {tmp_path}")
    names = [f"model-{i:05d}-of-00120.safetensors" for i in range(120)]
    write_model(str(tmp_path / "many"), names=names)
    os.makedirs(tmp_path / "d")
    top = tempfile.mkdtemp(prefix="wcache-staged-", dir=SHM)
    d = Daemon(tmp_path / "d", {"many": (str(tmp_path / "many"), {"stage": "yes"})},
               extra=f"stage_dir = {os.path.join(top, 'stage')}")
    if d.user is not None:
        open_to(top, *d.user)
    d.start()
    try:
        d.wait_for_log(r"generation 1 staged from \S+ to ")
        with wcache.connect(d.socket) as c, c.attach("many", _keep_fds=True) as m:
            h = m._h()
            o, i = _lib.wc_file_identity(), _lib.wc_file_identity()
            for k in (0, 1, 99, 100, 119, 0):
                assert h.lib.wc_model_file_origin(h.ptr, k, ctypes.byref(o)) == 0, k
                assert h.lib.wc_model_file_identity(h.ptr, k, ctypes.byref(i)) == 0, k
                name = h.lib.wc_model_file_name(h.ptr, k).decode()
                st = os.stat(os.path.join(tmp_path / "many", name))
                assert (o.dev, o.ino, o.size, o.mtime_ns, o.ctime_ns) == \
                    (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns), name
                assert (i.dev, i.ino) != (st.st_dev, st.st_ino)  # the copy's
            assert h.lib.wc_model_file_origin(h.ptr, 120, ctypes.byref(o)) == -errno.ERANGE
        log = d.read_log()
        assert "origins of \"many\" generation 1 from file 0 (100)" in log, log
        assert "origins of \"many\" generation 1 from file 100 (20)" in log, log
        assert log.count("origins of ") == 2, log
    finally:
        rc = d.stop()
        shutil.rmtree(top, ignore_errors=True)
        assert rc == 0, d.read_log()


def replace_shard_keeping_size_and_mtime(path, how):
    """Replaces shard path by other bytes of the same size and mtime, by
    rename ("rename") or by writing over it ("in place"); returns the old
    stat."""
    old = os.stat(path)
    new = path + ".new"
    write_safetensors(new, [("model.layers.1.x", "F32", (8, 16), b"\7" * 512),
                            ("model.layers.1.b", "I64", (4,), b"\11" * 32)],
                      metadata={"format": "pt", "shard": "N"})
    assert os.path.getsize(new) == old.st_size
    if how == "rename":
        os.utime(new, ns=(old.st_atime_ns, old.st_mtime_ns))
        os.rename(new, path)
    else:
        with open(new, "rb") as src, open(path, "r+b") as dst:
            dst.write(src.read())
        os.unlink(new)
        os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns))
    return old


@pytest.mark.parametrize("origins", [True, False], ids=["wcached says", "an older wcached"])
@pytest.mark.parametrize("how", ["rename", "in place"])
def test_a_replacement_before_the_first_attach_is_not_the_staged_copy(staged, how, origins,
                                                                     monkeypatch):
    """The case e7607df left open: a shard replaced after wcached staged it
    and before this process first attached the directory, by a file of the
    same size with the old mtime put back, within the source clock's lag
    behind this host's (the copy's ctime read an hour later, as in
    test_a_replacement_with_the_old_mtime_is_not_the_staged_copy's lag). The
    path then names the replacement at the first attach, so only what
    wcached says the copy was copied from (wc_model_file_origin: the
    source's device, inode, size, mtime and ctime) tells it from the source:
    it is mapped here with its own bytes. Before (HEAD's client/python), the
    old copy's bytes, labelled "wcached" generation 1.

    origins False: _origin says nothing (as with a wcached older than
    ORIGINS, or a libwcache without wc_model_file_origin): the clocks'
    test of _copy_of stands, and the file that was not replaced is still
    served from its staged copy."""
    copy_of = shards._copy_of
    monkeypatch.setattr(shards, "_copy_of", lambda i, st, o=None: copy_of(
        i[:4] + (i[4] + 3600 * 1_000_000_000,), st, o))
    if not origins:
        monkeypatch.setattr(shards, "_origin", lambda h, k: None)
    d, files, _ = staged
    replace_shard_keeping_size_and_mtime(files[1], how)
    d.wait_for_log(r"generation 1 (still serving|keeps serving)|not in the weight_map")
    with wcache.safe_open(files[0], framework="pt") as f:  # the one not replaced
        assert f.model.source == "wcached" and f.model.generation == 1
        same_as_the_file(f, files[0])
    if origins:
        with wcache.safe_open(files[1], framework="pt") as f:
            assert f.model.source == "file", f.model
            assert f.metadata()["shard"] == "N"
            assert sorted(f.keys()) == ["model.layers.1.b", "model.layers.1.x"]


@pytest.mark.parametrize("lag", [False, True], ids=["same clock", "source clock lags"])
@pytest.mark.parametrize("how", ["rename", "in place"])
def test_a_replacement_with_the_old_mtime_is_not_the_staged_copy(staged, how, lag,
                                                                  monkeypatch):
    """Review rev174 F1: a shard replaced by a file of the same size with
    the old file's mtime put back (rsync --inplace --times, touch -r, cp -p)
    that wcached refuses (a tensor not in the weight_map: generation 1 keeps
    serving its staged copy of the old file) is not taken for that copy:
    its ctime is later than the copy's. It is mapped here with its own
    bytes, through the directory held from before the replacement and
    through one attached after it. Before, both gave the old copy's bytes,
    labelled "wcached" generation 1.

    lag: as if the source's file system's clock ran an hour behind this
    host's (the copy's ctime an hour later), so the replacement's ctime is
    still before the copy's: the path was seen to name another file, or
    to change, since the generation was attached through this connection
    (_shards._source_seen). Before that check, the old copy's bytes."""
    if lag:
        copy_of = shards._copy_of
        monkeypatch.setattr(shards, "_copy_of", lambda i, st, o=None: copy_of(
            i[:4] + (i[4] + 3600 * 1_000_000_000,), st, o))
    d, files, _ = staged
    held = wcache.safe_open(files[2])
    assert held.model.source == "wcached"
    old = replace_shard_keeping_size_and_mtime(files[1], how)
    assert os.stat(files[1]).st_mtime_ns == old.st_mtime_ns
    d.wait_for_log(r"generation 1 (still serving|keeps serving)|not in the weight_map")
    for _ in range(2):
        with wcache.safe_open(files[1], framework="pt") as f:
            assert f.model.source == "file", f.model
            assert f.metadata()["shard"] == "N"
            assert sorted(f.keys()) == ["model.layers.1.b", "model.layers.1.x"]
        held.close()  # the second time, the directory is attached after the replacement
    with wcache.safe_open(files[0], framework="pt") as f:  # the others still are
        assert f.model.source == "wcached" and f.model.generation == 1
