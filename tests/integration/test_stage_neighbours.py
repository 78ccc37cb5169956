"""Staging looks at a model's path only by the judged walk (daemon/mountrule.h),
never by name (README, "Models in directories others may write in").

A staged model's path is looked at again by the staging: its path (is it a
directory, has it a shard index) when the copy starts, and each source's
path about once a second during the copy and once after it (is it still
the file copied). Those were stat(2)s by name: a neighbour who renamed his
link to his own FUSE mount, whose server never answers, onto the path
(while the copy ran, or while the staging waited for its turn on the work
queue) held a work thread on his server for good, and wcached's stop with
it. Now each look is mountrule's walk, which refuses a user's FUSE mount
met on the way without asking its server: the staging fails with one line
naming the path and the mount, other models are served, and wcached stops
at once. On tests/tools/remotefs (a FUSE filesystem that behaves as a
network one, stage = yes) with its reads throttled so that a copy, or the
wait behind one, lasts long enough to rename in; the neighbour's mount is
tests/pyutil/fusehang.py's, mounted as root as fusermount would for him
(the tests skip, saying why, where neither can be had). Nothing may reach
bob's server: its requests never answered (FuseHang.ops) must stay none (a
thread of wcached's seen waiting on some FUSE server could be one reading
the remote filesystem's throttled files)."""
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import types

from conftest import binary, mkmodel, wait_until
from test_stage import (BIG, LAYERS, SLOW, copy_in_flight, entries, generation, problems,
                        remotefs, stage_daemon, write_safetensors)
from test_watch_writer_neighbours import BOB, neighbours_file

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from fusehang import FuseHang, neighbours_place  # noqa: E402

STOP_BOUND = 30  # seconds a stop may take here before the test calls it hung


def bobs_mount(tmp_path):
    """Skips without FUSE; else bob's file tmp_path/bob/evil, to mount on
    (his directory, which wcached may walk into)."""
    place = neighbours_place(tmp_path, "bob")
    os.chown(place, *BOB)
    evil = place / "evil"
    neighbours_file(evil, b"x")
    return evil


def rename_link_over(fs, name, target):
    """Bob's link name -> target, renamed over name in fs's backing
    directory (what the remote filesystem's clients see); waits until the
    mount shows the link (lstat: nothing followed into target)."""
    tmp = fs.backing_path(f".bob-link-{name}")
    os.symlink(str(target), tmp)
    os.lchown(tmp, *BOB)
    os.rename(tmp, fs.backing_path(name))

    def shown():
        try:
            return os.readlink(fs.path(name)) == str(target)
        except OSError:
            return False
    wait_until(shown, timeout=30, what=f"{fs.path(name)} to show bob's link")


