"""tests/gpu/run.sh in its --cpu mode, end to end: a whole run (every
step but the CUDA calls, small sizes, the copy engine on its CPU backend,
test_gpu_script.py's stand-ins for safetensors and transformers), and runs
that go wrong (a failed step, no model, a budget, a step that cannot be
killed, an interrupt, a hung driver, no CUDA device; those with a build
tree made for another host are test_run_sh_carry.py's). Apart from
test_gpu_script.py, whose report rules and gpubench commands it shares,
so that the ctest entries python and python_2 (tests/CMakeLists.txt) can
run them side by side."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from test_gpu_script import REPO, gpubench, standins, without_transformers


def test_run_sh_cpu_mode(tmp_path):
    out_dir = tmp_path / "out"  # the device tool's $OUT
    out_dir.mkdir()
    # A stand-in nvidia-smi: the header's query (an idle GPU's link, and
    # the max), and the pinned row's while it copies.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(
        "#!/bin/sh\ncase \"$*\" in\n*gen.max*) echo \"$*\"; echo '570.00, 1, 16, 5, 16' ;;\n"
        "*) sleep 0.3; echo '5, 16' ;;\nesac\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    # A stand-in interpreter that notes what the Llama loads have of the
    # variables that keep transformers off the network, and gives
    # register-threads GPUBENCH_PIN_DELAY: each registration on the CPU
    # backend takes 5 ms, the GIL let go, so that the registration row has
    # times to compare (that step alone: the others need not wait, the
    # get_tensor loop's 193 registrations a load among them).
    offline = tmp_path / "offline"
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\ncase \"$*\" in *llama-load*)\n"
                       f"\techo \"$HF_HUB_OFFLINE $TRANSFORMERS_OFFLINE "
                       f"$HF_HUB_DISABLE_TELEMETRY\" >>{offline} ;;\n"
                       f"*' register-threads '*) export GPUBENCH_PIN_DELAY=0.005 ;;\nesac\n"
                       f"exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    # A bash without EPOCHSECONDS (bash 5.0's; 4.4 is RHEL 8's): unset
    # before the script starts (BASH_ENV), where it would die at its first
    # step under set -u (rev220's reproduction), with no report.
    (tmp_path / "bash44.env").write_text("unset EPOCHSECONDS\n")
    env = dict(os.environ, PYTHON=str(wrapper), STEP_TIMEOUT="120", OUT=str(out_dir),
               PYTHONPATH=standins(tmp_path / "standins"), PATH=f"{bin_dir}:{os.environ['PATH']}",
               BASH_ENV=str(tmp_path / "bash44.env"))
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY",
                 "GPUBENCH_PIN_DELAY"):
        env.pop(name, None)
    work = tmp_path / "work"
    r = subprocess.run([os.path.join(REPO, "tests", "gpu", "run.sh"), "--cpu", "--gib", "0.02",
                        "--work", str(work)], env=env, capture_output=True, text=True,
                       timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "FAILED" not in out and "TIMEOUT" not in out
    table = {line[:44].strip(): line[44:].split() for line in r.stdout.splitlines()
             if len(line) > 44}
    assert float(table["pinned anonymous memory (the limit)"][0]) > 0
    assert table["wcache, new path"][-1] == "register"
    assert table["wcache, new path, staging forced"][-1] == "staging"
    assert table["wcache, old per-tensor path"][-1] == "tensor"
    assert table["wcache, new path, 4 processes together"][-1] == "register"
    assert table["wcache, new path"][-2] == "0.0"  # private MiB: none on the CPU backend
    # each engine row, then where its time went and why it took its path
    lines = r.stdout.splitlines()
    after = lines[lines.index(next(x for x in lines if x.startswith("wcache, new path  "))) + 1]
    assert after.startswith("    view ") and ", register " in after and ", copy " in after and \
        ", unregister " in after and "; why: cpu: source registered read-only" in after, after
    # the header names the host: its glibc (which the carry needs), bash,
    # and the interpreter every step runs
    bash = subprocess.run(["bash", "-c", "echo $BASH_VERSION"], capture_output=True,
                          text=True, check=True).stdout.strip()
    glibc = os.confstr("CS_GNU_LIBC_VERSION").split()[1]
    version = subprocess.run([sys.executable, "--version"], capture_output=True,
                             text=True).stdout.strip()
    assert f", glibc {glibc}, bash {bash}, " in r.stderr, r.stderr
    assert f"\npython: {wrapper} = {wrapper}: {version}\n" in r.stderr, r.stderr
    for said in ("host: kernel ", "work directory ", "packages: numpy ", "accelerate ",
                 "read-only host registration "
                 "(cudaDevAttrHostRegisterReadOnlySupported): unknown", "nvidia-smi: "):
        assert said in r.stderr, (said, r.stderr)
    assert "nvidia-smi: --query-gpu=driver_version,pcie.link.gen.current," \
        "pcie.link.width.current,pcie.link.gen.max,pcie.link.width.max --format=csv\n" \
        "nvidia-smi: 570.00, 1, 16, 5, 16\n" in r.stderr, r.stderr
    # the pinned row: a power of two of the model's bytes, and the link
    # read while it copied
    import json
    pinned = json.loads((out_dir / "results.jsonl").read_text().splitlines()[0])
    assert pinned["method"] == "pinned" and pinned["bytes"] == 16 << 20 and \
        pinned["model_bytes"] > gpubench.layout_bytes(gpubench.layout(int(0.02 * (1 << 30)))) \
        > pinned["bytes"] and pinned["link"] == "5, 16", pinned
    at = lines.index(next(x for x in lines if x.startswith("pinned anonymous memory")))
    assert lines[at + 1] == "    16 MiB pinned and copied (the largest power of two <= the " \
        f"model's {pinned['model_bytes'] / (1 << 20):.1f} MiB); PCIe link while copying " \
        "(gen, width): 5, 16", lines[at + 1]
    # the targets' steps first, the informational ones after them all
    order = [x for x in r.stderr.splitlines() if x.startswith("== ") and ": " not in x]
    assert order.index("== wcache, 4 processes at once") < \
        order.index("== wcache, new path, staging forced") < \
        order.index("== get_tensor loop, safetensors"), order
    # no load of transformers may wait on the Hub
    assert offline.read_text() == "1 1 1\n" * 3, offline.read_text()
    # transformers' loading code is imported before the load is timed
    assert r.stderr.count("imported before the timing") == 3, r.stderr
    assert "new path >= 0.8x pinned limit" in r.stdout
    # every row's load checked, every tensor, against the file's checksums
    n = len(gpubench.layout(int(0.02 * (1 << 30))))
    assert f"bytes checked against the file (once per row, untimed): all {n} tensors\n" in \
        r.stdout, r.stdout
    assert "== checksums of the model: " in r.stderr, r.stderr
    assert float(table["safetensors.torch.load_file(device=)"][0]) > 0  # the stand-in
    # transformers (the stand-in): three loads; the two through wcache with
    # their speed-up over plain and how many shard handles registered
    plain = table["transformers, plain"]
    assert plain[0] == "load" and plain[2:] == ["s"] and float(plain[1]) > 0
    for label, registered in (("transformers, wcache", "0"),
                              ("transformers, wcache, WCACHE_HOST_REGISTER=1", "4")):
        row = table[label]
        assert row[0] == "load" and row[2] == "s" and row[4] == "plain", row
        assert abs(float(row[3].rstrip("x")) - float(plain[1]) / float(row[1])) < 0.01, row
        assert row[5:9] == [f"({registered}", "of", "4", "handles"], row  # 4 shards
        assert "(unmapping" in row, row  # the handles' unmapping, in the load's seconds
    # WCACHE_SAFETENSORS=1 through the package's .pth (gpubench --site), the
    # other load through wcache.install()
    lines = r.stdout.splitlines()
    at = lines.index(next(x for x in lines if x.startswith("transformers, wcache  ")))
    assert lines[at + 1] == "    safetensors patched by WCACHE_SAFETENSORS=1 " \
        "(wcache-safetensors.pth)", lines[at:at + 2]
    at = lines.index(next(x for x in lines if x.startswith("transformers, wcache, WCACHE_HOST")))
    assert lines[at + 1] == "    safetensors patched by wcache.install()", lines[at:at + 2]
    for label in ("transformers logits equal",
                  "transformers + WCACHE_HOST_REGISTER=1 logits equal",
                  "transformers loaded through wcached",
                  "transformers + WCACHE_HOST_REGISTER=1: every shard registered",
                  "WCACHE_HOST_REGISTER=1: registration left the page cache shared"):
        assert f"PASS  {label}" in r.stdout, (label, r.stdout)
    # the CPU backend pins nothing: the engine's registered pages are not
    # present when read, which measures nothing (it was a PASS)
    assert "n/a   new path: registration left the page cache shared  (pages not present " \
        "when read: nothing measured (0.0 MiB present of " in r.stdout, r.stdout
    _check_informational_rows(r.stdout, out_dir / "results.jsonl", 0.02)
    assert not work.exists(), "the work directory is removed without --keep"
    # what comes back from the device call: the rows and wcached's logs
    got = sorted(os.listdir(out_dir))
    assert got == ["results-concurrent.jsonl", "results.jsonl", "wcached-daemon.log",
                   "wcached-llama-daemon.log"], got
    assert '"method": "concurrent4"' in (out_dir / "results.jsonl").read_text()
    # each wcached has a stage_dir of its own: the second no longer warns
    # that the default one is locked by the first
    for log in ("wcached-daemon.log", "wcached-llama-daemon.log"):
        assert "stage_dir" not in (out_dir / log).read_text(), (out_dir / log).read_text()
    # wcached was stopped: no daemon left with our config
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(work) not in ps


def _check_informational_rows(stdout, results, gib):
    """The informational rows of a --cpu run with a gib GiB model and the
    stand-in safetensors: both get_tensor loops, every tensor once (all
    through the engine on the CPU), their ms per tensor their seconds over
    the tensors; registration of 8 ranges on 1 thread and on 4 threads,
    each registering, 4 at once faster (GPUBENCH_PIN_DELAY: a registration
    that takes time), every range unregistered; and no PASS/MISS for them."""
    import json
    n = len(gpubench.layout(int(gib * (1 << 30))))
    lines = stdout.splitlines()
    rows = {r["method"]: r for r in map(json.loads, results.read_text().splitlines())}
    for key, label in (("upstream_get_tensor", "get_tensor loop, safetensors safe_open"),
                       ("wcache_get_tensor", "get_tensor loop, wcache.safe_open")):
        at = lines.index(next(x for x in lines if x.startswith(label + "  ")))
        gbps, first, seconds, private, *path = lines[at][44:].split()
        row = rows[key]
        assert float(gbps) == row["gbps"] > 0 and float(seconds) > 0, lines[at]
        assert float(first) == row["first_gbps"] and 0 < row["first_gbps"] <= row["gbps"], row
        assert row["tensors"] == n and row["bytes"] == gpubench.layout_bytes(
            gpubench.layout(int(gib * (1 << 30)))), row
        assert abs(row["ms_per_tensor"] - row["seconds"] * 1000 / n) < 1e-3, row
        said = f"    {n} tensors, {row['ms_per_tensor']:.3f} ms per tensor"
        if key == "wcache_get_tensor":
            assert path == ["register"] and private == "0.0", lines[at]
            assert row["engine_tensors"] == n, row  # SMALL_COPY 0 on the CPU: each one
            said += f", {n} of them through the engine"
            assert lines[at + 2].startswith("    view ") and \
                "; why: cpu: source registered read-only" in lines[at + 2], lines[at + 2]
        assert lines[at + 1] == said + " (informational, no target)", lines[at + 1]
    row = rows["register_threads"]
    assert (row["ranges"], row["threads"], row["threads_used"], row["views"]) == \
        (8, 4, 4, False), row
    assert row["bytes"] % (8 * gpubench.PAGE) == 0 and \
        abs(row["bytes"] / 8 / (1 << 20) - row["range_mib"]) < 0.01, row
    assert row["seconds_1"] >= 8 * 0.005 and row["seconds_n"] >= 2 * 0.005, row
    assert abs(row["ratio"] - row["seconds_1"] / row["seconds_n"]) < 0.01 and \
        row["ratio"] > 2, row
    at = lines.index(next(x for x in lines if x.startswith("registration, 1 thread vs 4  ")))
    assert f"{row['seconds_1']:.3f} s vs {row['seconds_n']:.3f} s: {row['ratio']:.2f}x " \
        f"(4x if the driver pins in parallel" in lines[at], lines[at]
    assert lines[at + 1].startswith(f"    8 x {row['range_mib']:g} MiB of the model's mapping;")
    verdicts = [x for x in lines if x[:5].strip() in ("PASS", "MISS", "n/a")]
    assert len(verdicts) == 9, verdicts  # the targets, none more


def _run_small(tmp_path, env, timeout=600):
    """(result, its stdout and stderr, seconds) of run.sh --cpu with a
    0.01 GiB model in tmp_path/work, under env."""
    t0 = time.monotonic()
    r = subprocess.run([os.path.join(REPO, "tests", "gpu", "run.sh"), "--cpu", "--gib", "0.01",
                        "--work", str(tmp_path / "work")], env=env, capture_output=True,
                       text=True, timeout=timeout)
    return r, r.stdout + r.stderr, time.monotonic() - t0


def _python(tmp_path, arms=""):
    """A stand-in interpreter for run.sh (its PYTHON): the command lines
    that match one of arms (sh `case` arms, each ending in ;;) do what it
    says; host-info, which only prints the header's lines (a start of
    Python with torch, which test_run_sh_cpu_mode checks), succeeds at
    once; every other runs Python. For the tests whose steps after it
    do not read the header."""
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\ncase \"$*\" in {arms}\n*' host-info'*) exit 0 ;;\nesac\n"
                       f"exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    return str(wrapper)


def test_run_sh_reports_a_failed_step_and_goes_on(tmp_path):
    """A measurement that fails is named at the end, after the report of
    the others, and the script exits 1. One measurement before it (the
    new path) measures; the others before and after it, the 4 processes
    among them, and host-info succeed without measuring (their rows are
    skipped, which saves starts of Python with torch: test_run_sh_cpu_mode
    runs them). That the run went on past the failed step is read from
    the steps after it, which ran and succeeded (the 4 processes' row,
    which this test read for that, now comes before the failed step)."""
    wrapper = _python(tmp_path, "*wcache_staging*) exit 3 ;;\n"
                      "*'--method pinned '*|*'--method torch_load '*|"
                      "*'--method wcache_tensor '*|*'--method wcache_get_tensor '*|"
                      "*' register-threads '*|*' concurrent '*) exit 0 ;;")
    env = without_transformers(tmp_path / "hide", dict(os.environ, PYTHON=wrapper,
                                                       STEP_TIMEOUT="120"))
    r, out, _ = _run_small(tmp_path, env)
    assert r.returncode == 1, out
    assert "== transformers is not installed: skipped" in r.stderr, out
    assert "FAILED step: wcache, new path, staging forced" in r.stdout
    assert "FAILED step: wcache, 4" not in r.stdout
    lines = {x[:44].strip(): x[44:].split() for x in r.stdout.splitlines() if len(x) > 44}
    assert lines["wcache, new path, staging forced"] == ["skipped"]
    assert float(lines["wcache, new path"][0]) > 0  # the others' report
    said = [x for x in r.stderr.splitlines() if x.startswith("== ")]
    at = said.index("== wcache, new path, staging forced: FAILED (exit 3)")
    went_on = [x.split(": ")[0] for x in said[at + 1:] if x.endswith(" s")]
    assert "== get_tensor loop, wcache" in went_on and \
        "== registration, 1 thread vs 4" in went_on, said


def test_concurrent_fit_on_an_h100():
    """How many of the 4 concurrent loaders an H100 (~78.5 GiB free with
    a context) takes: each is allowed the model, 2% of it and 1 GiB."""
    free = int(78.5 * (1 << 30))
    for gib, n in ((8, 4), (17, 4), (19, 3), (26, 2), (38, 0)):
        assert gpubench.concurrent_fit(4, gib << 30, free) == n, (gib, n)
    assert gpubench.concurrent_fit(4, 8 << 30, 200 << 30) == 4  # never more than asked


def test_run_sh_runs_the_processes_that_fit_the_device(tmp_path):
    """Where 4 copies of the model do not fit the device's free memory
    (here a test's figure, GPUBENCH_TEST_DEVICE_FREE, read in place of
    torch.cuda.mem_get_info()), the concurrent step runs the most that fit,
    one line saying why, and the report's row and judge line name what ran;
    where not even 2 fit, the step is skipped and the judge line is n/a
    with the reason. Before, 4 ran whatever the device had: on an H100
    with --gib above ~17 they would run out of device memory mid-run.
    (The rows that have nothing to do with it, the new path's among them,
    and host-info succeed without measuring; the pinned row is the limit
    the judge line compares with.)"""
    wrapper = _python(tmp_path, "*'--method torch_load '*|*'--method wcache_tensor '*|"
                      "*'--method wcache '*|*'--method wcache_staging '*|*'--method upstream'*|"
                      "*'--method wcache_get_tensor '*|*' register-threads '*) exit 0 ;;")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    model_bytes = gpubench.layout_bytes(gpubench.layout(int(0.01 * (1 << 30))))
    each = gpubench.loader_bytes(model_bytes, gpubench.CPU_LOADER_OVERHEAD)
    env = without_transformers(tmp_path / "hide", dict(
        os.environ, PYTHON=wrapper, STEP_TIMEOUT="120", OUT=str(out_dir),
        GPUBENCH_TEST_DEVICE_FREE=str(int(3.5 * each))))
    t0 = time.monotonic()
    r = subprocess.run([os.path.join(REPO, "tests", "gpu", "run.sh"), "--cpu", "--gib", "0.01",
                        "--work", str(tmp_path / "work"), "--keep"], env=env,
                       capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    said = [x for x in r.stderr.splitlines() if x.startswith("4 processes at once: ")]
    assert len(said) == 1 and said[0].endswith(
        "do not fit the device's "
        f"{3.5 * each / (1 << 30):.2f} GiB free (GPUBENCH_TEST_DEVICE_FREE, a test's figure): "
        "3 processes instead"), said
    rows = [json.loads(x) for x in (out_dir / "results.jsonl").read_text().splitlines()]
    row = next(x for x in rows if x["method"] == "concurrent4")
    assert row["processes"] == 3 and row["fit"] == said[0][len("4 processes at once: "):], row
    assert len((out_dir / "results-concurrent.jsonl").read_text().splitlines()) == 3
    lines = r.stdout.splitlines()
    at = lines.index(next(x for x in lines if x.startswith("wcache, new path, 3 processes ")))
    assert float(lines[at][44:].split()[0]) > 0 and lines[at + 2] == "    " + row["fit"], \
        lines[at:at + 3]
    verdict = next(x for x in lines if "processes together" in x and "0.8x limit" in x)
    assert verdict[:5].strip() in ("PASS", "MISS") and verdict[6:].startswith(
        "3 processes together (4 do not fit the device) >= 0.8x limit  ("), verdict
    assert "4 processes together" not in r.stdout, out
    # not even 2: the step skipped, n/a with the reason (the kept model;
    # no loader starts, so no wcached is needed)
    model = tmp_path / "work" / "model" / "model.safetensors"
    results = tmp_path / "skipped.jsonl"
    env["GPUBENCH_TEST_DEVICE_FREE"] = str(int(1.5 * each))
    for args in (["concurrent", "--model", str(model), "--dir", str(tmp_path), "--results",
                  str(results)], ["report", "--results", str(results)]):
        r = subprocess.run([sys.executable, gpubench.__file__, "--cpu"] + args, env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
    why = "not even 2 do: skipped"
    assert r.stdout.count(why) == 2, r.stdout
    assert "n/a   4 processes together >= 0.8x limit  (skipped: 4 x " in r.stdout, r.stdout
    lines = r.stdout.splitlines()
    at = lines.index(next(x for x in lines if x.startswith("wcache, new path, 4 processes ")))
    assert lines[at][44:].split() == ["skipped"] and lines[at + 1].endswith(why), lines[at:at + 2]
    assert not [f for f in os.listdir(tmp_path) if f.startswith("go.")], "a loader started"
    shutil.rmtree(tmp_path / "work")
    assert time.monotonic() - t0 < 300


def test_run_sh_goes_on_without_a_model(tmp_path):
    """A work directory without room moves the check to /dev/shm; a model
    that cannot be made skips its measurements, not the rest of the run
    nor the report."""
    if not os.access("/dev/shm", os.W_OK):
        pytest.skip("no /dev/shm to move to")
    wrapper = _python(tmp_path, "*' gen '*) exit 3 ;;")
    before = set(os.listdir("/dev/shm"))
    env = without_transformers(tmp_path / "hide", dict(
        os.environ, PYTHON=wrapper, STEP_TIMEOUT="120", WORK_FREE_GIB="0.01"))
    env.pop("OUT", None)
    r, out, _ = _run_small(tmp_path, env)
    assert r.returncode == 1, out
    assert "== transformers is not installed: skipped" in r.stderr, out
    assert "working in /dev/shm" in r.stderr and "work directory /dev/shm/wcache-gpu." in \
        r.stderr, out
    assert "== make the model: FAILED (exit 3)" in r.stderr, out
    assert "== no model: its measurements are skipped" in r.stderr, out
    assert "wcache device check, " in r.stdout and "FAILED step: make the model" in r.stdout, out
    assert not [f for f in set(os.listdir("/dev/shm")) - before if f.startswith("wcache-gpu.")]


def test_run_sh_keeps_to_its_budget(tmp_path):
    """A step that hangs is cut where the run's budget (RUN_BUDGET) would
    be spent, the steps after it are skipped, and the report still prints:
    the device call's own limit would otherwise kill the run before it
    printed anything. The hung step is making the model, and host-info
    is skipped, so that the budget, which the test waits out, need only
    cover a start of Python without torch (room) before it."""
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\ncase \"$*\" in *' gen '*) exec sleep 1000 ;;\n"
                       f"*' host-info'*) exit 0 ;;\nesac\n"
                       f"exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    # 25 s: room fits in the first 10 even on a loaded machine (run.sh
    # skips a step with less than 15 s left); the stand-in transformers
    # gives the steps after the hung one.
    budget = 25
    env = dict(os.environ, PYTHON=str(wrapper), STEP_TIMEOUT="240", MAKE_TIMEOUT="240",
               RUN_BUDGET=str(budget), PYTHONPATH=standins(tmp_path / "standins"))
    r, out, took = _run_small(tmp_path, env)
    assert r.returncode == 1, out
    assert "== make the model: TIMEOUT after" in r.stderr, out
    assert "== make a Llama model: SKIPPED" in r.stderr, out
    assert "== transformers, plain: SKIPPED" in r.stderr, out
    assert "wcache device check, " in r.stdout and " s in all" in r.stdout, out  # the report
    assert "FAILED step: make the model" in r.stdout, out
    assert "FAILED step: transformers, plain" in r.stdout, out
    # Cut where the budget ends, not by its own limit: run.sh gave the step
    # what the budget left it less the 10 s it keeps for the report (not
    # MAKE_TIMEOUT, 240 s). The run's end is bounded generously: past the
    # budget come the report and the cleanup, each a start of Python, as
    # slow as the machine is loaded (the bound was budget + 20 s), and a
    # run that kept to no budget would take MAKE_TIMEOUT.
    limit = int(r.stderr.split("== make the model: TIMEOUT after ", 1)[1].split("s", 1)[0])
    assert limit <= budget - 10, (limit, out)
    assert took < budget + 60, (took, out)


def test_run_sh_leaves_a_step_that_cannot_be_killed(tmp_path):
    """timeout waits for its command after killing it, so a process stuck in
    the kernel (a driver call that never returns) would hold the run past
    every limit. Stood in for by a timeout that ignores everything, and a
    process of the step that never ends on its own (a sleep the test kills
    at its end, as the stuck process would stay) with the step's stdout and
    stderr: run.sh leaves the step behind 8 s after its limit, kills
    timeout, goes on and reports, and its own stdout and stderr end with it
    (a reader of them, this test as `run.sh | tee` on the device, is not
    held by what was left behind). What shows it is an order, not a time:
    run.sh has exited and its stdout and stderr have ended while the
    process left behind still runs. A run.sh held by it would never end
    (the deadline, 300 s, is only there to fail such a run; this one takes
    about 17 s alone, 59 s beside 6 busy loops on 2 cores). Before, the
    test allowed 40 s, which a loaded machine went past (43 s, 59 s)."""
    real = shutil.which("timeout")
    assert real
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "timeout"
    stuck = tmp_path / "stuck.pid"
    fake.write_text(f"#!/bin/sh\ncase \"$*\" in *' gen '*)\n"
                    f"\techo $$ >{tmp_path / 'timeout.pid'}; sleep 100000 & echo $! >{stuck}\n"
                    f"\ttrap '' TERM INT HUP\n\twhile :; do sleep 1; done ;;\nesac\n"
                    f"exec {real} \"$@\"\n")
    fake.chmod(0o755)
    env = without_transformers(tmp_path / "hide", dict(
        os.environ, PYTHON=_python(tmp_path), MAKE_TIMEOUT="2",
        PATH=f"{bin_dir}:{os.environ['PATH']}"))
    try:
        try:
            r, out, _ = _run_small(tmp_path, env, timeout=300)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"run.sh, or its stdout and stderr, did not end in {e.timeout} s "
                        f"while a process its step left behind ran: {e.stderr!r}")
        left = int(stuck.read_text())
        assert _alive(left), "the process left behind ended before run.sh did"
    finally:
        # The process left behind, and the stand-in timeout where run.sh
        # did not kill it (a run.sh that failed the test).
        _kill_ours(stuck, "sleep\0" "100000")
        _kill_ours(tmp_path / "timeout.pid", str(fake))
    assert r.returncode == 1, out
    assert "== make the model: ABANDONED after 10s: killed, a process of it did not end" in \
        r.stderr, out
    assert "== no model: its measurements are skipped" in r.stderr, out
    assert "== transformers is not installed: skipped" in r.stderr, out
    assert "wcache device check, " in r.stdout and "FAILED step: make the model" in r.stdout, out


def test_run_sh_interrupted_ends_its_step(tmp_path):
    """A step runs in the background (so that one the kernel cannot kill
    does not hold the run), where the terminal's SIGINT does not reach it
    and timeout gives it a process group of its own: run.sh interrupted
    (SIGTERM, SIGINT) ends the step it is running before it exits, where
    it left it running after its work directory was removed. The stand-in
    step never ends on its own, so the deadlines only fail a run.sh that
    hangs or a step it left: run.sh's exit includes its cleanup, which
    starts Python twice (4-6 s after the signal at load 15; once past a
    30 s limit here, with builds and other suites beside it). run.sh starts
    with SIGINT at its default, as a terminal's foreground job does
    (_sigint_default): a runner started with `&` from a script ignores
    SIGINT, run.sh inherited that, and bash cannot trap a signal ignored
    when it started: it ignored the SIGINT (exit 1, after the step's limit)
    or, under load, died of it (-2) racing the handler it sets for a moment
    around each wait, without its trap, leaving the step (8 of 8 runs
    failed so, 8 at once beside 2 busy loops on 2 cores).

    While the step runs, run.sh's watch runs no command in the foreground
    (stand-ins for sleep and date note any call): bash drops a SIGINT
    that comes as it starts or ends its wait for one, trap and all. The
    watch once paused with `sleep 0.2` and read the clock with `date`:
    about 1 signal in 160 sent at a random moment was lost so (8 runs at
    once beside 2 busy loops on 2 cores: 4 of 640; 0 of 640 with the
    builtins), the CI failure of 2026-12-07 (the step left running, run.sh
    exit 1 after the step's limit)."""
    real, real_sleep = shutil.which("timeout"), shutil.which("sleep")
    assert real and real_sleep
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    step_pid = tmp_path / "step.pid"
    # The step sleeps by the real sleep's path: the stand-in below is for
    # run.sh's own calls (the step's exec of it, after step.pid, came once
    # after `watching`, under load: a CI failure of the test itself).
    (bin_dir / "timeout").write_text(f"#!/bin/sh\ncase \"$*\" in *' gen '*)\n"
                                     f"\techo $$ >{step_pid}; exec {real_sleep} 100000 ;;\n"
                                     f"esac\nexec {real} \"$@\"\n")
    (bin_dir / "timeout").chmod(0o755)
    watching, called = tmp_path / "watching", tmp_path / "called"
    for name in ("sleep", "date"):
        real_cmd = shutil.which(name)
        assert real_cmd
        (bin_dir / name).write_text(f"#!/bin/sh\n[ -e {watching} ] && echo \"{name} $*\" >>{called}\n"
                                    f"exec {real_cmd} \"$@\"\n")
        (bin_dir / name).chmod(0o755)
    env = dict(os.environ, PYTHON=_python(tmp_path), PATH=f"{bin_dir}:{os.environ['PATH']}")
    for sig in (signal.SIGTERM, signal.SIGINT):
        step_pid.unlink(missing_ok=True)
        with open(tmp_path / "err", "w+") as err:
            p = subprocess.Popen([os.path.join(REPO, "tests", "gpu", "run.sh"), "--cpu",
                                  "--gib", "0.01", "--work", str(tmp_path / "work")],
                                 env=env, stdout=subprocess.DEVNULL, stderr=err,
                                 preexec_fn=_sigint_default)
            try:
                deadline = time.monotonic() + 120
                while not step_pid.exists() or not step_pid.read_text().strip():
                    assert p.poll() is None and time.monotonic() < deadline, \
                        (tmp_path / "err").read_text()
                    time.sleep(0.1)
                pid = int(step_pid.read_text())
                watching.touch()
                time.sleep(1)
                p.send_signal(sig)
                watching.unlink()
                assert not called.exists(), f"run.sh's watch ran: {called.read_text()}"
                rc = p.wait(timeout=300)
                assert rc in (130, 143, -sig), (rc, (tmp_path / "err").read_text())
                gone = time.monotonic() + 60
                while _alive(pid) and time.monotonic() < gone:
                    time.sleep(0.1)
                assert not _alive(pid), f"{sig.name}: the step ({pid}) is still running " \
                    f"(run.sh exited {rc}): {(tmp_path / 'err').read_text()}"
            finally:
                watching.unlink(missing_ok=True)
                if p.poll() is None:
                    p.kill()
                    p.wait()
                _kill_ours(step_pid, "sleep\0" "100000")
        assert not (tmp_path / "work").exists()  # cleanup ran


def _sigint_default():
    """In the child before it runs run.sh: SIGINT handled by default, as
    in a terminal's foreground job, whatever this process inherited."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _kill_ours(pid_file, marker):
    """SIGKILL to the process whose pid pid_file holds, if it still runs
    and its command line holds marker (not another that took its pid)."""
    try:
        pid = int(pid_file.read_text())
        with open(f"/proc/{pid}/cmdline") as f:
            if marker in f.read():
                os.kill(pid, signal.SIGKILL)
    except (FileNotFoundError, ProcessLookupError, ValueError):
        pass


def _alive(pid):
    """Whether pid is a process that has not ended (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_run_sh_reports_past_a_hung_driver(tmp_path):
    """The first calls into the driver (nvidia-smi, host-info's CUDA
    context) are where a fresh machine is likeliest to stall: each has a
    limit, so the run goes on and the report prints within RUN_BUDGET.
    Here nvidia-smi and host-info hang (a stand-in nvidia-smi on PATH, a
    stand-in interpreter); before, the run hung with them, no report.
    nvidia-smi's limit is NVIDIA_SMI_TIMEOUT=3 here (20 s by default: the
    test waited it out)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexec sleep 1000\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\ncase \"$*\" in *' host-info'*) exec sleep 1000 ;; esac\n"
                       f"exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    # nvidia-smi's 3 s, then host-info, which starts with at least the 15 s
    # a step needs left (room, nvidia-smi and the header take under 12 s
    # on a loaded machine), cut 10 s before the end
    budget = 30
    env = without_transformers(tmp_path / "hide", dict(
        os.environ, PYTHON=str(wrapper), RUN_BUDGET=str(budget), NVIDIA_SMI_TIMEOUT="3",
        PATH=f"{bin_dir}:{os.environ['PATH']}"))
    r, out, took = _run_small(tmp_path, env, timeout=budget + 60)
    assert r.returncode == 1, out
    assert "nvidia-smi: failed or timed out (exit 124)" in r.stderr, out
    assert "== host info: TIMEOUT after" in r.stderr, out
    assert "wcache device check, " in r.stdout and "FAILED step: host info" in r.stdout, out
    assert took < budget + 20, (took, out)


def test_run_sh_without_a_cuda_device(tmp_path):
    """Without --cpu on a host where torch sees no CUDA device, the check
    says so as a failed step, skips every measurement and still prints
    the report (it exited at the assertion before, with no report)."""
    env = without_transformers(tmp_path / "hide", dict(os.environ, PYTHON=_python(tmp_path)))
    env.pop("GPUBENCH_CPU", None)
    t0 = time.monotonic()
    r = subprocess.run([os.path.join(REPO, "tests", "gpu", "run.sh"), "--gib", "0.01",
                        "--work", str(tmp_path / "work")], env=env, capture_output=True,
                       text=True, timeout=300)
    out = r.stdout + r.stderr
    import torch
    if torch.cuda.is_available():
        pytest.skip("this host has a CUDA device")
    assert r.returncode == 1, out
    assert "== CUDA device: FAILED (exit 1)" in r.stderr, out
    assert "== no CUDA device: every measurement is skipped" in r.stderr, out
    assert "== host info: " in r.stderr and "== make the model" not in r.stderr, out
    assert "wcache device check, " in r.stdout and "FAILED step: CUDA device" in r.stdout, out
    assert time.monotonic() - t0 < 120, out


def _slow_cuda_check(tmp_path, first_sleep, then):
    """(result, its stdout and stderr) of run.sh (not --cpu) with
    CUDA_CHECK_TIMEOUT=3 under a stand-in interpreter for a fresh machine:
    the CUDA check sleeps first_sleep seconds the first time (torch's
    first import from a cold disk), then does `then` (a shell command);
    making the model and host-info succeed at once without doing
    anything, the rest is Python."""
    wrapper = tmp_path / "python"
    marker = tmp_path / "checked"
    wrapper.write_text(f"#!/bin/sh\ncase \"$*\" in *'torch.cuda.is_available()'*)\n"
                       f"\tif [ -e {marker} ]; then {then}; fi\n"
                       f"\ttouch {marker}; exec sleep {first_sleep} ;;\n"
                       f"*' gen '*|*' host-info'*) exit 0 ;;\nesac\n"
                       f"exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    env = without_transformers(tmp_path / "hide", dict(
        os.environ, PYTHON=str(wrapper), CUDA_CHECK_TIMEOUT="3"))
    env.pop("GPUBENCH_CPU", None)
    r = subprocess.run([os.path.join(REPO, "tests", "gpu", "run.sh"), "--gib", "0.01",
                        "--work", str(tmp_path / "work")], env=env, capture_output=True,
                       text=True, timeout=300)
    return r, r.stdout + r.stderr


def test_run_sh_tries_a_cuda_check_that_timed_out_again(tmp_path):
    """The CUDA check is the run's first import of torch, which on a
    machine just lent may outlast its limit: it is tried once more (warm
    then), and the run goes on where that answers. Before, its timeout
    said "no CUDA device" and skipped every measurement."""
    r, out = _slow_cuda_check(tmp_path, 1000, "exit 0")
    assert "== CUDA device: TIMEOUT after 3s" in r.stderr, out
    assert "== CUDA device, again (warm now): " in r.stderr and \
        "again (warm now): TIMEOUT" not in r.stderr, out
    assert "no CUDA device" not in out and "FAILED step: CUDA device" not in out, out
    assert "== make the model" in r.stderr, out  # the measurements were not skipped
    assert "wcache device check, " in r.stdout, out


def test_run_sh_says_a_cuda_check_timed_out(tmp_path):
    """A CUDA check that times out twice skips the measurements, and says
    it timed out: not "no CUDA device", which it never learnt."""
    r, out = _slow_cuda_check(tmp_path, 1000, "exec sleep 1000")
    assert r.returncode == 1, out
    assert "== CUDA device: TIMEOUT after 3s" in r.stderr, out
    assert "== CUDA device, again (warm now): TIMEOUT after 3s" in r.stderr, out
    assert "== the CUDA check timed out twice" in r.stderr, out
    assert "no CUDA device" not in out, out
    assert "FAILED step: CUDA device (timed out twice)" in r.stdout, out
    assert "== make the model" not in r.stderr, out
