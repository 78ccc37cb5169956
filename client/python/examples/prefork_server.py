#!/usr/bin/python3
"""A pre-fork HTTP inference server whose workers share one copy of the
weights through wcache.

    prefork_server.py MODEL [--port 8377] [--workers 4] [--loader wcache|torch|none]

The parent binds 127.0.0.1:PORT (only loopback: this is a toy), then forks
the workers. Each worker loads the model itself: with ``--loader wcache``
through ``wcache.safe_open(MODEL)`` (attached through wcached when it serves
MODEL, else mapped in-process: either way every worker maps the same page
cache, and loading takes microseconds); with ``--loader torch`` by
``torch.load`` of the equivalent checkpoint (``--pt``), the usual way, a
private copy per worker; ``--loader none`` loads nothing (a baseline for
memory figures). ``--attach-before-fork`` attaches once in the parent and
forks after, which shares the mapping the same way.

All workers accept on the one listening socket (the kernel spreads the
connections) and serve:

    GET /infer?layer=NAME&seed=N   y = W @ x for the layer's weight W and a
                                   random x (seeded): {"pid", "layer",
                                   "shape", "sum", "norm", "ms"}
    GET /health                    {"pid", "tensors", "source"}

When a worker is ready it prints one JSON line on stdout,
{"worker": PID, "port": PORT, "load_seconds": S, ...}, which
prefork_pss.py reads. SIGTERM or SIGINT to the parent stops everything.
"""
import argparse
import http.server
import json
import os
import signal
import socket
import socketserver
import sys
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the wcache package beside examples/

import torch  # noqa: E402

import wcache  # noqa: E402

STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def load(args, pre=None):
    """Returns (state dict of torch tensors, where it came from)."""
    if args.loader == "none":
        return {}, "none"
    if args.loader == "torch":
        return torch.load(args.pt, map_location="cpu", weights_only=True), "torch.load"
    f = pre if pre is not None else wcache.safe_open(args.model, framework="pt")
    state = {k: f.get_tensor(k) for k in f.keys()}
    return state, f.model.source


def touch(state):
    """Reads every page of every tensor (so memory figures count the whole
    model as resident), returns a checksum."""
    total = 0
    for t in state.values():
        if t.numel():
            total += int(t.reshape(-1).view(torch.uint8)[::4096].sum())
    return total


def make_handler(state, source):
    weights = {k: v for k, v in state.items() if v.dim() == 2}
    default = next((k for k in sorted(weights) if "mlp" in k), next(iter(sorted(weights)), None))

    class Handler(http.server.BaseHTTPRequestHandler):
        def reply(self, code, obj):
            body = (json.dumps(obj) + "\n").encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            url = urllib.parse.urlsplit(self.path)
            q = dict(urllib.parse.parse_qsl(url.query))
            if url.path == "/health":
                return self.reply(200, {"pid": os.getpid(), "tensors": len(state),
                                        "source": source})
            if url.path != "/infer":
                return self.reply(404, {"error": f"no such path {url.path}"})
            name = q.get("layer", default)
            w = weights.get(name)
            if w is None:
                return self.reply(404, {"error": f"no 2-D weight {name!r}"})
            g = torch.Generator().manual_seed(int(q.get("seed", "0")))
            x = torch.randn(w.shape[1], generator=g).to(w.dtype)
            t0 = time.perf_counter()
            with torch.inference_mode():
                y = torch.mv(w, x).float()
            ms = (time.perf_counter() - t0) * 1e3
            self.reply(200, {"pid": os.getpid(), "layer": name, "shape": list(w.shape),
                             "sum": float(y.sum()), "norm": float(y.norm()), "ms": ms})

        def log_message(self, fmt, *a):  # quiet
            pass

    return Handler


class Server(socketserver.TCPServer):
    allow_reuse_address = True


def worker(args, sock, pre):
    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked by the parent
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    state, source = load(args, pre)
    load_s = time.perf_counter() - t0
    checksum = touch(state) if args.touch else None
    srv = Server(sock.getsockname(), make_handler(state, source), bind_and_activate=False)
    srv.socket.close()
    srv.socket = sock
    # one write(2) of less than PIPE_BUF: lines from workers never interleave
    os.write(1, (json.dumps({"worker": os.getpid(), "port": sock.getsockname()[1],
                             "load_seconds": load_s, "tensors": len(state),
                             "source": source, "checksum": checksum}) + "\n").encode())
    try:
        srv.serve_forever()
    finally:
        os._exit(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="safetensors path or wcached model name")
    ap.add_argument("--port", type=int, default=8377, help="0 picks a free port")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--loader", choices=("wcache", "torch", "none"), default="wcache")
    ap.add_argument("--pt", help="checkpoint for --loader torch")
    ap.add_argument("--touch", action="store_true",
                    help="read every page before serving (for memory figures)")
    ap.add_argument("--attach-before-fork", action="store_true",
                    help="attach once in the parent; workers inherit the mapping")
    args = ap.parse_args()
    if args.loader == "torch" and not args.pt:
        ap.error("--loader torch needs --pt CHECKPOINT")

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(128)
    pre = None
    if args.attach_before_fork and args.loader == "wcache":
        pre = wcache.safe_open(args.model, framework="pt")
    print(f"prefork_server: http://127.0.0.1:{sock.getsockname()[1]}/ "
          f"({args.workers} workers, loader {args.loader})", file=sys.stderr, flush=True)

    children = []

    def stop(*_):
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    # SIGTERM and SIGINT wait (blocked) until the parent's handler is in place: one
    # that came between the last fork and signal() would kill the parent alone and
    # leave its workers serving, holding the caller's pipes open.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        for _ in range(args.workers):
            pid = os.fork()
            if pid == 0:
                try:
                    worker(args, sock, pre)
                except BaseException as e:  # never return into the parent's code
                    print(f"prefork_server: worker {os.getpid()}: {e!r}", file=sys.stderr,
                          flush=True)
                    os._exit(1)
            children.append(pid)
    finally:
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    status = 0
    while children:
        try:
            pid, st = os.wait()
        except ChildProcessError:
            break
        if pid in children:
            children.remove(pid)
            if os.waitstatus_to_exitcode(st) not in (0, -signal.SIGTERM):
                print(f"prefork_server: worker {pid} exited with "
                      f"{os.waitstatus_to_exitcode(st)}", file=sys.stderr, flush=True)
                status = 1
                stop()
    return status


if __name__ == "__main__":
    sys.exit(main())
