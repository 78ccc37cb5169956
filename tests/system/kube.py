#!/usr/bin/python3
"""The kube system test: deploy/Containerfile, deploy/Containerfile.worker
and the manifests of deploy/k8s run for real, with podman and runc.

    tests/system/kube.py --build BUILD [--debs DIR]

Builds the images from a debootstrapped Debian 12 base without network
(kube_image.py; the root and the images are cached under BUILD/kube and
reused while nothing that decides them changed), then runs the
DaemonSet's Pod template and worker.yaml's Pod as a kubelet would, with
podman pod create and podman run (kube_podman.py says why not podman
kube play), only their hostPaths moved to the test's directories. The
checks:
  daemon_pod       the daemon's Pod starts: its init container, wcached as
                   uid 10001 with CAP_LEASE alone, a read-only root and the
                   models read-only, the client socket alone in the node's
                   /run/wcached; its readiness and liveness probes pass
  worker_manifest  worker.yaml's own command attaches the model, as uid
                   20001 in group 10001
  shared_copy      8 worker containers attach a 256 MiB model and check
                   every byte; the Pss of the model's mappings in them and
                   in wcached adds up to one copy (within 10%)
  confined         every container and its conmon are in the test's cgroup
  pids_limit       the daemon's image under --pids-limit 6 exits 1 naming its
                   threads and the limit (not an abort); under 11 it serves
  daemon_replaced  while the 8 workers attach, check a tensor and release
                   in a loop, the daemon's Pod is stopped and started again
                   (a rolling update): no byte differs, every worker
                   attaches again, and what the attaches saw in the gap is
                   printed
Every pod and container goes at the end, whatever happened; the images
stay, cached. Skips with one line starting with "SKIP kube tests:" only
where no container can run here: not root, podman, runc or debootstrap
missing, the Debian archive unreachable, or a container of the base
image failing to start. Ends with "N passed, N failed"; exit status 1
when a check failed.
"""
import argparse
import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import traceback

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kube_image  # noqa: E402
import model  # noqa: E402
import rootfs  # noqa: E402
from container import wait_for  # noqa: E402
from run import find_debs  # noqa: E402
from kube_podman import Cgroup, Podman, PodmanError, cgroups_of, run_pod  # noqa: E402

CAP_LEASE = 1 << 28  # linux/capability.h: the manifest adds LEASE alone

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
K8S = os.path.join(SRC, "deploy", "k8s")
TOOLS = ("podman", "runc", "conmon", "debootstrap", "tar", "dpkg-deb")
PACKAGES = ("wcached", "libwcache0", "python3-wcache")
WORKERS = 8
TENSORS, PAGES_PER_TENSOR = 16, 4096  # 16 tensors of 16 MiB
NODE = "kube"  # the pods' names: wcached-kube, worker-kube-N


class Failure(Exception):
    pass


def skip(reason):
    print(f"SKIP kube tests: {reason}", flush=True)
    sys.exit(0)


def manifests():
    """The documents of deploy/k8s by (kind, name)."""
    docs = {}
    for path in sorted(glob.glob(os.path.join(K8S, "*.yaml"))):
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc is not None:
                    docs[(doc["kind"], doc["metadata"]["name"])] = doc
    return docs


