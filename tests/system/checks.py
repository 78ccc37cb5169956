"""checks.py: what the system suite checks in the booted container, in
order. Each check is a method of Checks listed in ORDER; they share one
daemon and build on each other (the models a reload added are there for
the swaps). After every check that leaves the daemon running, the runner
also checks it is the same process (systemctl's MainPID) and that the
journal never saw it killed (code=killed, status=31/SYS).

The deployment is a packager's: the project's .deb files, /etc/wcached.conf,
model files root-owned 0644 under /srv/models, the daemon as the packaged
user wcache, and a worker user in group wcache.
"""
import json
import math
import os
import re
import resource
import subprocess
import time

import held
import load
import model
import tools
from container import Timeout, wait_for

MODELS = "/srv/models"
UNIT = "wcached.service"
WORKER = "worker"          # in group wcache: may use the client socket
OUTSIDER = "outsider"      # not in group wcache
SECURITY_MAX = 1.5         # systemd-analyze security exposure, as tests/integration
CAP_LEASE = 1 << 28        # linux/capability.h: the unit's one capability
KILLED = re.compile(r"code=(killed|dumped)|status=31/SYS")
KILL_9 = "code=killed, status=9/KILL"  # what systemd logs for a kill -9 of MainPID
LOAD_WORKERS = 8           # per mode of restart_under_load
RESTARTS = 5
HOLD_SECONDS = 3           # restart_hold_seconds for held_across_restart
STAGED = "staged"          # warm_restart's model with stage = yes
STAGE_DIR = "/var/cache/wcached/staged"  # the default stage_dir (CacheDirectory=wcached)
# The model the pin checks lock: 4 tensors of 16 MiB, 64 MiB and a page,
# more than the 8 MiB RLIMIT_MEMLOCK a service gets without LimitMEMLOCK=.
BIG = {"tensors": 4, "pages_per_tensor": 4096}
DROP_INS = "/etc/systemd/system/wcached.service.d"

# A worker that attaches a model with the Python package and reads every
# tensor: prints the generation and the sha256 of the bytes it saw.
WORKER_PY = """\
import hashlib, sys, wcache
with wcache.connect() as client:
    m = client.attach(sys.argv[1])
h = hashlib.sha256()
for name in sorted(m.keys()):
    h.update(bytes(m.raw(name)))
print(m.generation, h.hexdigest())
"""
# Drops a file's pages from the page cache, as any reader of it may.
DROP_PY = """\
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
"""


def config(models, extra="", daemon=""):
    """/etc/wcached.conf with MODELS (name -> section body), DAEMON's lines in
    [wcached] and EXTRA at the end."""
    text = ("[wcached]\nsocket = /run/wcached/wcached.sock\ncontrol = /run/wcached/control.sock\n"
            "log_level = info\n" + daemon)
    for name, body in models.items():
        text += f"\n[model {name}]\n{body}"
    return text + extra


class Failure(Exception):
    pass


class Skipped(Exception):
    """What a check could not do on this runner, and why (after checking
    what it could)."""


def expect(cond, message):
    if not cond:
        raise Failure(message)


