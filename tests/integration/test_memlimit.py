"""The memory limit wcached runs under: percent budgets are of the smaller of
RAM and the daemon's own cgroup limit (issue 21).

Each test makes a child of this process's memory cgroup (v1
memory.limit_in_bytes, or v2 memory.max where the controller can be
enabled below us), starts the real daemon in it as the unprivileged test
user, and reads what status, metrics and the log say: the limit in force,
where it came from, the budget it gives, the warning when the models served
do not fit, and the new figure after the limit changes and the daemon
reloads. Skips, saying why, where this process cannot make a memory cgroup
(not root; no memory controller; cgroup v2 whose memory controller cannot be
enabled below this process's cgroup).
"""
import os
import re
import subprocess

import pytest

from conftest import Daemon, binary, wait_until
from ctlutil import ctl, daemons, status

MiB = 1 << 20


def own_memory_cgroup():
    """(version, directory, cgroup path) of this process's memory cgroup,
    or a pytest.skip naming why there is none to make children in."""
    if os.geteuid() != 0:
        pytest.skip("making a memory cgroup needs root")
    v1 = v2 = None
    with open("/proc/self/cgroup") as f:
        for line in f:
            hid, controllers, path = line.rstrip("\n").split(":", 2)
            if hid == "0" and controllers == "":
                v2 = path
            elif "memory" in controllers.split(","):
                v1 = path
    mounts = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            fstype, opts = fields[fields.index("-") + 1], fields[-1]
            if fstype == "cgroup" and "memory" in opts.split(","):
                mounts.setdefault("v1", (fields[3], fields[4]))
            elif fstype == "cgroup2":
                mounts.setdefault("v2", (fields[3], fields[4]))
    for version, path in (("v1", v1), ("v2", v2)):
        if path is None or version not in mounts:
            continue
        root, point = mounts[version]
        rel = path[len(root):] if root != "/" and path.startswith(root) else path
        directory = point + rel.rstrip("/")
        if version == "v1" or "memory" in open(
                os.path.join(directory, "cgroup.subtree_control")).read().split():
            return version, directory, path.rstrip("/")
    pytest.skip("no memory cgroup controller this process can make a child in "
                f"(v1 memory: {v1}, v2: {v2})")


@pytest.fixture
def cgroup():
    """A child memory cgroup: (version, directory, its path); set_limit(bytes)."""
    version, parent, path = own_memory_cgroup()
    name = f"wcache-test-{os.getpid()}"
    directory = os.path.join(parent, name)
    os.mkdir(directory)
    limit_file = "memory.limit_in_bytes" if version == "v1" else "memory.max"

    def set_limit(n):
        with open(os.path.join(directory, limit_file), "w") as f:
            f.write(str(n))

    yield version, directory, f"{path}/{name}", limit_file, set_limit
    # The daemon has exited (its fixture stops it first): nothing is left in
    # the cgroup but the page cache charged to it, which rmdir hands up.
    wait_until(lambda: open(os.path.join(directory, "cgroup.procs")).read() == "",
               timeout=30, what="the test cgroup to empty")
    os.rmdir(directory)


def make(tmp_path, name, seed, min_bytes):
    path = str(tmp_path / f"{name}.safetensors")
    subprocess.run([binary("mkmodel"), "--seed", str(seed), "--layers", "3", "--hidden", "512",
                    "--ffn", "1024", "--vocab", "1000", "--min-bytes", str(min_bytes), path],
                   check=True, stdout=subprocess.DEVNULL)
    return path


@pytest.fixture
def start(tmp_path, cgroup):
    """start(models, extra): a Daemon in the test's cgroup, stopped (exit 0)
    before the cgroup is removed."""
    yield from daemons(lambda models, extra, **kw: Daemon(tmp_path, models, extra,
                                                          cgroup=cgroup[1], **kw))


def metric(d, name):
    r = ctl(d, "metrics")
    assert r.returncode == 0, r.stderr
    return [line for line in r.stdout.splitlines() if line.startswith(name)]


