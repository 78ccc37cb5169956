"""A warm restart and staged copies (README, "Models on shared storage",
Restarts): a restored generation keeps serving its copy in stage_dir only
while the file it was copied from is still there, the same file (its
st_dev and st_ino, which the file descriptor store's description records
since version 4) with the same size, mtime and ctime (recorded since
version 5). A source replaced while no wcached ran by a file of the same
size and mtime (rsync -a, cp -p, a reproducible build's fixed mtime) is
staged again, whether it is another inode (a rename), the same one (cp -p
over it writes in place) or a new file at the freed inode number (rm then
cp -p, which ext4 gives back); so is a copy an older wcached described
without its origin or its ctime. A stage_dir that is a symbolic link keeps
its copies across a restart too."""
import fcntl
import json
import os
import subprocess

import pytest

from conftest import Daemon, binary, mkmodel, wait_until
from ctlutil import ctl
from fakemanager import FakeManager
from test_stage import MARKER, entries, generation, model_fds, on_fuse, own_dir, remotefs
from test_warm_restart import finish, ready, start, worker

LAYERS = dict(layers=2, hidden=64, ffn=128, vocab=64)


def staged_model(tmp_path, hold=1, where=None):
    """Model m (stage = yes), a fake manager and a daemon (not started):
    (its path, the manager, the daemon, stage_dir). hold: seconds a
    restarted daemon waits for the HOLDs of workers from before (they
    never say it here: 1 s, not 60). where: the directory of its file
    (default tmp_path, $WCACHE_TEST_USER's where that is set)."""
    src = mkmodel((where or tmp_path) / "m.safetensors", seed=1, **LAYERS)
    d = Daemon(tmp_path, {"m": (src, {"stage": "yes"})},
               extra=f"stage_dir = {tmp_path}/staged\nrestart_hold_seconds = {hold}\n")
    return src, FakeManager(str(tmp_path / "notify.sock")), d, str(tmp_path / "staged")


def start_stored(d, mgr, user=None):
    """Starts d under mgr (as user: start()) and waits until generation 1
    of m is in the store."""
    start(d, mgr, user=user)
    wait_until(lambda: ready(d, "m"), what="m ready")
    mgr.wait_for(lambda m: "wc-1-1-i" in m.store and "wc-desc" in m.store,
                 what="generation 1 stored")


