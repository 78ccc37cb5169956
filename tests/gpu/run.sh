#!/usr/bin/env bash
# tests/gpu/run.sh: wcache into cuda:0, side by side with the alternatives, in one run.
#
#   tests/gpu/run.sh [--cpu] [--build DIR] [--gib N] [--work DIR] [--keep]
#
# Uses a prebuilt tree whose wcached starts here (--build DIR; else build/;
# else .gpu-carry/, which `make gpu-carry` makes with the shared libraries
# wcached loads, for a GPU host that lacks them), or builds one (cmake, where
# a compiler and the libraries exist); without one, the steps that need no
# wcache still run and the others are failed steps naming the reason. Makes
# a model of at least --gib GiB (default 8) in the page
# cache, and prints GB/s into cuda:0 for: pinned anonymous memory (the
# limit: the largest power of two of the model's size, as torch would pin
# the next one up; with the PCIe link read while it copies),
# safetensors.torch.load_file(device=), torch.load(mmap=True) then
# .to(), wcache's per-tensor path, the new path (each the best of 2 loads
# in one process, with its first, cold load beside it, and its load
# checked, every tensor, against checksums made once from the file);
# then loads a ~1B-parameter Llama with transformers plainly, through
# WCACHE_SAFETENSORS=1 (the package's wcache-safetensors.pth, in a directory
# processed as site-packages are) + wcached, and through wcache.install() +
# wcached with WCACHE_HOST_REGISTER=1, and
# compares the logits and load times; last, 4 processes load the model at
# once through wcached (the step most likely to hang, so it goes last
# among the targets; fewer, at least 2, where 4 copies of the model and a
# context each do not fit the device's free memory, else none: one line
# says why, and the report's row and judge line name what ran). After
# every target, informational rows: the new path
# with staging forced, a get_tensor loop of safe_open on the device
# (upstream's and wcache's: GB/s and ms per tensor), and registration of 8 x 256 MiB of the model's mapping on
# 1 thread against 4 (does the driver pin in parallel?).
# Targets are printed PASS/MISS. The header names the host: kernel, driver
# and PCIe link (current, as idle, and max), whether the device supports
# read-only host registration, the work directory's filesystem, free memory and disk, and the commit and
# C sources a carried tree was made from (MANIFEST) against this tree's,
# with a WARNING where they differ. nvidia-smi (20 s, NVIDIA_SMI_TIMEOUT),
# the CUDA check (the first import of torch: 120 s, then once more for 60 s
# where that timed out) and host-info (60 s) have limits too: a driver that stalls there
# costs the run its measurements, not its report. Where the work
# directory lacks room for the model (2.3x --gib GiB, and 3 GiB for the
# Llama), the check works in /dev/shm, else with a smaller model, and says so.
# With $OUT set, results.jsonl, the 4 processes' rows and each wcached's
# log (its last 4 MiB) are copied there before the work directory goes.
#
# --cpu: the same steps on the CPU with small sizes (host memory stands for
# the device, the copy engine runs on its CPU backend, transformers and
# safetensors are skipped when absent): checks the script, not the link.
#
# Every step runs under `timeout` (STEP_TIMEOUT seconds, default 120; making
# the two models, MAKE_TIMEOUT, default 240), and no step starts or runs past
# RUN_BUDGET seconds from the start (default 420: the run takes under the 8
# minutes issue 23 allows on one H200, and a device call of 480 s, after
# the machine's start, leaves room for a rerun at once if the first run
# dies in its first minutes): a step that would is SKIPPED or cut (the
# informational rows, which come last, before any target's), and the report
# still prints. A step whose process outlives its SIGKILL (stuck in the
# kernel) is ABANDONED, left running, 8 s after its limit. A failed step
# (making the model too) is listed at the end.
# Environment: PYTHON (default python3), STEP_TIMEOUT, MAKE_TIMEOUT,
# RUN_BUDGET, CUDA_CHECK_TIMEOUT, NVIDIA_SMI_TIMEOUT, WCACHE_BUILD (a
# prebuilt tree, as --build), OUT.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
py=${PYTHON:-python3}
step_timeout=${STEP_TIMEOUT:-120}
make_timeout=${MAKE_TIMEOUT:-240} # writing GiBs of model, not a copy into the device
run_budget=${RUN_BUDGET:-420}
smi_timeout=${NVIDIA_SMI_TIMEOUT:-20}
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

