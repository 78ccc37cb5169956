"""kube_podman.py: podman for the kube system test, confined to the test's
own storage, configuration and cgroup, and a Kubernetes Pod spec run the
way a kubelet runs it, with `podman pod create` and `podman run`.

Why not `podman kube play`: Debian 12's podman 4.3 plays Pods and
Deployments (not DaemonSets), and puts every pod it plays under the
cgroup /libpod_parent at the root of each hierarchy: kube play has no
--cgroup-parent, and containers.conf has no key for a pod's cgroup parent
(runc refuses cgroups = "disabled"). The test must keep every container
under its own cgroup, so a Pod spec becomes `podman pod create
--cgroup-parent` and one `podman run --pod` per container: the same image,
command, user, groups, capabilities, read-only root, no-new-privileges,
default seccomp profile, volumes and mounts. A field this file does not
know is an error naming it, never something silently dropped.
"""
import json
import os
import shutil
import subprocess

# Debian 12's podman with this host's hybrid cgroups: crun refuses them,
# runc works; the limits are explicit (the host's own are unusual).
ULIMITS = ("nofile=16384:16384", "nproc=4096:4096")
CONTAINERS_CONF = """\
# Written by tests/system/kube_podman.py: the kube test's own podman setup.
[containers]
default_ulimits = [{ulimits}]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""

# Fields of a Pod that a node without a scheduler has nothing to do with.
IGNORED_POD = {"priorityClassName": "scheduling order among Pods"}
# Fields of a container the caller handles itself (the probes: the test
# runs them with podman exec) or that only schedule (resource requests).
IGNORED_CONTAINER = {"readinessProbe", "livenessProbe"}


class PodmanError(RuntimeError):
    pass


def cgroups_of(pid="self"):
    """PID's cgroup path in each hierarchy, by the hierarchy's
    "id:controllers" prefix of /proc/PID/cgroup."""
    with open(f"/proc/{pid}/cgroup") as f:
        return dict(line.rstrip("\n").rsplit(":", 1) for line in f if line.strip())


def _under(path, top):
    return top == "/" or path == top or path.startswith(top + "/")


def own_cgroup():
    """This process's cgroup: the deepest path /proc/self/cgroup lists (on a
    hybrid host, the v1 memory controller's, where the limits are)."""
    return max(cgroups_of().values(), key=len)


def cgroup_mounts():
    """The mount points of every cgroup hierarchy (v1 and v2)."""
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            if fields[sep + 1] in ("cgroup", "cgroup2"):
                mounts.append(fields[4])
    return mounts


class Cgroup:
    """The test's own cgroup, PARENT below this process's, where podman
    puts every pod and container (--cgroup-parent) and conmon. remove()
    deletes what the runs created in every hierarchy: the parent's subtree
    and any of its ancestors that did not exist before."""

    def __init__(self, name):
        self.parent = os.path.join(own_cgroup(), name)
        self.created = []  # directories to remove, deepest first
        for mount in cgroup_mounts():
            parts = self.parent.strip("/").split("/")
            for depth in range(len(parts), 0, -1):
                d = os.path.join(mount, *parts[:depth])
                if os.path.isdir(d):
                    break
                self.created.append(d)

    def holds(self, pid):
        """True when every hierarchy puts PID under the parent."""
        return all(_under(p, self.parent) for p in cgroups_of(pid).values())

    def outside_ours(self, pid):
        """The hierarchies ("id:controllers") where PID is not under this
        process's own cgroup (conmon, for one, stays in ours where podman
        has no controller to move it with)."""
        mine = cgroups_of()
        return [h for h, p in cgroups_of(pid).items() if not _under(p, mine.get(h, "?"))]

    def remove(self):
        """Removes the created cgroups; returns those that would not go."""
        left = []
        for top in self.created:
            if not os.path.isdir(top):
                continue
            for d, _, _ in os.walk(top, topdown=False):
                try:
                    os.rmdir(d)
                except OSError as e:
                    left.append(f"{d} ({e.strerror})")
        return left


