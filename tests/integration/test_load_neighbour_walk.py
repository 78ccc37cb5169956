"""Where wcached's walk of a model's path (daemon/mountrule.h) and the
kernel's disagreed, the load went on by name to where the kernel leads, a
neighbour's FUSE server that answers nothing (review rev207 H2, H3; the
reviewer's rev207-test_diverge.py): the walk now follows a chain of links
however long its text grows, as the kernel does, and follows no link on
/proc, whose "magic" links lead where their text does not say.

The layout is test_load_neighbour_paths' one-file model in a team
directory (2775, bob a member), bob's FUSE file bob-evil beside it (HangFS:
INIT answered, nothing else); the tests skip, saying why, without root or
/dev/fuse.
"""
import ctypes
import os
import random
import resource
import subprocess
import threading
import time

from conftest import TEST_USER, Daemon
from ctlutil import binary
from test_load_neighbour_mounts import error_of
from test_load_neighbour_paths import (HangFS, one_file_team_model, reloads_stuck, stuck_or,
                                       team_directory, where)
from test_watch_pending import ready
from test_watch_writer_neighbours import BOB

from fusehang import blocked_in_fuse  # noqa: E402


def bobs_link(team, name, text):
    """Bob renames his link name -> text into team/ (over what was there)."""
    tmp = team / (".bob-tmp-" + name)
    os.symlink(text, tmp)
    os.lchown(tmp, *BOB)
    os.rename(tmp, team / name)


def long_chain(team, pad=2040):
    """Bob's links in team/: A2 -> "./" x 19 "." (team itself), A ->
    A2/./.../. (4084 bytes); the text for the model's name, A/./.../bob-evil
    (4090 bytes): the kernel resolves it to team/bob-evil, and the walk's
    text, spliced, outgrows two PATH_MAX (it said ENAMETOOLONG, and the
    load went on by name)."""
    bobs_link(team, "A2", "./" * 19 + ".")
    bobs_link(team, "A", "A2/" + "./" * pad + ".")
    return "A/" + "./" * pad + "bob-evil"


def refused(d, team, fs, want):
    """Waits for m's error or a thread of wcached's held by bob's server:
    none held, and the error says want."""
    stuck = stuck_or(d, lambda: error_of(d, "m"))
    err = error_of(d, "m")
    log = d.read_log()[-3000:]
    assert not stuck, ("wcached threads wait on bob's FUSE server", stuck, list(fs.ops), log)
    assert err is not None and want in err, (err, log)


def test_a_link_chain_longer_than_two_path_max_is_walked_to_bobs_fuse_file(tmp_path):
    team, evil = one_file_team_model(tmp_path)
    text = long_chain(team)
    d = Daemon(tmp_path, {"m": str(team / "model.safetensors")}).start()
    try:
        ready(d, "m", 1)
        with HangFS(evil, *BOB, directory=False) as fs:
            bobs_link(team, "model.safetensors", text)
            refused(d, team, fs, "bob-evil lies on fuse (device ")
    finally:
        assert d.stop() == 0, d.read_log()[-3000:]


