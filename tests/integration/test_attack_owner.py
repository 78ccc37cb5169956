"""The owner of a served model file attacks through it (README, "Threat
model": the deployer who writes a model's files can replace the model, and
wcached must tell its workers when she changes it any other way):

  - on a remote filesystem served where it is (stage = no), she rewrites
    the file in place, keeping its size, and puts its mtime back with
    utimensat: the poll compared size and mtime only, so the generation
    stayed ready and new workers were handed bytes other than those that
    were validated, unwarned. inotify's check (watch.c) already compared
    the ctime, which no writer can put back; the poll now does too.

Each asserts what the old code got wrong, so it fails there."""
import os

from conftest import wait_until
from ctlutil import model_entry
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