class Podman:
    """podman with storage under WORK, run state in RUNROOT, the
    configuration above and every container under CGROUP.parent. LOG gets
    each command line and its output."""

    def __init__(self, work, runroot, cgroup, log):
        self.root = os.path.join(work, "storage")
        self.runroot = runroot
        self.cgroup = cgroup
        self.log = log
        os.makedirs(work, exist_ok=True)
        self.conf = os.path.join(work, "containers.conf")
        with open(self.conf, "w") as f:
            f.write(CONTAINERS_CONF.format(ulimits=", ".join(f'"{u}"' for u in ULIMITS)))
        self.env = dict(os.environ, CONTAINERS_CONF=self.conf)

    def argv(self, args):
        # skip_mount_home: the overlay driver would otherwise leave its
        # folder mounted on itself, and `make clean` could not remove it.
        return ["podman", "--root", self.root, "--runroot", self.runroot,
                "--tmpdir", os.path.join(self.runroot, "libpod"), "--runtime", "runc",
                "--cgroup-manager", "cgroupfs", "--storage-driver", "overlay",
                "--storage-opt", "overlay.skip_mount_home=true"] + list(args)

    def __call__(self, *args, check=True, timeout=120, input=None):
        """Runs podman ARGS; returns the CompletedProcess (text). CHECK: a
        non-zero exit raises PodmanError with the command and its stderr."""
        cmd = self.argv(args)
        self.log.write("$ " + " ".join(cmd) + "\n")
        self.log.flush()
        r = subprocess.run(cmd, input=input, capture_output=True, text=True, env=self.env,
                           timeout=timeout)
        self.log.write(r.stdout + r.stderr)
        if check and r.returncode != 0:
            raise PodmanError(f"podman {' '.join(args[:2])} exited with {r.returncode}: "
                              + (r.stderr.strip().splitlines() or ["(no output)"])[-1])
        return r

    def inspect(self, name):
        return json.loads(self("inspect", name).stdout)[0]

    def open_storage(self):
        """Checks that the storage answers; one made with other settings
        (podman's database records its run state folder) is removed, with
        its cached images, and made again. Returns what happened."""
        r = self("images", "--quiet", check=False)
        if r.returncode == 0:
            return "ready"
        if "database configuration mismatch" not in r.stderr:
            raise PodmanError(f"podman images: {r.stderr.strip()}")
        overlay = os.path.join(self.root, "overlay")
        if os.path.ismount(overlay):
            subprocess.run(["umount", overlay], check=False)
        shutil.rmtree(self.root)
        self("images", "--quiet")
        return "made again (the old one had other settings)"

    def remove_all(self):
        """Removes every pod and container in the test's storage (what a
        run left, even an interrupted one); images stay (the cache)."""
        self("pod", "rm", "--all", "--force", "--time", "0", check=False, timeout=120)
        self("rm", "--all", "--force", "--time", "0", check=False, timeout=120)
        overlay = os.path.join(self.root, "overlay")
        if os.path.ismount(overlay):  # left by a run without skip_mount_home
            subprocess.run(["umount", overlay], check=False)


def _volume_sources(spec, host_paths, configmaps, confdir):
    """The host path of each of SPEC's volumes: hostPaths through HOST_PATHS
    (a path it does not name is an error: the test never mounts the
    machine's own), configMaps written as files under CONFDIR, emptyDirs
    as new directories there, writable by every user (as a kubelet makes
    them)."""
    sources = {}
    for v in spec.get("volumes", []):
        name = v["name"]
        if "hostPath" in v:
            path = v["hostPath"]["path"]
            if path not in host_paths:
                raise PodmanError(f"volume {name}: hostPath {path} has no test directory")
            src = host_paths[path]
            kind = v["hostPath"].get("type", "")
            if kind == "DirectoryOrCreate":
                os.makedirs(src, mode=0o755, exist_ok=True)
            elif kind == "Directory" and not os.path.isdir(src):
                raise PodmanError(f"volume {name}: hostPath {path} ({src}) is not a directory")
            elif kind not in ("Directory", "DirectoryOrCreate"):
                raise PodmanError(f"volume {name}: hostPath type {kind!r} not handled")
            sources[name] = (src, False)
        elif "configMap" in v:
            cm = configmaps[v["configMap"]["name"]]
            src = os.path.join(confdir, name)
            os.makedirs(src, exist_ok=True)
            for key, value in cm["data"].items():
                with open(os.path.join(src, key), "w") as f:
                    f.write(value)
                os.chmod(os.path.join(src, key), 0o644)
            sources[name] = (src, True)  # a configMap volume is read-only
        elif "emptyDir" in v:
            src = os.path.join(confdir, name)
            os.makedirs(src, exist_ok=True)
            os.chmod(src, 0o777)
            sources[name] = (src, False)
        else:
            raise PodmanError(f"volume {name}: only hostPath, configMap and emptyDir are "
                              "handled")
    return sources


