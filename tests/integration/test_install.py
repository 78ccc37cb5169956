"""Installing and packaging wcache, as a user of it would see them.

- `cmake --install` into a temporary DESTDIR (prefix /usr/local, as
  `make install` does): the layout, the library's SONAME, the generated
  wcache.pc and systemd units, no path into the build tree.
- A C program built against that DESTDIR with `pkg-config --cflags --libs
  wcache`, and another with CMake's find_package(wcache), attach a model
  through the *installed* wcached and compare every tensor byte with the file.
- The man pages render without a warning, document every public function,
  configuration key, command and option, and the example of wcache(3)
  compiles against the installed header.
- `scripts/make-deb.sh` (what `make deb` runs) builds the Debian packages;
  they are unpacked into a scratch root with `dpkg -x` (never installed on
  this machine) and run from there: `wcached --check`, the daemon itself,
  the Python package attaching through it, pkg-config and the CMake package.

Environment: WCACHE_BUILD (the build directory), WCACHE_SRCDIR (the tree).
In a sanitizer build the test programs are compiled with the build's
compiler and sanitizer flags, since the installed library needs them.
"""
import os
import pathlib
import re
import shutil
import subprocess
import textwrap

import pytest

from conftest import BUILD, Daemon, binary, connectable, mkmodel, wait_until

