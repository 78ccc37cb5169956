"""torch tensors from wcache equal what torch.load gives for the same
checkpoint saved as .pt, and wcache.convert writes files wcache (and the
byte layout of safetensors) agree with."""
import json
import os
import select
import signal
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

import wcache
from pyhelpers import PYDIR, write_safetensors
from wcache.convert import convert

ST = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
      torch.float64: "F64", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
      torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL", torch.complex64: "C64"}


def sample_state_dict():
    g = torch.Generator().manual_seed(3)
    sd = {
        "embed.weight": torch.randn(50, 16, generator=g).to(torch.bfloat16),
        "layers.0.attn.q.weight": torch.randn(16, 16, generator=g),
        "layers.0.attn.q.bias": torch.randn(16, generator=g).half(),
        "layers.0.mlp.w": torch.randn(32, 16, generator=g).double(),
        "layers.0.mask": torch.rand(4, 4, generator=g) > 0.5,
        "layers.0.ids": torch.randint(-100, 100, (7,), generator=g),
        "layers.0.i32": torch.randint(-100, 100, (2, 3), generator=g, dtype=torch.int32),
        "layers.0.i16": torch.randint(-100, 100, (5,), generator=g, dtype=torch.int16),
        "layers.0.i8": torch.randint(-100, 100, (5,), generator=g, dtype=torch.int8),
        "layers.0.u8": torch.randint(0, 255, (3, 1), generator=g, dtype=torch.uint8),
        "layers.0.c": torch.randn(3, generator=g, dtype=torch.complex64),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
    }
    return sd


def assert_same(a, b, name=""):
    assert a.dtype == b.dtype, name
    assert a.shape == b.shape, name
    assert torch.equal(a, b), name


def test_equal_to_torch_load_of_the_pt(tmp_path, no_daemon):
    sd = sample_state_dict()
    pt = tmp_path / "model.pt"
    torch.save(sd, pt)
    # the safetensors file written byte by byte, independent of wcache.convert
    st = tmp_path / "model.safetensors"
    write_safetensors(st, [(k, ST[v.dtype], tuple(v.shape),
                            (v.view(torch.int16) if v.dtype == torch.bfloat16 else v)
                            .contiguous().numpy().tobytes()) for k, v in sd.items()])
    loaded = torch.load(pt, weights_only=True)
    with wcache.safe_open(str(st), framework="pt") as f:
        assert sorted(f.keys()) == sorted(loaded)
        for k in f.keys():
            assert_same(f.get_tensor(k), loaded[k], k)
    with wcache.open_file(st) as m:
        for k, v in m.state_dict().items():
            assert_same(v, loaded[k], k)