def _security_flags(pod_sc, sc, where):
    """podman run flags for the Pod's securityContext POD_SC overridden by
    the container's SC."""
    known_pod = {"runAsUser", "runAsGroup", "runAsNonRoot", "supplementalGroups",
                 "seccompProfile"}
    known = {"runAsUser", "runAsGroup", "runAsNonRoot", "allowPrivilegeEscalation",
             "readOnlyRootFilesystem", "capabilities"}
    for keys, allowed, what in ((pod_sc, known_pod, "Pod"), (sc, known, where)):
        extra = set(keys) - allowed
        if extra:
            raise PodmanError(f"{what}: securityContext field {sorted(extra)[0]} not handled")
    merged = dict(pod_sc, **sc)
    flags = []
    uid, gid = merged.get("runAsUser"), merged.get("runAsGroup")
    if uid is None:
        raise PodmanError(f"{where}: no runAsUser (the test runs every container as a"
                          " known uid)")
    if merged.get("runAsNonRoot") and uid == 0:
        raise PodmanError(f"{where}: runAsNonRoot with runAsUser 0 (a kubelet refuses it)")
    flags += ["--user", f"{uid}:{gid if gid is not None else uid}"]
    for g in merged.get("supplementalGroups", []):
        flags += ["--group-add", str(g)]
    seccomp = pod_sc.get("seccompProfile", {}).get("type", "RuntimeDefault")
    if seccomp != "RuntimeDefault":  # podman's default profile is the runtime's
        raise PodmanError(f"{where}: seccompProfile {seccomp} not handled")
    if merged.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    if merged.get("readOnlyRootFilesystem"):
        # As in Kubernetes: no writable tmpfs on /tmp and /run either.
        flags += ["--read-only", "--read-only-tmpfs=false"]
    caps = merged.get("capabilities", {})
    for c in caps.get("drop", []):
        flags += ["--cap-drop", c.lower()]
    for c in caps.get("add", []):
        flags += ["--cap-add", c.lower()]
    return flags


def _memory(quantity):
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    for suffix, factor in units.items():
        if str(quantity).endswith(suffix):
            return int(quantity[:-2]) * factor
    return int(quantity)


def _container_argv(pod_name, c, pod_sc, volumes, grace):
    """The `podman run` arguments (after "run") for container C."""
    known = {"name", "image", "command", "args", "env", "securityContext", "volumeMounts",
             "resources"} | IGNORED_CONTAINER
    where = f"container {c['name']}"
    extra = set(c) - known
    if extra:
        raise PodmanError(f"{where}: field {sorted(extra)[0]} not handled")
    argv = ["--pod", pod_name, "--name", f"{pod_name}-{c['name']}", "--pull", "never"]
    argv += [f"--ulimit={u}" for u in ULIMITS]
    argv += _security_flags(pod_sc, c.get("securityContext", {}), where)
    for e in c.get("env", []):
        argv += ["--env", f"{e['name']}={e['value']}"]
    for m in c.get("volumeMounts", []):
        src, always_ro = volumes[m["name"]]
        ro = always_ro or m.get("readOnly", False)
        argv += ["--volume", f"{src}:{m['mountPath']}:{'ro' if ro else 'rw'}"]
    limits = c.get("resources", {}).get("limits", {})
    if "memory" in limits:
        argv += ["--memory", str(_memory(limits["memory"]))]
    if grace is not None:
        argv += ["--stop-timeout", str(grace)]
    # command replaces the image's ENTRYPOINT, args its CMD.
    if "command" in c:
        argv += ["--entrypoint", json.dumps(c["command"])]
    return argv + [c["image"]] + list(c.get("args", []))


def run_pod(podman, name, spec, labels, host_paths, configmaps, confdir, override=None):
    """Runs the Pod spec SPEC as the pod NAME under the test's cgroup: its
    init containers one after the other to completion (a failure raises
    PodmanError with the container's output), then its containers in the
    background. OVERRIDE maps a container's name to fields that replace
    its own (the test's worker program). Returns the containers' names."""
    extra = set(spec) - {"containers", "initContainers", "securityContext", "volumes",
                         "terminationGracePeriodSeconds"} - set(IGNORED_POD)
    if extra:
        raise PodmanError(f"Pod {name}: field {sorted(extra)[0]} not handled")
    volumes = _volume_sources(spec, host_paths, configmaps, os.path.join(confdir, name))
    pod_sc = spec.get("securityContext", {})
    grace = spec.get("terminationGracePeriodSeconds")
    create = ["pod", "create", "--name", name, "--cgroup-parent", podman.cgroup.parent,
              "--network", "none"]
    for k, v in labels.items():
        create += ["--label", f"{k}={v}"]
    podman(*create)
    for c in spec.get("initContainers", []):
        argv = _container_argv(name, c, pod_sc, volumes, grace)
        r = podman("run", *argv, check=False, timeout=120)
        podman("rm", "--force", f"{name}-{c['name']}", check=False)
        if r.returncode != 0:
            raise PodmanError(f"Pod {name}: init container {c['name']} exited with "
                              f"{r.returncode}: {(r.stderr or r.stdout).strip()}")
    names = []
    for c in spec["containers"]:
        c = dict(c, **(override or {}).get(c["name"], {}))
        podman("run", "--detach", *_container_argv(name, c, pod_sc, volumes, grace))
        names.append(f"{name}-{c['name']}")
    return names
