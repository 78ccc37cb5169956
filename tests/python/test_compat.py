"""Upstream safetensors' documented behaviour, asserted against wcache:
file bytes computed here from the format (not by wcache), exception types,
dtypes, shapes, metadata, shared-tensor rules, and wcache.install()."""
import errno
import gc
import json
import os
import shutil
import stat
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

import wcache
import wcache.numpy as wnp
import wcache.torch as wtorch
from pyhelpers import PYDIR, file_mappings, other_thread_before, run_python

HERE = os.path.dirname(os.path.abspath(__file__))


def expected_file(header, data):
    """A safetensors file as upstream's format defines it: u64 length, the
    header padded with spaces to a multiple of 8, then the data."""
    h = header.encode("utf-8")
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def test_upstream_test_vector():
    # upstream's tests/test_simple.py: a 2x2 int32 of zeros
    want = (b'@\x00\x00\x00\x00\x00\x00\x00{"test":{"dtype":"I32","shape":[2,2],'
            b'"data_offsets":[0,16]}}    ' + b"\x00" * 16)
    assert wtorch.save({"test": torch.zeros((2, 2), dtype=torch.int32)}) == want
    assert wnp.save({"test": np.zeros((2, 2), dtype=np.int32)}) == want


def test_order_metadata_and_padding(tmp_path):
    tensors = {"b": torch.tensor([1.0, 2.0]), "a": torch.tensor([7], dtype=torch.int64),
               "c": torch.tensor([1, 2, 3], dtype=torch.uint8),
               "d": torch.tensor([1.0], dtype=torch.bfloat16),
               "é": torch.tensor(True), "z": torch.zeros((0, 2))}
    # descending dtype order of upstream's enum, then name
    header = ('{"__metadata__":{"format":"pt"},'
              '"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},'
              '"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},'
              '"z":{"dtype":"F32","shape":[0,2],"data_offsets":[16,16]},'
              '"d":{"dtype":"BF16","shape":[1],"data_offsets":[16,18]},'
              '"c":{"dtype":"U8","shape":[3],"data_offsets":[18,21]},'
              '"é":{"dtype":"BOOL","shape":[],"data_offsets":[21,22]}}')
    data = struct.pack("<q", 7) + struct.pack("<2f", 1, 2) + b"\x80\x3f" + b"\x01\x02\x03\x01"
    want = expected_file(header, data)
    assert wtorch.save(tensors, metadata={"format": "pt"}) == want
    path = tmp_path / "m.safetensors"
    wtorch.save_file(tensors, path, metadata={"format": "pt"})
    assert path.read_bytes() == want
    # {} is written as an empty object, None leaves __metadata__ out
    assert wtorch.save({"x": torch.zeros(1)}, metadata={}) == expected_file(
        '{"__metadata__":{},"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
        b"\x00" * 4)
    assert wtorch.save({"x": torch.zeros(1)}) == expected_file(
        '{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\x00" * 4)


def test_serialize_and_deserialize():
    spec = {"t": {"dtype": "float32", "shape": [2], "data": struct.pack("<2f", 1, 2)}}
    blob = wcache.serialize(spec)
    assert blob == expected_file('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
                                 struct.pack("<2f", 1, 2))
    out = wcache.deserialize(blob)
    assert out == [("t", {"shape": [2], "dtype": "F32", "data": bytearray(struct.pack(
        "<2f", 1, 2))})]
    with pytest.raises(wcache.SafetensorError):
        wcache.TensorSpec(dtype="nonsense", shape=[1], data_ptr=0, data_len=0)
    with pytest.raises(wcache.SafetensorError):
        wcache.deserialize(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    loaded = wtorch.load(blob)
    assert loaded["t"].dtype == torch.float32 and loaded["t"].tolist() == [1.0, 2.0]
    assert wnp.load(blob)["t"].dtype == np.float32


def test_serialize_dict_form_doubles_the_last_dimension_of_f4():
    """Upstream's prepare (bindings/python/src/lib.rs) doubles a
    float4_e2m1fn_x2 dict's last dimension (two values per byte), as
    TensorSpec does: shape [2, 3] of 6 bytes is recorded as [2, 6] (rev113
    #7: the dict form recorded [2, 3] and refused 6 bytes)."""
    data = bytes(range(6))
    want = expected_file('{"x":{"dtype":"F4","shape":[2,6],"data_offsets":[0,6]}}', data)
    assert wcache.serialize({"x": {"dtype": "float4_e2m1fn_x2", "shape": [2, 3],
                                   "data": data}}) == want
    buf = bytearray(data)
    addr = np.frombuffer(buf, dtype=np.uint8).ctypes.data
    spec = wcache.TensorSpec(dtype="float4_e2m1fn_x2", shape=[2, 3], data_ptr=addr,
                             data_len=6)
    assert wcache.serialize({"x": spec}) == want


@pytest.mark.parametrize("shape", [[2.7], [2.0], ["2"], "2"])
def test_serialize_refuses_a_dimension_that_is_not_an_integer(shape):
    """Upstream extracts the shape as Vec<usize>: a float or a str is a
    TypeError, not truncated or parsed (rev113 #8: [2.7] was written as
    [2]). Integers of other types (numpy's, torch.Size's) are dimensions."""
    with pytest.raises(TypeError):
        wcache.serialize({"x": {"dtype": "uint8", "shape": shape, "data": b"ab"}})
    with pytest.raises(TypeError):
        wcache.TensorSpec(dtype="uint8", shape=shape, data_ptr=0, data_len=2)
    for ok in ([np.int64(2)], torch.Size([2]), (2,)):
        assert wcache.serialize({"x": {"dtype": "uint8", "shape": ok, "data": b"ab"}}) == \
            expected_file('{"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}', b"ab")


@pytest.mark.parametrize("name,code", [("float32", "F32"), ("bfloat16", "BF16"),
                                       ("float8_e5m2fnuz", "F8_E5M2FNUZ"), ("bool", "BOOL"),
                                       ("float4_e2m1fn_x2", "F4")])
def test_tensorspec_dtype_is_the_format_code(name, code):
    """Upstream's TensorSpec.dtype (and repr) is the safetensors format
    code written in the header, "not the Python constructor-style name"
    (__init__.pyi, src/lib.rs getter dtype). Before (rev133 #2) it was the
    name given: 'float32', 'bfloat16'."""
    spec = wcache.TensorSpec(dtype=name, shape=[2, 3], data_ptr=5, data_len=24)
    assert spec.dtype == code
    shape = [2, 6] if code == "F4" else [2, 3]
    assert repr(spec) == f"TensorSpec(dtype='{code}', shape={shape}, data_ptr=5, data_len=24)"


def test_tensorspec_is_frozen():
    """Upstream's TensorSpec is a #[pyclass(frozen)] with getters only:
    assigning or deleting an attribute raises AttributeError. Before
    (rev133 #3) shape, dtype and data_len could be assigned, repr showed
    the new values and serialize wrote the dtype given at construction."""
    data = np.arange(6, dtype=np.float32)
    spec = wcache.TensorSpec(dtype="float32", shape=[2, 3], data_ptr=data.ctypes.data,
                             data_len=24)
    for attr, value in (("dtype", "int8"), ("shape", [6]), ("data_ptr", 0), ("data_len", 6),
                        ("other", 1)):
        with pytest.raises(AttributeError):
            setattr(spec, attr, value)
    with pytest.raises(AttributeError):
        del spec.shape
    spec.shape.append(7)  # a copy, as upstream's getter returns
    assert (spec.dtype, spec.shape, spec.data_len) == ("F32", [2, 3], 24)
    assert wcache.serialize({"x": spec}) == expected_file(
        '{"x":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}', data.tobytes())


def test_tensorspec_copies_are_itself_and_it_does_not_pickle():
    """Frozen, so copy.copy and copy.deepcopy give the same object back;
    pickling is refused as upstream's pyclass refuses it (TypeError: its
    data_ptr is an address in this process). Before (review rev138 #3)
    copying and unpickling raised AttributeError naming an assignment to
    '_st' the caller never made."""
    import copy
    import pickle
    data = np.arange(2, dtype=np.float32)
    spec = wcache.TensorSpec(dtype="float32", shape=[2], data_ptr=data.ctypes.data,
                             data_len=8)
    assert copy.copy(spec) is spec and copy.deepcopy({"x": spec})["x"] is spec
    with pytest.raises(TypeError, match="cannot pickle 'TensorSpec' object"):
        pickle.dumps(spec)


@pytest.mark.parametrize("field,value", [("shape", [-1]), ("shape", [2, 2**64]),
                                         ("data_ptr", -1), ("data_ptr", 2**64),
                                         ("data_len", -1), ("data_len", 2**64)])
def test_tensorspec_takes_unsigned_64_bit_integers(field, value):
    """Upstream's fields are Vec<usize>, u64 and usize: a negative value or
    one of 2**64 or more is refused at construction with pyo3's
    OverflowError. Before (rev133 #3) they were accepted, and data_len=-1
    reached ctypes in serialize (a ValueError)."""
    args = dict(dtype="uint8", shape=[0], data_ptr=0, data_len=0)
    args[field] = value
    with pytest.raises(OverflowError):
        wcache.TensorSpec(**args)
    top = 2**64 - 1  # the largest is taken
    spec = wcache.TensorSpec(dtype="uint8", shape=[0, top], data_ptr=top, data_len=top)
    assert (spec.shape, spec.data_ptr, spec.data_len) == ([0, top], top, top)
    # F4's doubled last dimension must fit too (upstream's checked_mul)
    assert wcache.TensorSpec(dtype="float4_e2m1fn_x2", shape=[2**63 - 1], data_ptr=0,
                             data_len=0).shape == [2**64 - 2]
    with pytest.raises(wcache.SafetensorError, match="overflows usize"):
        wcache.TensorSpec(dtype="float4_e2m1fn_x2", shape=[2**63], data_ptr=0, data_len=0)


def test_a_tensor_named_metadata_is_refused(tmp_path):
    """"__metadata__" is the header's metadata key (upstream's format and
    its JSON schema: a map of strings). Upstream 0.8 writes such a tensor
    anyway, a file none of its readers opens (its issue #849; PR #850, not
    merged, refuses it with a SafetensorError); wcache refuses it as its C
    writer does, with a SafetensorError, and writes nothing (rev113 #6:
    the metadata was dropped and the file unreadable). A longer name is an
    ordinary name."""
    path = tmp_path / "md.safetensors"
    calls = [lambda: wtorch.save_file({"__metadata__": torch.ones(2), "w": torch.zeros(1)},
                                      path, metadata={"format": "pt"}),
             lambda: wtorch.save({"__metadata__": torch.ones(2)}),
             lambda: wnp.save_file({"__metadata__": np.ones(2)}, path),
             lambda: wcache.serialize({"__metadata__": {"dtype": "uint8", "shape": [1],
                                                        "data": b"a"}}, metadata={}),
             lambda: wcache.serialize_file({"__metadata__": {"dtype": "uint8", "shape": [1],
                                                             "data": b"a"}}, path)]
    for call in calls:
        with pytest.raises(wcache.SafetensorError,
                           match="'__metadata__' cannot be written to safetensors "
                                 r"\(the name is reserved\)"):
            call()
        assert os.listdir(tmp_path) == []
    blob = wtorch.save({"__metadata___": torch.ones(2)}, metadata={"format": "pt"})
    assert torch.equal(wtorch.load(blob)["__metadata___"], torch.ones(2))


# Headers whose JSON parses but whose values are not of upstream's types
# (serde: shape Vec<usize>, data_offsets (usize, usize), __metadata__
# HashMap<String, String>): upstream raises SafetensorError for each.
WRONG_TYPES = {
    "offsets of floats": {"t": {"dtype": "U8", "shape": [16], "data_offsets": [0.0, 16.0]}},
    "offsets of bools": {"t": {"dtype": "U8", "shape": [1], "data_offsets": [False, True]}},
    "an offset a string": {"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
                           "b": {"dtype": "U8", "shape": [8], "data_offsets": ["8", 16]}},
    "three offsets": {"t": {"dtype": "U8", "shape": [16], "data_offsets": [0, 8, 16]}},
    "a negative offset": {"t": {"dtype": "U8", "shape": [16], "data_offsets": [-16, 0]}},
    "a shape of floats": {"t": {"dtype": "U8", "shape": [16.0], "data_offsets": [0, 16]}},
    "a negative shape": {"t": {"dtype": "U8", "shape": [-4, -4], "data_offsets": [0, 16]}},
    "a shape of bools": {"t": {"dtype": "U8", "shape": [True], "data_offsets": [0, 1]}},
    "a shape a string": {"t": {"dtype": "U8", "shape": "16", "data_offsets": [0, 16]}},
    "a shape past usize": {"t": {"dtype": "U8", "shape": [1 << 64], "data_offsets": [0, 16]}},
    "a dtype a list": {"t": {"dtype": ["U8"], "shape": [16], "data_offsets": [0, 16]}},
    "a tensor a list": {"t": [1, 2, 3]},
    "metadata a list": {"__metadata__": [1],
                        "t": {"dtype": "U8", "shape": [16], "data_offsets": [0, 16]}},
    "metadata of numbers": {"__metadata__": {"a": 1},
                            "t": {"dtype": "U8", "shape": [16], "data_offsets": [0, 16]}},
}


# What wcache's C parser refuses and upstream accepts (client/python/README.md,
# "Stricter validation").
T = '{"dtype":"U8","shape":[16],"data_offsets":[0,16]}'
STRICTER = {
    "a tensor twice": '{"t":%s,"t":%s}' % (T, T),
    "a field twice": '{"t":{"dtype":"U8","dtype":"U8","shape":[16],"data_offsets":[0,16]}}',
    "a metadata key twice": '{"__metadata__":{"a":"1","a":"2"},"t":%s}' % T,
    "an unknown field": '{"t":{"dtype":"U8","shape":[16],"data_offsets":[0,16],"x":1}}',
    "an empty name": '{"":%s}' % T,
    "a name with NUL": '{"a\\u0000b":%s}' % T,
    "nesting too deep for Python": '{"a":' + "[" * 100000 + "]" * 100000 + "}",
}


def refused_alike(blob, path):
    """Asserts that the bytes blob and a file holding them are refused with
    one message, the file's naming the file and the bytes' naming "bytes":
    the file and the bytes go through one parser."""
    path.write_bytes(blob)
    with pytest.raises(wcache.SafetensorError) as file_error:
        wcache.safe_open(path, framework="np")
    want = str(file_error.value).replace(str(path), "Error while deserializing: bytes", 1)
    assert want != str(file_error.value), file_error.value
    for load in (wcache.deserialize, wtorch.load, wnp.load):
        with pytest.raises(wcache.SafetensorError) as e:
            load(blob)
        assert str(e.value) == want, load


@pytest.mark.parametrize("what", sorted(STRICTER))
def test_what_the_c_parser_refuses_deserialize_refuses(what, tmp_path, no_daemon):
    refused_alike(expected_file(STRICTER[what], bytes(16)), tmp_path / "m.safetensors")


@pytest.mark.parametrize("what", sorted(WRONG_TYPES))
def test_values_of_the_wrong_type_are_safetensor_errors(what, tmp_path, no_daemon):
    refused_alike(expected_file(json.dumps(WRONG_TYPES[what]), bytes(16)),
                  tmp_path / "m.safetensors")


def test_deserialize_reads_any_buffer_in_pieces_in_file_order(monkeypatch):
    """deserialize copies the bytes into its memfd in pieces (os.write
    writes at most 2 GiB at once) from any buffer, and returns every tensor,
    an empty one included, in the order of the data."""
    import wcache._serialize as ser
    spec = {"z": {"dtype": "float32", "shape": [2], "data": struct.pack("<2f", 1, 2)},
            "a": {"dtype": "uint8", "shape": [3], "data": b"abc"},
            "e": {"dtype": "float32", "shape": [0, 4], "data": b""}}
    blob = wcache.serialize(spec, metadata={"k": "v"})
    # serialize's layout: F32 before U8, then by name; "e" (empty) and "z"
    # both start at 0, the empty one first.
    want = [("e", {"shape": [0, 4], "dtype": "F32", "data": bytearray()}),
            ("z", {"shape": [2], "dtype": "F32", "data": bytearray(spec["z"]["data"])}),
            ("a", {"shape": [3], "dtype": "U8", "data": bytearray(b"abc")})]
    monkeypatch.setattr(ser, "_WRITE_CHUNK", 7)
    for buf in (blob, bytearray(blob), memoryview(blob), np.frombuffer(blob, np.uint8)):
        assert wcache.deserialize(buf) == want, type(buf)
    with pytest.raises(wcache.SafetensorError, match="^Error while deserializing: bytes: "):
        wcache.deserialize(blob[:-1])
    with pytest.raises(wcache.SafetensorError, match="is a WEIG file, not safetensors"):
        wcache.deserialize(b"GIEW" + bytes(60))


def test_deserialize_copies_each_tensor_from_its_offset():
    """The parser reads a copy of the header only (the tensors' bytes are a
    hole in its memfd): every tensor's bytes still come from its own place
    in the buffer, with a header longer than the parser's first read."""
    rng = np.random.default_rng(5)
    spec = {f"t{i:04d}.{'x' * 40}": {"dtype": "uint8", "shape": [int(k)],
                                     "data": rng.integers(0, 256, int(k), np.uint8).tobytes()}
            for i, k in enumerate(rng.integers(0, 300, 2000))}
    blob = wcache.serialize(spec)
    assert struct.unpack("<Q", blob[:8])[0] > 64 << 10
    got = dict(wcache.deserialize(blob))
    assert got.keys() == spec.keys()
    for name, t in got.items():
        assert bytes(t["data"]) == spec[name]["data"] and t["shape"] == spec[name]["shape"]


def test_mutated_headers_are_safetensor_errors_or_whole_tensors():
    """deserialize, fuzzed through Python: a valid file's header with values
    swapped for ones of other types, and with bytes changed; every outcome
    is a SafetensorError or tensors that fit their bytes."""
    import random
    rng = random.Random(23)
    header = {"__metadata__": {"format": "pt"},
              "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
              "b": {"dtype": "U8", "shape": [4], "data_offsets": [16, 20]},
              "c": {"dtype": "BF16", "shape": [], "data_offsets": [20, 22]}}
    odd = [-1, 0, 1, 2, 4, 16, 22, 1 << 64, 1.0, 2.5, True, None, "", "2", "F32", [], [2],
           [2, 2], [0, 16], {}, {"x": "y"}, [[1]]]
    bits = {"F32": 32, "U8": 8, "BF16": 16, "F64": 64, "BOOL": 8}
    outcomes = {"error": 0, "tensors": 0}
    for i in range(4000):
        h = json.loads(json.dumps(header))
        for _ in range(rng.randint(1, 3)):
            name = rng.choice(list(h))
            if name == "__metadata__" or rng.random() < 0.1:
                h[name] = rng.choice(odd)
            else:
                info = h[name] if isinstance(h[name], dict) else {}
                key = rng.choice(["dtype", "shape", "data_offsets"])
                if rng.random() < 0.5 and isinstance(info.get(key), list) and info[key]:
                    info[key][rng.randrange(len(info[key]))] = rng.choice(odd)
                else:
                    info[key] = rng.choice(odd + list(bits))
                h[name] = info
        raw = bytearray(json.dumps(h).encode())
        if i % 3 == 0:
            for _ in range(rng.randint(1, 4)):
                raw[rng.randrange(len(raw))] = rng.randrange(256)
        blob = struct.pack("<Q", len(raw)) + bytes(raw) + bytes(22)
        try:
            out = wcache.deserialize(blob)
        except wcache.SafetensorError:
            outcomes["error"] += 1
            continue
        outcomes["tensors"] += 1
        for name, t in out:
            assert all(type(x) is int and x >= 0 for x in t["shape"]), (bytes(raw), t)
            count = 1
            for x in t["shape"]:
                count *= x
            assert count * bits[t["dtype"]] == 8 * len(t["data"]), (bytes(raw), name, t)
    assert outcomes["error"] > 1000 and outcomes["tensors"] > 30, outcomes


def test_load_maps_every_dtype_this_torch_has(monkeypatch):
    """wtorch.load takes its torch types from the table Model.torch uses, so
    a dtype that only a newer torch has (F8_E8M0: float8_e8m0fnu, torch 2.7)
    loads there; a torch without it (1.13 here) gets the error naming it."""
    blob = wcache.serialize({"s": {"dtype": "float8_e8m0fnu", "shape": [2],
                                   "data": b"\x7f\x80"}})
    monkeypatch.setattr(torch, "float8_e8m0fnu", torch.uint8, raising=False)  # stands in
    got = wtorch.load(blob)["s"]
    assert got.dtype == torch.uint8 and got.tolist() == [0x7F, 0x80]
    monkeypatch.delattr(torch, "float8_e8m0fnu")
    with pytest.raises(wcache.SafetensorError, match="has no type for F8_E8M0"):
        wtorch.load(blob)


def test_save_file_is_atomic(tmp_path):
    path = tmp_path / "m.safetensors"
    wtorch.save_file({"x": torch.zeros(4)}, path)
    old = open(path, "rb")
    wtorch.save_file({"x": torch.ones(4)}, path)
    assert old.read() == wtorch.save({"x": torch.zeros(4)})  # old inode untouched
    old.close()
    assert os.listdir(tmp_path) == ["m.safetensors"]  # no temporary left
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask



def test_save_file_writes_into_what_is_not_a_file(tmp_path):
    """Upstream opens the path and writes: into /dev/null, a FIFO, a
    terminal. Renaming a temporary file over such a node would replace it
    (as root: /dev/null becomes a regular file) or fail where this user may
    not write the directory. A FIFO here stands for them all (tests must
    not touch /dev/null)."""
    import threading
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []

    def read():
        with open(fifo, "rb") as f:
            got.append(f.read())
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    tensors = {"x": torch.arange(6.0)}
    wtorch.save_file(tensors, fifo)
    reader.join(10)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode), "the FIFO was replaced by a file"
    assert got == [wtorch.save(tensors)]
    assert sorted(os.listdir(tmp_path)) == ["pipe"]


def test_save_file_into_a_node_replaced_by_a_file_meanwhile(tmp_path, monkeypatch):
    """A path that was a FIFO or a device when looked at, and is a regular
    file by the time it is opened, is not truncated and written in place
    (the write is no longer atomic then): refused with ESTALE, as
    client/lib/outfile.c refuses it. The look is made to see a FIFO."""
    import errno
    from wcache import _serialize
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"precious")
    monkeypatch.setattr(_serialize, "_replaced", lambda name: os.stat(fifo))
    with pytest.raises(OSError) as e:
        wtorch.save_file({"x": torch.arange(6.0)}, path)
    assert e.value.errno == errno.ESTALE
    assert path.read_bytes() == b"precious"


