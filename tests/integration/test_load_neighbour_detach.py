"""A neighbour's FUSE mount detached lazily (umount -l, fusermount3 -u -z)
in the moment between the walk's step onto it and its look at the mount
table (review rev208 H2): the walk judged a mount by its device, and a
device the table did not list counted as local (for btrfs subvolumes), so
the detached mount, which no table lists but which still answers through
the walk's descriptor, was walked into: a LOOKUP to his server, which may
never answer (or serve his bytes). Now the walk judges the mount by its
mount ID (statx STATX_MNT_ID of its own descriptor), and an ID the table
does not list is a mount gone: refused, with one line.

The moment is made certain with an LD_PRELOAD gate in the daemon, no
sleep: while GATE/step exists, the first openat(2) with O_PATH of the name
"bobmnt" (the walk's step onto bob's mount) returns and then waits, having
created GATE/step.held; the test detaches the mount and removes GATE/step.

The layout is test_load_neighbour_walk's: root's one-file model in a team
directory (2775, bob a member), bob's link model.safetensors -> bobmnt/x
renamed over it, bobmnt his directory with his FUSE server on it (HangFS:
INIT answered, nothing else); skipped, saying why, without root or
/dev/fuse.
"""
import os
import subprocess
import sys

from conftest import wait_until
from ctlutil import Control
from test_load_neighbour_mounts import error_of
from test_load_neighbour_paths import HangFS, one_file_team_model, where
from test_load_neighbour_walk import bobs_link
from test_watch_pending import GatedDaemon, build_shim, ready
from test_watch_writer_neighbours import BOB

from fusehang import blocked_in_fuse  # noqa: E402

# The gate itself, for shims whose hold() says when to take it.
GATE_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_int taken;

/* Once, where WC_GATE_DIR/step exists: creates WC_GATE_DIR/step.held and
 * waits while step exists (120 s at most). */
static void
gate(void)
{
	const char *dir = getenv("WC_GATE_DIR");
	char armed[PATH_MAX], held[PATH_MAX];
	time_t end = time(NULL) + 120;
	int h;

	if (dir == NULL)
		return;
	snprintf(armed, sizeof(armed), "%s/step", dir);
	if (access(armed, F_OK) != 0 || atomic_exchange(&taken, 1) != 0)
		return;
	snprintf(held, sizeof(held), "%s/step.held", dir);
	if ((h = open(held, O_WRONLY | O_CREAT | O_CLOEXEC, 0666)) >= 0)
		close(h);
	while (access(armed, F_OK) == 0 && time(NULL) < end)
		usleep(5000);
}
"""

STEP_SHIM = GATE_SHIM + r"""
/* The gate, where path is WC_GATE_NAME opened O_PATH. */
static void
hold(const char *path, int flags)
{
	const char *name = getenv("WC_GATE_NAME");

	if (name != NULL && (flags & O_PATH) && strcmp(path, name) == 0)
		gate();
}

#define NEXT(fn) ((__typeof__(&fn))dlsym(RTLD_NEXT, #fn))
#define GATED(fn)                                                        \
int                                                                      \
fn(int dir, const char *path, int flags, ...)                            \
{                                                                        \
	mode_t mode = 0;                                                 \
	int fd;                                                          \
                                                                         \
	if (flags & (O_CREAT | O_TMPFILE)) {                             \
		va_list ap;                                              \
		va_start(ap, flags);                                     \
		mode = va_arg(ap, mode_t);                               \
		va_end(ap);                                              \
	}                                                                \
	fd = NEXT(fn)(dir, path, flags, mode);                           \
	if (fd >= 0)                                                     \
		hold(path, flags);                                       \
	return fd;                                                       \
}
GATED(openat)
GATED(openat64)
"""


def test_bobs_fuse_mount_detached_between_the_step_and_the_table_is_not_walked_into(
        tmp_path, tmp_path_factory):
    """The operator's reload of m walks team/model.safetensors -> bobmnt/x:
    it steps onto bob's mount on bobmnt (O_PATH) and is held there; bob's
    mount is detached (umount -l); then the walk judges it. Before, its
    device was no table line's and counted as local: the walk looked x up
    in bob's server, which never answers, and the reload waited for good.
    Now its mount ID is no line's: refused as gone, nothing waits."""
    team, _ = one_file_team_model(tmp_path)
    shim = build_shim(tmp_path_factory, STEP_SHIM)
    bobmnt = team / "bobmnt"
    bobmnt.mkdir()
    os.chown(bobmnt, *BOB)
    gate = tmp_path / "gate"
    gate.mkdir()
    os.chmod(gate, 0o777)
    d = GatedDaemon(tmp_path, {"m": str(team / "model.safetensors")})
    d.gate_env = {"LD_PRELOAD": shim, "WC_GATE_DIR": str(gate), "WC_GATE_NAME": "bobmnt"}
    d.start()
    c = None
    try:
        ready(d, "m", 1)
        with HangFS(bobmnt, *BOB) as fs:
            bobs_link(team, "model.safetensors", "bobmnt/x")
            (gate / "step").touch()
            c = Control(d, timeout=120)
            c.send(b"reload m\n")
            wait_until(lambda: (gate / "step.held").exists(), timeout=60,
                       what="the walk held on its step onto bobmnt")
            subprocess.run(["umount", "-l", str(bobmnt)], check=True)
            (gate / "step").unlink()
            stuck = []
            c.sock.settimeout(0.05)

            def outcome():
                stuck[:] = blocked_in_fuse(d.proc.pid)
                return bool(stuck) or _read_some(c)
            try:
                wait_until(outcome, timeout=60,
                           what="the reload's reply or a thread on bob's server")
            except Exception:  # noqa: BLE001 (judged below)
                pass
            ops = list(fs.ops)
            stacks = where(d.proc.pid, stuck) if stuck else []
        assert not stuck, ("wcached waits on bob's detached FUSE server", stuck, ops, stacks,
                           d.read_log()[-3000:])
        reply = c.buf.decode(errors="replace")
        err = error_of(d, "m") or ""
        want = "bobmnt lies on mount "
        assert want in reply or want in err, (reply, err, d.read_log()[-3000:])
        assert "gone from /proc/self/mountinfo (unmounted, or detached: umount -l)" in (
            reply + err), (reply, err)
        assert ops == [], ops  # nothing was asked of bob's server
    finally:
        if c is not None:
            c.close()
        assert d.stop() == 0, d.read_log()[-3000:]


def _read_some(c):
    """Reads what the control socket has (none within its timeout: False)."""
    try:
        chunk = c.sock.recv(65536)
    except OSError:
        return False
    c.buf += chunk
    return b"\n" in c.buf or not chunk


if __name__ == "__main__":
    sys.exit("run with pytest")
