"""Security issue 18, items 1 and 3, against the real wcached.

Item 1: whoever can write a served model file must not corrupt wcached's
memory. A writer process toggles strings of the header in place between
"\\u0041..." and "AAAAAA..." of the same length (a tensor name, a dtype, a
metadata value: a parser that measures a string on one read and decodes it
on another would overflow its buffer) and truncates and restores the file,
while wcached loads the model again and again. wcached must stay alive with
no sanitizer report, every refusal is one line naming the file, and at the
end a worker attaches the model and reads every byte correctly.
WCACHE_ATTACK_SECONDS sets how long the writer runs (default 20).

Item 3: a symlink in a model (a shard, the file of a single-file model) that
leads out of the model's tree is refused with a message that names the link,
its target and the tree; a Hugging Face hub snapshot (links into
../../blobs/) loads and serves."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

from conftest import Daemon, binary, mkmodel, wait_until
from ctlutil import ctl, model_entry

ATTACK_SECONDS = float(os.environ.get("WCACHE_ATTACK_SECONDS", "20"))
SANITIZER_WORDS = ("AddressSanitizer", "LeakSanitizer", "UndefinedBehaviorSanitizer",
                   "runtime error", "SIGBUS", "SIGSEGV")

# Repeats of each toggled string: 6 raw bytes a unit, so "\u0041" * N
# decodes to N bytes and "A" * 6N to 6N bytes.
UNITS = 400


def escaped(text):
    return "".join(f"\\u{ord(c):04x}" for c in text)


def attack_model(path):
    """Writes a safetensors file whose header holds three strings spelled
    with escapes; returns (file bytes, [(offset, escaped, plain)]) where each
    pair is the same length and both spellings are valid JSON."""
    name = escaped("A" * UNITS)                # a tensor name of UNITS bytes
    dtype = escaped("U8")                      # 12 raw bytes, 2 decoded
    note = escaped("B" * UNITS)                # a metadata value
    header = ('{"__metadata__":{"note":"%s"},'
              '"%s":{"dtype":"U8","shape":[0],"data_offsets":[4096,4096]},'
              '"w":{"dtype":"%s","shape":[64,64],"data_offsets":[0,4096]}}'
              % (note, name, dtype))
    header += " " * (-len(header) % 8)
    raw = header.encode()
    data = bytes((i * 37 + 11) & 0xff for i in range(4096))
    image = len(raw).to_bytes(8, "little") + raw + data
    regions = []
    for text, plain in ((name, "A" * len(name)), (dtype, "U8" + "8" * (len(dtype) - 2)),
                        (note, "B" * len(note))):
        off = 8 + raw.index(text.encode())
        regions.append((off, text.encode(), plain.encode()))
    with open(path, "wb") as f:
        f.write(image)
    return image, regions


# The writer: a separate process, so its pwrite loop never waits for the test.
WRITER = r"""
import json, os, sys, time
path, seconds, spec = sys.argv[1], float(sys.argv[2]), json.loads(sys.argv[3])
image = bytes.fromhex(spec["image"])
regions = [(o, bytes.fromhex(a), bytes.fromhex(b)) for o, a, b in spec["regions"]]
fd = os.open(path, os.O_WRONLY)
end = time.monotonic() + seconds
n = 0
while time.monotonic() < end:
    for off, a, b in regions:
        os.pwrite(fd, b if n % 2 == 0 else a, off)
    if n % 7 == 3:
        os.ftruncate(fd, 8 + (n % 200))       # in the middle of the header
        os.pwrite(fd, image, 0)               # and back
    if n % 11 == 5:
        os.ftruncate(fd, 0)
        os.ftruncate(fd, len(image))
        os.pwrite(fd, image, 0)
    n += 1