@pytest.mark.parametrize("save", ["torch", "numpy", "serialize_file"])
def test_save_file_keeps_mode_owner_and_symlink(tmp_path, save):
    """Upstream truncates and writes in place: the file keeps its mode and
    owner, and a symlink (a Hugging Face snapshot's link into blobs/) stays
    a link whose target gets the new bytes. The rename must keep them too."""
    def write(path, value):
        if save == "torch":
            wtorch.save_file({"x": torch.full((4,), float(value))}, path)
        elif save == "numpy":
            wnp.save_file({"x": np.full(4, value, np.float32)}, path)
        else:
            wcache.serialize_file({"x": {"dtype": "float32", "shape": [4],
                                         "data": np.full(4, value, np.float32).tobytes()}},
                                  path)

    def value(path):
        return wnp.load(open(path, "rb").read())["x"][0]

    secret = tmp_path / "secret.safetensors"
    write(secret, 0)
    os.chmod(secret, 0o600)
    if os.geteuid() == 0:
        os.chown(secret, 4321, 4321)
    write(secret, 1)
    st = os.stat(secret)
    assert (st.st_mode & 0o7777, value(secret)) == (0o600, 1)
    if os.geteuid() == 0:
        assert (st.st_uid, st.st_gid) == (4321, 4321)
    # A directory in the way: upstream's I/O error, nothing left beside it.
    (tmp_path / "adir").mkdir()
    with pytest.raises(wcache.SafetensorError, match="adir: Is a directory"):
        write(tmp_path / "adir", 5)
    assert sorted(os.listdir(tmp_path)) == ["adir", "secret.safetensors"]
    # ... raised before a byte is produced, not at the rename after them all.
    from wcache import _serialize
    produced = []

    def chunks():
        produced.append(1)
        yield b"x"
    with pytest.raises(IsADirectoryError):
        _serialize.write_atomically(tmp_path / "adir", chunks())
    assert produced == []
    # Set-id bits go, as a write in place would clear them.
    os.chmod(secret, 0o6750)
    write(secret, 4)
    assert (os.stat(secret).st_mode & 0o7777, value(secret)) == (0o750, 4)

    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots"
    blobs.mkdir()
    snap.mkdir()
    write(blobs / "abc", 0)
    os.chmod(blobs / "abc", 0o640)
    link = snap / "model.safetensors"
    os.symlink("../blobs/abc", link)
    write(link, 2)
    assert os.readlink(link) == "../blobs/abc"
    assert value(blobs / "abc") == 2 and os.stat(blobs / "abc").st_mode & 0o7777 == 0o640
    # A link to a file not there yet: the file is made where the link points.
    dangling = snap / "new.safetensors"
    os.symlink("../blobs/def", dangling)
    write(dangling, 3)
    assert os.path.islink(dangling) and value(blobs / "def") == 3
    assert sorted(os.listdir(blobs)) == ["abc", "def"] and len(os.listdir(snap)) == 2

