"""wcachectl and hostile text: names, paths and messages from a model file,
from wcached or from the command line are shown escaped on a terminal
(base/escape.h: C0 controls, DEL and bytes that are not UTF-8 as \\xNN, C1
controls and bidirectional overrides as \\uNNNN), never as the raw bytes a
terminal acts on; --json keeps them as JSON escapes. Also: numbers from the
daemon that no integer holds, and a standard output that cannot be written,
which every command reports in one line and exit status 1.

Each test drives the real wcachectl; the daemon is a real wcached where it
can be (attach), and a fake control socket (ctlutil.FakeControl) answering
a crafted reply where a real one would never send it. Assertions are on
bytes.
"""
import json
import os
import pty
import struct
import subprocess

from conftest import Daemon, binary, mkmodel
from ctlutil import FakeControl

ESC_NAME = "\x1b]0;PWNED\x07\x1b[2J\x1b[31mshard.safetensors"
C1 = "\u009b"        # CSI as one character: a terminal that honours C1 reads ESC [
BIDI = "\u202e"      # right-to-left override: hides what follows
RAW = (b"\x1b", b"\x07", b"\xc2\x9b", b"\xe2\x80\xae")  # bytes no output may hold
FULL = b"wcachectl: writing the output: No space left on device\n"


def run(*args, **kw):
    """Runs wcachectl ARGS; bytes out."""
    return subprocess.run([binary("wcachectl"), *args], capture_output=True, timeout=120, **kw)


def raw_bytes(data):
    """The bytes of RAW that data holds."""
    return [b for b in RAW if b in data]


