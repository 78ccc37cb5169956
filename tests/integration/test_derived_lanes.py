"""A builder that holds its lane of wcached's closer (a lingering socket it
passed, whose close waits out its linger) holds up no other user's
publication (review rev186 F2(a), rev189 F4). An artifact it built that
nobody holds is dropped to make room for another user's publication, and
the memory of that artifact is let go in a lane of wcached's own for its
builder, apart from the lane of what the builder chose: the publication
goes on once that lane is through, at once. Before, the artifact's memfds
closed in the builder's own lane, behind the held close: the publication
waited out the 30 s deadline, the kernel still counted the dropped
artifact, a second one was dropped in vain, and after 30 s more it was
refused (ENOMEM)."""
import os
import struct
import subprocess
import sys

import pytest

import test_neighbours
from conftest import mkmodel, wait_until
from test_derived import (ATTACH_OK, Peer, build, builders_lane_held, closing_reaches,
                          expect_error, let_in, memfd_with, metric, model_entry, publish_held,
                          release)
from test_derived import derived  # noqa: F401 (the fixture, used by name)
from test_derived_memory import artifact_of, dropped_for, in_cgroup  # noqa: F401 (fixture)
from test_derived_reload import BUILDER
from test_memlimit import cgroup  # noqa: F401 (the fixture, used by name)
from test_regressions import ready
from test_regressions import start  # noqa: F401 (the fixture, used by name)

MiB = 1 << 20
ALICE = (64302, 64302, (64200,))  # in derive_groups

# BUILDER (test_derived_reload.py) as Alice's worker: DERIVE "k2" of
# "small", print the BUILD, PUBLISH the memfd inherited as argv[2] at once,
# print the PUBLISH's reply as "type code text".
MADE = ('sys.stdin.readline()\nfd = os.memfd_create("artifact", os.MFD_CLOEXEC | '
        'os.MFD_ALLOW_SEALING)\nos.write(fd, bytes.fromhex(sys.argv[2]))\n')
assert MADE in BUILDER and BUILDER.count('b"f32-v1"') == 1
PUBLISHER = BUILDER.replace(MADE, "fd = int(sys.argv[2])\n").replace('b"f32-v1"', 'b"k2"')


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root for a cgroup and another user")
def test_a_builders_held_lane_holds_up_no_other_users_publication(in_cgroup, tmp_path,  # noqa: F811
                                                                  cgroup, monkeypatch):
    """Bob (root here) publishes k0 and k1, 40 MiB each, and releases them;
    then he holds his lane (a lingering socket he passed, lingering 300 s:
    past both of the old code's 30 s waits). Alice's 40 MiB k2 needs room
    under the 96 MiB cgroup: Bob's k0, nobody's, is dropped for it, and k2
    is published while Bob's lane is still held; only his lingering socket
    still waits to close."""
    cgroup[4](96 * MiB)
    d = in_cgroup({"small": (mkmodel(tmp_path / "small.safetensors"),
                             {"derive": "yes", "derive_groups": "64200"})}, "")
    ready(d, "small")
    bob = Peer(d)
    blob = artifact_of(40)
    release(bob, publish_held(bob, "k0", blob))
    release(bob, publish_held(bob, "k1", blob))
    linger = 'struct.pack("ii", 1, 60)'
    assert linger in test_neighbours.LINGERER
    monkeypatch.setattr(test_neighbours, "LINGERER",
                        test_neighbours.LINGERER.replace(linger, 'struct.pack("ii", 1, 300)'))
    from wcached import as_user
    let_in(d)
    fd = memfd_with(blob)
    with builders_lane_held(d):
        try:
            alice = subprocess.Popen(as_user(*ALICE) + [sys.executable, "-c", PUBLISHER,
                                                        d.socket, str(fd)],
                                     pass_fds=(fd,), stdout=subprocess.PIPE, text=True)
        finally:
            os.close(fd)
        out, _ = alice.communicate(timeout=240)
        assert alice.returncode == 0, out
        assert out.split(" ", 1)[0] == "133", out  # BUILD
        mtype, code, text = out.splitlines()[-1].split(" ", 2)
        assert (int(mtype), int(code)) == (ATTACH_OK, 0), (out, d.read_log()[-3000:])
        # Bob's lane is held still: the publication did not wait it out.
        assert metric(d, "wcached_fds_closing") >= 1
        d.wait_for_log(dropped_for("k2", "k0"))
        closing_reaches(d, 1, "the dropped k0 to close, Bob's lingering socket alone left")
        assert "in vain" not in d.read_log()
        assert sorted(x["key"] for x in model_entry(d, "small")["derived"]) == ["k1", "k2"]
    assert d.proc.poll() is None


def wcacheds_copies(d):
    """wcached's copies of publications it has open (memfds it named
    wcache-artifact), by /proc."""
    found = []
    for fd in os.listdir(f"/proc/{d.proc.pid}/fd"):
        try:
            if "wcache-artifact" in os.readlink(f"/proc/{d.proc.pid}/fd/{fd}"):
                found.append(fd)
        except OSError:
            pass  # closed meanwhile
    return found


def test_a_refused_copy_closes_apart_from_its_builders_lane(derived):  # noqa: F811
    """A publication whose header is of the right length but no JSON is
    refused after wcached copied it: the copy, wcached's memory, is let go in
    the lane of wcached's own for its builder, while the builder holds its
    lane (review rev193 F1). Before, the copy closed in the builder's lane,
    behind the lingering socket, for as long as the builder liked, while
    wcached counted its room as free: some 20 such refusals filled wcached's
    memory cgroup. The builder's own memfd and wcached's reopen of it (the
    builder's memory) still wait in its lane."""
    d = derived()
    ready(d, "small")
    a = Peer(d)
    with builders_lane_held(d):
        r = build(a, key="bad")
        fd = os.memfd_create("bad", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            head = b"this is not json"
            os.write(fd, struct.pack("<Q", len(head)) + head)
            os.write(fd, b"\x01" * (16 * MiB - 8 - len(head)))  # every byte written
            a.publish(r["token"], fd)
        finally:
            os.close(fd)
        expect_error(a.reply(timeout=60), "EBADMSG", "expected a JSON object")
        try:
            wait_until(lambda: not wcacheds_copies(d), timeout=60,
                       what="wcached's copy of the refused publication to close")
        except Exception as e:
            raise AssertionError(f"{e}: it waits behind the builder's held lane; "
                                 f"wcached_fds_closing {metric(d, 'wcached_fds_closing')}")
        # The lingering socket, the builder's memfd and the reopen of it.
        closing_reaches(d, 3, "the builder's own descriptors alone to wait in its lane")
    assert d.proc.poll() is None
