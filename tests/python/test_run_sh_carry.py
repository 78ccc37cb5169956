"""tests/gpu/run.sh --cpu with a build tree made for another host: the
tree scripts/gpu-carry.sh makes, on a host without our libraries, and one
whose wcached does not start there. (test_run_sh.py has the other runs;
these two, which each take about as long as a whole run, are apart from it
so that the ctest entries python and python_2 of tests/CMakeLists.txt,
which run side by side, take about as long as each other.)"""
import os
import shutil
import subprocess
import sys

import pytest

from test_gpu_script import REPO, standins, without_transformers


def _python(path, arms):
    """A stand-in interpreter for run.sh (its PYTHON) at path: the command
    lines that match one of arms (sh `case` arms) do what it says, every
    other runs Python."""
    path.write_text(f"#!/bin/sh\ncase \"$*\" in\n{arms}\nesac\nexec {sys.executable} \"$@\"\n")
    path.chmod(0o755)
    return str(path)


# The steps of a --cpu run that neither start wcached nor load through
# libwcache, the 4 processes and the informational rows (which load as
# the new path does): they succeed at once without running, where a test
# is about the tree run.sh uses, not about them (test_run_sh_cpu_mode and
# test_run_sh_without_a_wcache_that_starts run them).
NOT_THE_TREE = ("*' host-info'*|*'--method pinned '*|*'--method torch_load '*|*' concurrent '*|"
                "*'--method wcache_staging '*|*'--method wcache_get_tensor '*|"
                "*' register-threads '*) exit 0 ;;")


def _unshare_mount():
    """The command that runs a shell in a private mount namespace here
    (root: unshare -m; else a user namespace too), or None."""
    for cmd in (["unshare", "-m"], ["unshare", "-rm"]):
        if os.geteuid() != 0 and cmd == ["unshare", "-m"]:
            continue
        if subprocess.run(cmd + ["true"], capture_output=True).returncode == 0:
            return cmd
    return None