# The clock, a builtin that forks nothing (bash 4.2 and later; EPOCHSECONDS
# is bash 5.0's, and bash 4.4, RHEL 8's, would end the run at its first
# step under set -u): now VAR sets VAR to the seconds since the epoch.
now() { printf -v "$1" '%(%s)T' -1; }
now t_start
step() { # step [--limit S] LABEL COMMAND...: runs COMMAND under the step timeout (or S), timed
	local label t0 tick_s rc limit left pid logs tick tails=() cap=$step_timeout
	if [ "$1" = --limit ]; then cap=$2; shift 2; fi
	label=$1
	shift
	now t0
	# What the whole run has left (RUN_BUDGET), so that a hung step
	# leaves the time for the report: the device call's own limit
	# would otherwise kill the run before it printed anything.
	left=$((t_start + run_budget - t0))
	if [ $left -lt 15 ]; then
		echo "== $label: SKIPPED (${left}s left of RUN_BUDGET=${run_budget}s)" >&2
		return 125
	fi
	limit=$((left - 10 < cap ? left - 10 : cap))
	echo "== $label" >&2
	# In the background, watched: after killing its command, timeout
	# waits for it, and a process the kernel cannot kill (a driver call
	# that never returns, in D state) would hold timeout, and the run,
	# past every limit. 8 s after the limit (timeout's KILL comes at 5)
	# the step is left behind, within the 10 s kept for the report.
	# Its output goes to files that tail copies to ours until timeout
	# ends: a process left behind holds those files, not our stdout and
	# stderr, so a reader of ours (run.sh ... | tee) still sees them end.
	logs=$(mktemp -d "${TMPDIR:-/tmp}/wcache-step.XXXXXX") || return 1
	: >"$logs/out"
	: >"$logs/err" # there before tail opens them, whichever starts first
	mkfifo "$logs/tick" || { rm -rf "$logs"; return 1; } # the watch's pause (below), made before the traps
	set +e
	# A background step gets no SIGINT from the terminal, and timeout
	# runs it in a process group of its own: interrupted, we end it (timeout
	# passes the signal on to its group), then exit through cleanup. Set
	# before the step starts: a signal between its start and pid=$! ends
	# it through $!, which is timeout's until the tails start (before, a
	# signal while the tails started left the step running).
	pid=
	trap 'kill -TERM "${pid:-$!}" 2>/dev/null; exit 130' INT
	trap 'kill -TERM "${pid:-$!}" 2>/dev/null; exit 143' TERM
	timeout --kill-after=5 "$limit" "$@" >"$logs/out" 2>"$logs/err" &
	pid=$!
	tail -s 0.1 -n +1 --pid="$pid" -f "$logs/out" &
	tails+=($!)
	tail -s 0.1 -n +1 --pid="$pid" -f "$logs/err" >&2 &
	tails+=($!)
	# The watch runs no command in the foreground (builtins only: the
	# clock from now, the pause a read that times out on a FIFO
	# we hold both ends of): a SIGINT that reaches bash while it waits for
	# a foreground command that then exits normally (a sleep) is taken as
	# handled by that command, and bash drops it, trap and all (1 in about
	# 100 SIGINTs lost so beside 2 busy loops on 2 cores: the step left
	# running, the run going on; the read builtin runs the trap at once).
	exec {tick}<>"$logs/tick"
	while kill -0 "$pid" 2>/dev/null; do
		now tick_s
		if [ $((tick_s - t0)) -ge $((limit + 8)) ]; then
			kill -KILL "$pid" 2>/dev/null
			wait "$pid" 2>/dev/null
			trap - INT TERM
			wait "${tails[@]}"
			exec {tick}<&-
			rm -rf "$logs"
			set -e
			echo "== $label: ABANDONED after $((limit + 8))s: killed, a process of it did not end (left running)" >&2
			return 137
		fi
		read -r -t 0.2 -u "$tick" _
	done
	wait "$pid"
	rc=$?
	trap - INT TERM
	wait "${tails[@]}" # they end once pid has, having copied the rest
	exec {tick}<&-
	rm -rf "$logs"
	set -e
	if [ $rc -ne 0 ]; then
		[ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "== $label: TIMEOUT after ${limit}s" >&2 ||
			echo "== $label: FAILED (exit $rc)" >&2
		return $rc
	fi
	now tick_s
	echo "== $label: $((tick_s - t0)) s" >&2
}

failed=()
try_step() { # as step, but a failure is reported at the end and the run goes on
	local label=$1
	if [ "$1" = --limit ]; then label=$3; fi
	step "$@" || failed+=("$label")
}

# wcached and libwcache: the tree passed in (--build, else $WCACHE_BUILD), else build/,
# else .gpu-carry/ (make gpu-carry: the binaries with the libraries they load, for a host
# without them), else a fresh cmake build. A tree is used only if its wcached starts
# here. Without one (the host's glibc older than the carry needs, say), the steps that
# need no wcache still run, and the others are failed steps naming the reason.
starts() { # starts DIR: DIR has the files, and its wcached and wcachectl start here
	local b f said
	for f in "$1/bin/wcached" "$1/bin/wcachectl" "$1/lib/libwcache.so.0"; do
		[ -e "$f" ] || { why="$f is missing (build with 'make build', or pass --build)"; return 1; }
	done
	for b in wcached wcachectl; do
		if ! said=$(LD_LIBRARY_PATH="$1/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
			timeout -k 2 10 "$1/bin/$b" --version 2>&1); then
			why="$1/bin/$b does not start here: $(echo "$said" | head -1) (carry what"
			why+=" 'make gpu-carry' makes, .gpu-carry/, and pass --build .gpu-carry)"
			return 1
		fi
	done
}
why="" have_wcache=1
if [ -z "$build" ] && [ -n "${WCACHE_BUILD:-}" ]; then build=$WCACHE_BUILD; fi
if [ -n "$build" ]; then
	starts "$build" || have_wcache=0
else
	for dir in "$repo/build" "$repo/.gpu-carry"; do
		if [ -e "$dir/bin/wcached" ] && starts "$dir"; then build=$dir; break; fi
	done
	if [ -z "$build" ]; then
		if command -v cmake >/dev/null && command -v cc >/dev/null; then
			build=$repo/build-gpu
			if ! step "build (cmake)" bash -c "cmake -S '$repo' -B '$build' -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build '$build' -j\$(nproc) >/dev/null"; then
				why="cannot build here${why:+; $why}"
				have_wcache=0
			elif ! starts "$build"; then
				have_wcache=0
			fi
		else
			why="no tree to use (--build DIR, .gpu-carry/ or build/) and no cmake/cc to build one${why:+; $why}"
			have_wcache=0 build=""
		fi
	fi
fi
if [ -n "$build" ] && [ -d "$build" ]; then
	build=$(cd "$build" && pwd) # the same paths for every step, whatever its directory
	export WCACHE_BUILD=$build WCACHE_LIB=$build/lib/libwcache.so.0
fi
export PYTHONPATH=$repo/client/python${PYTHONPATH:+:$PYTHONPATH}
# Nothing here may reach the Hub: from_pretrained of a local directory
# should not, but a probe that does would wait on huggingface_hub's
# timeouts, with retries, where packets are dropped rather than refused.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
# Not LD_LIBRARY_PATH: the tree's lib/ is for wcached alone (gpubench's
# daemon start puts it there); Python loads libwcache by WCACHE_LIB.
if [ "$have_wcache" = 0 ]; then
	echo "run.sh: no wcache here: $why; the steps that need wcache fail, the others run" >&2
fi
wcache_step() { # as try_step, for a step that needs wcache: failed at once without it
	local label=$1
	if [ "$1" = --limit ]; then label=$3; fi
	if [ "$have_wcache" = 0 ]; then
		echo "== $label: FAILED (needs wcache, which does not start here)" >&2
		failed+=("$label (needs wcache)")
		return 0
	fi
	try_step "$@"
}

importable() { # importable MODULE: false only where Python says it cannot import it
	# Within 60 s and what the budget leaves; out of time (a stalled
	# import, no time left) it says true, and the steps that need the
	# module say what became of them (TIMEOUT, SKIPPED).
	local rc left=$((t_start + run_budget - $(date +%s) - 10))
	[ $left -le 60 ] || left=60
	[ $left -ge 1 ] || return 0
	timeout -k 2 "$left" "$py" -c "import $1" >/dev/null 2>&1 && return 0
	rc=$?
	[ $rc -eq 124 ] || [ $rc -eq 137 ] || return $rc
}

gb=("$py" "$here/gpubench.py")
bench() { "${gb[@]}" "$@"; }

# Where to work, and how big a model: room for it (and its torch.save copy:
# 2.3x --gib GiB) and the Llama's shards (3 GiB) in the work directory, else
# in /dev/shm, else a smaller model (gpubench.py room says what it did).
made_work=0
if [ -z "$work" ]; then work=$(mktemp -d /tmp/wcache-gpu.XXXXXX); made_work=1; fi
mkdir -p "$work"
llama_gib=3 min_gib=0.25
[ "$cpu" = 1 ] && llama_gib=0.05 min_gib=0.005
if room=$(timeout -k 5 60 "${gb[@]}" room --work "$work" --gib "$gib" --llama-gib "$llama_gib" --min-gib "$min_gib"); then
	old_work=$work
	eval "$room"
	if [ "$work" != "$old_work" ] && [ "$made_work" = 1 ]; then rmdir "$old_work" || true; fi
else
	echo "== room: could not be judged; going on in $work with $gib GiB" >&2
fi
mkdir -p "$work/model" "$work/daemon" "$work/llama" "$work/llama-daemon"
results=$work/results.jsonl
: >"$results"
save_results() { # into $OUT, which comes back: at most 4 files, each at most 4 MiB
	local d
	[ -n "${OUT:-}" ] && [ -d "$OUT" ] || return 0
	[ -s "$results" ] && tail -c 4M "$results" >"$OUT/results.jsonl"
	[ -s "$results.concurrent" ] && tail -c 4M "$results.concurrent" >"$OUT/results-concurrent.jsonl"
	for d in daemon llama-daemon; do
		[ -s "$work/$d/wcached.log" ] && tail -c 4M "$work/$d/wcached.log" >"$OUT/wcached-$d.log"
	done
	return 0
}
cleanup() {
	bench daemon stop --dir "$work/daemon" 2>/dev/null || true
	bench daemon stop --dir "$work/llama-daemon" 2>/dev/null || true
	save_results || echo "run.sh: copying the results to \$OUT failed" >&2
	if [ "$keep" = 0 ]; then rm -rf "$work"; else echo "kept $work" >&2; fi
}
trap cleanup EXIT

echo "wcache device check: $(date -u +%FT%TZ), $(uname -n), mode $([ "$cpu" = 1 ] && echo cpu || echo cuda), model ${gib} GiB, build ${build:-none}" >&2
# glibc: what the carry's binaries and libwcache.so.0 need (MANIFEST says
# which, below); bash: the script's own (bash 4.2 and later).
glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null) && glibc=${glibc#glibc } || glibc=""
memory=$(awk '/^MemTotal:/ { t = $2 } /^MemAvailable:/ { a = $2 } END {
	printf "%.1f GiB available of %.1f", a / 1048576, t / 1048576 }' /proc/meminfo 2>/dev/null)
echo "host: kernel $(uname -r), glibc ${glibc:-unknown}, bash $BASH_VERSION," \
	"$(nproc) CPUs, memory $memory" >&2
# The interpreter every step runs (PYTHON), before the CUDA check, which
# is the first to import torch.
py_path=$(command -v "$py" 2>/dev/null) || py_path="not found"
py_version=$(timeout -k 2 10 "$py" --version 2>&1 | head -1) || py_version="no answer (exit $?)"
echo "python: $py = $py_path: ${py_version:-no answer}" >&2
echo "work directory $work: $(stat -f -c %T "$work" 2>/dev/null || echo unknown), $(df -Pk "$work" 2>/dev/null | awk 'NR == 2 { printf "%.1f GiB free", $4 / 1048576 }')" >&2
# What the tree was built from (a carry's MANIFEST says), against this tree:
# a carry made from other sources may not match the Python that loads it.
tree_commit=$(git -C "$repo" describe --always --dirty 2>/dev/null) || tree_commit="unknown (no git here)"
tree_sources=$(sh "$repo/scripts/gpu-carry.sh" --sources 2>/dev/null) || tree_sources=unknown
if [ -n "$build" ] && [ -f "$build/MANIFEST" ]; then
	built_commit=$(sed -n 's/^# commit //p' "$build/MANIFEST")
	built_sources=$(sed -n 's/^# sources //p' "$build/MANIFEST")
	echo "commit: carry ${built_commit:-unknown}, tree $tree_commit; C sources: carry ${built_sources:-unknown}, tree $tree_sources" >&2
	if [ -n "$built_commit" ] && [ "$tree_commit" = "${tree_commit#unknown}" ] &&
		[ "$built_commit" != "$tree_commit" ]; then
		echo "WARNING: $build was made at commit $built_commit, this tree is $tree_commit" >&2
	fi
	if [ -n "$built_sources" ] && [ "$built_sources" != "$tree_sources" ]; then
		echo "WARNING: $build was made from other C sources than this tree's: make gpu-carry again" >&2
	fi
	# Its wcached and wcachectl and the libwcache.so.0 Python loads all
	# need it: an older glibc fails every step that needs wcache.
	needs=$(sed -n 's/^# needs glibc >= \([0-9][0-9.]*\).*/\1/p' "$build/MANIFEST")
	if [ -n "$needs" ] && [ -n "$glibc" ] &&
		[ "$(printf '%s\n' "$needs" "$glibc" | sort -V | head -1)" != "$needs" ]; then
		echo "WARNING: $build needs glibc >= $needs, this host has $glibc:" \
			"every wcache step will fail" >&2
	fi
else
	echo "commit: tree $tree_commit" >&2
fi
# The first calls into the driver (NVML, a CUDA context) are where a fresh
# machine is likeliest to stall: each has a limit, so the report still prints.
if command -v nvidia-smi >/dev/null 2>&1; then
	# The current link is an idle GPU's, which lowers it to save power
	# (often Gen 1): the max is what the slot and GPU can do, and the
	# pinned row reads the current link again while it copies.
	{ timeout -k 5 "$smi_timeout" nvidia-smi --query-gpu=driver_version,pcie.link.gen.current,pcie.link.width.current,pcie.link.gen.max,pcie.link.width.max --format=csv 2>&1 ||
		echo "failed or timed out (exit $?)"; } | sed 's/^/nvidia-smi: /' >&2
	echo "nvidia-smi: (current = idle, often lower; the pinned row reads it while copying)" >&2
else
	echo "nvidia-smi: not here" >&2
fi
# The check is the run's first import of torch: on a machine just lent,
# the dynamic loader reads GBs of libtorch_cuda and NVIDIA libraries from a
# disk that may be restored lazily from its image, so it gets
# CUDA_CHECK_TIMEOUT (default 120 s); one that times out is tried once
# more, warm then, for at most 60 s (what a stalled driver is given). Only
# an answer says there is no CUDA device: a timeout says it timed out.
have_cuda=1
if [ "$cpu" = 0 ]; then
	cuda_check=${CUDA_CHECK_TIMEOUT:-120}
	check_cuda=("$py" -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"')
	rc=0
	step --limit "$cuda_check" "CUDA device" "${check_cuda[@]}" || rc=$?
	if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
		rc=0
		step --limit $((cuda_check < 60 ? cuda_check : 60)) "CUDA device, again (warm now)" \
			"${check_cuda[@]}" || rc=$?
	fi
	if [ $rc -ne 0 ]; then
		have_cuda=0
		if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
			failed+=("CUDA device (timed out twice)")
			echo "== the CUDA check timed out twice (importing torch, or the driver, stalled): every measurement is skipped" >&2
		elif [ $rc -eq 125 ]; then
			failed+=("CUDA device (no time left)")
			echo "== the CUDA check was skipped for want of time: every measurement is skipped" >&2
		else
			failed+=("CUDA device")
			echo "== no CUDA device: every measurement is skipped" >&2
		fi
	fi
fi
try_step --limit 60 "host info" "${gb[@]}" host-info

model=$work/model/model.safetensors pt=$work/model/model.pt
have_model=0
if [ "$have_cuda" = 0 ]; then
	:
elif [ "$gib" = 0 ]; then
	echo "== no room for a model: its measurements are skipped" >&2
	failed+=("make the model (no room)")
else
	# not fatal: the Llama part and the report go on without it
	try_step --limit "$make_timeout" "make the model" "${gb[@]}" gen --dir "$work/model" --gib "$gib" --pt
	if [ -e "$model" ]; then have_model=1; fi # written under another name, renamed when whole
fi
if [ "$have_model" = 1 ]; then
	try_step "warm the page cache" "${gb[@]}" warm "$model" "$pt"
	# Every tensor's checksums, from the file, once: each timed row's load
	# is checked against them on the device, outside its timing (without
	# them, 3 tensors are compared byte by byte). A few seconds for 8 GiB
	# on 8 threads (an estimate: 1 GiB took 2 s on a loaded 2-core VM).
	try_step --limit 60 "checksums of the model" "${gb[@]}" sums "$model"
	wcache_step "start wcached" "${gb[@]}" daemon start --dir "$work/daemon" --files "$model"
	export WCACHE_SOCKET=$work/daemon/wcached.sock
	try_step "pinned anonymous memory" "${gb[@]}" bench --method pinned --model "$model" --results "$results"
	if importable safetensors.torch; then
		try_step "safetensors.torch.load_file" "${gb[@]}" bench --method upstream --model "$model" --results "$results"
	else
		echo "== safetensors is not installed: skipped" >&2
	fi
	try_step "torch.load(mmap=True) then .to()" "${gb[@]}" bench --method torch_load --model "$model" --pt "$pt" --results "$results"
	rm -f "$pt" # room in the page cache for the next part
	wcache_step "wcache, per-tensor path" "${gb[@]}" bench --method wcache_tensor --model "$model" --results "$results"
	wcache_step "wcache, new path" "${gb[@]}" bench --method wcache --model "$model" --results "$results"
elif [ "$have_cuda" = 1 ]; then
	echo "== no model: its measurements are skipped" >&2
fi

# WCACHE_SAFETENSORS=1 acts through wcache-safetensors.pth, which the
# python3-wcache package installs in dist-packages; a GPU host has no such
# package, so the load through it gets a directory with the tree's .pth that
# gpubench.py adds as site-packages are (--site: site.addsitedir) before
# anything imports safetensors. The WCACHE_HOST_REGISTER=1 load goes through
# wcache.install() instead, so both ways in are run under transformers.
mkdir -p "$work/site"
cp "$repo/client/python/wcache-safetensors.pth" "$work/site/"
if [ "$have_cuda" = 0 ]; then
	:
elif importable transformers; then
	tiny=()
	[ "$cpu" = 1 ] && tiny=(--tiny)
	try_step --limit "$make_timeout" "make a Llama model" "${gb[@]}" llama-make --dir "$work/llama" "${tiny[@]}"
	shards=("$work"/llama/*.safetensors)
	try_step "warm its shards" "${gb[@]}" warm "${shards[@]}"
	wcache_step "start wcached for its shards" "${gb[@]}" daemon start --dir "$work/llama-daemon" --files "${shards[@]}"
	try_step "transformers, plain" "${gb[@]}" llama-load --dir "$work/llama" --mode plain --out "$work/plain.pt" --results "$results"
	wcache_step "transformers, wcache" env WCACHE_SOCKET="$work/llama-daemon/wcached.sock" WCACHE_SAFETENSORS=1 \
		"$py" "$here/gpubench.py" --site "$work/site" llama-load --dir "$work/llama" --mode wcache --out "$work/wcache.pt" --results "$results"
	wcache_step "transformers, wcache, WCACHE_HOST_REGISTER=1" env -u WCACHE_SAFETENSORS \
		WCACHE_SOCKET="$work/llama-daemon/wcached.sock" WCACHE_HOST_REGISTER=1 \
		"$py" "$here/gpubench.py" llama-load --dir "$work/llama" --mode wcache_hostreg --out "$work/hostreg.pt" --results "$results"
	wcache_step "compare logits" "${gb[@]}" llama-compare "$work/plain.pt" "$work/wcache.pt" --results "$results"
	wcache_step "compare logits, host registration" "${gb[@]}" llama-compare "$work/plain.pt" "$work/hostreg.pt" --tag hostreg --results "$results"
	bench daemon stop --dir "$work/llama-daemon" || true
else
	echo "== transformers is not installed: skipped" >&2
fi

# Last of the targets: 4 processes registering at once is where a driver
# is likeliest to hang (a cudaHostRegister that never returns); its
# timeout then costs no other target's step, only the informational rows
# after it.
if [ "$have_model" = 1 ]; then
	# 4 x the model must fit the device: gpubench checks it against
	# torch.cuda.mem_get_info() (a process of its own, ~5-10 s) and runs
	# the most that fit, at least 2, or skips the step, saying why.
	wcache_step "wcache, 4 processes at once" "${gb[@]}" concurrent --n 4 --model "$model" --dir "$work/daemon" --results "$results"
	# The informational rows (no target) come after every target, so that
	# however long they take (60 s each at most, ~60 s in all at the
	# expected speeds) no target's step is skipped for them. At those
	# speeds the steps before them add up to ~4.5 min (an estimate: no
	# device has run this yet), ~5.5 with them: within RUN_BUDGET's 420 s,
	# which, where the device is slower, cuts them, not the report.
	#
	# The new path with staging forced (the path taken where registration
	# is refused): ~12 s.
	wcache_step --limit 60 "wcache, new path, staging forced" "${gb[@]}" bench --method wcache_staging --model "$model" --results "$results"
	# {k: f.get_tensor(k) for k in f.keys()} of safe_open(device="cuda:0"),
	# as loaders that ask tensor by tensor load; upstream's, then wcache's
	# (one engine copy per tensor over 1 MiB), from the page cache still
	# warm (128 GiB of memory hold the model and the Llama's shards).
	# Each costs a start of Python with torch and CUDA (~10 s) and two
	# loops of the model (8 GiB at 3-20 GB/s: 1-6 s each) and the check:
	# ~15-25 s at the expected speeds.
	if importable safetensors; then
		try_step --limit 60 "get_tensor loop, safetensors" "${gb[@]}" bench --method upstream_get_tensor --model "$model" --results "$results"
	else
		echo "== safetensors is not installed: its get_tensor loop is skipped" >&2
	fi
	wcache_step --limit 60 "get_tensor loop, wcache" "${gb[@]}" bench --method wcache_get_tensor --model "$model" --results "$results"
	# Last, as registering is where a driver may hang: 8 x 256 MiB of
	# the model's mapping registered as the engine registers it (shared
	# views, read-only), on 1 thread, then on 4 (the engine's
	# REGISTER_AHEAD), twice each: does the driver pin in parallel? At
	# ~0.1 s per GB pinned, 2 GiB is ~0.2 s a pass, 1 s for the four,
	# after a start of Python with torch and CUDA (~10 s): ~12 s at the
	# expected speeds. 60 s at most.
	wcache_step --limit 60 "registration, 1 thread vs 4" "${gb[@]}" register-threads --model "$model" --results "$results"
fi
bench daemon stop --dir "$work/daemon" || true

echo
echo "wcache device check, $(date -u +%FT%TZ), $(($(date +%s) - t_start)) s in all"
bench report --results "$results"
if [ ${#failed[@]} -gt 0 ]; then
	printf 'FAILED step: %s\n' "${failed[@]}"
	[ "$have_wcache" = 1 ] || echo "(no wcache: $why)"
	exit 1
fi
