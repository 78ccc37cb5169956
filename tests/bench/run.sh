#!/bin/sh
# run.sh BUILD: the benchmark suite behind `make bench` (after the build).
#
# 1. Header validation (issue 2): safetensors headers of ~1,000 and ~50,000
#    tensors (mkmodel with tiny hidden sizes, so the files are small), timed
#    in-process by bench_header next to a plain read() of the same bytes.
# 2. Loading (issue 3): bench.py, with ~1.2 GiB models, a real wcached on a
#    temporary socket, warm and cold page cache.
# 3. Scale (issue 13): bench_scale.py, attach and wc_open_file at 200,000
#    tensors and 163 shards (mklayout layouts, tiny data), wcached's memory
#    per model and per client; bench_cold.py, fio's best direct read of a
#    ~2 GiB file against cat, dd, vmtouch and wcached's warm-up.
# 4. Derived weights (issue 20): bench_derived.py, 4 and 8 workers each
#    transforming a ~560 MiB model (BF16 -> F32, int8 per channel) by
#    themselves, then through wcache.derived().
# 5. Shared storage (issue 22): bench_poll.py, the cost of polling a model's
#    paths (1 file, 163 shards; local and through tests/tools/remotefs, as
#    root) and a remote rename among 1, 16 and 64 polled models, and (as
#    root, unshare -m) 163 shards on a mount of their own polled with few
#    mounts and with 500 more;
#    bench_stage.py, staging a ~2.2 GB model against warming it in place.
# 6. Files of a served directory (wcache/_shards.py): bench_shards.py,
#    safe_open of each of 163 shards by its own path, the directory served,
#    against each shard served as a model of its own and an unserved one.
# Models are cached in BUILD/bench-models and reused. Figures and targets
# are printed with PASS/MISS; a missed target never makes this script fail
# (only a broken setup does). Takes about 4 minutes on a 2-core machine,
# plus about 25 for the derived-weights part (README, "Performance").
set -eu

case ${1:-} in
-h | --help)
	sed -n '2,/^set -eu/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
	exit 0
	;;
-*)
	echo "run.sh: unknown option $1 (usage: run.sh [BUILD], default build)" >&2
	exit 2
	;;
esac
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
bin=$build/bin
models=$build/bench-models
for b in mkmodel mklayout wcachectl wcached bench_header bench_load bench_attach; do
	if [ ! -x "$bin/$b" ]; then
		echo "run.sh: $bin/$b is missing: build first (make build)" >&2
		exit 1
	fi
done
mkdir -p "$models"
start=$(date +%s)

# Header-only models: real tensor names and BF16 2-D shapes, tiny data.
header_model() { # NAME LAYERS
	f=$models/$1.safetensors
	if [ ! -s "$f" ] || ! "$bin/wcachectl" inspect "$f" >/dev/null 2>&1; then
		"$bin/mkmodel" --layers "$2" --hidden 8 --ffn 16 --vocab 16 "$f" >/dev/null
	fi
	echo "$f"
}
h1k=$(header_model hdr-1k 111)
h50k=$(header_model hdr-50k 5555)

echo "== wcache benchmarks ($(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -r), $(nproc) CPUs," \
	"load average $(cut -d' ' -f1-3 /proc/loadavg)) =="
echo
"$bin/bench_header" "$h1k" "$h50k"

/usr/bin/python3 "$here/bench_scale.py" --build "$build" --models "$models"
/usr/bin/python3 "$here/bench_cold.py" --build "$build" --models "$models"
/usr/bin/python3 "$here/bench.py" --build "$build" --models "$models"
echo
/usr/bin/python3 "$here/bench_swap.py" --build "$build" --models "$models"
echo
/usr/bin/python3 "$here/bench_neighbours.py" --build "$build"
echo
/usr/bin/python3 "$here/bench_restart.py" --build "$build"
echo
PYTHONPATH="$here/../../client/python" WCACHE_LIB="$build/lib/libwcache.so.0" \
	/usr/bin/python3 "$here/bench_python.py" --build "$build" --dir "$models"
echo
/usr/bin/python3 "$here/bench_derived.py" --build "$build" --models "$models"
echo
/usr/bin/python3 "$here/bench_poll.py" --build "$build" --models "$models"
echo
/usr/bin/python3 "$here/bench_stage.py" --build "$build"
echo
PYTHONPATH="$here/../../client/python" WCACHE_LIB="$build/lib/libwcache.so.0" \
	/usr/bin/python3 "$here/bench_shards.py" --build "$build"
echo
echo "== bench done in $(( $(date +%s) - start )) s =="
