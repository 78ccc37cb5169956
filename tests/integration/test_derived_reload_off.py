"""Derived artifacts and a configuration reload that shuts a build's builder
out (review rev190 D1-D3; test_derived_reload.py has the first cases): a
reload to derive = no fails the model's builds in progress at once, and
nobody is handed a build of a model whose derive is off, also where the
reload came while a publication was checked; a reload that narrows
derive_groups hands the build of a builder it shuts out to a waiter that may
still build, and a waiter that may not is told so (EHOSTDOWN), never EPERM,
which reads as derive = no; and a publication being checked when the reload
shuts its builder out is refused before it drops anything to make room."""

import contextlib
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import Daemon, mkmodel, wait_until
from ctlutil import ctl, running_daemons
from test_derived import (ARTIFACT, BUILD, CLIENT, DERIVE_CONF, ERRNO, ERROR, Peer, closing,
                          expect_error, let_in, publish_held, release, waiting)
from test_derived import derived  # noqa: F401 (the fixture, used by name)
from test_derived_memory import MiB, artifact_of, dropped_for, keys
from test_memlimit import cgroup  # noqa: F401 (the fixture, used by name)
from test_derived_reload import (ALLOWED, OTHER, as_another_user, builder, no_artifact, publish,
                                 reloaded_while_building)
from test_regressions import ready
from test_regressions import start  # noqa: F401 (the fixture, used by name)


@as_another_user
def test_a_reload_to_derive_off_fails_the_build_and_hands_it_to_nobody(
        derived, tmp_path):  # noqa: F811 (derived: the fixture)
    """rev190 D1: the reload left the build alone; when its builder then
    went away before publishing, the waiter (root, which may always build)
    was handed the BUILD of a model whose derive is off. Now the reload
    fails the build: the waiter gets EPERM (derive = no) naming the model,
    the key and the builder, and nobody builds."""
    d = derived({"derive_groups": str(ALLOWED)})
    with reloaded_while_building(d, tmp_path, (64305, 64305, (ALLOWED,)),
                                 {"derive": "no", "derive_groups": str(ALLOWED)}) as (proc, w):
        proc.kill()
        proc.wait(timeout=60)
        r = w.reply(timeout=60)
        assert r["type"] != BUILD, closing(r)
        expect_error(r, "EPERM", 'model "small"', 'derived "f32-v1"', "uid 64305",
                     "a configuration reload turned derive off (derive = no)")
    d.wait_for_log(r'model "small": derive is off now: 0 derived artifacts dropped .*, '
                   r'1 build in progress failed')


@contextlib.contextmanager
def reload_with_a_waiter(d, tmp_path, builder_group, waiter_group, new_groups):
    """Uid 64307 of builder_group builds "small"'s "f32-v1" and uid 64308 of
    waiter_group waits for it; a reload sets derive_groups to new_groups.
    Yields the builder and the waiter's one line ("type code text"); kills
    what is left of them afterwards."""
    ready(d, "small")
    proc = builder(d, (64307, 64307, (builder_group,)))
    from wcached import as_user
    let_in(d)
    waiter = subprocess.Popen(as_user(64308, 64308, (waiter_group,)) +
                              [sys.executable, "-c", CLIENT, d.socket],
                              stdout=subprocess.PIPE, text=True)
    try:
        waiting(d, 1)
        d.write_config({"small": (str(tmp_path / "small.safetensors"),
                                  {"derive": "yes", "derive_groups": new_groups})})
        r = ctl(d, "reload")
        assert r.returncode == 0, r
        out, _ = waiter.communicate(timeout=60)
        yield proc, out
    finally:
        for p in (proc, waiter):
            if p.poll() is None:
                p.kill()
                p.wait(timeout=60)


@as_another_user
def test_a_waiter_that_may_no_longer_build_either_is_told_ehostdown_not_eperm(
        derived, tmp_path):  # noqa: F811 (derived: the fixture)
    """rev190 D2: the waiter (another user of group OTHER) got EPERM, which
    PROTOCOL and the Python client read as derive = no. With no waiter left
    that may build, it now gets EHOSTDOWN naming derive_groups, as when a
    builder goes away and no waiter may take over."""
    d = derived({"derive_groups": f"{ALLOWED} {OTHER}"})
    with reload_with_a_waiter(d, tmp_path, OTHER, OTHER, str(ALLOWED)) as (proc, out):
        mtype, code, text = out.split(" ", 2)
        assert (int(mtype), int(code)) == (ERROR, ERRNO["EHOSTDOWN"]), out
        for words in ('model "small": derived "f32-v1"', "uid 64307) may no longer build it",
                      "a configuration reload changed derive_groups",
                      "no waiting worker may build it (derive_groups)"):
            assert words in text, text
        mtype, code, text = publish(proc)
        assert (mtype, code) == (ERROR, ERRNO["EPERM"]), (mtype, code, text)
    no_artifact(d)


