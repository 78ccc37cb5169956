"""Edges of wcache as a drop-in for safetensors found by review rev176:
values of derived() built from lazily conjugated / negated torch views, a
served model's name against a worker's own file of that name, spellings
wcached cannot take, metadata() of a renamed-over file, what the writers
refuse, install()'s save_model, the .pth hook's cost and convert's pickle
gate."""
import contextlib
import os
import subprocess
import sys

import pytest

import wcache
from pyhelpers import PYDIR, Daemon, write_safetensors

HERE = os.path.dirname(os.path.abspath(__file__))


@contextlib.contextmanager
def serving(tmp_path, monkeypatch, models):
    """A wcached serving models (pyhelpers.Daemon's form) for the block,
    $WCACHE_SOCKET pointing at it and no connection kept from before."""
    import wcache._safe_open as so
    d = Daemon(tmp_path, models).start()
    monkeypatch.setenv("WCACHE_SOCKET", d.socket)
    so._shared = None
    try:
        yield d
    finally:
        so._shared = None
        assert d.stop() == 0, d.read_log()


@pytest.fixture
def derive_daemon(tmp_path, model_path, monkeypatch):
    """wcached serving model_path as "small" with derived artifacts."""
    with serving(tmp_path, monkeypatch, {"small": (model_path, {"derive": "yes"})}) as d:
        yield d


def test_derived_publishes_conj_and_neg_views_resolved(derive_daemon):
    """x.conj() is contiguous but its storage holds x: the artifact must hold
    conj(x), as the local fallback returns (rev176 F2)."""
    import torch

    def build(src):
        c = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
        return {"conj": c.conj(), "neg": c.conj().imag,
                "negc": torch.tensor([1 + 2j], dtype=torch.complex64).conj()._neg_view()
                if hasattr(torch.Tensor, "_neg_view") else c.conj().resolve_conj()}
    want = {k: v.resolve_conj().resolve_neg().clone() for k, v in build(None).items()}
    got = wcache.derived("small", "conj-v1", build)
    assert sorted(got) == sorted(want)
    for k in want:
        assert torch.equal(got[k], want[k]), (k, got[k].tolist(), want[k].tolist())
    # and an attach of the published artifact reads the same
    again = wcache.derived("small", "conj-v1", lambda src: pytest.fail("built twice"))
    for k in want:
        assert torch.equal(again[k], want[k]), k


def test_existing_file_wins_over_a_served_name(tmp_path, model_path, monkeypatch):
    """safe_open("m1") with the worker's own ./m1 opens that file, not the
    model wcached serves under the name "m1" (rev176 F1); the name is still
    asked where no such file exists, and a relative path of the served file
    itself still attaches."""
    import torch
    from wcache.torch import load_file, save_file
    with serving(tmp_path, monkeypatch, {"m1": model_path}):
        work = tmp_path / "work"
        work.mkdir()
        monkeypatch.chdir(work)
        with wcache.safe_open("m1", framework="pt") as f:
            assert f.model.source == "wcached"  # no ./m1: the name
        save_file({"mine": torch.full((2,), 42.0)}, "m1")
        with wcache.safe_open("m1", framework="pt") as f:
            assert f.model.source == "file"
            assert f.keys() == ["mine"]
        assert list(load_file("m1")) == ["mine"]
        monkeypatch.chdir(os.path.dirname(model_path))
        with wcache.safe_open(os.path.basename(model_path), framework="pt") as f:
            assert f.model.source == "wcached"  # the served file, by its path


def test_path_wcached_cannot_take_is_not_served(tmp_path, daemon, monkeypatch):
    """A file whose path is over wcached's 1,024-byte limit opens while
    wcached runs, as it does without one, and safe_open("") raises
    FileNotFoundError as upstream does (rev176 F7): neither can be served,
    so neither is asked."""
    import torch
    from wcache.torch import load_file, save_file
    d = tmp_path.joinpath(*(["d" * 200] * 5))
    d.mkdir(parents=True)
    path = str(d / "model.safetensors")
    assert len(path.encode()) > 1024
    save_file({"w": torch.ones(2)}, path)
    assert torch.equal(load_file(path)["w"], torch.ones(2))
    with wcache.safe_open(path, framework="pt") as f:
        assert f.model.source == "file"
    monkeypatch.chdir(d)
    assert list(load_file("model.safetensors")) == ["w"]
    with pytest.warns(RuntimeWarning, match="not shared"):
        got = wcache.derived(path, "long-v1", lambda src: {"w2": src["w"] * 2})
    assert torch.equal(got["w2"], torch.full((2,), 2.0))
    with pytest.raises(FileNotFoundError):
        wcache.safe_open("", framework="pt")
    with pytest.raises(FileNotFoundError):
        load_file("")
    with pytest.raises(wcache.ModelNotFound, match="1 to 1024 bytes"):
        wcache.connect().attach("x" * 1025)