SRC = os.path.abspath(os.environ.get("WCACHE_SRCDIR")
                      or os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.abspath(BUILD)
PREFIX = "/usr/local"
MAN_PAGES = {"man1": ["wcachectl.1"], "man3": ["wcache.3"], "man5": ["wcached.conf.5"],
             "man8": ["wcached.8"]}

# A worker: attaches argv[2] through the socket argv[1], opens the file
# argv[3] directly, and checks that both hold the same tensors, byte for
# byte. Prints the tensor count, the generation and the file libwcache was
# loaded from (from /proc/self/maps), so the test can tell which copy ran.
WORKER_C = r"""
/* worker.c: a client of the installed libwcache (see test_install.py). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wcache.h>

static int
fail(const char *what)
{
	fprintf(stderr, "worker: %s: %s\n", what, wc_errmsg());
	return 1;
}

/* Prints the path of the mapped libwcache, as the dynamic loader found it. */
static void
print_library(void)
{
	char line[4096];
	FILE *f = fopen("/proc/self/maps", "r");

	if (f == NULL)
		return;
	while (fgets(line, sizeof(line), f) != NULL) {
		char *p = strchr(line, '/');
		if (p != NULL && strstr(p, "libwcache.so") != NULL) {
			printf("library %s", p);
			break;
		}
	}
	fclose(f);
}

int
main(int argc, char **argv)
{
	wc_client *c;
	wc_model *attached, *file;
	size_t n;

	if (argc != 4) {
		fprintf(stderr, "usage: worker SOCKET MODEL FILE\n");
		return 2;
	}
	if (wc_connect(argv[1], &c) < 0)
		return fail("connect");
	if (wc_attach(c, argv[2], &attached) < 0)
		return fail("attach");
	if (wc_open_file(argv[3], &file) < 0)
		return fail("open");
	n = wc_model_count(attached);
	if (n == 0 || n != wc_model_count(file)) {
		fprintf(stderr, "worker: %zu tensors attached, %zu in the file\n", n,
			wc_model_count(file));
		return 1;
	}
	for (size_t i = 0; i < n; i++) {
		wc_tensor a, f;

		if (wc_model_tensor(attached, i, &a) < 0 || wc_model_find(file, a.name, &f) < 0)
			return fail("tensor");
		if (a.nbytes != f.nbytes || strcmp(a.dtype, f.dtype) != 0 ||
			memcmp(a.data, f.data, (size_t)a.nbytes) != 0) {
			fprintf(stderr, "worker: tensor %s differs\n", a.name);
			return 1;
		}
	}
	printf("tensors %zu generation %" PRIu64 "\n", n, wc_model_generation(attached));
	print_library();
	wc_release(attached);
	wc_release(file);
	wc_disconnect(c);
	return 0;
}
"""

CONSUMER_CMAKE = """
cmake_minimum_required(VERSION 3.18)
project(wcache_consumer LANGUAGES C)
find_package(wcache 0.1 REQUIRED CONFIG)
add_executable(worker worker.c)
target_link_libraries(worker PRIVATE wcache::wcache)
message(STATUS "wcache ${wcache_VERSION} from ${wcache_DIR}")
"""


def run(cmd, **kw):
    """Runs cmd; fails the test with its output when it exits non-zero."""
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("timeout", 300)
    r = subprocess.run(cmd, **kw)
    assert r.returncode == 0, f"{cmd} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r


def cache_value(key):
    """A value from the build's CMakeCache.txt, or None."""
    try:
        with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
            for line in f:
                m = re.match(rf"{re.escape(key)}:[A-Z]+=(.*)$", line.rstrip("\n"))
                if m:
                    return m.group(1)
    except OSError:
        pass
    return None


def is_on(value):
    return (value or "").upper() in ("ON", "1", "YES", "TRUE", "Y")


def build_cc_flags():
    """The compiler and flags a program linked with this build's libwcache
    needs: a sanitizer build's library refers to the sanitizer runtime."""
    cc = cache_value("CMAKE_C_COMPILER") or "cc"
    flags = []
    if is_on(cache_value("WCACHE_SANITIZE")):
        flags += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
    if is_on(cache_value("WCACHE_FUZZ")):
        flags += ["-fsanitize=fuzzer-no-link"]
    return cc, flags


def wait_model_ready(daemon):
    """Waits until wcached listens (attaches are answered once its models
    are loaded)."""
    wait_until(lambda: daemon.proc.poll() is not None or connectable(daemon.socket),
               what="wcached to listen")
    assert daemon.proc.poll() is None, daemon.read_log()


class InstalledDaemon(Daemon):
    """conftest's Daemon, running another wcached binary (the installed one)."""

    def __init__(self, tmp, models, wcached, env=None):
        super().__init__(tmp, models)
        self.wcached = wcached
        self.env = env

    def start(self, env=None):
        self.logf = open(self.log, "w")
        self.proc = subprocess.Popen([self.wcached, "-c", self.conf], stderr=self.logf,
                                     env=env or self.env)
        wait_model_ready(self)
        return self


@pytest.fixture
def installed_daemon(tmp_path, installed):
    """The installed wcached serving one small model as "small"."""
    model = mkmodel(tmp_path / "small.safetensors")
    d = InstalledDaemon(tmp_path, {"small": model},
                        os.path.join(installed["prefix"], "sbin", "wcached")).start()
    d.model = model
    yield d
    status = d.stop()
    assert status == 0, f"installed wcached exited with {status}:\n{d.read_log()}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """`cmake --install` of the build into a fresh DESTDIR, prefix /usr/local."""
    dest = str(tmp_path_factory.mktemp("destdir"))
    env = dict(os.environ, DESTDIR=dest)
    run(["cmake", "--install", BUILD, "--prefix", PREFIX], env=env)
    prefix = dest + PREFIX
    return {"dest": dest, "prefix": prefix, "lib": os.path.join(prefix, "lib")}


def readelf_dynamic(path):
    return run(["readelf", "-d", path]).stdout


# --- cmake --install -----------------------------------------------------------

def test_install_layout(installed):
    p = installed["prefix"]
    expect = ["sbin/wcached", "bin/wcachectl", "include/wcache.h", "lib/libwcache.so",
              "lib/libwcache.so.0", "lib/pkgconfig/wcache.pc",
              "lib/cmake/wcache/wcacheConfig.cmake",
              "lib/cmake/wcache/wcacheConfigVersion.cmake",
              "lib/cmake/wcache/wcacheTargets.cmake",
              "lib/systemd/system/wcached.service", "lib/sysusers.d/wcache.conf",
              "lib/tmpfiles.d/wcache.conf", "share/doc/wcache/wcached.conf.example"]
    expect += [f"share/man/{sec}/{page}" for sec, pages in MAN_PAGES.items() for page in pages]
    missing = [e for e in expect if not os.path.exists(os.path.join(p, e))]
    assert not missing, f"not installed under {p}: {missing}"
    for prog in ("sbin/wcached", "bin/wcachectl"):
        assert os.access(os.path.join(p, prog), os.X_OK), prog

    # Every socket and service unit of systemd/ is installed.
    for unit in os.listdir(os.path.join(SRC, "systemd")):
        if unit.endswith((".service", ".socket")):
            assert os.path.exists(os.path.join(p, "lib/systemd/system", unit)), unit

    # Everything installed (CMake's manifest lists paths without DESTDIR)
    # is under the prefix, and was written into DESTDIR.
    with open(os.path.join(BUILD, "install_manifest.txt")) as f:
        manifest = f.read().split()
    assert len(manifest) >= len(expect)
    outside = [path for path in manifest if not path.startswith(PREFIX + "/")]
    assert not outside, f"installed outside the prefix {PREFIX}: {outside}"
    absent = [path for path in manifest if not os.path.lexists(installed["dest"] + path)]
    assert not absent, f"not written into DESTDIR: {absent}"

    # The version is the project's; the header is the tree's.
    with open(os.path.join(SRC, "client", "lib", "wcache.h"), "rb") as a, \
            open(os.path.join(p, "include", "wcache.h"), "rb") as b:
        assert a.read() == b.read()


def test_install_puts_the_example_config_in_etc_once(installed, tmp_path):
    """/etc/wcached.conf (in DESTDIR, whatever the prefix) is the example when
    there was none; a second install keeps an edited one; it is not in the
    manifest, so uninstalling cannot remove an operator's configuration."""
    conf = os.path.join(installed["dest"], "etc", "wcached.conf")
    with open(conf) as f, open(os.path.join(SRC, "conf", "wcached.conf.example")) as g:
        assert f.read() == g.read()
    with open(os.path.join(BUILD, "install_manifest.txt")) as f:
        assert "/etc/wcached.conf" not in f.read().split()
    r = subprocess.run([os.path.join(installed["prefix"], "sbin", "wcached"), "--check", "-c",
                        conf], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, LD_LIBRARY_PATH=installed["lib"]))
    # Valid, serving nothing yet: a warning says so.
    assert r.returncode == 0, r.stdout + r.stderr
    assert "configures no model" in r.stderr and "warning" in r.stderr
    dest = str(tmp_path / "again")
    os.makedirs(os.path.join(dest, "etc"))
    with open(os.path.join(dest, "etc", "wcached.conf"), "w") as f:
        f.write("; the operator's own\n")
    run(["cmake", "--install", BUILD, "--prefix", PREFIX, "--component", "Runtime"],
        env=dict(os.environ, DESTDIR=dest))
    with open(os.path.join(dest, "etc", "wcached.conf")) as f:
        assert f.read() == "; the operator's own\n"


