"""rootfs.py: the Debian 12 root the system tests boot, built once with
debootstrap and cached under the build folder.

The root is keyed by everything that decides its contents (suite, mirror,
variant, package list, and LAYOUT below): a change to any of them, or a
root whose build did not finish, means a new debootstrap. A finished root
holds the file MARKER with its key; a build goes to DIR.partial and is
renamed into place only when complete, so an interrupted run leaves
nothing that looks finished. One build at a time per cache folder: a
second caller (tests/system/roots.py made it beside the ctest phases)
waits on the folder's lock and then finds the root finished.

The packages are systemd and its friends plus every dependency of the
.deb files under test (read from the packages themselves): the container
has no network, so `dpkg -i` there must find everything installed.
"""
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import urllib.error
import urllib.request

SUITE = "bookworm"
VARIANT = "minbase"
# What the checks use besides the packages' own dependencies: systemd as
# PID1 (systemd-sysv), D-Bus for systemctl, util-linux for fincore and
# runuser, python3 for a worker that drops a file's pages.
BASE_PACKAGES = ["systemd", "systemd-sysv", "dbus", "util-linux", "python3"]
# Bump when the way the root is made changes.
LAYOUT = 1
MARKER = ".wcache-system-root"
OWN_PACKAGES = {"wcached", "libwcache0", "libwcache-dev", "python3-wcache"}


class Unavailable(Exception):
    """The root cannot be built here for a reason outside the project
    (no archive configured, archive unreachable): the suite skips."""


def _deb822_stanzas(text):
    stanza = {}
    key = None
    for line in text.splitlines():
        if not line.strip():
            if stanza:
                yield stanza
            stanza, key = {}, None
        elif line.startswith("#"):
            continue
        elif line[0] in " \t" and key is not None:
            stanza[key] += " " + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            key = key.strip().lower()
            stanza[key] = value.strip()
    if stanza:
        yield stanza


def apt_mirror():
    """The Debian archive apt is configured with: $WCACHE_SYSTEM_MIRROR, else
    the first deb source of the sources.list.d/*.sources files (deb822) or
    sources.list that carries SUITE (else any that is not the security
    archive). Raises Unavailable when there is none."""
    if os.environ.get("WCACHE_SYSTEM_MIRROR"):
        return os.environ["WCACHE_SYSTEM_MIRROR"].rstrip("/")
    candidates = []  # (carries SUITE, uri)
    d = "/etc/apt/sources.list.d"
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if not name.endswith(".sources"):
            continue
        with open(os.path.join(d, name)) as f:
            for s in _deb822_stanzas(f.read()):
                if "deb" not in s.get("types", "").split() or s.get("enabled", "yes") == "no":
                    continue
                suites = s.get("suites", "").split()
                for uri in s.get("uris", "").split():
                    candidates.append((SUITE in suites, uri))
    for path in ["/etc/apt/sources.list"] + sorted(
            os.path.join(d, n) for n in (os.listdir(d) if os.path.isdir(d) else [])
            if n.endswith(".list")):
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for line in f:
                m = re.match(r"\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line)
                if m:
                    candidates.append((m.group(2) == SUITE, m.group(1)))
    for want_suite in (True, False):
        for has_suite, uri in candidates:
            if has_suite == want_suite and "security" not in uri and uri.startswith("http"):
                return uri.rstrip("/")
    raise Unavailable("apt has no Debian archive configured in /etc/apt/sources.list*"
                      " (set WCACHE_SYSTEM_MIRROR)")


def check_reachable(mirror, timeout=20):
    """Raises Unavailable unless MIRROR serves SUITE's Release file."""
    url = f"{mirror}/dists/{SUITE}/Release"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            r.read(1)
    except (urllib.error.URLError, OSError) as e:
        raise Unavailable(f"the Debian archive {mirror} is unreachable ({url}: {e})")


def deb_dependencies(debs):
    """The packages the .deb files depend on (first alternative of each,
    without versions or architecture qualifiers), minus the project's own."""
    names = set()
    for deb in debs:
        out = subprocess.run(["dpkg-deb", "-f", deb, "Depends"], capture_output=True,
                             text=True, check=True).stdout
        for clause in out.split(","):
            first = clause.split("|")[0].strip()
            name = re.split(r"[\s(]", first, maxsplit=1)[0].split(":")[0]
            if name and name not in OWN_PACKAGES:
                names.add(name)
    return names


def packages_for(debs):
    return sorted(set(BASE_PACKAGES) | deb_dependencies(debs))


def root_key(mirror, packages):
    spec = {"suite": SUITE, "variant": VARIANT, "mirror": mirror, "packages": packages,
            "layout": LAYOUT}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def ensure_root(cache_dir, mirror, packages, log):
    """Returns the path of a finished root for MIRROR and PACKAGES under
    CACHE_DIR, building it (and removing roots of other keys) when missing.
    LOG is a file for debootstrap's output. Raises Unavailable when the
    archive cannot be reached, RuntimeError when debootstrap fails."""
    os.makedirs(cache_dir, exist_ok=True)
    with open(os.path.join(cache_dir, "rootfs.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        return _ensure_root_locked(cache_dir, mirror, packages, log)


# debootstrap's own limit: a clean-clone CI took 628 to 1132 s at nice 19
# beside the tests, and over 1800 s on a machine loaded besides (2026-12-06).
DEBOOTSTRAP_TIMEOUT = 3600


def _remove_root(path):
    """Removes a root, half-made ones too: what debootstrap mounted in it
    (its proc, left mounted when debootstrap was killed) is unmounted first,
    deepest first, else rmtree fails on the mounted proc's files."""
    path = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        points = [line.split()[1].replace("\\040", " ") for line in f if line.strip()]
    for point in sorted((p for p in points if p == path or p.startswith(path + "/")),
                        key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False)
    shutil.rmtree(path, ignore_errors=True)


def _ensure_root_locked(cache_dir, mirror, packages, log):
    key = root_key(mirror, packages)
    root = os.path.join(cache_dir, f"rootfs-{key}")
    marker = os.path.join(root, MARKER)
    if os.path.exists(marker):
        with open(marker) as f:
            if f.read().strip() == key:
                return root, False
    check_reachable(mirror)
    for name in os.listdir(cache_dir):  # stale roots and half-made ones
        if name.startswith("rootfs-"):
            _remove_root(os.path.join(cache_dir, name))
    partial = root + ".partial"
    cmd = ["debootstrap", f"--variant={VARIANT}", "--include=" + ",".join(packages), SUITE,
           partial, mirror]
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    # Its own session: a debootstrap past its limit is killed whole (its
    # dpkg and chroot children too), not only the script.
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        rc = p.wait(timeout=DEBOOTSTRAP_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        _remove_root(partial)
        raise RuntimeError(f"debootstrap {SUITE} from {mirror} took more than "
                           f"{DEBOOTSTRAP_TIMEOUT} s; see {log.name}") from None
    if rc != 0:
        _remove_root(partial)
        # An archive that went away mid-way is no fault of the project.
        check_reachable(mirror)
        raise RuntimeError(f"debootstrap {SUITE} from {mirror} failed (exit {rc});"
                           f" see {log.name}")
    # Downloaded packages are not needed again: every run copies the root.
    archives = os.path.join(partial, "var", "cache", "apt", "archives")
    for name in os.listdir(archives):
        if name.endswith(".deb"):
            os.unlink(os.path.join(archives, name))
    with open(os.path.join(partial, MARKER), "w") as f:
        f.write(key + "\n")
    os.rename(partial, root)
    return root, True
