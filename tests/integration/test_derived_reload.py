"""Derived artifacts and a configuration reload between a builder's DERIVE
and its PUBLISH: derive_groups is judged at DERIVE, and again at PUBLISH and
by the reload, so that a builder the reload shut out publishes nothing that
every worker would attach, and nobody waits for, or is handed, a build that
can no longer be published (more in test_derived_reload_off.py)."""

import contextlib
import os
import shutil
import subprocess
import sys

import pytest

from ctlutil import ctl
from test_derived import (ARTIFACT, BUILD, ERRNO, ERROR, Peer, expect_error, let_in, memfd_with,
                          take_artifact, waiting)
from test_derived import derived  # noqa: F401 (the fixture, used by name)
from test_regressions import ready
from test_regressions import start  # noqa: F401 (the fixture, used by name)

# A builder run as another user: DERIVE, print the BUILD's token; on a line
# of stdin PUBLISH the artifact (given in hex as argv[2]) and print the
# reply as "type code text".
BUILDER = r"""
import os, socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.settimeout(120)
s.connect(sys.argv[1])
key, name = b"f32-v1", b"small"

def reply():
    data, anc, _, _ = s.recvmsg(8192, socket.CMSG_SPACE(4 * 256))
    for level, kind, cdata in anc:
        for (fd,) in struct.iter_unpack("i", cdata[:len(cdata) // 4 * 4]):
            os.close(fd)
    return struct.unpack_from("<H", data, 6)[0], data[16:]

s.send(struct.pack("<IHHII", 0x31504357, 1, 4, 8 + len(key) + len(name), 1) +
       struct.pack("<II", 30000, len(key)) + key + name)
mtype, p = reply()
token = struct.unpack_from("<Q", p, 40)[0] if mtype == 133 else 0
print(mtype, token, flush=True)
sys.stdin.readline()
fd = os.memfd_create("artifact", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
os.write(fd, bytes.fromhex(sys.argv[2]))
s.sendmsg([struct.pack("<IHHII", 0x31504357, 1, 5, 8, 2) + struct.pack("<Q", token)],
          [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))])
mtype, p = reply()
print(mtype, struct.unpack_from("<i", p)[0] if mtype == 255 else 0,
      p[4:].decode("utf-8", "replace") if mtype == 255 else "", flush=True)
"""

ALLOWED, OTHER = 64260, 64261

# The builder runs as another user: this process must be root, with setpriv.
# wcached may run as root or, in ctest's integration_unprivileged
# (WCACHE_TEST_USER), as an unprivileged user without capabilities, as the
# packaged unit runs it: derive_groups judges the builder the same (root's
# waiter, and wcached's own uid, may always build).
as_another_user = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv (util-linux) to run a builder as another user")


def builder(d, user):
    """BUILDER run as user (uid, gid, groups) against d, its BUILD read:
    the process (send a line to its stdin to make it publish)."""
    from wcached import as_user
    let_in(d)
    proc = subprocess.Popen(as_user(*user) + [sys.executable, "-c", BUILDER, d.socket,
                                              ARTIFACT.hex()],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    mtype, _ = proc.stdout.readline().split()
    assert mtype == "133", mtype  # BUILD
    return proc


def publish(proc):
    """Makes the builder publish; its reply as (type, code, text)."""
    proc.stdin.write("\n")
    proc.stdin.flush()
    out, _ = proc.communicate(timeout=60)
    mtype, code, text = out.split(" ", 2)
    return int(mtype), int(code), text.strip()


@contextlib.contextmanager
def reloaded_while_building(d, tmp_path, user, keys):
    """d's "small" ready, a builder run as user has its BUILD of "f32-v1", a
    root connection waits for it, and then a reload gives "small" keys:
    (the builder's process, the waiter's Peer)."""
    ready(d, "small")
    proc = builder(d, user)
    try:
        w = Peer(d, timeout=60)
        w.derive("small", "f32-v1")
        waiting(d, 1)
        d.write_config({"small": (str(tmp_path / "small.safetensors"), keys)})
        r = ctl(d, "reload")
        assert r.returncode == 0, r
        yield proc, w
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)


def no_artifact(d):
    """Nothing was published: a new DERIVE builds."""
    p = Peer(d)
    p.derive("small", "f32-v1")
    r = p.reply(timeout=60)
    for fd in r["fds"]:
        os.close(fd)
    assert r["type"] == 133, r  # BUILD, not ATTACH_OK of a published artifact
    p.close()


@as_another_user
def test_a_reload_that_narrows_derive_groups_hands_the_build_to_a_waiter_that_may(
        derived, tmp_path):  # noqa: F811 (derived: the fixture)
    """The builder, in group OTHER, DERIVEs while derive_groups is "ALLOWED
    OTHER"; a reload narrows it to "ALLOWED" before its PUBLISH. Before
    823bc86 the PUBLISH was taken and every worker attached the artifact.
    The reload takes the build from the builder: its waiter, root, which
    may always build, takes it over (BUILD, a new token; review rev190 D2:
    it got EPERM, which reads as derive = no) and publishes it, and the
    builder's PUBLISH is refused with EPERM saying why."""
    d = derived({"derive_groups": f"{ALLOWED} {OTHER}"})
    with reloaded_while_building(d, tmp_path, (64303, 64303, (OTHER,)),
                                 {"derive": "yes", "derive_groups": str(ALLOWED)}) as (proc, w):
        r = w.reply(timeout=60)
        for fd in r["fds"]:
            os.close(fd)
        assert r["type"] == BUILD, r
        mtype, code, text = publish(proc)
        assert (mtype, code) == (ERROR, ERRNO["EPERM"]), (mtype, code, text)
        assert 'model "small": derived "f32-v1"' in text and "uid 64303 may no longer build " \
            "it: a configuration reload changed derive_groups" in text, text
        fd = memfd_with(ARTIFACT)
        w.publish(r["token"], fd)
        os.close(fd)
        assert take_artifact(w.reply(timeout=60)) == ARTIFACT
    d.wait_for_log(r'derived "f32-v1" of generation 1: the builder \(pid \d+ uid 64303\) may '
                   r'no longer build it \(gid 64303, \d+ supplementary groups\): a '
                   r'configuration reload changed derive_groups')


@as_another_user
def test_a_reload_that_turns_derive_off_fails_the_build_and_its_publish_is_told_why(
        derived, tmp_path):  # noqa: F811 (derived: the fixture)
    """The same, the reload turning derive off: the build fails at once
    (review rev190 D1: the reload left it alone, and its waiter learned only
    when the builder published, ECANCELED): its waiter gets EPERM, derive =
    no, naming the model, the builder's uid and the reload, and the
    builder's PUBLISH gets EPERM, one line saying why; nothing is
    published."""
    d = derived({"derive_groups": f"{ALLOWED}"})
    with reloaded_while_building(d, tmp_path, (64304, 64304, (ALLOWED,)),
                                 {"derive": "no", "derive_groups": str(ALLOWED)}) as (proc, w):
        expect_error(w.reply(timeout=60), "EPERM", 'model "small"', 'derived "f32-v1"',
                     "uid 64304", "a configuration reload turned derive off (derive = no)")
        mtype, code, text = publish(proc)
    assert (mtype, code) == (ERROR, ERRNO["EPERM"]), (mtype, code, text)
    assert "\n" not in text
    for words in ('model "small": derived "f32-v1"', "its build (token", "failed",
                  "uid 64304 may no longer build it: a configuration reload turned derive off"):
        assert words in text, text
