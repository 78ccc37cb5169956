"""A file of a model wcached serves as a DIRECTORY (README's configuration of
a Hugging Face model), opened by its own path as transformers opens shards:
safe_open(DIR/model-00002-of-00003.safetensors) comes through wcached, with
that file's own tensors and metadata; the directory is attached once
however many shards are open, held while they (or their tensors) live, and
released after; a file the directory model does not hold, or a directory
nobody serves, is mapped here with one INFO line (wcache/_shards.py).
Review rev163 F1-F3: before, every shard was mapped in-process, silently."""
import json
import logging
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import wcache
from pyhelpers import Daemon, binary, file_mappings, wait_child, wait_until, write_safetensors

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from restartutil import attached as _attached  # noqa: E402 (path set just above)

SHARDS = [f"model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3)]


def attached(d, name="llama"):
    """Clients attached to model name's current generation."""
    return _attached(d, binary("wcachectl"), name)


def generations(d, name="llama"):
    """{generation: clients attached to it} of model name."""
    r = subprocess.run([binary("wcachectl"), "status", "--json", "--control", d.control],
                       capture_output=True, text=True, timeout=60)
    model = next(m for m in json.loads(r.stdout)["models"] if m["name"] == name)
    return {g["number"]: g["attached"] for g in model["generations"]}


def write_model(directory, seed=0, names=SHARDS):
    """Three shards and the index upstream writes; shard i holds layer i's
    tensors and the metadata {"format": "pt", "shard": "i"}. Returns the
    shard paths."""
    os.makedirs(directory, exist_ok=True)
    weight_map = {}
    rng = np.random.default_rng(seed)
    for i, name in enumerate(names):
        tensors = [(f"model.layers.{i}.w", "F32", (8, 16),
                    rng.standard_normal(128).astype("<f4").tobytes()),
                   (f"model.layers.{i}.b", "I64", (4,),
                    np.arange(4, dtype="<i8").tobytes())]
        write_safetensors(os.path.join(directory, name), tensors,
                          metadata={"format": "pt", "shard": str(i)})
        weight_map.update({t[0]: name for t in tensors})
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)
    return [os.path.join(directory, n) for n in names]


def use(monkeypatch, d):
    """Points safe_open at daemon d (None: leaves $WCACHE_SOCKET), forgetting
    earlier connections, directories and what was logged."""
    import wcache._device as dev
    import wcache._safe_open as so
    import wcache._shards as shards
    if d is not None:
        monkeypatch.setenv("WCACHE_SOCKET", d.socket)
    so._shared = None
    so._told.clear()
    shards._dirs.clear()
    dev._logged.clear()


@pytest.fixture
def served(tmp_path, monkeypatch):
    """wcached serving the directory tmp_path/llama as "llama"; yields
    (daemon, shard paths)."""
    files = write_model(str(tmp_path / "llama"))
    os.makedirs(tmp_path / "d")
    d = Daemon(tmp_path / "d", {"llama": str(tmp_path / "llama")}).start()
    use(monkeypatch, d)
    yield d, files
    import wcache._safe_open as so
    so._shared = None
    assert d.stop() == 0, d.read_log()


def same_as_the_file(f, path):
    """f (a safe_open handle) has what the file at path alone has, read in
    this process by the package (upstream's safe_open(path) gives the same)."""
    with wcache.open_file(path) as local:
        assert f.keys() == local.keys()
        assert f.offset_keys() == local.offset_keys()
        assert f.metadata() == local.metadata() and f.metadata()["format"] == "pt"
        for k in local.keys():
            assert f.get_tensor(k).numpy().tobytes() == local.raw(k).tobytes(), k


def test_a_shard_of_a_served_directory_comes_through_wcached(served):
    d, files = served
    with wcache.safe_open(files[1], framework="pt") as f:
        assert f.model.source == "wcached"
        assert f.model.name == files[1]
        assert f.metadata() == {"format": "pt", "shard": "1"}
        same_as_the_file(f, files[1])
        with wcache.connect(d.socket) as c, c.attach("llama") as whole:
            assert f.model.generation == whole.generation >= 1
            assert len(whole) == 6 and len(f.model) == 2
        assert not f.model.stale()
        assert attached(d) == 1
    d.wait_for_log(r'attached "' + os.path.dirname(files[1]) + '" generation 1')
    wait_until(lambda: attached(d) == 0, what="the directory's release")