def test_percent_budget_is_of_the_cgroup_limit(start, tmp_path, cgroup):
    version, directory, path, limit_file, set_limit = cgroup
    limit = 512 * MiB
    set_limit(limit)
    models = {"a": make(tmp_path, "a", 1, 24 * MiB), "b": make(tmp_path, "b", 2, 24 * MiB)}
    d = start(models, "memory_budget = 50%\n")
    # Both loaded first, and both figures from one reply: models_bytes counts
    # the models loaded when it is read (a second reply could count more).
    s = wait_until(lambda: (lambda s: sorted(m["name"] for m in s["models"]
                                             if m["generation"] == 1) == ["a", "b"] and s)(
        status(d)), what="a and b loaded")
    mem = s["memory"]
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert mem["ram"] == ram
    assert mem["limit"] == limit and mem["cgroup_limit"] == limit
    assert mem["limit_kind"] == f"cgroup_{version}"
    assert mem["limit_source"] == f"cgroup {version} {limit_file} of {path}", mem
    assert mem["budget"] == limit // 2  # 50% of the cgroup's limit, not of the RAM
    assert mem["fits"] is True
    assert mem["models_bytes"] == sum(m["bytes"] for m in s["models"])
    assert metric(d, "wcached_memory_limit_bytes{") == [
        f'wcached_memory_limit_bytes{{source="cgroup_{version}"}} {limit}']
    assert metric(d, "wcached_memory_budget_bytes ") == [
        f"wcached_memory_budget_bytes {limit // 2}"]
    assert metric(d, "wcached_memory_ram_bytes ") == [f"wcached_memory_ram_bytes {ram}"]
    assert f"memory: {limit >> 20} MiB in force (cgroup {version} {limit_file} of {path}" \
        in d.read_log()
    assert "do not fit" not in d.read_log()
    out = ctl(d, "status").stdout
    assert (f"memory: 512.0 MiB in force (cgroup {version} {limit_file} of {path}), "
            "budget 256.0 MiB, models ") in out, out
    assert "do not fit" not in out

    # The limit changes (a resize of the container); a reload reads it again.
    set_limit(256 * MiB)
    r = ctl(d, "reload")
    assert r.returncode == 0, r.stderr
    mem = status(d)["memory"]
    assert mem["limit"] == 256 * MiB and mem["budget"] == 128 * MiB
    d.wait_for_log(r"memory: 256 MiB in force")

    # No limit left: the RAM again, and the budget with it.
    set_limit(-1)
    assert ctl(d, "reload").returncode == 0
    mem = status(d)["memory"]
    assert mem["limit_kind"] == "ram" or mem["limit"] < ram  # a limit above us may remain
    if mem["limit_kind"] == "ram":
        assert mem["limit"] == ram and mem["limit_source"] == "RAM"
        assert mem["budget"] == ram // 100 * 50 + ram % 100 * 50 // 100


def test_models_that_do_not_fit_are_named_at_start(start, tmp_path, cgroup):
    version, directory, path, limit_file, set_limit = cgroup
    # Two models of 80 MiB and more under a 128 MiB limit (room for the
    # daemon's own memory, ASan's included): the kernel would reclaim what
    # the daemon warms, and the log says so once, with the fix.
    set_limit(128 * MiB)
    models = {"a": make(tmp_path, "a", 1, 80 * MiB), "b": make(tmp_path, "b", 2, 80 * MiB)}
    d = start(models, "")
    t, line = d.wait_for_log(r"the 2 models served \(\d+ MiB\) do not fit under the memory "
                             r"limit in force \(128 MiB, cgroup")
    assert f"of {path}" in line and "raise or remove that limit" in line, line
    mem = status(d)["memory"]
    assert mem["fits"] is False and mem["limit"] == 128 * MiB and mem["budget"] == 0
    out = ctl(d, "status").stdout
    assert "budget none" in out and "warning: the models do not fit under the memory limit" \
        in out, out
    assert len(re.findall("do not fit", d.read_log())) == 1


