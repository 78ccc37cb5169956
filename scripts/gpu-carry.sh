#!/bin/sh
# scripts/gpu-carry.sh: a self-contained copy of what tests/gpu/run.sh needs
# from a build, for a GPU host that has Python and torch but neither our
# build tools nor the Debian libraries wcached links (libuv, inih).
#
#   scripts/gpu-carry.sh [BUILD [OUT]]     (default: build .gpu-carry)
#   scripts/gpu-carry.sh --sources         (the digest of this tree's C sources)
#
# OUT gets bin/wcached, bin/wcachectl and lib/libwcache.so.0 from BUILD, and
# in lib/ a copy of every shared library they load other than the C
# library's own (Debian's libuv.so.1 and libinih.so.1), as the loader here
# resolves them. run.sh puts OUT/lib on LD_LIBRARY_PATH, so
# `tests/gpu/run.sh --build OUT` runs there with nothing installed but
# glibc (at least the version MANIFEST names). MANIFEST lists each file,
# its size, its sha256 and the Debian package it came from, and the commit
# (git describe --always --dirty) and digest of the C sources (--sources
# prints it) it was made from, which run.sh's header compares with the
# tree it runs in. OUT is made under OUT.partial and renamed into place
# only when complete; the copy is
# checked by starting `wcached --version` and `wcachectl --version` from it
# with a clean environment, and by the loader resolving every library but
# glibc's from OUT/lib.
set -eu

# A digest of the C sources a build is made from (what CMake compiles and
# how), the same here and on the GPU host, where the tree comes without git:
# MANIFEST records it, and run.sh compares it with the tree it runs in.
sources() {
	root=$(cd "$(dirname "$0")/.." && pwd)
	(cd "$root" && find CMakeLists.txt cmake proto daemon client/CMakeLists.txt client/base \
		client/ctl client/format client/lib -type f \( -name '*.c' -o -name '*.h' -o \
		-name CMakeLists.txt -o -name '*.cmake' -o -name '*.in' \) -print0 |
		LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
}

build=${1:-build}
out=${2:-.gpu-carry}
case "$build" in
-h | --help) sed -n '2,22p' "$0"; exit 0 ;;
--sources) sources; exit 0 ;;
esac
out=${out%/}
[ -n "$out" ] || { echo "gpu-carry: OUT must not be / or empty" >&2; exit 2; }

for f in bin/wcached bin/wcachectl lib/libwcache.so.0; do
	if [ ! -e "$build/$f" ]; then
		echo "gpu-carry: $build/$f is missing: build first (make build)" >&2
		exit 1
	fi
done
command -v ldd >/dev/null || { echo "gpu-carry: ldd is missing (libc-bin)" >&2; exit 1; }

tmp=$out.partial
rm -rf "$tmp"
mkdir -p "$tmp/bin" "$tmp/lib"
cp -L "$build/bin/wcached" "$build/bin/wcachectl" "$tmp/bin/"
cp -L "$build/lib/libwcache.so.0" "$tmp/lib/"

# The libraries each file loads, as "name path" lines, less the C library's
# own (every host has those, and a copy of them would not match its loader)
# and less what the build itself makes.
glibc_own='^(libc|libm|libdl|libpthread|librt|libresolv|libutil|ld-linux[^ ]*)\.so'
needed() {
	ldd "$1" >"$tmp/ldd" || { echo "gpu-carry: ldd $1 failed" >&2; exit 1; }
	awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }
		$2 == "=>" && $3 == "not" { print $1, "missing"; }' "$tmp/ldd" |
		grep -Ev "$glibc_own" | grep -v '^libwcache\.so' || true
}
# The files to check, as "$@" (OUT may have spaces in its path).
set -- "$tmp/bin/wcached" "$tmp/bin/wcachectl" "$tmp/lib/libwcache.so.0"
for f in "$@"; do
	needed "$f" >"$tmp/needed"
	while read -r name path; do
		if [ "$path" = missing ]; then
			echo "gpu-carry: $f needs $name, which the loader here cannot find" >&2
			exit 1
		fi
		if [ ! -e "$tmp/lib/$name" ]; then
			cp -L "$path" "$tmp/lib/$name"
			echo "$name $(readlink -f "$path")" >>"$tmp/sources"
		fi
	done <"$tmp/needed"
done

# The newest glibc symbol version any file needs: the host's glibc must be
# at least that.
glibc=$(for f in "$tmp"/bin/* "$tmp"/lib/*; do
	objdump -T "$f" 2>/dev/null | grep -o 'GLIBC_[0-9.]*'
done | sed 's/GLIBC_//' | sort -uV | tail -1)

{
	echo "# wcache GPU carry from $build, $(date -u +%FT%TZ), $(uname -m)"
	echo "# needs glibc >= ${glibc:-unknown}; run: tests/gpu/run.sh --build $out"
	commit=$(git -C "$(dirname "$0")/.." describe --always --dirty 2>/dev/null) || commit=unknown
	echo "# commit $commit"
	echo "# sources $(sources)"
	for f in "$tmp"/bin/* "$tmp"/lib/*; do
		rel=${f#"$tmp"/}
		src=$(awk -v n="${rel#lib/}" '$1 == n { print $2 }' "$tmp/sources" 2>/dev/null)
		if [ -z "$src" ]; then
			from="built here"
		else
			pkg=$(dpkg -S "$src" 2>/dev/null | head -1 | cut -d: -f1 || true)
			if [ -n "$pkg" ]; then
				from="$pkg $(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null) ($src)"
			else
				from=$src
			fi
		fi
		echo "$rel $(stat -c %s "$f") $(sha256sum "$f" | cut -d' ' -f1) $from"
	done
} >"$tmp/MANIFEST"

# Started from the copy alone: what the GPU host's loader will do.
for b in wcached wcachectl; do
	if ! env -i LD_LIBRARY_PATH="$tmp/lib" "$tmp/bin/$b" --version >/dev/null 2>"$tmp/err"; then
		echo "gpu-carry: $tmp/bin/$b --version failed: $(head -1 "$tmp/err")" >&2
		exit 1
	fi
done
# And every library but glibc's found in the copy, not where this host
# keeps its own (which --version above would not tell apart).
abs=$(cd "$tmp" && pwd)
for f in "$@"; do
	env -i LD_LIBRARY_PATH="$abs/lib" ldd "$f" >"$tmp/ldd" ||
		{ echo "gpu-carry: ldd $f failed" >&2; exit 1; }
	# "name path" (the path whole, spaces and all), or "name not-found"
	sed -n -e 's/^[[:space:]]*\([^ ]*\) => not found$/\1 not-found/p' \
		-e 's/^[[:space:]]*\([^ ]*\) => \(.*\) (0x[0-9a-f]*)$/\1 \2/p' "$tmp/ldd" |
		grep -Ev "$glibc_own" |
		while read -r name path; do
			case "$path" in
			"$abs/lib/"*) ;;
			*) echo "gpu-carry: $f loads $name from $path, not from the copy" >&2; exit 1 ;;
			esac
		done
done
rm -f "$tmp/err" "$tmp/sources" "$tmp/ldd" "$tmp/needed"
rm -rf "$out"
mv "$tmp" "$out"
echo "gpu-carry: $out: $(find "$out" -type f | wc -l) files, $(du -sh "$out" | cut -f1), needs glibc >= ${glibc:-unknown}"
