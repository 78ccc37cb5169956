"""The README's "Serving real models" guide, done as it says: a Hugging Face
hub cache snapshot (a tree of symlinks into blobs/) served through a stable
symlink, moved to a new revision by one atomic symlink swap, the minimal
one-model configuration; and the Kubernetes manifests of deploy/k8s,
parsed and checked against each other, the configuration they carry and
the paths the Debian package installs."""
import json
import os
import re
import subprocess

import pytest
import yaml

from conftest import Daemon, binary, mkmodel, wait_until
from ctlutil import ctl, model_entry, wait_for_control

SRC = os.environ.get("WCACHE_SRCDIR") or os.path.join(os.path.dirname(__file__), "..", "..")
K8S = os.path.join(SRC, "deploy", "k8s")
SMALL = dict(layers=2, hidden=64, ffn=128, vocab=100)


def hub_snapshot(hub, revision, seed):
    """A hub cache entry the way huggingface_hub lays it out: the file in
    blobs/ under its hash, snapshots/REVISION/ holding relative symlinks."""
    repo = hub / "models--org--tiny"
    blobs = repo / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    tmp = blobs / f"incoming-{revision}"
    mkmodel(tmp, seed=seed, **SMALL)
    digest = subprocess.run(["sha256sum", str(tmp)], capture_output=True, text=True,
                            check=True).stdout.split()[0]
    os.rename(tmp, blobs / digest)
    (blobs / f"cfg-{revision}").write_text(json.dumps({"model_type": "llama"}))
    snap = repo / "snapshots" / revision
    snap.mkdir(parents=True)
    os.symlink(f"../../blobs/{digest}", snap / "model.safetensors")
    os.symlink(f"../../blobs/cfg-{revision}", snap / "config.json")
    return snap


