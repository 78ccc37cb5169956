/*
 * mountrule.h: wcached's rule for mounts inside a model's tree, and for
 * the names a directory model's files are found by (README, "Models in
 * directories others may write in"; review rev202 H1).
 *
 * A neighbour who may add entries to a model's directory (a 1777 drop
 * directory, a 2775 team directory) may mount a FUSE server on a file or
 * directory of his own there (allow_other, where /etc/fuse.conf has
 * user_allow_other), and such a server may never answer an open: the
 * thread that opens the file waits for good, and a work thread of the
 * local share with it. So wcached opens a model's files with
 * RESOLVE_NO_XDEV, and one that crosses a mount only where the mount's
 * device, told by statx(2) with AT_STATX_DONT_SYNC (no server asked) and
 * the mount table, is a local filesystem (a shard bind-mounted from
 * another disk, a Kubernetes subPath mount, loads); a directory model's
 * files are found only among names with no remote mount on them.
 */
#ifndef WC_MOUNTRULE_H
#define WC_MOUNTRULE_H

/* Sets tree.h's tree_mounts and shards.h's shards_name_rule to wcached's
 * rule. Once, at start. */
void mountrule_install(void);

#endif