def test_convert_then_read(tmp_path):
    sd = sample_state_dict()
    pt = tmp_path / "model.pt"
    torch.save(sd, pt)
    out = tmp_path / "out.safetensors"
    r = subprocess.run([sys.executable, "-m", "wcache.convert", "--trust-pickle", str(pt), str(out)],
                       env=dict(os.environ, PYTHONPATH=PYDIR), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"{len(sd)} tensors" in r.stdout
    loaded = torch.load(pt, weights_only=True)
    with wcache.open_file(out) as m:
        assert m.metadata() == {"format": "pt"}
        assert sorted(m.keys()) == sorted(loaded)
        for k in m.keys():
            assert_same(m.torch(k), loaded[k], k)
    # layout: header padded to 8, every tensor aligned to its element size
    blob = out.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    assert n % 8 == 0
    header = json.loads(blob[8:8 + n])
    for k, v in header.items():
        if k != "__metadata__":
            size = torch.tensor([], dtype=loaded[k].dtype).element_size()
            assert v["data_offsets"][0] % size == 0, k
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_convert_shared_storage_and_views(tmp_path):
    base = torch.arange(20, dtype=torch.float32)
    emb = torch.randn(6, 4)
    sd = {"embed.weight": emb, "lm_head.weight": emb,       # tied
          "half.a": base[:10], "half.b": base[10:],          # views of one storage
          "t.weight": torch.randn(3, 5).t()}                  # not contiguous
    pt = tmp_path / "shared.pt"
    torch.save(sd, pt)
    notes = []
    out = tmp_path / "shared.safetensors"
    convert(str(pt), str(out), log=notes.append, trust_pickle=True)
    assert any("embed.weight" in n and "lm_head.weight" in n for n in notes)
    assert any("half.a" in n and "half.b" in n for n in notes)
    loaded = torch.load(pt, weights_only=True)
    with wcache.open_file(out) as m:
        for k in sd:
            assert_same(m.torch(k), loaded[k].contiguous(), k)
        # written as separate copies: distinct addresses
        assert m.info("embed.weight").data != m.info("lm_head.weight").data


def test_convert_checkpoint_and_module(tmp_path):
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    ck = tmp_path / "ck.pt"
    torch.save({"state_dict": net.state_dict(), "epoch": 7, "opt": {"step": 3}}, ck)
    notes = []
    convert(str(ck), str(tmp_path / "ck.safetensors"), log=notes.append, trust_pickle=True)
    assert any("epoch" in n for n in notes)
    with wcache.open_file(tmp_path / "ck.safetensors") as m:
        assert sorted(m.keys()) == sorted(net.state_dict())
        for k, v in net.state_dict().items():
            assert_same(m.torch(k), v, k)

    whole = tmp_path / "whole.pt"
    torch.save(net, whole)
    out = tmp_path / "whole.safetensors"
    r = subprocess.run([sys.executable, "-m", "wcache.convert", str(whole), str(out)],
                       env=dict(os.environ, PYTHONPATH=PYDIR), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1
    assert "--trust-pickle" in r.stderr
    assert not out.exists()
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    convert(str(whole), str(out), trust_pickle=True)
    with wcache.open_file(out) as m:
        for k, v in net.state_dict().items():
            assert_same(m.torch(k), v, k)


def test_convert_failure_leaves_nothing(tmp_path):
    from wcache.convert import ConvertError
    pt = tmp_path / "c128.pt"
    torch.save({"ok": torch.zeros(2), "bad": torch.zeros(2, dtype=torch.complex128)}, pt)
    out = tmp_path / "c128.safetensors"
    with pytest.raises(ConvertError, match="bad.*complex128"):
        convert(str(pt), str(out), trust_pickle=True)
    assert sorted(os.listdir(tmp_path)) == ["c128.pt"]
    # an existing destination is replaced only by a complete file
    out.write_bytes(b"old")
    with pytest.raises(ConvertError):
        convert(str(pt), str(out), trust_pickle=True)
    assert out.read_bytes() == b"old"


def test_convert_names_a_file_that_is_no_checkpoint(tmp_path, capsys):
    """Text, an empty or truncated file, a safetensors file: one line that
    names the file and the reason, not a traceback from torch's unpickler.
    The first through the command (a fresh python3 -m wcache.convert), the
    others through the same main() in this process, where an exception
    would fail the test as a traceback would (each fresh python imports
    torch: a second or more)."""
    import wcache.torch as wcache_torch
    from wcache.convert import main
    good = tmp_path / "good.pt"
    torch.save({"w": torch.zeros(4)}, good)
    cases = {"notes.txt": b"hello\n", "empty.pt": b"",
             "cut.pt": good.read_bytes()[:40],
             "model.safetensors": wcache_torch.save({"w": torch.zeros(2)})}
    # A safetensors file whose header starts with JSON whitespace (upstream
    # and the C reader accept it): before, it went to torch.load, which told
    # the user to pass --trust-pickle (review rev126 #3).
    header = b' {"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    header += b" " * (-len(header) % 8)
    cases["spaced.safetensors"] = (len(header).to_bytes(8, "little") + header + bytes(8))
    out = tmp_path / "out.safetensors"
    for name, data in cases.items():
        src = tmp_path / name
        src.write_bytes(data)
        if name == "notes.txt":
            r = subprocess.run([sys.executable, "-m", "wcache.convert", "--trust-pickle", str(src), str(out)],
                               capture_output=True, text=True,
                               env=dict(os.environ, PYTHONPATH=PYDIR), timeout=120)
            status, err = r.returncode, r.stderr
        else:
            status, err = main(["--trust-pickle", str(src), str(out)]), capsys.readouterr().err
        assert status == 1, (name, err)
        assert "Traceback" not in err, (name, err)
        assert str(src) in err and "not a PyTorch checkpoint" in err, (name, err)
        if name.endswith(".safetensors"):
            assert "safetensors file already" in err, (name, err)
        assert not out.exists()


def test_convert_refuses_two_tensors_of_one_flattened_name(tmp_path):
    """"a.b" beside "a" -> {"b": t} are both "a.b" in safetensors: refused
    (rev113 #1: the second silently replaced the first, exit 0)."""
    from wcache.convert import ConvertError
    out = tmp_path / "collide.safetensors"
    clash = {"a.b": torch.ones(2), "a": {"b": torch.zeros(3)}, "c": torch.arange(4)}
    for i, ck in enumerate((clash, {"state_dict": clash, "epoch": 1})):
        pt = tmp_path / f"collide{i}.pt"
        torch.save(ck, pt)
        with pytest.raises(ConvertError, match="named 'a.b'"):
            convert(str(pt), str(out), trust_pickle=True)
        assert not out.exists()
    assert sorted(os.listdir(tmp_path)) == ["collide0.pt", "collide1.pt"]


def test_convert_refuses_to_write_over_its_input(tmp_path, capsys):
    """OUT naming IN's file (the same path, another spelling of it, a hard
    link, a symlink) is refused, as wcachectl convert refuses it, and the
    checkpoint is left as it was (rev113 #2: it was replaced by its
    model's tensors, optimizer state and epoch gone)."""
    from wcache.convert import main
    ck = tmp_path / "ckpt.pt"
    torch.save({"model": {"w": torch.ones(2)}, "optimizer": {"state": {}}, "epoch": 3}, ck)
    before = ck.read_bytes()
    os.link(ck, tmp_path / "hard.pt")
    os.symlink(ck, tmp_path / "sym.pt")
    pairs = [(ck, ck), (ck, tmp_path / "." / "ckpt.pt"), (ck, tmp_path / "hard.pt"),
             (ck, tmp_path / "sym.pt"), (tmp_path / "sym.pt", ck)]
    for src, dst in pairs:
        status, err = main(["--trust-pickle", str(src), str(dst)]), capsys.readouterr().err
        assert status == 1, (src, dst, err)
        assert f"{dst}: the output is the input {src}" in err, (src, dst, err)
        assert ck.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt", "hard.pt", "sym.pt"]
    assert main(["--trust-pickle", str(ck), str(tmp_path / "ckpt.safetensors")]) == 0


def test_convert_refuses_a_tensor_named_metadata(tmp_path, capsys):
    """"__metadata__" is the header's metadata key: a tensor of that name
    is refused, as wcachectl convert refuses it (rev113 #6: exit 0 and a
    file no reader opens)."""
    from wcache.convert import main
    pt = tmp_path / "md.pt"
    torch.save({"__metadata__": torch.ones(2), "w": torch.zeros(1)}, pt)
    out = tmp_path / "md.safetensors"
    status, err = main(["--trust-pickle", str(pt), str(out)]), capsys.readouterr().err
    assert status == 1, err
    assert "'__metadata__' cannot be written to safetensors (the name is reserved)" in err
    assert sorted(os.listdir(tmp_path)) == ["md.pt"]


# Runs python3 -m wcache.convert's main() with its write stalled once the
# temporary file holds the header: writes b"x" to the fd argv[3] then, and
# sleeps until a signal ends it.
STALLED_CONVERT = r"""
import os, signal, sys, time
# as a shell starts a command (the test runner may ignore SIGHUP)
signal.signal(signal.SIGHUP, signal.SIG_DFL)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
signal.signal(signal.SIGINT, signal.default_int_handler)
import wcache._serialize as ser
from wcache.convert import main
write_all = ser._write_all
def stalled(f, chunks):
    write_all(f, chunks[:1])
    os.write(int(sys.argv[3]), b"x")
    time.sleep(120)
ser._write_all = stalled
sys.exit(main(["--trust-pickle"] + sys.argv[1:3]))
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_convert_ended_by_a_signal_leaves_no_temporary(tmp_path, sig):
    """SIGTERM, SIGHUP (and SIGINT) during the write remove the temporary
    file, and the command still ends by that signal, as wcachectl convert
    does (rev113 #5: SIGTERM and SIGHUP left .OUT.*.tmp behind)."""
    pt = tmp_path / "m.pt"
    torch.save({"w": torch.zeros(64)}, pt)
    out = tmp_path / "m.safetensors"
    rfd, wfd = os.pipe()
    p = subprocess.Popen([sys.executable, "-c", STALLED_CONVERT, str(pt), str(out), str(wfd)],
                         pass_fds=(wfd,), env=dict(os.environ, PYTHONPATH=PYDIR),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    os.close(wfd)
    try:
        ready, _, _ = select.select([rfd], [], [], 120)
        assert ready and os.read(rfd, 1) == b"x", p.communicate(timeout=60)
        assert [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]  # it is there
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    finally:
        os.close(rfd)
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == -sig, err
    assert "Traceback" not in err, err
    assert sorted(os.listdir(tmp_path)) == ["m.pt"]


def test_state_dict_into_module(tmp_path, no_daemon):
    """A module takes wcache tensors as its parameters, and inference works."""
    net = torch.nn.Linear(8, 4)
    pt = tmp_path / "lin.pt"
    torch.save(net.state_dict(), pt)
    out = tmp_path / "lin.safetensors"
    convert(str(pt), str(out), trust_pickle=True)
    x = torch.randn(2, 8)
    with wcache.safe_open(str(out)) as f:
        other = torch.nn.Linear(8, 4)
        other.load_state_dict({k: f.get_tensor(k) for k in f.keys()})
        assert torch.equal(other(x), net(x))
        # zero-copy parameters: wrap the views directly
        with torch.no_grad():
            w = torch.nn.Parameter(f.get_tensor("weight"), requires_grad=False)
            assert torch.equal(torch.nn.functional.linear(x, w, f.get_tensor("bias")), net(x))
    assert np.isfinite(w.numpy()).all()   # still valid after the with block


def test_convert_names_what_src_is_before_refusing_for_the_torch_version(tmp_path, capsys,
                                                                          monkeypatch):
    """A missing path, a directory, a FIFO, a text or GGUF file is named as
    such in one line, with or without --trust-pickle: on torch before 2.6
    (Debian 12's 1.13) each was refused with "pass --trust-pickle to convert
    it anyway", and with it a missing file gave Python's "[Errno 2] ..."
    (review rev223 M2). Real checkpoints (torch.save's zip and legacy
    formats) are still refused without --trust-pickle there, and convert
    with it."""
    from wcache.convert import main
    monkeypatch.setattr(torch, "__version__", "1.13.0a0")
    (tmp_path / "dir").mkdir()
    (tmp_path / "notes.txt").write_text("root:x:0:0\n")
    (tmp_path / "m.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(24))
    os.mkfifo(tmp_path / "fifo")
    cases = {"missing.pt": "No such file or directory", "dir": "is a directory",
             "fifo": "is a FIFO", "notes.txt": "not a PyTorch checkpoint: a text file",
             "m.gguf": "not a PyTorch checkpoint: a GGUF file"}
    out = tmp_path / "out.safetensors"
    for name, reason in cases.items():
        src = tmp_path / name
        for opts in ([], ["--trust-pickle"]):
            status, err = main(opts + [str(src), str(out)]), capsys.readouterr().err
            assert status == 1, (name, opts, err)
            assert f"wcache.convert: {src}: {reason}" in err, (name, opts, err)
            assert "pass --trust-pickle" not in err and "Errno" not in err, (name, opts, err)
            assert "CVE" not in err and len(err.splitlines()) == 1, (name, opts, err)
            assert not out.exists()
    for i, zipped in enumerate((True, False)):
        pt = tmp_path / f"m{i}.pt"
        torch.save({"w": torch.ones(3)}, pt, _use_new_zipfile_serialization=zipped)
        assert main([str(pt), str(out)]) == 1
        assert "pass --trust-pickle" in capsys.readouterr().err
        assert main(["--trust-pickle", str(pt), str(out)]) == 0
        assert "CVE-2025-32434" in capsys.readouterr().err
        with wcache.open_file(out) as m:
            assert m.torch("w").tolist() == [1.0, 1.0, 1.0]
        out.unlink()
