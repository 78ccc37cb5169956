"""wcache against what safetensors 0.8 (huggingface/safetensors at 24b0b28)
documents for the torch versions of a GPU host today (torch 2.11): the
checks a drop-in needs there that torch 1.13, this host's, cannot make by
itself (review notes/reviews/rev170.md).

FP4: safetensors 0.8 gives an F4 tensor to torch >= 2.8 as
``torch.float4_e2m1fn_x2`` (two values per byte) with the header's last
dimension halved (bindings/python/src/lib.rs, get_tensor and
torch_storage_shape: "F4 packs two elements per byte, so the `torch.empty`
shape halves the last dim relative to the logical shape recorded in the
safetensors header"). Upstream's own test, test_pt_comparison.py
test_odd_dtype_fp4:

    test2 = torch.empty(2, 2, device="cpu", dtype=torch.float4_e2m1fn_x2)
    save_file({"test1": test1, "test2": test2}, local)
    reloaded = load_file(local)
    self.assertEqual(reloaded["test2"].dtype, torch.float4_e2m1fn_x2)

A torch without the type (1.13 here) gets it as a stand-in: torch.uint8
put in its place for the test, so the same code path runs; with torch 2.8
or later the real type is used.
"""
import pytest
import torch

import wcache
import wcache.torch
from wcache import _device
from wcache._device import CpuBackend, to_device

from pyhelpers import write_safetensors

F4 = "float4_e2m1fn_x2"


@pytest.fixture
def float4(monkeypatch):
    """torch's float4_e2m1fn_x2, or torch.uint8 standing in for it (one
    byte an element, as the packed type) where this torch has none."""
    if not hasattr(torch, F4):
        monkeypatch.setattr(torch, F4, torch.uint8, raising=False)
    return getattr(torch, F4)


def write(path, tensors):
    """A safetensors file of (name, dtype, shape, data) in that order; its path."""
    write_safetensors(path, tensors)
    return str(path)


def as_bytes(t):
    return bytes(t.contiguous().view(torch.uint8).flatten().tolist())


# What upstream's test_odd_dtype_fp4 writes for test2: a (2, 2) float4_e2m1fn_x2
# tensor, whose header shape is [2, 4] (save_file doubles the last dimension).
PACKED = bytes([0x21, 0x43, 0x65, 0x87])


def test_f4_loads_as_float4_e2m1fn_x2_with_the_last_dimension_halved(tmp_path, float4):
    """Upstream test_odd_dtype_fp4's load, through load_file, safe_open's
    get_tensor and get_tensors: dtype float4_e2m1fn_x2, shape (2, 2), the
    file's bytes. get_slice's get_shape() is the header's (logical) shape, as
    upstream's PySafeSlice.get_shape returns info.shape; get_dtype() "F4"
    (Dtype's Display); its indexing is wcache's own (see below)."""
    tensors = [("pad", "U8", (3,), b"\x01\x02\x03"), ("test2", "F4", (2, 4), PACKED),
               ("cube", "F4", (2, 1, 6), bytes(range(6)))]
    if hasattr(torch, "float8_e8m0fnu"):  # upstream's test1 (torch 2.7)
        tensors.append(("test1", "F8_E8M0", (1,), b"\x7f"))
    path = write(tmp_path / "fp4.safetensors", tensors)
    reloaded = wcache.torch.load_file(path)
    assert reloaded["test2"].dtype == float4
    assert tuple(reloaded["test2"].shape) == (2, 2)
    assert as_bytes(reloaded["test2"]) == PACKED
    assert tuple(reloaded["cube"].shape) == (2, 1, 3)
    assert as_bytes(reloaded["cube"]) == bytes(range(6))
    if hasattr(torch, "float8_e8m0fnu"):
        assert reloaded["test1"].dtype == torch.float8_e8m0fnu
    with wcache.safe_open(path, framework="pt") as f:
        t = f.get_tensor("test2")
        assert (t.dtype, tuple(t.shape), as_bytes(t)) == (float4, (2, 2), PACKED)
        assert tuple(f.get_tensors()["test2"].shape) == (2, 2)
        s = f.get_slice("test2")
        assert s.get_shape() == [2, 4]
        assert s.get_dtype() == "F4"
        # transformers 5 materialises every tensor as get_slice(k)[...]. Here
        # wcache differs: upstream's PySafeSlice.__getitem__ for "pt" views the
        # bytes as float4_e2m1fn_x2 and reshapes them to the header's shape
        # (lib.rs:1630-1633), which has twice as many values as there are
        # elements, and raises torch's RuntimeError; wcache indexes
        # get_tensor's tensor, so a slice is a part of what get_tensor gives.
        whole = s[...]
        assert (whole.dtype, tuple(whole.shape), as_bytes(whole)) == (float4, (2, 2), PACKED)
        assert as_bytes(s[1:]) == PACKED[2:]


def test_f4_with_an_odd_last_dimension_is_upstreams_error(tmp_path, float4):
    """lib.rs get_tensor: an F4 tensor whose last dimension is odd has no
    torch shape: SafetensorError("f4_x2 dtype requires that the last dim be
    divisible by 2 in torch: got [2, 3]")."""
    path = write(tmp_path / "odd.safetensors", [("odd", "F4", (2, 3), b"\x00\x11\x22")])
    with wcache.safe_open(path, framework="pt") as f:
        with pytest.raises(wcache.SafetensorError,
                           match=r"^f4_x2 dtype requires that the last dim be divisible by 2 "
                                 r"in torch: got \[2, 3\]$"):
            f.get_tensor("odd")
        assert f.get_slice("odd").get_shape() == [2, 3]


def test_f4_copied_to_a_device_has_the_packed_shape(tmp_path, float4):
    """safe_open(device=...) and load_file(device=...) copy through the
    batched engine (wcache/_device.py): an F4 tensor arrives as on the CPU,
    float4_e2m1fn_x2 of the halved shape (upstream's test_mps_fp4: "The MPS
    loader must halve the last dim before calling torch.empty")."""
    path = write(tmp_path / "fp4.safetensors",
                 [("a", "F32", (4,), bytes(range(16))), ("test2", "F4", (2, 4), PACKED),
                  ("none", "F4", (0, 4), b"")])
    model = wcache.open_file(path)
    out = to_device(model, model.offset_keys(), torch.device("cpu"), model.torch,
                    backend=CpuBackend(), mode="auto", small=0)
    assert _device.last_load[0].path == "register"
    assert (out["test2"].dtype, tuple(out["test2"].shape)) == (float4, (2, 2))
    assert as_bytes(out["test2"]) == PACKED
    assert (out["none"].dtype, tuple(out["none"].shape)) == (float4, (0, 2))
    assert as_bytes(out["a"]) == bytes(range(16))
    model.close()
