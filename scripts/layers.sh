#!/bin/sh
# layers.sh: fails (exit 1, naming each offending line) when code depends
# against the project's layering (README, "Layout"; daemon/MODULES.md,
# client/MODULES.md). Run from the repository root; `make layers` (and so
# `make lint`) runs it.
#
# 1. Includes by folder: proto/ includes only proto/; client/base/ only
#    proto/ and base/; client/format/ never lib/ or ctl/; client/lib/ never
#    ctl/; the daemon never client/lib/ or client/ctl/.
# 2. Calls inside the daemon: a lower module never calls a function of a
#    higher one by its prefix (lower modules report upward through hooks).
bad=0

# report LABEL OUTPUT: prints OUTPUT under LABEL and marks the run failed.
report() {
	if [ -n "$2" ]; then
		echo "layers: $1:"
		echo "$2"
		bad=1
	fi
}

inc() { # FILES... : the folder-qualified includes of the files
	grep -Hn '#include "[a-z]*/' "$@" 2>/dev/null
}
report "proto/ includes another folder" "$(inc proto/*.[ch] | grep -v '"proto/')"
report "client/base/ includes above it" "$(inc client/base/*.[ch] | grep -E '"(format|lib|ctl|client)/')"
report "client/format/ includes lib/ or ctl/" "$(inc client/format/*.[ch] | grep -E '"(lib|ctl|client)/')"
report "client/lib/ includes ctl/" "$(inc client/lib/*.[ch] | grep -E '"(ctl|client)/')"
report "daemon/ includes libwcache or wcachectl" "$(inc daemon/*.[ch] | grep -E '"(lib|ctl|client)/')"

# calls FILES PREFIXES: calls (not comments) of PREFIX*( in FILES.
calls() {
	(cd daemon && grep -nHE "\\b($2)[a-z_0-9]*\\(" $1 | grep -vE ':[0-9]+:\s*(\*|/\*|//)')
}
above="srv_|server_|request_|ctl_|control_|metrics_|watch_"
report "a lower daemon module calls a higher one" "$(
	calls "log.c resident.c index_check.c warm.c pages.c access.c statuspage.c fdstore.c
		fdstore_check.c fdstore_name.c notify.c listen.c peercred.c uidtally.c memlimit.c
		nss.c diracl.c fstype.c mountrule.c stage.c stage_dir.c workq.c config.c config_value.c" \
		"gen_|generation_|registry_|derive_|restore_|$above"
	calls "generation.c" "registry_|derive_|restore_|$above"
	calls "registry.c registry_load.c registry_links.c registry_sweep.c registry_budget.c" "derive_|restore_|$above"
	calls "derive.c" "restore_|$above"
	calls "restore.c restore_adopt.c restore_check.c restore_job.c restore_layout.c
		restore_store.c" \
		"$above"
	calls "server.c server_requests.c server_budget.c watch.c watch_poll.c metrics.c" "ctl_|control_")"
exit $bad
