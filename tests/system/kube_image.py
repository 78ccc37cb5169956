"""kube_image.py: the images of deploy/Containerfile and
deploy/Containerfile.worker, built for the kube test without a registry
or network.

The base is a Debian 12 root made with debootstrap (rootfs.ensure_root,
cached under BUILD/kube like the systemd suite's under BUILD/system) that
already holds every dependency of the packages, so the Containerfiles'
apt needs no index; `podman import` makes it the local image that the
builds take as their BASE (--network none). Both images are tagged with
the names the manifests use and labelled with a key of everything that
decides their contents (the base, the Containerfile, the .deb files): a
later run with the same key reuses them.
"""
import hashlib
import os
import re
import subprocess

import rootfs
from kube_podman import ULIMITS

# What the Containerfiles install besides the .deb files; their packages'
# dependencies come from the .deb files themselves.
IMAGE_PACKAGES = {"python3", "python3-numpy", "systemd-standalone-sysusers"}
BASE_REPO = "localhost/wcache-kube-base"
KEY_LABEL = "org.wcache.kube.key"


def base_packages(debs):
    """IMAGE_PACKAGES and the dependencies of DEBS: of each alternative
    (a | b), the one IMAGE_PACKAGES names, else the first."""
    names = set(IMAGE_PACKAGES)
    for deb in debs:
        out = subprocess.run(["dpkg-deb", "-f", deb, "Depends"], capture_output=True,
                             text=True, check=True).stdout
        for clause in out.split(","):
            alternatives = [re.split(r"[\s(:]", a.strip(), maxsplit=1)[0]
                            for a in clause.split("|") if a.strip()]
            if alternatives and not set(alternatives) & (names | rootfs.OWN_PACKAGES):
                names.add(alternatives[0])
    return sorted(names)


def _file_digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def base_image(podman, cache_dir, debs, log):
    """The local base image for DEBS (a list of paths), importing the
    cached root (built when missing). Returns (tag, what happened)."""
    root, built = rootfs.ensure_root(cache_dir, rootfs.apt_mirror(), base_packages(debs), log)
    tag = f"{BASE_REPO}:{os.path.basename(root).split('-', 1)[1]}"
    if not built and podman("image", "exists", tag, check=False).returncode == 0:
        return tag, "cached"
    tar = subprocess.Popen(["tar", "-C", root, "--exclude", f"./{rootfs.MARKER}", "-c", "."],
                           stdout=subprocess.PIPE)
    cmd = podman.argv(["import", "--quiet", "-", tag])
    r = subprocess.run(cmd, stdin=tar.stdout, capture_output=True, text=True, env=podman.env,
                       timeout=600)
    tar.stdout.close()
    if tar.wait() != 0 or r.returncode != 0:
        raise RuntimeError(f"podman import of {root} failed: {r.stderr.strip()}")
    return tag, "debootstrapped and imported" if built else "imported"


def build(podman, base, containerfile, tag, context, debs):
    """Builds CONTAINERFILE (context CONTEXT, the folder of the .deb files)
    from BASE as TAG unless TAG already carries the same key. Returns
    "cached" or "built"."""
    h = hashlib.sha256(base.encode())
    with open(containerfile, "rb") as f:
        h.update(f.read())
    for deb in sorted(debs):
        h.update(_file_digest(deb).encode())
    key = h.hexdigest()[:16]
    r = podman("image", "inspect", "--format", "{{index .Labels \"" + KEY_LABEL + "\"}}", tag,
               check=False)
    if r.returncode == 0 and r.stdout.strip() == key:
        return "cached"
    # buildah runs each RUN step in the --cgroup-parent cgroup itself, not
    # a child of it: a leaf of its own (runc cannot deny all devices to a
    # v1 cgroup that has children, such as the test's own).
    podman("build", "--quiet", "--network", "none", "--pull=never",
           "--cgroup-parent", podman.cgroup.parent + "/build", *(f"--ulimit={u}" for u in ULIMITS),
           "--build-arg", f"BASE={base}", "--label", f"{KEY_LABEL}={key}",
           "-f", containerfile, "-t", tag, context, timeout=600)
    # The image this tag named before is of no use any more.
    podman("image", "prune", "--force", check=False)
    return "built"