def write_safetensors(path, tensors):
    """tensors: {name: bytes of F32 data}, each one-dimensional."""
    header, data = {}, b""
    for name, raw in tensors.items():
        header[name] = {"dtype": "F32", "shape": [len(raw) // 4],
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, ensure_ascii=False).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def sharded(directory, shards):
    """A sharded model in directory: shards maps a shard's file name to its
    tensors (a name: data); the index's weight_map names them all."""
    directory.mkdir()
    weight_map = {}
    for shard, tensors in shards.items():
        write_safetensors(directory / shard, tensors)
        weight_map.update({name: shard for name in tensors})
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": weight_map}, ensure_ascii=False))
    return directory


def hostile_status():
    """A status reply with a hostile string in every member wcachectl shows."""
    def evil(word):
        return f"{word}\x1b[2J{C1}31m{BIDI}"
    model = {"name": evil("m"), "path": "/m", "generation": 2, "state": evil("ready"),
             "bytes": 1000, "resident_bytes": 1000, "pinned": evil("all"),
             "pin_applied": evil("metadata"), "pin_error": evil("refused"), "attached": 1,
             "error": evil("broken"),
             "generations": [{"number": 1, "state": evil("old"), "attached": 1, "bytes": 9,
                              "current": False, "pending": False}],
             "derived": [{"key": evil("key"), "state": "ready", "format": evil("fmt"),
                          "source_generation": 2, "bytes": 5}]}
    return {"ok": True, "protocol": 1, "version": evil("0.1"), "pid": 1, "uptime_seconds": 5,
            "clients": 0, "memory": {"limit": 1 << 30, "budget": 0, "models_bytes": 1000,
                                     "limit_source": evil("cgroup"), "fits": True},
            "models": [model, {**model, "name": "plain", "state": "ready",
                               "pinned": "all", "pin_applied": "all"}],
            "unloaded": [{"name": evil("u"), "state": evil("gone"), "generation": 3,
                          "attached": 1}]}


# ---- model files ----------------------------------------------------------

def test_convert_escapes_a_shard_name_from_the_index(tmp_path):
    """A sharded index names a shard that is missing: the reader's message
    quotes that name, which must reach the terminal as text."""
    d = sharded(tmp_path / "hostile", {"two.safetensors": {"b": bytes(4)}})
    index = json.loads((d / "model.safetensors.index.json").read_text())
    index["weight_map"]["a"] = ESC_NAME
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    r = run("convert", str(d), str(tmp_path / "out.weig"))
    assert r.returncode == 1 and r.stderr.startswith(b"wcachectl: "), r
    assert not raw_bytes(r.stderr), r.stderr
    assert b"\\x1b]0;PWNED\\x07\\x1b[2J\\x1b[31mshard.safetensors" in r.stderr, r.stderr
    assert r.stderr.count(b"\n") == 1


def test_convert_escapes_out_in_its_summary(tmp_path):
    """OUT comes from the command line: the summary line shows it escaped."""
    src = tmp_path / "in.safetensors"
    write_safetensors(src, {"a": bytes(8)})
    out = tmp_path / f"\x1b[2J{C1}out.weig"
    r = run("convert", str(src), str(out))
    assert r.returncode == 0, r.stderr
    assert not raw_bytes(r.stdout) and b"\\x1b[2J\\u009bout.weig: WEIG" in r.stdout, r.stdout
    assert os.path.exists(out)


def test_inspect_escapes_c1_and_bidi_and_keeps_the_table_aligned(tmp_path):
    shard = f"{C1}2J{BIDI}shard.safetensors"
    name = f"{C1}name{BIDI}"
    d = sharded(tmp_path / "c1", {shard: {name: bytes(4)}, "two.safetensors": {"b": bytes(4)}})
    r = run("inspect", str(d))
    assert r.returncode == 0, r.stderr
    assert not raw_bytes(r.stdout), r.stdout
    rows = {line.split()[0]: line for line in r.stdout.decode().splitlines()
            if line.startswith(("\\u009b", "b "))}
    assert sorted(rows) == ["\\u009bname\\u202e", "b"], rows
    assert "\\u009b2J\\u202eshard" in rows["\\u009bname\\u202e"]
    assert [row.index(" F32") for row in rows.values()] == [48, 48], rows

    # --json: the same names as JSON escapes, which read back as they were.
    r = run("inspect", "--json", str(d))
    assert r.returncode == 0 and not raw_bytes(r.stdout), r.stdout
    tensors = json.loads(r.stdout)["tensors"]
    assert name in [t["name"] for t in tensors]
    assert any(t["file"].endswith(shard) for t in tensors)

    # And the message that names the shard when it is missing.
    os.unlink(d / shard)
    r = run("inspect", str(d))
    assert r.returncode == 1 and r.stderr.startswith(b"wcachectl: "), r
    assert not raw_bytes(r.stderr) and b"\\u009b2J\\u202eshard" in r.stderr, r.stderr


# ---- the daemon's strings --------------------------------------------------

def test_status_escapes_every_string_from_the_daemon(tmp_path):
    path = tmp_path / "control.sock"
    fake = FakeControl(path, hostile_status())
    try:
        r = run("--control", str(path), "status")
        assert r.returncode == 3, r.stderr  # "ready\x1b..." is not ready
        out = r.stdout
        assert not raw_bytes(out), out
        for word in (b"0.1", b"cgroup", b"m", b"ready", b"metadata", b"old", b"gone",
                     b"fmt", b"all", b"broken", b"refused", b"key", b"u"):
            assert word + b"\\x1b[2J\\u009b31m\\u202e" in out, (word, out)
        # The table's columns line up, escaped text counted as it shows.
        lines = out.decode().splitlines()
        head = next(line for line in lines if line.startswith("NAME"))
        rows = [line for line in lines if line.startswith(("m\\x1b", "plain "))]
        assert len(rows) == 2
        for column in ("GEN", "STATE", "BYTES", "PINNED", "ATTACHED"):
            at = head.index(column)
            assert all(row[at - 2:at] == "  " and row[at] != " " for row in rows), (column,
                                                                                  out)

        # --json: the reply's strings stay JSON, C1 and bidi as \\u escapes.
        r = run("--control", str(path), "--json", "status")
        assert r.returncode == 3, r.stderr
        assert not raw_bytes(r.stdout), r.stdout
        assert json.loads(r.stdout)["version"] == hostile_status()["version"]
        r = run("--control", str(path), "--json", "status", f"n{C1}")
        assert r.returncode == 4 and not raw_bytes(r.stdout + r.stderr), r
        assert json.loads(r.stdout)["unknown"] == [f"n{C1}"]
    finally:
        fake.close()


def test_a_daemons_error_is_escaped(tmp_path):
    path = tmp_path / "control.sock"
    fake = FakeControl(path, {"ok": False, "protocol": 1,
                              "error": f"/x/{C1}2J{BIDI}\x1b[31m: refused"})
    try:
        r = run("--control", str(path), "unload", "x")
        assert r.returncode == 1, r
        assert r.stderr == b"wcachectl: /x/\\u009b2J\\u202e\\x1b[31m: refused\n", r.stderr
        r = run("--control", str(path), "--json", "unload", "x")
        assert r.returncode == 1 and not raw_bytes(r.stdout), r.stdout
        assert json.loads(r.stdout)["error"].startswith(f"/x/{C1}2J{BIDI}")
    finally:
        fake.close()


def test_attach_escapes_the_daemons_load_error_and_the_name(tmp_path):
    """wc_errmsg() carries the daemon's load error, which quotes the model's
    path; the name comes from the command line."""
    bad = tmp_path / f"bad{C1}[31m{BIDI}.safetensors"
    bad.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}garbag")
    d = Daemon(tmp_path, {"m": str(bad)}).start()
    try:
        r = run("attach", "m", "--socket", d.socket)
        assert r.returncode == 1 and not raw_bytes(r.stderr), r.stderr
        assert b"bad\\u009b[31m\\u202e.safetensors" in r.stderr, r.stderr
        r = run("attach", "\x1b[2Jx", "--socket", d.socket)
        assert r.returncode == 1 and not raw_bytes(r.stderr), r.stderr
        assert b"\\x1b[2Jx" in r.stderr, r.stderr
    finally:
        assert d.stop() == 0, d.read_log()


