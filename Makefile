# Thin wrapper over CMake. `make` builds into build/; `make test` runs every
# test in a normal build and again in an ASan+UBSan clang build with short
# fuzz runs, then the system tests (the .deb files under a real systemd in
# a Debian 12 container); `make deps` installs missing Debian packages.
SHELL       := /bin/bash
BUILD       ?= build
ASAN_BUILD  ?= build-asan
# lint's compilation database: configured only (nothing is built there), so
# that lint never reconfigures $(BUILD) while make test's runs use it.
LINT_BUILD  ?= $(BUILD)-lint
JOBS        ?= $(shell nproc)
# ctest lanes for the full runs. The integration runs (two per build) and
# the Python suite (two, in the gcc build only) wait on timers and daemons
# more than they compute (measured: about 1.1 to 1.4 cores busy of 2 with
# three side by side), and make test's work at nice 19 (the system tests'
# roots, clang's Release build, lint) takes only what they leave: the gcc
# build's ctest runs its four pytest entries at once, two more lanes than
# cores (four lanes measured 375 s instead of 450 s for it alone; its
# entries were slower only when the debootstraps ran beside it at normal
# priority), the ASan build's one more than cores, since its fuzzers
# compute all the time they run.
TEST_JOBS      ?= $(shell echo $$(( $(JOBS) + 2 )))
ASAN_TEST_JOBS ?= $(shell echo $$(( $(JOBS) + 1 )))
FUZZ_SECONDS ?= 300
PREFIX      ?= /usr/local
DESTDIR     ?=

DEPS = cmake make gcc clang libclang-rt-14-dev pkg-config libuv1-dev libinih-dev \
       libcmocka-dev libjansson-dev libfuse3-dev fuse3 python3 python3-pytest python3-numpy \
       python3-torch procps systemd util-linux debhelper dh-python dpkg-dev binutils \
       groff-base man-db clang-tidy cppcheck python3-pip python3-venv python3-yaml \
       systemd-container debootstrap strace valgrind podman runc catatonit uidmap \
       slirp4netns fuse-overlayfs btrfs-progs python3-fsspec lintian prometheus

.PHONY: all deps build layers columns test asan-build test-asan release-builds test-release test-system lint fuzz bench demo \
	gpu-carry install deb clean

all: build

deps:
	@missing=""; for p in $(DEPS); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		if [ "$$(id -u)" != 0 ]; then echo "make deps: run as root to install:$$missing" >&2; exit 1; fi; \
		apt-get install -y -q $$missing || { apt-get update -q && apt-get install -y -q $$missing; }; \
	fi

# Warnings are errors here and in CI (WCACHE_WERROR=ON), not in a plain
# `cmake` build of someone else's, where a newer compiler must not break it.
# CMake's Release (-O3) with gcc, so that
# gcc's optimiser-only warnings are errors (-O3's -Wdangling-pointer found
# d4bc518's), with debug information for gdb and perf.
build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS_RELEASE="-O3 -g -DNDEBUG" \
		-DWCACHE_WERROR=ON >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

# The packages are built once, first: the integration tests of both builds
# check these (WCACHE_DEBS) instead of building their own, and test-system
# installs them. Beside the two ctest phases, at nice 19 so that they take
# only the CPU the tests leave idle (the tests wait on timers and daemons a
# good part of the time): the system tests' two Debian roots (debootstrap,
# by tests/system/roots.py, output in $(BUILD)/roots.log; the suites wait
# for a root still being made), and clang's Release build and lint (output
# in $(BUILD)/checks.log, printed after the tests), and the ASan build
# (asan-build, output in $(BUILD)/asan-build.log): test-asan waits for it
# and then builds what is left, nothing where it finished, or shows the
# error again where it failed (about 100 s of compiling that ran alone
# between the two ctest phases before). Only the compilers and
# the static checks run there: that build's unit tests, which have
# timers of their own, run after the ASan phase at normal priority.
# The recipe calls make through SUBMAKE, not $(MAKE): GNU make runs any recipe
# line that names $(MAKE) even under -n, so `make -n test` started the tests,
# the Release build, lint and the debootstraps (review rev224 M1); it prints
# them now. Under `make -jN test` the sub-makes say "jobserver unavailable:
# using -j1", which costs nothing: their work is cmake's and ctest's, which
# take -j $(JOBS) of their own.
SUBMAKE = $(MAKE)
test: build deb
	@nice -n 19 /usr/bin/python3 tests/system/roots.py --build $(BUILD) >$(BUILD)/roots.log 2>&1 & \
	roots=$$!; \
	nice -n 19 $(SUBMAKE) --no-print-directory asan-build >$(BUILD)/asan-build.log 2>&1 & \
	asan=$$!; \
	nice -n 19 $(SUBMAKE) --no-print-directory -k release-builds lint >$(BUILD)/checks.log 2>&1 & \
	checks=$$!; ok=0; checked=0; \
	echo "make test: beside the tests, at nice 19: the system tests' roots ($(BUILD)/roots.log)"; \
	echo "make test: and clang's Release build and lint ($(BUILD)/checks.log, printed after the tests)"; \
	echo "make test: and the ASan build ($(BUILD)/asan-build.log; test-asan finishes it)"; \
	echo "cd $(BUILD) && ctest --output-on-failure -j $(TEST_JOBS)"; \
	(cd $(BUILD) && WCACHE_DEBS=$(abspath $(BUILD))/deb \
		ctest --output-on-failure -j $(TEST_JOBS)); rc=$$?; wait $$asan; \
	[ $$rc = 0 ] && WCACHE_DEBS=$(abspath $(BUILD))/deb $(SUBMAKE) test-asan && ok=1; \
	wait $$checks && checked=1; \
	echo "make test: clang's Release build and lint ($(BUILD)/checks.log):"; cat $(BUILD)/checks.log; \
	[ $$checked = 1 ] || echo "make test: clang's Release build or lint failed (above)"; \
	[ $$ok = 1 ] && [ $$checked = 1 ] && $(SUBMAKE) test-release || ok=0; \
	wait $$roots; cat $(BUILD)/roots.log; \
	[ $$ok = 1 ] && [ $$checked = 1 ] || exit 1; \
	$(SYSTEM_TESTS)

