#!/usr/bin/env bash
# tests/gpu/run.sh: wcache into cuda:0, side by side with the alternatives, in one run.
#
#   tests/gpu/run.sh [--cpu] [--build DIR] [--gib N] [--work DIR] [--keep]
#
# Uses a prebuilt tree whose wcached starts here (--build DIR; else build/;
# else .gpu-carry/, which `make gpu-carry` makes with the shared libraries
# wcached loads, for a GPU host that lacks them), or builds one (cmake, where
# a compiler and the libraries exist); makes a model of --gib GiB (default 8) in the page
# cache, and prints GB/s into cuda:0 for: pinned anonymous memory (the
# limit), safetensors.torch.load_file(device=), torch.load(mmap=True) then
# .to(), wcache's per-tensor path, the new path (and with staging forced),
# and 4 processes at once through wcached; then loads a ~1B-parameter Llama
# with transformers plainly, through wcache.install() + wcached, and the
# same with WCACHE_HOST_REGISTER=1, and compares the logits and load times.
# Targets are printed PASS/MISS.
#
# --cpu: the same steps on the CPU with small sizes (host memory stands for
# the device, the copy engine runs on its CPU backend, transformers and
# safetensors are skipped when absent): checks the script, not the link.
#
# Every step runs under `timeout` (STEP_TIMEOUT seconds, default 240), and
# no step starts or runs past RUN_BUDGET seconds from the start (default 480,
# the 8 minutes it is meant to take on one H200): a step that would is
# SKIPPED or cut, and the report still prints.
# Environment: PYTHON (default python3), STEP_TIMEOUT, RUN_BUDGET, WCACHE_BUILD
# (a prebuilt tree, as --build).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
py=${PYTHON:-python3}
step_timeout=${STEP_TIMEOUT:-240}
run_budget=${RUN_BUDGET:-480}
cpu=0 gib=8 build="" work="" keep=0
while [ $# -gt 0 ]; do
	case "$1" in
	--cpu | --dry-run) cpu=1 ;;
	--build) build=$2; shift ;;
	--gib) gib=$2; shift ;;
	--work) work=$2; shift ;;
	--keep) keep=1 ;;
	-h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
	*) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
	shift
done
if [ "$cpu" = 1 ] && [ "$gib" = 8 ]; then gib=0.0625; fi
export GPUBENCH_CPU=$cpu

t_start=$(date +%s)
step() { # step LABEL COMMAND...: runs COMMAND under the step timeout, timed
	local label=$1 t0 rc limit left
	shift
	t0=$(date +%s)
	# What the whole run has left (RUN_BUDGET), so that a hung step
	# leaves the time for the report: the device call's own limit
	# would otherwise kill the run before it printed anything.
	left=$((t_start + run_budget - t0))
	if [ $left -lt 15 ]; then
		echo "== $label: SKIPPED (${left}s left of RUN_BUDGET=${run_budget}s)" >&2
		return 125
	fi
	limit=$((left - 10 < step_timeout ? left - 10 : step_timeout))
	echo "== $label" >&2
	set +e
	timeout --kill-after=5 "$limit" "$@"
	rc=$?
	set -e
	if [ $rc -ne 0 ]; then
		[ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "== $label: TIMEOUT after ${limit}s" >&2 ||
			echo "== $label: FAILED (exit $rc)" >&2
		return $rc
	fi
	echo "== $label: $(($(date +%s) - t0)) s" >&2
}

failed=()
try_step() { # as step, but a failure is reported at the end and the run goes on
	step "$@" || failed+=("$1")
}

# wcached and libwcache: the tree passed in (--build, else $WCACHE_BUILD), else build/,
# else .gpu-carry/ (make gpu-carry: the binaries with the libraries they load, for a host
# without them), else a fresh cmake build. A tree is used only if its wcached starts
# here: one whose libraries this host lacks is named with the reason.
starts() { # starts DIR: DIR has the files, and its wcached and wcachectl start here
	local b f said
	for f in "$1/bin/wcached" "$1/bin/wcachectl" "$1/lib/libwcache.so.0"; do
		[ -e "$f" ] || { why="$f is missing (build with 'make build', or pass --build)"; return 1; }
	done
	for b in wcached wcachectl; do
		if ! said=$(LD_LIBRARY_PATH="$1/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
			"$1/bin/$b" --version 2>&1); then
			why="$1/bin/$b does not start here: $(echo "$said" | head -1) (carry what"
			why+=" 'make gpu-carry' makes, .gpu-carry/, and pass --build .gpu-carry)"
			return 1
		fi
	done
}
why=""
if [ -z "$build" ] && [ -n "${WCACHE_BUILD:-}" ]; then build=$WCACHE_BUILD; fi
if [ -n "$build" ]; then
	starts "$build" || { echo "run.sh: $why" >&2; exit 2; }
else
	for dir in "$repo/build" "$repo/.gpu-carry"; do
		if [ -e "$dir/bin/wcached" ] && starts "$dir"; then build=$dir; break; fi
	done
fi
if [ -z "$build" ]; then
	if command -v cmake >/dev/null && command -v cc >/dev/null; then
		build=$repo/build-gpu
		step "build (cmake)" bash -c "cmake -S '$repo' -B '$build' -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build '$build' -j\$(nproc) >/dev/null" ||
			{ echo "run.sh: cannot build here${why:+; $why}" >&2; exit 2; }
		starts "$build" || { echo "run.sh: $why" >&2; exit 2; }
	else
		echo "run.sh: no tree to use (--build DIR, .gpu-carry/ or build/) and no cmake/cc to build one${why:+; $why}" >&2
		exit 2
	fi
fi
build=$(cd "$build" && pwd) # the same paths for every step, whatever its directory
export WCACHE_BUILD=$build WCACHE_LIB=$build/lib/libwcache.so.0
export PYTHONPATH=$repo/client/python${PYTHONPATH:+:$PYTHONPATH}
# Not LD_LIBRARY_PATH: the tree's lib/ is for wcached alone (gpubench's
# daemon start puts it there); Python loads libwcache by WCACHE_LIB.

if [ -z "$work" ]; then work=$(mktemp -d /tmp/wcache-gpu.XXXXXX); fi
mkdir -p "$work/model" "$work/daemon" "$work/llama" "$work/llama-daemon"
results=$work/results.jsonl
: >"$results"
gb=("$py" "$here/gpubench.py")
bench() { "${gb[@]}" "$@"; }
cleanup() {
	bench daemon stop --dir "$work/daemon" 2>/dev/null || true
	bench daemon stop --dir "$work/llama-daemon" 2>/dev/null || true
	if [ "$keep" = 0 ]; then rm -rf "$work"; else echo "kept $work" >&2; fi
}
trap cleanup EXIT

echo "wcache device check: $(date -u +%FT%TZ), $(uname -n), mode $([ "$cpu" = 1 ] && echo cpu || echo cuda), model ${gib} GiB, build $build" >&2
"$py" -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available() and torch.cuda.get_device_name(0))' >&2
if [ "$cpu" = 0 ]; then
	"$py" -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"'