def test_safe_open_interface(tmp_path, no_daemon):
    path = tmp_path / "m.safetensors"
    a = torch.arange(50, dtype=torch.float32).reshape(10, 5)
    tensors = {"a": a, "b": torch.ones(3, dtype=torch.bfloat16),
               **{f"layers.{i}.w": torch.full((2, 2), float(i)) for i in range(12)}}
    wtorch.save_file(tensors, path, metadata={"format": "pt"})
    with wcache.safe_open(path, framework="pt", device="cpu", backend="pread") as f:
        assert f.keys() == sorted(tensors)
        offsets = json.loads(path.read_bytes()[8:8 + struct.unpack("<Q", path.read_bytes()[
            :8])[0]])
        offsets.pop("__metadata__")
        assert f.offset_keys() == sorted(offsets, key=lambda k: offsets[k]["data_offsets"])
        assert f.metadata() == {"format": "pt"}
        every = f.get_tensors()
        assert list(every) == f.offset_keys()
        for k, v in tensors.items():
            got = f.get_tensor(k)
            assert got.dtype == v.dtype and torch.equal(got, v) and torch.equal(every[k], v)
            assert f.get_tensor(k) is not got  # a new tensor each call
        s = f.get_slice("a")
        assert s.get_shape() == [10, 5] and s.get_dtype() == "F32"
        assert torch.equal(s[2:, -1], a[2:, -1]) and torch.equal(s[0, :2], a[0, :2])
        assert list(s[list()].shape) == [0, 5]
        for index, message in (
                ((slice(2, None), -6), "Invalid index -6 for dimension 1 of size 5"),
                ([0, 1], "Non empty lists are not implemented"),
                ((slice(2, None), 20), "Error during slicing [2:, 20] with shape [10, 5]: "
                 "index 20 out of bounds for tensor dimension #1 of size 5"),
                (slice(None, 20), "Error during slicing [:20] with shape [10, 5]: index 19 "
                 "out of bounds for tensor dimension #0 of size 10")):
            with pytest.raises(wcache.SafetensorError) as e:
                s[index]
            assert str(e.value) == message
        with pytest.raises(wcache.SafetensorError):
            f.get_tensor("nope")
        with pytest.raises(KeyError):  # what wcache raised before
            f.get_tensor("nope")
    with pytest.raises(wcache.SafetensorError, match="File is closed"):
        f.keys()
    with wcache.safe_open(path, framework="pt") as g:
        get = g.get_tensor
        get("a")
    with pytest.raises(wcache.SafetensorError, match="File is closed"):
        get("layers.0.w")  # bound before close
    with pytest.raises(wcache.SafetensorError):
        wcache.safe_open(path, framework="tf")
    with pytest.raises(wcache.SafetensorError):
        wcache.safe_open(path, framework="pt", backend="io_uring")
    with pytest.raises(wcache.SafetensorError):
        wcache.safe_open(path, framework="np", device="cuda")
    wcache.safe_open(path, framework="pt", device=0).close()  # an int is a CUDA index
    with pytest.raises(FileNotFoundError):
        wcache.safe_open(tmp_path / "missing.safetensors", framework="pt")
    del tensors["b"]  # numpy has no bfloat16 (upstream raises too)
    wtorch.save_file(tensors, path)
    np_every = wnp.load_file(path)
    assert np_every["a"].dtype == np.float32 and np.array_equal(np_every["a"], a.numpy())
    assert not np_every["a"].flags.writeable


