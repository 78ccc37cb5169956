"""The load's walk of the links its path goes through (registry_links.c's
registry_walk_links: check_links, after the files were opened) judged no
mount it stepped onto: an fstat(2) of each name, so a neighbour's FUSE mount
met on the way, made between the load's open and that walk, had its server
asked (GETATTR), and a thread of wcached's waited for good (review rev216
H2, the load's side of the warm restart's hang). Now the walk judges each
mount as the load's own walk (mountrule_open) does, before anything on it
is asked: the load is refused with one line naming the mount.

The moment is made certain with an LD_PRELOAD gate in the daemon, no sleep:
while GATE/step exists, the first readlinkat(2) of PATH_MAX bytes (the
links walk's read of a link's text; the judged walk reads PATH_MAX - 1) of
a link named WC_GATE_NAME returns and then waits, having created
GATE/step.held; the test mounts bob's server and removes GATE/step.

The layout: bob's directory model v1 in his home (0755, his), deployed
through his link home/bob/llama -> v1; skipped, saying why, without root or
/dev/fuse.
"""
import os
import sys

from conftest import mkmodel, wait_until
from ctlutil import model_entry
from fusehang import HangFS, blocked_in_fuse, neighbours_place
from test_load_neighbour_detach import GATE_SHIM
from test_load_neighbour_mounts import error_of
from test_load_neighbour_paths import where
from test_watch_pending import GatedDaemon, build_shim, ready
from test_watch_writer_neighbours import BOB

LINK_SHIM = GATE_SHIM + r"""
/* The gate, where len is PATH_MAX and fd a link named WC_GATE_NAME. */
static void
hold(int fd, const char *path, size_t len)
{
	const char *name = getenv("WC_GATE_NAME"), *last;
	char link[64], at[PATH_MAX];
	ssize_t n;

	if (name == NULL || len != PATH_MAX || path[0] != '\0')
		return;
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	if ((n = readlink(link, at, sizeof(at) - 1)) <= 0)
		return;
	at[n] = '\0';
	if ((last = strrchr(at, '/')) != NULL && strcmp(last + 1, name) == 0)
		gate();
}

#define NEXT(fn) ((__typeof__(&fn))dlsym(RTLD_NEXT, #fn))

ssize_t
readlinkat(int fd, const char *path, char *buf, size_t len)
{
	ssize_t n = NEXT(readlinkat)(fd, path, buf, len);

	if (n >= 0)
		hold(fd, path, len);
	return n;
}

ssize_t __readlinkat_chk(int fd, const char *path, char *buf, size_t len, size_t buflen);

ssize_t
__readlinkat_chk(int fd, const char *path, char *buf, size_t len, size_t buflen)
{
	ssize_t n = NEXT(__readlinkat_chk)(fd, path, buf, len, buflen);

	if (n >= 0)
		hold(fd, path, len);
	return n;
}
"""


def test_a_fuse_mount_met_by_the_loads_walk_of_its_links_is_refused(tmp_path,
                                                                     tmp_path_factory):
    """m is bob's home/bob/llama -> v1, loaded. Bob renames a new model file
    into v1 (his update: a watched reload). The reload opens it, then walks
    its path again for the links on it; held as it reads llama's text, bob
    mounts his FUSE server (answering INIT alone) on v1, and the walk goes
    on into v1. Before, its fstat of v1 asked his server and never returned:
    m's reload never ended, nor would wcached's stop. Now v1's mount is
    judged first: the load is refused with one line naming it (the watched
    reload's files wait for the operator's reload), nothing is asked of his
    server, and wcached stops."""
    home = neighbours_place(tmp_path, "home")
    bobs = home / "bob"
    v1 = bobs / "v1"
    v1.mkdir(parents=True)
    for p in (bobs, v1):
        os.chown(p, *BOB)
        os.chmod(p, 0o755)
    f = mkmodel(str(v1 / "model.safetensors"), seed=1)
    os.chown(f, *BOB)
    os.symlink("v1", bobs / "llama")
    os.lchown(bobs / "llama", *BOB)
    shim = build_shim(tmp_path_factory, LINK_SHIM)
    gate = tmp_path / "gate"
    gate.mkdir()
    os.chmod(gate, 0o777)
    d = GatedDaemon(tmp_path, {"m": str(bobs / "llama")})
    d.gate_env = {"LD_PRELOAD": shim, "WC_GATE_DIR": str(gate), "WC_GATE_NAME": "llama"}
    d.start()
    stuck, ops, stacks = [], [], []
    try:
        ready(d, "m", 1)
        (gate / "step").touch()
        new = mkmodel(str(bobs / "new.tmp"), layers=3, seed=3)
        os.chown(new, *BOB)
        os.rename(new, v1 / "model.safetensors")
        wait_until(lambda: (gate / "step.held").exists(), timeout=60,
                   what="the links walk held on llama's text")
        with HangFS(v1, *BOB) as fs:
            (gate / "step").unlink()

            def outcome():
                stuck[:] = blocked_in_fuse(d.proc.pid)
                return bool(stuck) or error_of(d, "m")
            try:
                wait_until(outcome, timeout=60, what="m's error or a thread on bob's server")
            except Exception:  # noqa: BLE001 (judged below)
                pass
            ops = list(fs.ops)
            stacks = where(d.proc.pid, stuck) if stuck else []
            err = error_of(d, "m") or ""
            assert not stuck, ("wcached waits on bob's FUSE server", stuck, ops, stacks,
                               d.read_log()[-3000:])
            assert ops == [], ops  # nothing was asked of bob's server
            want = "its path was walked again after its files were opened: %s: v1 lies on fuse" % (
                bobs / "llama")
            assert want in err, (err, d.read_log()[-3000:])
            assert "mounted by uid %d" % BOB[0] in err, err
            # a watched reload: waits for the operator's word, as for a link refused
            assert "served only after the operator's `wcachectl reload m`" in err, err
            assert "waits_for_reload" in model_entry(d, "m"), model_entry(d, "m")
            lines = [l for l in d.read_log().split("\n") if want in l and " error: " in l]
            assert len(lines) == 1, d.read_log()[-3000:]
            assert ready(d, "m", 1)   # generation 1 serves on
            assert d.stop(timeout=20) == 0, d.read_log()[-3000:]   # his server mounted
    finally:
        d.stop()


if __name__ == "__main__":
    sys.exit("run with pytest")