def test_the_directory_is_attached_once_for_all_its_shards(served):
    """Each attach maps every file of the model: one per shard would map
    each file once per open shard (163 x 163 for a 163-shard model). The
    attached model keeps no descriptor of a file that is not a staged copy
    (review rev172 F2: before, one per file while held), the shards none."""
    d, files = served
    handles = [wcache.safe_open(files[0])]  # connects: a descriptor for the connection
    fds = len(os.listdir("/proc/self/fd"))
    handles += [wcache.safe_open(p) for p in files[1:] + files[:1]]
    assert [h.model.source for h in handles] == ["wcached"] * 4
    assert attached(d) == 1
    # the directory model's mapping of each file, and one per open handle of it
    assert [file_mappings(p) for p in files] == [3, 2, 2]
    assert len(os.listdir("/proc/self/fd")) == fds
    for h in handles[:3]:
        h.close()
    assert attached(d) == 1   # handles[3] holds it
    assert [file_mappings(p) for p in files] == [2, 1, 1]
    handles[3].close()
    wait_until(lambda: attached(d) == 0, what="the directory's release")
    assert [file_mappings(p) for p in files] == [0, 0, 0]
    assert len(os.listdir("/proc/self/fd")) == fds


def serve_big(tmp_path, monkeypatch, n):
    """wcached serving an n-shard tmp_path/big as "big", connected to once
    (a shard opened and closed) and the directory released since; returns
    (daemon, shard paths)."""
    names = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    files = write_model(str(tmp_path / "big"), names=names)
    os.makedirs(tmp_path / "d")
    d = Daemon(tmp_path / "d", {"big": str(tmp_path / "big")}).start()
    use(monkeypatch, d)
    with wcache.safe_open(files[0]) as f:
        assert f.model.source == "wcached"
    wait_until(lambda: attached(d, "big") == 0, what="the directory's release")
    return d, files


def test_a_loaded_directory_holds_no_descriptor(tmp_path, monkeypatch, caplog):
    """Review rev172 F2: transformers' loop (open, get_tensor, close per
    shard, the state dict kept) over a 40-shard directory leaves the
    process with the descriptors it had, and needs about N + 3 free ones
    on the way (one attach's reply, the file's own). Before, the held
    directory kept one per shard for as long as the state dict lived
    (fds 40 more), and the first open of each file attached it again, so
    the loop needed 2N + 2 free: at this limit it fell back to mapping
    files here, with a WARNING."""
    import resource
    n = 40
    d, files = serve_big(tmp_path, monkeypatch, n)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    state = {}
    try:
        before = len(os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (before + n + 8, hard))
        with caplog.at_level(logging.WARNING, logger="wcache"):
            sources = []
            for i, p in enumerate(files):
                with wcache.safe_open(p, framework="pt") as f:
                    for k in f.keys():
                        state[k] = f.get_tensor(k)
                    sources.append(f.model.source)
        assert sources == ["wcached"] * n, sources
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(os.listdir("/proc/self/fd")) == before
        assert attached(d, "big") == 1
        assert all(torch.equal(state[f"model.layers.{i}.b"], torch.arange(4))
                   for i in range(n))
        state.clear()
        wait_until(lambda: attached(d, "big") == 0, what="the release after the tensors went")
        assert len(os.listdir("/proc/self/fd")) == before
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        state.clear()
        import wcache._safe_open as so
        so._shared = None
        assert d.stop() == 0, d.read_log()