def test_metadata_empty_and_absent(tmp_path, no_daemon):
    empty, absent = tmp_path / "e.safetensors", tmp_path / "n.safetensors"
    empty.write_bytes(expected_file(
        '{"__metadata__":{},"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x05"))
    absent.write_bytes(expected_file(
        '{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x05"))
    with wcache.safe_open(empty, framework="np") as f:
        assert f.metadata() == {}
    with wcache.safe_open(absent, framework="np") as f:
        assert f.metadata() is None


def test_bad_files_are_safetensor_errors(tmp_path, no_daemon):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(wcache.SafetensorError):
        wcache.safe_open(bad, framework="pt")
    pt = tmp_path / "pytorch_model.bin"
    torch.save({"w": torch.zeros(2)}, pt)
    with pytest.raises(wcache.SafetensorError) as e:
        wcache.safe_open(pt, framework="pt")
    assert "PyTorch checkpoint" in str(e.value) and "python3 -m wcache.convert" in str(e.value)
    legacy = tmp_path / "legacy.pt"
    torch.save({"w": torch.zeros(2)}, legacy, _use_new_zipfile_serialization=False)
    with pytest.raises(wcache.SafetensorError, match="legacy torch.save"):
        wcache.safe_open(legacy, framework="pt")
    npy = tmp_path / "a.npy"
    np.save(npy, np.zeros(3))
    with pytest.raises(wcache.SafetensorError, match=r"NumPy \.npy"):
        wcache.safe_open(npy, framework="np")


def test_save_file_io_errors_are_safetensor_errors(tmp_path):
    # Upstream (bindings/python/src/lib.rs, serialize_file): "Error while
    # serializing: I/O error: ..."; wcache raised FileNotFoundError, naming
    # its temporary file.
    target = tmp_path / "missing" / "m.safetensors"
    for save in (lambda: wtorch.save_file({"a": torch.zeros(2)}, target),
                 lambda: wnp.save_file({"a": np.zeros(2)}, target),
                 lambda: wcache.serialize_file({"a": {"dtype": "float32", "shape": [1],
                                                      "data": bytes(4)}}, target)):
        with pytest.raises(wcache.SafetensorError) as e:
            save()
        assert str(e.value) == (f"Error while serializing: I/O error: {target}: No such file "
                                "or directory (os error 2)"), str(e.value)
        assert e.value.errno == 2


@pytest.mark.parametrize("framework,backend", [("np", "mmap"), ("pt", "pread")])
def test_slice_errors_after_an_ellipsis_name_the_right_dimension(tmp_path, no_daemon,
                                                                 framework, backend):
    """[..., 7] of a [2, 3, 4] tensor, where upstream's own slicer checks
    the index ("np", and "pt" with backend="pread"; upstream's slicer has no
    Ellipsis, wcache's checks take it): the dimension out of bounds is #2,
    as the message says for the same index written out ([:, :, 7]); torch,
    left to check it, counted from the Ellipsis ("dimension 1")."""
    path = tmp_path / "e.safetensors"
    whole = torch.arange(24.0).reshape(2, 3, 4)
    wtorch.save_file({"t": whole}, path)
    with wcache.safe_open(path, framework=framework, backend=backend) as f:
        s = f.get_slice("t")
        for index, message in (
                ((Ellipsis, 7), "Error during slicing [..., 7] with shape [2, 3, 4]: index 7 "
                 "out of bounds for tensor dimension #2 of size 4"),
                ((0, Ellipsis, slice(None, 9)), "Error during slicing [0, ..., :9] with shape "
                 "[2, 3, 4]: index 8 out of bounds for tensor dimension #2 of size 4"),
                ((Ellipsis, 5, 0), "Error during slicing [..., 5, 0] with shape [2, 3, 4]: "
                 "index 5 out of bounds for tensor dimension #1 of size 3")):
            with pytest.raises(wcache.SafetensorError) as e:
                s[index]
            assert str(e.value) == message
        want = whole if framework == "pt" else whole.numpy()
        assert (s[..., 3] == want[..., 3]).all() and s[..., 3].shape == want[..., 3].shape
        assert (s[1, ...] == want[1]).all() and s[1, ...].shape == want[1].shape


def test_pt_slices_index_as_torch_does(tmp_path, no_daemon):
    """framework="pt" with the default backend: upstream (bindings/python/
    src/lib.rs, PySafeSlice.__getitem__, Storage::Torch) hands the index to
    torch's __getitem__ on the whole tensor, so slice bounds past the end
    are clamped (tensor-parallel loaders rely on it for the last shard:
    TGI's get_partial_sharded takes [rank * block:(rank + 1) * block]),
    lists, tensors and booleans index as in torch, and a bad index raises
    torch's IndexError with torch's message. Before, wcache made its
    slicer's checks ("np"'s) here too and raised for all of these."""
    path = tmp_path / "s.safetensors"
    a = torch.arange(50.0).reshape(10, 5)
    wtorch.save_file({"a": a}, path)
    with wcache.safe_open(path, framework="pt") as f:
        s = f.get_slice("a")
        for index in (slice(8, 12), slice(None, 20), (slice(None), slice(None, 20)),
                      slice(12, 16), [0, 1], (slice(None), [0, 4]), torch.tensor([3, 1]),
                      True, (Ellipsis, 1), None, slice(-20, 3), (2, slice(3, 99))):
            got, want = s[index], a[index]
            assert got.shape == want.shape and torch.equal(got, want), index
        for index in ((Ellipsis, 7), 10, (0, 0, 0), (slice(None), -6)):
            with pytest.raises(IndexError) as e:
                a[index]
            with pytest.raises(IndexError) as got:
                s[index]
            assert isinstance(got.value, wcache.SafetensorError)
            assert str(got.value) == str(e.value), index


@pytest.mark.parametrize("framework", ["pt", "np"])
def test_get_slice_of_a_missing_tensor(tmp_path, no_daemon, framework):
    """Upstream's get_slice of a name the file does not have raises
    SafetensorError "File does not contain tensor NAME" (lib.rs, get_slice),
    the text get_tensor gives; wcache's said "model PATH has no tensor
    'NAME'"."""
    path = tmp_path / "m.safetensors"
    wtorch.save_file({"a": torch.zeros(2)}, path)
    with wcache.safe_open(path, framework=framework) as f:
        for get in (f.get_slice, f.get_tensor):
            with pytest.raises(wcache.SafetensorError) as e:
                get("nope")
            assert str(e.value) == "File does not contain tensor nope"
            assert isinstance(e.value, KeyError)  # what wcache raised before


def test_numpy_slice_of_every_dimension_is_a_0d_array(tmp_path, no_daemon):
    """Upstream's np slicer makes every result with frombuffer(...).reshape(
    new shape) (lib.rs, slice_bytes_to_tensor), so an index that takes
    every dimension ([0, 1], or [()] of a 0-d tensor) gives a 0-d ndarray;
    wcache gave numpy's scalar (numpy.float32), a copy without flags or
    base."""
    path = tmp_path / "m.safetensors"
    a = np.arange(50, dtype=np.float32).reshape(10, 5)
    wnp.save_file({"a": a, "s": np.array(2.5, dtype=np.float32)}, path)
    with wcache.safe_open(path, framework="np") as f:
        for name, index, want in (("a", (0, 1), 1.0), ("a", (9, -1), 49.0), ("s", (), 2.5)):
            x = f.get_slice(name)[index]
            assert type(x) is np.ndarray and x.shape == () and x.dtype == np.float32, index
            assert x == want and x.base is not None and not x.flags.writeable
        assert f.get_slice("a")[3].shape == (5,) and f.get_slice("a")[3][2] == 17.0


@pytest.mark.parametrize("framework", ["pt", "np"])
@pytest.mark.parametrize("first", [False, True])
def test_a_slice_outlives_its_handle(tmp_path, no_daemon, framework, first):
    """Upstream's get_slice() object holds the file's storage itself (lib.rs:
    PySafeSlice.storage, an Arc cloned from the handle's), and the handle's
    __exit__ drops only its own, so a slice taken in a with block indexes
    after it (first: after a get_tensor and a slice in the block, else the
    first tensor made at all). wcache's indexed through the handle and
    raised "File is closed". The mapping goes with the slice."""
    path = tmp_path / "m.safetensors"
    a = torch.arange(50.0).reshape(10, 5)
    wtorch.save_file({"a": a, "b": torch.ones(3)}, path)
    want = a if framework == "pt" else a.numpy()
    with wcache.safe_open(path, framework=framework) as f:
        s = f.get_slice("a")
        if first:
            assert (f.get_tensor("b") == 1).all() and (s[1] == want[1]).all()
    assert s.get_shape() == [10, 5] and s.get_dtype() == "F32"
    for index in (slice(None, 1), (slice(2, 4), 3), (Ellipsis, slice(1, None, 2))):
        got = s[index]
        assert type(got) is type(want) and got.shape == want[index].shape
        assert (got == want[index]).all(), index
    with pytest.raises(wcache.SafetensorError, match="^File is closed$"):
        f.get_tensor("a")  # the handle itself stays closed
    del got, s
    gc.collect()
    assert file_mappings(path) == 0, "the mapping outlives the slice"


def test_a_file_that_cannot_be_opened_is_file_not_found(tmp_path, no_daemon):
    """Upstream raises FileNotFoundError for every failure to open the file
    (lib.rs, Open::new: File::open(...).map_err(PyFileNotFoundError)), not
    only for a missing one, so code written for it catches these with
    `except FileNotFoundError`; wcache raised a plain WcacheError. Now
    wcache.CannotOpenFile, a FileNotFoundError and a WcacheError with the
    failure's own errno and message. A file that opens but is not a model
    stays a SafetensorError, not a FileNotFoundError."""
    model = tmp_path / "m.safetensors"
    wtorch.save_file({"a": torch.zeros(2)}, model)
    loop = tmp_path / "loop.safetensors"
    os.symlink(loop, loop)
    for path, code in ((model / "x", errno.ENOTDIR), (loop, errno.ELOOP),
                       (tmp_path / ("n" * 300), errno.ENAMETOOLONG)):
        with pytest.raises(FileNotFoundError) as e:
            wcache.safe_open(path, framework="pt")
        assert isinstance(e.value, wcache.CannotOpenFile), path
        assert isinstance(e.value, wcache.WcacheError) and e.value.errno == code, path
        assert str(path) in str(e.value) and os.strerror(code) in str(e.value), str(e.value)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10" + bytes(7) + b"{}")
    with pytest.raises(wcache.SafetensorError) as e:
        wcache.safe_open(bad, framework="pt")
    assert not isinstance(e.value, FileNotFoundError)
    # Permission denied: as an unprivileged user (root opens anything).
    shared = tmp_path / "shared"
    shared.mkdir()
    secret = shared / "secret.safetensors"
    wtorch.save_file({"a": torch.zeros(2)}, secret)
    secret.chmod(0o600 if os.geteuid() == 0 else 0)
    code = ("import wcache\n"
            "try:\n"
            f"    wcache.safe_open({str(secret)!r}, framework='np')\n"
            "except FileNotFoundError as e:\n"
            "    print(type(e).__name__, e.errno, isinstance(e, wcache.WcacheError), e)\n")
    if os.geteuid() != 0:
        r = run_python(code)
    elif not shutil.which("setpriv"):
        pytest.skip("no setpriv to run as an unprivileged user for permission denied")
    else:
        # nobody needs the package and the library as well as the file: a
        # clone nobody cannot read (in /root, 0700 on Debian) failed the
        # import, so the child gets copies of both next to the file.
        py = tmp_path / "py"
        shutil.copytree(os.path.dirname(wcache.__file__), py / "wcache",
                        ignore=shutil.ignore_patterns("__pycache__"))
        lib = py / "libwcache.so"
        shutil.copyfile(wcache.library_path(), lib)
        for p in [py, *py.rglob("*")]:
            p.chmod(0o755 if p.is_dir() or p == lib else 0o644)
        for d in [shared, *shared.parents]:  # nobody needs to reach them
            if d.stat().st_mode & 0o001 == 0:
                d.chmod(d.stat().st_mode | 0o001)
        r = run_python(code, env={"PYTHONPATH": str(py), "WCACHE_LIB": str(lib)},
                       wrap=("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"))
    assert r.stdout == f"CannotOpenFile {errno.EACCES} True {secret}: Permission denied\n", \
        r.stdout + r.stderr


def test_save_rules_for_shared_tensors(tmp_path):
    shared = torch.zeros(4)
    with pytest.raises(RuntimeError, match="share memory"):
        wtorch.save_file({"a": shared, "b": shared}, tmp_path / "x.safetensors")
    with pytest.raises(ValueError, match="non contiguous"):
        wtorch.save_file({"a": torch.zeros(3, 3).t()}, tmp_path / "x.safetensors")
    # views of one buffer that do not overlap are fine (upstream's filter)
    buf = torch.arange(8.0)
    wtorch.save_file({"lo": buf[:4], "hi": buf[4:]}, tmp_path / "y.safetensors")


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4, bias=False)
        self.b = torch.nn.Linear(4, 4, bias=False)
        self.b.weight = self.a.weight


def test_save_and_load_model(tmp_path, no_daemon):
    path = tmp_path / "tied.safetensors"
    model = Tied()
    wtorch.save_model(model, path)
    with wcache.safe_open(path, framework="pt") as f:
        assert f.keys() == ["a.weight"]  # the duplicate name is dropped ...
        assert f.metadata() == {"b.weight": "a.weight"}  # ... and recorded
    other = Tied()
    missing, unexpected = wtorch.load_model(other, path)
    assert (missing, unexpected) == (set(), [])
    assert torch.equal(other.a.weight, model.a.weight)
    lone = torch.nn.Linear(4, 2)
    with pytest.raises(RuntimeError, match="Missing key"):
        wtorch.load_model(lone, path)
    missing, unexpected = wtorch.load_model(lone, path, strict=False)
    assert missing == {"weight", "bias"} and unexpected == ["a.weight"]


def test_save_and_load_model_whose_parameters_are_wcache_views(tmp_path, no_daemon):
    """Parameters set from load_file's tensors are views of one storage per
    dtype and file (wcache's difference from upstream, whose tensors each
    have their own): save_model and load_model must treat them as upstream
    treats its own tensors, not refuse them as 'None is covering the entire
    storage'."""
    path = tmp_path / "two.safetensors"
    wtorch.save_file({"a.weight": torch.randn(4, 4), "b.weight": torch.randn(4, 4)}, path)
    model = torch.nn.Sequential()
    model.add_module("a", torch.nn.Linear(4, 4, bias=False))
    model.add_module("b", torch.nn.Linear(4, 4, bias=False))
    state = wtorch.load_file(path)
    assert wtorch.storage_ptr(state["a.weight"]) == wtorch.storage_ptr(state["b.weight"])
    model.a.weight = torch.nn.Parameter(state["a.weight"])
    model.b.weight = torch.nn.Parameter(state["b.weight"])
    out = tmp_path / "saved.safetensors"
    wtorch.save_model(model, out)
    again = wtorch.load_file(out)
    assert torch.equal(again["a.weight"], state["a.weight"])
    assert torch.equal(again["b.weight"], state["b.weight"])
    assert wtorch.load_model(model, out) == (set(), [])
    # a tensor of the caller's own that covers part of its storage is still
    # refused, as upstream refuses it
    lone = torch.nn.Linear(2, 2, bias=False)
    lone.weight = torch.nn.Parameter(torch.zeros(8)[:4].view(2, 2))
    with pytest.raises(RuntimeError, match="None is covering the entire storage"):
        wtorch.save_model(lone, tmp_path / "lone.safetensors")


def test_save_model_keeps_a_wcache_tensor_over_a_partial_view_of_it(tmp_path, no_daemon):
    """A model holding a tensor from load_file and a Parameter that views
    part of it: upstream keeps the whole tensor (the only one covering its
    storage) and records the view as its alias. The view must not be kept
    in its place because it too lies in wcache's part storage: the whole
    tensor's other rows would be lost from the file."""
    path = tmp_path / "w.safetensors"
    w = torch.arange(16, dtype=torch.float32).view(4, 4)
    wtorch.save_file({"w": w}, path)
    state = wtorch.load_file(path)
    model = torch.nn.Module()
    model.b = torch.nn.Parameter(state["w"])
    model.a = torch.nn.Parameter(state["w"][:2])  # sorts first
    out = tmp_path / "saved.safetensors"
    wtorch.save_model(model, out)
    again = wtorch.load_file(out)
    assert list(again) == ["b"] and torch.equal(again["b"], w)
    # two partial views of it, neither covering what they share: refused,
    # as upstream refuses them
    halves = torch.nn.Module()
    halves.a = torch.nn.Parameter(state["w"][:3])
    halves.b = torch.nn.Parameter(state["w"][1:])
    with pytest.raises(RuntimeError, match="None is covering the entire storage"):
        wtorch.save_model(halves, tmp_path / "halves.safetensors")


def run_standin(code, env_extra, tmp_path):
    """Runs code in a fresh interpreter that finds the stand-in safetensors
    and this tree's wcache (whether or not $PYTHONPATH already names it)."""
    env = dict(os.environ, **env_extra)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "standin"), PYDIR,
                                         env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, cwd=str(tmp_path))


def test_install_patches_safetensors(tmp_path, no_daemon):
    path = tmp_path / "m.safetensors"
    wtorch.save_file({"w": torch.ones(2)}, path)
    code = f"""
import wcache, torch
wcache.install()
import safetensors, safetensors.torch
with safetensors.safe_open({str(path)!r}, framework="pt") as f:
    assert f.keys() == ["w"]
assert torch.equal(safetensors.torch.load_file({str(path)!r})["w"], torch.ones(2))
m = torch.nn.Module(); m.w = torch.nn.Parameter(torch.zeros(2))
assert safetensors.torch.load_model(m, {str(path)!r}) == (set(), [])
assert safetensors.torch.save_file() == "upstream save_file"  # the rest stays upstream's
print("patched")
"""
    r = run_standin(code, {}, tmp_path)
    assert r.returncode == 0 and "patched" in r.stdout, r.stderr


def test_install_hands_other_frameworks_to_upstream(tmp_path, no_daemon):
    """The safe_open install() puts on safetensors serves "pt" and "np"
    (and their aliases); any other framework (upstream's tf, tensorflow,
    jax, flax, mlx, paddle, or a name upstream refuses) goes to the
    package's own safe_open with the arguments unchanged, also through
    the reference a module bound by `from safetensors import safe_open`
    after install() (upstream's flax.py, tensorflow.py, mlx.py, paddle.py
    do that) and after uninstall(). wcache.safe_open itself still refuses
    them. Before (rev133 #1) the installed safe_open raised
    SafetensorError for them, so an installed safetensors' flax/tf/mlx/
    paddle loaders failed under WCACHE_SAFETENSORS=1."""
    path = tmp_path / "m.safetensors"
    wtorch.save_file({"w": torch.ones(2)}, path)
    code = f"""
import wcache, torch
import safetensors
calls = []
class Upstream:  # records what reaches the package's own safe_open
    def __init__(self, *args, **kwargs):
        calls.append((args, kwargs))
safetensors.safe_open = Upstream
wcache.install()
import safetensors.torch
from safetensors import safe_open as late  # as upstream's flax.py binds it
assert safetensors.safe_open is late is safetensors.torch.safe_open
p = {str(path)!r}
others = ["tf", "tensorflow", "jax", "flax", "mlx", "paddle", "nonsense", None, 3]
for fw in others:
    h = late(p, framework=fw)
    assert type(h) is Upstream and calls.pop() == ((p,), {{"framework": fw}}), fw
h = late(p, "flax", "cpu", backend="pread")
assert type(h) is Upstream and calls.pop() == ((p, "flax", "cpu"), {{"backend": "pread"}})
for fw in ["pt", "torch", "pytorch", "np", "numpy"]:
    with late(p, framework=fw) as f:
        assert isinstance(f, wcache.safe_open) and f.keys() == ["w"], fw
with late(p, "pt") as f, late(p) as g:
    assert f.get_tensor("w").tolist() == g.get_tensor("w").tolist() == [1.0, 1.0]
assert not calls
# Its signature is wcache's (upstream's), not __new__'s (*args, **kwargs):
# code probes `"backend" in inspect.signature(safe_open).parameters`.
import inspect
assert list(inspect.signature(late).parameters) == ["filename", "framework", "device",
                                                    "backend"], inspect.signature(late)
try:
    wcache.safe_open(p, framework="flax")
    raise AssertionError("wcache.safe_open took flax")
except wcache.SafetensorError as e:
    assert "framework flax is invalid" in str(e) and not calls
wcache.uninstall()
assert safetensors.safe_open is Upstream
assert type(late(p, framework="mlx")) is Upstream and calls.pop() == ((p,), {{"framework": "mlx"}})
print("delegated")
"""
    r = run_standin(code, {}, tmp_path)
    assert r.returncode == 0 and "delegated" in r.stdout, r.stdout + r.stderr


def test_environment_variable_patches_on_import(tmp_path, no_daemon):
    path = tmp_path / "m.safetensors"
    wtorch.save_file({"w": torch.ones(2)}, path)
    site = tmp_path / "site"
    site.mkdir()
    pth = os.path.join(HERE, "..", "..", "client", "python", "wcache-safetensors.pth")
    (site / "wcache-safetensors.pth").write_bytes(open(pth, "rb").read())
    code = f"""
import site, sys
site.addsitedir({str(site)!r})   # what Python does at start-up for dist-packages
import safetensors.torch
print(safetensors.torch.load_file({str(path)!r})["w"].tolist())
try:  # a framework wcache does not serve goes to the stand-in's safe_open
    safetensors.safe_open({str(path)!r}, framework="flax")
except AssertionError as e:
    print("flax:", e)
"""
    r = run_standin(code, {"WCACHE_SAFETENSORS": "1"}, tmp_path)
    assert r.returncode == 0 and "[1.0, 1.0]" in r.stdout, r.stderr
    assert "flax: upstream safe_open called" in r.stdout, r.stdout + r.stderr
    r = run_standin(code, {"WCACHE_SAFETENSORS": ""}, tmp_path)
    assert r.returncode != 0 and "upstream load_file called" in r.stderr
    # Switched off (0, no): the .pth imports nothing, so an interpreter
    # start costs no import of wcache and numpy (before, any non-empty
    # value imported the package, about 200 ms, and patched nothing).
    off = f"""
import site, sys
site.addsitedir({str(site)!r})
print(sorted(m for m in ("wcache", "numpy") if m in sys.modules))
"""
    for value in ("0", "no", "off"):
        r = run_standin(off, {"WCACHE_SAFETENSORS": value}, tmp_path)
        assert r.returncode == 0 and r.stdout.strip() == "[]", (value, r.stdout, r.stderr)


@pytest.fixture
def standin_unpatched(monkeypatch):
    """The stand-in safetensors package (tests/python/standin), imported
    and not patched: (its upstream objects wcache.install() replaces, by
    (module, attribute)). Afterwards uninstalled, its hook removed and the
    package forgotten."""
    import importlib
    from wcache import _install
    monkeypatch.syspath_prepend(os.path.join(HERE, "standin"))
    saved = {k: sys.modules.pop(k) for k in list(sys.modules)
             if k == "safetensors" or k.startswith("safetensors.")}
    importlib.import_module("safetensors.torch")
    upstream = {(m, a): getattr(sys.modules[m], a)
                for m, attrs in [("safetensors", ["safe_open"]),
                                 ("safetensors.torch", ["safe_open", "load_file", "load_model"])]
                for a in attrs}
    try:
        yield upstream
    finally:
        wcache.uninstall()
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _install._Hook)]
        for k in [k for k in sys.modules if k == "safetensors" or k.startswith("safetensors.")]:
            del sys.modules[k]
        sys.modules.update(saved)


