"""Every safetensors dtype, read through wcache as raw bytes, numpy and
torch, against the bytes written into the file."""
import os
import random

import numpy as np
import pytest
import torch

import wcache
from pyhelpers import write_safetensors

# dtype -> (bits, numpy typestr or None, torch attribute or None)
TABLE = {
    "F64": (64, "<f8", "float64"), "F32": (32, "<f4", "float32"),
    "F16": (16, "<f2", "float16"), "BF16": (16, None, "bfloat16"),
    "I64": (64, "<i8", "int64"), "I32": (32, "<i4", "int32"), "I16": (16, "<i2", "int16"),
    "I8": (8, "|i1", "int8"), "U64": (64, "<u8", "uint64"), "U32": (32, "<u4", "uint32"),
    "U16": (16, "<u2", "uint16"), "U8": (8, "|u1", "uint8"), "BOOL": (8, "|b1", "bool"),
    "C64": (64, "<c8", "complex64"),
    "F8_E4M3": (8, None, "float8_e4m3fn"), "F8_E5M2": (8, None, "float8_e5m2"),
    "F8_E8M0": (8, None, "float8_e8m0fnu"), "F8_E4M3FNUZ": (8, None, "float8_e4m3fnuz"),
    "F8_E5M2FNUZ": (8, None, "float8_e5m2fnuz"),
    # F4: two values a byte; torch 2.8+ has float4_e2m1fn_x2 (upstream 0.8
    # gives it with the last dimension halved), older torch no type
    "F4": (4, None, "float4_e2m1fn_x2"), "F6_E2M3": (6, None, None), "F6_E3M2": (6, None, None),
}
SHAPES = [(3, 4), (2, 2, 2), (), (0, 5), (8,)]
_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t):
    """t's bit patterns, as an integer tensor of the same element size.
    torch.equal compares floats as numbers, and a NaN equals nothing: the
    random bytes of the FP8 tensors here hold NaN patterns (0x80 is NaN in
    F8_E5M2FNUZ), which a torch with FP8 types (2.1 and later) would call
    different from themselves."""
    if t.is_floating_point() or t.is_complex():
        return t.view(_SAME_SIZE_INT[t.element_size()])
    return t


def payload(dtype, count, rnd):
    bits = TABLE[dtype][0]
    nbytes = count * bits // 8
    if dtype == "BOOL":
        return bytes(rnd.choice((0, 1)) for _ in range(nbytes))
    if dtype in ("F16", "F32", "F64", "C64", "BF16"):
        # finite values: random small numbers through numpy/torch
        if dtype == "BF16":
            vals = torch.tensor([rnd.uniform(-4, 4) for _ in range(count)],
                                dtype=torch.bfloat16)
            return vals.view(torch.int16).numpy().tobytes()
        typestr = TABLE[dtype][1]
        n = count * (2 if dtype == "C64" else 1)
        return np.array([rnd.uniform(-4, 4) for _ in range(n)],
                        dtype=typestr.replace("c8", "f4")).tobytes()
    return bytes(rnd.randrange(256) for _ in range(nbytes))


@pytest.fixture(scope="module")
def every_dtype(tmp_path_factory):
    rnd = random.Random(5)
    tensors = []
    for dtype, (bits, _np, _t) in TABLE.items():
        for shape in SHAPES:
            count = int(np.prod(shape)) if shape else 1
            if count * bits % 8:
                continue
            name = f"{dtype}.{'x'.join(map(str, shape)) or 'scalar'}"
            tensors.append((name, dtype, shape, payload(dtype, count, rnd)))
    path = tmp_path_factory.mktemp("dtypes") / "every.safetensors"
    where = write_safetensors(path, tensors, metadata={"what": "every dtype"})
    return str(path), tensors, where


def open_model(path, table):
    """Opens path; with table, reads the whole tensor table first (keys()),
    which switches views to slices of one array over all tensor data."""
    m = wcache.open_file(path)
    if table:
        m.keys()
    return m


@pytest.mark.parametrize("table", [False, True])
def test_raw_bytes_match_the_file(every_dtype, table):
    path, tensors, where = every_dtype
    with open(path, "rb") as f:
        blob = f.read()
    with open_model(path, table) as m:
        assert len(m) == len(tensors)
        for name, dtype, shape, data in tensors:
            info = m.info(name)
            assert (info.dtype, info.shape, info.nbytes) == (dtype, tuple(shape), len(data))
            raw = m.raw(name)
            assert raw.dtype == np.uint8 and raw.shape == (len(data),)
            assert raw.tobytes() == data
            off = where[name][0]
            assert blob[off:off + len(data)] == data