os.pwrite(fd, image, 0)
os.ftruncate(fd, len(image))
os.close(fd)
print(n)
"""


def no_sanitizer_report(d):
    log = d.read_log()
    for word in SANITIZER_WORDS:
        assert word not in log, log[-4000:]


def test_writer_toggling_and_truncating_header_while_loading(tmp_path):
    path = str(tmp_path / "m.safetensors")
    image, regions = attack_model(path)
    pristine = tmp_path / "pristine.safetensors"
    pristine.write_bytes(image)
    d = Daemon(tmp_path, {"m": path}).start()
    writer = None
    try:
        wait_until(lambda: (model_entry(d, "m") or {}).get("state") == "ready",
                   what="the model ready")
        spec = json.dumps({"image": image.hex(),
                           "regions": [(o, a.hex(), b.hex()) for o, a, b in regions]})
        writer = subprocess.Popen([sys.executable, "-c", WRITER, path, str(ATTACK_SECONDS),
                                   spec], stdout=subprocess.PIPE, text=True)
        loads, refusals, reasons = 0, 0, set()
        deadline = time.monotonic() + ATTACK_SECONDS
        while time.monotonic() < deadline:
            r = ctl(d, "load", "m", path, timeout=60)
            assert d.proc.poll() is None, f"wcached died: {d.read_log()[-4000:]}"
            if r.returncode == 0:
                loads += 1
                continue
            assert r.returncode == 1, (r.returncode, r.stderr)
            refusals += 1
            msg = r.stderr.strip()
            assert "\n" not in msg and "m.safetensors" in msg, msg
            reasons.add(re.sub(r"[0-9]+", "N", msg.split("m.safetensors: ", 1)[-1])[:70])
        out, _ = writer.communicate(timeout=60)
        assert writer.returncode == 0
        print(f"attack: {ATTACK_SECONDS:.0f} s, {out.strip()} writer rounds, {loads} loads, "
              f"{refusals} refusals; reasons: {sorted(reasons)}")
        assert loads + refusals > 0
        assert d.proc.poll() is None, d.read_log()[-4000:]
        no_sanitizer_report(d)
        # The file is whole again: it loads, and a worker reads every byte
        # of the generation it attaches correctly.
        assert open(path, "rb").read() == image
        wait_until(lambda: ctl(d, "load", "m", path).returncode == 0, timeout=60,
                   what="the restored file to load")
        wait_until(lambda: (model_entry(d, "m") or {}).get("state") == "ready",
                   what="the last generation ready")
        w = subprocess.run([binary("demo_worker"), "--socket", d.socket, "--verify",
                            str(pristine), "m"], capture_output=True, text=True, timeout=60)
        assert w.returncode == 0, w.stdout + w.stderr
        assert json.loads(w.stdout)["tensors"] == 2, w.stdout
        no_sanitizer_report(d)
    finally:
        if writer is not None and writer.poll() is None:
            writer.send_signal(signal.SIGKILL)
            writer.wait()
        assert d.stop() == 0, d.read_log()[-4000:]
    no_sanitizer_report(d)


def shard_index(st_path, shard_name, index_path):
    """Writes a shard index putting every tensor of st_path in shard_name."""
    with open(st_path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    weight_map = {k: shard_name for k in header if k != "__metadata__"}
    with open(index_path, "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def test_symlinks_leaving_the_model_tree_are_refused(tmp_path):
    root = tmp_path / "models"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    (root / "c").mkdir()
    other = mkmodel(root / "b" / "y.safetensors", seed=2)
    outside = mkmodel(tmp_path / "outside.safetensors", seed=3)
    # a: a sharded model whose shard links into model b's directory.
    shard = "model-00001-of-00001.safetensors"
    os.symlink("../b/y.safetensors", root / "a" / shard)
    shard_index(other, shard, root / "a" / "model.safetensors.index.json")
    # c: a single-file model that is an absolute link to a file outside.
    os.symlink(outside, root / "c" / "model.safetensors")
    # hub: a Hugging Face hub snapshot, files linking to ../../blobs/.
    repo = tmp_path / "hub" / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    (repo / "snapshots" / "rev1").mkdir(parents=True)
    blob = mkmodel(repo / "blobs" / "0123abcd", seed=4)
    os.symlink("../../blobs/0123abcd", repo / "snapshots" / "rev1" / "model.safetensors")
    snapshot = str(repo / "snapshots" / "rev1")

    d = Daemon(tmp_path, {"b": str(root / "b")}).start()
    try:
        wait_until(lambda: (model_entry(d, "b") or {}).get("state") == "ready",
                   what="model b ready")
        tree_a = os.path.realpath(root / "a")
        r = ctl(d, "load", "a", str(root / "a"))
        assert r.returncode == 1, r.stdout
        assert (f"{root / 'a' / shard}: symlink to ../b/y.safetensors leaves the model's "
                f"tree {tree_a}") in r.stderr, r.stderr
        assert model_entry(d, "a") is None
        tree_c = os.path.realpath(root / "c")
        for path in (str(root / "c"), str(root / "c" / "model.safetensors")):
            r = ctl(d, "load", "c", path)
            assert r.returncode == 1, r.stdout
            assert (f"{root / 'c' / 'model.safetensors'}: symlink to {outside} leaves the "
                    f"model's tree {tree_c}") in r.stderr, r.stderr
        # A model that serves keeps serving when its replacement is refused,
        # and status shows why.
        r = ctl(d, "load", "b", str(root / "a"))
        assert r.returncode == 1
        m = model_entry(d, "b")
        assert m["state"] == "ready" and "leaves the model's tree" in m["error"], m
        # The hub snapshot loads, through its directory or its file, and serves.
        for name, path in (("hub", snapshot), ("hubfile", snapshot + "/model.safetensors")):
            r = ctl(d, "load", name, path)
            assert r.returncode == 0, r.stderr
            wait_until(lambda: (model_entry(d, name) or {}).get("state") == "ready",
                       what=f"{name} ready")
            w = subprocess.run([binary("demo_worker"), "--socket", d.socket, "--verify", blob,
                                name], capture_output=True, text=True, timeout=60)
            assert w.returncode == 0, w.stdout + w.stderr
        no_sanitizer_report(d)
    finally:
        assert d.stop() == 0, d.read_log()[-4000:]
    shutil.rmtree(tmp_path / "hub")