@pytest.mark.parametrize("meta_before, meta_after", [({}, None), (None, {})])
def test_metadata_of_file_without_entries_is_the_opened_files(tmp_path, no_daemon,
                                                              meta_before, meta_after):
    """metadata() answers {} or None for the file the handle opened, read
    once at open, not for whatever is at the path at each call (rev176 F5)."""
    path = str(tmp_path / "m.safetensors")
    write_safetensors(path, [("a", "U8", (1,), b"\x07")], metadata=meta_before)
    f = wcache.safe_open(path, framework="np")
    assert f.metadata() == meta_before
    write_safetensors(path + ".new", [("a", "U8", (1,), b"\x08")], metadata=meta_after)
    os.rename(path + ".new", path)
    assert f.metadata() == meta_before
    assert f.get_tensor("a").tolist() == [7]
    os.unlink(path)
    assert f.metadata() == meta_before
    f.close()


@pytest.mark.parametrize("tensors, metadata, words", [
    ({"w": None}, {"note": "a\0b"}, "value contains a NUL"),
    ({"w": None}, {"a\0b": "x"}, "key contains a NUL"),
    ({"a\0b": None}, None, "name contains a NUL"),
    ({"": None}, None, "an empty name"),
    ({"x" * 4097: None}, None, "name of 4097 bytes is longer than 4096"),
])
def test_writers_refuse_what_wcache_cannot_read(tmp_path, no_daemon, tensors, metadata, words):
    """save, save_file and serialize refuse NUL in metadata and NUL, empty or
    over-long tensor names, which every wcache reader refuses, rather than
    write a file wcache then cannot read (rev176 F8)."""
    import numpy as np
    import torch
    import wcache.numpy
    import wcache.torch
    path = tmp_path / "x.safetensors"
    ts = {k: torch.ones(2) for k in tensors}
    arrays = {k: np.ones(2, dtype="<f4") for k in tensors}
    specs = {k: {"dtype": "float32", "shape": [2], "data": b"\0" * 8} for k in tensors}
    for write in (lambda: wcache.torch.save(ts, metadata=metadata),
                  lambda: wcache.torch.save_file(ts, path, metadata=metadata),
                  lambda: wcache.numpy.save(arrays, metadata=metadata),
                  lambda: wcache.numpy.save_file(arrays, path, metadata=metadata),
                  lambda: wcache.serialize(specs, metadata=metadata),
                  lambda: wcache.serialize_file(specs, path, metadata=metadata)):
        with pytest.raises(wcache.SafetensorError, match=f"Error while serializing: .*{words}"):
            write()
        assert not path.exists()


def run_standin(code, env_extra, tmp_path):
    """code in a fresh interpreter that finds the stand-in safetensors
    package (tests/python/standin) and this tree's wcache."""
    env = dict(os.environ, **env_extra)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "standin"), PYDIR,
                                         env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, cwd=str(tmp_path), timeout=120)


def test_install_patches_save_model(tmp_path, no_daemon):
    """Under install(), safetensors.torch.save_model is wcache's: it saves a
    model whose tied weights are tensors wcache loaded (sharing one storage
    per dtype and file, as no upstream-loaded tensors do), where upstream's
    refuses ("None is covering the entire storage"; rev176 F4)."""
    from wcache.torch import save_file
    import torch
    path = tmp_path / "tied.safetensors"
    save_file({"embed.weight": torch.arange(6.0).reshape(3, 2),
               "norm.weight": torch.ones(2)}, path)
    code = f"""
import torch, wcache
import safetensors.torch as st
def upstream(*args, **kwargs):
    raise AssertionError("upstream save_model called")
st.save_model = st._remove_duplicate_names = upstream
wcache.install()
loaded = st.load_file({str(path)!r})
m = torch.nn.Module()
m.embed = torch.nn.Module(); m.lm_head = torch.nn.Module(); m.norm = torch.nn.Module()
m.embed.weight = torch.nn.Parameter(loaded["embed.weight"], requires_grad=False)
m.lm_head.weight = m.embed.weight  # tied
m.norm.weight = torch.nn.Parameter(loaded["norm.weight"], requires_grad=False)
assert st._remove_duplicate_names(m.state_dict()) == {{"embed.weight": ["lm_head.weight"]}}
out = {str(tmp_path / "out.safetensors")!r}
st.save_model(m, out)
with wcache.safe_open(out, framework="pt") as f:
    assert f.keys() == ["embed.weight", "norm.weight"], f.keys()
    assert f.metadata() == {{"lm_head.weight": "embed.weight"}}
    assert torch.equal(f.get_tensor("embed.weight"), loaded["embed.weight"])
wcache.uninstall()
assert st.save_model is upstream and st._remove_duplicate_names is upstream
print("saved")
"""
    r = run_standin(code, {}, tmp_path)
    assert r.returncode == 0 and "saved" in r.stdout, r.stdout + r.stderr