@pytest.mark.parametrize("table", [False, True])
@pytest.mark.parametrize("dtype", sorted(TABLE))
def test_numpy_every_dtype(every_dtype, dtype, table):
    path, tensors, _ = every_dtype
    typestr = TABLE[dtype][1]
    with open_model(path, table) as m:
        for name, dt, shape, data in tensors:
            if dt != dtype:
                continue
            if typestr is None:
                with pytest.raises(TypeError) as e:
                    m.numpy(name)
                assert dtype in str(e.value) and name in str(e.value)
                if dtype == "BF16":
                    assert "numpy has no bfloat16" in str(e.value)
                    bits = m.raw(name).view(np.uint16).reshape(shape)
                    assert bits.tobytes() == data
                continue
            a = m.numpy(name)
            assert a.dtype == np.dtype(typestr)
            assert a.shape == tuple(shape)
            assert a.tobytes() == data
            expect = np.frombuffer(data, dtype=typestr).reshape(shape)
            assert np.array_equal(a, expect, equal_nan=a.dtype.kind in "fc")
            assert not a.flags.writeable
            if a.size:
                # zero-copy: the array's memory is the mapping's
                assert a.__array_interface__["data"][0] == m.info(name).data


@pytest.mark.parametrize("table", [False, True])
@pytest.mark.parametrize("dtype", sorted(TABLE))
def test_torch_every_dtype(every_dtype, dtype, table):
    path, tensors, _ = every_dtype
    attr = TABLE[dtype][2]
    tdtype = getattr(torch, attr, None) if attr else None
    with open_model(path, table) as m:
        for name, dt, shape, data in tensors:
            if dt != dtype:
                continue
            if tdtype is None:
                with pytest.raises(TypeError) as e:
                    m.torch(name)
                assert dtype in str(e.value) and name in str(e.value)
                assert "torch" in str(e.value)
                continue
            if dtype == "F4":
                # upstream 0.8 (test_pt_comparison.py test_odd_dtype_fp4): the
                # last dimension halved, an odd one refused
                if not shape or shape[-1] % 2:
                    with pytest.raises(Exception, match="divisible by 2"):
                        m.torch(name)
                    continue
                t = m.torch(name)
                assert t.dtype == tdtype
                assert tuple(t.shape) == tuple(shape[:-1]) + (shape[-1] // 2,)
                assert t.view(torch.uint8).reshape(-1).numpy().tobytes() == data
                continue
            t = m.torch(name)
            assert t.dtype == tdtype
            assert tuple(t.shape) == tuple(shape)
            flat = bits(t).reshape(-1)
            if flat.dtype == torch.bool:
                flat = flat.view(torch.uint8)
            got = flat.numpy().tobytes()
            assert got == data
            expect = torch.frombuffer(bytearray(data), dtype=tdtype).reshape(shape) \
                if data else torch.empty(shape, dtype=tdtype)
            assert torch.equal(bits(t), bits(expect))


def test_bits_compare_nan_patterns():
    """bits() is what makes the comparison above exact: two NaNs are never
    torch.equal as numbers, while their bit patterns are compared as such."""
    nans = torch.tensor([0x7E01, 0x7E02], dtype=torch.int16).view(torch.float16)
    assert not torch.equal(nans, nans.clone())
    assert torch.equal(bits(nans), bits(nans.clone()))
    assert not torch.equal(bits(nans[:1]), bits(nans[1:]))


def test_bf16_values(tmp_path):
    values = torch.tensor([[1.0, -2.5, 3.25], [0.0, 1e-3, -65504.0]], dtype=torch.bfloat16)
    path = tmp_path / "bf16.safetensors"
    write_safetensors(path, [("w", "BF16", (2, 3), values.view(torch.int16).numpy().tobytes())])
    with wcache.open_file(path) as m:
        assert torch.equal(m.torch("w"), values)
        assert np.array_equal(m.raw("w").view(np.uint16).reshape(2, 3),
                              values.view(torch.int16).numpy().view(np.uint16))


def test_unaligned_data(tmp_path):
    """safetensors does not promise aligned offsets: a 1-byte tensor first
    puts the next F32 at an odd address."""
    f32 = np.arange(6, dtype="<f4")
    path = tmp_path / "odd.safetensors"
    write_safetensors(path, [("a", "U8", (1,), b"\x07"), ("b", "F32", (2, 3), f32.tobytes())])
    with open_model(path, True) as m:
        assert m.info("b").data % 4 != 0
        assert np.array_equal(m.numpy("b"), f32.reshape(2, 3))
        assert torch.equal(m.torch("b"), torch.from_numpy(f32.reshape(2, 3)))


def test_unknown_torch_types_name_the_dtype(tmp_path):
    path = tmp_path / "f8.safetensors"
    write_safetensors(path, [("q", "F8_E4M3", (4,), bytes(4))])
    with wcache.open_file(path) as m:
        if getattr(torch, "float8_e4m3fn", None) is None:
            with pytest.raises(TypeError, match=r"F8_E4M3.*torch .* has no type"):
                m.torch("q")
        with pytest.raises(TypeError, match="F8_E4M3"):
            m.numpy("q")
        assert m.raw("q").tobytes() == bytes(4)


def test_safe_open_np_bf16_raises_like_safetensors(tmp_path, no_daemon):
    path = tmp_path / "bf.safetensors"
    write_safetensors(path, [("w", "BF16", (2,), bytes(4))])
    with wcache.safe_open(str(path), framework="np") as f:
        with pytest.raises(TypeError, match="bfloat16"):
            f.get_tensor("w")
    assert os.path.exists(path)
