"""Fixtures of the Python package's tests (helpers are in pyhelpers.py)."""
import pytest

from pyhelpers import Daemon, mkmodel
from wcached import pytest_sessionfinish  # noqa: F401 (the hook)


@pytest.fixture
def model_path(tmp_path):
    return mkmodel(tmp_path / "small.safetensors")


@pytest.fixture
def daemon(tmp_path, model_path, monkeypatch):
    """wcached serving model_path as "small"; $WCACHE_SOCKET points at it."""
    import wcache._safe_open as so
    d = Daemon(tmp_path, {"small": model_path}).start()
    monkeypatch.setenv("WCACHE_SOCKET", d.socket)
    so._shared = None  # forget connections to earlier tests' daemons
    yield d
    so._shared = None
    status = d.stop()
    assert status == 0, f"wcached exited with {status}:\n{d.read_log()}"


@pytest.fixture
def no_daemon(tmp_path, monkeypatch):
    """$WCACHE_SOCKET points at a socket nobody listens on."""
    import wcache._safe_open as so
    path = str(tmp_path / "nobody.sock")
    monkeypatch.setenv("WCACHE_SOCKET", path)
    so._shared = None
    yield path
    so._shared = None


@pytest.fixture
def cpu_device(monkeypatch):
    """device="cuda:0" runs the engine on CpuBackend (refusing nothing), so
    safe_open's device path is exercised on a machine without a GPU."""
    from wcache import _device
    from wcache._device import CpuBackend
    made = []

    def backend_for(device):
        made.append(CpuBackend())
        return made[-1]
    monkeypatch.setattr(_device, "backend_for", backend_for)
    monkeypatch.setattr(_device, "SMALL_COPY", 0)
    monkeypatch.setattr(_device.to_device, "__defaults__", (None, None, 0))
    return made