@pytest.mark.parametrize("other", ["install", "uninstall"])
def test_patching_on_import_while_another_thread_installs_or_uninstalls(
        standin_unpatched, monkeypatch, other):
    """The import hook's patching (install_from_environment with
    WCACHE_SAFETENSORS=1 and safetensors imported: what the .pth runs) with
    another thread's whole install() or uninstall() before each line of
    _install._patch in turn: whatever order they took, one uninstall()
    afterwards puts every upstream object back. Before, the hook patched
    without the lock install() and uninstall() hold: an install() between
    its check of _saved and its read of the attribute made it save
    wcache's safe_open as upstream's (which uninstall() then put back), and
    an uninstall() between its save and its setattr left safetensors
    patched with nothing saved (install fails at line 4, uninstall at 5)."""
    from wcache import _install
    upstream = standin_unpatched
    monkeypatch.setenv(_install.ENV, "1")
    k = 0
    while True:
        errors, other_errors, ran = other_thread_before(
            _install._patch.__code__, k, _install.install_from_environment,
            getattr(wcache, other))
        assert not errors and not other_errors, (k, errors, other_errors)
        wcache.uninstall()
        for (module, attr), obj in upstream.items():
            assert getattr(sys.modules[module], attr) is obj, \
                f"{other}() before line {k} of _patch: {module}.{attr} is not upstream's " \
                f"after uninstall()"
        if not ran:
            break
        k += 1
    assert k > 5


