"""Where wcached's walk of a model's path and the kernel's disagree, the
walk decides: a walk that fails, however, refuses the load with one line and
nothing looks the path up by name after it (README: a model's path is
walked into no user's FUSE mount). And a file's "is it at its place?"
check after a load's open crosses no mount inside the model's tree that
tree.h's rule did not judge.

Bob's links and FUSE mounts as in test_load_neighbour_paths (2775 team
directories, bob a member; HangFS answers INIT only); root with /dev/fuse,
else skipped.
"""
import os
import subprocess
import sys

from conftest import Daemon
from ctlutil import binary
from test_watch_pending import ready
from test_watch_writer_neighbours import BOB
from test_load_neighbour_mounts import error_of, team_model
from test_load_neighbour_paths import EXCHANGE, one_file_team_model, stuck_or

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from fusehang import HangFS, blocked_in_fuse  # noqa: E402


def bobs_link(team, name, text):
    """Bob's link name -> text in team/, renamed in (he may: 2775)."""
    tmp = team / (".bob-tmp-" + name)
    os.symlink(text, tmp)
    os.lchown(tmp, *BOB)
    os.rename(tmp, team / name)


def long_chain(team, pad=2040):
    """Bob's links in team/: A2 -> 40 bytes of "./" (team itself), A ->
    A2/./.../. (4084 bytes); returns the text of a link that leads through
    them to team/bob-evil (4090 bytes). The kernel follows it (each link
    below PATH_MAX); wcached's walk splices the texts, which together
    outgrow what it follows (ENAMETOOLONG)."""
    bobs_link(team, "A2", "./" * 19 + ".")
    bobs_link(team, "A", "A2/" + "./" * pad + ".")
    return "A/" + "./" * pad + "bob-evil"


def test_a_link_chain_longer_than_the_walk_follows_refuses_the_reload(tmp_path):
    """A one-file model in a team directory; bob renames a link over it
    whose chain the walk cannot follow to its end, to his file with his
    FUSE server on it. The watched reload fails with the walk's reason
    and asks his server nothing (before: realpath and stat by name after
    the walk's ENAMETOOLONG, a thread held for good)."""
    team, evil = one_file_team_model(tmp_path)
    text = long_chain(team)
    d = Daemon(tmp_path, {"m": str(team / "model.safetensors")}).start()
    try:
        ready(d, "m", 1)
        with HangFS(evil, *BOB, directory=False) as fs:
            bobs_link(team, "model.safetensors", text)
            stuck = stuck_or(d, lambda: error_of(d, "m"))
            err = error_of(d, "m")
            log = d.read_log()[-3000:]
            ops = list(fs.ops)
        assert not stuck, ("wcached threads wait on bob's FUSE server", stuck, ops, log)
        assert err is not None and str(team / "model.safetensors") in err, (err, log)
    finally:
        assert d.stop() == 0, d.read_log()[-3000:]


def test_wcached_check_of_a_link_chain_longer_than_the_walk_follows_ends(tmp_path):
    """The same link and `wcached --check`: one line for the model, the
    walk's reason, and it ends (before: it waited on bob's server in D
    state, which SIGKILL does not end)."""
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
            out = p.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            stuck = blocked_in_fuse(p.pid)
            p.kill()  # ends once HangFS fails what it holds, below
            out = None
    p.communicate()
    assert out is not None, ("wcached --check waits on bob's FUSE server", stuck)
    assert p.returncode == 1 and 'model "m": ' + str(team / "model.safetensors") in out, out


def test_the_same_chain_short_enough_for_the_walk_is_refused_at_bobs_mount(tmp_path):
    """The control: the same links with 100 "./" each: the walk follows
    them to bob-evil and refuses his mount by name; nothing waits."""
    team, evil = one_file_team_model(tmp_path)
    text = long_chain(team, pad=100)
    d = Daemon(tmp_path, {"m": str(team / "model.safetensors")}).start()
    try:
        ready(d, "m", 1)
        with HangFS(evil, *BOB, directory=False) as fs:
            bobs_link(team, "model.safetensors", text)
            stuck = stuck_or(d, lambda: error_of(d, "m"))
            ops = list(fs.ops)
        assert not stuck, ("wcached threads wait on bob's FUSE server", stuck, ops)
        assert "FUSE" in (error_of(d, "m") or ""), error_of(d, "m")
    finally:
        assert d.stop() == 0, d.read_log()[-3000:]


def test_a_link_into_bobs_fuse_directory_swapped_over_a_shard_after_the_open_hangs_nothing(
        tmp_path):
    """m/ a team directory model; bobdir/ bob's directory in it with his
    FUSE server mounted on it. Bob swaps (renameat2 RENAME_EXCHANGE, he
    may) a link `-> bobdir/x` and root's shard at the shard's name, back
    and forth, making an event now and then. A reload that opened root's
    shard and then asks whether it is at its place (generation.c) while
    the link is there must not look x up in his server (before: openat2
    RESOLVE_BENEATH without RESOLVE_NO_XDEV crossed onto bobdir: LOOKUP,
    never answered, in about 8 s)."""
    mdir, shards = team_model(tmp_path)
    bobdir = mdir / "bobdir"
    bobdir.mkdir()
    os.chown(bobdir, *BOB)
    d = Daemon(tmp_path, {"m": str(mdir)}).start()
    try:
        ready(d, "m", 1)
        with HangFS(bobdir, *BOB) as fs:
            link = mdir / ".bob-link"
            os.symlink("bobdir/x", link)
            os.lchown(link, *BOB)
            swap = subprocess.Popen([sys.executable, "-c", EXCHANGE, str(mdir), ".bob-link",
                                     shards[0][0], "45"])
            try:
                stuck = stuck_or(d, lambda: swap.poll() is not None, timeout=60)
            finally:
                swap.kill()
                swap.wait()
            if os.path.islink(mdir / shards[0][0]):
                os.rename(mdir / ".bob-link", mdir / ".keep")
                os.rename(mdir / shards[0][0], mdir / ".bob-link")
                os.rename(mdir / ".keep", mdir / shards[0][0])
            log = d.read_log()[-3000:]
            ops = list(fs.ops)
        assert not stuck, ("wcached threads wait on bob's FUSE server", stuck, ops, log)
    finally:
        assert d.stop() == 0, d.read_log()[-3000:]