def verify(d, src):
    """A worker reads every byte of m and compares it with src."""
    r = subprocess.run([binary("demo_worker"), "--socket", d.socket, "--verify", src, "m"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, "served bytes are not the source's: " + r.stderr[-300:]


def same_size_and_mtime(tmp_path, src, seed):
    """Renames over src a new file (other bytes) of its size and mtime."""
    st = os.stat(src)
    new = mkmodel(tmp_path / "new.safetensors", seed=seed, **LAYERS)
    assert os.path.getsize(new) == st.st_size
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.rename(new, src)


def test_a_source_replaced_by_a_file_of_the_same_size_and_mtime_is_staged_again(tmp_path):
    src, mgr, d, stage_dir = staged_model(tmp_path)
    try:
        start_stored(d, mgr)
        # Unchanged: the copy is kept, twice (a restored generation is
        # described again with its origin).
        for _ in range(2):
            assert d.stop() == 0, d.read_log()
            start(d, mgr, *mgr.listen_fds())
            wait_until(lambda: ready(d, "m"), what="m restored")
            assert 'generation 1 keeps its staged copy' in d.read_log(), d.read_log()
            assert entries(stage_dir) == ["m.1"]
            mgr.wait_for(lambda m: len(m.store.get("wc-desc", [])) == 1,
                         what="the description stored again")
        verify(d, src)
        assert d.stop() == 0, d.read_log()

        same_size_and_mtime(tmp_path, src, 2)
        start(d, mgr, *mgr.listen_fds())
        wait_until(lambda: ready(d, "m") and generation(d) == 2, what="m staged again")
        log = d.read_log()
        assert f"{src} was replaced since it was staged (it is another file now)" in log, log
        assert "keeps its staged copy" not in log, log
        d.wait_for_log(r'"m": generation 2 staged from \S+ to ')
        verify(d, src)
        assert 'model "m": generation 1 not restored: removing its staged copy' in log, log
        wait_until(lambda: entries(stage_dir) == ["m.2"], what="only m.2")
    finally:
        code = d.stop()
        mgr.close()
    assert code == 0, d.read_log()


def walk(desc):
    """Walks a version 9 (or 8, 7, 6) description (proto/PROTOCOL.md, "The
    file descriptor store"): ([(generation number, file k, offset of the file's
    origin st_dev, st_ino, which st_ctim, st_nlink and the origin's st_ctim
    follow)], [(offset, length) of each generation's holder uids: their
    count and pairs, which version 6 added], [each derived artifact's
    {"key", and the offsets of its "size", "index_size", "builder_uid" and,
    in version 7, "builder_gid", "groups" (the offset of each of its
    builder's groups) and "builder" ((offset, length) of its builder's gid,
    group count and groups, which version 7 added)}], [(offset, length) of
    each model's wait line and tree, which versions 8 and 9 added, version
    10 the tree's path named and kept files], [offset of each generation's
    path named byte, which version 10 added])."""
    found, holders, artifacts, tails, named, p = [], [], [], [], [], 0

    def take(n):
        nonlocal p
        b = desc[p:p + n]
        assert len(b) == n
        p += n
        return b

    def num(n):
        return int.from_bytes(take(n), "little")

    def string():
        return take(num(2))

    assert take(8) == b"WCFDSTOR"
    version = num(4)
    assert version in (6, 7, 8, 9, 10), version
    models = num(4)
    take(8)
    for _ in range(models):
        string(), string(), take(16)
        for _ in range(num(4)):
            number = num(8)
            take(8)
            at = p
            take(8 * num(4))
            holders.append((at, p - at))
            if version >= 10:
                named.append(p)
                take(1)                     # what its path named
            string(), take(8)
            for k in range(num(4)):
                string(), take(32)
                found.append((number, k, p))
                take(16 + 24)
        for _ in range(num(4)):
            a = {"key": string().decode()}
            take(8), string()
            a["size"] = p
            take(8), string()
            a["index_size"] = p
            take(8)
            a["builder_uid"] = p
            take(16)
            if version >= 7:
                at = a["builder_gid"] = p
                take(4)
                count = num(4)
                a["groups"] = [p + 4 * i for i in range(count)]
                take(4 * count)
                a["builder"] = (at, p - at)
            artifacts.append(a)
        at = p
        if version >= 8:
            take(num(2))                    # the wait line (0: none)
        if version >= 9 and num(2) > 0:     # the tree: its root, if any,
            p -= 2
            string(), take(4 + 1 + 8 + 8)   # owner, inode known, dev, ino
            take(num(2)), take(8)           # its place, mode, directory length
            if version >= 10:               # what its path named, kept files
                take(1), take(28 * num(4))  # each uid, dev, ino, ctime
        tails.append((at, p - at))
    assert p == len(desc)
    return found, holders, artifacts, tails, named


def file_records(desc):
    """walk()'s file records of a description."""
    return walk(desc)[0]


def older_version(desc, version):
    """The version 10 (9, 8, 7) description as a version 6 wcached wrote it
    (without its models' trees and wait lines, nor its artifacts' builders'
    groups, nor what its generations' paths named), a version 4 one (without the holders' uids, each file's ctimes
    and nlink either) or a version 3 one (without its files' origin
    either)."""
    assert version in (3, 4, 6), version
    files, holders, artifacts, tails, named = walk(desc)
    cuts = [(at, at + n) for at, n in (a["builder"] for a in artifacts)] + \
        [(at, at + n) for at, n in tails] + [(at, at + 1) for at in named]
    if version <= 4:
        cuts += [(at + (16 if version == 4 else 0), at + 16 + 24) for _, _, at in files] + \
            [(at, at + n) for at, n in holders]
    cuts.sort()
    out, last = bytearray(desc[:8] + version.to_bytes(4, "little")), 12
    for begin, end in cuts:
        out += desc[last:begin]
        last = end
    return bytes(out + desc[last:])


def to_version_3(desc):
    return older_version(desc, 3)


def replace_description(mgr, desc):
    """Puts desc in mgr's store as the sealed wc-desc memfd, in place of
    the one there (the caller holds mgr.lock)."""
    old = mgr.store["wc-desc"]
    fd = os.memfd_create("wcached-fdstore", os.MFD_ALLOW_SEALING)
    os.write(fd, desc)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK |
                fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    mgr.store["wc-desc"] = [fd]
    for f in old:
        os.close(f)


def origins(desc):
    """{(generation, k): (origin st_dev, st_ino)} of a description."""
    return {(g, k): (int.from_bytes(desc[at:at + 8], "little"),
                     int.from_bytes(desc[at + 8:at + 16], "little"))
            for g, k, at in file_records(desc)}


def ctimes(desc):
    """{(generation, k): (st_ctim, st_nlink, origin st_ctim)} of a
    description, times in ns."""
    return {(g, k): tuple(int.from_bytes(desc[at + 16 + 8 * i:at + 24 + 8 * i], "little",
                                         signed=i != 1) for i in range(3))
            for g, k, at in file_records(desc)}


def description_in(store):
    """The stored description's bytes (the caller holds the manager's lock,
    as mgr.wait_for's condition does)."""
    fd = store["wc-desc"][0]
    return os.pread(fd, os.fstat(fd).st_size, 0)


def descriptions_stored(mgr):
    """How many descriptions the daemons have stored (the lock held)."""
    return sum(1 for m in mgr.messages if m.get("FDNAME") == "wc-desc" and
               m.get("FDSTORE") == "1")


def test_a_copy_described_by_an_older_wcached_is_staged_again(tmp_path):
    """Version 3 did not record a copy's origin: whether the source is still
    the file copied cannot be told, so the model is not restored; nor does
    it record the tree its generation was loaded from, and a copy's place
    tells none, so what its path names waits, once, for the operator's
    `wcachectl reload m` (review rev206 M1), which stages it again."""
    src, mgr, d, stage_dir = staged_model(tmp_path)
    try:
        start_stored(d, mgr)
        assert d.stop() == 0, d.read_log()
        with mgr.lock:
            desc = description_in(mgr.store)
            assert origins(desc)[(1, 0)] == (os.stat(src).st_dev, os.stat(src).st_ino)
            replace_description(mgr, to_version_3(desc))
        start(d, mgr, *mgr.listen_fds())
        d.wait_for_log(r'model "m": not restored: .*records no tree to judge it against.*'
                       r'wcachectl reload m', timeout=60)
        assert generation(d) is None   # nothing serves
        r = ctl(d, "reload", "m")
        assert r.returncode == 0, r.stdout + r.stderr
        wait_until(lambda: ready(d, "m") and generation(d) == 2, what="m staged again")
        log = d.read_log()
        assert (f"the description of its copy of {src} does not say which file it was "
                "copied from (stored by an older wcached)") in log, log
        assert "keeps its staged copy" not in log, log
        verify(d, src)
        wait_until(lambda: entries(stage_dir) == ["m.2"], what="only m.2")
        assert entries(os.path.join(stage_dir, "m.2")) == [MARKER, "m.safetensors"]
    finally:
        code = d.stop()
        mgr.close()
    assert code == 0, d.read_log()


@pytest.mark.parametrize("stage", ["yes", "no"])
def test_a_generation_described_without_ctimes_loads_afresh(tmp_path, stage):
    """Version 4 did not record the files' ctime (nor a copy's origin's):
    a write in place whose writer put the mtime back while no wcached ran
    cannot be told, so the current generation loads afresh, once, staged or
    not; the next restart is warm again. Version 5 records each file's
    st_ctim and st_nlink, and a copy's origin's st_ctim. Nor did version 4
    record the model's tree (version 9 does): the restart takes the one its
    stored file is found in only where that is root's or the file's owner's,
    so the file (root's, as the test makes it) lies in a directory of root's,
    not in tmp_path, which is $WCACHE_TEST_USER's where that is set (there,
    the model would wait for `wcachectl reload m`)."""
    models = tmp_path / "models"
    models.mkdir()
    src, mgr, d, stage_dir = staged_model(tmp_path, where=models)
    d.write_config({"m": (src, {"stage": stage})},
                   f"stage_dir = {stage_dir}\nrestart_hold_seconds = 1\n")
    os.chmod(mgr.path, 0o666)   # wcached, as $WCACHE_TEST_USER, sends to it
    try:
        start_stored(d, mgr, user=d.user)
        assert d.stop() == 0, d.read_log()
        with mgr.lock:
            desc = description_in(mgr.store)
            st = os.stat(src)
            ctime, nlink, origin_ctime = ctimes(desc)[(1, 0)]
            if stage == "yes":
                assert origin_ctime == st.st_ctime_ns and nlink == 1
            else:
                assert (ctime, nlink, origin_ctime) == (st.st_ctime_ns, st.st_nlink, 0)
            replace_description(mgr, older_version(desc, 4))
        start(d, mgr, *mgr.listen_fds(), user=d.user)
        wait_until(lambda: ready(d, "m") and generation(d) == 2, what="m loaded afresh")
        log = d.read_log()
        assert ('model "m": not restored: file m.safetensors: its description does not '
                'record its ctime (stored by an older wcached), so a write in place while '
                'no wcached ran cannot be told; loading') in log, log
        verify(d, src)
        mgr.wait_for(lambda m: "wc-1-2-i" in m.store and "wc-desc" in m.store and
                     (2, 0) in ctimes(description_in(m.store)), what="generation 2 stored")
        assert d.stop() == 0, d.read_log()
        start(d, mgr, *mgr.listen_fds(), user=d.user)
        wait_until(lambda: ready(d, "m"), what="m restored")
        assert 'model "m": generation 2 restored from the file descriptor store' in \
            d.read_log(), d.read_log()
    finally:
        code = d.stop()
        mgr.close()
    assert code == 0, d.read_log()


@pytest.mark.parametrize("how", ["cp -p over it", "rm, then cp -p"])
def test_a_source_rewritten_with_its_size_and_mtime_while_down_is_staged_again(tmp_path,
                                                                                 how):
    """cp -p NEW SRC over a staged source writes it in place (the same
    inode); rm SRC then cp -p NEW SRC gets a new file, on ext4 at the
    freed inode number (nothing holds the source open). Both keep the size
    and mtime: only the ctime tells. The restart kept the old copy and
    served its bytes for the new source (rev110 defect 3)."""
    src, mgr, d, stage_dir = staged_model(tmp_path)
    try:
        start_stored(d, mgr)
        assert d.stop() == 0, d.read_log()
        st = os.stat(src)
        new = mkmodel(tmp_path / "new.safetensors", seed=2, **LAYERS)
        assert os.path.getsize(new) == st.st_size
        os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
        if how.startswith("rm"):
            os.unlink(src)
        subprocess.run(["cp", "-p", new, src], check=True)
        now = os.stat(src)
        assert (now.st_size, now.st_mtime_ns) == (st.st_size, st.st_mtime_ns)
        assert now.st_ctime_ns != st.st_ctime_ns
        start(d, mgr, *mgr.listen_fds())
        wait_until(lambda: ready(d, "m") and generation(d) == 2, what="m staged again")
        log = d.read_log()
        if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
            assert (f"{src} was written or replaced since it was staged (its ctime moved; "
                    "its size and mtime are the copy's)") in log, log
        else:
            assert f"{src} was replaced since it was staged (it is another file now)" in log, log
        assert "keeps its staged copy" not in log, log
        d.wait_for_log(r'"m": generation 2 staged from \S+ to ')
        verify(d, src)
        wait_until(lambda: entries(stage_dir) == ["m.2"], what="only m.2")
    finally:
        code = d.stop()
        mgr.close()
    assert code == 0, d.read_log()


def in_namespace(bind=None):
    """start()'s prefix: wcached in a mount namespace of its own (each start
    of wcached.service has one: PrivateTmp=, ProtectSystem=strict), bind, if
    given, mounted on itself there first (how systemd makes CacheDirectory=
    writable under ProtectSystem=strict)."""
    pre = f"mount --bind {bind} {bind} && " if bind else ""
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", pre + 'exec "$@"', "sh"]


ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces: root's")


@pytest.mark.parametrize("bind", [None, pytest.param(True, marks=ROOT_ONLY)],
                         ids=["", "namespace+bind"])
def test_a_held_staged_generation_keeps_its_origin(tmp_path, bind):
    """A generation held by a worker when wcached stops, its source since
    replaced: restored as held (its copy serves its holder), and described
    again with the origin it was copied from, not the file now there. Each
    wcached in a mount namespace of its own too, stage_dir bind-mounted on
    itself (wcached.service's CacheDirectory=): the copy's own name, which
    its origin's is found by, is found by identity under stage_dir (review
    rev217 M1: "the copy's own name cannot be told")."""
    src, mgr, d, stage = staged_model(tmp_path, hold=60)
    prefix = ()
    if bind:
        os.mkdir(stage)
        prefix = in_namespace(stage)
    old_bytes = str(tmp_path / "old-bytes.safetensors")
    with open(src, "rb") as a, open(old_bytes, "wb") as b:
        b.write(a.read())
    first = os.stat(src)
    try:
        start(d, mgr, prefix=prefix)
        wait_until(lambda: ready(d, "m"), what="m ready")
        holder = worker(d, old_bytes, "m")
        tmp = tmp_path / "next.safetensors"
        mkmodel(tmp, seed=2, **LAYERS)
        os.rename(tmp, src)
        wait_until(lambda: generation(d) == 2, what="generation 2")
        second = os.stat(src)
        want = {(1, 0): (first.st_dev, first.st_ino), (2, 0): (second.st_dev, second.st_ino)}
        mgr.wait_for(lambda m: "wc-desc" in m.store and origins(description_in(m.store)) == want,
                     what="both generations described with their origins")
        assert d.stop() == 0, d.read_log()
        with mgr.lock:
            stored = descriptions_stored(mgr)
        start(d, mgr, *mgr.listen_fds(), prefix=prefix)
        wait_until(lambda: ready(d, "m"), what="m restored")
        log = d.read_log()
        assert 'generation 1, held by workers before the restart, restored' in log, log
        assert 'generation 2 keeps its staged copy' in log, log
        # Described again by this process: the same origins.
        mgr.wait_for(lambda m: descriptions_stored(m) > stored and
                     origins(description_in(m.store)) == want,
                     what="the description stored again, with the same origins")
        assert finish(holder)["generation"] == 1
    finally:
        code = d.stop()
        mgr.close()
    assert code == 0, d.read_log()


def test_a_symlinked_stage_dir_keeps_its_copies_across_a_restart(tmp_path):
    """stage_dir a symbolic link the operator made (stage.h follows it):
    the restored copy's path, as the kernel names its descriptor, is under
    the link's target. It was compared with the configured spelling as a
    string: the copy was not recognised, the sweep removed it ("removed 1
    staged copy"), the check compared the copy with its origin as if it
    were the model's own file ("... was replaced or changed since it was
    stored") and every restart copied the whole model again."""
    src = mkmodel(tmp_path / "m.safetensors", seed=1, **LAYERS)
    link = str(tmp_path / "staged")
    d = Daemon(tmp_path, {"m": (src, {"stage": "yes"})},
               extra=f"stage_dir = {link}\nrestart_hold_seconds = 1\n")
    # The link's target is the daemon's own directory: with
    # WCACHE_TEST_USER, that user's, and the daemon runs as that user.
    real = own_dir(d, tmp_path / "real")
    os.symlink(real, link)
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    os.chmod(mgr.path, 0o666)   # wcached, as that user, sends to it
    try:
        start_stored(d, mgr, user=d.user)
        copy = os.path.join(real, "m.1")
        first = os.stat(os.path.join(copy, "m.safetensors"))
        assert d.stop() == 0, d.read_log()
        assert entries(real) == ["m.1"]
        start(d, mgr, *mgr.listen_fds(), user=d.user)
        wait_until(lambda: ready(d, "m"), what="m restored")
        log = d.read_log()
        assert f'model "m": generation 1 keeps its staged copy {copy}' in log, log
        assert "staged from" not in log and "removed" not in log, log
        assert "not restored" not in log, log
        assert generation(d) == 1 and entries(real) == ["m.1"]
        again = os.stat(os.path.join(copy, "m.safetensors"))
        assert (again.st_dev, again.st_ino) == (first.st_dev, first.st_ino)
        fds = model_fds(d.proc.pid)
        assert fds and all(t.startswith(copy + "/") for t in fds), fds
        verify(d, src)
    finally:
        code = d.stop()
        mgr.close()
    assert code == 0, d.read_log()


def test_a_copy_in_the_stage_dir_of_before_is_said_to_be_there(tmp_path):
    """stage_dir changed between two runs: the stored copy is in the old
    one. The restarted wcached stages the model again into the new one,
    and says the copy is in another stage_dir (which it does not sweep),
    not that the model's file "was replaced or changed since it was
    stored", which comparing the copy with the source said."""
    src, mgr, d, old_dir = staged_model(tmp_path)
    new_dir = str(tmp_path / "staged-new")
    try:
        start_stored(d, mgr)
        assert d.stop() == 0, d.read_log()
        d.write_config({"m": (src, {"stage": "yes"})},
                       f"stage_dir = {new_dir}\nrestart_hold_seconds = 1\n")
        start(d, mgr, *mgr.listen_fds())
        wait_until(lambda: ready(d, "m") and generation(d) == 2, what="m staged again")
        log = d.read_log()
        copy = os.path.join(old_dir, "m.1")
        assert (f"its staged copy {copy}/m.safetensors is not in stage_dir {new_dir} "
                f"(stage_dir changed since it was staged): the copy is not used, and no "
                f"sweep removes {copy}: remove it by hand") in log, log
        assert "replaced or changed since it was stored" not in log, log
        d.wait_for_log(r'"m": generation 2 staged from \S+ to ')
        assert entries(new_dir) == ["m.2"] and entries(old_dir) == ["m.1"]
        verify(d, src)
    finally:
        code = d.stop()
        mgr.close()
    assert code == 0, d.read_log()


def test_a_warm_restart_looks_nothing_up_in_a_stage_dir_on_a_hung_fuse_mount(tmp_path):
    """stage_dir moved, between two runs, to a FUSE mount whose server hangs
    (as a gVisor or Kata pod's emptyDir is 9p or virtiofs), m now stage =
    auto on a local file: the restarted wcached warns once, looks nothing
    up there (neither the restore's walk of its stored copy, which names
    stage_dir's entries on the loop, nor the sweep, nor making it) and
    serves m from its own file (review rev221 M3: before, the start was
    refused, and without the refusal the restore waited on the server)."""
    rfs = remotefs()
    src = mkmodel(tmp_path / "m.safetensors", seed=1, **LAYERS)
    d = Daemon(tmp_path, {"m": (src, {"stage": "yes"})},
               extra=f"stage_dir = {tmp_path}/staged\nrestart_hold_seconds = 1\n")
    old_dir = own_dir(d, tmp_path / "staged")
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    os.chmod(mgr.path, 0o666)   # wcached, as that user, sends to it
    with rfs.RemoteFS(tmp_path / "backing", tmp_path / "mnt") as fs:
        remote = fs.path("staged")
        try:
            start_stored(d, mgr, user=d.user)
            assert d.stop() == 0, d.read_log()
            assert entries(old_dir) == ["m.1"]
            d.write_config({"m": src}, f"stage_dir = {remote}\nrestart_hold_seconds = 1\n")
            fs.freeze()
            try:
                start(d, mgr, *mgr.listen_fds(), user=d.user)
                d.wait_for_log("warning: " + on_fuse(remote) + "$", timeout=30)
                wait_until(lambda: ready(d, "m"), timeout=30, what="m served")
                verify(d, src)
                log = d.read_log()
                assert "staged from" not in log and "removed" not in log, log
            finally:
                fs.thaw()
        finally:
            code = d.stop()
            mgr.close()
        assert code == 0, d.read_log()
        assert not os.path.exists(fs.backing_path("staged"))


def test_a_stage_key_changed_across_a_restart_is_applied(tmp_path):
    """stage = yes set while no wcached ran (as under systemd: edit, then
    restart): the stored generation, served from the source's own files, is
    not restored but loaded afresh, which stages it, as status and the
    daemon's descriptors show; the reverse (stage = no) serves the source
    again and removes the copy. Before, the stored generation was restored
    as it was: status said "stage": "yes" with "staged": false, and neither
    a SIGHUP nor `wcachectl reload m` ("unchanged") staged it until its
    file was replaced."""
    src = mkmodel(tmp_path / "m.safetensors", seed=1, **LAYERS)
    stage_dir = str(tmp_path / "staged")
    extra = f"stage_dir = {stage_dir}\nrestart_hold_seconds = 1\n"
    d = Daemon(tmp_path, {"m": (src, {"stage": "no"})}, extra=extra)
    mgr = FakeManager(str(tmp_path / "notify.sock"))

    def staged():
        r = subprocess.run([binary("wcachectl"), "--control", d.control, "--json", "status"],
                           capture_output=True, text=True, timeout=60)
        m = {m["name"]: m for m in json.loads(r.stdout)["models"]}["m"]
        return m["stage"], [g["staged"] for g in m["generations"] if g["current"]]

    try:
        start_stored(d, mgr)
        assert staged() == ("no", [False])
        assert d.stop() == 0, d.read_log()

        d.write_config({"m": (src, {"stage": "yes"})}, extra)
        start(d, mgr, *mgr.listen_fds())
        wait_until(lambda: ready(d, "m") and generation(d) == 2, what="m staged afresh")
        log = d.read_log()
        assert ('model "m": not restored: generation 1 is not a staged copy, and stage = yes '
                'now; loading') in log, log
        assert staged() == ("yes", [True])
        wait_until(lambda: model_fds(d.proc.pid) and all(
            t.startswith(stage_dir + "/m.2/") for t in model_fds(d.proc.pid)),
            what="only the copy open")
        verify(d, src)
        mgr.wait_for(lambda m: "wc-1-2-i" in m.store and "wc-desc" in m.store,
                     what="generation 2 stored")
        assert d.stop() == 0, d.read_log()

        d.write_config({"m": (src, {"stage": "no"})}, extra)
        start(d, mgr, *mgr.listen_fds())
        wait_until(lambda: ready(d, "m") and generation(d) == 3, what="m loaded afresh")
        log = d.read_log()
        assert ('model "m": not restored: generation 2 is a staged copy, and stage = no now; '
                'loading') in log, log
        assert staged() == ("no", [False])
        wait_until(lambda: set(model_fds(d.proc.pid)) == {src}, what="only the source open")
        wait_until(lambda: entries(stage_dir) == [], what="the copy m.2 removed")
        verify(d, src)
    finally:
        code = d.stop()
        mgr.close()
    assert code == 0, d.read_log()


@ROOT_ONLY
@pytest.mark.parametrize("bind", [False, True], ids=["namespace", "namespace+bind"])
def test_a_staged_copy_is_kept_across_a_restart_in_a_mount_namespace_of_its_own(tmp_path,
                                                                             bind):
    """Each wcached in a mount namespace of its own, as wcached.service
    starts it: the descriptors the store gives back are on the previous
    start's mounts, detached with its namespace, and the kernel names them
    from those mounts' roots. The copy was not recognised (its name refused,
    or, with stage_dir bind-mounted, taken from the bind mount's root:
    "its staged copy /m.1/m.safetensors is not in stage_dir"): swept, and
    the model copied again at each restart (review rev217 M1). Found by
    its identity under stage_dir, it is kept, as without namespaces."""
    src, mgr, d, stage = staged_model(tmp_path)
    os.mkdir(stage)
    prefix = in_namespace(stage if bind else None)
    try:
        start(d, mgr, prefix=prefix)
        wait_until(lambda: ready(d, "m"), what="m ready")
        mgr.wait_for(lambda m: "wc-1-1-i" in m.store and "wc-desc" in m.store,
                     what="generation 1 stored")
        copy = os.path.join(stage, "m.1")
        first = os.stat(os.path.join(copy, "m.safetensors"))
        assert d.stop() == 0, d.read_log()
        start(d, mgr, *mgr.listen_fds(), prefix=prefix)
        wait_until(lambda: ready(d, "m"), what="m restored")
        log = d.read_log()
        assert f'model "m": generation 1 keeps its staged copy {copy}' in log, log
        assert "staged from" not in log and "removed" not in log, log
        assert "not restored" not in log and "warning" not in log, log
        assert generation(d) == 1 and entries(stage) == ["m.1"]
        again = os.stat(os.path.join(copy, "m.safetensors"))
        assert (again.st_dev, again.st_ino) == (first.st_dev, first.st_ino)
        verify(d, src)
    finally:
        code = d.stop()
        mgr.close()
    assert code == 0, d.read_log()