def test_the_first_pass_over_a_held_directory_asks_wcached_once(served, monkeypatch):
    """Review rev172 (bench_shards' first-pass MISS): a file the held
    directory maps as it was attached (the same device, inode, size, mtime
    and ctime) comes through it without asking wcached: opening the 3
    shards attaches the directory once. Before, each file's first open
    attached it again (3 attaches; 163 for 163 shards). A file written in
    place since, even with its mtime put back (rsync --inplace --times),
    is not taken: wcached is asked, and its refusal raised."""
    import errno
    from wcache.model import Client
    d, files = served
    directory = os.path.dirname(files[0])
    asked = []
    real = Client.attach
    monkeypatch.setattr(Client, "attach",
                        lambda self, name, **kw: asked.append(name) or real(self, name, **kw))
    handles = [wcache.safe_open(p) for p in files]
    try:
        assert [h.model.source for h in handles] == ["wcached"] * 3
        assert [n for n in asked if n == directory] == [directory]
        for h, p in zip(handles, files):
            same_as_the_file(h, p)
        handles.pop().close()
        st = os.stat(files[2])
        with open(files[2], "r+b") as f:  # in place, same size, mtime put back
            f.seek(-8, 2)
            f.write(b"\x7f" * 8)
        os.utime(files[2], ns=(st.st_atime_ns, st.st_mtime_ns))
        d.wait_for_log("modified in place")
        with pytest.raises(wcache.WcacheError) as e:
            wcache.safe_open(files[2])
        assert e.value.errno == errno.ESTALE, e.value
        assert [n for n in asked if n == directory] == [directory] * 2
    finally:
        for h in handles:
            h.close()


def test_tensors_keep_the_directory_attached(served, monkeypatch):
    """wcache.torch.load_file and load_model go through the same open: the
    handle closes at once, and the tensors hold the shard's mapping and so
    the directory's generation."""
    from wcache.torch import load_file, load_model
    d, files = served
    state = load_file(files[2])
    assert attached(d) == 1
    with wcache.open_file(files[2]) as local:
        assert list(state) == local.offset_keys()
        for k, t in state.items():
            assert t.numpy().tobytes() == local.raw(k).tobytes()
    del state, t
    wait_until(lambda: attached(d) == 0, what="the release after the tensors went")

    module = torch.nn.Module()
    module.model = torch.nn.Module()
    module.model.layers = torch.nn.ModuleList([torch.nn.Module()])
    module.model.layers[0].w = torch.nn.Parameter(torch.zeros(8, 16))
    module.model.layers[0].b = torch.nn.Parameter(torch.zeros(4, dtype=torch.int64),
                                                  requires_grad=False)
    sources = []
    import wcache._safe_open as so
    real = so.open_model
    monkeypatch.setattr(so, "open_model", lambda p: sources.append(real(p)) or sources[-1])
    assert load_model(module, files[0]) == (set(), [])
    assert [m.source for m in sources] == ["wcached"]
    with wcache.open_file(files[0]) as local:
        assert torch.equal(module.model.layers[0].w, local.torch("model.layers.0.w"))
        assert torch.equal(module.model.layers[0].b, local.torch("model.layers.0.b"))


def test_a_file_that_is_not_served_says_so_once(served, tmp_path, caplog, monkeypatch):
    """A file in the served directory that its model does not hold, and a
    file in a directory nobody serves: mapped here, one INFO line per
    directory naming the file; the directory attached for the check is
    released at once."""
    d, files = served
    extra = os.path.join(os.path.dirname(files[0]), "consolidated.safetensors")
    write_safetensors(extra, [("x", "F32", (2,), b"\0" * 8)])
    elsewhere = [str(tmp_path / n) for n in ("a.safetensors", "b.safetensors")]
    for p in elsewhere:
        write_safetensors(p, [("x", "F32", (2,), b"\0" * 8)])
    with caplog.at_level(logging.INFO, logger="wcache"):
        for p in (extra, extra, elsewhere[0], elsewhere[1]):
            with wcache.safe_open(p) as f:
                assert f.model.source == "file", p
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(said) == 2, said
    assert extra in said[0] and "serves its directory" in said[0] and \
        "not this file" in said[0], said[0]
    assert elsewhere[0] in said[1] and "is not served" in said[1] and \
        f"nor is its directory {tmp_path}" in said[1], said[1]
    wait_until(lambda: attached(d) == 0, what="the directory's release")

    # without a daemon nothing is said: the file is not shared and not expected to be
    monkeypatch.setenv("WCACHE_SOCKET", str(tmp_path / "nobody.sock"))
    use(monkeypatch, None)
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="wcache"):
        with wcache.safe_open(elsewhere[0]) as f:
            assert f.model.source == "file"
    assert not caplog.records