def test_hub_snapshot_and_revision_swap(tmp_path):
    hub = tmp_path / "hub"
    rev1 = hub_snapshot(hub, "rev1", seed=1)
    served = tmp_path / "models"
    served.mkdir()
    os.symlink(rev1, served / "tiny")
    # The minimal configuration: one section, everything else defaults
    # (the sockets go in the test's directory, not /run).
    d = Daemon(tmp_path, {})
    with open(d.conf) as f:
        sockets = "".join(l for l in f if l.startswith(("[wcached]", "socket", "control")))
    with open(d.conf, "w") as f:
        f.write(f"{sockets}\n[model tiny]\npath = {served / 'tiny'}\n")
    r = subprocess.run([binary("wcached"), "--check", "-c", d.conf], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and 'model "tiny": ok' in r.stdout, r.stdout + r.stderr
    d.start()
    try:
        wait_for_control(d)
        wait_until(lambda: ctl(d, "status", "tiny").returncode == 0, what="rev1 ready")
        assert model_entry(d, "tiny")["generation"] == 1
        first = json.loads(d.attach("tiny", "--json").stdout)
        # A new revision arrives beside the old one; one rename switches.
        rev2 = hub_snapshot(hub, "rev2", seed=2)
        os.symlink(rev2, served / ".tiny.new")
        os.rename(served / ".tiny.new", served / "tiny")
        wait_until(lambda: (lambda m: m["generation"] == 2 and m["state"] == "ready")(
            model_entry(d, "tiny")), what="wcached to serve rev2 after the symlink swap")
        assert ctl(d, "status", "tiny").returncode == 0
        second = json.loads(d.attach("tiny", "--json").stdout)
        assert (first["generation"], second["generation"]) == (1, 2)
    finally:
        assert d.stop() == 0, d.read_log()


# ---- deploy/k8s -------------------------------------------------------------

def documents():
    docs = {}
    for name in sorted(os.listdir(K8S)):
        if name.endswith((".yaml", ".yml")):
            with open(os.path.join(K8S, name)) as f:
                for doc in yaml.safe_load_all(f):
                    if doc is not None:
                        docs[(doc["kind"], doc["metadata"]["name"])] = doc
    return docs


def volume(spec, name):
    return next(v for v in spec["volumes"] if v["name"] == name)


def mounts(container):
    return {m["name"]: m for m in container.get("volumeMounts", [])}


def test_k8s_manifests_parse_and_agree(tmp_path):
    docs = documents()
    for doc in docs.values():
        assert doc["apiVersion"] and doc["metadata"]["name"]
    ds = docs[("DaemonSet", "wcached")]
    assert ds["apiVersion"] == "apps/v1"
    assert ds["spec"]["selector"]["matchLabels"].items() <= \
        ds["spec"]["template"]["metadata"]["labels"].items()
    pod = ds["spec"]["template"]["spec"]
    daemon = next(c for c in pod["containers"] if c["name"] == "wcached")
    # The models read-only from the node, the sockets on the node.
    models, run = volume(pod, "models"), volume(pod, "run")
    assert run["hostPath"]["path"] == "/run/wcached"
    assert mounts(daemon)["run"]["mountPath"] == "/run/wcached"
    assert "hostPath" in models and mounts(daemon)["models"]["readOnly"] is True
    assert daemon["securityContext"]["capabilities"]["drop"] == ["ALL"]
    for init in pod.get("initContainers", []):
        assert mounts(init)["run"]["mountPath"] == "/run/wcached"

    # The configuration it carries is valid: with its model paths pointed at
    # a real model, wcached --check accepts it.
    cm = docs[("ConfigMap", volume(pod, "config")["configMap"]["name"])]
    conf_name = os.path.basename(daemon["command"][daemon["command"].index("-c") + 1])
    text = cm["data"][conf_name]
    model = mkmodel(tmp_path / "m.safetensors", **SMALL)
    local = re.sub(r"^path = .*$", f"path = {model}", text, flags=re.M)
    local = local.replace("/run/wcached/", f"{tmp_path}/")
    local = local.replace("/run/wcached-control/", f"{tmp_path}/")
    (tmp_path / "w.conf").write_text(local)
    r = subprocess.run([binary("wcached"), "--check", "-c", str(tmp_path / "w.conf")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "configures no model" not in r.stderr, r.stdout + r.stderr
    socket_path = re.search(r"^socket = (\S+)", text, re.M).group(1)
    control_path = re.search(r"^control = (\S+)", text, re.M).group(1)
    assert os.path.dirname(socket_path) == "/run/wcached"
    assert control_path in daemon["readinessProbe"]["exec"]["command"]
    # The control socket is not where workers reach: only the daemon's Pod
    # mounts its directory.
    assert not control_path.startswith("/run/wcached/")
    control_dir = os.path.dirname(control_path)
    assert any(m["mountPath"] == control_dir and "emptyDir" in volume(pod, m["name"])
               for m in daemon["volumeMounts"])

    # The programs are where the Debian package puts them.
    installed = open(os.path.join(SRC, "debian", "wcached.install")).read().split()
    assert daemon["command"][0].lstrip("/") in installed
    assert daemon["readinessProbe"]["exec"]["command"][0].lstrip("/") in installed

    # The worker reaches the socket: same node directory, the daemon's
    # group, and $WCACHE_SOCKET naming the configured socket; no model volume.
    worker = docs[("Pod", "inference-worker")]
    wspec = worker["spec"]
    wc = wspec["containers"][0]
    mounted = {m["mountPath"]: volume(wspec, m["name"]) for m in wc["volumeMounts"]}
    assert mounted["/run/wcached"]["hostPath"]["path"] == run["hostPath"]["path"]
    assert all(m["readOnly"] for m in wc["volumeMounts"] if m["mountPath"] == "/run/wcached")
    assert not any("/srv/models" in path for path in mounted)
    assert pod["securityContext"]["runAsGroup"] in wspec["securityContext"]["supplementalGroups"]
    env = {e["name"]: e["value"] for e in wc["env"]}
    assert env["WCACHE_SOCKET"] == socket_path
    assert worker["metadata"]["namespace"] == ds["metadata"]["namespace"]
    assert ("Namespace", ds["metadata"]["namespace"]) in docs


def quantity(text):
    """A Kubernetes memory quantity in bytes (the binary suffixes)."""
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)?", str(text))
    assert m, f"memory quantity {text!r}"
    return int(m.group(1)) << {None: 0, "Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40}[m.group(2)]


def containerfile(name):
    """deploy/NAME: the image its header's build command tags, its USER and
    its CMD."""
    with open(os.path.join(SRC, "deploy", name)) as f:
        text = f.read()
    header = "".join(l for l in text.splitlines(True) if l.startswith("#"))
    tag = re.search(rf"podman build -f deploy/{re.escape(name)}\s+(?:\\\s*#\s*)?-t (\S+)",
                    header).group(1)
    user = re.search(r"^USER (\d+):(\d+)$", text, re.M).groups()
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M).group(1))
    return tag, tuple(int(i) for i in user), cmd


def test_k8s_images_and_memory_advice():
    """The manifests run the images the Containerfiles build, as the users
    the images declare, and follow the README's memory advice: the daemon
    is node-critical, requests its warm set and has no memory limit below
    it."""
    docs = documents()
    pod = docs[("DaemonSet", "wcached")]["spec"]["template"]["spec"]
    daemon = next(c for c in pod["containers"] if c["name"] == "wcached")
    tag, user, cmd = containerfile("Containerfile")
    assert daemon["image"] == tag
    assert all(c["image"] == tag for c in pod.get("initContainers", []))
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == user
    assert daemon["command"] == cmd
    worker = docs[("Pod", "inference-worker")]["spec"]
    wtag, wuser, _ = containerfile("Containerfile.worker")
    assert worker["containers"][0]["image"] == wtag
    assert (worker["securityContext"]["runAsUser"], worker["securityContext"]["runAsGroup"]) \
        == wuser
    # Evicted last; the warm set requested, and no limit under it.
    assert pod["priorityClassName"] == "system-node-critical"
    resources = daemon["resources"]
    request = quantity(resources["requests"]["memory"])
    assert request >= 64 << 20
    limit = resources.get("limits", {}).get("memory")
    assert limit is None or quantity(limit) > request
    with open(os.path.join(K8S, "wcached.yaml")) as f:
        text = f.read()
    assert "deploy/Containerfile" in text and "yours to build" not in text
