"""A hard link added or removed beside a served file moves its link count
and its ctime, which cannot be told from a write with its mtime put back in
the same interval (review rev222 M2). wcached loads the files again itself,
validated anew, paced, and keeps serving the generation meanwhile (README,
"Updating a model safely"): a neighbour's ln/rm keeps no worker out (review
rev225 H1, M1), a header written in place behind a link serves as the next
generation, and files that no longer validate are refused (fail closed).

One daemon serves a model per case (their pacing is per model): the cases
run in order, each waiting on its own model's log lines."""
import os
import pathlib
import re
import signal
import subprocess
import time

import pytest

from conftest import Daemon, binary, mkmodel, wait_until
from remotefs import RemoteFS  # tests/pyutil, on the path conftest set
from test_ctl_escape import sharded
from test_reload_refused import remote_place
from test_tree_places import ALICE_UID, BOB_UID, DAEMON_UID, GROUP, WCACHED_GID, as_bob, made_by
from test_tree_places import pytestmark

__all__ = ["pytestmark"]

CASES = ["private", "team", "header", "garbage", "broken_bak", "broken", "loop"]


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """alice's one-file model per case: in her own 0755 directory inside a
    root's shared/ (bob has his own there), or, for "team", straight in a
    root's 2775 place whose group may rename entries; a daemon serving
    them all, as an unprivileged user. Yields (daemon, {case: path}, bob's
    directory)."""
    tmp = tmp_path_factory.mktemp("links")
    shared = made_by(tmp / "shared", 0, 0o755)
    bob = made_by(os.path.join(shared, "bob"), BOB_UID)
    team = made_by(tmp / "team", 0, 0o2775)
    os.chmod(team, 0o2775)
    paths = {}
    for case in CASES:
        where = team if case == "team" else made_by(os.path.join(shared, case), ALICE_UID)
        m = mkmodel(os.path.join(where, "model.safetensors"), seed=1)
        os.chown(m, ALICE_UID, GROUP)
        os.chmod(m, 0o644)
        paths[case] = m
    # "sharded": a model configured by its shard index (rev227 M2)
    where = sharded(pathlib.Path(made_by(os.path.join(shared, "sharded"), ALICE_UID)) / "m",
                    {"a.safetensors": {"x": b"\x00" * 4096}, "b.safetensors": {"y": b"\x01" * 4096}})
    for name in os.listdir(where):
        os.chown(os.path.join(where, name), ALICE_UID, GROUP)
    os.chown(where, ALICE_UID, GROUP)
    paths["sharded"] = os.path.join(where, "model.safetensors.index.json")
    d = Daemon(tmp, paths, user=(DAEMON_UID, GROUP), nofile=1024).start()
    try:
        for case in CASES + ["sharded"]:
            d.wait_for_log(r'model "%s": generation 1 warm' % case)
        yield d, paths, bob
    finally:
        assert d.stop() == 0, d.read_log()


def count(d, pattern):
    """How many log lines so far match pattern."""
    d._follow_log()  # reads what the log has now
    rx = re.compile(pattern)
    return sum(1 for _, line in d.lines if rx.search(line))


def wait_count(d, pattern, n, timeout=90):
    """Waits until n log lines match pattern."""
    wait_until(lambda: count(d, pattern) >= n, timeout=timeout,
               what="%d lines matching %r" % (n, pattern))


def moved(name):
    return r'model "%s": model\.safetensors: its link count went from \d+ to \d+ and its ' \
        r'ctime moved' % name


def unchanged(name):
    return r'model "%s": generation 1: its files, loaded again after a link count change, ' \
        r'validated anew: unchanged' % name


def serves(d, name, generation):
    r = d.attach(name)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "generation %d," % generation in r.stdout, r.stdout
    return r