def test_connect_timeout(daemon):
    from wcache import _lib
    if _lib.has("wc_connect_timeout"):
        with wcache.connect(daemon.socket, timeout=5) as c:
            c.set_timeout(0.5)
            assert c.attach("small").keys()
        with pytest.raises(ValueError):
            wcache.connect(daemon.socket, timeout=-1)
    else:  # a library without deadlines says so instead of ignoring timeout=
        with pytest.raises(wcache.WcacheError, match="WCACHE_TIMEOUT"):
            wcache.connect(daemon.socket, timeout=5)


def test_upstream_messages_and_helpers(tmp_path, no_daemon):
    with pytest.raises(FileNotFoundError) as e:
        wcache.safe_open("notafile", framework="pt")
    assert str(e.value) == "No such file or directory: notafile"  # upstream's words
    assert "not running" in e.value.reason  # and why wcached did not serve it
    # a dangling symlink (a snapshot link whose blob is gone) does not exist
    # either, for upstream as for os.path.exists
    link = tmp_path / "link.safetensors"
    os.symlink(tmp_path / "gone.safetensors", link)
    with pytest.raises(FileNotFoundError) as e:
        wcache.safe_open(link, framework="pt")
    assert str(e.value) == f"No such file or directory: {link}"
    with pytest.raises(FileNotFoundError):
        wtorch.load_file(link)
    # 0.7 raised SafetensorError for an incomplete dict, 0.8 TypeError for any dict
    with pytest.raises(wcache.SafetensorError):
        wcache.serialize({"test": {"dtype": "float32", "shape": [1]}})
    with pytest.raises(TypeError):
        wcache.serialize({"test": {"dtype": "float32", "shape": [1], "data_ptr": 0,
                                   "data_len": 0}})
    b = torch.zeros(16)
    assert wtorch._end_ptr(b[::4]) - b[::4].data_ptr() == 16 * 3 + 4  # last element's end
    assert wtorch.storage_size(b[::4]) == 64 and wtorch.storage_ptr(b[4:]) == b.data_ptr()