def test_uptime_no_integer_holds_is_not_undefined(tmp_path):
    """"uptime_seconds":1e999 reads as infinity; converting it to an integer
    is undefined behaviour (UBSan reports it). It shows as "?"."""
    path = tmp_path / "control.sock"
    reply = (b'{"ok":true,"protocol":1,"version":"0.1","pid":1,"uptime_seconds":1e999,'
             b'"clients":0,"models":[],"unloaded":[],"work_queue":{"remote_stalled":1,'
             b'"remote_waiting":0,"oldest_remote_seconds":18446744073709551616}}\n')
    fake = FakeControl(path, reply)
    try:
        r = run("--control", str(path), "status")
        assert r.returncode == 0 and b"runtime error" not in r.stderr, r.stderr
        assert b", up ?, 0 clients" in r.stdout, r.stdout
        assert b"stalled on a remote filesystem for up to ? " in r.stdout, r.stdout
    finally:
        fake.close()


# ---- metrics: escaped on a terminal only ----------------------------------

METRICS = "# HELP wcache_x \x1b]0;PWNED\x07 help\nwcache_x{model=\"\u009b2J\"} 1\n"


def read_pty(argv):
    """Runs argv with stdout on a pseudo-terminal; its exit status and the
    bytes it wrote there."""
    master, slave = pty.openpty()
    p = subprocess.Popen(argv, stdout=slave, stderr=subprocess.PIPE)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the terminal's last writer has gone
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    p.stderr.read()
    return p.wait(timeout=60), out


