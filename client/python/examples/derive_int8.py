#!/usr/bin/python3
"""int8 weights computed once and shared by every worker: a per-output-channel
quantizer as a derived artifact of a model wcached serves.

    derive_int8.py MODEL [--key int8-rowwise-v1] [--socket PATH]

Every 2-D floating-point weight W[out, in] becomes W_q = round(W / scale)
(int8, clamped to [-127, 127]) and NAME.scale = max(|W[o, :]|) / 127 (F32,
one per output channel; 1 for a row of zeros); other tensors (norms,
biases, embeddings of other dtypes) are kept as they are. The first worker
to ask computes it (``wcache.derived`` calls ``quantize`` there only);
wcached seals and serves it, and every later worker attaches the int8
artifact zero-copy. Without wcached the quantization runs in this process
(with a warning). Change the key whenever the quantizer changes.

Prints one JSON line: how many tensors were quantized, whether this process
built the artifact, and the largest relative error of a dequantized row.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the wcache package beside examples/

import torch  # noqa: E402

import wcache  # noqa: E402

KEY = "int8-rowwise-v1"


def quantize_rows(w):
    """(int8 weight, F32 scale per row) of a 2-D floating-point weight."""
    w = w.float()
    scale = w.abs().amax(dim=1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.clamp(torch.round(w / scale[:, None]), -127, 127).to(torch.int8)
    return q, scale


def quantize(source):
    """The build: {name: int8 weight, name.scale: F32 scales, others as they are}."""
    out = {}
    for name, t in source.items():
        if t.dim() == 2 and t.is_floating_point():
            out[name], out[name + ".scale"] = quantize_rows(t)
        else:
            out[name] = t
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="a model wcached serves (name or path), or a file")
    ap.add_argument("--key", default=KEY)
    ap.add_argument("--socket", default=None)
    args = ap.parse_args()

    built = []

    def build(source):
        built.append(os.getpid())
        return quantize(source)

    q = wcache.derived(args.model, args.key, build, socket=args.socket)
    source = wcache.safe_open(args.model, framework="pt")
    worst, quantized = 0.0, 0
    for name in source.keys():
        w = source.get_tensor(name)
        if name + ".scale" not in q:
            assert torch.equal(q[name], w), name
            continue
        quantized += 1
        assert q[name].dtype == torch.int8 and q[name + ".scale"].dtype == torch.float32
        back = q[name].float() * q[name + ".scale"][:, None]
        err = (back - w.float()).abs().amax(dim=1) / w.float().abs().amax(dim=1).clamp(min=1e-30)
        worst = max(worst, float(err.max()))
    print(json.dumps({"key": args.key, "quantized": quantized, "tensors": len(q),
                      "built_here": bool(built), "max_row_error": worst}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