def test_run_sh_on_a_host_without_our_libraries(tmp_path):
    """A GPU host has Python and torch but not Debian's libuv and inih.
    Here they are hidden (/dev/null bound over them in a private mount
    namespace): build/ then does not start, and run.sh says so and how to
    mend it, failing the steps that need wcache and running the others
    (here each succeeds at once: what is said of build/ is run.sh's, and
    test_run_sh_without_a_wcache_that_starts runs those steps with a
    libwcache that cannot load); the tree scripts/gpu-carry.sh makes runs
    the --cpu check there: its wcached started, and the per-tensor and new
    paths loading through its libwcache (NOT_THE_TREE's steps succeed at
    once)."""
    build = os.environ.get("WCACHE_BUILD") or os.path.join(REPO, "build")
    wcached = os.path.join(build, "bin", "wcached")
    if not os.path.exists(wcached):
        pytest.skip(f"{wcached} is missing: build first")
    unshare = _unshare_mount()
    if unshare is None:
        pytest.skip("no private mount namespace here (unshare -m, unshare -rm)")
    ldd = subprocess.run(["ldd", wcached], capture_output=True, text=True, check=True).stdout
    libs = [line.split()[2] for line in ldd.splitlines()
            if line.split()[0] in ("libuv.so.1", "libinih.so.1") and "=>" in line]
    assert len(libs) == 2, ldd
    carry = tmp_path / "carry"
    made = subprocess.run(["sh", os.path.join(REPO, "scripts", "gpu-carry.sh"), build,
                           f"{carry}/"], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stdout + made.stderr
    manifest = (carry / "MANIFEST").read_text()
    assert "lib/libuv.so.1 " in manifest and "lib/libinih.so.1 " in manifest, manifest
    # what it was made from: the commit and the digest of the C sources,
    # which run.sh's header compares with the tree's
    sources = subprocess.run(["sh", os.path.join(REPO, "scripts", "gpu-carry.sh"), "--sources"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert f"\n# sources {sources}\n" in manifest and "\n# commit " in manifest, manifest
    # Debian's torch links the system's libuv.so.1; a wheel carries its own
    # in torch/lib. That stands in for it here, for Python alone: run.sh
    # gives the carried lib/ to wcached only, so torch keeps its own.
    torch_lib = tmp_path / "torch-lib"
    torch_lib.mkdir()
    shutil.copy([lib for lib in libs if lib.endswith("libuv.so.1")][0], torch_lib / "libuv.so.1")
    run_sh = os.path.join(REPO, "tests", "gpu", "run.sh")
    # build/: a model file that is there (what run.sh asks of the steps
    # that need wcache), every step of Python but room and the report at once
    first_py = _python(tmp_path / "python1", "*' gen '*) : >\"$4/model.safetensors\"; exit 0 ;;\n"
                       "*' warm '*|*' sums '*) exit 0 ;;\n" + NOT_THE_TREE)
    script = "".join(f"mount --bind /dev/null {lib} || exit 97\n" for lib in libs) + (
        f"{wcached} --version >/dev/null 2>&1 && exit 98\n"
        f"PYTHON={first_py} {run_sh} --cpu --gib 0.01 --build {build} --work {tmp_path}/w1 "
        f">{tmp_path}/out1 2>&1\n"
        f"echo $? >{tmp_path}/rc1\n"
        # relative, as README's device call passes it
        f"cd {tmp_path} && exec {run_sh} --cpu --gib 0.01 --build carry --work {tmp_path}/w2\n")
    env = {k: v for k, v in os.environ.items() if k not in ("WCACHE_BUILD", "WCACHE_LIB")}
    env.update(PYTHON=_python(tmp_path / "python2", NOT_THE_TREE), STEP_TIMEOUT="120",
               LD_LIBRARY_PATH=str(torch_lib))
    env = without_transformers(tmp_path / "hide", env)
    r = subprocess.run(unshare + ["bash", "-c", script], env=env, capture_output=True,
                       text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode not in (97, 98), f"the libraries were not hidden ({r.returncode}): {out}"
    # build/ does not start without them: the library and the mend named,
    # the steps that need wcache failed, the others run (exit 1)
    assert (tmp_path / "rc1").read_text().strip() == "1"
    first = (tmp_path / "out1").read_text()
    assert "does not start here" in first and ".so.1" in first and "make gpu-carry" in first, first
    assert "FAILED step: wcache, new path (needs wcache)" in first, first
    assert "== pinned anonymous memory: " in first and "TIMEOUT" not in first, first
    # the carried tree runs the check
    assert r.returncode == 0, out
    assert "FAILED" not in out and "TIMEOUT" not in out, out
    assert f"build {carry}" in out
    for step in ("start wcached", "wcache, per-tensor path", "wcache, new path"):
        assert f"== {step}: " in r.stderr, (step, out)
    assert f"C sources: carry {sources}, tree {sources}" in out and "WARNING" not in out, out
    assert "== transformers is not installed: skipped" in r.stderr, out
    # the CPU backend pins nothing: n/a, its pages not present when read
    assert "n/a   new path: registration left the page cache shared  (pages not present" in \
        r.stdout, out


def test_run_sh_without_a_wcache_that_starts(tmp_path):
    """A carried tree whose wcached does not start on the host (its glibc
    older than the carry needs: a stand-in that fails as the loader does,
    and a libwcache.so.0 that cannot load) no longer stops the run: the
    steps that need no wcache (pinned memory, upstream safetensors,
    torch.load, transformers plainly) run and are reported; the others are
    failed steps, and the reason is said. Its MANIFEST names other C
    sources than this tree's, and a glibc newer than any (99.1): the
    header warns of both, the second in one line saying that every wcache
    step will fail (before, only the loader's message said why)."""
    carry = tmp_path / "carry"
    (carry / "bin").mkdir(parents=True)
    (carry / "lib").mkdir()
    for b in ("wcached", "wcachectl"):
        (carry / "bin" / b).write_text(
            f"#!/bin/sh\necho \"{carry}/bin/{b}: /lib/x86_64-linux-gnu/libc.so.6: version "
            f"\\`GLIBC_2.34' not found (required by {carry}/bin/{b})\" >&2\nexit 1\n")
        (carry / "bin" / b).chmod(0o755)
    (carry / "lib" / "libwcache.so.0").write_bytes(b"not a library\n")
    (carry / "MANIFEST").write_text(f"# needs glibc >= 99.1; run: tests/gpu/run.sh --build "
                                    f"{carry}\n# commit 0000000\n# sources 0000000000000000\n")
    # host-info (the header's lines) succeeds at once
    env = dict(os.environ, PYTHON=_python(tmp_path / "python", "*' host-info'*) exit 0 ;;"),
               STEP_TIMEOUT="120", PYTHONPATH=standins(tmp_path / "standins"))
    env.pop("WCACHE_BUILD", None)
    r = subprocess.run([os.path.join(REPO, "tests", "gpu", "run.sh"), "--cpu", "--gib", "0.01",
                        "--build", str(carry), "--work", str(tmp_path / "work")], env=env,
                       capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "TIMEOUT" not in out and "ABANDONED" not in out, out
    assert "run.sh: no wcache here: " in r.stderr and "GLIBC_2.34' not found" in r.stderr, out
    assert "WARNING: " in r.stderr and "other C sources than this tree's" in r.stderr, out
    glibc = os.confstr("CS_GNU_LIBC_VERSION").split()[1]
    assert f"\nWARNING: {carry} needs glibc >= 99.1, this host has {glibc}: every wcache " \
        f"step will fail\n" in r.stderr, out
    table = {line[:44].strip(): line[44:].split() for line in r.stdout.splitlines()
             if len(line) > 44}
    for label in ("pinned anonymous memory (the limit)", "safetensors.torch.load_file(device=)",
                  "torch.load(mmap=True) then .to()", "get_tensor loop, safetensors safe_open"):
        assert float(table[label][0]) > 0, (label, out)
    assert table["wcache, new path"] == ["skipped"], out
    assert table["transformers, plain"][0] == "load", out
    failed = [x[len("FAILED step: "):] for x in r.stdout.splitlines()
              if x.startswith("FAILED step: ")]
    assert failed == [f"{label} (needs wcache)" for label in (
        "start wcached", "wcache, per-tensor path", "wcache, new path",
        "start wcached for its shards", "transformers, wcache",
        "transformers, wcache, WCACHE_HOST_REGISTER=1", "compare logits",
        "compare logits, host registration", "wcache, 4 processes at once",
        "wcache, new path, staging forced", "get_tensor loop, wcache",
        "registration, 1 thread vs 4")], out
    assert "(no wcache: " in r.stdout and "does not start here" in r.stdout, out