# Release (-O3) with clang too, warnings as errors, its unit tests run
# against it (gcc's Release is $(BUILD), whose tests make test runs).
release-builds: deps
	CC=clang cmake -S . -B $(BUILD)-release-clang -DCMAKE_BUILD_TYPE=Release \
		-DWCACHE_WERROR=ON >/dev/null
	cmake --build $(BUILD)-release-clang -j $(JOBS)

# clang's Release unit tests (make test runs this after the ASan phase, at
# normal priority: some have timers of their own).
test-release: release-builds
	cd $(BUILD)-release-clang && ctest --output-on-failure -j $(JOBS) -R '^unit_'

# Dependencies go one way (README, "Layout"): includes between folders and
# calls between the daemon's modules (scripts/layers.sh says what it checks).
layers:
	@sh scripts/layers.sh

# Every tracked .c and .h line within 100 columns, tabs 8 wide (STYLE.md,
# "Formatting"; scripts/columns.sh names each longer line).
columns:
	@sh scripts/columns.sh

# Static analysis: warnings are errors (.clang-tidy sets WarningsAsErrors).
# The unit tests and the fuzz harnesses are checked as the code is. The
# harnesses build only with clang (WCACHE_FUZZ=ON), so $(LINT_BUILD)'s compilation
# database has no command for them: clang-tidy gets their flags after --.
# clang-tidy runs on $(JOBS) files at once (xargs: its status is 123 if any
# run found something).
SOURCES = client/*/*.c proto/*.c daemon/*.c
TEST_SOURCES = tests/unit/*.c tests/unit/*/*.c
FUZZ_SOURCES = tests/fuzz/*.c
lint: deps layers columns
	cppcheck --quiet --enable=warning,portability --std=c11 -D_GNU_SOURCE \
		-DWCACHE_VERSION='"lint"' -I . -I client -I daemon \
		--suppress=missingIncludeSystem --inline-suppr --error-exitcode=1 \
		$(SOURCES) $(TEST_SOURCES) $(FUZZ_SOURCES)
	cmake -S . -B $(LINT_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWCACHE_WERROR=ON \
		-DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
	ls $(SOURCES) $(TEST_SOURCES) | xargs -P $(JOBS) -n 8 clang-tidy -p $(LINT_BUILD) --quiet \
		2>&1 | grep -v "warnings generated" ; exit $${PIPESTATUS[1]}
	ls $(FUZZ_SOURCES) | xargs -P $(JOBS) -n 8 sh -c 'clang-tidy --quiet "$$@" -- \
		-std=c11 -D_GNU_SOURCE -DWCACHE_VERSION="\"lint\"" -I . -I client -I daemon' \
		clang-tidy 2>&1 | grep -v "warnings generated" ; exit $${PIPESTATUS[1]}

# The test run gives each fuzzer 10 s, whatever an earlier `make fuzz` left
# in the build's cache.
asan-build: deps
	CC=clang cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DWCACHE_SANITIZE=ON \
		-DWCACHE_FUZZ=ON -DWCACHE_FUZZ_SECONDS=10 -DWCACHE_WERROR=ON >/dev/null
	cmake --build $(ASAN_BUILD) -j $(JOBS)

test-asan: asan-build
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
		UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure \
		-j $(ASAN_TEST_JOBS)

fuzz: deps
	CC=clang cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DWCACHE_SANITIZE=ON \
		-DWCACHE_FUZZ=ON -DWCACHE_FUZZ_SECONDS=$(FUZZ_SECONDS) >/dev/null
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ctest --output-on-failure -R '^fuzz_'

bench: build
	tests/bench/run.sh $(BUILD)

demo: build
	/usr/bin/python3 tests/demo.py --build $(BUILD)

# What tests/gpu/run.sh needs on a GPU host without our build tools or Debian's
# libraries: the binaries and every shared library they load but glibc, in
# .gpu-carry/ (README, "The device check").
gpu-carry: build
	sh scripts/gpu-carry.sh $(BUILD) .gpu-carry

install: build
	DESTDIR=$(DESTDIR) cmake --install $(BUILD) --prefix $(PREFIX)
# Debian packages: wcached, libwcache0, libwcache-dev, python3-wcache.
deb: deps
	scripts/make-deb.sh $(BUILD)/deb

# The packaged service under a real systemd: tests/system/run.py boots a
# Debian 12 root (debootstrapped once into $(BUILD)/system) with
# systemd-nspawn and checks the .deb files there. Then tests/system/kube.py
# builds the images of deploy/ (from a root debootstrapped once into
# $(BUILD)/kube) and runs the manifests of deploy/k8s with podman and runc.
# Both need root and skip, saying why on one line, where no container can
# run; both always run, and the target fails if either failed.
define SYSTEM_TESTS
rc=0; \
/usr/bin/python3 tests/system/run.py --build $(BUILD) --debs $(BUILD)/deb || rc=1; \
/usr/bin/python3 tests/system/kube.py --build $(BUILD) --debs $(BUILD)/deb || rc=1; \
exit $$rc
endef

test-system: deb
	$(SYSTEM_TESTS)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(BUILD)-release-gcc $(BUILD)-release-clang $(LINT_BUILD)
