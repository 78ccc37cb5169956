"""Hot swap: models replaced by rename(2) become new generations while
workers keep reading the generation they hold; files written in place are
refused; nothing stays open afterwards."""
import json
import os
import subprocess

from conftest import Daemon, binary, fd_count, mkmodel, settled_fd_count, wait_until
from ctlutil import ctl, model_entry
from test_warm_restart import write_shards

LAYERS = dict(layers=2, hidden=64, ffn=128, vocab=64)


def generation(d, name="m"):
    r = d.attach(name, "--json")
    return json.loads(r.stdout)["generation"] if r.returncode == 0 else None


def replace(path, seed, tmpdir):
    """Writes a new model beside path and renames it over path."""
    tmp = os.path.join(tmpdir, f".new-{seed}.safetensors")
    mkmodel(tmp, seed=seed, **LAYERS)
    os.rename(tmp, path)


def model_mappings(pid):
    with open(f"/proc/{pid}/maps") as f:
        return [line for line in f if ".safetensors" in line]


def test_swap_under_load(tmp_path):
    path = mkmodel(tmp_path / "m.safetensors", seed=1, **LAYERS)
    d = Daemon(tmp_path, {"m": path}).start()
    try:
        wait_until(lambda: generation(d) == 1, what="generation 1")
        base = settled_fd_count(d.proc.pid)
        workers = [subprocess.Popen([binary("demo_worker"), "--socket", d.socket, "--loop",
                                     "12", "m"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True) for _ in range(3)]
        for seed in range(2, 52):
            before = generation(d)
            replace(path, seed, tmp_path)
            wait_until(lambda: (generation(d) or 0) > before, what=f"swap to seed {seed}")
        final = generation(d)
        assert final == 51
        for w in workers:
            out, err = w.communicate(timeout=60)
            assert w.returncode == 0, err  # every byte matched its generation, no signal
            r = json.loads(out)
            assert r["checks"] > 0 and r["swaps"] > 0
        # Only the current generation stays open.
        wait_until(lambda: fd_count(d.proc.pid) == base, what="fds back to baseline")
        maps = model_mappings(d.proc.pid)
        assert all("(deleted)" not in m for m in maps), maps
        assert "generation 50 closed" in d.read_log()
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_series_of_swaps_is_not_backed_off(tmp_path):
    """Swaps (a new file renamed over the model's name) are updates, not a
    file changing in a loop: watch.h's backoff counts only changes of a file
    at its name, so ten swaps in a row each reload after the settle time.
    Before, the sixth began a backoff that doubled up to 30 s and never
    ended while the swaps went on (test_swap_under_load took 25 minutes)."""
    path = mkmodel(tmp_path / "m.safetensors", seed=1, **LAYERS)
    d = Daemon(tmp_path, {"m": path}).start()
    try:
        wait_until(lambda: generation(d) == 1, what="generation 1")
        for seed in range(2, 12):
            before = generation(d)
            replace(path, seed, tmp_path)
            wait_until(lambda: (generation(d) or 0) > before, what=f"swap to seed {seed}")
        assert generation(d) == 11
        assert "backing off" not in d.read_log(), d.read_log()
    finally:
        assert d.stop() == 0, d.read_log()


def test_invalid_replacement_keeps_serving(tmp_path):
    path = mkmodel(tmp_path / "m.safetensors", seed=1, **LAYERS)
    d = Daemon(tmp_path, {"m": path}).start()
    try:
        assert generation(d) == 1
        bad = tmp_path / ".bad.safetensors"
        bad.write_bytes(open(path, "rb").read()[:-100])
        os.rename(bad, path)
        wait_until(lambda: "m.safetensors" in d.read_log().split("reloading")[-1]
                   and "still serving" in d.read_log(), what="the failed reload")
        assert generation(d) == 1
        # A good file after the bad one is served.
        replace(path, 3, tmp_path)
        wait_until(lambda: generation(d) == 2, what="generation 2")
    finally:
        assert d.stop() == 0, d.read_log()


def test_in_place_truncate_is_refused(tmp_path):
    path = mkmodel(tmp_path / "m.safetensors", seed=1, **LAYERS)
    d = Daemon(tmp_path, {"m": path}).start()
    try:
        assert generation(d) == 1
        os.truncate(path, os.path.getsize(path) - 4096)
        wait_until(lambda: d.attach("m").returncode != 0, what="attach refused")
        r = d.attach("m")
        assert "modified in place" in r.stderr and "rename" in r.stderr
        assert "modified in place" in d.read_log()
        # Renaming a good file over it serves again, as a new generation.
        replace(path, 5, tmp_path)
        wait_until(lambda: generation(d) == 2, what="generation 2 after rename")
    finally:
        assert d.stop() == 0, d.read_log()


def test_in_place_write_is_refused(tmp_path):
    path = mkmodel(tmp_path / "m.safetensors", seed=1, **LAYERS)
    d = Daemon(tmp_path, {"m": path}).start()
    try:
        assert generation(d) == 1
        with open(path, "r+b") as f:  # dd conv=notrunc
            f.seek(os.path.getsize(path) - 10)
            f.write(b"0123456789")
        wait_until(lambda: d.attach("m").returncode != 0, what="attach refused")
    finally:
        assert d.stop() == 0, d.read_log()


def test_chmod_of_a_served_file_is_mended_by_the_operators_reload(tmp_path):
    """A chmod (even one that changes nothing) moves the file's ctime, which
    wcached cannot tell from a write whose writer put the mtime back: the
    generation is marked modified and refused. `wcachectl reload NAME` loads
    the same files again, validated, as a new generation: no rewrite and
    rename of every file is needed to serve the model again (review rev181
    F12). A watched reload of the same files does not (the owner's own change
    is not taken as the operator's word)."""
    path = mkmodel(tmp_path / "m.safetensors", seed=1, **LAYERS)
    d = Daemon(tmp_path, {"m": path}).start()
    try:
        assert generation(d) == 1
        os.chmod(path, os.stat(path).st_mode & 0o7777)  # the same mode
        wait_until(lambda: d.attach("m").returncode != 0, what="attach refused")
        assert "modified in place" in d.attach("m").stderr
        d.wait_for_log(r'model "m": .* of generation 1 was modified in place')
        r = ctl(d, "reload", "m")
        assert r.returncode == 0, r.stdout + r.stderr
        wait_until(lambda: generation(d) == 2, what="generation 2 after the operator's reload")
        assert "loads its files again" in d.read_log(), d.read_log()[-2000:]
    finally:
        assert d.stop() == 0, d.read_log()


def test_sharded_model_swapped_by_index_rename(tmp_path):
    """Shards written under new names, then the index renamed last."""
    import struct
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()

    # Two shards holding disjoint tensors: build them from one model's header.
    def shard(v):
        full = mkmodel(tmp_path / f"full{v}.safetensors", seed=v, layers=2, hidden=32, ffn=64,
                       vocab=16)
        data = open(full, "rb").read()
        n = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8:8 + n])
        meta = header.pop("__metadata__")
        body = data[8 + n:]
        names = sorted(header, key=lambda k: header[k]["data_offsets"][0])
        halves = [names[:len(names) // 2], names[len(names) // 2:]]
        weight_map = {}
        for i, part in enumerate(halves):
            out, off, blob = {"__metadata__": meta}, 0, b""
            for k in part:
                a, b = header[k]["data_offsets"]
                out[k] = dict(header[k], data_offsets=[off, off + b - a])
                blob += body[a:b]
                off += b - a
            h = json.dumps(out).encode()
            h += b" " * (-len(h) % 8)
            fname = f"model-v{v}-0000{i + 1}-of-00002.safetensors"
            with open(shard_dir / fname, "wb") as f:
                f.write(struct.pack("<Q", len(h)) + h + blob)
            for k in part:
                weight_map[k] = fname
        tmp = shard_dir / ".index.tmp"
        tmp.write_text(json.dumps({"metadata": {"total_size": len(body)},
                                   "weight_map": weight_map}))
        os.rename(tmp, shard_dir / "model.safetensors.index.json")

    shard(1)
    d = Daemon(tmp_path, {"m": str(shard_dir / "model.safetensors.index.json")}).start()
    try:
        assert generation(d) == 1
        holder = subprocess.Popen([binary("demo_worker"), "--socket", d.socket, "--touch",
                                   "--hold", "m"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        assert json.loads(holder.stdout.readline())["generation"] == 1
        shard(2)
        wait_until(lambda: generation(d) == 2, what="generation 2 of the sharded model")
        assert "generation 1 closed" not in d.read_log()  # still held
        r = d.attach("m", "--touch", "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["generation"] == 2
        holder.stdin.write("\n")
        holder.stdin.close()
        assert holder.wait(timeout=30) == 0
        wait_until(lambda: "generation 1 closed" in d.read_log(), what="generation 1 closed")
    finally:
        assert d.stop() == 0, d.read_log()


def test_real_path_of_a_symlinked_snapshot_attaches(tmp_path):
    """README "Serving real models": a hub snapshot configured through a
    stable symlink, moved to a new revision by renaming a new symlink over
    it. A worker that loads by hub id names the snapshot's real directory:
    that attaches the model, the generation its name attaches, while that
    generation serves; a path that is none of the name, the configured path
    and that real path is not served. After the swap the new snapshot's real
    path attaches and the old one's no longer does, while a worker that
    attached by it keeps its generation. Before, only the configured path
    (the symlink) and the name attached."""
    snaps = tmp_path / "hub" / "models--org--m" / "snapshots"
    rev1, rev2 = snaps / "rev1", snaps / "rev2"
    for v, rev in enumerate((rev1, rev2), 1):
        rev.mkdir(parents=True)
        write_shards(tmp_path, rev, v)
    (tmp_path / "models").mkdir()
    link = tmp_path / "models" / "m"
    link.symlink_to(rev1)
    real1, real2 = os.path.realpath(rev1), os.path.realpath(rev2)
    d = Daemon(tmp_path, {"m": str(link)}).start()

    def not_served(name):
        r = d.attach(name)
        return r.returncode == 1 and \
            f'model "{name}" is not served by wcached at {d.socket}' in r.stderr
    try:
        wait_until(lambda: generation(d) == 1, what="generation 1")
        assert generation(d, real1) == 1
        assert generation(d, str(link)) == 1
        assert model_entry(d, "m")["resolved_path"] == real1
        holder = subprocess.Popen([binary("demo_worker"), "--socket", d.socket, "--touch",
                                   "--hold", real1], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        assert json.loads(holder.stdout.readline())["generation"] == 1
        for other in (real2, os.path.join(real1, "model-v1-00001-of-00002.safetensors"),
                      str(snaps), real1 + "/"):
            assert not_served(other), other
        new = tmp_path / "models" / ".m.new"
        new.symlink_to(rev2)
        os.rename(new, link)
        wait_until(lambda: generation(d) == 2, what="generation 2 after the symlink swap")
        assert generation(d, real2) == 2
        assert not_served(real1)
        assert model_entry(d, "m")["resolved_path"] == real2
        holder.stdin.write("\n")
        holder.stdin.close()
        assert holder.wait(timeout=30) == 0  # it read generation 1 to the end
        wait_until(lambda: "generation 1 closed" in d.read_log(), what="generation 1 closed")
    finally:
        assert d.stop() == 0, d.read_log()
