"""The safetensors element types and their numpy and torch counterparts.

Every spelling client/format/dtype.c knows is listed with its size. numpy types are
given with an explicit little-endian byte order (safetensors data is
little-endian), so values are right on any host. torch types are looked up
by attribute name at run time: a newer torch that has, say,
``torch.float8_e4m3fn`` gets it; torch 1.13 has none of the FP8 types, no
unsigned type wider than 8 bits, and no FP4/FP6, and gets a clear error.

numpy has no bfloat16, float8, float4 or float6. For those, ``numpy()``
raises TypeError (as ``safetensors.safe_open(framework="np")`` does for
bfloat16); ``Model.raw(name)`` gives the bytes, and for BF16 the error
message shows the zero-copy ``uint16`` view of the bit patterns.
"""

# safetensors dtype -> (bits, numpy typestr or None, torch attribute names
# to try in order, numpy typestr of the same width torch can wrap)
DTYPES = {
    "F64": (64, "<f8", ("float64",), "<f8"),
    "F32": (32, "<f4", ("float32",), "<f4"),
    "F16": (16, "<f2", ("float16",), "<f2"),
    "BF16": (16, None, ("bfloat16",), "<i2"),
    "I64": (64, "<i8", ("int64",), "<i8"),
    "I32": (32, "<i4", ("int32",), "<i4"),
    "I16": (16, "<i2", ("int16",), "<i2"),
    "I8": (8, "|i1", ("int8",), "|i1"),
    "U64": (64, "<u8", ("uint64",), "<i8"),
    "U32": (32, "<u4", ("uint32",), "<i4"),
    "U16": (16, "<u2", ("uint16",), "<i2"),
    "U8": (8, "|u1", ("uint8",), "|u1"),
    "BOOL": (8, "|b1", ("bool",), "|b1"),
    "C64": (64, "<c8", ("complex64",), "<c8"),
    "F8_E4M3": (8, None, ("float8_e4m3fn",), "|u1"),
    "F8_E5M2": (8, None, ("float8_e5m2",), "|u1"),
    "F8_E8M0": (8, None, ("float8_e8m0fnu",), "|u1"),
    "F8_E4M3FNUZ": (8, None, ("float8_e4m3fnuz",), "|u1"),
    "F8_E5M2FNUZ": (8, None, ("float8_e5m2fnuz",), "|u1"),
    # Sub-byte types: no torch type holds one value. F4 goes to torch
    # through PACKED (two values an element), never alone.
    "F4": (4, None, (), None),
    "F6_E2M3": (6, None, (), None),
    "F6_E3M2": (6, None, (), None),
}

# torch dtype (by str(), e.g. "torch.bfloat16") -> safetensors spelling, for
# the converter.
TORCH_TO_ST = {
    "torch.float64": "F64", "torch.float32": "F32", "torch.float16": "F16",
    "torch.bfloat16": "BF16", "torch.int64": "I64", "torch.int32": "I32",
    "torch.int16": "I16", "torch.int8": "I8", "torch.uint8": "U8", "torch.bool": "BOOL",
    "torch.complex64": "C64", "torch.uint16": "U16", "torch.uint32": "U32",
    "torch.uint64": "U64", "torch.float8_e4m3fn": "F8_E4M3", "torch.float8_e5m2": "F8_E5M2",
    "torch.float8_e8m0fnu": "F8_E8M0", "torch.float8_e4m3fnuz": "F8_E4M3FNUZ",
    "torch.float8_e5m2fnuz": "F8_E5M2FNUZ",
}


# safetensors dtype -> (torch attribute, values per torch element): the
# packed type safetensors 0.8 gives such a tensor as to torch (F4: torch
# 2.8's float4_e2m1fn_x2, two values a byte), whose torch shape is the
# header's with its last dimension divided by that number (upstream's
# torch_storage_shape in bindings/python/src/lib.rs). Its carrier is a byte.
PACKED = {"F4": ("float4_e2m1fn_x2", 2)}


def packed_torch_type(torch, dtype, shape):
    """(torch dtype, storage shape) of a tensor of a PACKED dtype with header
    shape, or None when this torch has no type for it; ValueError, with
    upstream's message, when its last dimension does not divide."""
    packed = PACKED[dtype]
    t = getattr(torch, packed[0], None)
    if t is None:
        return None
    shape = list(shape)
    if not shape or shape[-1] % packed[1]:
        raise ValueError(f"f4_x2 dtype requires that the last dim be divisible by "
                         f"{packed[1]} in torch: got {shape}")
    shape[-1] //= packed[1]
    return t, tuple(shape)


def numpy_typestr(dtype):
    """numpy typestr for a safetensors dtype, or None."""
    entry = DTYPES.get(dtype)
    return entry[1] if entry else None


def torch_dtype(torch, dtype):
    """The torch dtype object for a safetensors dtype, or None."""
    entry = DTYPES.get(dtype)
    if entry is None:
        return None
    for attr in entry[2]:
        t = getattr(torch, attr, None)
        if t is not None:
            return t
    return None


def carrier_typestr(dtype):
    """A numpy typestr of the same width that torch.from_numpy accepts; the
    torch tensor is then reinterpreted with .view(torch dtype)."""
    entry = DTYPES.get(dtype)
    return entry[3] if entry else None