def test_a_directory_served_by_its_real_path(served, tmp_path):
    """A shard opened through a symlink to the served directory: the
    directory's absolute path is not served, its real path is."""
    d, files = served
    os.symlink(os.path.dirname(files[0]), tmp_path / "link")
    with wcache.safe_open(str(tmp_path / "link" / SHARDS[2])) as f:
        assert f.model.source == "wcached"
        same_as_the_file(f, files[2])


def test_a_replaced_shard(served):
    """A shard renamed over: once wcached serves the new generation, the
    directory is attached anew (the registry's is stale), and the old
    generation stays attached for the handle that holds it."""
    d, files = served
    old = wcache.safe_open(files[1])
    assert old.model.source == "wcached" and old.model.generation == 1
    before = old.get_tensor("model.layers.1.w").clone()
    new = os.path.join(os.path.dirname(os.path.dirname(files[1])), "new")
    write_model(new, seed=7)
    os.rename(os.path.join(new, SHARDS[1]), files[1])  # wcached sees it (inotify)
    wait_until(old.model.stale, what="the old generation to go stale")
    with wcache.safe_open(files[1]) as f:
        assert f.model.source == "wcached" and f.model.generation == 2
        assert not torch.equal(f.get_tensor("model.layers.1.w"), before)
        same_as_the_file(f, files[1])
        assert generations(d) == {1: 1, 2: 1}
    assert torch.equal(old.get_tensor("model.layers.1.w"), before)
    old.close()
    wait_until(lambda: generations(d) in ({2: 0}, {1: 0, 2: 0}), what="both releases")


def test_a_child_of_fork_attaches_on_its_own_connection(served):
    d, files = served
    with wcache.safe_open(files[0]) as f:
        assert f.model.source == "wcached"
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                with wcache.safe_open(files[1]) as g:
                    assert g.model.source == "wcached"
                    assert attached(d) == 2
                    code = 0
            finally:
                os._exit(code)
        assert wait_child(pid) == 0
        assert attached(d) == 1


@pytest.fixture
def hub(tmp_path):
    """A Hugging Face hub cache (snapshots/REV/FILE -> ../../blobs/HASH) and
    README's stable symlink srv/tiny -> snapshots/REV; returns (snapshot
    dir, stable dir)."""
    repo = tmp_path / "hub" / "models--org--tiny"
    plain = write_model(str(tmp_path / "plain"))
    snap = repo / "snapshots" / "0123abcd"
    os.makedirs(repo / "blobs")
    os.makedirs(snap)
    for p in plain + [os.path.join(os.path.dirname(plain[0]), "model.safetensors.index.json")]:
        blob = f"{abs(hash(os.path.basename(p))):016x}"
        os.rename(p, repo / "blobs" / blob)
        os.symlink(f"../../blobs/{blob}", snap / os.path.basename(p))
    os.makedirs(tmp_path / "srv")
    os.symlink(snap, tmp_path / "srv" / "tiny")
    return str(snap), str(tmp_path / "srv" / "tiny")


@pytest.fixture
def hub_served(hub, tmp_path, monkeypatch):
    os.makedirs(tmp_path / "d")
    d = Daemon(tmp_path / "d", {"tiny": hub[1]}).start()
    use(monkeypatch, d)
    yield d, hub
    import wcache._safe_open as so
    so._shared = None
    assert d.stop() == 0, d.read_log()


def test_hub_cache_by_the_configured_stable_path(hub_served):
    """The shards are symlinks into blobs/: the file is the blob wcached
    mapped (its real path is not the snapshot's)."""
    d, (snap, stable) = hub_served
    with wcache.safe_open(os.path.join(stable, SHARDS[0])) as f:
        assert f.model.source == "wcached"
        same_as_the_file(f, os.path.join(snap, SHARDS[0]))
        assert attached(d, "tiny") == 1


def test_hub_cache_by_the_snapshot_path(hub_served):
    """A worker loading by hub id opens snapshots/REV/FILE: its directory is
    the real path of the configured symlink, which wcached matches since
    8ab4020 (a model by the real path of its configured path)."""
    d, (snap, stable) = hub_served
    with wcache.safe_open(os.path.join(snap, SHARDS[1])) as f:
        assert f.model.source == "wcached"
        same_as_the_file(f, os.path.join(snap, SHARDS[1]))
        assert attached(d, "tiny") == 1


