"""libwcache across restarts of the real wcached (issue 12, "Clients that do
not notice"): a worker keeps one wc_client while the daemon is stopped with
SIGTERM or killed with SIGKILL and a new wcached starts on the same socket
path. The next wc_attach() on the old client works without reconnecting by
hand; the models attached before keep reading; their release only unmaps
(the new daemon's attach count is not touched); wc_client_fd() changes.
The worker is tests/tools/restart_worker.c, driven line by line."""
import os
import subprocess
import sys

import pytest

from conftest import Daemon, binary, wait_until

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from restartutil import attached as count_attached, restart  # noqa: E402 (path set just above)


class Worker:
    def __init__(self, d, name="small"):
        self.p = subprocess.Popen([binary("restart_worker"), "--socket", d.socket, name],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        self.first = self.answer()

    def answer(self):
        line = self.p.stdout.readline().split()
        assert line and line[0] != "error", " ".join(line) + self.p.stderr.read()
        return line

    def ask(self, command):
        self.p.stdin.write(command + "\n")
        self.p.stdin.flush()
        return self.answer()

    def quit(self):
        self.p.stdin.write("quit\n")
        self.p.stdin.close()
        assert self.p.wait(timeout=60) == 0, self.p.stderr.read()


def attached(d, name="small"):
    return count_attached(d, binary("wcachectl"), name)


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_attach_after_restart(tmp_path, model, how):
    d = Daemon(tmp_path, {"small": model}).start()
    try:
        w = Worker(d)
        assert w.first[0] == "attached"
        wait_until(lambda: attached(d) == 1, what="the first attach to count")
        restart(d, how)
        again = w.ask("attach")
        assert again[0] == "attached"
        assert again[2] != w.first[2]       # a new connection: wc_client_fd() changed
        wait_until(lambda: attached(d) == 1, what="the attach after the restart to count")
        # The model from before the restart: released locally only. Had
        # its RELEASE reached the new daemon under a handle it reused, the
        # new attach would have gone from the count.
        assert w.ask("release 0") == ["released", "0"]
        assert w.ask("attach")[0] == "attached"   # the old one still read first
        wait_until(lambda: attached(d) == 2, what="the third attach to count")
        assert "RELEASE of unknown handle" not in d.read_log()
        assert w.ask("release 1") == ["released", "1"]
        wait_until(lambda: attached(d) == 1, what="the release to reach the new daemon")
        w.quit()
    finally:
        status = d.stop()
    assert status == 0, d.read_log()


def test_dispatch_reconnects(tmp_path, model):
    """An event-loop worker: after the restart, dispatch reconnects and
    the descriptor to poll changes; attaches then go over it."""
    d = Daemon(tmp_path, {"small": model}).start()
    try:
        w = Worker(d)
        restart(d, "sigterm")
        disp = w.ask("dispatch")
        assert disp[0] == "dispatched" and disp[2] != w.first[2]
        again = w.ask("attach")
        assert again[2] == disp[2]          # no second reconnect
        wait_until(lambda: attached(d) == 1, what="the attach after the restart to count")
        w.quit()
    finally:
        status = d.stop()
    assert status == 0, d.read_log()


def test_daemon_gone_is_an_error(tmp_path, model):
    """No daemon comes back: the attach fails once, saying so."""
    d = Daemon(tmp_path, {"small": model}).start()
    w = Worker(d)
    assert d.stop() == 0
    w.p.stdin.write("attach\n")
    w.p.stdin.flush()
    line = w.p.stdout.readline()
    assert line.startswith("error "), line
    assert "closed the connection, and connecting again failed" in line, line
    assert d.socket in line
    assert w.p.wait(timeout=60) == 1
