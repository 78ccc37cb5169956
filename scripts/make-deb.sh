#!/bin/sh
# make-deb.sh: builds wcache's Debian packages (wcached, libwcache0,
# libwcache-dev, python3-wcache) from this source tree with the standard
# tooling (dpkg-buildpackage, debhelper 13, dh + cmake), offline, and puts
# the .deb files into OUTDIR (default build/deb).
#
#   scripts/make-deb.sh [OUTDIR]
#
# Why a copy: dpkg-buildpackage builds in the source tree and writes its
# results into the parent directory, and `debian/rules clean` runs first.
# Building a copy in a temporary directory leaves the developer's tree, its
# build directories and its parent untouched. The copy holds the files git
# knows plus new files not ignored (so uncommitted work is packaged too),
# or, outside a git checkout, everything but build directories.
#
# Needs the packages of debian/control's Build-Depends (`make deps` installs
# them); dpkg-checkbuilddeps names any that are missing. Runs as root or
# not (Rules-Requires-Root: no).
set -eu

SRCDIR=$(cd "$(dirname "$0")/.." && pwd)
OUTDIR=${1:-$SRCDIR/build/deb}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}

for tool in dpkg-buildpackage dh cmake; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "make-deb.sh: $tool is missing: run make deps (as root)" >&2
		exit 1
	fi
done

# The upstream version in debian/changelog must be the project's version.
project_version=$(sed -n 's/^project(wcache VERSION \([0-9.]*\).*/\1/p' "$SRCDIR/CMakeLists.txt")
deb_version=$(cd "$SRCDIR" && dpkg-parsechangelog -S Version)
case "$deb_version" in
"$project_version"-*) ;;
*)
	echo "make-deb.sh: debian/changelog is at $deb_version but CMakeLists.txt says" \
		"$project_version: add a changelog entry $project_version-1" >&2
	exit 1
	;;
esac

mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)

work=$(mktemp -d "${TMPDIR:-/tmp}/wcache-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
trap 'exit 1' INT TERM
src="$work/wcache-$project_version"
mkdir -p "$src"

if git -C "$SRCDIR" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	# Tracked and untracked-but-not-ignored files that exist (a tracked
	# file deleted in the work tree is skipped).
	# shellcheck disable=SC2016 # $f is expanded by the inner sh
	(cd "$SRCDIR" && git ls-files -z --cached --others --exclude-standard) |
		(cd "$SRCDIR" && xargs -0 sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh) |
		(cd "$SRCDIR" && tar --null -T - -cf -) | tar -xf - -C "$src"
else
	(cd "$SRCDIR" && tar --exclude='./build*' --exclude='./obj-*' --exclude='./.git' \
		--exclude='__pycache__' --exclude='./debian/tmp' -cf - .) | tar -xf - -C "$src"
fi

echo "make-deb.sh: building in $src"
(cd "$src" && DEB_BUILD_OPTIONS="parallel=$JOBS ${DEB_BUILD_OPTIONS:-}" \
	dpkg-buildpackage -us -uc -b) >"$work/build.log" 2>&1 || {
	tail -n 60 "$work/build.log" >&2
	echo "make-deb.sh: dpkg-buildpackage failed (last lines above)" >&2
	exit 1
}

rm -f "$OUTDIR"/wcached_*.deb "$OUTDIR"/wcached-dbgsym_*.deb "$OUTDIR"/libwcache0_*.deb \
	"$OUTDIR"/libwcache0-dbgsym_*.deb "$OUTDIR"/libwcache-dev_*.deb "$OUTDIR"/python3-wcache_*.deb
for f in "$work"/*.deb; do
	cp "$f" "$OUTDIR/"
	echo "$OUTDIR/$(basename "$f")"
done
# The .changes (which lintian checks with every package it lists) and the
# .buildinfo it names.
rm -f "$OUTDIR"/wcache_*.changes "$OUTDIR"/wcache_*.buildinfo
cp "$work"/*.changes "$work"/*.buildinfo "$OUTDIR/" 2>/dev/null || true
cp "$work/build.log" "$OUTDIR/build.log"
