"""model.py: small safetensors files for the system tests, laid out so that
residency compares exactly: the header fills the first page and every
tensor is a whole number of pages, so the file is too, and what fincore
counts (whole pages) is what the daemon counts (bytes of the file)."""
import hashlib
import json
import os
import random

PAGE = 4096


def write(path, seed, tensors=3, pages_per_tensor=256):
    """Writes a U8 safetensors model to PATH (root's, 0644) with data from
    SEED, fsyncs it, drops its pages from the page cache, and returns the
    sha256 of its tensors' bytes in name order (what a worker that reads
    every tensor sees)."""
    size = pages_per_tensor * PAGE
    header = {"__metadata__": {"seed": str(seed)}}
    for i in range(tensors):
        header[f"layer.{i}.weight"] = {"dtype": "U8", "shape": [size],
                                       "data_offsets": [i * size, (i + 1) * size]}
    text = json.dumps(header, separators=(",", ":")).encode()
    if len(text) > PAGE - 8:
        raise ValueError("header longer than a page")
    text += b" " * (PAGE - 8 - len(text))
    rng = random.Random(seed)
    data = [rng.randbytes(size) for _ in range(tensors)]
    digest = hashlib.sha256()
    for name in sorted(header):
        if name != "__metadata__":
            digest.update(data[int(name.split(".")[1])])
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for d in data:
            f.write(d)
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    os.chmod(path, 0o644)
    return digest.hexdigest()


def drop_pages(path):
    """Drops PATH's clean pages from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def file_size(tensors=3, pages_per_tensor=256):
    return PAGE + tensors * pages_per_tensor * PAGE