def exported_symbols(library):
    """The functions a shared library exports (nm -D, defined, global)."""
    out = run(["nm", "-D", "--defined-only", library]).stdout
    return sorted(line.split()[2] for line in out.splitlines()
                  if len(line.split()) == 3 and line.split()[1] in "TW")


def test_symbols_file_matches_exports():
    """debian/libwcache0.symbols lists exactly what libwcache.so.0 exports:
    a function added to wcache.h without a symbols entry (or the reverse)
    fails here before lintian or dpkg-gensymbols see it."""
    lib = os.path.realpath(os.path.join(BUILD, "lib", "libwcache.so.0"))
    exported = exported_symbols(lib)
    listed = sorted(re.findall(r"^ (\w+)@Base ", read("debian", "libwcache0.symbols"), re.M))
    assert exported, f"nm found no exports in {lib}"
    assert listed == exported, (
        f"missing from debian/libwcache0.symbols: {sorted(set(exported) - set(listed))}; "
        f"listed but not exported: {sorted(set(listed) - set(exported))}")
    assert all(name.startswith("wc_") for name in exported), exported


def test_library_soname_and_no_build_paths(installed):
    lib = installed["lib"]
    assert os.path.islink(os.path.join(lib, "libwcache.so"))
    assert os.readlink(os.path.join(lib, "libwcache.so")) == "libwcache.so.0"
    real = os.path.realpath(os.path.join(lib, "libwcache.so.0"))
    assert re.fullmatch(r"libwcache\.so\.0\.\d+\.\d+", os.path.basename(real)), real
    assert "Library soname: [libwcache.so.0]" in readelf_dynamic(real)
    for prog in ("sbin/wcached", "bin/wcachectl"):
        dyn = readelf_dynamic(os.path.join(installed["prefix"], prog))
        assert BUILD not in dyn and SRC not in dyn, f"{prog} refers to the build tree:\n{dyn}"