@as_another_user
def test_a_reload_that_swaps_derive_groups_hands_the_build_to_a_new_member(
        derived, tmp_path):  # noqa: F811 (derived: the fixture)
    """rev193 F2: a reload swapping derive_groups from ALLOWED to OTHER shuts
    the builder (group ALLOWED) out, and the waiter (group OTHER), which may
    build under the new groups only, takes the build over (BUILD). Before,
    the takeover was also judged by the model's old derive_groups, which it
    keeps until the reload's walk is done: the waiter got EHOSTDOWN "no
    waiting worker may build it (derive_groups)"."""
    d = derived({"derive_groups": str(ALLOWED)})
    with reload_with_a_waiter(d, tmp_path, ALLOWED, OTHER, str(OTHER)) as (proc, out):
        assert int(out.split(" ", 1)[0]) == BUILD, (out, d.read_log()[-2000:])
        d.wait_for_log(r'derived "f32-v1" .*the builder \(pid \d+ uid 64307\) may no longer '
                       r"build it .*changed derive_groups")
        mtype, code, text = publish(proc)
        assert (mtype, code) == (ERROR, ERRNO["EPERM"]), (mtype, code, text)

# Holds a check of the memfd named "shutout" on the work queue (at its
# F_GET_SEALS) while the file $WC_GATE exists, saying so with $WC_GATE.held:
# LD_PRELOADed into wcached, it lets a reload come while a publication is
# checked.
GATE_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static void hold(int fd) {
	const char *gate = getenv("WC_GATE");
	char link[64], target[256], held[300];
	ssize_t n;
	if (gate == NULL || access(gate, F_OK) != 0) return;
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	if ((n = readlink(link, target, sizeof(target) - 1)) < 0) return;
	target[n] = 0;
	if (strstr(target, "memfd:shutout") == NULL) return;
	snprintf(held, sizeof(held), "%s.held", gate);
	close(open(held, O_WRONLY | O_CREAT | O_CLOEXEC, 0666));
	while (access(gate, F_OK) == 0) usleep(5000);
}
#define DEF(NAME) int NAME(int fd, int cmd, ...) { va_list ap; va_start(ap, cmd); \
	long arg = va_arg(ap, long); va_end(ap); if (cmd == F_GET_SEALS) hold(fd); \
	int (*next)(int, int, ...) = (int (*)(int, int, ...))dlsym(RTLD_NEXT, #NAME); \
	return next(fd, cmd, arg); }
DEF(fcntl)
DEF(fcntl64)
"""

# A builder run as another user: DERIVE of argv[3], print the BUILD's
# type; on a line of stdin PUBLISH argv[2] (a file's bytes) in a memfd
# named "shutout", print "published", and hang up (argv[4] "hang up") or
# print the reply as "type code text".
LATE_BUILDER = r"""
import os, socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.settimeout(120)
s.connect(sys.argv[1])
key, name = sys.argv[3].encode(), b"small"
s.send(struct.pack("<IHHII", 0x31504357, 1, 4, 8 + len(key) + len(name), 1) +
       struct.pack("<II", 30000, len(key)) + key + name)
