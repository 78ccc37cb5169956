#!/usr/bin/python3
"""A tiny inference server whose F32 weights are derived once from a BF16
model and shared by every worker.

    derive_f32_server.py MODEL [--port 8378] [--socket PATH] [--timeout S]

At start it asks for the model as F32 (``wcache.derived(MODEL, "f32-v1",
to_f32)``): the first server to ask converts it (``to_f32`` runs there only)
and wcached serves the result; every other server attaches it, zero-copy,
without converting anything. Without wcached it converts in this process
(with a warning). It then serves on 127.0.0.1:PORT (loopback only: a toy):

    GET /infer?seed=N   y = W @ x for the first 2-D weight W and a random x
                        (seeded): {"pid", "layer", "sum", "dtype"}

When ready it prints one JSON line, {"port": PORT, "tensors": N, "dtype":
"float32", "built_here": bool}. SIGTERM or SIGINT stops it.
"""
import argparse
import http.server
import json
import os
import sys
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the wcache package beside examples/

import torch  # noqa: E402

import wcache  # noqa: E402


def to_f32(source):
    """The build: every floating-point tensor as float32, others unchanged."""
    return {k: v.float() if v.is_floating_point() else v for k, v in source.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--port", type=int, default=8378)
    ap.add_argument("--socket", default=None)
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds to wait for another worker's build (default: as long as "
                         "wcached lets it run, its derive_timeout; 0: no limit)")
    args = ap.parse_args()

    built = []

    def build(source):
        built.append(os.getpid())
        return to_f32(source)

    weights = wcache.derived(args.model, "f32-v1", build, socket=args.socket,
                             timeout=args.timeout)
    layer = next(k for k in sorted(weights) if weights[k].dim() == 2)
    w = weights[layer]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            url = urllib.parse.urlparse(self.path)
            if url.path != "/infer":
                self.send_error(404)
                return
            seed = int(urllib.parse.parse_qs(url.query).get("seed", ["0"])[0])
            x = torch.randn(w.shape[1], generator=torch.Generator().manual_seed(seed))
            y = w @ x
            body = json.dumps({"pid": os.getpid(), "layer": layer, "sum": float(y.sum()),
                               "dtype": str(w.dtype).split(".")[-1]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = http.server.HTTPServer(("127.0.0.1", args.port), Handler)
    print(json.dumps({"port": server.server_address[1], "tensors": len(weights),
                      "dtype": "float32", "built_here": bool(built)}), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