def test_pth_imports_nothing_of_wcache_until_safetensors(tmp_path, no_daemon):
    """With WCACHE_SAFETENSORS=1, wcache-safetensors.pth loads only
    wcache/_hook.py: no wcache package, no numpy (0.14 s -> 1.0 s per Python
    start before, and a traceback at each start where numpy could not be
    imported yet, rev176 F6); importing safetensors still patches it."""
    import torch
    from wcache.torch import save_file
    path = tmp_path / "m.safetensors"
    save_file({"w": torch.ones(2)}, path)
    site = tmp_path / "site"
    site.mkdir()
    pth = os.path.join(HERE, "..", "..", "client", "python", "wcache-safetensors.pth")
    (site / "wcache-safetensors.pth").write_bytes(open(pth, "rb").read())
    code = f"""
import site, sys
sys.modules["numpy"] = None   # numpy not importable while site-packages are read
site.addsitedir({str(site)!r})
print(sorted(m for m in sys.modules if m.split(".")[0] in ("wcache", "torch")))
del sys.modules["numpy"]
import safetensors.torch
print(safetensors.torch.load_file({str(path)!r})["w"].tolist())
"""
    r = run_standin(code, {"WCACHE_SAFETENSORS": "1"}, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stderr == "", r.stderr
    assert r.stdout.splitlines() == ["['wcache._hook']", "[1.0, 1.0]"], r.stdout


def test_convert_says_weights_only_is_no_sandbox_before_torch_2_6(tmp_path, capsys,
                                                                   monkeypatch):
    """On torch before 2.6, torch.load(weights_only=True) runs code from a
    crafted file (CVE-2025-32434): wcache.convert says so on stderr for
    every conversion, and not on 2.6 or later (rev176 F3)."""
    import torch
    from wcache.convert import main
    pt = tmp_path / "m.pt"
    torch.save({"w": torch.zeros(2)}, pt)
    out = tmp_path / "m.safetensors"
    for version, warned in (("1.13.0a0", True), ("2.5.1+cu124", True),
                            ("2.6.0", False), ("2.10.0", False), ("10.0", False)):
        monkeypatch.setattr(torch, "__version__", version)
        assert main(["--trust-pickle", str(pt), str(out)]) == 0
        err = capsys.readouterr().err
        assert ("CVE-2025-32434" in err) == warned, (version, err)
        if warned:
            assert f"torch {version}: torch.load(weights_only=True) runs code" in err
            out.unlink()
            assert main([str(pt), str(out)]) == 1  # refused without the opt-in
            assert "refused" in capsys.readouterr().err and not out.exists()


def test_wrong_argument_types_name_the_argument(tmp_path, daemon, model_path):
    """A wrong type is a TypeError whose message names the argument, where
    upstream raises a TypeError too (review rev223 L8): get_tensor(None)
    raised MissingTensor (a KeyError), "File does not contain tensor None";
    get_slice(k)["a"] torch's "new(): invalid data type 'str'";
    connect(timeout="x") "'<' not supported between ... 'str' and 'int'"."""
    import numpy as np
    from wcache import _lib
    for framework in ("pt", "np"):
        with wcache.safe_open(str(model_path), framework=framework) as f:
            name = next(iter(f.keys()))
            for bad in (None, 5, b"x"):
                with pytest.raises(TypeError, match=f"argument 'name': tensor names are str, "
                                   f"not {type(bad).__name__}"):
                    f.get_tensor(bad)
            with pytest.raises(KeyError, match="File does not contain tensor nosuch"):
                f.get_tensor("nosuch")
            if framework == "pt":  # "np" checks indices itself, as upstream's slicer
                with pytest.raises(TypeError, match=rf"get_slice\('{name}'\)\['a'\]: indices "
                                   "are ints, slices, Ellipsis or None"):
                    f.get_slice(name)["a"]
                assert f.get_slice(name)[:1].shape[0] == 1
    if not _lib.has("wc_connect_timeout"):
        return
    for bad in ("x", object(), True, [1]):
        with pytest.raises(TypeError, match=r"timeout=.*: seconds \(a number\), 0 for none"):
            wcache.connect(daemon.socket, timeout=bad)
    with pytest.raises(ValueError, match=r"timeout=nan: seconds, 0 for none"):
        wcache.connect(daemon.socket, timeout=float("nan"))
    for good in (np.float32(2.5), 3, float("inf"), 0):
        with wcache.connect(daemon.socket, timeout=good) as c:
            assert c.attach("small").keys()
            with pytest.raises(TypeError, match="timeout='1': seconds"):
                c.set_timeout("1")