data, anc, _, _ = s.recvmsg(8192, socket.CMSG_SPACE(4 * 256))
for level, kind, cdata in anc:
    for (fd,) in struct.iter_unpack("i", cdata[:len(cdata) // 4 * 4]):
        os.close(fd)
mtype = struct.unpack_from("<H", data, 6)[0]
token = struct.unpack_from("<Q", data, 16 + 40)[0] if mtype == 133 else 0
print(mtype, flush=True)
sys.stdin.readline()
fd = os.memfd_create("shutout", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
os.write(fd, open(sys.argv[2], "rb").read())
s.sendmsg([struct.pack("<IHHII", 0x31504357, 1, 5, 8, 2) + struct.pack("<Q", token)],
          [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))])
os.close(fd)
print("published", flush=True)
if sys.argv[4] == "hang up":
    s.close()
    sys.exit(0)
data, anc, _, _ = s.recvmsg(8192, socket.CMSG_SPACE(4 * 256))
for level, kind, cdata in anc:
    for (fd,) in struct.iter_unpack("i", cdata[:len(cdata) // 4 * 4]):
        os.close(fd)
mtype = struct.unpack_from("<H", data, 6)[0]
print(mtype, struct.unpack_from("<i", data, 16)[0] if mtype == 255 else 0,
      data[20:].decode("utf-8", "replace") if mtype == 255 else "", flush=True)
"""


def gate_shim(tmp_path, monkeypatch):
    """GATE_SHIM built and preloaded into the daemons started after it: the
    gate's path (create it to hold the next check of a "shutout" memfd)."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("needs a C compiler for the LD_PRELOAD shim")
    (tmp_path / "shim.c").write_text(GATE_SHIM)
    so = str(tmp_path / "shim.so")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", so, str(tmp_path / "shim.c"), "-ldl"],
                   check=True)
    # Readable by a daemon run as another user (WCACHE_TEST_USER) too.
    os.chmod(tmp_path, 0o755)
    os.chmod(so, 0o755)
    gate = str(tmp_path / "gate")
    monkeypatch.setenv("LD_PRELOAD", so)
    monkeypatch.setenv("WC_GATE", gate)
    return gate


def late_builder(d, tmp_path, user, key, data, then):
    """LATE_BUILDER run as user with its BUILD of key read: the process (a
    line on its stdin makes it publish data, then hang up where then is
    "hang up", else wait for its reply)."""
    from wcached import as_user
    (tmp_path / "blob").write_bytes(data)
    os.chmod(tmp_path, 0o755)
    os.chmod(tmp_path / "blob", 0o644)
    let_in(d)
    proc = subprocess.Popen(as_user(*user) + [sys.executable, "-c", LATE_BUILDER,
                                              d.socket, str(tmp_path / "blob"), key, then],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == str(BUILD)
    return proc


@as_another_user
def test_a_publication_a_reload_to_derive_off_refuses_after_its_builder_left_goes_to_nobody(
        derived, tmp_path, monkeypatch):  # noqa: F811 (derived: the fixture)
    """rev190 D1, the other way in: the builder published and hung up, and
    the reload turning derive off came while the publication was checked
    (a reload leaves such a build to its check). The check refuses it; with
    its builder gone the build went to the waiter, root, handed the BUILD of
    a model whose derive is off. Now a waiter takes a build over only where
    the model lets it build now: nobody may, and the waiter gets EHOSTDOWN
    saying derive = no."""
    gate = gate_shim(tmp_path, monkeypatch)
    d = derived({"derive_groups": str(ALLOWED)})
    ready(d, "small")
    proc = late_builder(d, tmp_path, (64309, 64309, (ALLOWED,)), "f32-v1", ARTIFACT,
                        "hang up")
    try:
        w = Peer(d, timeout=60)
        w.derive("small", "f32-v1")
        waiting(d, 1)
        open(gate, "w").close()
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "published"
        proc.wait(timeout=60)
        wait_until(lambda: os.path.exists(gate + ".held"), timeout=60, what="the check held")

        def builder_gone():
            p = Peer(d)
            p.derive("small", "f32-v1", wait_ms=0)
            r = closing(p.reply(timeout=60))
            p.close()
            return r["type"] == ERROR and "(which has disconnected) is being checked" in r["text"]
        wait_until(builder_gone, timeout=60, what="wcached to see the builder gone")
        d.write_config({"small": (str(tmp_path / "small.safetensors"),
                                  {"derive": "no", "derive_groups": str(ALLOWED)})})
        r = ctl(d, "reload")
        assert r.returncode == 0, r
    finally:
        if os.path.exists(gate):
            os.unlink(gate)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    r = w.reply(timeout=60)
    assert r["type"] != BUILD, closing(r)
    expect_error(r, "EHOSTDOWN", 'model "small": derived "f32-v1"', "uid 64309",
                 "no waiting worker may build it (derive = no)")


@as_another_user
def test_a_publication_checked_when_a_reload_shuts_its_builder_out_drops_nothing(
        tmp_path, cgroup, monkeypatch):  # noqa: F811 (cgroup: the fixture)
    """rev190 D3: a publication whose check was under way when a reload
    narrowing derive_groups shut its builder out still made room for its
    copy under the memory limit, dropping an artifact of root's that nobody
    held, and copied it, only to be refused at the end of its check. Now it
    is refused before it makes room: root's artifacts stay, and the builder
    is told why (EPERM)."""
    gate = gate_shim(tmp_path, monkeypatch)
    cgroup[4](96 * MiB)
    model = mkmodel(tmp_path / "small.safetensors")
    with running_daemons(lambda models, extra: Daemon(tmp_path, models, extra,
                                                      cgroup=cgroup[1])) as start:
        d = start({"small": (model, dict(DERIVE_CONF, derive_groups=f"{ALLOWED} {OTHER}"))},
                  "")
        ready(d, "small")
        a = Peer(d)
        blob = artifact_of(40)
        release(a, publish_held(a, "k0", blob))  # root's, and nobody holds them
        release(a, publish_held(a, "k1", blob))
        proc = late_builder(d, tmp_path, (64310, 64310, (OTHER,)), "kx", blob, "wait")
        try:
            open(gate, "w").close()
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "published"
            wait_until(lambda: os.path.exists(gate + ".held"), timeout=60,
                       what="the check held")
            d.write_config({"small": (model, dict(DERIVE_CONF, derive_groups=str(ALLOWED)))})
            r = ctl(d, "reload")
            assert r.returncode == 0, r
        finally:
            if os.path.exists(gate):
                os.unlink(gate)
        out, _ = proc.communicate(timeout=120)
        mtype, code, text = out.split(" ", 2)
        assert (int(mtype), int(code)) == (ERROR, ERRNO["EPERM"]), out
        assert "uid 64310" in text and "may no longer build it: none of its groups is in " \
            "derive_groups since a configuration reload" in text, text
        assert re.search(dropped_for("kx", r"k\d"), d.read_log()) is None
        assert keys(d) == ["k0", "k1"]