fi

model=$work/model/model.safetensors pt=$work/model/model.pt
step "make the model" "${gb[@]}" gen --dir "$work/model" --gib "$gib" --pt
step "warm the page cache" "${gb[@]}" warm "$model" "$pt"
step "start wcached" "${gb[@]}" daemon start --dir "$work/daemon" --files "$model"
export WCACHE_SOCKET=$work/daemon/wcached.sock

try_step "pinned anonymous memory" "${gb[@]}" bench --method pinned --model "$model" --results "$results"
if "$py" -c 'import safetensors.torch' 2>/dev/null; then
	try_step "safetensors.torch.load_file" "${gb[@]}" bench --method upstream --model "$model" --results "$results"
else
	echo "== safetensors is not installed: skipped" >&2
fi
try_step "torch.load(mmap=True) then .to()" "${gb[@]}" bench --method torch_load --model "$model" --pt "$pt" --results "$results"
try_step "wcache, per-tensor path" "${gb[@]}" bench --method wcache_tensor --model "$model" --results "$results"
try_step "wcache, new path" "${gb[@]}" bench --method wcache --model "$model" --results "$results"
try_step "wcache, new path, staging forced" "${gb[@]}" bench --method wcache_staging --model "$model" --results "$results"
try_step "wcache, 4 processes at once" "${gb[@]}" concurrent --n 4 --model "$model" --dir "$work/daemon" --results "$results"
bench daemon stop --dir "$work/daemon" || true
rm -f "$pt" # page cache for the next part

if "$py" -c 'import transformers' 2>/dev/null; then
	tiny=()
	[ "$cpu" = 1 ] && tiny=(--tiny)
	try_step "make a Llama model" "${gb[@]}" llama-make --dir "$work/llama" "${tiny[@]}"
	shards=("$work"/llama/*.safetensors)
	try_step "warm its shards" "${gb[@]}" warm "${shards[@]}"
	try_step "start wcached for its shards" "${gb[@]}" daemon start --dir "$work/llama-daemon" --files "${shards[@]}"
	try_step "transformers, plain" "${gb[@]}" llama-load --dir "$work/llama" --mode plain --out "$work/plain.pt" --results "$results"
	try_step "transformers, wcache" env WCACHE_SOCKET="$work/llama-daemon/wcached.sock" WCACHE_SAFETENSORS=1 \
		"$py" "$here/gpubench.py" llama-load --dir "$work/llama" --mode wcache --out "$work/wcache.pt" --results "$results"
	try_step "transformers, wcache, WCACHE_HOST_REGISTER=1" env WCACHE_SOCKET="$work/llama-daemon/wcached.sock" \
		WCACHE_SAFETENSORS=1 WCACHE_HOST_REGISTER=1 \
		"$py" "$here/gpubench.py" llama-load --dir "$work/llama" --mode wcache_hostreg --out "$work/hostreg.pt" --results "$results"
	try_step "compare logits" "${gb[@]}" llama-compare "$work/plain.pt" "$work/wcache.pt" --results "$results"
	try_step "compare logits, host registration" "${gb[@]}" llama-compare "$work/plain.pt" "$work/hostreg.pt" --tag hostreg --results "$results"
else
	echo "== transformers is not installed: skipped" >&2
fi

echo
echo "wcache device check, $(date -u +%FT%TZ), $(($(date +%s) - t_start)) s in all"
bench report --results "$results"
if [ ${#failed[@]} -gt 0 ]; then
	printf 'FAILED step: %s\n' "${failed[@]}"
	exit 1
fi
