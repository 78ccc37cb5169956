"""kube_worker.py: the worker the kube test runs in each worker container
(its source is the container's `python3 -c` program; argv[1] is JSON:
the model's name, the sha256 of all its tensors in name order, and the
sha256 of each tensor).

It connects with the wcache package as any worker does ($WCACHE_SOCKET,
the default deadline), attaches the model, checks every byte against the
digest, prints a "ready" line and keeps that model mapped (for the PSS
measurement). On SIGUSR1 it attaches, checks one tensor (the next each
time) and releases, in a loop, recording what every attach saw, until
SIGUSR2; then it checks every byte of the first attach again (its mapping
outlived any daemon in between) and prints one "summary" line. Lines are
JSON; times are CLOCK_MONOTONIC, which the host shares.
"""
import hashlib
import json
import re
import signal
import sys
import threading
import time

import wcache

spec = json.loads(sys.argv[1])
state = {"go": False, "stop": False}


def wait_for_signals():
    """SIGUSR1 starts the loop, SIGUSR2 ends it. They are blocked in every
    thread and taken here with sigwait, so that none interrupts a call
    into libwcache (EINTR would look like an attach that failed)."""
    while not state["stop"]:
        sig = signal.sigwait({signal.SIGUSR1, signal.SIGUSR2})
        state["go" if sig == signal.SIGUSR1 else "stop"] = True


signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGUSR2})
threading.Thread(target=wait_for_signals, daemon=True).start()


def say(**fields):
    print(json.dumps(fields), flush=True)


def digest(model, names):
    h = hashlib.sha256()
    for name in names:
        h.update(model.numpy(name))
    return h.hexdigest()


client = wcache.connect()
t = time.monotonic()
held = client.attach(spec["model"])
names = sorted(held.keys())
if digest(held, names) != spec["digest"]:
    say(event="fail", why=f"{spec['model']} generation {held.generation}: bytes differ")
    sys.exit(1)
say(event="ready", generation=held.generation, verify_s=round(time.monotonic() - t, 3))
while not state["go"]:
    time.sleep(0.01)

ok = bad = 0
errors = {}       # kind -> count
messages = {}     # kind -> first message
gaps = []         # [end of the last attach that worked, end of the next that did]
failing = False
last_ok = time.monotonic()
slowest = slowest_failure = 0.0
generations = set()
i = 0
while not state["stop"]:
    t = time.monotonic()
    try:
        m = client.attach(spec["model"])
    except wcache.WcacheError as e:
        # By class, errno and the system's reason at the end of the
        # message: a socket not there yet, or one nobody listens on.
        reason = re.search(r"\(([^()]*)\)$", str(e))
        kind = f"{type(e).__name__}({e.errno})" + (f" [{reason.group(1)}]" if reason else "")
        errors[kind] = errors.get(kind, 0) + 1
        messages.setdefault(kind, str(e))
        slowest_failure = max(slowest_failure, time.monotonic() - t)
        if not failing:
            gaps.append([last_ok, None])
            failing = True
        time.sleep(0.02)  # a worker's retry
        continue
    last_ok = time.monotonic()
    slowest = max(slowest, last_ok - t)
    if failing:
        gaps[-1][1] = last_ok
        failing = False
    name = names[i % len(names)]
    i += 1
    generations.add(m.generation)
    if hashlib.sha256(m.numpy(name)).hexdigest() == spec["tensors"][name]:
        ok += 1
    else:
        bad += 1
    m.close()
say(event="summary", ok=ok, bad=bad, errors=errors, messages=messages,
    gaps=gaps, slowest_attach_s=round(slowest, 4),
    slowest_failure_s=round(slowest_failure, 4), generations=sorted(generations),
    held_intact=digest(held, names) == spec["digest"])