def test_numpy_zero_dimensional_arrays_keep_their_shape(tmp_path, no_daemon):
    """A 0-d array is written with shape [] (upstream writes arr.shape), not
    [1], which np.ascontiguousarray makes of it."""
    scalar = np.array(3.0, dtype=np.float32)
    want = expected_file('{"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}',
                         struct.pack("<f", 3.0))
    assert wnp.save({"s": scalar}) == want
    path = tmp_path / "s.safetensors"
    wnp.save_file({"s": scalar}, path)
    assert path.read_bytes() == want
    assert wnp.load(want)["s"].shape == () and wnp.load_file(path)["s"].shape == ()
    # a 0-d view that is not contiguous in the usual sense keeps its shape too
    assert wnp.save({"s": np.arange(4.0, dtype=np.float32)[::2][1, ...]}) == \
        expected_file('{"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}',
                      struct.pack("<f", 2.0))


def test_safe_open_handle(tmp_path, no_daemon):
    path = tmp_path / "m.safetensors"
    wnp.save_file({"a": np.arange(4, dtype=np.int16)}, path)
    with open(path, "rb") as f, wcache._safe_open_handle(f, framework="np") as g:
        assert g.keys() == ["a"] and g.get_tensor("a").tolist() == [0, 1, 2, 3]

    class NoFileno:  # a file object without a descriptor (fsspec, s3)
        def __init__(self, data):
            self.data, self.pos = data, 0

        def fileno(self):
            raise OSError("no descriptor")

        def seek(self, pos):
            self.pos = pos

        def read(self, n):
            chunk = self.data[self.pos:self.pos + n]
            self.pos += len(chunk)
            return chunk

    with wcache._safe_open_handle(NoFileno(path.read_bytes()), framework="np") as g:
        assert g.get_tensor("a").dtype == np.int16


