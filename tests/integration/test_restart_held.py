"""Generations workers still held at a warm restart (issue 12): the old
process stores them with the current ones, the new one restores them as held
and waits restart_hold_seconds for the workers to say so (HOLD, sent by
libwcache when it reconnects). One that a worker claims stays open until
that worker releases it; one nobody claims closes when the wait ends. Both
workers' mappings read right bytes throughout.

Uses tests/pyutil/fakemanager.py's fake service manager (through test_warm_restart); the worker is
tests/tools/restart_worker.c (test_restart's driver)."""
import json
import os
import subprocess

from conftest import Daemon, binary, mkmodel, wait_until
from test_restart import Worker
from test_warm_restart import FakeManager, ready, start  # FakeManager: tests/pyutil


def swap(path, seed):
    tmp = str(path) + ".new"
    mkmodel(tmp, seed=seed)
    os.rename(tmp, path)


def generations(d):
    r = subprocess.run([binary("wcachectl"), "status", "--json", "--control", d.control],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode in (0, 3), r.stderr
    return {m["name"]: {g["number"]: g for g in m.get("generations", [])}
            for m in json.loads(r.stdout)["models"]}


def current(d, name):
    return next((n for n, g in generations(d)[name].items() if g["current"]), None)


def stored_index(mgr, slot, number):
    return f"wc-{slot}-{number}-i" in mgr.store


def test_held_generations_survive_a_restart(tmp_path):
    a = mkmodel(tmp_path / "a.safetensors", seed=1)
    b = mkmodel(tmp_path / "b.safetensors", seed=2)
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    # 8 s: the restart, the checks here and the worker's HOLD all fit on a
    # loaded machine under ASan (3 s left little room).
    d = Daemon(tmp_path, {"a": a, "b": b}, extra="restart_hold_seconds = 8")
    w = v = None
    try:
        start(d, mgr)
        wait_until(lambda: ready(d, "a") and ready(d, "b"), what="the models ready")
        w = Worker(d, "a")          # holds a's generation 1, reconnects later
        v = Worker(d, "b")          # holds b's generation 1, stays idle
        assert w.first[1] == "1" and v.first[1] == "1", (w.first, v.first)
        swap(a, 11)
        swap(b, 12)
        wait_until(lambda: current(d, "a") == 2 and current(d, "b") == 2,
                   what="generation 2 of a and b")
        g = generations(d)
        assert g["a"][1]["attached"] == 1 and g["b"][1]["attached"] == 1, g
        # Old and new generations are stored (the description that names
        # them goes with the stop: restore_stopping).
        mgr.wait_for(lambda m: all(stored_index(m, s, n) for s in (1, 2) for n in (1, 2)),
                     what="both generations of a and b stored")

        assert d.stop() == 0, d.read_log()
        start(d, mgr, *mgr.listen_fds())
        wait_until(lambda: ready(d, "a") and ready(d, "b"), what="the models restored")
        log = d.read_log()
        for name in ("a", "b"):
            assert f'model "{name}": generation 2 restored from the file descriptor store' \
                in log, log
            assert (f'model "{name}": generation 1, held by workers before the restart, '
                    "restored") in log, log
        g = generations(d)
        assert g["a"][1]["attached"] == 0 and "hold_wait_ms" in g["a"][1], g
        assert g["b"][1]["attached"] == 0 and "hold_wait_ms" in g["b"][1], g

        # w's next call reconnects, and libwcache says it holds a's
        # generation 1 (HOLD) before its attach goes: its attach comes
        # from the new daemon, its old generation counts there again.
        assert w.ask("attach")[1] == "2"
        g = generations(d)
        assert g["a"][1]["attached"] == 1 and g["a"][2]["attached"] == 1, g
        # b's generation 1: nobody said so; it closes when the wait ends.
        wait_until(lambda: 1 not in generations(d)["b"], timeout=30,
                   what="b's unclaimed generation 1 closed")
        log = d.read_log()
        assert ('model "b": generation 1: no worker said it still holds it within 8 s of '
                "the restart") in log, log
        mgr.wait_for(lambda m: not stored_index(m, 2, 1), what="b's generation 1 left the store")
        # a's generation 1 outlives the wait: w holds it.
        assert generations(d)["a"][1]["attached"] == 1
        assert stored_index(mgr, 1, 1)
        # w's release of it reaches the daemon; the generation closes.
        assert w.ask("release 0") == ["released", "0"]
        wait_until(lambda: 1 not in generations(d)["a"], what="a's generation 1 closed")
        mgr.wait_for(lambda m: not stored_index(m, 1, 1), what="a's generation 1 left the store")
        # v's mapping of b's generation 1 still reads right (attach reads
        # every held model end to end first), and its release only unmaps.
        assert v.ask("attach")[1] == "2"
        assert v.ask("release 0") == ["released", "0"]
        assert generations(d)["b"][2]["attached"] == 1
        w.quit()
        v.quit()
        w = v = None
    finally:
        for p in (w, v):
            if p is not None:
                p.p.kill()
                p.p.wait()
        code = d.stop()
        mgr.close()
    assert code == 0, d.read_log()


def test_hold_of_unknown_generation_is_refused(tmp_path):
    """A HOLD the new daemon cannot match (the generation is not open) is
    refused; the worker's attach still works and its old release only
    unmaps."""
    a = mkmodel(tmp_path / "a.safetensors", seed=1)
    d = Daemon(tmp_path, {"a": a}).start()   # no manager: a cold restart
    w = None
    try:
        w = Worker(d, "a")
        swap(a, 5)
        wait_until(lambda: current(d, "a") == 2, what="generation 2")
        assert d.stop() == 0, d.read_log()
        d.start()                             # numbers start again at 1
        wait_until(lambda: current(d, "a") == 1, what="generation 1 of the new daemon")
        assert w.ask("attach")[1] == "1"
        log = d.read_log()
        assert "holds \"a\" generation 1" not in log, log
        g = generations(d)["a"]
        assert g[1]["attached"] == 1, g       # the new attach only
        assert w.ask("release 0") == ["released", "0"]   # only unmaps
        assert generations(d)["a"][1]["attached"] == 1
        w.quit()
        w = None
    finally:
        if w is not None:
            w.p.kill()
            w.p.wait()
        code = d.stop()
    assert code == 0, d.read_log()