def test_wcached_check_of_a_link_chain_longer_than_two_path_max_ends(tmp_path):
    team, evil = one_file_team_model(tmp_path)
    text = long_chain(team)
    d = Daemon(tmp_path, {"m": str(team / "model.safetensors")})
    d.start()
    assert d.stop() == 0  # only its config is wanted
    stuck = None
    with HangFS(evil, *BOB, directory=False):
        bobs_link(team, "model.safetensors", text)
        p = subprocess.Popen([binary("wcached"), "-c", d.conf, "--check"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            out = p.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            stuck = blocked_in_fuse(p.pid)
            p.kill()  # ends once HangFS fails what it holds, below
            out = None
    p.communicate()
    assert out is not None, ("wcached --check waits on bob's FUSE server", stuck)
    assert "bob-evil lies on fuse (device " in out, out


def test_a_magic_link_to_bobs_detached_fuse_file_is_not_followed(tmp_path):
    """Bob holds an O_PATH descriptor of his FUSE mount's root (no request
    needed), detaches the mount (umount -l: no mount table lists it
    since), and renames a link model.safetensors -> /proc/PID/fd/N over the
    model: its text reads "/", the kernel goes to his FUSE file. The walk
    follows no link on /proc: refused, naming it; nothing waits. An
    unprivileged wcached (WCACHE_TEST_USER) may not even read the link's
    text (another user's /proc/PID/fd: EACCES): refused so, before the
    rule on /proc is asked."""
    team, evil = one_file_team_model(tmp_path)
    d = Daemon(tmp_path, {"m": str(team / "model.safetensors")}).start()
    fd = -1
    try:
        ready(d, "m", 1)
        with HangFS(evil, *BOB, directory=False) as fs:
            fd = os.open(evil, os.O_PATH)
            subprocess.run(["umount", "-l", str(evil)], check=True)
            bobs_link(team, "model.safetensors", f"/proc/{os.getpid()}/fd/{fd}")
            refused(d, team, fs, f": {fd} is a link on /proc (device " if not TEST_USER
                    else "model.safetensors: Permission denied")
    finally:
        if fd >= 0:
            os.close(fd)
        assert d.stop() == 0, d.read_log()[-3000:]


def test_wcached_check_whose_walk_fails_otherwise_looks_nothing_up_by_name(tmp_path):
    """Bob's link model.safetensors -> bob-evil, and `wcached --check` run
    with so few descriptors (RLIMIT_NOFILE 4 to 8) that the walk's own
    opens, or its read of the mount table, fail (EMFILE) where a stat(2)
    by name needs none: each run ends, the model refused with the walk's
    reason. Before, --check went on after any walk error but EXDEV to
    source_open's stat(2) of the path: GETATTR to bob's server, never
    answered (review rev207 H2's callers; the load's load_work likewise)."""
    team, evil = one_file_team_model(tmp_path)
    d = Daemon(tmp_path, {"m": str(team / "model.safetensors")})
    d.start()
    assert d.stop() == 0  # only its config is wanted
    outs, stuck = {}, None
    with HangFS(evil, *BOB, directory=False):
        bobs_link(team, "model.safetensors", "bob-evil")
        for n in range(4, 9):
            p = subprocess.Popen(
                [binary("wcached"), "-c", d.conf, "--check"], stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True,
                preexec_fn=lambda n=n: resource.setrlimit(resource.RLIMIT_NOFILE, (n, n)))
            try:
                outs[n] = p.communicate(timeout=60)[0]
            except subprocess.TimeoutExpired:
                stuck = blocked_in_fuse(p.pid)
                p.kill()  # ends once HangFS fails what it holds, below
                outs[n] = None
                break
    p.communicate()
    assert None not in outs.values(), ("wcached --check waits on bob's FUSE server", outs,
                                       stuck)
    assert all('model "m": ' in out and "ok:" not in out for out in outs.values()), outs
    assert any("Too many open files" in out for out in outs.values()), outs


def test_a_link_over_the_models_directory_into_bobs_fuse_directory_is_not_watched(tmp_path):
    """team/ (2775, bob a member) holds root's directory sub/ (0755) and in
    it root's one-file model sub/model.safetensors. Bob renames sub/ away
    (same parent: team is writable, not sticky) and his link sub ->
    bobmnt/x in its place, bobmnt his directory with his FUSE server on it.
    The operator's reload is refused; the watch armed again after it
    walks sub/ first, is refused the same way, and arms nothing: before, it
    armed sub/ by name, and the kernel's lookup of "x" in bob's server
    waited for good (review rev208 H1)."""
    team = team_directory(tmp_path, "sub", "model.safetensors")
    bobmnt = team / "bobmnt"
    bobmnt.mkdir()
    os.chown(bobmnt, *BOB)
    d = Daemon(tmp_path, {"m": str(team / "sub" / "model.safetensors")}).start()
    try:
        ready(d, "m", 1)
        with HangFS(bobmnt, *BOB) as fs:
            os.rename(team / "sub", team / ".sub-old")
            bobs_link(team, "sub", "bobmnt/x")
            stuck = stuck_or(d, lambda: False, timeout=5)  # bob's renames alone reload nothing
            stuck = stuck or reloads_stuck(d, "m", tries=1)  # the operator's reload: refused
            # then the watch is armed again: refused, the walk's line said
            stuck = stuck or stuck_or(d, lambda: "cannot watch " + str(team / "sub") +
                                      " for model updates: " in d.read_log(), timeout=60)
            log = d.read_log()[-3000:]
            ops = list(fs.ops)
            stacks = where(d.proc.pid, stuck)
        assert not stuck, ("wcached threads wait on bob's FUSE server", stuck, ops, stacks,
                           log)
        assert "bobmnt lies on fuse (device " in log, log
    finally:
        assert d.stop() == 0, d.read_log()[-3000:]


_libc = ctypes.CDLL(None, use_errno=True)
MNT_DETACH = 2


def test_the_operators_reload_after_a_walk_that_missed_bobs_mount_asks_it_nothing(tmp_path):
    """Bob's link model.safetensors -> bobmnt/x (bobmnt his directory in
    team/), and a loop of his: mount a FUSE server that never answers INIT
    on bobmnt (as fusermount3 would for him), wait 0-2 ms, unmount it
    (again while a walk holds it busy: not detached lazily, whose moment
    between the walk's statx and its read of the mount table is review
    rev208 H2, still open). An operator's reload whose walk finds
    bobmnt bare fails (ENOENT) and looks for the place the path names
    (place_of): it looked by name (realpath, stat, readlink) and met his
    mount back by then, GETATTR waiting for good (review rev208 H3: the
    first reload of 400 was held). Now that look is the judged walk too,
    and reads what it needs from the walk's descriptors."""
    team, _ = one_file_team_model(tmp_path)
    bobmnt = team / "bobmnt"
    bobmnt.mkdir()
    os.chown(bobmnt, *BOB)
    d = Daemon(tmp_path, {"m": str(team / "model.safetensors")}).start()
    fds, stop = [], threading.Event()

    def churn():
        while not stop.is_set():
            fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
            fds.append(fd)  # kept: a request pending on it waits (no INIT answered)
            opts = f"fd={fd},rootmode=040755,user_id={BOB[0]},group_id={BOB[1]},allow_other"
            if _libc.mount(b"hang", str(bobmnt).encode(), b"fuse.hang", 0, opts.encode()) != 0:
                continue
            time.sleep(random.random() * 0.002)
            while _libc.umount2(str(bobmnt).encode(), 0) != 0 and not stop.is_set():
                time.sleep(0.001)  # busy: a walk holds it (and then judges it)
            if len(fds) > 2000:  # the oldest, surely not the one a walk holds
                os.close(fds.pop(0))

    t = threading.Thread(target=churn, daemon=True)
    try:
        ready(d, "m", 1)
        bobs_link(team, "model.safetensors", "bobmnt/x")
        t.start()
        stuck = reloads_stuck(d, "m", tries=400)
        stacks = where(d.proc.pid, stuck) if stuck else []
        assert not stuck, ("a wcached thread waits on bob's FUSE mount", stuck, stacks)
    finally:
        stop.set()
        t.join(timeout=10)
        _libc.umount2(str(bobmnt).encode(), MNT_DETACH)
        for fd in fds:
            os.close(fd)
        assert d.stop() == 0, d.read_log()[-3000:]
