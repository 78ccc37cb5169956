"""The control socket and wcachectl's control commands, end to end: every
command's happy path and errors, swaps by `load`, `unload` while a worker
holds the model, pin and evict, who may connect (file mode, SO_PEERCRED,
control_group with primary and supplementary groups), hostile request
lines, and the metrics text checked by promtool when it is installed."""
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time

import pytest

from conftest import BUILD, FUSE_WAIT, Daemon, binary, mkmodel, root_daemon, wait_until
from ctlutil import (Control, FakeControl, as_user, ctl, mapped_bytes, model_entry,
                     quiet_fd_count, shared_dir, status, wait_for_control)
# tests/pyutil, on the path conftest set
from remotefs import RemoteFS, config_on_a_hung_server, skip_reason

SMALL = dict(layers=2, hidden=64, ffn=128, vocab=100)


@pytest.fixture
def daemon(daemon):
    """conftest's daemon, once its control socket answers."""
    return wait_for_control(daemon)


def ready(d, name, generation=1):
    """Waits until name's current generation is generation and warm."""
    return wait_until(lambda: (lambda m: m and m["generation"] == generation
                               and m["state"] == "ready" and m)(model_entry(d, name)),
                      what=f"{name} generation {generation} ready")


def serving(d, name="small"):
    r = d.attach(name)
    assert r.returncode == 0, r.stderr
    return r


# ---- status and the help ----------------------------------------------------

def test_status_fields(daemon, model):
    m = ready(daemon, "small")
    s = status(daemon)
    assert s["version"] and s["uptime_seconds"] >= 0 and s["clients"] == 0
    assert s["pid"] == daemon.proc.pid
    assert m["path"] == model
    assert m["bytes"] == os.path.getsize(model)
    assert 0 <= m["resident_bytes"] <= m["bytes"]
    assert m["pinned"] == "metadata" and m["attached"] == 0 and "error" not in m
    assert [(g["number"], g["state"], g["attached"]) for g in m["generations"]] == \
        [(1, "ready", 0)]
    assert s["unloaded"] == []


def test_status_table(daemon):
    ready(daemon, "small")
    r = ctl(daemon, "status")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("wcached ") and "0 clients" in lines[0]
    header = next(i for i, line in enumerate(lines) if line.startswith("NAME"))
    assert lines[header].split() == ["NAME", "GEN", "STATE", "BYTES", "RESIDENT", "PINNED",
                                     "ATTACHED"]
    row = lines[header + 1].split()
    assert row[0] == "small" and row[1] == "1" and row[2] == "ready" and row[-1] == "0"


