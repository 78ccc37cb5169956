"""The owner of a served model file attacks through it (README, "Threat
model": the deployer who writes a model's files can replace the model, and
wcached must tell its workers when she changes it any other way):

  - on a remote filesystem served where it is (stage = no), she rewrites
    the file in place, keeping its size, and puts its mtime back with
    utimensat: the poll compared size and mtime only, so the generation
    stayed ready and new workers were handed bytes other than those that
    were validated, unwarned. inotify's check (watch.c) already compared
    the ctime, which no writer can put back; the poll now does too;
  - the same write during the first staging copy of a remote model: the
    copy's checks compared size and mtime only, and a copy mixing two
    versions was served; the ctime now fails the staging;
  - a hub snapshot's blob (snapshots/REV/x -> ../../blobs/H) written in
    place, same size: inotify watches the snapshot's directory, where the
    blob's writes make no event, so the generation stayed ready forever;
    the residency check (every 5 s, off the loop) now compares each
    file's fstat as well.

Each asserts what the old code got wrong, so it fails there."""
import os

from conftest import mkmodel, wait_until
from ctlutil import model_entry
from test_regressions import ready
from test_regressions import start as local_start  # noqa: F401 (the fixture, used by name)
from test_shared_storage import remote, remote_model, start, wait_generation  # noqa: F401


def test_remote_write_in_place_with_its_mtime_put_back_is_seen(start, tmp_path, remote):
    path = remote_model(tmp_path, remote, layers=2, hidden=64, ffn=128, vocab=100)
    d = start({"m": (path, {"poll_interval": "0.2", "stage": "no"})})
    wait_generation(d, "m", 1)
    backing = remote.backing_path("m.safetensors")
    before = os.stat(backing)
    with open(backing, "r+b") as f:  # the last bytes of tensor data, same size
        f.seek(before.st_size - 64)
        f.write(b"\xa5" * 64)
    os.utime(backing, ns=(before.st_atime_ns, before.st_mtime_ns))
    now = os.stat(backing)
    assert (now.st_size, now.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert now.st_ctime_ns != before.st_ctime_ns
    wait_until(lambda: model_entry(d, "m")["generations"][0]["state"] == "modified",
               timeout=15, what="generation 1 marked modified")
    d.wait_for_log(r'model "m": .*m\.safetensors was written in place', timeout=10)


def test_a_source_rewritten_during_its_staging_with_its_mtime_put_back_is_not_served(tmp_path):
    """A model on a slow remote server, staged (stage = yes): while its
    first copy runs, the owner rewrites the source's first bytes of tensor
    data in place, at the same size, and puts its mtime back. The copy's
    checks compared size and mtime only, so the copy (the old version's
    end, the new version's start: a mix no one published) was served; the
    ctime, which no writer can put back, now fails the staging."""
    import test_stage as ts
    rfs = ts.remotefs()
    with rfs.RemoteFS(tmp_path / "backing", tmp_path / "mnt", read_rate=ts.SLOW,
                      attr_timeout=0.2) as fs:
        backing = fs.backing_path("m.safetensors")
        ts.write_safetensors(backing, {"w": os.urandom(ts.BIG)})
        d, stage_dir = ts.stage_daemon(tmp_path, {"m": (fs.path("m.safetensors"),
                                                        {"stage": "yes", "watch": "inotify"})})
        d.start(timeout=120)
        fd = None
        try:
            fd = ts.copy_in_flight(rfs, stage_dir, "m", "m.safetensors")
            before = os.stat(backing)
            with open(backing, "r+b") as f:
                f.seek(before.st_size - ts.BIG)  # the tensor's first bytes
                f.write(b"\xa5" * 4096)
            os.utime(backing, ns=(before.st_atime_ns, before.st_mtime_ns))
            assert os.stat(backing).st_mtime_ns == before.st_mtime_ns
            _, line = d.wait_for_log(r'model "m": cannot stage it: .*; not served', timeout=60)
            assert "changed during the copy (its ctime moved" in line, line
        finally:
            if fd is not None:
                os.close(fd)
            assert d.stop() == 0, d.read_log()


def test_a_hub_blob_written_in_place_is_seen(local_start, tmp_path):
    """A hub snapshot's file is a symlink to ../../blobs/: inotify watched
    the snapshot's directory, where the blob's writes make no event, and
    nothing else looked, so the owner rewrote the blob in place (keeping
    its size) and the generation stayed ready, handing new workers bytes
    other than those validated, unwarned. The residency check, every 5 s
    off the loop, now compares each file's fstat too."""
    repo = tmp_path / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    (repo / "snapshots" / "rev1").mkdir(parents=True)
    blob = mkmodel(repo / "blobs" / "0123abcd", layers=2, hidden=64, ffn=128, vocab=100)
    os.symlink("../../blobs/0123abcd", repo / "snapshots" / "rev1" / "model.safetensors")
    d = local_start({"m": str(repo / "snapshots" / "rev1")})
    ready(d, "m")
    size = os.stat(blob).st_size
    with open(blob, "r+b") as f:  # the last bytes of tensor data, same size
        f.seek(size - 64)
        f.write(b"\xa5" * 64)
    wait_until(lambda: model_entry(d, "m")["generations"][0]["state"] == "modified",
               timeout=20, what="generation 1 marked modified")
    d.wait_for_log(r'model "m": .* of generation 1 was modified in place', timeout=10)