def test_a_generation_modified_in_place_is_refused_for_its_shards(served, caplog):
    """Review rev165 F1: wcached refuses a generation one of whose files was
    written in place (ESTALE "modified in place"). The file written in
    place raises that refusal, as a named attach of the directory does,
    while the directory is held (its ctime is not the one the generation
    was attached with, so wcached is asked), and any file of it once
    nothing holds the directory. A file the held generation maps that was
    not written since it was attached (the same device, inode, size, mtime
    and ctime) is that generation's, opened before or not: its bytes are
    the file's (review rev172: the first pass asks wcached nothing).
    Before rev165 the written one came "wcached" through the held
    generation and the last was mapped here with an INFO line."""
    import errno
    import gc
    d, files = served
    holder = wcache.safe_open(files[0])
    again = wcache.safe_open(files[1])
    assert holder.model.source == again.model.source == "wcached"
    again.close()
    with open(files[1], "r+b") as f:  # in place, same size
        f.seek(-8, 2)
        f.write(b"\x7f" * 8)
    d.wait_for_log("modified in place")
    with pytest.raises(wcache.WcacheError) as named:
        wcache.safe_open(os.path.dirname(files[1]))
    with pytest.raises(wcache.WcacheError) as e:
        wcache.safe_open(files[1])
    assert e.value.errno == errno.ESTALE == named.value.errno, e.value
    assert "modified in place" in str(e.value), e.value
    # shard 0, opened before, and shard 2, not: both unchanged, the held generation's
    for path in (files[0], files[2]):
        with wcache.safe_open(path) as f:
            assert f.model.source == "wcached" and \
                f.model.generation == holder.model.generation, path
            same_as_the_file(f, path)
    holder.close()
    del holder, f
    gc.collect()
    wait_until(lambda: attached(d) == 0, what="the directory's release")
    with pytest.raises(wcache.WcacheError) as e:
        wcache.safe_open(files[2])
    assert e.value.errno == errno.ESTALE, e.value
    assert not [r for r in caplog.records if "mapped in this process" in r.getMessage()]


def test_a_directory_that_failed_to_load_warns_and_maps_here(tmp_path, monkeypatch, caplog):
    """Review rev165 F1: a directory wcached could not load (EIO "failed to
    load") is said once at WARNING, and its files are mapped here, as a
    path that failed to load is (before: an INFO line only)."""
    files = write_model(str(tmp_path / "llama"))
    with open(files[2], "r+b") as f:  # not safetensors: the model fails to load
        f.write(b"\xff" * 16)
    os.makedirs(tmp_path / "d")
    d = Daemon(tmp_path / "d", {"llama": str(tmp_path / "llama")}).start()
    use(monkeypatch, d)
    try:
        with caplog.at_level(logging.INFO, logger="wcache"):
            for p in (files[0], files[1]):
                with wcache.safe_open(p) as f:
                    assert f.model.source == "file"
                    same_as_the_file(f, p)
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == 1, warned
        assert "failed to load" in warned[0] and os.path.dirname(files[0]) in warned[0], warned
    finally:
        import wcache._safe_open as so
        so._shared = None
        assert d.stop() == 0, d.read_log()


def test_a_staged_directory_says_why_its_shards_are_mapped_here(tmp_path, monkeypatch, caplog):
    """Review rev165 F2: wcached serves a staged directory model from its
    copy in stage_dir, so a shard opened by its own path is not one of the
    files it maps: mapped here, and the INFO line says that staging may be
    why (before: "not listed in it, or replaced since" only)."""
    files = write_model(str(tmp_path / "llama"))
    os.makedirs(tmp_path / "d")
    d = Daemon(tmp_path / "d", {"llama": (str(tmp_path / "llama"), {"stage": "yes"})},
               extra=f"stage_dir = {tmp_path}/d/stage").start()
    use(monkeypatch, d)
    try:
        with caplog.at_level(logging.INFO, logger="wcache"):
            with wcache.safe_open(files[1]) as f:
                assert f.model.source == "file"
        said = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
        assert len(said) == 1 and "served from a staged copy" in said[0], said
    finally:
        import wcache._safe_open as so
        so._shared = None
        assert d.stop() == 0, d.read_log()