class Run:
    """One run of the checks: the manifests, the test's directories (the
    node's /srv/models and /run/wcached), the model and podman."""

    def __init__(self, podman, work):
        self.podman = podman
        self.work = work
        docs = manifests()
        self.daemonset = docs[("DaemonSet", "wcached")]
        self.worker = next(d for (kind, _), d in docs.items() if kind == "Pod")
        self.configmaps = {name: d for (kind, name), d in docs.items() if kind == "ConfigMap"}
        self.host_paths = {"/srv/models": os.path.join(work, "models"),
                           "/run/wcached": os.path.join(work, "run")}
        self.workers = []  # worker container names

    # ---- the model ---------------------------------------------------------

    def write_model(self):
        """Writes the model the ConfigMap's configuration serves, under the
        test's /srv/models, and returns the worker's expectations."""
        conf = next(iter(self.configmaps.values()))["data"]["wcached.conf"]
        self.model_name = re.search(r"^\[model (\S+)\]", conf, re.M).group(1)
        inside = re.search(r"^path = (\S+)", conf, re.M).group(1)
        if not inside.startswith("/srv/models/"):
            raise Failure(f"the ConfigMap's model path {inside} is not under /srv/models")
        directory = os.path.join(self.host_paths["/srv/models"], inside[len("/srv/models/"):])
        os.makedirs(directory, mode=0o755)
        self.model_path = os.path.join(directory, "model.safetensors")
        digest = model.write(self.model_path, seed=21, tensors=TENSORS,
                             pages_per_tensor=PAGES_PER_TENSOR)
        size = PAGES_PER_TENSOR * model.PAGE
        tensors = {}
        with open(self.model_path, "rb") as f:
            for i in range(TENSORS):
                f.seek(model.PAGE + i * size)
                tensors[f"layer.{i}.weight"] = hashlib.sha256(f.read(size)).hexdigest()
        model.drop_pages(self.model_path)  # the daemon warms it from disk
        self.model_size = os.path.getsize(self.model_path)
        return {"model": self.model_name, "digest": digest, "tensors": tensors}

    # ---- pods --------------------------------------------------------------

    def start_daemon(self):
        """Runs the DaemonSet's Pod template and waits for its readiness
        probe. Returns the daemon's container name."""
        template = self.daemonset["spec"]["template"]
        name = f"{self.daemonset['metadata']['name']}-{NODE}"
        [ctr] = run_pod(self.podman, name, template["spec"], template["metadata"]["labels"],
                        self.host_paths, self.configmaps, os.path.join(self.work, "config"))
        spec = next(c for c in template["spec"]["containers"] if c["name"] == "wcached")
        probe = spec["readinessProbe"]["exec"]["command"]

        def ready():
            if self.podman("exec", ctr, *probe, check=False).returncode == 0:
                return True
            if not self.podman.inspect(ctr)["State"]["Running"]:
                raise Failure(f"{ctr} exited: {self.logs(ctr)[-400:]}")
            return False

        wait_for(f"{ctr}'s readiness probe ({' '.join(probe)})", ready, 60, interval=0.1)
        self.daemon_pod, self.daemon = name, ctr
        return ctr

    def logs(self, ctr):
        r = self.podman("logs", ctr, check=False)
        return r.stdout + r.stderr

    def start_workers(self, spec):
        """Runs WORKERS Pods from worker.yaml with kube_worker.py as their
        program. Returns their containers' names."""
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                               "kube_worker.py")) as f:
            program = f.read()
        wspec = self.worker["spec"]
        cname = wspec["containers"][0]["name"]
        override = {cname: {"command": ["python3", "-c", program], "args": [json.dumps(spec)]}}
        for i in range(WORKERS):
            name = f"worker-{NODE}-{i}"
            self.workers += run_pod(self.podman, name, wspec,
                                    self.worker["metadata"].get("labels", {}), self.host_paths,
                                    self.configmaps, os.path.join(self.work, "config"),
                                    override)
        return self.workers

    def events(self, ctr):
        out = []
        for line in self.podman("logs", ctr, check=False).stdout.splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    def pid(self, ctr):
        return self.podman.inspect(ctr)["State"]["Pid"]


def model_pss(pid, st):
    """(Pss, Rss) in bytes of PID's mappings of the file whose stat is ST."""
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    pss = rss = 0
    mine = False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            fields = line.split()
            if re.match(r"^[0-9a-f]+-[0-9a-f]+$", fields[0]):
                mine = len(fields) >= 5 and fields[3] == dev and fields[4] == str(st.st_ino)
            elif mine and fields[0] == "Pss:":
                pss += int(fields[1]) * 1024
            elif mine and fields[0] == "Rss:":
                rss += int(fields[1]) * 1024
    return pss, rss


# ---- the checks -----------------------------------------------------------