def test_safe_open_handle_metadata_and_no_descriptor_leaked(tmp_path, no_daemon):
    """metadata() of a handle on a file object: {} for an empty
    __metadata__ and None for none, as for a path, though the descriptor
    behind /proc/self/fd/N is closed (the memfd) or closed by the caller,
    and N may name another file since. A file object whose read fails
    leaves no descriptor behind."""
    import io
    empty = wtorch.save({"a": torch.zeros(2)}, metadata={})
    none = wtorch.save({"a": torch.zeros(2)})
    for data, want in ((empty, {}), (none, None)):
        with wcache._safe_open_handle(io.BytesIO(data), framework="pt") as g:
            with open(__file__, "rb"):  # may take the memfd's number
                assert g.metadata() == want
        path = tmp_path / "m.safetensors"
        path.write_bytes(data)
        with open(path, "rb") as f:
            g = wcache._safe_open_handle(f, framework="pt")
        assert g.metadata() == want
        g.close()

    class FailingRead(io.RawIOBase):
        def readable(self):
            return True

        def fileno(self):
            raise io.UnsupportedOperation("no descriptor")

        def seek(self, pos, whence=0):
            return 0

        def read(self, n=-1):
            raise OSError(5, "read failed (test)")

    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        with pytest.raises(OSError, match="read failed"):
            wcache._safe_open_handle(FailingRead(), framework="pt")
    assert len(os.listdir("/proc/self/fd")) == before


def test_load_of_a_pickle_names_it(tmp_path):
    import io
    buf = io.BytesIO()
    torch.save({"w": torch.zeros(2)}, buf)
    with pytest.raises(wcache.SafetensorError) as e:
        wtorch.load(buf.getvalue())
    assert "PyTorch checkpoint" in str(e.value) and "python3 -m wcache.convert" in str(e.value)
    with pytest.raises(wcache.SafetensorError, match="GGUF"):
        wnp.load(b"GGUF\x03\x00\x00\x00" + bytes(32))


def test_daemon_and_wcachectl_name_a_pickled_checkpoint(tmp_path, daemon):
    from pyhelpers import binary
    pt = tmp_path / "pytorch_model.bin"
    torch.save({"w": torch.zeros(2)}, pt)
    for cmd in (["--control", daemon.control, "load", "pt", str(pt)], ["inspect", str(pt)]):
        r = subprocess.run([binary("wcachectl")] + cmd, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode != 0, (cmd, r.stdout)
        out = r.stdout + r.stderr
        assert "PyTorch checkpoint" in out and "python3 -m wcache.convert" in out, (cmd, out)


@pytest.mark.parametrize("seed", range(6))
def test_runs_give_every_tensor_its_own_values(tmp_path, no_daemon, seed):
    """Tensors made run by run (strided views of the model's memory) equal
    what was saved, for layouts that repeat, repeat with outliers, or not at
    all, with several dtypes, scalars and empty tensors; in numpy too."""
    import random
    rnd = random.Random(seed)
    shapes = [(4, 4), (8, 4), (4,), (), (0, 3), (2, 3, 2)]
    dtypes = [torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.float16]
    tensors = {}
    layers = rnd.randint(9, 40)
    per_layer = [(rnd.choice(shapes), rnd.choice(dtypes)) for _ in range(rnd.randint(1, 6))]
    for layer in range(layers):
        for j, (shape, dtype) in enumerate(per_layer):
            if rnd.random() < 0.1:  # an irregular layer now and then
                shape = rnd.choice(shapes)
            n = int(np.prod(shape)) if shape else 1
            values = torch.arange(n, dtype=torch.float64).reshape(shape) + layer * 100 + j
            tensors[f"model.layers.{layer}.p{j}"] = values.to(dtype)
    tensors["embed"] = torch.randn(8, 4)
    tensors["lm_head"] = torch.randn(8, 4)
    path = tmp_path / "r.safetensors"
    wtorch.save_file(tensors, path)
    with wcache.safe_open(path, framework="pt") as f:
        for k in f.keys():
            t = f.get_tensor(k)
            assert t.dtype == tensors[k].dtype and t.shape == tensors[k].shape, k
            assert torch.equal(t, tensors[k]), k
        every = f.get_tensors()
        assert all(torch.equal(every[k], tensors[k]) for k in tensors)
    with wcache.safe_open(path, framework="np") as f:
        for k in f.keys():
            if tensors[k].dtype != torch.bfloat16:
                assert np.array_equal(f.get_tensor(k), tensors[k].numpy()), k


def test_interleaved_layers_are_few_runs(tmp_path, no_daemon):
    """q, k, v, o of one shape in every layer, and embeddings of the same
    shape as a projection before and after the layers: still one run per
    projection (the speed of safe_open depends on it), and right values."""
    tensors = {"a.embed": torch.randn(8, 4), "z.lm_head": torch.randn(8, 4)}
    for layer in range(30):
        for j, name in enumerate(("k", "o", "q", "v")):
            tensors[f"m.layers.{layer}.{name}"] = torch.full((4, 4), layer * 10.0 + j)
        tensors[f"m.layers.{layer}.up"] = torch.full((8, 4), -layer - 1.0)
    path = tmp_path / "l.safetensors"
    wtorch.save_file(tensors, path)
    with wcache.safe_open(path, framework="pt") as f:
        runs = f._bulk()
        assert len(runs.plan.done) <= 4 + 1 + 2  # k, o, q, v; up; embed and lm_head alone
        for k in f.keys():
            assert torch.equal(f.get_tensor(k), tensors[k]), k