def test_pkgconfig_file(installed):
    pc = os.path.join(installed["lib"], "pkgconfig", "wcache.pc")
    with open(pc) as f:
        text = f.read()
    assert re.search(rf"^prefix={re.escape(PREFIX)}$", text, re.M), text
    env = dict(os.environ, PKG_CONFIG_LIBDIR=os.path.dirname(pc))
    env.pop("PKG_CONFIG_PATH", None)
    version = run(["pkg-config", "--modversion", "wcache"], env=env).stdout.strip()
    project = re.search(r"project\(wcache VERSION ([0-9.]+)",
                        open(os.path.join(SRC, "CMakeLists.txt")).read()).group(1)
    assert version == project
    assert run(["pkg-config", "--variable=libdir", "wcache"], env=env).stdout.strip() == \
        PREFIX + "/lib"


def test_units_name_installed_programs(installed):
    """ExecStart= and ExecReload= point at the programs where they were
    installed (sbin/wcached, bin/wcachectl under the prefix)."""
    unit = os.path.join(installed["prefix"], "lib/systemd/system/wcached.service")
    with open(unit) as f:
        text = f.read()
    start = re.search(r"^ExecStart=[-@:+!]*(\S+)", text, re.M).group(1)
    assert start == PREFIX + "/sbin/wcached"
    for cmd in re.findall(r"^Exec\w*=[-@:+!]*(\S+)", text, re.M):
        assert cmd.startswith(PREFIX + "/"), f"{unit}: {cmd} is not under {PREFIX}"
        assert os.access(installed["dest"] + cmd, os.X_OK), f"{unit}: {cmd} is not installed"
    with open(os.path.join(installed["prefix"], "lib/sysusers.d/wcache.conf")) as f:
        assert re.search(r"^u\s+wcache\s", f.read(), re.M)


def test_pkgconfig_build_attaches_through_installed_daemon(tmp_path, installed,
                                                            installed_daemon):
    src = tmp_path / "worker.c"
    src.write_text(WORKER_C)
    env = dict(os.environ, PKG_CONFIG_SYSROOT_DIR=installed["dest"],
               PKG_CONFIG_LIBDIR=os.path.join(installed["lib"], "pkgconfig"))
    env.pop("PKG_CONFIG_PATH", None)
    flags = run(["pkg-config", "--cflags", "--libs", "wcache"], env=env).stdout.split()
    assert "-I" + installed["prefix"] + "/include" in flags, flags
    assert "-lwcache" in flags
    cc, extra = build_cc_flags()
    exe = str(tmp_path / "worker")
    run([cc, *extra, "-std=c11", "-Wall", "-Wextra", "-Werror", str(src), "-o", exe, *flags])

    r = run([exe, installed_daemon.socket, "small", installed_daemon.model],
            env=dict(os.environ, LD_LIBRARY_PATH=installed["lib"]))
    assert re.search(r"^tensors [1-9]\d* generation [1-9]", r.stdout, re.M), r.stdout
    lib = re.search(r"^library (\S+)", r.stdout, re.M).group(1)
    assert lib.startswith(installed["lib"] + "/"), f"loaded {lib}, not the installed library"


def test_find_package_build_attaches(tmp_path, installed, installed_daemon):
    proj = tmp_path / "consumer"
    proj.mkdir()
    (proj / "CMakeLists.txt").write_text(CONSUMER_CMAKE)
    (proj / "worker.c").write_text(WORKER_C)
    cc, extra = build_cc_flags()
    bld = str(tmp_path / "consumer-build")
    cfg = run(["cmake", "-S", str(proj), "-B", bld, f"-DCMAKE_PREFIX_PATH={installed['prefix']}",
               f"-DCMAKE_C_COMPILER={cc}", f"-DCMAKE_C_FLAGS={' '.join(extra)}",
               f"-DCMAKE_EXE_LINKER_FLAGS={' '.join(extra)}"])
    assert f"from {installed['prefix']}/lib/cmake/wcache" in cfg.stdout, cfg.stdout
    run(["cmake", "--build", bld])

    # The imported target carries the library's path: no LD_LIBRARY_PATH.
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)
    r = run([os.path.join(bld, "worker"), installed_daemon.socket, "small",
             installed_daemon.model], env=env)
    assert re.search(r"^tensors [1-9]", r.stdout, re.M), r.stdout
    lib = re.search(r"^library (\S+)", r.stdout, re.M).group(1)
    assert lib.startswith(installed["lib"] + "/"), lib