def test_a_budget_under_the_limit_fits(start, tmp_path, cgroup):
    """The README's advice followed: models of more than the limit, and a
    memory_budget below it, which keeps one warm. No "do not fit" warning
    (the log, status's "fits" and its warning line): the budget decides what
    stays warm. Before, the warning fired and advised setting the budget
    that was set."""
    version, directory, path, limit_file, set_limit = cgroup
    set_limit(128 * MiB)
    models = {"a": make(tmp_path, "a", 1, 48 * MiB), "b": make(tmp_path, "b", 2, 48 * MiB),
              "c": make(tmp_path, "c", 3, 48 * MiB)}
    d = start(models, "memory_budget = 56M\n")
    wait_until(lambda: all(m["state"] in ("ready", "cold") for m in status(d)["models"]),
               what="the models to load")
    mem = status(d)["memory"]
    assert mem["models_bytes"] > 128 * MiB and mem["budget"] == 56 * MiB, mem
    assert mem["fits"] is True, mem
    out = ctl(d, "status").stdout
    assert "do not fit" not in out, out
    assert "do not fit" not in d.read_log()


def test_models_pinned_whole_do_not_fit_whatever_the_budget(start, tmp_path, cgroup):
    """The budget evicts no model pinned whole (pin = all): three such
    models of more than the limit do not fit, whatever memory_budget says,
    and the warning says why (review rev125: c433ee7 counted the budget
    alone, so they "fit" and the warning was gone)."""
    version, directory, path, limit_file, set_limit = cgroup
    set_limit(128 * MiB)
    models = {n: (make(tmp_path, n, seed, 48 * MiB), {"pin": "all"})
              for n, seed in (("a", 1), ("b", 2), ("c", 3))}
    # As a user without CAP_IPC_LOCK: its pins fail (RLIMIT_MEMLOCK), so
    # nothing is charged to the cgroup; the configured pins are what count.
    d = start(models, "memory_budget = 56M\n", user=(65534, 65534))
    t, line = d.wait_for_log(r"do not fit under the memory limit in force \(128 MiB")
    assert "the models pinned whole (pin = all) alone do not fit: pin fewer" in line, line
    assert status(d)["memory"]["fits"] is False


def test_budget_above_the_limit_is_named(start, tmp_path, cgroup):
    version, directory, path, limit_file, set_limit = cgroup
    set_limit(128 * MiB)
    d = start({"a": make(tmp_path, "a", 1, 8 * MiB)}, "memory_budget = 1G\n")
    t, line = d.wait_for_log(r"memory_budget \(1024 MiB\) is above the memory limit in force "
                             r"\(128 MiB")
    assert path in line, line
    assert status(d)["memory"]["budget"] == 1 << 30


def test_without_a_budget_the_limit_in_force_bounds_an_artifact(start, tmp_path, cgroup):
    """rev175 F5: without a memory_budget an artifact was bounded by the
    machine's RAM (read again at each PUBLISH), not by the memory limit in
    force: under a cgroup limit of 64 MiB a 96 MiB artifact was published."""
    from conftest import mkmodel
    from test_derived import ATTACH_OK, Peer, build, closing, expect_error, one_tensor_memfd
    from test_regressions import ready
    version, directory, path, limit_file, set_limit = cgroup
    set_limit(64 * MiB)
    d = start({"small": (mkmodel(tmp_path / "small.safetensors"), {"derive": "yes"})}, "")
    ready(d, "small")
    a = Peer(d)

    def publish(key):
        r = build(a, key=key)
        fd = one_tensor_memfd(96 * MiB, lambda fd, off, n: os.pwrite(fd, bytes(n), off))
        a.publish(r["token"], fd)
        os.close(fd)
        return a.reply()

    expect_error(publish("big-v1"), "EFBIG", "big-v1", "96 MiB is more than the memory limit "
                 f"in force (64 MiB, cgroup {version} {limit_file} of {path})", "memory_budget")
    # A reload reads the limit again, and the bound follows it.
    set_limit(256 * MiB)
    assert ctl(d, "reload").returncode == 0
    assert closing(publish("big-v2"))["type"] == ATTACH_OK