def test_what_was_said_is_bounded(served, tmp_path, caplog):
    """Review rev165 F4: the directories named once (_safe_open._told) and
    the lines said once (_device._logged) keep the last 256: a process that
    opens a file in each of 300 directories nobody serves keeps no more;
    the newest is still not said twice, the oldest may be said again."""
    import wcache._device as dev
    import wcache._safe_open as so
    paths = []
    for i in range(300):
        p = tmp_path / f"step{i}" / "model.safetensors"
        os.makedirs(p.parent)
        write_safetensors(str(p), [("x", "F32", (2,), b"\0" * 8)])
        paths.append(str(p))
    with caplog.at_level(logging.INFO, logger="wcache"):
        for p in paths + [paths[-1], paths[0]]:
            with wcache.safe_open(p) as f:
                assert f.model.source == "file"
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(said) == 301, len(said)
    assert paths[0] in said[-1]
    assert len(so._told) <= 256 and len(dev._logged) <= 256, (len(so._told), len(dev._logged))


def test_loader_threads_attach_the_directory_once(tmp_path, monkeypatch):
    """Review rev174 F3: transformers' loader threads open shards of one
    directory at once; the first pass attaches it once, the other threads
    waiting for that attach (before, each thread that found no entry
    attached it: up to 4 replies of N + 2 descriptors and N mappings). The
    attach is slowed so that the threads overlap."""
    import threading
    import wcache._shards as shards
    d, files = serve_big(tmp_path, monkeypatch, 8)
    calls, real = [], shards._attach

    def slow_attach(*args):
        calls.append(args[1])
        time.sleep(0.2)
        return real(*args)

    monkeypatch.setattr(shards, "_attach", slow_attach)
    start, state, errors = threading.Barrier(4), {}, []

    def load(paths):
        try:
            start.wait()
            for p in paths:
                with wcache.safe_open(p, framework="pt") as f:
                    assert f.model.source == "wcached", f.model
                    state.update({k: f.get_tensor(k) for k in f.keys()})
        except BaseException as e:  # reported below
            errors.append(e)

    try:
        threads = [threading.Thread(target=load, args=(files[i::4],)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert len(state) == 2 * len(files)
        assert calls == [os.path.dirname(files[0])]
    finally:
        state.clear()
        import wcache._safe_open as so
        so._shared = None
        assert d.stop() == 0, d.read_log()


def test_a_shard_bind_mounted_into_the_directory_opens_here_and_through_wcached(
        tmp_path, monkeypatch):
    """The layouts a container gives (docker -v host/shard:/models/m/shard,
    a Kubernetes subPath mount of one file): a directory model's second
    shard is a bind mount of a file on another local filesystem (a tmpfs).
    wcached refuses only a remote filesystem's mount inside a model's tree
    (review rev202 H1); this process's own open (libwcache, no daemon)
    crosses any mount, and wcached crosses this one: both give the shard's
    tensors. Needs root (mount(8))."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs and bind-mount a file")
    files = write_model(str(tmp_path / "llama"))
    other = tmp_path / "other"
    other.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(other)], check=True)
    try:
        shutil.move(files[1], other / SHARDS[1])
        with open(files[1], "wb"):
            pass
        subprocess.run(["mount", "--bind", str(other / SHARDS[1]), files[1]], check=True)
        try:
            assert os.stat(files[1]).st_dev != os.stat(files[0]).st_dev
            use(monkeypatch, None)
            monkeypatch.setenv("WCACHE_SOCKET", str(tmp_path / "nobody.sock"))
            with wcache.open_file(str(tmp_path / "llama")) as m:
                assert len(m) == 6
            with wcache.safe_open(files[1]) as f:
                assert f.model.source == "file"
                same_as_the_file(f, files[1])
            os.makedirs(tmp_path / "d")
            d = Daemon(tmp_path / "d", {"llama": str(tmp_path / "llama")}).start()
            use(monkeypatch, d)
            try:
                with wcache.safe_open(files[1]) as f:
                    assert f.model.source == "wcached", d.read_log()[-2000:]
                    same_as_the_file(f, files[1])
            finally:
                import wcache._safe_open as so
                so._shared = None
                assert d.stop() == 0, d.read_log()
        finally:
            subprocess.run(["umount", "-l", files[1]], capture_output=True)
    finally:
        subprocess.run(["umount", "-l", str(other)], capture_output=True)
