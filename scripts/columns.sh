#!/bin/sh
# columns.sh: lists every line of the tracked C sources and headers (`*.c`,
# `*.h`, as git ls-files names them) wider than 100 columns with tabs
# expanded to 8 (expand -t8), as "path:line: N columns", and exits 1 if there
# is any, 0 otherwise (2 outside a git checkout).
#
# Why: the project's style is 100 columns, indented with tabs (STYLE.md,
# "Formatting"). clang-format would wrap with spaces, so long lines are
# wrapped by hand, and this check keeps them wrapped. `make columns` (and so
# `make lint`) runs it; it works from any directory of the checkout.
max=100

top=$(git -C "$(dirname "$0")" rev-parse --show-toplevel) || {
	echo "columns: not in a git checkout" >&2
	exit 2
}
cd "$top" || exit 2

long=$(git ls-files -- '*.c' '*.h' | while IFS= read -r file; do
	expand -t8 -- "$file" | awk -v file="$file" -v max="$max" \
		'length($0) > max { printf "%s:%d: %d columns\n", file, NR, length($0) }'
done)
[ -z "$long" ] && exit 0
printf '%s\n' "$long"
echo "columns: lines wider than $max columns (tabs 8 wide):" \
	"$(printf '%s\n' "$long" | grep -c .)" >&2
exit 1