def checked(d, name):
    """A worker's attach of name, every byte checked against the pattern its
    "seed" metadata names: (exit status, output)."""
    r = subprocess.run([binary("demo_worker"), "--socket", d.socket, "--repeat", "1",
                        "--check", name], capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


def link_and_write_keeping_mtime(d, path, data):
    """Links path (a second name beside it) and writes data over it in
    place, at its size, its mtime put back (utimensat): only its ctime and
    link count move. wcached is stopped meanwhile, so that its watch, woken
    by the write, never sees the write's mtime before it is put back (that
    is a write in place, and fails closed)."""
    st = os.stat(path)
    assert len(data) == st.st_size
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(0.02)  # a ctime of a later clock tick than the load's
        os.link(path, path + ".bak")
        with open(path, "r+b") as f:
            f.write(data)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    now = os.stat(path)
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
    assert now.st_nlink == 2 and now.st_ctime_ns != st.st_ctime_ns


def test_a_neighbours_link_keeps_no_worker_out(place):
    """rev225 H1: bob's hard link of alice's file (made where
    fs.protected_hardlinks=0; root stands in for him for link(2) alone),
    then his own rm of it: every attach succeeds, generation 1 serves on,
    its files loaded again and found the same after each. Her file in her
    own directory, and in a team place (2775), side by side."""
    d, paths, bob = place
    cases = ["private", "team"]
    time.sleep(0.02)  # a ctime of a later clock tick than the load's
    for case in cases:
        os.link(paths[case], os.path.join(bob, case))
        serves(d, case, 1)
    for case in cases:
        wait_count(d, unchanged(case), 1)
        serves(d, case, 1)
    as_bob("rm %s" % " ".join(cases), bob)  # bob alone, no privilege; paced: 5 s after
    for case in cases:
        wait_count(d, unchanged(case), 2)
        serves(d, case, 1)
    log = d.read_log()
    for case in cases:
        assert 'model "%s": generation 2' not in log, log
        assert not re.search(r'model "%s": .*modified in place' % case, log), log


def test_a_header_written_in_place_behind_a_link_is_the_next_generation(place, tmp_path):
    """rev222 M2 while running: alice links her file and writes it in place
    at its size, a new header (another seed in its metadata) and data, its
    mtime put back. The files are loaded again: generation 2, of the new
    bytes (a worker checks them against the new seed); attaches never fail."""
    d, paths, _ = place
    m = paths["header"]
    new = mkmodel(tmp_path / "seed2.safetensors", seed=2)
    with open(new, "rb") as f:
        data = f.read()
    link_and_write_keeping_mtime(d, m, data)
    # Meanwhile generation 1, or 2 where the load again was quicker than
    # this attach (ci75, ASan: 2 already): never a refusal.
    r = d.attach("header")
    assert r.returncode == 0 and re.search(r"generation [12],", r.stdout), r.stdout + r.stderr
    d.wait_for_log(r"model \"header\": generation 1's model\.safetensors was written in place "
                   r"\(its header changed, its mtime put back\)")
    d.wait_for_log(r'model "header": generation 2 is current')
    serves(d, "header", 2)
    status, out = checked(d, "header")
    assert status == 0, out
    assert not re.search(r'model "header": .*modified in place', d.read_log())


def test_a_garbage_header_behind_a_link_is_refused(place):
    """As above, but the header written is no valid one: the files serving
    no longer validate, so generation 1 is marked modified and new
    attaches are refused (fail closed)."""
    d, paths, _ = place
    m = paths["garbage"]
    with open(m, "rb") as f:
        data = bytearray(f.read())
    data[8:24] = b"{garbage garbage"
    link_and_write_keeping_mtime(d, m, bytes(data))
    d.wait_for_log(r"model \"garbage\": generation 1's files no longer validate \(loaded again "
                   r"after a link count change: ")
    d.wait_for_log(r'model "garbage": .*generation 1 was modified in place')
    r = d.attach("garbage")
    assert r.returncode != 0 and "modified in place" in r.stdout + r.stderr, r.stdout + r.stderr


@pytest.mark.parametrize("case", ["broken_bak", "broken"])
def test_a_broken_version_renamed_over_a_linked_file_keeps_serving(place, case):
    """rev225 M1's third case: alice's file has a second name (a backup
    link, or none for the control) and a broken new version is renamed over
    its path: its link count drops with the rename. The load fails, the
    path names another file, so generation 1 serves on, as after any failed
    replacement."""
    d, paths, _ = place
    m = paths[case]
    if case == "broken_bak":
        time.sleep(0.02)
        os.link(m, m + ".bak")
        wait_count(d, unchanged(case), 1)
        serves(d, case, 1)
    bad = os.path.join(os.path.dirname(m), ".new")
    with open(bad, "wb") as f:
        f.write(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    os.rename(bad, m)
    d.wait_for_log(r'model "%s": .*generation 1 still serving' % case)
    if case == "broken_bak":
        # the link count drop is seen (a residency check), and loaded again
        wait_count(d, moved(case), 2)
        wait_count(d, r'model "%s": .*generation 1 still serving' % case, 3)
    serves(d, case, 1)
    assert not re.search(r'model "%s": .*modified in place' % case, d.read_log())


def test_a_broken_shard_renamed_over_a_linked_shard_keeps_serving(place):
    """rev227 M2: a model configured by its shard index, one shard with a
    second name (alice's cp -al snapshot), and a broken new version of that
    shard renamed over it: the old shard's link count drops, its files are
    loaded again and the load fails on the new shard. The configured path
    (the index, untouched) said nothing of which file failed: generation 1
    was marked modified, attaches refused. It serves on, as after any
    failed replacement."""
    d, paths, bob = place
    where = os.path.dirname(paths["sharded"])
    b = os.path.join(where, "b.safetensors")
    time.sleep(0.02)
    os.link(b, os.path.join(bob, "b.snapshot"))
    wait_count(d, unchanged("sharded"), 1)
    bad = os.path.join(where, ".b.new")
    with open(bad, "wb") as f:
        f.write(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    os.rename(bad, b)
    # the rename's reload fails; then the link count drop, loaded again, fails
    wait_count(d, r'model "sharded": b\.safetensors: its link count went from 2 to 1', 1)
    wait_count(d, r'model "sharded": .*generation 1 still serving', 3)
    serves(d, "sharded", 1)
    assert not re.search(r'model "sharded": .*(modified in place|no longer validate)',
                         d.read_log()), d.read_log()


def test_links_made_in_a_loop_keep_no_worker_out_and_are_paced(place):
    """bob makes a new hard link of alice's file every 200 ms for 12 s (a
    snapshot or dedup tool; root stands in for him for link(2)), then
    removes them all: every attach succeeds, generation 1 serves on, and
    its files are loaded again a few times only (the settle time, then 5 s
    and 10 s after the one before). (A link made and removed again between
    two checks leaves the link count as it was: that is a ctime moved alone,
    a chmod or a write, README: not this.)"""
    d, paths, bob = place
    m = paths["loop"]
    links = []
    end = time.monotonic() + 12
    while time.monotonic() < end:
        links.append(os.path.join(bob, "loop.%d" % len(links)))
        os.link(m, links[-1])
        serves(d, "loop", 1)
        time.sleep(0.2)
    d.wait_for_log(r'model "loop": links of its files keep changing: each reload of them '
                   r'waits 5 s to 60 s')
    n = count(d, moved("loop"))
    assert 2 <= n <= 4, d.read_log()
    for link in links:
        os.unlink(link)
    wait_count(d, moved("loop"), n + 1)
    serves(d, "loop", 1)
    log = d.read_log()
    assert count(d, r'model "loop": links of its files keep changing') == 1, log
    assert 'model "loop": generation 2' not in log, log
    assert not re.search(r'model "loop": .*modified in place', log), log


def test_a_snapshot_linking_two_files_of_a_remote_model_is_validated_anew(tmp_path):
    """A polled remote 2775 place (FUSE, stage = no): root's model of two
    shards, both linked at once into a snapshot beside it (cp -al): the
    reload knows each file by the ctime the move gave it, so it validates
    them anew. Only the first file's was kept (review rev227 M3): the
    second was "not one of the files serving", refused each paced minute,
    never validated."""
    backing, mnt, shared = remote_place(tmp_path)
    llama = pathlib.Path(shared) / "llama"
    sharded(llama, {"a.safetensors": {"x": b"\x00" * 4096}, "b.safetensors": {"y": b"\x01" * 4096}})
    os.chmod(llama, 0o2775)
    snap = made_by(os.path.join(shared, "snap"), 0)
    with RemoteFS(backing, mnt, attr_timeout=0.1):
        d = Daemon(tmp_path / "d", {"llama": (str(mnt / "shared" / "llama"),
                                              {"poll_interval": "1", "stage": "no"})},
                   user=(DAEMON_UID, WCACHED_GID), nofile=1024).start()
        try:
            d.wait_for_log(r'model "llama": generation 1 warm', timeout=60)
            time.sleep(0.05)  # a ctime of a later clock tick than the load's
            for n in ("a", "b"):
                os.link(llama / ("%s.safetensors" % n), os.path.join(snap, n))
            d.wait_for_log(r'model "llama": generation 1: its files, loaded again after a '
                           r'link count change, validated anew: unchanged', timeout=30)
            serves(d, "llama", 1)
            assert "is not one of the files serving" not in d.read_log(), d.read_log()
        finally:
            assert d.stop() == 0, d.read_log()
