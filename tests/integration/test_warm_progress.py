"""How far a model has warmed, as status and metrics report it: a percentage
and an estimate of the time left while it warms, 100 and 0 once ready; and
the warm log line, which gives a rate only when it has one."""
import re
import subprocess

from conftest import Daemon, binary, wait_until
from ctlutil import ctl, model_entry
from test_regressions import drop_page_cache


def make_big(tmp_path):
    """A 256 MiB model, written back and dropped from the page cache."""
    path = str(tmp_path / "big.safetensors")
    subprocess.run([binary("mkmodel"), "--hidden", "256", "--ffn", "512", "--vocab", "1000",
                    "--min-bytes", str(256 << 20), path], check=True,
                   stdout=subprocess.DEVNULL)
    drop_page_cache(path)
    return path


def test_warm_percent_eta_and_log(tmp_path):
    path = make_big(tmp_path)
    d = Daemon(tmp_path, {"big": path}).start()
    try:
        seen = []

        def ready():
            m = model_entry(d, "big")
            seen.append((m["state"], m["warm_percent"], m["warm_eta_seconds"]))
            return m["state"] == "ready"
        wait_until(ready, timeout=120, what="big ready")
        for state, percent, eta in seen:
            assert 0 <= percent <= 100, seen
            if state == "warming":
                assert percent < 100 and (eta is None or eta >= 0), seen
        # Percentages only grow while one generation warms.
        warming = [p for s, p, _ in seen if s == "warming"]
        assert warming == sorted(warming), seen
        m = model_entry(d, "big")
        assert m["warm_percent"] == 100 and m["warm_eta_seconds"] == 0, m
        metrics = ctl(d, "metrics").stdout
        assert re.search(r'^wcached_model_warm_percent\{model="big"\} 100$', metrics, re.M), \
            metrics
        assert re.search(r'^wcached_model_warm_eta_seconds\{model="big"\} 0$', metrics, re.M)
        log = d.read_log()
        line = re.search(r'generation \d+ warm: (\d+) bytes in ([0-9.]+) s(.*)', log)
        assert line, log
        assert "(0 MB/s)" not in log
        if float(line.group(2)) > 0:
            assert re.match(r" \(\d+ MB/s\)", line.group(3)), line.group(0)
    finally:
        assert d.stop() == 0, d.read_log()