def nothing_held(d, hang, local):
    """After m's staging failed: no request waits on bob's server (hang),
    m is not served, the local model is (a worker reads every byte), and
    d's stop ends within STOP_BOUND seconds, with status 0 (not killed)."""
    assert hang.ops == [], ("requests wait on bob's FUSE server", hang.ops,
                            d.read_log()[-2000:])
    assert generation(d, "m") is None
    r = subprocess.run([binary("demo_worker"), "--socket", d.socket, "--verify", local,
                        "local"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["generation"] == 1, r.stdout
    status = d.stop(timeout=STOP_BOUND)
    assert status == 0, (f"wcached did not stop within {STOP_BOUND} s (status {status})",
                         d.read_log()[-3000:])


@contextlib.contextmanager
def beside_bob(tmp_path, write_models, env=None):
    """Skips without remotefs or FUSE. A slow remote filesystem (reads
    throttled to SLOW) whose backing directory write_models(fs) fills, bob's
    file with his FUSE mount on it (answering neither an open nor a stat),
    and wcached serving a local model, started with env: yields a
    namespace of fs, evil (bob's file), hang (his mount), d, stage_dir,
    local, staged (a staged model's options), conf (the configuration's
    models) and fds (descriptors closed at the end). d is stopped, if the
    test did not, once the mount is gone (its server's requests failed)."""
    rfs = remotefs()
    evil = bobs_mount(tmp_path)
    with rfs.RemoteFS(tmp_path / "backing", tmp_path / "mnt", read_rate=SLOW, stale="keep",
                      attr_timeout=0.2) as fs:
        write_models(fs)
        local = mkmodel(tmp_path / "local.safetensors", seed=2, **LAYERS)
        d, stage_dir = stage_daemon(tmp_path, {"local": local})
        d.start(env=env)
        t = types.SimpleNamespace(rfs=rfs, fs=fs, evil=evil, d=d, stage_dir=stage_dir,
                                  local=local, staged={"stage": "yes", "poll_interval": "60"},
                                  conf={"local": local}, fds=[])
        try:
            with FuseHang(evil, *BOB, getattr_too=True) as t.hang:
                try:
                    wait_until(lambda: generation(d, "local") == 1, what="local served")
                    yield t
                finally:
                    for fd in t.fds:
                        os.close(fd)
        finally:
            d.stop(timeout=5)


def load(t, name, path):
    """Adds model name (path, staged) to t's configuration, by SIGHUP."""
    t.conf[name] = (path, t.staged)
    t.d.write_config(t.conf, f"stage_dir = {t.stage_dir}\n")
    t.d.proc.send_signal(signal.SIGHUP)


def test_a_neighbours_link_renamed_over_a_source_during_its_copy_fails_the_staging(tmp_path):
    """m, 64 MiB on a slow remote filesystem, is staged (stage = yes). A
    second into the copy, bob renames his link over m's path, to his own
    file with a FUSE mount on it whose server answers neither an open nor a
    stat. The copy's next check of its sources walks the path, meets bob's
    mount and stops the staging: "m.safetensors was replaced during the
    copy: ... evil lies on fuse ... mounted by uid 64112"; no request waits
    on bob's server, the local model is served, and wcached stops at once.
    (Before, the check stat(2)ed the path by name: the copy's thread waited
    on bob's server for good, and the stop with it.)"""
    def models(fs):
        write_safetensors(fs.backing_path("m.safetensors"), {"w": os.urandom(BIG)})

    with beside_bob(tmp_path, models) as t:
        src = t.fs.path("m.safetensors")
        load(t, "m", src)
        t.fds.append(copy_in_flight(t.rfs, t.stage_dir, "m", "m.safetensors"))
        rename_link_over(t.fs, "m.safetensors", t.evil)
        _, line = t.d.wait_for_log(r'model "m": cannot stage it: ', timeout=30)
        assert re.search(re.escape(f"cannot stage it: {src} was replaced during the copy: ") +
                         r".*evil.* lies on fuse .*mounted by uid 64112", line), line
        assert len([p for p in problems(t.d) if "cannot stage it" in p]) == 1, problems(t.d)
        wait_until(lambda: not any(n.startswith(".m.tmp-") for n in entries(t.stage_dir)),
                   what="the unfinished copy removed")
        nothing_held(t.d, t.hang, t.local)


def test_a_neighbours_link_renamed_over_a_model_waiting_to_be_staged_fails_it(tmp_path):
    """m, a small model on a slow remote filesystem, is loaded (stage = yes)
    while another model's staging copies from the same filesystem: its load
    opens and checks it, then its staging waits for the filesystem's one
    place on the work queue (4 work threads: 2 for remote work, 1 for each
    remote filesystem). Meanwhile bob renames his link over m's path, to
    his file with a FUSE mount on it whose server answers neither an open
    nor a stat. When m's staging starts, its look at the model's path (a
    directory? a shard index?) walks into bob's mount and stops: one line
    naming the path and the mount; the other staging finishes, the local
    model is served, and wcached stops at once. (Before, that look was a
    stat(2) by name, which waited on bob's server for good.)"""
    def models(fs):
        write_safetensors(fs.backing_path("big.safetensors"), {"w": os.urandom(BIG)})
        mkmodel(fs.backing_path("m.safetensors"), seed=3, **LAYERS)

    with beside_bob(tmp_path, models, env=dict(os.environ, UV_THREADPOOL_SIZE="4")) as t:
        src = t.fs.path("m.safetensors")
        load(t, "big", t.fs.path("big.safetensors"))
        t.fds.append(copy_in_flight(t.rfs, t.stage_dir, "big", "big.safetensors"))
        load(t, "m", src)
        wait_until(lambda: work_queue(t.d)["remote_waiting"] >= 1, timeout=30,
                   what="m's staging waiting behind big's")
        assert not os.path.exists(os.path.join(t.stage_dir, "m.1"))
        rename_link_over(t.fs, "m.safetensors", t.evil)
        t.fs.unthrottle()
        _, line = t.d.wait_for_log(r'model "m": cannot stage it: ', timeout=60)
        assert re.search(re.escape(f"cannot stage it: {src}: ") + r".*evil.* lies on fuse "
                         r".*mounted by uid 64112", line), line
        t.d.wait_for_log(r'model "big": generation 1 staged from ', timeout=60)
        assert generation(t.d, "big") == 1
        assert entries(t.stage_dir) == ["big.1"], entries(t.stage_dir)
        nothing_held(t.d, t.hang, t.local)


def work_queue(d):
    r = subprocess.run([binary("wcachectl"), "--control", d.control, "status", "--json"],
                       capture_output=True, text=True, timeout=60)
    return json.loads(r.stdout)["work_queue"]