class Checks:
    ORDER = ["install", "socket_activation", "sandbox", "memlock_limit", "check_status",
             "systemctl_status", "metrics", "residency_warm", "evict", "dropped_by_a_client",
             "pin", "pin_metadata_large", "pin_all_large", "pin_refused_filter",
             "pin_refused_limit", "memory_limit", "python_worker", "reload_good", "reload_bad", "rename_swaps", "in_place_write",
             "warm_restart", "restart_under_load", "held_across_restart", "journal_priorities",
             "analyze_security", "analyze_verify", "stop"]

    def __init__(self, container, debs):
        self.c = container
        self.debs = debs
        self.main_pid = None
        self.digests = {}       # model name -> sha256 of its tensors
        self.seed = 1
        self.models = {}        # the configuration's models: name -> section body
        self.kills = 0          # kill -9 of MainPID done on purpose
        self.memlock_max = None  # MainPID's RLIMIT_MEMLOCK (memlock_limit); None: unlimited

    # ---- helpers ----

    def sh(self, *argv, **kw):
        return self.c.run(list(argv), **kw)

    def show(self, *props, unit=UNIT):
        out = self.sh("systemctl", "show", unit, *[f"-p{p}" for p in props]).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def status(self):
        # Exit 0: every model ready; 3: some model is not (warming, cold).
        r = self.sh("wcachectl", "--json", "status", check=False)
        expect(r.returncode in (0, 3), f"wcachectl status exited {r.returncode}: {r.stderr}")
        return json.loads(r.stdout)

    def model_status(self, name):
        for m in self.status()["models"]:
            if m["name"] == name:
                return m
        raise Failure(f"wcachectl status does not list model {name!r}")

    def metric(self, name, model_name):
        text = self.sh("wcachectl", "metrics").stdout
        m = re.search(rf'^{name}{{[^}}]*model="{re.escape(model_name)}"[^}}]*}} (\S+)$', text,
                      re.M)
        expect(m, f"wcachectl metrics has no {name} for model {model_name!r}")
        return float(m.group(1))

    def fincore(self, path):
        r = self.sh("fincore", "--bytes", "--noheadings", "--output", "RES", path)
        return int(r.stdout.split()[0])

    def journal(self, *args):
        return self.sh("journalctl", "--no-pager", "-b", *args).stdout

    def write_model(self, name, path=None, **shape):
        """Writes model NAME's file (or PATH, for a replacement written beside
        it) with a new seed (and SHAPE, model.write's); remembers its digest
        for NAME."""
        path = path or f"{MODELS}/{name}.safetensors"
        self.seed += 1
        self.digests[name] = model.write(self.c.path(path), self.seed, **shape)
        return path

    def memlock(self, pid=None):
        """RLIMIT_MEMLOCK of PID (default MainPID) from /proc/PID/limits:
        (soft, hard) in bytes, None for unlimited."""
        text = self.sh("cat", f"/proc/{pid or self.main_pid}/limits").stdout
        m = re.search(r"^Max locked memory\s+(\S+)\s+(\S+)", text, re.M)
        expect(m, f"no 'Max locked memory' in /proc/{pid}/limits:\n{text}")
        return tuple(None if v == "unlimited" else int(v) for v in m.groups())

    def locked(self, pid=None):
        """VmLck of PID (default MainPID) in bytes."""
        text = self.sh("cat", f"/proc/{pid or self.main_pid}/status").stdout
        m = re.search(r"^VmLck:\s+(\d+) kB", text, re.M)
        expect(m, f"no VmLck in /proc/{pid}/status")
        return int(m.group(1)) * 1024

    def wait_model(self, name, what, pred, timeout=60):
        """Waits until PRED(model NAME's status entry) holds; returns the entry."""
        try:
            return wait_for(f"model {name}: {what}", lambda: (lambda m: pred(m) and m)(
                self.model_status(name)), timeout, interval=0.1)
        except Timeout as e:
            raise Failure(f"{e}; status says {self.model_status(name)}")

    def restart(self):
        """systemctl restart (a warm restart); the new MainPID, once every
        model is ready with its metadata locked again (restored generations
        lock it after they serve) or refused (pin_error)."""
        self.sh("systemctl", "reset-failed", UNIT)  # StartLimitBurst=: the test's pace
        self.sh("systemctl", "restart", UNIT, timeout=120)
        pid = int(self.show("MainPID")["MainPID"])
        expect(pid not in (0, self.main_pid), f"MainPID {pid} after systemctl restart")
        self.main_pid = pid
        self.pins_settled()
        return pid

    def pins_settled(self):
        """Waits until every model is ready with its pin applied or refused
        (pin_error): no lock or unlock is still running."""
        try:
            wait_for("every model ready, its pin applied or refused", lambda: all(
                m["state"] == "ready" and (m["pin_applied"] == m["pinned"] or m["pin_error"])
                for m in self.status()["models"]), 60, 0.1)
        except Timeout as e:
            raise Failure(f"{e}; status says {self.status()['models']}")

    def refusal_told(self, pid, name, m):
        """The refusal in model NAME's status entry M (pin_error) is also one
        warning in PID's journal, naming the model, and in wcachectl
        status's note on pins."""
        e = self.journal_entry(pid, f'model "{name}": {m["pin_error"]}')
        expect(e.get("PRIORITY") == "4", f"the refusal is at priority {e.get('PRIORITY')}")
        text = self.sh("wcachectl", "status", name, check=False).stdout
        note = (f"{name}: pin = {m['pinned']} asked, {m['pin_applied']} locked: "
                f"{m['pin_error']}")
        expect(note in text, f"wcachectl status does not say {note!r}:\n{text}")

    def with_drop_in(self, name, text):
        """Installs drop-in NAME.conf of the unit and restarts it; returns
        the new MainPID. drop_in_removed() undoes it."""
        os.makedirs(self.c.path(DROP_INS), exist_ok=True)
        with open(self.c.path(f"{DROP_INS}/{name}.conf"), "w") as f:
            f.write(text)
        self.sh("systemctl", "daemon-reload")
        return self.restart()

    def drop_in_removed(self, name):
        path = self.c.path(f"{DROP_INS}/{name}.conf")
        if os.path.exists(path):
            os.unlink(path)
        self.sh("systemctl", "daemon-reload")
        return self.restart()

    def write_config(self, text):
        with open(self.c.path("/etc/wcached.conf"), "w") as f:
            f.write(text)

    def wait_state(self, name, state, generation=None, timeout=60):
        def ok():
            m = self.model_status(name)
            return (m["state"] == state and (generation is None or m["generation"] == generation)
                    and m)
        try:
            return wait_for(f"model {name} to be {state}", ok, timeout, interval=0.1)
        except Timeout as e:
            raise Failure(f"{e}; status says {self.model_status(name)}")

    def attach(self, name, user=WORKER, check=True):
        r = self.sh("wcachectl", "attach", name, "--json", user=user, check=False, timeout=90)
        if check:
            expect(r.returncode == 0, f"wcachectl attach {name} as {user} exited with "
                   f"{r.returncode}: {r.stderr.strip()}")
            return json.loads(r.stdout)
        return r

    def residency_agrees(self, name, timeout=15):
        """Waits until the page cache holds still (fincore reads the same before
        and after) and status and metrics report exactly what fincore does for
        model NAME's file; returns that number. Strict: no tolerance."""
        path = f"{MODELS}/{name}.safetensors"
        last = {}

        def agree():
            before = self.fincore(path)
            status = self.model_status(name)["resident_bytes"]
            metric = self.metric("wcached_model_resident_bytes", name)
            after = self.fincore(path)
            last.update(fincore=after, status=status, metrics=metric)
            return before == after == status == metric and (after,)
        try:
            return wait_for(f"status and metrics to agree with fincore on {path}", agree,
                            timeout, interval=0.2)[0]
        except Timeout:
            raise Failure(f"resident bytes of {name}: fincore {last['fincore']}, status "
                          f"{last['status']}, metrics {last['metrics']:.0f} (they must be "
                          f"equal; file {model.file_size()} bytes)")

    def invariant(self):
        """The daemon is the process it was and was never killed."""
        p = self.show("MainPID", "ActiveState", "SubState")
        expect(p["ActiveState"] == "active" and p["SubState"] == "running",
               f"{UNIT} is {p['ActiveState']}/{p['SubState']}")
        expect(int(p["MainPID"]) == self.main_pid,
               f"MainPID changed from {self.main_pid} to {p['MainPID']}")
        self.never_killed()

    def never_killed(self):
        """No process of the unit died of a signal, but for the kill -9s the
        checks did themselves (self.kills)."""
        bad = [l for l in self.journal("-u", UNIT, "-o", "short").splitlines()
               if KILLED.search(l)]
        ours = [l for l in bad if KILL_9 in l]
        expect(len(bad) == len(ours) and len(ours) <= self.kills,
               "the journal says: " + " | ".join(bad))

    def wait_new_main(self, old, timeout=60):
        """Waits until the unit is active and running with a MainPID other
        than OLD (after READY=1: Type=notify) and returns it."""
        def new():
            p = self.show("MainPID", "ActiveState", "SubState")
            pid = int(p["MainPID"])
            return (pid not in (0, old) and p["ActiveState"] == "active"
                    and p["SubState"] == "running" and pid)
        try:
            return wait_for(f"{UNIT} to run again after PID {old}", new, timeout, interval=0.01)
        except Timeout as e:
            raise Failure(f"{e}; it is {self.show('MainPID', 'ActiveState', 'SubState', 'Result')}"
                          f"\n{self.journal('-u', UNIT, '-o', 'short', '-n', '15')}")

    def other_generations(self, gens, when):
        """None when every model in GENS (name -> generation) is ready with
        that generation, else what is wrong."""
        now = {m["name"]: (m["state"], m["generation"]) for m in self.status()["models"]}
        wrong = {n: now.get(n) for n, g in gens.items() if now.get(n) != ("ready", g)}
        return wrong and f"{when}: models not ready with their generation {gens}: {wrong}"

    def read_again(self, pid, gens):
        """None when the journal of PID says every model of GENS was restored
        from the store (not read again) and shows no load or warm-up of a
        model, else what it shows."""
        want = [f'model "{n}": generation {g} restored from the file descriptor store'
                for n, g in gens.items()]

        def text():
            return self.journal("-u", UNIT, "-o", "cat", f"_PID={pid}")

        def restored():
            t = text()
            return all(any(w in l and "not read again" in l for l in t.splitlines())
                       for w in want) and t
        try:
            t = wait_for(f"the restore lines of PID {pid} in the journal", restored, 10, 0.1)
        except Timeout:
            return f"PID {pid} did not restore every model of {gens} from the store:\n" + "".join(
                f"  {l}\n" for l in text().splitlines() if 'model "' in l)
        loads = [l for l in t.splitlines() if "warm:" in l or "not restored" in l or
                 re.search(r'model "[^"]+": generation \d+ from ', l)]
        return loads and f"PID {pid} read a model again: " + " | ".join(loads)

    def downtimes(self, windows):
        """{kind: [ns]}: for each restart of WINDOWS (kind -> [(start, end)]),
        how long the journal shows the service down: from systemd's
        "Stopping" (a restart) or "Main process exited" (a kill) to the next
        "Started". The journal's monotonic clock is the host's."""
        marks = []
        for l in self.journal("-u", UNIT, "-o", "json").splitlines():
            e = json.loads(l) if l.strip() else {}
            msg = str(e.get("MESSAGE", ""))
            if e.get("_PID") == "1" and e.get("UNIT") == UNIT:
                for word in ("Stopping", "Main process exited", "Started"):
                    if msg.startswith(word) or msg.startswith(f"{UNIT}: {word}"):
                        marks.append((int(e["__MONOTONIC_TIMESTAMP"]) * 1000, word))
        out = {}
        for kind, ws in windows.items():
            down = "Stopping" if kind == "restart" else "Main process exited"
            for start, end in ws:
                t_down = next((t for t, w in marks if w == down and start <= t <= end), None)
                t_up = next((t for t, w in marks if w == "Started" and t_down is not None
                             and t_down <= t <= end), None)
                expect(t_up is not None, f"the journal shows no {down!r} and then 'Started' "
                       f"between {start} and {end} ns")
                out.setdefault(kind, []).append(t_up - t_down)
        return out

    # ---- the checks ----

    def install(self):
        """The .debs install offline (dpkg -i); policy-rc.d keeps dpkg from
        starting anything, so the socket is started by hand below."""
        names = [f"/root/debs/{d}" for d in sorted(self.debs)]
        self.sh("dpkg", "-i", *names, timeout=300)
        self.sh("rm", "-f", "/usr/sbin/policy-rc.d")
        self.sh("getent", "passwd", "wcache")
        # The metrics endpoint (TCP, naming every model) is the operator's
        # choice: installed, not enabled (debian/rules).
        state = self.sh("systemctl", "is-enabled", "wcached-metrics.socket",
                        check=False).stdout.strip()
        expect(state == "disabled", f"wcached-metrics.socket is {state!r} after install")
        state = self.sh("systemctl", "is-enabled", "wcached.socket", check=False).stdout.strip()
        expect(state == "enabled", f"wcached.socket is {state!r} after install")
        self.sh("useradd", "--create-home", "--groups", "wcache", WORKER)
        self.sh("useradd", "--create-home", OUTSIDER)
        self.sh("install", "-d", "-m", "0755", "-o", "root", "-g", "root", MODELS,
                "/srv/wcache-test")
        for script, text in (("worker.py", WORKER_PY), ("drop.py", DROP_PY)):
            with open(self.c.path(f"/srv/wcache-test/{script}"), "w") as f:
                f.write(text)
        for name in ("small", "restricted"):
            self.write_model(name)
        self.models = {"small": f"path = {MODELS}/small.safetensors\n",
                       "restricted": f"path = {MODELS}/restricted.safetensors\n"
                                     "allow_users = root\n"}
        self.write_config(config(self.models))
        # As the daemon's user: it can read what it is to serve.
        self.sh("wcached", "--check", "-c", "/etc/wcached.conf", user="wcache")
        for name in ("small", "restricted"):  # --check read them
            model.drop_pages(self.c.path(f"{MODELS}/{name}.safetensors"))
        st = self.sh("stat", "-c", "%U:%G %a", f"{MODELS}/small.safetensors").stdout.strip()
        expect(st == "root:root 644", f"model file is {st}")
        self.sh("systemctl", "start", "wcached.socket")
        state = self.sh("systemctl", "is-active", UNIT, check=False).stdout.strip()
        expect(state == "inactive", f"{UNIT} is {state} before any client connected")
        expect(self.fincore(f"{MODELS}/small.safetensors") == 0,
               "the model's pages are resident before the daemon ran")

    def socket_activation(self):
        """A worker in group wcache connects before the service runs: systemd
        starts it and the attach succeeds. A user outside the group cannot
        connect."""
        got = self.attach("small")
        expect(got["model"] == "small" and got["generation"] == 1, f"attach said {got}")
        p = self.show("MainPID", "ActiveState")
        expect(p["ActiveState"] == "active", f"{UNIT} is {p['ActiveState']} after the attach")
        self.main_pid = int(p["MainPID"])
        expect("Started wcached.service" in self.journal("-u", UNIT, "-o", "cat"),
               "the journal does not show the service starting")
        r = self.attach("small", user=OUTSIDER, check=False)
        expect(r.returncode != 0 and "ermission denied" in r.stderr,
               f"a user outside group wcache attached: exit {r.returncode} {r.stderr.strip()}")

    def sandbox(self):
        """The daemon runs as wcache, with CAP_LEASE alone (its writer check
        of a new model file), filtered."""
        status = self.sh("cat", f"/proc/{self.main_pid}/status").stdout
        fields = dict(l.split(":", 1) for l in status.splitlines() if ":" in l)
        uid = self.sh("id", "-u", "wcache").stdout.strip()
        expect(fields["Uid"].split() == [uid] * 4, f"Uid: {fields['Uid'].strip()}")
        expect(all(int(fields[k], 16) == CAP_LEASE for k in ("CapEff", "CapBnd", "CapAmb")),
               f"CapEff {fields['CapEff'].strip()} CapBnd {fields['CapBnd'].strip()} CapAmb "
               f"{fields['CapAmb'].strip()}, not CAP_LEASE ({CAP_LEASE:x}) alone")
        expect(fields["NoNewPrivs"].strip() == "1", "NoNewPrivs is not set")
        expect(fields["Seccomp"].strip() == "2", "no seccomp filter")
        p = self.show("SystemCallErrorNumber")
        expect(p["SystemCallErrorNumber"] == "1",  # EPERM
               f"SystemCallErrorNumber={p['SystemCallErrorNumber']}, not EPERM (1): a "
               "refused call kills the daemon")

    def memlock_limit(self):
        """The unit's LimitMEMLOCK=infinity holds for the daemon, as on a
        host: the container has CAP_SYS_RESOURCE (container.py), so its
        systemd may raise the limit. A runner without that capability in
        its bounding set cannot give it: systemd then sets the highest
        limit it can, the runner's hard limit, and the check says so."""
        soft, hard = self.memlock()
        self.memlock_max = soft
        if "CAP_SYS_RESOURCE" not in self.c.missing:
            expect(soft is None and hard is None,
                   f"/proc/{self.main_pid}/limits: Max locked memory {soft} {hard} bytes, not "
                   "unlimited: the unit's LimitMEMLOCK=infinity does not hold")
            return "Max locked memory unlimited"
        runner = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
        runner = None if runner == resource.RLIM_INFINITY else runner
        expect(soft == hard == runner,
               f"Max locked memory {soft} {hard} bytes; systemd should set the runner's hard "
               f"limit {runner}, the highest it can without CAP_SYS_RESOURCE")
        if runner is None:
            return "Max locked memory unlimited (the runner's own)"
        raise Skipped(f"Max locked memory {soft} bytes, this runner's hard limit: it lacks "
                      "CAP_SYS_RESOURCE, so the container cannot be given it and "
                      "LimitMEMLOCK=infinity cannot hold")

    def check_status(self):
        r = self.sh("wcachectl", "status", check=False)
        expect(r.returncode in (0, 3), f"wcachectl status exited {r.returncode}: {r.stderr}")
        expect(re.search(r"^small +1 +(ready|warming) ", r.stdout, re.M),
               f"status table:\n{r.stdout}")
        m = self.wait_state("small", "ready")
        expect(m["bytes"] == model.file_size(), f"status says {m['bytes']} bytes")

    def systemctl_status(self):
        """The manager got the daemon's STATUS= line."""
        text = self.sh("systemctl", "status", UNIT, "--no-pager", check=False).stdout
        expect(re.search(r'Status: "serving \d+ models?', text),
               f"systemctl status shows no STATUS= line of wcached:\n{text}")

    def metrics(self):
        text = self.sh("wcachectl", "metrics").stdout
        for name in ("wcached_uptime_seconds", "wcached_clients",
                     'wcached_model_bytes{model="small"}'):
            expect(name in text, f"metrics lack {name}")
        expect(self.metric("wcached_model_bytes", "small") == model.file_size(),
               "wcached_model_bytes is not the file's size")

    def residency_warm(self):
        """Warming read the whole file; status, metrics and fincore agree."""
        n = self.residency_agrees("small")
        expect(n == model.file_size(), f"after warming {n} of {model.file_size()} bytes "
               "are resident")
        method = self.model_status("small").get("resident_method")
        return f"{n} bytes, measured by {method}" if method else f"{n} bytes"

    def evict(self):
        """Eviction runs off the event loop: once the pages went, status and
        metrics say what fincore says."""
        path = f"{MODELS}/small.safetensors"
        self.sh("wcachectl", "evict", "small")
        try:
            wait_for("evict to drop pages", lambda: self.fincore(path) < model.file_size(),
                     15, 0.1)
        except Timeout as e:
            raise Failure(f"{e}: fincore still counts {self.fincore(path)} bytes")
        return f"{self.residency_agrees('small')} bytes left resident"

    def dropped_by_a_client(self):
        """A worker (not the file's owner) drops the file's pages: status keeps
        telling the truth (and the daemon may warm it again)."""
        self.attach("small")  # warms the evicted model again
        self.residency_agrees("small")
        path = f"{MODELS}/small.safetensors"
        self.sh("python3", "/srv/wcache-test/drop.py", path, user=WORKER)
        dropped = self.fincore(path)
        n = self.residency_agrees("small")
        return f"fincore {dropped} bytes right after the drop, {n} when status agreed"

    def pin(self):
        self.sh("wcachectl", "pin", "small")
        wait_for("pin = all to be applied",
                 lambda: self.model_status("small")["pin_applied"] == "all", 60, 0.1)
        n = self.residency_agrees("small")
        expect(n == model.file_size(), f"pinned, {n} of {model.file_size()} bytes resident")
        self.sh("wcachectl", "unpin", "small")

    def pin_metadata_large(self):
        """pin = metadata of a 64 MiB model (more than a service's default
        8 MiB RLIMIT_MEMLOCK) under the packaged unit: its index and header
        are locked (VmLck of MainPID grows by about that), nothing more."""
        self.pins_settled()  # pin's unpin may still run
        before = self.locked()
        path = self.write_model("big", **BIG)
        self.models["big"] = f"path = {path}\npin = metadata\n"
        self.write_config(config(self.models))
        self.sh("systemctl", "reload", UNIT)
        m = self.wait_model("big", "ready with its metadata locked",
                            lambda m: m["state"] == "ready" and m["pin_applied"] == "metadata")
        expect(m["pin_error"] is None and m["bytes"] == model.file_size(**BIG),
               f"model big: {m}")
        after = self.locked()
        # One page of header and the index (a page for 4 tensors); a whole
        # file would be 64 MiB.
        delta = after - before
        expect(model.PAGE < delta <= model.PAGE + (64 << 10),
               f"VmLck of MainPID grew by {delta} bytes ({before} -> {after}) for the metadata "
               "of model big")
        return f"VmLck {before} -> {after} bytes (+{delta}: index and header)"

    def pin_all_large(self):
        """wcachectl pin of the 64 MiB model holds under the packaged unit
        (LimitMEMLOCK=infinity): pin_applied all, VmLck of MainPID at least
        the model's size, every page resident; unpin gives it back. Where
        the runner keeps RLIMIT_MEMLOCK below the model (memlock_limit), the
        lock is checked to be refused for that reason, and the check skips."""
        size = model.file_size(**BIG)
        base = self.locked()
        try:
            if self.memlock_max is not None and self.memlock_max < base + size:
                self.sh("wcachectl", "pin", "big", check=False)
                m = self.wait_model("big", "its pin = all refused", lambda m: m["pin_error"])
                want = f"mlock: ENOMEM: RLIMIT_MEMLOCK is {self.memlock_max} bytes"
                expect(want in m["pin_error"] and m["pin_applied"] == "metadata",
                       f"model big: pin_error {m['pin_error']!r}, pin_applied "
                       f"{m['pin_applied']} (wanted {want!r})")
                self.sh("wcachectl", "unpin", "big", check=False)
                self.wait_model("big", "unpinned, its error cleared", lambda m: m[
                    "pin_applied"] == "metadata" and m["pin_error"] is None)
                raise Skipped(f"pin = all of {size} bytes cannot hold under this runner's "
                              f"{self.memlock_max}-byte RLIMIT_MEMLOCK; refused as it must be: "
                              f"{m['pin_error']}")
            self.sh("wcachectl", "pin", "big")
            m = self.wait_model("big", "locked whole", lambda m: m["pin_applied"] == "all")
            expect(m["pin_error"] is None, f"model big: {m}")
            pinned = self.locked()
            expect(pinned >= size and pinned - base >= size - model.PAGE,
                   f"pin = all of {size} bytes: VmLck {base} -> {pinned}")
            resident = self.residency_agrees("big")
            expect(resident == size, f"pinned, {resident} of {size} bytes resident")
            self.sh("wcachectl", "unpin", "big")
            self.wait_model("big", "unpinned", lambda m: m["pin_applied"] == "metadata")
            try:
                wait_for("VmLck back to the metadata's", lambda: self.locked() == base, 30, 0.1)
            except Timeout as e:
                raise Failure(f"{e}: VmLck {self.locked()}, was {base} before the pin")
            return f"VmLck {base} -> {pinned} -> {base} bytes, {resident} resident"
        finally:
            del self.models["big"]
            self.write_config(config(self.models))
            self.sh("systemctl", "reload", UNIT)

    def memory_limit(self):
        """The memory limit in force under the packaged unit: without a
        limit, the container's RAM figure (or the cgroup limit the
        container itself runs under); with a drop-in setting MemoryMax=
        (cgroup v2) and MemoryLimit= (v1) of 512M, status's "memory" says
        512 MiB from wcached.service's cgroup, and memory_budget = 50% is
        256 MiB of it. Where the container's systemd has no memory
        controller to delegate (a hybrid host gives nspawn none), the drop-in
        sets nothing: skipped, saying so, after checking the figure without
        it."""
        mem = self.status()["memory"]
        expect(mem["limit"] <= mem["ram"] and mem["limit_source"],
               f"status memory without a limit: {mem}")
        before = mem
        pid = self.with_drop_in("memory-max", "[Service]\nMemoryMax=512M\nMemoryLimit=512M\n")
        try:
            groups = self.sh("cat", f"/proc/{pid}/cgroup").stdout
            mem = self.status()["memory"]
            if mem["limit"] == before["limit"] and mem["limit_kind"] == before["limit_kind"]:
                raise Skipped(f"MemoryMax=512M set no limit wcached can see (its cgroups: "
                              f"{' '.join(groups.split())}); without it: "
                              f"{before['limit'] >> 20} MiB from {before['limit_source']}")
            expect(mem["limit"] == 512 << 20 and mem["limit_kind"] in ("cgroup_v1", "cgroup_v2")
                   and "wcached.service" in mem["limit_source"],
                   f"status memory with MemoryMax=512M: {mem}")
            self.write_config(config(self.models, daemon="memory_budget = 50%\n"))
            self.sh("systemctl", "reload", UNIT)
            mem = self.status()["memory"]
            expect(mem["budget"] == 256 << 20, f"memory_budget = 50% under 512M: {mem}")
            text = self.sh("wcachectl", "status").stdout
            expect(f"memory: 512.0 MiB in force ({mem['limit_source']}), budget 256.0 MiB" in text,
                   f"wcachectl status:\n{text}")
        finally:
            self.write_config(config(self.models))
            self.drop_in_removed("memory-max")
        return f"512 MiB from {mem['limit_source']}, budget 256 MiB"

    def pin_refused_filter(self):
        """(a) mlock(2) forbidden by a seccomp filter (a drop-in with
        SystemCallFilter=~@memlock, refused with EPERM): the metadata lock
        the restarted daemon makes is refused, and both the journal (one
        warning) and status (pin_error, wcachectl status) say the filter
        did it, not RLIMIT_MEMLOCK. Without the drop-in it holds again."""
        pid = self.with_drop_in("memlock-filter", "[Service]\nSystemCallFilter=~@memlock\n"
                                "SystemCallErrorNumber=EPERM\n")
        try:
            soft = self.memlock()[0]
            m = self.wait_model("small", "its metadata lock refused", lambda m: m["pin_error"])
            limit = "unlimited" if soft is None else f"{soft} bytes"
            rx = (r"cannot lock its index \(\d+ bytes\) in memory: mlock: EPERM: forbidden by "
                  r"a seccomp filter \(.*\), not by RLIMIT_MEMLOCK \(" + re.escape(limit) +
                  r"\); allow @memlock, or use pin = none")
            expect(re.fullmatch(rx, m["pin_error"]) and m["pin_applied"] == "none",
                   f"model small: pin_error {m['pin_error']!r}, pin_applied {m['pin_applied']}")
            self.refusal_told(pid, "small", m)
            expect(self.locked() == 0, f"VmLck {self.locked()} with mlock refused")
            error = m["pin_error"]
        finally:
            self.drop_in_removed("memlock-filter")
        m = self.model_status("small")
        expect(m["pin_applied"] == "metadata" and m["pin_error"] is None,
               f"without the drop-in, model small: {m}")
        return (f"{error[error.index('mlock: '):error.index(' (the unit')]}, VmLck 0; "
                "held again without the drop-in")

    def pin_refused_limit(self):
        """(b) RLIMIT_MEMLOCK too small (a drop-in with LimitMEMLOCK=1M):
        wcachectl pin of a 3 MiB model is refused with ENOMEM, and the
        journal and status name the limit, the bytes locked and asked, and
        the LimitMEMLOCK= that would do. Raised again (prlimit, as the
        daemon's user), a pin that holds clears the error."""
        hard = self.memlock()[1]
        pid = self.with_drop_in("memlock-limit", "[Service]\nLimitMEMLOCK=1M:"
                                f"{'infinity' if hard is None else hard}\n")
        size = model.file_size()
        try:
            expect(self.memlock(pid) == (1 << 20, hard),
                   f"with LimitMEMLOCK=1M:{hard}, /proc/{pid}/limits says {self.memlock(pid)}")
            locked = self.locked()
            self.sh("wcachectl", "pin", "small", check=False)
            m = self.wait_model("small", "its pin refused", lambda m: m["pin_error"])
            want = (f"cannot lock {MODELS}/small.safetensors ({size} bytes) in memory: mlock: "
                    f"ENOMEM: RLIMIT_MEMLOCK is {1 << 20} bytes, {locked} bytes were locked and "
                    f"{size} more asked; raise LimitMEMLOCK= in wcached.service (or ulimit -l) "
                    f"to at least {math.ceil((locked + size) / (1 << 20))}M, or pin less")
            expect(m["pin_error"] == want and m["pin_applied"] == "metadata",
                   f"model small: pin_error {m['pin_error']!r} (wanted {want!r}), pin_applied "
                   f"{m['pin_applied']}")
            self.refusal_told(pid, "small", m)
            # The daemon's own user may raise its soft limit up to the hard one.
            self.sh("prlimit", f"--pid={pid}",
                    f"--memlock={'unlimited' if hard is None else hard}:", user="wcache")
            self.sh("wcachectl", "pin", "small")
            m = self.wait_model("small", "locked whole, the error cleared",
                                lambda m: m["pin_applied"] == "all" and m["pin_error"] is None)
            expect(self.locked() >= size, f"pinned, VmLck {self.locked()}")
            self.sh("wcachectl", "unpin", "small")
            self.wait_model("small", "unpinned", lambda m: m["pin_applied"] == "metadata")
        finally:
            self.drop_in_removed("memlock-limit")
        return "ENOMEM at 1M, named; cleared by a pin that held"

    def python_worker(self):
        """The Python package, as a worker, reads exactly the bytes written."""
        r = self.sh("python3", "/srv/wcache-test/worker.py", "small", user=WORKER)
        gen, digest = r.stdout.split()
        expect(digest == self.digests["small"], "the worker read other bytes than the file's")

    def reload_good(self):
        self.write_model("second")
        self.models["second"] = f"path = {MODELS}/second.safetensors\n"
        self.write_config(config(self.models))
        self.sh("systemctl", "reload", UNIT)
        self.wait_state("second", "ready")
        self.attach("second")
        wait_for("STATUS= to count 3 models",
                 lambda: "serving 3 models" in self.show("StatusText")["StatusText"], 30, 0.1)

    def reload_bad(self):
        self.write_config(config(self.models, "\n[model broken\npath = /nowhere\n"))
        try:
            r = self.sh("systemctl", "reload", UNIT, check=False)
            expect(r.returncode != 0, "systemctl reload of a broken config succeeded")
            text = self.journal("-u", UNIT, "-o", "cat", "-n", "20")
            expect(re.search(r"/etc/wcached\.conf:\d+: section header", text),
                   f"the journal does not name the bad line:\n{text}")
            for name in ("small", "second"):
                self.attach(name)
        finally:
            self.write_config(config(self.models))
        self.sh("systemctl", "reload", UNIT)

    def rename_swaps(self):
        """Three rename(2) swaps; each new generation is current and served
        with its own bytes."""
        for _ in range(3):
            gen = self.model_status("small")["generation"]
            beside = self.write_model("small", f"{MODELS}/.small.next")
            self.sh("mv", "-T", beside, f"{MODELS}/small.safetensors")
            self.wait_state("small", "ready", generation=gen + 1)
            r = self.sh("python3", "/srv/wcache-test/worker.py", "small", user=WORKER)
            got_gen, digest = r.stdout.split()
            expect(int(got_gen) == gen + 1 and digest == self.digests["small"],
                   f"after a swap to generation {gen + 1}, a worker got generation "
                   f"{got_gen} with {'the right' if digest == self.digests['small'] else 'other'}"
                   " bytes")

    def in_place_write(self):
        """A write into the served file is noticed: no new attaches of that
        generation, an error in the journal; a rename repairs it."""
        gen = self.model_status("small")["generation"]
        self.sh("dd", "if=/dev/zero", f"of={MODELS}/small.safetensors", "bs=4096", "seek=8",
                "count=1", "conv=notrunc,fsync", "status=none")
        self.wait_state("small", "modified", generation=gen)
        r = self.attach("small", check=False)
        expect(r.returncode != 0 and "modified in place" in r.stderr,
               f"attach of a modified model: exit {r.returncode} {r.stderr.strip()}")
        beside = self.write_model("small", f"{MODELS}/.small.next")
        self.sh("mv", "-T", beside, f"{MODELS}/small.safetensors")
        self.sh("wcachectl", "reload", "small")
        m = self.wait_state("small", "ready")
        expect(m["generation"] > gen, f"still generation {m['generation']}")
        self.attach("small")

    def warm_restart(self):
        """systemctl restart: a new process (MainPID changes) serves every
        ready model with the same generation, restored from the file
        descriptor store without a warm-up, and a worker reads the bytes
        written. Among them a model with stage = yes keeps its copy in
        stage_dir: the new process says so and makes no second copy (the
        same file, alone there). Each start under the unit has a mount
        namespace of its own, so the copy's descriptors taken back from the
        store are on the old start's mounts: before 2aeace2 the new process
        did not find the copy by them, removed it and staged the model again
        as a new generation (review rev217 M1). The staged model is dropped
        again after the check: the later restarts count opens of the models'
        own files."""
        self.write_model(STAGED)
        self.models[STAGED] = f"path = {MODELS}/{STAGED}.safetensors\nstage = yes\n"
        try:
            pid, n = self.restart_with_staged()
        finally:
            # Dropped at the next reload (restart_under_load's, if this
            # check failed before its own).
            del self.models[STAGED]
            self.write_config(config(self.models))
        self.sh("systemctl", "reload", UNIT)
        wait_for(f"model {STAGED} to leave status", lambda: STAGED not in
                 {m["name"] for m in self.status()["models"]}, 30, 0.1)
        return f"{n} models restored, {STAGED} with its copy, MainPID {pid}"

    def restart_with_staged(self):
        """warm_restart with model STAGED configured: (the new MainPID, how
        many models it restored)."""
        self.write_config(config(self.models))
        self.sh("systemctl", "reload", UNIT)
        staged = self.wait_state(STAGED, "ready")["generation"]
        copy = f"{STAGE_DIR}/{STAGED}.{staged}"
        copied = self.staged_copy(staged, copy, "before the restart")
        before = {m["name"]: m["generation"] for m in self.status()["models"]
                  if m["state"] == "ready"}
        self.sh("systemctl", "restart", UNIT, timeout=120)
        pid = int(self.show("MainPID")["MainPID"])
        expect(pid not in (0, self.main_pid), f"MainPID {pid} after systemctl restart")
        self.main_pid = pid
        # Before 2aeace2: 'not restored: generation N is not a staged copy',
        # then generation N+1 "staged from ext4" (review rev217 M1).
        self.journal_entry(pid, f'model "{STAGED}": generation {staged} keeps its staged copy '
                           f"{copy}")
        for name, gen in before.items():
            m = self.wait_state(name, "ready")
            expect(m["generation"] == gen, f"model {name}: generation {m['generation']} after "
                   f"the restart, was {gen}")
        text = self.journal("-u", UNIT, "-o", "cat", f"_PID={pid}")
        for name in before:
            expect(f'model "{name}": generation {before[name]} restored' in text,
                   f"model {name} was not restored:\n{text[-2000:]}")
        expect("warm:" not in text, f"the new process warmed a model:\n{text[-2000:]}")
        expect(" staged from " not in text, f"the new process staged a model again:\n"
               f"{text[-2000:]}")
        expect(self.staged_copy(staged, copy, "after the restart") == copied,
               f"{copy}/{STAGED}.safetensors is another file after the restart: copied again")
        for name in ("small", STAGED):
            r = self.sh("python3", "/srv/wcache-test/worker.py", name, user=WORKER)
            gen, digest = r.stdout.split()
            expect(int(gen) == before[name] and digest == self.digests[name],
                   f"after the restart a worker of {name} got generation {gen} with "
                   f"{'the right' if digest == self.digests[name] else 'other'} bytes")
        return pid, len(before)

    def staged_copy(self, gen, copy, when):
        """The (st_dev, st_ino) of model STAGED's copy: its generation GEN is
        served from COPY (status), the one copy in STAGE_DIR."""
        g = self.generations(STAGED).get(gen, {})
        expect(g.get("staged") and g.get("staged_dir") == copy,
               f"{when}: model {STAGED}'s generation {gen} is not served from {copy}: {g}")
        there = sorted(os.listdir(self.c.path(STAGE_DIR)))
        expect(there == [f"{STAGED}.{gen}"], f"{when}: {STAGE_DIR} holds {there}")
        st = os.stat(self.c.path(f"{copy}/{STAGED}.safetensors"))
        return st.st_dev, st.st_ino

    def restart_under_load(self):
        """16 workers in group wcache attach model load, check every byte
        (tests/tools/pattern.h) and release it in a loop, half keeping their
        client across restarts, half connecting for each attach, while
        wcached restarts RESTARTS times (systemctl restart) and is killed
        with SIGKILL once. Not one attach may fail, every generation stays
        what it was, and each new process takes every model back from the
        file descriptor store without reading a model file: its journal
        says "not read again" for each model and shows no load or warm-up,
        and, independently of anything the daemon says, an inotify watch on
        every model file sees no open(2) and no read (a re-read has to open
        the path, or read from a stored descriptor, and both are events;
        the watch is shown to see them when model load is first loaded).
        Prints the longest wait for one attach across a restart, per mode.
        PID1 is not traced meanwhile (the times would be strace's)."""
        work = os.path.dirname(self.c.dir)
        binary = "/srv/wcache-test/load_worker"
        tools.build_worker(self.c, work, "load_worker", binary)
        self.seed += 1
        seed, path = self.seed, f"{MODELS}/load.safetensors"
        subprocess.run([tools.build_mkmodel(work), "--seed", str(seed), self.c.path(path)],
                       check=True, capture_output=True)
        os.chmod(self.c.path(path), 0o644)
        self.models["load"] = f"path = {path}\n"
        files = [self.c.path(f"{MODELS}/{name}.safetensors") for name in self.models]
        watch = tools.AccessWatch(files)
        workers = None
        try:
            self.write_config(config(self.models))
            self.sh("systemctl", "reload", UNIT)
            self.wait_state("load", "ready")
            seen = watch.events().get(self.c.path(path), {})
            expect(seen.get("open") and seen.get("access"),
                   f"inotify did not see the daemon open and read {path} when it loaded it "
                   f"({seen}): it would not see a re-read either")
            gens = {m["name"]: m["generation"] for m in self.status()["models"]}
            problems = [self.other_generations(gens, "before the restarts")]
            expect(not problems[0], problems[0])
            workers = load.Workers(self.c, binary, WORKER, "load", seed, LOAD_WORKERS,
                                   LOAD_WORKERS)
            ready = workers.start()
            expect({g for _, g in ready.values()} == {gens["load"]},
                   f"the workers attached generations {ready}, status says {gens['load']}")
            windows, pids = {"restart": [], "kill -9": []}, []
            for i in range(RESTARTS + 1):
                # systemd refuses a sixth start within 10 s (StartLimitBurst=5):
                # the test's pace, not an operator's.
                self.sh("systemctl", "reset-failed", UNIT)
                old, t0 = self.main_pid, time.monotonic_ns()
                if i < RESTARTS:
                    kind = "restart"
                    self.sh("systemctl", "restart", UNIT, timeout=120)
                else:
                    kind = "kill -9"
                    self.kills += 1
                    self.sh("sh", "-c", f"kill -9 {old}")
                # Problems are noted, not raised: what the workers saw is
                # reported with them.
                try:
                    self.main_pid = self.wait_new_main(old)
                except Failure as e:
                    problems.append(str(e))
                    break
                windows[kind].append((t0, time.monotonic_ns()))
                pids.append(self.main_pid)
                problems.append(self.other_generations(gens, f"after {kind} "
                                                             f"{len(windows[kind])}"))
            result = workers.stop()
        finally:
            if workers is not None:
                workers.kill()
            reads = watch.events()
            watch.close()
        return self.restart_report(result, gens, windows, pids, reads, workers.pids,
                                   [p for p in problems if p])

    def restart_report(self, result, gens, windows, pids, reads, worker_pids, problems):
        """restart_under_load's assertions on what the workers, the journal
        and inotify saw, and its summary line."""
        other = {g for _, _, _, _, g in result.samples} - {gens["load"]}
        if other:
            problems.append(f"workers got generations {sorted(other)} of model load, not "
                            f"{gens['load']}")
        problems += [p for p in (self.read_again(pid, gens) for pid in pids) if p]
        # A restart reads nothing of a model (a cold load would pread its
        # header). Each new process opens each served file once, through
        # /proc/self/fd/N of the descriptor it took back, for the open file
        # description its workers get (PROTOCOL.md, ATTACH_OK): one open per
        # file per restart, and never more.
        starts = len(pids)
        bad = {path: n for path, n in reads.items() if n["access"] or n["open"] > starts}
        if bad:
            problems.append("inotify saw model files read, or opened more than once per "
                            f"restart ({starts} restarts), across the restarts: "
                            + ", ".join(f"{path[len(self.c.dir):]} opened {n['open']}x, read "
                                        f"{n['access']}x" for path, n in bad.items()))
        if result.failed:
            t_first = min((a for ws in windows.values() for a, _ in ws),
                          default=min(s[2] for s in result.samples))
            problems.append(
                f"{result.failed} of {result.attaches()} attaches failed; the first: "
                + " | ".join(f"worker {w} ({m}) at {(t0 - t_first) / 1e6:+.0f} ms after the "
                             f"first restart began, after {d / 1e6:.0f} ms: {code} {msg}"
                             for m, w, t0, d, code, msg in result.failures[:8])
                + "; restarts (ms after the first began): " + ", ".join(
                    f"{k} {(a - t_first) / 1e6:.0f}..{(b - t_first) / 1e6:.0f}"
                    for k, ws in windows.items() for a, b in ws))
        expect(not problems, "\n  ".join(problems))
        expect(result.done == (2 * LOAD_WORKERS, 2 * LOAD_WORKERS),
               f"load_worker says {result.done} workers exited cleanly")
        left = self.sh("sh", "-c", "for p in " + " ".join(map(str, worker_pids)) +
                       "; do [ -e /proc/$p ] && echo $p; done; true").stdout.split()
        expect(not left, f"worker processes {left} are still running")
        wait_for("the daemon to count no client", lambda: self.status()["clients"] == 0, 10, 0.1)
        stats, longest = [], {}
        for kind, ws in windows.items():
            for mode in ("keep", "connect"):
                for i, w in enumerate(ws):
                    expect(result.across([w], mode), f"no {mode} worker was attaching during "
                           f"{kind} {i + 1}: nothing measured")
                waits = result.across(ws, mode)
                longest[kind] = max(longest.get(kind, 0), max(waits))
                stats.append(f"{kind} {mode}: max {max(waits) / 1e6:.1f} p99 "
                             f"{load.p99(waits) / 1e6:.1f} ms of {len(waits)}")
        steady = result.outside([w for ws in windows.values() for w in ws])
        down = self.downtimes(windows)
        return (f"{RESTARTS} restarts + kill -9, {2 * LOAD_WORKERS} workers, "
                f"{result.attaches()} attaches, 0 failed, longest wait "
                f"{longest['restart'] / 1e6:.0f} ms (restart) / {longest['kill -9'] / 1e6:.0f} ms "
                f"(kill -9); " + "; ".join(stats) +
                f"; down by the journal: max {max(down['restart']) / 1e6:.0f} ms (restart), "
                f"{max(down['kill -9']) / 1e6:.0f} ms (kill -9)" +
                (f"; between restarts p99 {load.p99(steady) / 1e6:.1f} ms" if steady else ""))

    def generations(self, name):
        """Model NAME's open generations in status: number -> entry."""
        return {g["number"]: g for g in self.model_status(name).get("generations", [])}

    def journal_entry(self, pid, text, timeout=10):
        """The first entry of PID's journal whose message holds TEXT (waited
        for, as journald may not have read it yet)."""
        def find():
            for l in self.journal("-u", UNIT, "-o", "json", f"_PID={pid}").splitlines():
                e = json.loads(l) if l.strip() else {}
                if text in str(e.get("MESSAGE", "")):
                    return e
            return None
        try:
            return wait_for(f"{text!r} in the journal of PID {pid}", find, timeout, 0.1)
        except Timeout as e:
            raise Failure(f"{e}; it says:\n"
                          f"{self.journal('-u', UNIT, '-o', 'cat', f'_PID={pid}')[-2500:]}")

    def store_holds(self, files, want, when):
        """Waits until systemd's file descriptor store (PID1's descriptors)
        holds exactly the files of FILES ({(st_dev, st_ino): label}) whose
        labels are WANT."""
        try:
            wait_for(f"systemd's store to hold {sorted(want)} {when}",
                     lambda: held.in_store(self.c.pid1, files) == want, 10, 0.1)
        except Timeout as e:
            raise Failure(f"{e}; it holds {sorted(held.in_store(self.c.pid1, files))}")

    def held_across_restart(self):
        """Generations workers still hold survive systemctl restart (issue
        12). A worker (restart_worker, a user in group wcache) holds model
        small's generation N, a second one model second's generation K;
        both models are replaced by rename(2). The new process restores N
        and K as held and waits restart_hold_seconds (HOLD_SECONDS here,
        /etc/wcached.conf) for their holders. The first worker's next attach
        reads its old mapping end to end, reconnects and HOLDs N (attached
        1 again) and gets N+1; the second stays silent, so K closes when the
        wait ends, while N stays until its holder releases it. Independently
        of the daemon, PID1's descriptors show systemd's store holding each
        generation's file while it is open and dropping it once it closed.
        The silent worker's mapping of K still reads afterwards, and its
        release of it only unmaps."""
        work = os.path.dirname(self.c.dir)
        binary = "/srv/wcache-test/restart_worker"
        tools.build_worker(self.c, work, "restart_worker", binary)
        names = ("small", "second")
        claimer, silent = names
        # The daemon reads it when it starts: the restart below takes it.
        self.write_config(config(self.models,
                                 daemon=f"restart_hold_seconds = {HOLD_SECONDS}\n"))
        workers = {}
        try:
            for name in names:
                workers[name] = held.RestartWorker(self.c, binary, WORKER, name)
            old = {name: w.generation for name, w in workers.items()}
            for name in names:
                now = self.model_status(name)["generation"]
                expect(now == old[name], f"model {name}: a worker attached generation "
                       f"{old[name]}, status says {now}")
            files = {held.file_id(self.c.path(f"{MODELS}/{n}.safetensors")): (n, old[n])
                     for n in names}
            for name in names:
                beside = self.write_model(name, f"{MODELS}/.{name}.next")
                self.sh("mv", "-T", beside, f"{MODELS}/{name}.safetensors")
            for name in names:
                self.wait_state(name, "ready", generation=old[name] + 1)
                g = self.generations(name)
                expect(g.get(old[name], {}).get("attached") == 1,
                       f"model {name} after the swap: generations {g}")
                files[held.file_id(self.c.path(f"{MODELS}/{name}.safetensors"))] = \
                    (name, old[name] + 1)
            self.store_holds(files, set(files.values()), "before the restart")

            t_restart = time.monotonic_ns()
            self.sh("systemctl", "restart", UNIT, timeout=120)
            pid = int(self.show("MainPID")["MainPID"])
            expect(pid not in (0, self.main_pid), f"MainPID {pid} after systemctl restart")
            self.main_pid = pid
            restored = {}
            for name in names:
                restored[name] = self.journal_entry(
                    pid, f'model "{name}": generation {old[name]}, held by workers before the '
                    f"restart, restored; waiting {HOLD_SECONDS} s for them to say so (HOLD)")
                self.journal_entry(pid, f'model "{name}": generation {old[name] + 1} restored '
                                   "from the file descriptor store")
                g = self.generations(name)
                was, new = g.get(old[name], {}), g.get(old[name] + 1, {})
                expect(was.get("attached") == 0 and "hold_wait_ms" in was and new.get("current"),
                       f"model {name} after the restart: generations {g}")

            got = workers[claimer].attach()
            g = self.generations(claimer)
            expect(got == old[claimer] + 1 and g.get(old[claimer], {}).get("attached") == 1
                   and g.get(got, {}).get("attached") == 1,
                   f"after the worker's attach (generation {got}): {claimer}'s generations {g}")
            left_ms = g[old[claimer]].get("hold_wait_ms")

            k = old[silent]
            try:
                wait_for(f"model {silent}'s unclaimed generation {k} to close",
                         lambda: k not in self.generations(silent), HOLD_SECONDS + 10, 0.1)
            except Timeout as e:
                raise Failure(f"{e}; generations {self.generations(silent)}")
            closed = self.journal_entry(pid, f'model "{silent}": generation {k}: no worker said '
                                        f"it still holds it within {HOLD_SECONDS} s of the "
                                        "restart")
            # The journal's monotonic clock is the host's. It stamps a line
            # when journald reads it, so a late read of the restore line
            # shortens WAITED: the lower bound is from the restart's start.
            t_closed = int(closed["__MONOTONIC_TIMESTAMP"]) * 1000
            waited = (t_closed - int(restored[silent]["__MONOTONIC_TIMESTAMP"]) * 1000) / 1e9
            since_restart = (t_closed - t_restart) / 1e9
            expect(since_restart >= HOLD_SECONDS and waited <= HOLD_SECONDS + 2.5,
                   f"generation {k} of {silent} closed {since_restart:.2f} s after systemctl "
                   f"restart began and {waited:.2f} s after the journal's restore line: the "
                   f"wait is {HOLD_SECONDS} s")
            n = old[claimer]
            try:
                wait_for(f"the wait of {claimer}'s generation {n} to end",
                         lambda: "hold_wait_ms" not in self.generations(claimer).get(n, {}),
                         5, 0.1)
            except Timeout as e:
                raise Failure(f"{e}; generations {self.generations(claimer)}")
            g = self.generations(claimer)
            expect(g.get(n, {}).get("attached") == 1,
                   f"{claimer}'s claimed generation {n} after the wait: generations {g}")
            text = self.journal("-u", UNIT, "-o", "cat", f"_PID={pid}")
            expect(f'model "{claimer}": generation {n}: no worker said' not in text,
                   f"the claimed generation {n} of {claimer} was said to be unclaimed:\n"
                   f"{text[-2000:]}")
            self.store_holds(files, set(files.values()) - {(silent, k)},
                             "after the wait ended")

            workers[claimer].release(0)
            self.journal_entry(pid, f'model "{claimer}": generation {n} closed')
            try:
                wait_for(f"{claimer}'s generation {n} to leave status",
                         lambda: n not in self.generations(claimer), 5, 0.1)
            except Timeout as e:
                raise Failure(f"{e}; generations {self.generations(claimer)}")
            current = {(name, old[name] + 1) for name in names}
            self.store_holds(files, current, "after the release")

            got = workers[silent].attach()
            expect(got == k + 1, f"the silent worker's attach got generation {got}, not {k + 1}")
            workers[silent].release(0)
            g = self.generations(silent)
            expect(set(g) == {k + 1} and g[k + 1]["attached"] == 1,
                   f"after the silent worker released generation {k} (only unmapped): {g}")
            for name in names:
                workers.pop(name).quit()
            wait_for("the daemon to count no client", lambda: self.status()["clients"] == 0,
                     10, 0.1)
        finally:
            for w in workers.values():
                w.kill()
            self.write_config(config(self.models))
        self.sh("systemctl", "reload", UNIT)
        return (f"MainPID {pid}; {claimer} generation {n} claimed with "
                f"{left_ms} ms of the {HOLD_SECONDS} s wait left, closed on release; {silent} "
                f"generation {k} unclaimed, closed {waited:.2f} s after its restore line, "
                f"{since_restart:.2f} s after systemctl restart began; systemd's "
                "store dropped both")

    def journal_priorities(self):
        """Warnings reach journald at priority 4, errors at 3, info at 6."""
        r = self.attach("restricted", check=False)
        expect(r.returncode != 0 and "access denied" in r.stderr,
               f"restricted attach: exit {r.returncode} {r.stderr.strip()}")

        def entries():
            out = self.journal("-u", UNIT, "-o", "json")
            return [json.loads(l) for l in out.splitlines() if l.strip()]

        def find(text):
            return [e for e in entries() if text in str(e.get("MESSAGE", ""))]
        wait_for("the refused attach in the journal",
                 lambda: find('attach of model "restricted" refused'), 10, 0.1)
        for text, prio in (('attach of model "restricted" refused', "4"),
                           ("was modified in place", "3"), ("serving on", "6")):
            got = find(text)
            expect(got and all(e.get("PRIORITY") == prio for e in got),
                   f"{text!r} in the journal at priorities "
                   f"{[e.get('PRIORITY') for e in got]}, expected {prio}")
            expect(all(not str(e["MESSAGE"]).startswith("<") for e in got),
                   f"{text!r}: the <N> prefix reached the message")
        warnings = self.journal("-u", UNIT, "-p", "warning..warning", "-o", "cat")
        expect('attach of model "restricted" refused' in warnings,
               "journalctl -p warning does not show the warning")

    def analyze_security(self):
        out = self.sh("systemd-analyze", "security", UNIT, "--no-pager").stdout
        m = re.search(r"Overall exposure level for \S+: ([\d.]+)", out)
        expect(m, f"no exposure level in:\n{out[-500:]}")
        expect(float(m.group(1)) <= SECURITY_MAX, f"exposure {m.group(1)} > {SECURITY_MAX}")
        return f"exposure {m.group(1)}"

    def analyze_verify(self):
        r = self.sh("systemd-analyze", "verify", "/lib/systemd/system/wcached.service",
                    "/lib/systemd/system/wcached.socket", check=False)
        # Documentation=man:... needs man(1), which a minimal root lacks.
        problems = [l for l in (r.stdout + r.stderr).splitlines()
                    if "wcached" in l and "man" not in l.lower()]
        expect(not problems, "systemd-analyze verify:\n" + "\n".join(problems))

    def stop(self):
        """systemctl stop: a clean exit; the socket stays and the next worker
        starts the daemon again."""
        self.sh("systemctl", "stop", UNIT)
        p = self.show("ActiveState", "Result", "ExecMainCode", "ExecMainStatus")
        expect(p["ActiveState"] == "inactive" and p["Result"] == "success"
               and p["ExecMainCode"] == "1" and p["ExecMainStatus"] == "0",
               f"after stop: {p}")
        self.never_killed()
        state = self.sh("systemctl", "is-active", "wcached.socket", check=False).stdout.strip()
        expect(state == "active", f"wcached.socket is {state} after the service stopped")
        self.attach("small")
        pid = int(self.show("MainPID")["MainPID"])
        expect(pid not in (0, self.main_pid), f"MainPID {pid} after re-activation")
        self.main_pid = pid
        self.sh("systemctl", "stop", UNIT)
        self.never_killed()

    # Checks that leave the daemon as the runner found it running; stop
    # and install do not.
    NO_INVARIANT = {"install", "stop"}
    # Checks that measure time: PID1 is not traced meanwhile.
    UNTRACED = {"restart_under_load"}