def test_metrics_are_escaped_on_a_terminal_and_raw_for_a_scraper(tmp_path):
    path = tmp_path / "control.sock"
    fake = FakeControl(path, {"ok": True, "protocol": 1, "text": METRICS})
    try:
        code, out = read_pty([binary("wcachectl"), "--control", str(path), "metrics"])
        assert code == 0 and not raw_bytes(out), out
        # The terminal adds a carriage return to each newline (ONLCR).
        assert out == (b"# HELP wcache_x \\x1b]0;PWNED\\x07 help\r\n"
                       b"wcache_x{model=\"\\u009b2J\"} 1\r\n"), out
        r = run("--control", str(path), "metrics")
        assert r.returncode == 0 and r.stdout == METRICS.encode(), r.stdout
    finally:
        fake.close()


# ---- standard output that cannot be written ------------------------------

def test_every_command_reports_a_full_disk(tmp_path):
    model = mkmodel(tmp_path / "small.safetensors")
    fake_path = tmp_path / "control.sock"
    fake = FakeControl(fake_path, hostile_status())
    # Metrics larger than stdout's buffer: one fwrite() whose failure left
    # only ferror(), and "Input/output error", before.
    big_path = tmp_path / "big.sock"
    big = FakeControl(big_path, {"ok": True, "protocol": 1,
                                 "text": "wcache_x{model=\"m\"} 1\n" * 4096})
    os.mkdir(tmp_path / "d")
    d = Daemon(tmp_path / "d", {"small": model}).start()
    try:
        cases = (["--version"], ["--help"], ["help"], ["inspect", model],
                 ["inspect", "--json", model], ["convert", model, str(tmp_path / "o.weig")],
                 ["attach", "small", "--socket", d.socket],
                 ["attach", "small", "--socket", d.socket, "--json"],
                 ["--control", str(fake_path), "status"],
                 ["--control", str(fake_path), "--json", "status"], ["status", "--help"],
                 ["--control", str(big_path), "metrics"],
                 ["--control", str(big_path), "--json", "metrics"],
                 ["--control", d.control, "metrics"])
        wrong = []
        for args in cases:
            with open("/dev/full", "wb") as full:
                r = subprocess.run([binary("wcachectl"), *args], stdout=full,
                                   stderr=subprocess.PIPE, timeout=120)
            if (r.returncode, r.stderr) != (1, FULL):
                wrong.append((args, r.returncode, r.stderr))
        assert not wrong, wrong
    finally:
        fake.close()
        big.close()
        assert d.stop() == 0, d.read_log()


# ---- options ---------------------------------------------------------------

def test_empty_paths_and_the_timeout_rule_are_one_clear_line(tmp_path):
    cases = ((["--control=", "status"], "--control needs a path, not an empty one"),
             (["--config=", "status"], "--config needs a path, not an empty one"),
             (["-c", "", "status"], "--config needs a path, not an empty one"),
             (["status", "--control="], "--control needs a path, not an empty one"),
             (["status", "--config", ""], "--config needs a path, not an empty one"),
             (["metrics", "--http", "--timeout", "0"],
              '--timeout takes seconds, more than 0 and at most 3600, not "0"'),
             (["metrics", "--http", "--timeout", "3601"],
              '--timeout takes seconds, more than 0 and at most 3600, not "3601"'))
    for args, text in cases:
        r = run(*args, cwd=tmp_path)
        assert r.returncode == 2 and r.stdout == b"", (args, r)
        err = r.stderr.decode()
        assert len(err.splitlines()) == 1 and text in err, (args, err)


def test_help_and_man_page_list_version():
    r = run("--help")
    assert r.returncode == 0 and b"\n  -V, --version " in r.stdout, r.stdout
    for flag in ("--version", "-V"):  # -V as wcached takes it (review rev223 L9)
        r = run(flag)
        assert r.returncode == 0 and r.stdout.startswith(b"wcachectl "), (flag, r)
    man = os.path.join(os.path.dirname(__file__), "..", "..", "man", "wcachectl.1")
    with open(man) as f:
        assert "\\-\\-version" in f.read()