def test_find_package_refuses_other_major_version(tmp_path, installed):
    proj = tmp_path / "v1"
    proj.mkdir()
    (proj / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(v1 LANGUAGES NONE)\n"
        "find_package(wcache 1 CONFIG)\n"
        "if(wcache_FOUND)\n  message(FATAL_ERROR \"wcache 1 found\")\nendif()\n")
    run(["cmake", "-S", str(proj), "-B", str(tmp_path / "v1-build"),
         f"-DCMAKE_PREFIX_PATH={installed['prefix']}"])


# --- man pages -------------------------------------------------------------------

def man_pages(root):
    return [os.path.join(root, sec, page) for sec, pages in MAN_PAGES.items() for page in pages]


def test_man_pages_render_without_warnings(installed):
    mandoc = shutil.which("mandoc")
    for page in man_pages(os.path.join(installed["prefix"], "share", "man")):
        r = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", page],
                           capture_output=True, text=True)
        assert r.returncode == 0 and r.stderr == "", f"groff: {page}:\n{r.stderr}"
        r = subprocess.run(["man", "-l", page], capture_output=True, text=True,
                           env=dict(os.environ, MANWIDTH="80", MANPAGER="cat", PAGER="cat"))
        assert r.returncode == 0 and "NAME" in r.stdout, f"man -l {page}:\n{r.stderr}"
        if mandoc:
            r = subprocess.run([mandoc, "-Tlint", "-Wwarning", page], capture_output=True,
                               text=True)
            assert r.returncode == 0, f"mandoc: {page}:\n{r.stdout}{r.stderr}"


def read(*parts):
    with open(os.path.join(SRC, *parts)) as f:
        return f.read()


def test_man_pages_cover_the_interfaces():
    """Every public function, config key, wcachectl command and wcached
    option has its entry: a new one without documentation fails here."""
    page = read("man", "wcache.3")
    functions = re.findall(r"^WC_EXPORT\b[^(]*?\b(wc_\w+)\(", read("client", "lib", "wcache.h"), re.M)
    assert len(functions) >= 10, functions
    for fn in functions:
        assert re.search(rf"^\.BR? {fn} \(\)", page, re.M), f"wcache.3 does not describe {fn}()"
        assert fn in page.split(".SH SYNOPSIS")[0], f"wcache.3: {fn} missing from NAME"

    page = read("man", "wcached.conf.5")
    keys = re.findall(r'^\s*\[[WM]K_\w+\] = "(\w+)"', read("daemon", "config.c"), re.M)
    assert {"socket", "path", "pin"} <= set(keys), keys
    for key in keys:
        assert re.search(rf'^\.BI {key} " = ', page, re.M), f"wcached.conf.5 lacks {key}"

    page = read("man", "wcachectl.1")
    helptext = run([binary("wcachectl"), "--help"]).stdout
    commands = re.findall(r"^  ([a-z]+)\s{2,}", helptext, re.M)
    assert "status" in commands and "inspect" in commands, commands
    for cmd in commands:
        assert re.search(rf"^\.(B|BI|BR) \"?{cmd}\b", page, re.M), \
            f"wcachectl.1 lacks the command {cmd}"

    page = read("man", "wcached.8")
    helptext = run([binary("wcached"), "--help"]).stdout
    options = re.findall(r"--([a-z][a-z-]*)", helptext)
    assert "check" in options, options
    for opt in options:
        assert "\\-\\-" + opt.replace("-", "\\-") in page, f"wcached.8 lacks --{opt}"


def test_wcache3_example_compiles(tmp_path, installed):
    """The program in EXAMPLES of wcache(3) builds against the installed
    header and library."""
    text = run(["groff", "-man", "-Tascii", "-P-cbou",
                os.path.join(installed["prefix"], "share/man/man3/wcache.3")]).stdout
    example = text.split("\nEXAMPLES\n", 1)[1]
    start = example.index("#include")
    end = example.index("\n       }\n", start) + len("\n       }\n")
    src = textwrap.dedent(example[start:end])
    (tmp_path / "example.c").write_text(src)
    cc, extra = build_cc_flags()
    run([cc, *extra, "-std=c11", "-Wall", "-Wextra", "-Werror",
         "-I" + os.path.join(installed["prefix"], "include"), str(tmp_path / "example.c"),
         "-L" + installed["lib"], "-lwcache", "-o", str(tmp_path / "example")])


