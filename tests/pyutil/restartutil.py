"""Helpers shared by the tests (and benchmarks) that restart a real wcached
under its clients: tests/integration/test_restart.py (libwcache) and
tests/python/test_restart.py (the Python package).

Both suites' Daemon classes (tests/integration/conftest.py,
tests/python/pyhelpers.py) are tests/pyutil/wcached.py's Wcached; the
helpers here only use what Wcached has (proc, logf, stop(), start(),
control) and take the path of the build's wcachectl from the caller, so
this module imports neither suite and can be imported from either
directory. Import it with

    sys.path.append(<tests>/pyutil); from restartutil import ...
"""
import json
import signal
import subprocess


def attached(d, wcachectl, name="small"):
    """How many attaches of model name the daemon d counts, by
    `wcachectl status` (exit status 3, "not ready", is fine)."""
    r = subprocess.run([wcachectl, "status", "--json", "--control", d.control],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode in (0, 3), r.stderr
    return next(m["attached"] for m in json.loads(r.stdout)["models"] if m["name"] == name)


def restart(d, how):
    """Stops d, with SIGTERM (how "sigterm": it must exit 0) or SIGKILL
    ("sigkill"), and starts a new wcached with the same configuration, on
    the same socket paths."""
    if how == "sigterm":
        assert d.stop() == 0, d.read_log()
    elif how == "sigkill":
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(timeout=60)
        d.logf.close()
    else:
        raise ValueError(f"restart how={how!r}: not sigterm or sigkill")
    d.start()