def test_clients_and_attached_counts(daemon):
    ready(daemon, "small")
    w = subprocess.Popen([binary("demo_worker"), "--socket", daemon.socket, "--hold", "small"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert json.loads(w.stdout.readline())["generation"] == 1
        s = status(daemon)
        assert s["clients"] == 1
        assert s["models"][0]["attached"] == 1 and s["models"][0]["attaches"] >= 1
    finally:
        w.communicate("\n", timeout=30)
    assert w.returncode == 0
    wait_until(lambda: model_entry(daemon, "small")["attached"] == 0, what="release")


def test_help():
    r = subprocess.run([binary("wcachectl"), "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    for command in ("status", "load", "unload", "reload", "pin", "unpin", "evict", "metrics",
                    "inspect", "--control", "--json", "-c"):
        assert command in r.stdout
    for command in ("status", "load", "unload", "reload", "pin", "unpin", "evict", "metrics"):
        r = subprocess.run([binary("wcachectl"), command, "--help"], capture_output=True,
                           text=True)
        assert r.returncode == 0 and r.stdout.startswith("usage: wcachectl"), command
    assert "pin=none|metadata|all" in subprocess.run(
        [binary("wcachectl"), "load", "--help"], capture_output=True, text=True).stdout
    # -V as wcached takes it (review rev223 L9: "unknown option").
    for flag in ("-V", "--version"):
        r = subprocess.run([binary("wcachectl"), flag], capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout.startswith("wcachectl "), (flag, r)
    assert "-V, --version" in subprocess.run([binary("wcachectl"), "--help"],
                                             capture_output=True, text=True).stdout


def test_usage_errors(daemon):
    for args in (["bogus"], ["load", "x"], ["unload"], ["pin", "a", "b"], ["status", "--what"],
                 ["-c", "x", "--control", "y", "status"]):
        r = subprocess.run([binary("wcachectl"), *args], capture_output=True, text=True)
        assert r.returncode == 2, args
        assert r.stderr, args


def test_not_running(tmp_path):
    path = str(tmp_path / "none.sock")
    r = subprocess.run([binary("wcachectl"), "--control", path, "status"], capture_output=True,
                       text=True)
    assert r.returncode == 1
    assert "wcached is not running" in r.stderr and path in r.stderr


def start_refused(tmp_path, control, env=None):
    """wcached started on tmp_path/w.sock and control, which it must refuse:
    its stderr, once it exited 1 with one fatal line and left no socket file
    (review rev181: control_start's failures did fatalx(), leaving the
    control socket it had made)."""
    worker = tmp_path / "w.sock"
    conf = tmp_path / "refused.conf"
    conf.write_text(f"[wcached]\nsocket = {worker}\ncontrol = {control}\n")
    r = subprocess.run([binary("wcached"), "-c", str(conf)], capture_output=True, text=True,
                       timeout=30, env=env)
    assert r.returncode == 1, r.stderr
    assert len([ln for ln in r.stderr.splitlines() if "fatal:" in ln]) == 1, r.stderr
    assert not os.path.lexists(worker) and not os.path.lexists(control), r.stderr
    return r.stderr


def test_a_control_socket_that_cannot_be_bound_is_named_in_one_line(tmp_path):
    control = tmp_path / "missing" / "c.sock"
    err = start_refused(tmp_path, control)
    assert f"wcached: fatal: control socket {control}: No such file or directory" in err, err


# Makes getsockopt(SO_ACCEPTCONN) fail: control_start() then fails on the
# control socket wcached has just made.
NO_ACCEPTCONN = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sys/socket.h>
int getsockopt(int fd, int level, int name, void *value, socklen_t *len)
{
	int (*real)(int, int, int, void *, socklen_t *) =
		(int (*)(int, int, int, void *, socklen_t *))dlsym(RTLD_NEXT, "getsockopt");
	if (level == SOL_SOCKET && name == SO_ACCEPTCONN) {
		errno = ENOBUFS;
		return -1;
	}
	return real(fd, level, name, value, len);
}
"""


def test_a_failed_control_start_removes_the_control_socket_it_made(tmp_path):
    """Before, the start ended with fatalx() and the control socket file stayed:
    wcachectl then met a dead socket."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler for the getsockopt shim")
    (tmp_path / "shim.c").write_text(NO_ACCEPTCONN)
    shim = str(tmp_path / "shim.so")
    subprocess.run([cc, "-shared", "-fPIC", "-o", shim, str(tmp_path / "shim.c"), "-ldl"],
                   check=True)
    env = dict(os.environ, LD_PRELOAD=shim)
    # A gcc ASan build's runtime must come first; the shim is harmless there.
    env["ASAN_OPTIONS"] = ":".join(filter(None, [os.environ.get("ASAN_OPTIONS"),
                                                 "verify_asan_link_order=0"]))
    control = tmp_path / "c.sock"
    err = start_refused(tmp_path, control, env=env)
    assert f"wcached: fatal: control socket {control}: No buffer space available" in err, err


def test_socket_from_config_and_environment(daemon, tmp_path):
    ready(daemon, "small")
    # -c CONFIG: the daemon's own config names the socket by absolute path.
    r = subprocess.run([binary("wcachectl"), "-c", daemon.conf, "status"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    # A relative control path is relative to the config's directory, not the cwd.
    other = tmp_path / "etc"
    other.mkdir()
    (other / "w.conf").write_text("# comment\n[wcached]\nsocket = x.sock ; inline\n"
                                  f"control = ../{os.path.basename(daemon.control)}  ; here\n"
                                  "[model a]\ncontrol = nope\n")
    r = subprocess.run([binary("wcachectl"), "--config", str(other / "w.conf"), "--json",
                        "status"], capture_output=True, text=True, cwd="/")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ok"] is True
    r = subprocess.run([binary("wcachectl"), "-c", str(tmp_path / "missing.conf"), "status"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "missing.conf" in r.stderr
    # `control =` edited and not yet applied (systemctl reload runs
    # `wcachectl -c /etc/wcached.conf reload`): the message says why
    # (review rev126 #2; it said only that wcached was not running).
    moved = tmp_path / "moved.conf"
    moved.write_text(f"[wcached]\ncontrol = {tmp_path}/moved.sock\n")
    r = subprocess.run([binary("wcachectl"), "-c", str(moved), "reload"], capture_output=True,
                       text=True)
    assert r.returncode == 1 and f"the `control` of {moved} (if you changed `control` since " \
        "wcached started, it applies at the next restart" in r.stderr, r.stderr
    # Any other command: nothing was changed that a restart would apply
    # (review rev223 L4: a fresh user's `-c CONFIG status` read that it had).
    r = subprocess.run([binary("wcachectl"), "-c", str(moved), "status"], capture_output=True,
                       text=True)
    assert r.returncode == 1 and r.stderr == (
        f"wcachectl: wcached is not running: no control socket at {tmp_path}/moved.sock (No "
        f"such file or directory), the `control` of {moved}\n"), r.stderr
    env = dict(os.environ, WCACHE_CONTROL=daemon.control)
    r = subprocess.run([binary("wcachectl"), "status"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr


def test_a_control_path_that_is_no_socket_is_named_so(tmp_path):
    """--control, $WCACHE_CONTROL or -c's `control` naming a regular file
    or a directory says it is not a socket, and what names the control
    socket (review rev223 L3: "wcached is not running ... (Connection
    refused)", where `--control /etc/wcached.conf` meant -c)."""
    conf = tmp_path / "w.conf"
    conf.write_text(f"[wcached]\ncontrol = {conf}\n")
    cases = ((["--control", str(conf)], None, f"{conf} is not a socket (a regular file): "
              "--control names wcached's control socket; -c takes a configuration file"),
             (["--control", str(tmp_path)], None, f"{tmp_path} is not a socket (a directory)"),
             ([], str(conf), f"{conf} is not a socket (a regular file): $WCACHE_CONTROL names "
              "wcached's control socket"),
             (["-c", str(conf)], None, f"{conf}, the `control` of {conf}, is not a socket "
              "(a regular file)"))
    for args, env, text in cases:
        environ = dict(os.environ)
        environ.pop("WCACHE_CONTROL", None)
        if env is not None:
            environ["WCACHE_CONTROL"] = env
        r = subprocess.run([binary("wcachectl"), *args, "status"], capture_output=True,
                           text=True, env=environ)
        assert r.returncode == 1, (args, r.stderr)
        assert text in r.stderr and "not running" not in r.stderr, (args, r.stderr)
        assert len(r.stderr.splitlines()) == 1, (args, r.stderr)


def test_config_reader_under_valgrind(tmp_path):
    """wcachectl -c with an absolute CONFIG path and a relative control key
    reads no uninitialised memory (it once measured an unset cwd buffer) and
    finds the socket where wcached puts it: in the config's directory."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        pytest.skip("valgrind is not installed (make deps installs it)")
    with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
        if "WCACHE_SANITIZE:BOOL=ON" in f.read():
            pytest.skip("a sanitizer build: valgrind cannot run ASan binaries")
    etc = tmp_path / "etc"
    etc.mkdir()
    conf = etc / "w.conf"
    conf.write_text("[wcached]\ncontrol = ./run/ctl.sock ; relative\n")
    r = subprocess.run([valgrind, "-q", "--error-exitcode=99", "--leak-check=full",
                        "--errors-for-leak-kinds=definite", binary("wcachectl"), "-c", str(conf),
                        "status"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert f"no control socket at {etc}/run/ctl.sock " in r.stderr, r.stderr


def test_config_syntax_errors_as_wcached_says(tmp_path):
    """wcachectl reads -c CONFIG with wcached's reader: a line wcached cannot
    parse is an error for both, with the same FILE:LINE: reason."""
    for text, reason in (("[wcached]\n[model a\n", "2: section header without closing ']'"),
                         ("[wcached]\ncontrol\n", '2: expected "key = value"'),
                         ("[wcached] control = x\n", "1: unexpected text after section header"),
                         ("[wcached]\n\vcontrol =\n", "2: empty control path")):
        conf = tmp_path / "w.conf"
        conf.write_text(text)
        r = subprocess.run([binary("wcachectl"), "-c", str(conf), "status"],
                           capture_output=True, text=True)
        assert r.returncode == 1 and f"{conf}:{reason}" in r.stderr, (text, r.stderr)
        if "empty control" not in reason:
            d = subprocess.run([binary("wcached"), "--check", "-c", str(conf)],
                               capture_output=True, text=True)
            assert d.returncode != 0 and f"{conf}:{reason}" in d.stderr, (text, d.stderr)


# ---- load, unload, reload ---------------------------------------------------

def test_load_new_model(daemon, tmp_path):
    other = mkmodel(tmp_path / "other.safetensors", seed=5, **SMALL)
    r = ctl(daemon, "load", "other", other)
    assert r.returncode == 0, r.stderr
    assert "generation 1" in r.stdout
    ready(daemon, "other")
    serving(daemon, "other")
    serving(daemon, "small")


def test_failed_loads_of_new_names_give_their_status_slots_back(daemon, tmp_path):
    """Each model name takes a slot of the status page (8191) for the
    daemon's life, so that its generation numbers keep growing across an
    unload; a name that never served (its load failed) gives it back.
    Before, 8,200 failed loads of new names used the page up and the next
    new model got slot 0: its numbers began again at 1 after an unload and
    workers' wc_model_stale() never saw it swapped."""
    c = Control(daemon)
    try:
        for i in range(8200):
            r = c.request(f"load n{i} /nonexistent/n{i}.safetensors".encode())
            assert r["ok"] is False, r
    finally:
        c.close()
    late = mkmodel(tmp_path / "late.safetensors", seed=9, **SMALL)
    for generation in (1, 2):
        r = ctl(daemon, "load", "late", late)
        assert r.returncode == 0 and f"generation {generation}" in r.stdout, r.stdout + r.stderr
        ready(daemon, "late", generation)
    assert ctl(daemon, "unload", "late").returncode == 0
    r = ctl(daemon, "load", "late", late)
    assert r.returncode == 0 and "generation 3" in r.stdout, r.stdout + r.stderr


def fill_status_page(d, path):
    """Takes every free slot of d's status page with a name that serves
    (loaded from path, then unloaded: it keeps its slot for the daemon's
    life), pipelined in rounds; returns how many names it took."""
    c = Control(d, timeout=120)
    taken = 0
    try:
        while True:
            names = [f"fill{taken + i}" for i in range(256)]
            c.send(b"".join(f"load {n} {path}\nunload {n}\n".encode() for n in names))
            full = False
            for _ in names:
                loaded, unloaded = c.reply(), c.reply()
                if loaded["ok"]:
                    assert unloaded["ok"], unloaded
                    taken += 1
                else:
                    assert "the status page has no slot left" in loaded["error"], loaded
                    full = True
            if full:
                return taken
    finally:
        c.close()


def test_a_model_refused_for_a_full_status_page_is_loaded_by_the_next_reload(daemon,
                                                                             tmp_path, model):
    """A model added to the configuration while every status page slot
    belongs to a name that served fails to load ('the status page has no
    slot left'). Before, the next reload took it for a model unloaded at
    run time ('unloaded at run time and its section did not change: the
    reload leaves it unloaded') and never loaded it again, even once a
    restart had freed slots; now that reload says why it was not served,
    loads it again, and fails again while the page is full."""
    taken = fill_status_page(daemon, model)
    assert taken == 8191 - 1     # "small" has the first slot
    late = mkmodel(tmp_path / "late.safetensors", seed=9, **SMALL)
    daemon.write_config({"small": model, "late": late})
    r = ctl(daemon, "reload")
    assert r.returncode == 1 and "some models failed to load" in r.stderr, r.stdout + r.stderr
    assert 'model "late": the status page has no slot left' in daemon.read_log()
    r = ctl(daemon, "reload")
    assert r.returncode == 1, r.stdout + r.stderr
    log = daemon.read_log()
    assert ('model "late": not served: its load was refused: the status page had no slot '
            'left for a new name; the reload loads it again') in log, log
    assert 'model "late": unloaded at run time' not in log, log
    assert log.count('model "late": the status page has no slot left') == 2, log


def test_load_relative_path_and_pin(daemon, tmp_path):
    mkmodel(tmp_path / "rel.safetensors", seed=6, **SMALL)
    r = subprocess.run([binary("wcachectl"), "--control", daemon.control, "--json", "load",
                        "rel", "rel.safetensors", "pin=none"], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    reply = json.loads(r.stdout)
    assert reply["ok"] and reply["model"] == "rel" and reply["generation"] == 1
    m = ready(daemon, "rel")
    assert m["path"] == str(tmp_path / "rel.safetensors") and m["pinned"] == "none"


def test_load_over_existing_name_swaps(daemon, tmp_path):
    ready(daemon, "small")
    w = subprocess.Popen([binary("demo_worker"), "--socket", daemon.socket, "--hold", "small"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert json.loads(w.stdout.readline())["generation"] == 1
        new = mkmodel(tmp_path / "v2.safetensors", seed=9, **SMALL)
        r = ctl(daemon, "--json", "load", "small", new)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["generation"] == 2
        m = ready(daemon, "small", generation=2)
        assert m["path"] == new and m["swaps"] == 1
        # Generation 1 stays open for the worker that holds it.
        assert {g["number"]: g["attached"] for g in m["generations"]} == {1: 1, 2: 0}
        out = json.loads(daemon.attach("small", "--json").stdout)
        assert out["generation"] == 2
        r = ctl(daemon, "status")
        assert "generation 1" in r.stdout and "old" in r.stdout
    finally:
        w.communicate("\n", timeout=30)
    wait_until(lambda: [g["number"] for g in model_entry(daemon, "small")["generations"]] == [2],
               what="generation 1 closed")


def test_load_invalid_file_keeps_serving(daemon, tmp_path, model):
    ready(daemon, "small")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(open(model, "rb").read()[:-10])
    r = ctl(daemon, "load", "small", str(bad))
    assert r.returncode == 1
    assert r.stderr.startswith("wcachectl: load: ") and "bad.safetensors" in r.stderr
    m = model_entry(daemon, "small")
    assert m["generation"] == 1 and m["state"] == "ready" and "bad.safetensors" in m["error"]
    assert m["load_errors"] == 1
    r = ctl(daemon, "status")
    assert "errors:" in r.stdout and "bad.safetensors" in r.stdout
    serving(daemon)
    r = ctl(daemon, "load", "fresh", str(tmp_path / "missing.safetensors"))
    assert r.returncode == 1 and "missing.safetensors" in r.stderr
    # The failed load of another path re-armed no watch of small's: its
    # own file is unchanged, and no reload of it cleared the error (the
    # re-arm compared it with bad.safetensors: h260's M2 patch).
    assert "changed after its last load failed" not in daemon.read_log(), daemon.read_log()
    assert "bad.safetensors" in model_entry(daemon, "small")["error"]


def test_failed_load_of_new_name_leaves_nothing(daemon, tmp_path, model):
    ready(daemon, "small")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(open(model, "rb").read()[:-10])
    for path in (str(bad), str(tmp_path / "missing.safetensors")):
        r = ctl(daemon, "load", "ghost", path)
        assert r.returncode == 1 and "not added" in r.stderr, r.stderr
        assert model_entry(daemon, "ghost") is None, status(daemon)
        text = ctl(daemon, "metrics").stdout
        assert 'model="ghost"' not in text and 'model="small"' in text
        assert ctl(daemon, "status", "ghost").returncode == 4
    # A name that serves keeps serving, and keeps its error for status.
    r = ctl(daemon, "load", "small", str(bad))
    assert r.returncode == 1 and "not added" not in r.stderr
    assert model_entry(daemon, "small")["state"] == "ready"


def test_load_says_it_lasts_until_restart(daemon, tmp_path):
    other = mkmodel(tmp_path / "other.safetensors", seed=5, **SMALL)
    r = ctl(daemon, "load", "other", other)
    assert r.returncode == 0 and "until wcached restarts" in r.stdout, r.stdout
    r = ctl(daemon, "--json", "load", "other", other)
    reply = json.loads(r.stdout)
    assert reply["persistent"] is False and "configuration file" in reply["message"]
    r = ctl(daemon, "load", "--help")
    assert "until wcached restarts" in r.stdout


# ---- status as a health check ---------------------------------------------

def test_status_names_and_exit_codes(daemon):
    ready(daemon, "small")
    assert ctl(daemon, "status").returncode == 0
    r = ctl(daemon, "status", "small")
    assert r.returncode == 0 and "small" in r.stdout
    r = ctl(daemon, "status", "small", "nope")
    assert r.returncode == 4 and 'no model "nope"' in r.stderr
    r = ctl(daemon, "--json", "status", "nope")
    assert r.returncode == 4
    reply = json.loads(r.stdout)  # exactly one object
    assert reply["ok"] is True and reply["ready"] is False and reply["unknown"] == ["nope"]
    reply = json.loads(ctl(daemon, "--json", "status", "small").stdout)
    assert reply["ready"] is True and reply["not_ready"] == [] and reply["unknown"] == []


def fake_model(name, state, pinned="metadata", applied="metadata", bytes_=1000, resident=1000):
    return {"name": name, "path": f"/m/{name}", "generation": 1, "state": state,
            "bytes": bytes_, "resident_bytes": resident, "pinned": pinned,
            "pin_applied": applied, "attached": 0, "generations": []}


def test_status_table_pins_warming_and_exit_codes(tmp_path):
    path = str(tmp_path / "control.sock")
    fake = FakeControl(path, {
        "ok": True, "protocol": 1, "version": "0.1.0", "pid": 1, "uptime_seconds": 5,
        "clients": 0, "unloaded": [],
        "models": [fake_model("a", "ready"),
                   fake_model("b", "warming", pinned="all", applied="metadata",
                              resident=450),
                   {**fake_model("c", "failed", applied="none", bytes_=0, resident=0),
                    "generation": 0, "error": "c.safetensors: truncated"}]})
    try:
        def run(*args):
            return subprocess.run([binary("wcachectl"), "--control", path, *args],
                                  capture_output=True, text=True, timeout=60)
        r = run("status")
        assert r.returncode == 3, r.stderr
        rows = {line.split()[0]: line for line in r.stdout.splitlines()[3:6]}
        assert "warming 45%" in rows["b"], r.stdout
        # PINNED shows what is locked, and a note says why it is less.
        assert rows["b"].split()[-2] == "metadata", r.stdout
        assert "pin = all asked, metadata locked" in r.stdout and "RLIMIT_MEMLOCK" in r.stdout
        assert "c.safetensors: truncated" in r.stdout
        assert run("status", "a").returncode == 0
        r = run("status", "a", "c")
        assert r.returncode == 3 and "b" not in [l.split()[0] for l in r.stdout.splitlines()
                                                 if l.strip()]
        reply = json.loads(run("--json", "status", "a", "c").stdout)
        assert reply["ready"] is False and reply["not_ready"] == ["c"]
        assert run("status", "a", "zz").returncode == 4  # unknown wins over not ready
    finally:
        fake.close()
    # A daemon that reports its own warm progress and estimate: those are shown.
    path = str(tmp_path / "control2.sock")
    fake = FakeControl(path, {
        "ok": True, "protocol": 1, "version": "0.1.0", "pid": 1, "uptime_seconds": 5,
        "clients": 0, "unloaded": [],
        "models": [{**fake_model("w", "warming", resident=100), "warm_percent": 62.4,
                    "warm_eta_seconds": 7.2}]})
    try:
        r = subprocess.run([binary("wcachectl"), "--control", path, "status"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 3 and "warming 62%, ~7 s left" in r.stdout, r.stdout
    finally:
        fake.close()


def test_json_is_one_object_whatever_happens(tmp_path, daemon):
    missing = str(tmp_path / "none.sock")
    for args in (["--control", missing, "--json", "status"],
                 ["--control", missing, "status", "--json"],
                 ["--control", daemon.control, "--json", "unload", "nope"],
                 ["--control", missing, "--json", "load", "x"],
                 # Usage errors found before the command is known (before,
                 # nothing on stdout), and --json before a file command.
                 ["--json", "bogus"], ["--json"], ["--json", "--bogus", "status"],
                 ["--bogus", "--json", "status"], ["--json", "-c"],
                 ["--json", "attach", "small"], ["--json", "load", "x", ""],
                 # --json after the command, an error before it (review rev126).
                 ["--frob", "status", "--json"], ["-c", "x", "--control", "y", "status",
                                                  "--json"]):
        r = subprocess.run([binary("wcachectl"), *args], capture_output=True, text=True)
        assert r.returncode in (1, 2), (args, r.returncode)
        reply = json.loads(r.stdout)
        assert reply["ok"] is False and reply["error"] and reply["protocol"] == 1, reply
        assert r.stdout.count("\n") == 1


def test_file_commands_json_is_one_object_whatever_happens(tmp_path, daemon, model):
    """attach --json and inspect --json print the error object on stdout when
    they fail, as their help and README say (review rev223 L7: stdout was
    empty); a --json before a file command says where its --json goes, and
    that convert has none (L12: it advised `convert ... --json`)."""
    missing = str(tmp_path / "none.safetensors")
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = ((["attach", "nosuch", "--json", "--socket", daemon.socket], 1, '"nosuch"'),
             (["attach", "small", "--json", "--socket", missing], 1, "not running"),
             (["inspect", "--json", missing], 1, "No such file"),
             (["inspect", missing, "--json"], 1, "No such file"),
             (["inspect", "--json", str(empty)], 1, str(empty)),
             (["attach", "--json"], 2, "missing NAME"),
             (["attach", "--json", "--bogus"], 2, '"--bogus"'),
             (["inspect", "--json", "a", "b"], 2, 'unexpected argument "b"'),
             (["--json", "inspect", "x"], 2, "wcachectl inspect --json PATH"),
             (["--json", "attach", "x"], 2, "wcachectl attach NAME --json"),
             (["--json", "convert", "a", "b"], 2, "convert has no --json output"))
    for args, code, text in cases:
        r = subprocess.run([binary("wcachectl"), *args], capture_output=True, text=True)
        assert r.returncode == code, (args, r.returncode, r.stderr)
        reply = json.loads(r.stdout)
        assert reply["ok"] is False and reply["protocol"] == 1, (args, reply)
        assert text in reply["error"] and text in r.stderr, (args, reply, r.stderr)
        assert r.stdout.count("\n") == 1 and len(r.stderr.splitlines()) == 1, (args, r)
    # Without --json, stdout stays empty; the successful objects say "ok" too, as
    # every control reply does (rev226 L2: a probe reading .ok got null from them).
    r = subprocess.run([binary("wcachectl"), "inspect", missing], capture_output=True, text=True)
    assert r.returncode == 1 and r.stdout == "", r
    reply = json.loads(daemon.attach("small", "--json").stdout)
    assert reply["model"] == "small" and reply["ok"] is True and reply["protocol"] == 1, reply
    r = subprocess.run([binary("wcachectl"), "inspect", "--json", str(model)],
                       capture_output=True, text=True)
    reply = json.loads(r.stdout)
    assert r.returncode == 0 and reply["ok"] is True and reply["protocol"] == 1, r
    assert reply["format"] == "safetensors" and reply["tensors"], reply


def test_every_reply_has_the_protocol_version(daemon):
    c = Control(daemon)
    try:
        for line in (b"status", b"help", b"metrics", b"bogus", b"unload nope"):
            assert c.request(line)["protocol"] == 1, line
    finally:
        c.close()


def test_client_socket_as_control_gives_a_hint(daemon, tmp_path):
    """The hint names the control socket beside the client socket, the one
    that daemon uses, where there is one; else the config's `control` key
    and the compiled-in default."""
    r = subprocess.run([binary("wcachectl"), "--control", daemon.socket, "status"],
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert "client socket, not its control socket" in r.stderr, r.stderr
    assert f"--control {daemon.control} (the control socket beside it)" in r.stderr, r.stderr
    assert len(r.stderr.splitlines()) == 1
    # The client socket linked elsewhere, with no control socket beside it.
    alone = tmp_path / "alone"
    alone.mkdir()
    os.symlink(daemon.socket, alone / "client.sock")
    r = subprocess.run([binary("wcachectl"), "--control", str(alone / "client.sock"), "status"],
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert "client socket, not its control socket" in r.stderr, r.stderr
    assert "`control` path of wcached's config (default /run/wcached/control.sock)" in r.stderr
    assert len(r.stderr.splitlines()) == 1


def test_control_socket_or_a_file_as_client_socket_gives_a_hint(daemon, tmp_path):
    """The reverse mistake of the test above: a client (attach, a worker
    through libwcache) given the control socket, or a regular file, is told
    so and where workers connect (review rev223 L2: "Protocol wrong type
    for socket"; L3: "wcached is not running ... (Connection refused)")."""
    conf = tmp_path / "w.conf"
    conf.write_text("[wcached]\n")
    where = "workers connect to the `socket` of wcached's config (default " \
        "/run/wcached/wcached.sock)"
    for path, text in ((daemon.control, f"{daemon.control} is not wcached's client socket (a "
                        "stream socket: wcached's control socket?); " + where),
                       (str(conf), f"{conf} is not a socket (a regular file): " + where)):
        r = subprocess.run([binary("wcachectl"), "attach", "small", "--socket", path],
                           capture_output=True, text=True)
        assert r.returncode == 1 and r.stderr == f"wcachectl: {text}\n", r.stderr
    assert serving(daemon).returncode == 0


def test_usage_errors_name_the_problem_in_one_line(tmp_path):
    cases = ((["load", "x"], "missing PATH"), (["load"], "missing NAME PATH"),
             (["unload"], "missing NAME"), (["pin", "a", "b"], 'unexpected argument "b"'),
             (["status", "--what"], 'unknown option "--what"'), ([], "missing COMMAND"),
             (["inspect"], "missing PATH"), (["inspect", "a", "b"], 'unexpected argument "b"'),
             (["convert", "a"], "missing OUT"), (["convert"], "missing IN OUT"),
             (["convert", "a", "b", "c"], 'unexpected argument "c"'),
             (["attach"], "missing NAME"), (["bogus"], 'unknown command "bogus"'),
             # --json was ignored with --http (review rev223 L9).
             (["metrics", "--http", "--timeout", "1", "--json"], "--json does not go with --http"))
    for args, text in cases:
        r = subprocess.run([binary("wcachectl"), *args], capture_output=True, text=True,
                           cwd=tmp_path)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert r.stdout == "" or "--json" in args, args
        assert len(r.stderr.splitlines()) == 1 and text in r.stderr, (args, r.stderr)
        assert "--help" in r.stderr, (args, r.stderr)


def test_load_argument_errors(daemon, tmp_path):
    """A bad NAME, pin= option or drop KEY is a usage error (exit 2) that
    names the word, said before connecting, so the same with no daemon
    (review rev223 L1: exit 1 from the daemon, and with none "wcached is
    not running")."""
    none = str(tmp_path / "none.sock")
    for args, text in ((["load", "--", "-bad", "/x"], 'invalid model name "-bad"'),
                       (["load", "a/b", "/x"], 'invalid model name "a/b"'),
                       (["load", "ok", "/x", "pin=some"], 'bad option "pin=some": use pin=none'),
                       (["load", "ok", "/x", "warm=no"], 'bad option "warm=no"'),
                       (["load", "ok", "/x", "z"], 'bad option "z"'),
                       (["drop", "small", "bad key!"], 'invalid key "bad key!"')):
        for control in (daemon.control, none):
            r = subprocess.run([binary("wcachectl"), "--control", control, *args],
                               capture_output=True, text=True)
            assert r.returncode == 2, (args, control, r.stderr)
            assert r.stderr.startswith(f"wcachectl {args[0]}: {text}"), (args, r.stderr)
            assert "--help" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    # The words the rules allow still reach the daemon.
    r = ctl(daemon, "load", "ok", "/nonexistent", "pin=all")
    assert r.returncode == 1 and "nonexistent" in r.stderr, r.stderr
    r = ctl(daemon, "drop", "small", "good.key+1")
    assert r.returncode == 1 and "good.key+1" in r.stderr, r.stderr
    # An empty PATH (an unset variable: load small "$NEWPATH") is a usage
    # error; before, it loaded the current directory over the model.
    r = ctl(daemon, "load", "small", "")
    assert r.returncode == 2 and "load: PATH is empty" in r.stderr, r.stderr
    assert status(daemon)["models"][0]["generation"] == 1


def test_unload_while_attached(daemon, tmp_path, model):
    ready(daemon, "small")
    original = open(model, "rb").read()
    w = subprocess.Popen([binary("demo_worker"), "--socket", daemon.socket, "--verify", model,
                          "--hold", "small"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    try:
        first = json.loads(w.stdout.readline())
        assert first["verified"] == first["bytes"] > 0
        r = ctl(daemon, "unload", "small")
        assert r.returncode == 0, r.stderr
        assert "unloaded" in r.stdout
        s = status(daemon)
        assert [m["name"] for m in s["models"]] == []
        assert [(u["name"], u["generation"], u["attached"]) for u in s["unloaded"]] == \
            [("small", 1, 1)]
        assert daemon.attach("small").returncode == 1
        # Replace the file too: the worker's mapping still reads the old bytes.
        replacement = tmp_path / "next.safetensors"
        mkmodel(replacement, seed=77, **SMALL)
        os.rename(replacement, model)
        assert mapped_bytes(w.pid, model, 0, len(original)) == original
        r = ctl(daemon, "status")
        assert "unloaded: closes when released" in r.stdout
        assert ctl(daemon, "unload", "small").returncode == 1
    finally:
        w.communicate("\n", timeout=30)
    assert w.returncode == 0
    wait_until(lambda: status(daemon)["unloaded"] == [], what="generation closed on release")
    wait_until(lambda: "generation 1 closed" in daemon.read_log(), what="close logged")


def test_reload_model_and_config(daemon, tmp_path, model):
    ready(daemon, "small")
    r = ctl(daemon, "reload", "small")
    assert r.returncode == 0, r.stderr
    assert "unchanged" in r.stdout
    fresh = tmp_path / ".fresh.safetensors"
    mkmodel(fresh, seed=3, **SMALL)
    os.rename(fresh, model)
    r = ctl(daemon, "--json", "reload", "small")
    assert r.returncode == 0, r.stderr
    wait_until(lambda: model_gen(daemon, "small") >= 2, what="reload to generation 2")
    assert ctl(daemon, "reload", "nope").returncode == 1
    # Without a name: the configuration is re-read, and the reply waits for it.
    other = mkmodel(tmp_path / "other.safetensors", seed=4, **SMALL)
    daemon.write_config({"small": model, "other": other})
    r = ctl(daemon, "reload")
    assert r.returncode == 0, r.stderr
    assert model_entry(daemon, "other") is not None
    serving(daemon, "other")
    # A broken configuration is refused with its file and line; nothing changes.
    with open(daemon.conf, "a") as f:
        f.write("bogus line\n")
    r = ctl(daemon, "reload")
    assert r.returncode == 1
    assert daemon.conf in r.stderr
    serving(daemon, "other")


def test_a_config_reload_serves_an_unloaded_model_whose_section_changed(tmp_path, model):
    """A configured model unloaded at run time (`wcachectl unload`) stays
    unloaded until a restart or a reload that changes its section
    (`wcachectl unload --help`): whatever key changed, the reload serves it
    as configured, as a start would, with one line saying so; an unloaded
    model whose section did not change stays unloaded, with one line too.
    Before, only a change of path, warm or stage brought it back: with pin
    or allow_users changed it stayed unloaded, the log said `error: model
    "a" is not loaded` without context, and the reload answered ok (review
    rev112 #2)."""
    models = {name: mkmodel(tmp_path / f"{name}.safetensors", seed=seed, **SMALL)
              for seed, name in enumerate("abcd", 11)}
    d = Daemon(tmp_path, models)
    wait_for_control(d.start())
    try:
        for name in models:
            ready(d, name)
            r = ctl(d, "unload", name)
            assert r.returncode == 0, r.stderr
        assert status(d)["models"] == []
        d.write_config({"a": (models["a"], {"pin": "all", "allow_users": "0"}),
                        "b": (models["b"], {"warm": "no"}),
                        "c": (models["c"], {"derive": "yes"}),
                        "d": models["d"]})
        r = ctl(d, "reload")
        assert r.returncode == 0, (r.stdout, r.stderr)
        # Generation numbers go on growing across an unload (PROTOCOL.md).
        a = ready(d, "a", generation=2)
        assert a["pinned"] == "all", a
        b = wait_until(lambda: model_entry(d, "b"), what="b served")
        assert b["generation"] == 2 and b["state"] in ("ready", "cold"), b
        ready(d, "c", generation=2)
        assert model_entry(d, "d") is None  # its section did not change
        log = d.read_log()
        assert ('model "a": unloaded at run time; its section changed (pin, '
                'allow_users/allow_groups): the reload serves it again as configured') in log
        assert 'model "b": unloaded at run time; its section changed (warm)' in log
        assert ('model "c": unloaded at run time; its section changed '
                '(derive/derive_groups/derive_timeout)') in log
        assert ('model "d": unloaded at run time and its section did not change: the '
                'reload leaves it unloaded') in log
        assert "error:" not in log and "is not loaded" not in log, log
    finally:
        assert d.stop() == 0, d.read_log()


def end_after_a_hang(fs, d, clients):
    """A test's end, passed or failed: the server answers again, the
    clients still waiting are killed, and wcached stops cleanly."""
    fs.thaw()
    for p in clients:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert d.stop() == 0, d.read_log()


def test_config_reloads_asked_while_one_waits_share_its_read(tmp_path, model):
    """While the configuration's read hangs (its file on a network
    filesystem whose server stopped answering; a directory service that
    NSS waits on does the same), reloads asked meanwhile, by clients that
    wait or by a script's `timeout 1 wcachectl reload` whose clients are
    gone, join the one read waiting its turn: once the server answers, two
    reads are applied, the one that hung and one more, and each waiting
    client is answered. Before, each reload's read and apply ran in turn
    (10 departed reloads: 10 applies), however many had piled up."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with config_on_a_hung_server(tmp_path, lambda d: Daemon(d, {"small": model})) as (d, fs):
        waiting = []
        try:
            wait_for_control(d)
            argv = [binary("wcachectl"), "--control", d.control, "reload"]
            waiting.append(subprocess.Popen(argv, stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT, text=True))
            d.wait_for_log(r"control: uid \d+: reload$")
            for _ in range(3):
                r = subprocess.run(["timeout", "1", *argv], capture_output=True, text=True,
                                   timeout=60)
                assert r.returncode == 124, r.stdout + r.stderr  # still waiting
            waiting.append(subprocess.Popen(argv, stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT, text=True))
            asked = re.compile(r"control: uid \d+: reload$", re.M)
            wait_until(lambda: len(asked.findall(d.read_log())) == 5,
                       what="the fifth reload to be asked")
            assert d.read_log().count("reloading ") == 0
            fs.thaw()
            for p in waiting:
                out, _ = p.communicate(timeout=60)
                assert p.returncode == 0, out
                assert "configuration reloaded" in out
            log = d.read_log()
            assert log.count("reloading ") == 2, log
            assert log.count("joins the read waiting for its turn") == 3
            assert log.count("left before the reply to its reload") == 3
            assert status(d)["models"][0]["state"] == "ready"
        finally:
            end_after_a_hang(fs, d, waiting)


def threads_waiting_on_fuse(pid):
    """How many threads of pid wait for a FUSE server's answer now (their
    wchan is one of FUSE_WAIT)."""
    n = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                n += f.read().strip() in FUSE_WAIT
        except OSError:
            pass
    return n


@contextlib.contextmanager
def loads_on_a_hung_server(tmp_path, model, n):
    """wcached serving x from a RemoteFS mount whose server then hangs, and
    n `wcachectl load x` asked of it in turn: two run, hung (the
    filesystem's share of the work queue), the next ones wait their turn.
    Each of the first two is seen running (a thread of wcached waiting for
    the server) before the next is asked: a job of the same share that
    runs at that moment (the residency check of x, every 5 s) keeps a load
    waiting its turn until it ends, and the next load would supersede it
    (once under load 6-8 the second load was answered "superseded").
    Yields (d, loads, fs); ends with end_after_a_hang, passed or failed."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    data = open(model, "rb").read()
    with RemoteFS(tmp_path / "backing", tmp_path / "mnt", attr_timeout=0.1) as fs:
        fs.replace("x.safetensors", data)
        fs.wait_visible("x.safetensors")
        path = fs.path("x.safetensors")
        (tmp_path / "d").mkdir()
        d = Daemon(tmp_path / "d", {"x": (path, {"watch": "inotify", "stage": "no"})})
        d.start()
        loads = []
        try:
            wait_for_control(d)
            ready(d, "x")
            fs.freeze()
            asked = re.compile(r'control: uid \d+: load "x"', re.M)
            for k in range(n):
                loads.append(subprocess.Popen(
                    [binary("wcachectl"), "--control", d.control, "load", "x", path],
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
                wait_until(lambda: len(asked.findall(d.read_log())) == k + 1,
                           what=f"load {k + 1} to be asked")
                if k < 2:
                    wait_until(lambda: threads_waiting_on_fuse(d.proc.pid) == k + 1,
                               what=f"load {k + 1} to run, hung on the server")
            yield d, loads, fs
        finally:
            end_after_a_hang(fs, d, loads)


def test_a_load_superseded_before_it_starts_is_answered_at_once(tmp_path, model):
    """On a remote filesystem whose server hangs, two loads of a model run
    (the filesystem's share of the work queue) and the next ones wait their
    turn. A load that waits and that a newer load of the same model
    supersedes is taken back and answered at once ("superseded"), while the
    server still hangs; before, it stayed queued, then opened and validated
    the files once the server answered, only to be discarded: a loop of
    `timeout 1 wcachectl load` (each client gone, its place given back)
    left one such load each, run in turn (10 departed loads: 10 loads)."""
    with loads_on_a_hung_server(tmp_path, model, 4) as (d, loads, fs):
        # The third waited its turn (two run, hung); the fourth took
        # its place: the third is answered while the server hangs.
        wait_until(lambda: loads[2].poll() is not None,
                   what="the waiting load superseded by a newer one to be answered")
        out = loads[2].communicate()[0]
        assert loads[2].returncode == 1, out
        assert "superseded by a newer load" in out
        assert all(p.poll() is None for p in (loads[0], loads[1], loads[3]))
        fs.thaw()
        outs = [p.communicate(timeout=60)[0] for p in (loads[0], loads[1], loads[3])]
        assert loads[3].returncode == 0, outs[2]
        assert all("superseded" in o for o in outs[:2]), outs
        assert status(d)["models"][0]["state"] == "ready"


def test_a_load_unloaded_before_it_starts_is_answered_at_once(tmp_path, model):
    """As above, but the model is unloaded while a load waits its turn on
    the hung server (an unload, or a configuration reload that drops the
    model): the waiting load is taken back and answered at once, saying
    why; before, it waited for the server, opened and validated the files,
    and was answered "superseded" only then."""
    with loads_on_a_hung_server(tmp_path, model, 3) as (d, loads, _):
        # Two run, hung; the third waits its turn.
        unload = ctl(d, "unload", "x")
        assert unload.returncode == 0, unload.stdout + unload.stderr
        wait_until(lambda: loads[2].poll() is not None,
                   what="the waiting load of the unloaded model to be answered")
        out = loads[2].communicate()[0]
        assert loads[2].returncode == 1, out
        assert 'load: model "x": unloaded before its load began' in out, out
        assert loads[0].poll() is None and loads[1].poll() is None


def state(d, name):
    m = model_entry(d, name)
    return m["state"] if m else None


def test_a_config_reload_loads_failed_models_again(tmp_path, model):
    """A reload of the configuration (SIGHUP, `wcachectl reload`, `systemctl
    reload wcached`) loads again each configured model that is failed,
    though its configuration did not change: here "small" failed to stage,
    its stage_dir being a file, not a directory.
    A retry that fails again fails the reload (exit 1, "some models
    failed"), one that works serves the model, and a model that serves
    ("other") gets no new generation from any of them. One line per model
    loaded again. Before, a reload left a failed model as it was and
    answered "configuration reloaded" (exit 0): README's advice for a
    failed model, fix the cause and reload, did nothing (only `wcachectl
    reload NAME` retried it)."""
    other = mkmodel(tmp_path / "other.safetensors", seed=2, **SMALL)
    base = tmp_path / "var"
    base.mkdir()
    blocker = base / "staged"
    blocker.write_text("a file where stage_dir should be\n")
    d = Daemon(tmp_path, {"small": (model, {"stage": "yes"}), "other": other},
               extra=f"stage_dir = {blocker}\n")
    if d.user is not None:
        os.chown(base, *d.user)
    wait_for_control(d.start())
    try:
        wait_until(lambda: state(d, "small") == "failed", what="small failed")
        assert "stage_dir" in model_entry(d, "small")["error"]
        ready(d, "other")
        retried = 'model "small": its load failed: .*; the reload loads it again'
        # The cause is still there: the retry fails, and so does the reload.
        r = ctl(d, "reload")
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert "some models failed" in r.stderr
        d.wait_for_log(retried)
        assert state(d, "small") == "failed"
        # Fixed: the reload serves it.
        blocker.unlink()
        r = ctl(d, "reload")
        assert r.returncode == 0, (r.stdout, r.stderr, d.read_log())
        ready(d, "small")
        serving(d, "small")
        # Nothing is failed now: a reload loads nothing again.
        r = ctl(d, "reload")
        assert r.returncode == 0, r.stderr
        log = d.read_log()
        assert log.count("the reload loads it again") == 2, log
        assert model_gen(d, "small") == 1 and model_gen(d, "other") == 1
        assert 'model "other": generation 2' not in log
    finally:
        assert d.stop() == 0, d.read_log()


def tracer(pid):
    """The pid tracing pid (TracerPid in /proc/PID/status), 0 if none."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("TracerPid:"))


def all_traced(pid):
    """Whether every thread pid has is traced; one that ends meanwhile does
    not count (the daemon starts and ends threads of its own)."""
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            if tracer(f"{pid}/task/{t}") == 0:
                return False
        except (FileNotFoundError, ProcessLookupError):
            pass
    return True


@contextlib.contextmanager
def injected(pid, call, error):
    """Every call of the system call `call` by the running process pid (all
    its threads) fails with error while the block runs: a strace attached
    for the while (skips where strace or ptrace is missing), detached at
    the end."""
    strace = shutil.which("strace")
    if strace is None or subprocess.run([strace, "-qq", "-o", "/dev/null", "true"]).returncode:
        pytest.skip(f"needs strace, and ptrace allowed, to make {call} fail")
    proc = subprocess.Popen([strace, "-f", "-qq", "-o", "/dev/null", "-p", str(pid),
                             "-e", f"trace={call}", "-e", f"inject={call}:error={error}"])
    try:
        wait_until(lambda: all_traced(pid), what="strace attached")
        yield
        proc.terminate()
        proc.wait(timeout=30)
        wait_until(lambda: tracer(pid) == 0, what="strace detached")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_config_reload_loads_a_model_whose_warming_failed_again(tmp_path, model):
    """A generation whose warming failed (sendfile(2) fails with EIO,
    injected by strace) serves nothing: a reload of the configuration loads
    the model again. While reads still fail the new generation, current at
    once since the failed one serves nothing, fails too (the reply comes once
    it is loaded, before it warms: status says how its warming ended); once
    they work, the next reload's generation serves. Before, a reload answered "configuration reloaded" and left
    generation 1 current, every attach failing with "generation 1 failed
    while warming" until wcached restarted."""
    strace = shutil.which("strace")
    if strace is None or subprocess.run([strace, "-qq", "-o", "/dev/null", "true"]).returncode:
        pytest.skip("needs strace, and ptrace allowed, to make a read fail")
    # -D: strace runs beside wcached, which is the daemon's process itself;
    # killing strace (-I1: it may be killed) detaches it: reads work again.
    wrapper = tmp_path / "wcached-eio"
    wrapper.write_text(f"#!/bin/sh\nexec {strace} -I1 -D -f -qq -o /dev/null -e trace=sendfile "
                       f"-e inject=sendfile:error=EIO {binary('wcached')} \"$@\"\n")
    wrapper.chmod(0o755)
    d = Daemon(tmp_path, {"small": model})
    d.wcached = str(wrapper)
    wait_for_control(d.start())
    try:
        wait_until(lambda: state(d, "small") == "failed", what="small failed while warming")
        assert "generation 1 failed while warming" in d.attach("small").stderr
        assert ctl(d, "reload").returncode == 0
        d.wait_for_log('model "small": generation 1 failed while warming: Input/output error; '
                       'the reload loads it again')
        d.wait_for_log("warming generation 2 failed: Input/output error")
        # Generation 2 served at once (generation 1 served nothing), and failed.
        wait_until(lambda: state(d, "small") == "failed" and model_gen(d, "small") == 2,
                   what="generation 2 current and failed")
        assert "generation 2 failed while warming" in d.attach("small").stderr
        # Reads work again.
        os.kill(tracer(d.proc.pid), signal.SIGTERM)
        wait_until(lambda: tracer(d.proc.pid) == 0, what="strace detached")
        assert ctl(d, "reload").returncode == 0
        ready(d, "small", generation=3)
        serving(d, "small")
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_config_reload_loads_a_model_whose_replacement_failed_again(tmp_path, model):
    """A replacement (a new file renamed over the model's path) whose load
    fails for a transient cause (every openat(2) of wcached fails with EIO,
    injected by a strace attached for the while) leaves generation 1
    serving the old weights, the error in status. Nothing on disk changes
    after that, so no watch would ever load it again: a reload of the
    configuration does, once the cause is gone, and generation 2 serves the
    new file. Before, a config reload left a serving model alone, old
    weights and all, until its files changed again or `wcachectl reload
    NAME`."""
    d = Daemon(tmp_path, {"small": model})
    wait_for_control(d.start())
    try:
        ready(d, "small")
        with injected(d.proc.pid, "openat", "EIO"):
            new = mkmodel(tmp_path / "new.safetensors", seed=2, **SMALL)
            os.rename(new, model)
            d.wait_for_log('model "small": .*Input/output error; generation 1 still serving')
            m = model_entry(d, "small")
            assert m["generation"] == 1 and "Input/output error" in m["error"], m
            serving(d, "small")
        r = ctl(d, "reload")
        assert r.returncode == 0, (r.stdout, r.stderr, d.read_log())
        d.wait_for_log('model "small": its replacement failed [(]generation 1 still serving[)]: '
                       '.*Input/output error; the reload loads it again')
        ready(d, "small", generation=2)
        assert "error" not in model_entry(d, "small")
        serving(d, "small")
        # Nothing is failed now: a reload loads nothing again.
        assert ctl(d, "reload").returncode == 0
        assert d.read_log().count("the reload loads it again") == 1
        assert model_gen(d, "small") == 2
    finally:
        assert d.stop() == 0, d.read_log()


def test_control_accept_failing_pauses(tmp_path, model):
    """accept(2) of the control socket failing for as long as it lasts
    (ENOMEM, injected by an attached strace into every accept4 of wcached):
    the listener pauses 100 ms at a time with one warning, the loop goes on
    (a stop is handled), and once accepts work again a waiting request is
    answered. Before, libuv's own accept loop tried again at once without
    returning to the loop: 100% CPU, a warning per try (thousands a second),
    and SIGTERM never handled. Each pause is counted in
    wcached_control_accept_pauses_total (a second of failures, about ten;
    before, no metric counted them), apart from the client socket's
    wcached_accept_pauses_total (no client waited there)."""
    d = Daemon(tmp_path, {"small": model})
    wait_for_control(d.start())
    try:
        ready(d, "small")
        assert control_metric(d, "wcached_control_accept_pauses_total") == 0
        with injected(d.proc.pid, "accept4", "ENOMEM"):
            waiting = subprocess.Popen([binary("wcachectl"), "--control", d.control, "status"],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            d.wait_for_log(r"control: accept: Cannot allocate memory: connections wait in the "
                           r"backlog; trying again every 100 ms")
            time.sleep(1.0)
            lines = d.read_log().count("control: accept:")
            assert lines == 1, d.read_log()[-2000:]
            assert waiting.poll() is None  # in the backlog
        out, err = waiting.communicate(timeout=30)
        assert waiting.returncode in (0, 3), (out, err)
        d.wait_for_log("control: accepting connections again")
        assert 2 <= control_metric(d, "wcached_control_accept_pauses_total") <= 40
        assert control_metric(d, "wcached_accept_pauses_total") == 0
    finally:
        assert d.stop() == 0, d.read_log()[-3000:]


def model_gen(d, name):
    m = model_entry(d, name)
    return m["generation"] if m else 0


# ---- pin, unpin, evict ----------------------------------------------------------

def test_pin_unpin_evict(daemon):
    ready(daemon, "small")
    r = ctl(daemon, "pin", "small")
    assert r.returncode == 0, r.stderr
    assert model_entry(daemon, "small")["pinned"] == "all"
    r = ctl(daemon, "evict", "small")
    assert r.returncode == 1 and "pinned" in r.stderr
    r = ctl(daemon, "unpin", "small")
    assert r.returncode == 0, r.stderr
    assert model_entry(daemon, "small")["pinned"] == "metadata"
    r = ctl(daemon, "evict", "small")
    assert r.returncode == 0, r.stderr
    assert model_entry(daemon, "small")["state"] == "cold"
    # Attaching a cold model warms it again.
    serving(daemon)
    ready(daemon, "small")
    for cmd in ("pin", "unpin", "evict"):
        r = ctl(daemon, cmd, "nope")
        assert r.returncode == 1 and "nope" in r.stderr, cmd


# ---- metrics --------------------------------------------------------------------

def test_metrics(daemon, tmp_path):
    ready(daemon, "small")
    serving(daemon)
    # A path with a quote, a backslash and a space: label escaping.
    odd = tmp_path / 'we "ird\\ dir'
    odd.mkdir()
    path = mkmodel(odd / "m.safetensors", seed=2, **SMALL)
    r = ctl(daemon, "load", "odd", path)
    assert r.returncode == 0, r.stderr
    ready(daemon, "odd")
    # Residency is measured off the loop after the warm-up: compare the two
    # formats once the figure has settled.
    wait_until(lambda: (lambda m: m["resident_bytes"] == m["bytes"])(model_entry(daemon, "odd")),
               what="odd's residency measured")
    r = ctl(daemon, "metrics")
    assert r.returncode == 0, r.stderr
    text = r.stdout
    assert 'wcached_model_generation{model="small"} 1\n' in text
    assert 'wcached_model_attaches_total{model="small"} 1\n' in text
    assert "# TYPE wcached_model_swaps_total counter\n" in text
    assert 'path="' + path.replace("\\", "\\\\").replace('"', '\\"') + '"' in text
    assert "wcached_uptime_seconds " in text and "wcached_clients 0\n" in text
    reply = json.loads(ctl(daemon, "--json", "metrics").stdout)
    def steady(t):
        return [line for line in t.splitlines() if not line.startswith("wcached_uptime")]
    assert reply["ok"] and steady(reply["text"]) == steady(text)
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout + check.stderr


# ---- the protocol -----------------------------------------------------------------

def test_protocol_pipelined_and_quoted(daemon, tmp_path):
    ready(daemon, "small")
    odd = tmp_path / 'a b"c'
    odd.mkdir()
    path = mkmodel(odd / "m.safetensors", seed=8, **SMALL)
    quoted = '"' + path.replace("\\", "\\\\").replace('"', '\\"') + '"'
    c = Control(daemon)
    # Several requests in one write: one reply each, in order; the load's
    # reply waits for the load, and the status behind it sees its result.
    c.send(b"status\nbogus\r\nload q " + quoted.encode() + b"\nstatus\nhelp\n")
    assert c.reply()["ok"] is True
    bad = c.reply()
    assert bad == {"ok": False, "protocol": 1, "error": 'unknown command "bogus" (try "help")'}
    loaded = c.reply()
    assert loaded["ok"] and loaded["model"] == "q" and loaded["generation"] == 1
    assert any(m["name"] == "q" and m["path"] == path for m in c.reply()["models"])
    assert any(x["usage"].startswith("load NAME PATH") for x in c.reply()["commands"])
    # A line ended by EOF instead of '\n' is still a request.
    c.send(b"status")
    c.sock.shutdown(socket.SHUT_WR)
    assert c.reply()["ok"] is True
    assert c.reply() is None
    c.close()


def test_malformed_lines(daemon):
    ready(daemon, "small")
    c = Control(daemon)
    for line, text in ((b"", "empty request"), (b"   \t ", "empty request"),
                       (b"status\x00", "control character 0x00"),
                       (b"\xff\xfe\x80binary" + bytes(range(1, 9)), "bad request"),
                       (b"\xc0\xaf", "not UTF-8"), (b"\xed\xa0\x80", "not UTF-8"),
                       (b"load a \"/x", "unterminated quote"),
                       (b"load a /x\\y", "quote the word"),
                       (b"unload a b c d e f g h i", "more than"),
                       (b"status extra", "status: usage: status"),
                       (b"STATUS", 'unknown command "STATUS"')):
        reply = c.request(line)
        assert reply["ok"] is False, line
        assert text in reply["error"], (line, reply)
    # The connection survives all of them.
    assert c.request(b"status")["ok"] is True
    c.close()
    # Random binary with newlines inside: every piece gets an error, no crash.
    c = Control(daemon)
    blob = bytes((b * 37 + 11) % 256 for b in range(3000)).replace(b"\n", b"\x01") + b"\n"
    assert c.request(blob)["ok"] is False
    c.close()
    serving(daemon)


def test_overlong_line_closes(daemon):
    ready(daemon, "small")
    base = quiet_fd_count(daemon)
    c = Control(daemon)
    try:
        c.send(b"x" * (1 << 20) + b"\n")
    except (BrokenPipeError, ConnectionResetError):
        pass  # the daemon closed after its error reply, which is still readable
    reply = c.reply()
    assert reply == {"ok": False, "protocol": 1, "error": "request longer than 4096 bytes"}
    try:
        assert c.reply() is None
    except ConnectionResetError:
        pass
    c.close()
    # Exactly 4096 bytes is allowed (and then an unknown command).
    c = Control(daemon)
    reply = c.request(b"y" * 4096)
    assert reply["ok"] is False and "unknown command" in reply["error"]
    c.close()
    serving(daemon)
    assert status(daemon)["ok"]
    wait_until(lambda: quiet_fd_count(daemon) == base, what="fds back to baseline")


def test_client_disappears_mid_request(daemon, tmp_path):
    ready(daemon, "small")
    paths = [mkmodel(tmp_path / f"g{i}.safetensors", seed=20 + i, **SMALL) for i in range(5)]
    for i, path in enumerate(paths):
        c = Control(daemon)
        c.send(f"load gone{i} {path}\nstatus\n".encode())
        c.close()  # before the load's reply
    wait_until(lambda: all(model_entry(daemon, f"gone{i}") for i in range(5)),
               what="the loads finished anyway")
    for i in range(5):
        ready(daemon, f"gone{i}")
    base = quiet_fd_count(daemon)
    for i in range(20):
        c = Control(daemon)
        c.send([b"sta", b"status\n", b"status\nstatus\nmetrics\n", b""][i % 4])
        c.close()
    serving(daemon)
    wait_until(lambda: quiet_fd_count(daemon) == base, what="fds back to baseline")


# ---- who may control ----------------------------------------------------------------

def start_shared(tmp_path, model, extra=""):
    """A daemon whose control socket lives where other users can reach it."""
    d = Daemon(tmp_path, {"small": model})
    d.control = os.path.join(shared_dir(), f"control-{os.getpid()}-{tmp_path.name}.sock")
    d.write_config({"small": model}, extra)
    wait_for_control(d.start())
    # Ready, so that status exits 0 for the users allowed to ask.
    wait_until(lambda: ctl(d, "status").returncode == 0, what="small ready")
    return d


@root_daemon
def test_socket_mode_keeps_others_out(tmp_path, model):
    d = start_shared(tmp_path, model)
    try:
        st = os.stat(d.control)
        assert stat.S_IMODE(st.st_mode) == 0o600
        r = ctl(d, "status", user=as_user())
        assert r.returncode == 1
        assert "permission denied" in r.stderr and d.control in r.stderr
        assert ctl(d, "status").returncode == 0
    finally:
        assert d.stop() == 0, d.read_log()
    assert not os.path.exists(d.control)


def control_metric(d, name):
    """The value of the metric name (a family without labels)."""
    text = ctl(d, "metrics").stdout
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in metrics:\n{text}")


# Connects COUNT times to the control socket PATH and prints each reply.
REFUSED_LOOP = r"""
import socket, sys
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    s.settimeout(10)
    print(s.makefile().readline().strip())
    s.close()
"""


@root_daemon
def test_peercred_refuses_others(tmp_path, model):
    """Someone who may connect but not control gets an error reply, each
    time counted in wcached_control_refused_total (not in ..._evicted_total),
    and one warning a minute: a loop of refused connections cannot flood
    the log (before, one warning per connection)."""
    d = start_shared(tmp_path, model)
    try:
        os.chmod(d.control, 0o666)  # only SO_PEERCRED stands in the way now
        r = ctl(d, "status", user=as_user())
        assert r.returncode == 1
        assert "permission denied: uid 65534 may not control wcached" in r.stderr
        r = ctl(d, "unload", "small", user=as_user())
        assert r.returncode == 1
        r = subprocess.run(as_user() + ["/usr/bin/python3", "-c", REFUSED_LOOP, d.control,
                                        "50"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        replies = r.stdout.splitlines()
        assert len(replies) == 50 and all("permission denied: uid 65534" in x
                                          for x in replies), r.stdout
        assert control_metric(d, "wcached_control_refused_total") == 52
        assert control_metric(d, "wcached_control_evicted_total") == 0
        assert d.read_log().count("control: refused uid 65534") == 1, d.read_log()
        assert status(d)["control_clients"] == 1
        serving(d)
        assert model_entry(d, "small") is not None
    finally:
        assert d.stop() == 0, d.read_log()


@root_daemon
def test_control_group(tmp_path, model):
    d = start_shared(tmp_path, model, extra="control_group = nogroup\n")
    try:
        st = os.stat(d.control)
        assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == 65534
        # Primary group.
        r = ctl(d, "status", user=as_user(group="nogroup"))
        assert r.returncode == 0, r.stderr
        # Supplementary group (SO_PEERGROUPS).
        r = ctl(d, "--json", "status", user=as_user(group="daemon", groups=["nogroup"]))
        assert r.returncode == 0, r.stderr
        # Neither: the file mode refuses, and with a looser mode SO_PEERCRED does.
        r = ctl(d, "status", user=as_user(group="daemon"))
        assert r.returncode == 1 and "permission denied" in r.stderr
        os.chmod(d.control, 0o666)
        r = ctl(d, "status", user=as_user(group="daemon"))
        assert r.returncode == 1 and "may not control" in r.stderr
    finally:
        assert d.stop() == 0, d.read_log()


@root_daemon
def test_stale_control_socket_replaced_and_live_one_refused(tmp_path, model):
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp_path / "control.sock"))
    stale.close()
    d = wait_for_control(Daemon(tmp_path, {"small": model}).start())
    try:
        assert status(d)["ok"]
        # A second daemon on the same control socket (another client socket).
        second = tmp_path / "second"
        second.mkdir()
        other = Daemon(second, {"small": model})
        other.control = d.control
        other.write_config({"small": model})
        r = subprocess.run([binary("wcached"), "-c", other.conf], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 1
        assert "another wcached" in r.stderr and d.control in r.stderr
        assert status(d)["ok"]
    finally:
        assert d.stop() == 0, d.read_log()


# ---- the sockets' owners, and who removes them ----------------------------------------

def open_model_dir(model):
    """A directory anyone may enter and write (sockets of a daemon that is
    not root), holding a readable copy of model: (directory, copy)."""
    where = tempfile.mkdtemp(prefix="wcache-group-", dir=shared_dir())
    os.chmod(where, 0o777)
    mine = shutil.copy(model, os.path.join(where, "m.safetensors"))
    os.chmod(mine, 0o644)
    return where, mine


@root_daemon
def test_user_keeps_the_control_groups_socket_and_a_shared_group_is_named(model):
    """Started as root with user = and control_group =, the control socket
    stays in control_group's group (the drop to the user gave it the user's
    group, locking the operators out). A control_group that is also the
    client socket's group (every worker's) is named in a warning."""
    where, mine = open_model_dir(model)
    for group, shared in (("daemon", False), ("nogroup", True)):
        d = Daemon(where, {"small": mine}, extra=f"user = nobody\ncontrol_group = {group}\n")
        try:
            wait_for_control(d.start())
            st = os.stat(d.control)
            assert (st.st_uid, st.st_gid) == (65534, 1 if group == "daemon" else 65534)
            assert stat.S_IMODE(st.st_mode) == 0o660
            line = f"control_group = {group} is also the group of the client socket " \
                f"{d.socket}: every worker that may attach may also control wcached"
            # Said at start, before the first model is opened.
            d.wait_for_log("model \"small\": generation")
            assert (line in d.read_log()) == shared, d.read_log()
        finally:
            assert d.stop() == 0, d.read_log()


def test_a_control_group_the_daemon_is_not_in_is_one_clear_error(tmp_path, model):
    """Not root, and not in control_group: the socket cannot be given to the
    group. --check, run as that user (as wcached(8) advises), fails (it
    said nothing, then warned with exit 0: review rev114 #7), and the start
    names the group and the remedy (it said 'Operation not permitted')."""
    user = as_user() if os.geteuid() == 0 else []  # nobody, without groups
    where, mine = open_model_dir(model)
    d = Daemon(where, {"small": mine}, extra="control_group = daemon\n")
    os.chmod(where, 0o777)  # Daemon gave it to $WCACHE_TEST_USER, if set
    os.chmod(d.conf, 0o644)
    r = subprocess.run([*user, binary("wcached"), "--check", "-c", d.conf],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "wcached: control_group = daemon: this user (uid " in r.stderr, r.stderr
    assert "is not in that group" in r.stderr and "warning: control_group" not in r.stderr
    r = subprocess.run([*user, binary("wcached"), "-c", d.conf], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1
    assert f"{d.control}: cannot give the socket to group 1: Operation not permitted " \
        "(wcached's user is not in that group" in r.stderr, r.stderr


def test_a_successors_socket_is_not_removed(tmp_path, model):
    """At exit wcached removes the sockets it made only while they are still
    the ones it made: a successor that took the path over (a force-deleted
    Pod, a stale socket replaced) keeps its own."""
    d = Daemon(tmp_path, {"small": model})
    successor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        wait_for_control(d.start())
        os.unlink(d.control)
        successor.bind(d.control)
        successor.listen(1)
    finally:
        assert d.stop() == 0, d.read_log()
    try:
        assert os.path.exists(d.control)
        assert stat.S_ISSOCK(os.lstat(d.control).st_mode)
        assert f"{d.control}: another socket is there now (a successor's); left alone" in \
            d.read_log()
        assert not os.path.exists(d.socket)  # its own, removed
    finally:
        successor.close()