def check_daemon_pod(run):
    t = time.monotonic()
    ctr = run.start_daemon()
    took = time.monotonic() - t
    info = run.podman.inspect(ctr)
    cfg, host = info["Config"], info["HostConfig"]
    if cfg["User"] != "10001:10001":
        raise Failure(f"{ctr} runs as {cfg['User']!r}, not 10001:10001")
    status = open(f"/proc/{info['State']['Pid']}/status").read()
    caps = re.search(r"^CapEff:\s*(\S+)", status, re.M).group(1)
    # The manifest adds LEASE (its writer check): podman gives it to uid
    # 10001 as an ambient capability; a runtime that does not, nothing.
    if int(caps, 16) & ~CAP_LEASE:
        raise Failure(f"{ctr}'s wcached has capabilities {caps}, more than CAP_LEASE")
    if not host["ReadonlyRootfs"]:
        raise Failure(f"{ctr}'s root file system is writable")
    models = next(m for m in info["Mounts"] if m["Destination"] == "/srv/models")
    if models["RW"]:
        raise Failure(f"{ctr} mounts /srv/models writable")
    r = run.podman("exec", ctr, "sh", "-c", "touch /srv/models/x", check=False)
    if r.returncode == 0:
        raise Failure(f"{ctr} could write into /srv/models")
    sock = os.path.join(run.host_paths["/run/wcached"], "wcached.sock")
    shared = sorted(os.listdir(run.host_paths["/run/wcached"]))
    if shared != ["wcached.sock"]:
        raise Failure(f"the node's /run/wcached, which workers mount, holds {shared}, not "
                      "the client socket alone (the control socket must not be there)")
    st = os.stat(sock)
    if (st.st_uid, st.st_gid, st.st_mode & 0o777) != (10001, 10001, 0o660):
        raise Failure(f"the client socket is {st.st_uid}:{st.st_gid} "
                      f"{st.st_mode & 0o777:o}, not 10001:10001 660")
    spec = next(c for c in run.daemonset["spec"]["template"]["spec"]["containers"]
                if c["name"] == "wcached")
    r = run.podman("exec", ctr, *spec["livenessProbe"]["exec"]["command"], check=False)
    if r.returncode != 0:
        raise Failure(f"the liveness probe fails (exit {r.returncode}): {r.stdout}{r.stderr}")
    return (f"init container, then ready in {took:.1f} s; uid 10001, CapEff 0, read-only root"
            " and models, socket 10001:10001 0660 alone in /run/wcached, liveness probe passes")


def check_worker_manifest(run):
    """worker.yaml as it is: its own command, run to its end."""
    wspec = run.worker["spec"]
    name = f"{run.worker['metadata']['name']}-{NODE}"
    [ctr] = run_pod(run.podman, name, wspec, {}, run.host_paths, run.configmaps,
                    os.path.join(run.work, "config"))
    r = run.podman("wait", ctr, timeout=60)
    out = run.logs(ctr).strip()
    if r.stdout.strip() != "0" or not out.isdigit():
        raise Failure(f"{ctr} exited with {r.stdout.strip()}: {out[-400:]}")
    user = run.podman.inspect(ctr)["Config"]["User"]
    run.podman("pod", "rm", "--force", name)
    return f"its command printed generation {out} (user {user}, group 10001 added)"


def check_shared_copy(run, spec):
    t = time.monotonic()
    run.start_workers(spec)

    def all_ready():
        ready = 0
        for ctr in run.workers:
            events = run.events(ctr)
            if any(e["event"] == "fail" for e in events):
                raise Failure(f"{ctr}: {events[-1]['why']}")
            if not any(e["event"] == "ready" for e in events):
                if not run.podman.inspect(ctr)["State"]["Running"]:
                    raise Failure(f"{ctr} exited: {run.logs(ctr)[-600:]}")
                return False
            ready += 1
        return ready == len(run.workers)

    wait_for(f"{WORKERS} workers to check every byte", all_ready, 180, interval=0.5)
    took = time.monotonic() - t
    st = os.stat(run.model_path)
    pss = rss = 0
    for ctr in run.workers:
        p, r = model_pss(run.pid(ctr), st)
        pss += p
        rss += r
    # wcached maps every page too (it warms through its mapping): the one
    # copy is shared by all nine containers.
    daemon_pss, _ = model_pss(run.pid(run.daemon), st)
    ratio = (pss + daemon_pss) / run.model_size
    mib = 1 << 20
    detail = (f"{WORKERS} workers started and checked every byte in {took:.1f} s; model "
              f"{run.model_size / mib:.0f} MiB, summed Pss {(pss + daemon_pss) / mib:.1f} MiB ="
              f" {ratio:.3f}x (workers {pss / mib:.1f} MiB, wcached {daemon_pss / mib:.1f} MiB;"
              f" the workers' summed Rss {rss / mib:.0f} MiB)")
    if not 0.9 <= ratio <= 1.1:
        raise Failure(f"summed Pss is not one copy: {detail}")
    return detail