# --- Debian packages -------------------------------------------------------------

PACKAGES = ("wcached", "libwcache0", "libwcache-dev", "python3-wcache")


@pytest.fixture(scope="module")
def debs(tmp_path_factory):
    """The .deb files scripts/make-deb.sh builds, by package name: those it
    built into $WCACHE_DEBS where that is set (`make test` builds them once,
    with `make deb`, for both builds' runs and the system tests), else built
    here."""
    given = os.environ.get("WCACHE_DEBS")
    if given:
        out = pathlib.Path(given)
        if not out.is_dir():
            pytest.fail(f"WCACHE_DEBS={given}: no such directory: run `make deb`, or unset "
                        "WCACHE_DEBS to build the packages here")
    else:
        if shutil.which("dpkg-buildpackage") is None:
            pytest.skip("dpkg-buildpackage is not installed (make deps installs it)")
        out = tmp_path_factory.mktemp("debs")
        run([os.path.join(SRC, "scripts", "make-deb.sh"), str(out)], timeout=900)
    found = {}
    for name in os.listdir(out):
        if name.endswith(".deb"):
            found[name.split("_")[0]] = str(out / name)
    if given and not set(PACKAGES) <= set(found):
        pytest.fail(f"WCACHE_DEBS={given} holds {sorted(found)}, not all of {sorted(PACKAGES)}: "
                    "run `make deb`, or unset WCACHE_DEBS to build them here")
    return found


