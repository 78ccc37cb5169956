"""A model a warm restart took back is watched from what its check saw:
a shard index renamed over after the restart's check listed the model's
files, but before the model's directory was watched, is a change (watch.c
compares the model's path with the check's stat, restore_layout.c), as it
is after a load (the load's stat at open). Before, the restored
generation had no such baseline: the check of its paths when the watch was
armed compared only the shards, which the README's way of updating a
sharded model (new shards under new names, the index renamed over last)
leaves as they were, and the old shards served on for good.

The window is made wide on purpose: with one work thread
(UV_THREADPOOL_SIZE=1) a second model's warm restart check, on a "remote"
filesystem (tests/pyutil/remotefs.py) frozen meanwhile, holds the thread
after the first model's check, so the job that arms the first model's
watch waits behind it until the filesystem is thawed."""
import json
import os
import re
import sys

import pytest

from conftest import Daemon, mkmodel, wait_until
from test_warm_restart import generation, start, status, write_shards

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from fakemanager import FakeManager  # noqa: E402 (path set just above)
from remotefs import RemoteFS, skip_reason  # noqa: E402


def test_an_index_renamed_before_a_restored_model_is_watched_is_seen(tmp_path, monkeypatch):
    """Model m (a shard index on local disk) is restored; its index is
    renamed over (version 2) while the job that arms its watch waits
    behind model r's check, on a frozen remote filesystem. Once that check
    ends, m's watch is armed, sees that its index is not what the check
    listed, and m loads generation 2. Before: generation 1 for good."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    monkeypatch.setenv("UV_THREADPOOL_SIZE", "1")
    os.chmod(tmp_path, 0o755)
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    write_shards(tmp_path, shard_dir, 1)
    index = shard_dir / "model.safetensors.index.json"
    with RemoteFS(tmp_path / "backing", tmp_path / "mnt", attr_timeout=0.1) as fs:
        with open(mkmodel(tmp_path / "r.safetensors", seed=3), "rb") as f:
            fs.replace("r.safetensors", f.read())
        fs.wait_visible("r.safetensors")
        mgr = FakeManager(str(tmp_path / "notify.sock"))
        d = Daemon(tmp_path, {"m": str(index),
                              "r": (fs.path("r.safetensors"), {"stage": "no"})})
        try:
            start(d, mgr)
            wait_until(lambda: all(status(d).get(x, {}).get("state") == "ready"
                                   for x in ("m", "r")), what="m and r ready")
            mgr.wait_for(lambda m: "wc-desc" in m.store and
                         sum(k.endswith("-1-i") for k in m.store) == 2,
                         what="both generations and the description stored")
            assert d.stop() == 0, d.read_log()
            fs.freeze()
            try:
                start(d, mgr, *mgr.listen_fds())
                d.wait_for_log(r'model "m": generation 1 restored from the file descriptor '
                               r'store', timeout=30)
                # r's check holds the one work thread: m's watch is not
                # armed, and this rename makes no event it sees.
                assert 'model "r": generation 1 restored' not in d.read_log()
                write_shards(tmp_path, shard_dir, 2)
            finally:
                fs.thaw()
            d.wait_for_log(r'model "r": generation 1 restored from the file descriptor store',
                           timeout=30)
            wait_until(lambda: generation(d, "m") == 2, timeout=20,
                       what="generation 2 of m, its index renamed before it was watched")
            log = d.read_log()
            assert (f'model "m": generation 1: {index} changed before its directory was '
                    'watched') in log, log
            r = d.attach("m", "--touch", "--json")
            assert r.returncode == 0 and json.loads(r.stdout)["generation"] == 2, r.stdout
        finally:
            status_code = d.stop()
            mgr.close()
        assert status_code == 0, d.read_log()


def test_a_directory_changed_between_its_stat_and_its_watch_is_seen(tmp_path):
    """A directory model loaded at run time is watched for the first time
    by a work thread's job: stat the directory, add its watch. Its update
    (new shards, the index renamed over) made between the two is neither an
    event nor, before, a difference: the stat compared was the one before
    the watch, and generation 1 served on for good (review rev137 #1). Now
    the directory is stat'ed again once watched. The window is held open by
    strace, which delays each inotify_add_watch by 10 s: the update is made
    once the first of the job's two calls (the parent directory's) is done,
    while the second (the model's directory) waits."""
    import shutil
    import subprocess
    import time
    from conftest import binary
    strace = shutil.which("strace")
    if strace is None or subprocess.run([strace, "-qq", "-o", "/dev/null", "true"]).returncode:
        pytest.skip("needs strace, and ptrace allowed, to hold the window open")
    from test_control import all_traced
    os.chmod(tmp_path, 0o755)
    mdir = tmp_path / "models" / "m"
    mdir.mkdir(parents=True)
    write_shards(tmp_path, mdir, 1)
    trace = tmp_path / "strace.out"

    def added(path):
        """Whether strace saw inotify_add_watch(path) return (its line whole,
        or "unfinished" then the same thread's "resumed"). wcached arms a
        directory by its walk's descriptor N, "/proc/self/fd/N": the path
        is the one the open (or dup) that returned N last said (strace -y)."""
        pending, done, fds = {}, set(), {}
        for line in trace.read_text().splitlines() if trace.exists() else ():
            pid = line.split(None, 1)[0]
            opened = re.search(r" = (\d+)<(.*)>$", line)
            if opened:
                fds[opened.group(1)] = opened.group(2)
            if "inotify_add_watch(" in line:
                called = line.split('"')[1]
                if called.startswith("/proc/self/fd/"):
                    called = fds.get(called[len("/proc/self/fd/"):], called)
                if "<unfinished" in line:
                    pending[pid] = called
                elif ") = " in line:  # not a line strace is still writing
                    done.add(called)
            elif "<... inotify_add_watch resumed>" in line and pid in pending:
                done.add(pending.pop(pid))
        return str(path) in done

    d = Daemon(tmp_path, {"other": str(mkmodel(tmp_path / "o.safetensors", seed=9))})
    d.start()
    tracer = load = None
    try:
        tracer = subprocess.Popen([strace, "-f", "-qq", "-o", str(trace), "-y",
                                   "-p", str(d.proc.pid), "-e",
                                   "trace=inotify_add_watch,openat,openat2,fcntl",
                                   "-e", "inject=inotify_add_watch:delay_enter=10000000"])
        wait_until(lambda: all_traced(d.proc.pid), what="strace attached")
        load = subprocess.Popen([binary("wcachectl"), "load", "m", str(mdir), "--control",
                                 d.control], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_until(lambda: added(mdir.parent), timeout=60,
                   what="the parent directory's watch added")
        seen = time.monotonic()
        write_shards(tmp_path, mdir, 2)
        # Well inside the 10 s the model directory's inotify_add_watch waits
        # (10, not 3: a loaded machine's seconds are left 7 s): the update
        # is made before that watch exists.
        assert time.monotonic() - seen < 7.0, "the update took too long to fall in the window"
        assert not added(mdir), trace.read_text()
        wait_until(lambda: added(mdir), timeout=60, what="the model directory's watch added")
        _, err = load.communicate(timeout=60)
        assert load.returncode == 0, err
        tracer.terminate()
        tracer.wait(timeout=30)
        wait_until(lambda: generation(d, "m") == 2, timeout=20,
                   what="generation 2 of m, changed before its directory was watched")
        assert (f'model "m": generation 1: {mdir} changed before its directory was '
                'watched') in d.read_log(), d.read_log()
    finally:
        for p in (load, tracer):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(timeout=30)
        assert d.stop() == 0, d.read_log()