def check_pids_limit(run):
    """The daemon's image under a container pids limit too low for its
    threads (podman run --pids-limit 6; a kubelet's podPidsLimit alike):
    wcached exits 1 with one line naming the threads and the limits in
    question (before: libuv aborted it, SIGABRT, not a word). With room for
    them (1 + 8 work + 2 prefetch: --pids-limit 11) the same start serves."""
    tag = next(c["image"] for c in run.daemonset["spec"]["template"]["spec"]["containers"]
               if c["name"] == "wcached")
    conf = os.path.join(run.work, "pids-limit.conf")
    with open(conf, "w") as f:
        f.write("[wcached]\nsocket = /tmp/wcached.sock\ncontrol = /tmp/control.sock\n"
                "prefetch_threads = 2\n")
    os.chmod(conf, 0o644)
    argv = ["--network", "none", "--cgroup-parent", run.podman.cgroup.parent, "--volume",
            f"{conf}:/etc/pids-limit.conf:ro"]
    cmd = [tag, "/usr/sbin/wcached", "-c", "/etc/pids-limit.conf"]
    want = ("wcached: fatal: cannot start 8 work threads: Resource temporarily unavailable (a "
            "limit on tasks: the user's RLIMIT_NPROC, the unit's TasksMax=, the container's "
            "pids limit)")
    r = run.podman("run", "--rm", "--pids-limit", "6", *argv, *cmd, check=False, timeout=60)
    if r.returncode != 1 or want not in r.stderr.splitlines():
        raise Failure(f"under --pids-limit 6 wcached exited with {r.returncode} (wanted 1 and "
                      f"{want!r}): {r.stderr.strip()[-400:]}")
    name = f"pids-limit-{NODE}"
    run.podman("run", "--detach", "--name", name, "--pids-limit", "11", *argv, *cmd)
    try:
        def serving():
            if "serving on /tmp/wcached.sock" in run.logs(name):
                return True
            if not run.podman.inspect(name)["State"]["Running"]:
                raise Failure(f"under --pids-limit 11 wcached exited: {run.logs(name)[-400:]}")
            return False
        wait_for("wcached to serve under --pids-limit 11", serving, 30, interval=0.1)
    finally:
        run.podman("rm", "--force", "--time", "0", name, check=False)
    return "--pids-limit 6: exit 1, the threads and the limit named; --pids-limit 11: serving"


def check_confined(run):
    """Each container's processes in the test's cgroup in every hierarchy;
    conmon in the test's where podman moves it (the controllers) and
    in ours everywhere."""
    ids = run.podman("ps", "--quiet", "--no-trunc").stdout.split()
    cgroup = run.podman.cgroup
    outside = []
    for cid in ids:
        info = run.podman.inspect(cid)
        pid, conmon = info["State"]["Pid"], info["State"]["ConmonPid"]
        if not cgroup.holds(pid):
            outside.append(f"{info['Name']} (PID {pid}) is outside {cgroup.parent}")
        if cgroup.outside_ours(conmon) or not any(
                p.startswith(cgroup.parent + "/") for p in cgroups_of(conmon).values()):
            outside.append(f"{info['Name']}'s conmon (PID {conmon}) is elsewhere: "
                           + ", ".join(f"{h}:{p}" for h, p in cgroups_of(conmon).items()))
    if outside:
        raise Failure("; ".join(outside))
    return (f"{len(ids)} containers under {cgroup.parent}, their conmon under it where podman"
            " moves it and under ours in every hierarchy")