@pytest.fixture(scope="module")
def scratch(debs, tmp_path_factory):
    """Every package unpacked into one scratch root (dpkg -x: no maintainer
    scripts run, nothing touches this machine's dpkg database)."""
    root = str(tmp_path_factory.mktemp("deb-root"))
    for pkg in PACKAGES:
        run(["dpkg", "-x", debs[pkg], root])
    multiarch = run(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"]).stdout.strip()
    return {"root": root, "lib": os.path.join(root, "usr/lib", multiarch),
            "multiarch": multiarch}


def deb_field(path, field):
    return run(["dpkg-deb", "-f", path, field]).stdout.strip()


def test_deb_packages_and_metadata(debs, tmp_path):
    assert set(PACKAGES) <= set(debs), f"built: {sorted(debs)}"
    assert deb_field(debs["python3-wcache"], "Architecture") == "all"
    assert "libwcache0" in deb_field(debs["python3-wcache"], "Depends")
    assert "python3-numpy" in deb_field(debs["python3-wcache"], "Depends")
    assert "libwcache0 (=" in deb_field(debs["libwcache-dev"], "Depends")
    assert deb_field(debs["libwcache0"], "Multi-Arch") == "same"

    ctl = tmp_path / "wcached.control"
    run(["dpkg-deb", "-e", debs["wcached"], str(ctl)])
    assert (ctl / "conffiles").read_text().split() == ["/etc/wcached.conf"]
    postinst = (ctl / "postinst").read_text()
    # The user exists before tmpfiles chowns /run/wcached to it, and the
    # units are enabled.
    assert postinst.index("systemd-sysusers") < postinst.index("systemd-tmpfiles")
    assert "wcached.socket" in postinst and "wcached.service" in postinst

    ctl = tmp_path / "lib.control"
    run(["dpkg-deb", "-e", debs["libwcache0"], str(ctl)])
    assert "libwcache.so.0 libwcache0" in (ctl / "symbols").read_text()


LINTIAN = shutil.which("lintian")
# Tags that are right for this package: it is not uploaded to Debian, so
# there is no ITP bug for the changelog to close.
LINTIAN_ALLOWED = {"initial-upload-closes-no-bugs"}


def test_lintian_is_clean(debs):
    """lintian finds no error and no warning in the packages (their
    .changes: every .deb and the .buildinfo), but the allowed tags."""
    if LINTIAN is None:
        pytest.skip("lintian is not installed (Debian package lintian)")
    if os.environ.get("WCACHE_DEBS") and is_on(cache_value("WCACHE_SANITIZE")):
        # `make test` gives both builds' runs the same packages: the
        # first run's lintian (13-46 s here) checked these very files.
        pytest.skip("sanitizer build with WCACHE_DEBS: lintian checked these packages in the "
                    "other build's run")
    changes = [os.path.join(os.path.dirname(p), n) for p in list(debs.values())[:1]
               for n in os.listdir(os.path.dirname(p)) if n.endswith(".changes")]
    targets = changes or sorted(debs.values())
    r = subprocess.run([LINTIAN, "--tag-display-limit", "0", *targets], capture_output=True,
                       text=True, timeout=600)
    findings = [l for l in r.stdout.splitlines() if re.match(r"^[EW]: ", l)]
    bad = [l for l in findings if l.split()[2] not in LINTIAN_ALLOWED]
    assert not bad, "lintian:\n" + "\n".join(bad) + "\n" + r.stderr
    assert r.returncode in (0, 1), r.stderr  # 2: lintian itself failed


def test_deb_ships_the_metrics_units(scratch):
    units = os.path.join(scratch["root"], "lib/systemd/system")
    for unit in ("wcached-metrics.socket", "wcached-metrics@.service"):
        assert os.path.exists(os.path.join(units, unit)), unit
    with open(os.path.join(units, "wcached-metrics@.service")) as f:
        text = f.read()
    assert re.search(r"^ExecStart=/usr/bin/wcachectl .*metrics --http$", text, re.M), text


def test_deb_contents(scratch):
    root, lib = scratch["root"], scratch["lib"]
    for path in ("usr/sbin/wcached", "usr/bin/wcachectl", "etc/wcached.conf",
                 "lib/systemd/system/wcached.service", "usr/lib/sysusers.d/wcache.conf",
                 "usr/include/wcache.h", "usr/share/man/man8/wcached.8.gz",
                 "usr/share/man/man3/wcache.3.gz",
                 "usr/share/doc/wcached/examples/wcached.conf.example",
                 "usr/lib/python3/dist-packages/wcache/__init__.py",
                 "usr/lib/python3/dist-packages/wcache/torch.py",
                 "usr/lib/python3/dist-packages/wcache-safetensors.pth",
                 "usr/bin/wcache-convert"):
        assert os.path.exists(os.path.join(root, path)), path
    # the dist-info: importlib.metadata sees the package and its script
    r = run(["/usr/bin/python3", "-c", "import importlib.metadata as m; "
             "print(m.version('wcache'), [e.value for e in m.distribution('wcache').entry_points])"],
            env=dict(os.environ, PYTHONPATH=os.path.join(root, "usr/lib/python3/dist-packages")))
    assert r.stdout.split()[0] == "0.1.0" and "wcache.convert:main" in r.stdout, r.stdout
    assert "Library soname: [libwcache.so.0]" in readelf_dynamic(os.path.join(lib, "libwcache.so.0"))
    with open(os.path.join(lib, "pkgconfig", "wcache.pc")) as f:
        pc = f.read()
    assert re.search(r"^prefix=/usr$", pc, re.M)
    assert re.search(rf"^libdir=\$\{{prefix\}}/lib/{scratch['multiarch']}$", pc, re.M)
    with open(os.path.join(root, "lib/systemd/system/wcached.service")) as f:
        unit = f.read()
    assert re.search(r"^ExecStart=/usr/sbin/wcached\s", unit, re.M), unit
    for page in ("usr/share/man/man8/wcached.8.gz", "usr/share/man/man3/wcache.3.gz"):
        r = subprocess.run(["man", "-l", os.path.join(root, page)], capture_output=True,
                           text=True, env=dict(os.environ, MANWIDTH="80", MANPAGER="cat"))
        assert r.returncode == 0 and "NAME" in r.stdout, r.stderr


def test_deb_wcached_check(tmp_path, scratch):
    """wcached --check from the package, on a config serving a small model,
    and on the package's own /etc/wcached.conf."""
    model = mkmodel(tmp_path / "small.safetensors")
    conf = tmp_path / "wcached.conf"
    conf.write_text(f"[wcached]\nsocket = {tmp_path}/s.sock\ncontrol = {tmp_path}/c.sock\n\n"
                    f"[model small]\npath = {model}\n")
    env = dict(os.environ, LD_LIBRARY_PATH=scratch["lib"])
    wcached = os.path.join(scratch["root"], "usr/sbin/wcached")
    r = subprocess.run([wcached, "--check", "-c", str(conf)], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r'^model "small": ok', r.stdout, re.M), r.stdout
    r = subprocess.run([wcached, "--check", "-c", os.path.join(scratch["root"], "etc/wcached.conf")],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr

    # A broken configuration fails the check.
    bad = tmp_path / "bad.conf"
    bad.write_text("[model small]\npth = x\n")
    r = subprocess.run([wcached, "--check", "-c", str(bad)], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 1 and "bad.conf:2" in r.stderr, r.stdout + r.stderr


def test_deb_daemon_serves_python_and_c(tmp_path, scratch):
    """The packaged daemon serves a model; the packaged Python package
    attaches it through the packaged libwcache (found by the dynamic loader,
    no $WCACHE_LIB); a program built against the -dev package does too."""
    model = mkmodel(tmp_path / "small.safetensors")
    env = dict(os.environ, LD_LIBRARY_PATH=scratch["lib"])
    env.pop("WCACHE_LIB", None)
    d = InstalledDaemon(tmp_path, {"small": model},
                        os.path.join(scratch["root"], "usr/sbin/wcached"), env=env).start()
    try:
        script = textwrap.dedent("""
            import sys, wcache
            with wcache.connect(sys.argv[1]) as client:
                m = client.attach("small")
                f = wcache.open_file(sys.argv[2])
                assert sorted(m.keys()) == sorted(f.keys()), "tensor names differ"
                print("tensors", len(m), "generation", m.generation)
            with open("/proc/self/maps") as maps:
                print("library", [l.split()[-1] for l in maps if "libwcache.so" in l][0])
            print("module", wcache.__file__)
        """)
        penv = dict(env, PYTHONPATH=os.path.join(scratch["root"], "usr/lib/python3/dist-packages"))
        r = run(["/usr/bin/python3", "-c", script, d.socket, model], env=penv, cwd=str(tmp_path))
        assert re.search(r"^tensors [1-9]\d* generation [1-9]", r.stdout, re.M), r.stdout
        lib = re.search(r"^library (\S+)", r.stdout, re.M).group(1)
        assert lib.startswith(scratch["lib"] + "/"), lib
        assert re.search(r"^module " + re.escape(scratch["root"]), r.stdout, re.M), r.stdout

        # C, through the -dev package's pkg-config file.
        (tmp_path / "worker.c").write_text(WORKER_C)
        cenv = dict(os.environ, PKG_CONFIG_SYSROOT_DIR=scratch["root"],
                    PKG_CONFIG_LIBDIR=os.path.join(scratch["lib"], "pkgconfig"))
        cenv.pop("PKG_CONFIG_PATH", None)
        flags = run(["pkg-config", "--cflags", "--libs", "wcache"], env=cenv).stdout.split()
        exe = str(tmp_path / "worker")
        run(["cc", "-std=c11", "-Wall", "-Werror", str(tmp_path / "worker.c"), "-o", exe, *flags])
        r = run([exe, d.socket, "small", model], env=env)
        assert re.search(r"^tensors [1-9]", r.stdout, re.M), r.stdout
        assert re.search(r"^library " + re.escape(scratch["lib"] + "/"), r.stdout, re.M), r.stdout
    finally:
        status = d.stop()
    assert status == 0, d.read_log()


def test_deb_cmake_package_is_relocatable(tmp_path, scratch):
    """find_package(wcache) against the -dev package unpacked elsewhere."""
    proj = tmp_path / "consumer"
    proj.mkdir()
    (proj / "CMakeLists.txt").write_text(CONSUMER_CMAKE)
    (proj / "worker.c").write_text(WORKER_C)
    cfg = run(["cmake", "-S", str(proj), "-B", str(tmp_path / "b"),
               f"-DCMAKE_PREFIX_PATH={scratch['root']}/usr"])
    assert f"from {scratch['lib']}/cmake/wcache" in cfg.stdout, cfg.stdout
    run(["cmake", "--build", str(tmp_path / "b")])


def test_versions_agree():
    """debian/changelog and the man pages' headers name the project's version."""
    project = re.search(r"project\(wcache VERSION ([0-9.]+)", read("CMakeLists.txt")).group(1)
    first = read("debian", "changelog").splitlines()[0]
    assert re.match(rf"wcache \({re.escape(project)}-\d+\)", first), \
        f"debian/changelog starts with {first!r}; the project is at {project}"
    for sec, pages in MAN_PAGES.items():
        for page in pages:
            th = re.search(r"^\.TH .*$", read("man", page), re.M).group(0)
            assert f'"wcache {project}"' in th, f"man/{page}: {th} (project {project})"