def check_daemon_replaced(run):
    pids = [run.pid(ctr) for ctr in run.workers]
    for pid in pids:
        os.kill(pid, signal.SIGUSR1)
    time.sleep(2)  # the loop runs against the first daemon for a while
    t_stop = time.monotonic()
    run.podman("pod", "stop", "--time", "30", run.daemon_pod, timeout=60)
    t_stopped = time.monotonic()
    run.podman("pod", "rm", run.daemon_pod)
    run.start_daemon()
    t_ready = time.monotonic()
    time.sleep(2)  # and against the new one
    for pid in pids:
        os.kill(pid, signal.SIGUSR2)

    def summaries():
        got = [next((e for e in run.events(c) if e["event"] == "summary"), None)
               for c in run.workers]
        return got if all(got) else None

    got = wait_for("the workers' summaries", summaries, 60, interval=0.2)
    ok = sum(s["ok"] for s in got)
    bad = sum(s["bad"] for s in got)
    errors, messages = {}, {}
    for s in got:
        for kind, n in s["errors"].items():
            errors[kind] = errors.get(kind, 0) + n
        messages.update(s["messages"])
    gaps = [g for s in got for g in s["gaps"]]
    problems = []
    if bad:
        problems.append(f"{bad} tensor reads differ")
    for ctr, s in zip(run.workers, got):
        if not s["held_intact"]:
            problems.append(f"{ctr}: the model attached before the replacement changed")
        if any(end is None for _, end in s["gaps"]):
            problems.append(f"{ctr} never attached again")
    longest = max((end - start for start, end in gaps if end is not None), default=0.0)
    detail = (f"stop took {t_stopped - t_stop:.2f} s, new daemon ready {t_ready - t_stop:.2f} s "
              f"after the stop began; {ok} attaches checked a tensor, {bad} differed; "
              f"failed attaches: "
              + (", ".join(f"{k} x{n}" for k, n in sorted(errors.items())) or "none")
              + f"; longest gap seen by a worker {longest:.2f} s; slowest attach "
              f"{max(s['slowest_attach_s'] for s in got):.3f} s, slowest failed one "
              f"{max(s['slowest_failure_s'] for s in got):.3f} s")
    for kind, msg in sorted(messages.items()):
        detail += f"\n       {kind}: {msg}"
    if problems:
        raise Failure("; ".join(problems) + ": " + detail)
    return detail


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build", help="the build folder (caches, logs)")
    ap.add_argument("--debs", help="where make deb put the .deb files (default BUILD/deb)")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    cache = os.path.join(build, "kube")
    debdir = os.path.abspath(args.debs or os.path.join(build, "deb"))
    debs = {pkg: path for pkg, path in find_debs(debdir).items() if pkg in PACKAGES}
    if os.geteuid() != 0:
        skip("not root (podman with runc and cgroups needs root): run as root")
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        skip(f"{', '.join(missing)} missing: make deps installs podman, runc and debootstrap")
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, lambda signum, _: sys.exit(f"kube tests: interrupted by {signum}"))
    os.makedirs(cache, exist_ok=True)
    # One run at a time: a run starts by removing what another left.
    lock = open(os.path.join(cache, "lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SystemExit(f"kube tests: another run holds {lock.name}")

    t0 = time.monotonic()
    log = open(os.path.join(cache, "podman.log"), "w")
    cgroup = Cgroup(f"wcache-kube-{os.getpid()}")
    # Run state on tmpfs, one folder per storage (a build folder of its own).
    runroot = f"/run/wcache-kube-{hashlib.sha256(cache.encode()).hexdigest()[:8]}"
    podman = Podman(cache, runroot, cgroup, log)
    work = tempfile.mkdtemp(prefix="run-", dir=cache)
    os.chmod(work, 0o755)
    passed, failed = [], []
    try:
        how = podman.open_storage()
        podman.remove_all()  # what an interrupted run left
        print(f"kube tests: podman storage {podman.root} {how}", flush=True)
        t = time.monotonic()
        try:
            with open(os.path.join(cache, "debootstrap.log"), "a") as dlog:
                base, how = kube_image.base_image(podman, cache, list(debs.values()), dlog)
        except rootfs.Unavailable as e:
            skip(str(e))
        except (RuntimeError, OSError) as e:  # PodmanError included
            failed.append("base_image")
            print(f"FAIL base_image: {e}", flush=True)
            return finish(t0, passed, failed)
        smoke = podman("run", "--rm", "--network", "none", "--cgroup-parent", cgroup.parent,
                       base, "true", check=False)
        if smoke.returncode != 0:
            skip(f"a container of {base} cannot start here: "
                 + (smoke.stderr.strip().splitlines() or ["?"])[-1])
        print(f"kube tests: base image {base} ({how}, {time.monotonic() - t:.0f} s)",
              flush=True)
        try:
            run = Run(podman, work)
        except (KeyError, StopIteration, yaml.YAMLError) as e:
            failed.append("manifests")
            print(f"FAIL manifests: deploy/k8s lacks the DaemonSet wcached, a Pod or a"
                  f" ConfigMap, or does not parse: {e!r}", flush=True)
            return finish(t0, passed, failed)
        spec = {}

        def images():
            built = []
            for pod, ctr, recipe in ((run.daemonset["spec"]["template"]["spec"], "wcached",
                                      "Containerfile"),
                                     (run.worker["spec"], "worker", "Containerfile.worker")):
                tag = next(c["image"] for c in pod["containers"] if c["name"] == ctr)
                how = kube_image.build(podman, base, os.path.join(SRC, "deploy", recipe), tag,
                                       debdir, list(debs.values()))
                built.append(f"{tag} from deploy/{recipe} {how}")
            return "; ".join(built)

        def write_model():
            spec.update(run.write_model())
            return f"{run.model_size >> 20} MiB, {TENSORS} tensors, at {run.model_path}"

        print("kube tests: Pods run with podman pod create and podman run (podman 4.3's kube"
              " play cannot put them under the test's cgroup); not applied: priorityClassName,"
              " resources.requests (scheduling); the probes run with podman exec", flush=True)
        for name, check in (("images", images),
                            ("model", write_model),
                            ("daemon_pod", lambda: check_daemon_pod(run)),
                            ("worker_manifest", lambda: check_worker_manifest(run)),
                            ("shared_copy", lambda: check_shared_copy(run, spec)),
                            ("confined", lambda: check_confined(run)),
                            ("pids_limit", lambda: check_pids_limit(run)),
                            ("daemon_replaced", lambda: check_daemon_replaced(run))):
            t = time.monotonic()
            try:
                detail = check()
            except (Failure, PodmanError, RuntimeError, TimeoutError, OSError) as e:
                failed.append(name)
                print(f"FAIL {name}: {e}", flush=True)
                break  # each check needs the ones before
            except Exception:
                failed.append(name)
                print(f"FAIL {name}: {traceback.format_exc()}", flush=True)
                break
            passed.append(name)
            print(f"ok   {name} ({time.monotonic() - t:.1f} s; {detail})", flush=True)
        if failed and hasattr(run, "daemon"):
            print(f"--- {run.daemon} log (last 30 lines) ---\n"
                  + "\n".join(run.logs(run.daemon).splitlines()[-30:]), flush=True)
    finally:
        t = time.monotonic()
        podman.remove_all()
        shutil.rmtree(work, ignore_errors=True)
        left = cgroup.remove()
        log.close()
        print(f"kube tests: pods and containers removed in {time.monotonic() - t:.1f} s"
              f" (images kept in {podman.root}; podman's commands in {log.name})"
              + (f"; cgroups left: {', '.join(left)}" if left else ""), flush=True)
    return finish(t0, passed, failed)


def finish(t0, passed, failed):
    print(f"kube tests: {time.monotonic() - t0:.0f} s in all")
    print(f"{len(passed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
