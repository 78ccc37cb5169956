/*
 * registry_load.c: the registry's load pipeline (registry.h, registry_load
 * and registry_reload). Loading a model opens and validates its files with
 * the client library's readers and copies the compiled index into a sealed
 * memfd (the one thing every worker maps to find tensors without parsing),
 * on libuv's work queue. Back on the loop the generation is made (gen_new)
 * and installed: pinned as its model asks, handed to the warm pool, and
 * made current at once (a first generation) or when warm (a replacement).
 * What happens to a generation after that is generation.c's.
 *
 * A model that stages (stage.h: stage = yes, or auto on a network or FUSE
 * filesystem) takes one more trip through the work queue between the two:
 * once the source is validated, the loop decides (the model's stage key is
 * set only after registry_load() returns), and the copy is made, checked,
 * opened and validated as the model, off the loop; the generation then
 * serves the copy, with its origin (the files it was copied from) noted.
 * A staging queued while the start-up sweep of stage_dir runs waits for it
 * (registry_sweep.c).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/openat2.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "base/error.h"
#include "base/file.h"
#include "base/path.h"
#include "closer.h"
#include "diracl.h"
#include "format/shards.h"
#include "format/tree.h"
#include "log.h"
#include "mountrule.h"
#include "nss.h"
#include "pages.h"
#include "proto/memfds.h"
#include "registry_internal.h"
#include "stage.h"

/* The end of each line of a watched reload the model-tree rules refuse
 * (same_tree), its "%s" the model's name: only the operator's word serves
 * those files, never a config reload's retry of failed models (reload.c's
 * retry_failed, review rev195 M1). */
#define OPERATORS_WORD \
	"the operator's `wcachectl reload %s` (a config reload that leaves the model's " \
	"section unchanged does not load it)"

struct load_request {
	struct workq_job job;
	struct registry *r;
	char *name;
	char *path;
	enum pin_mode pin;
	uint64_t pin_seq;     /* the model's pin_seq when queued */
	int warm;
	enum reload_kind reload; /* discard when the files are unchanged */
	/* A watched reload (RELOAD_WATCHED): the tree root its model's
	 * newest generation recorded (generation.h's tree_root) and its
	 * owner, in which (or in a sibling of the same owner) the files must
	 * be; or, for a generation that has no root recorded (a warm
	 * restart's), the real path it resolved, whose root load_work finds;
	 * or, for a model whose newest generation records neither (it has
	 * none), the tree its operator's last load found (model_entry's
	 * operator_tree), and the place its path named when that load found
	 * nothing there (keep_place, operator_tree's place). All NULL for an
	 * operator's load or reload, which resolves anew, and for a watched
	 * one when nothing is known: that one is refused (same_tree). */
	char *keep_root;
	char *keep_resolved;
	char *keep_place;
	/* keep_root's device and inode as recorded (generation.h's
	 * tree_ino_known; keep_root_known, below, 0: not told). */
	dev_t keep_root_dev;
	ino_t keep_root_ino;
	uid_t keep_uid;
	/* keep_place's directory that existed (operator_tree's place_mode
	 * and place_dir_len): its mode and the length of its path. */
	mode_t keep_place_mode;
	size_t keep_place_dir_len;
	/* A watched reload of a model whose newest generation is one file:
	 * that file's owner (its fstat as opened, or its origin's for a
	 * staged copy), whom the new file must have (same_tree). */
	int keep_file_known;
	uid_t keep_file_uid;
	/* Whether keep_root's inode, and root's, are known (root_known:
	 * gen_found_tree's root_known). */
	int keep_root_known;
	int root_known;
	/* Any load of a model with a generation: the real path its newest
	 * generation's path resolved to when that is one file or a shard
	 * index (NULL: none, or not known), and that file's owner: a model
	 * straight in a shared directory is that owner's (linked_in). */
	char *named_path;
	uid_t named_uid;
	/* Its newest generation's path resolved to a file straight in its
	 * tree (a one-file model or an index, whose tree is the directory
	 * holding it): no directory beside that one is a sibling of it, only
	 * a file in a sibling reached the same way (review rev191 F1). */
	int keep_named_file;
	/* A watched reload of a model that has a generation: the owners of
	 * its newest generation's files (as opened; a staged copy's, its
	 * origin's), nkeep_owners of them (0: none known). Each new file has
	 * one of them or the tree's owner (same_owners). */
	uid_t *keep_owners;
	size_t nkeep_owners;
	/* Any load of a model with a generation: that generation's files (as
	 * opened; a staged copy's, its origin's; its shard index where known,
	 * named_owner), by device and inode, nkeep_files of them: where the
	 * directory holding the files is one others may rename entries in,
	 * wcached's own reloads take no other (files_kept, review rev201 H2).
	 * ctime_known: a restart's kept files (keep_restart_files), which
	 * nothing held while wcached was down: a file of that device and
	 * inode is theirs only with their ctime (a freed inode number is
	 * given to the next file made, review rev217 L1); so too a live
	 * staged generation's origins and a shard index (keep_tree), which
	 * nothing holds (rev219 H2), and the files of a generation on a
	 * remote filesystem, whose server frees a file another host removes
	 * whoever holds it here (rev222 M1); only files a generation serves
	 * where they lie on a local filesystem are held by it. */
	struct file_id {
		dev_t dev;
		ino_t ino;
		int64_t ctime_ns;
		int ctime_known;
	} *keep_files;
	size_t nkeep_files;
	/* A watched reload: the links the path of its model's newest
	 * generation went through (generation.h's links), nkeep_links of
	 * them; one met unchanged is followed whoever made it (check_links,
	 * review rev195 L1). */
	struct gen_link *keep_links;
	size_t nkeep_links;
	/* An operator's load or reload: the tree it found, for
	 * model_entry's operator_tree (find_operator_tree). */
	uid_t found_uid;
	int found_taken;
	char *found_root;
	char *found_place;
	mode_t found_place_mode;
	size_t found_place_dir_len;
	uint64_t id;
	uint64_t entry_id;    /* the model entry it was queued for */
	struct model_source source;
	/* Each of source's files' access ACL (diracl_file_acl), read from its
	 * descriptor the first time a rule needs it (file_acl) and kept for
	 * the rest of the load: kind 0 (DIRACL_NONE) with len 1 once read, len
	 * 0 not asked yet. NULL until asked, then nfiles_acl of them (the
	 * source's nfiles then: gen_new takes the source); freed with the
	 * files (drop_opened, files_acl_free). */
	struct diracl_value *files_acl;
	size_t nfiles_acl;
	/* The shard index's ACL (model_source's index_acl_value), as file_acl
	 * gives it: its value borrowed from q->source, never freed here. */
	struct diracl_value index_acl;
	int *served_fds;      /* gen_open_served(), one per file */
	int index_fd;
	/* A watched reload of a model that nothing serves, judged against
	 * the tree a warm restart recorded for the generation it stored,
	 * whose files' owners the restart could not tell, or the tree an
	 * operator's failed load found (model_entry's operator_tree
	 * owners_untold, its OWNERS_UNTOLD_ value): taken only where no one
	 * but the owner of the directory holding its files may write in it
	 * (same_tree, reviews rev206 H1, rev209 H1). */
	int owners_untold;
	const uint8_t *index;
	size_t index_size;
	int status;
	char message[ERROR_MAX];
	registry_done_fn done;
	void *arg;
	/* Staging (stage.h): the source's filesystem (the first remote one),
	 * whether the served files are a copy, the copy, and the files it was
	 * copied from (their path and stat at open) for the generation. */
	struct fs_info fs;
	int staged;
	/* A load that failed: where its path is (model_entry.failed_path),
	 * and its filesystem when note_failed_path looked (path_noted). */
	int path_known;
	dev_t path_dev;
	int path_err;
	int path_noted;
	struct stat path_st;
	struct fs_info path_fs;
	/* load_work's verdict on the holes of its files (gen_check_holes),
	 * its message in message: applied by keeps_room. */
	int holes;
	/* Refused for its descriptors (fd_room): loaded again once a
	 * generation closes (model_entry's room_wait), or at once when one
	 * closed while it ran: registry's closes_done was closes_seen as it
	 * was queued (review rev182 F2). */
	int room_refused;
	uint64_t closes_seen;
	/* A reload (any but RELOAD_NONE) asked while m's revalidate named a
	 * generation (model_entry's revalidate): that number; 0: none. */
	uint64_t revalidate;
	/* What path named just before it was opened (staging's failures
	 * compare with it: the path may name a newer file by then). */
	int opened_known;
	struct stat opened_st;
	/* The realpath of path as its files were opened (gen_resolved_path),
	 * or NULL: the generation's resolved_path; its tree root and the
	 * root's owner (gen_tree_root), or NULL: its tree_root. A file named
	 * in a hub snapshot directory (hub_root) has the hub repo for root,
	 * wherever its link points (blobs/). */
	char *resolved;
	char *root;
	/* root's device and inode as found (root_known 0: not told). */
	dev_t root_dev;
	ino_t root_ino;
	uid_t root_uid;
	/* The model directory gen_resolved_path found the files in (its
	 * gen_found_tree's dir_*; files_dir_known 0: not told), its owner and
	 * mode (who may have put the files there), and the links
	 * the walk of the path after the open went through, once it ended at
	 * what was opened (check_links): for the generation's links
	 * (links_known 0: none recorded; -1: a watched reload refused a
	 * link, link_taken). */
	int files_dir_known;
	gid_t files_gid;
	dev_t files_dev;
	ino_t files_ino;
	uid_t files_uid;
	mode_t files_mode;
	struct gen_link *links;
	size_t nlinks;
	int links_known;
	/* A watched reload whose tree same_tree refused (-EXDEV), or any load
	 * with a hard link of another user's file in its tree (linked_in,
	 * -EPERM): 0 or that, with q->message. load_after answers "unchanged"
	 * first when the files are the ones serving, and refuses the rest
	 * (review rev180 F7). */
	int tree_status;
	/* A watched reload (find_writer): 1 + the index of a file it opened
	 * that is open for writing, or 0; and the errno for which that could
	 * not be told of a file, or 0. The file found open for writing (by
	 * find_writer, or by path_writer after a failed validation): a
	 * read-only descriptor of its own on it, or -1, and its real path,
	 * or NULL: model_entry's writer_fd and writer_path (wait_for_writer). */
	size_t writing;
	int writing_err;
	int busy_fd;
	char *busy_path;
	/* The file its model waited for a writer of as it ended (taken from
	 * model_entry's writer_path: take_writer), and since when, or NULL. */
	char *waited;
	uint64_t waited_since_ms;
	/* gen_found_tree's link_unchecked: without openat2, a file was
	 * reached through a link inside the tree (same_tree's line). */
	int link_unchecked;
	struct stage_request stage;
	char *stage_dir;      /* stage.stage_dir, owned */
	uint64_t stage_queued_ms; /* registry_now_ms() when the copy was queued */
	struct gen_origin *origin;
	size_t norigin;
	struct load_request *held_next; /* waiting for the start-up sweep (registry_sweep.c) */
	const char *withdrawn; /* its answer when an unload withdrew it (withdraw_waiting) */
};

/* Copies the compiled index into a sealed memfd and maps it read-only. */
static int
seal_index(struct load_request *q)
{
	int r = gen_seal_index(q->source.index, q->source.index_len, &q->index_fd, &q->index);

	if (r < 0)
		return r;
	q->index_size = q->source.index_len;
	free(q->source.index);
	q->source.index = NULL;
	return 0;
}

/* Opens, validates and compiles the model at path into q (source, served
 * descriptors, sealed index). Work queue thread. */
static int
open_model(struct load_request *q, const char *path)
{
	int err;

	if ((err = source_open(path, &q->source)) == 0 &&
		((err = gen_open_served(&q->source, &q->served_fds)) < 0 ||
			(err = seal_index(q)) < 0)) {
		gen_close_served(q->served_fds, q->source.nfiles);
		q->served_fds = NULL;
		source_close(&q->source);
	}
	return err;
}

static void drop_opened(struct load_request *q);

int
registry_file_in(const char *path, const char *root)
{
	char *dir = path_dir(path);
	int in = dir != NULL && strcmp(dir, root) == 0 && strcmp(path, root) != 0;

	free(dir);
	return in;
}

/* Whether path is root or lies under it (both canonical). */
static int
path_under(const char *path, const char *root)
{
	size_t n = strlen(root);

	return strncmp(path, root, n) == 0 &&
		(path[n] == '\0' || path[n] == '/' || (n > 0 && root[n - 1] == '/'));
}

/*
 * Whether q's tree root is a sibling of the one kept (one directory holds
 * both) owned by the same user: a deployer's swap of her versions by a
 * symbolic link (README, "Updating a model safely"). Another tenant's model
 * lies elsewhere or is another user's (review rev173 F1). Both owners were
 * found when each root was: the old tree may be gone by now (rev175 F8).
 * A one-file model's tree is the directory holding its file, and the
 * directories beside that one are other models (a root-owned team
 * directory's neighbours, private ones too): a path that named a file
 * there and now names a directory beside it is no swap (review rev191
 * F1); a link to a file must stay in its directory (the opener's rule), so
 * a file's sibling tree is reached only by a directory's swap above it
 * (llama/model.safetensors, llama -> v2). The owner is the tree's, not the
 * swap's maker's: a link followed because its maker owns the files serving
 * (not the tree) moves the model only to files of hers (makers_move,
 * review rev216 H1).
 */
static int
sibling_swap(const struct load_request *q)
{
	char *d1 = path_dir(q->keep_root), *d2 = path_dir(q->root);
	int ok = d1 != NULL && d2 != NULL && strcmp(d1, d2) == 0 && q->keep_uid == q->root_uid &&
		(!q->keep_named_file ||
			(q->resolved != NULL && registry_file_in(q->resolved, q->root)));

	free(d1);
	free(d2);
	return ok;
}

/*
 * Work queue thread, for a watched reload: whether the files it opened lie
 * in the tree its model's newest generation resolved (q->keep_root). The
 * last component of a configured path is often not the operator's (the
 * deployer who renames her model's directory over it owns its parent):
 * a symbolic link renamed there to another tenant's model is followed only
 * on an operator's reload. One move is the deployer's own and taken: to a
 * sibling of the old tree (the same directory holds both) with the same
 * owner, README's `ln -s v2 .next && mv -T .next llama` (sibling_swap). A
 * path that resolved to another place while the files were opened
 * (q->resolved NULL) is refused too: its files may be anywhere. A kept
 * root not recorded (a restored generation's) is found from its resolved
 * path here; one that cannot be found is no tree to stay in. A model with
 * no generation keeps the tree its operator's load found, and where that
 * found nothing at its path, the place it named (at_place). A model that
 * is one file takes, besides, only a file of its old file's owner
 * (same_file_owner), a model with a generation only files of its tree's
 * owner or of the files serving (same_owners), and any only a path whose
 * links it may follow, walked again to what was opened (check_links). 0,
 * or -EXDEV with q->message.
 */
static int at_place(const struct load_request *q, int first_comer);
static int owned_by(const struct model_source *src, uid_t uid);

/*
 * Whether q keeps a place (its model has no generation and its operator's
 * load found nothing at its path) whose directory that existed then may be
 * written by others than its owner (group or others write: a 1777 place as
 * /tmp, a shared hub cache, a team's directory): whoever got there first
 * made the model's files, and in a sticky one its rightful owner cannot
 * remove them (review rev187 R5).
 */
static int
open_place(const struct load_request *q)
{
	return q->keep_place != NULL && (q->keep_place_mode & (S_IWGRP | S_IWOTH)) != 0;
}

/* The owner of src's file i, or of its origin (when not NULL). */
static uid_t
owner_of(const struct model_source *src, const struct gen_origin *origin, size_t i)
{
	return origin != NULL ? origin[i].st.st_uid : src->files[i].st.st_uid;
}

/*
 * The owners of src's files, or of their origin (when not NULL), in buf:
 * "uid A" or "uids A, B", each once.
 */
static const char *
owners_said(const struct model_source *src, const struct gen_origin *origin, char *buf,
	size_t len)
{
	char list[256] = "";
	size_t at = 0, listed = 0;

	for (size_t i = 0; i < src->nfiles && at < sizeof(list); i++) {
		size_t k = 0;

		while (k < i && owner_of(src, origin, k) != owner_of(src, origin, i))
			k++;
		if (k == i)
			at += (size_t)snprintf(list + at, sizeof(list) - at, "%s%u",
				listed++ > 0 ? ", " : "", (unsigned)owner_of(src, origin, i));
	}
	snprintf(buf, len, "uid%s %s", listed > 1 ? "s" : "", list);
	return buf;
}

/* Whether others than its owner may write in the directory holding q's
 * files as they were found (a group or others write bit: an ACL's named
 * users show in the group bits). */
static int
others_write(const struct load_request *q)
{
	return q->files_dir_known && (q->files_mode & (S_IWGRP | S_IWOTH)) != 0;
}

/* Whether uid alone may write in the directory holding q's files as they
 * were found: it owns it, and others may not (others_write); not where that
 * is not known. */
static int
only_writer(const struct load_request *q, uid_t uid)
{
	return q->files_dir_known && q->files_uid == uid && !others_write(q);
}

/*
 * Whether a watched reload's one file (a model that is one file) has the
 * owner of the file of the generation it replaces: a model whose file lies
 * directly in a shared directory (1777, or group-writable) has that
 * directory for its tree, whose owner stays the same whoever makes a file
 * at the model's name once its owner's is gone (review rev187 R2b). A file
 * of the tree's owner with no other name is taken too where no one else
 * may write in the directory holding it: only she made it there (the
 * operator's copy over a download user's file in her own directory:
 * review rev191 F3); in a directory others may rename in (a 2775 team
 * directory) any of them could have renamed her file there (review rev195
 * M3), and one with other names may be anyone's link of it where
 * fs.protected_hardlinks=0.
 */
static int
same_file_owner(const struct load_request *q)
{
	const struct stat *st = q->source.nfiles == 1 ? &q->source.files[0].st : NULL;

	return !q->keep_file_known || st == NULL || q->source.format == FORMAT_SHARDED ||
		st->st_uid == q->keep_file_uid ||
		(q->root != NULL && st->st_uid == q->root_uid && st->st_nlink == 1 &&
			only_writer(q, q->root_uid));
}

/* Whether uid owns a file of the generation a watched reload replaces
 * (q->keep_owners). */
static int
kept_owner(const struct load_request *q, uid_t uid)
{
	for (size_t k = 0; k < q->nkeep_owners; k++)
		if (q->keep_owners[k] == uid)
			return 1;
	return 0;
}

/*
 * A file of q's model, the i-th (i == nfiles: its shard index, the file
 * its path named, when sharded; NULL past it): its fstat as opened in *st
 * and how to name it in *name.
 */
static int
file_of(const struct load_request *q, size_t i, const struct stat **st, const char **name)
{
	if (i < q->source.nfiles) {
		*st = &q->source.files[i].st;
		*name = q->source.files[i].path;
		return 1;
	}
	*st = &q->source.index_st;
	*name = q->path;
	return i == q->source.nfiles && q->source.format == FORMAT_SHARDED;
}

/*
 * How a line names the file of q that file_of gave as (st, name): q's
 * shard index, which file_of names by q->path, is found again in the
 * directory a model configured by its directory names (shards_find_model,
 * as its load found it) and named by its own path where that is the very
 * file opened (its device and inode), else "the shard index in DIR": not
 * the directory as "its file" (review rev219 L1). Into buf of len bytes
 * where a name is made. Work queue thread: it lists the directory.
 */
static const char *
file_said(const struct load_request *q, const struct stat *st, const char *name, char *buf,
	size_t len)
{
	const struct stat *ix = &q->source.index_st;
	struct stat found_st;
	char *found = NULL;
	bool is_index = false;

	if (st != ix || !q->opened_known || !S_ISDIR(q->opened_st.st_mode))
		return name;
	if (shards_find_model(q->path, &found, &is_index) == 0 && is_index &&
		stat(found, &found_st) == 0 && found_st.st_dev == ix->st_dev &&
		found_st.st_ino == ix->st_ino)
		snprintf(buf, len, "%s", found);
	else
		snprintf(buf, len, "the shard index in %s", q->path);
	free(found);
	return buf;
}

/*
 * Whether each file of a watched reload (its shard index too) is owned by
 * the owner of the tree it was found in or by an owner of a file of the
 * generation it replaces: the tree rules ask where a file's name is, not
 * whose the inode is, and a file another user renamed (or hard-linked)
 * into the tree was served as its owner's model (review rev187 R3). A
 * file of the tree's owner is taken only where that owner owns a file
 * serving too, or alone may write where the files lie (only_writer): in
 * root's team place (1775) holding a deployer's model, her index renamed
 * over hers could name root's private file beside it (review rev218 H1).
 * A model with no generation has no owners to keep: the place it waits at
 * says which files it takes (at_place). The first file that is neither's
 * in *name and *st.
 */
static int
same_owners(const struct load_request *q, const char **name, const struct stat **st)
{
	int tree_owners = kept_owner(q, q->root_uid) || only_writer(q, q->root_uid);

	for (size_t i = 0; q->nkeep_owners > 0 && file_of(q, i, st, name); i++)
		if (!kept_owner(q, (*st)->st_uid) &&
			((*st)->st_uid != q->root_uid || !tree_owners))
			return 0;
	return 1;
}

/* q->message for the file same_owners refused (name, st). */
static void
same_owners_said(struct load_request *q, const char *name, const struct stat *st)
{
	char named[PATH_MAX];

	name = file_said(q, st, name, named, sizeof(named));
	if (st->st_uid != q->root_uid)
		snprintf(q->message, sizeof(q->message), "its file %s is owned by uid %u, not "
			"by the owner of its tree %s (uid %u) nor of the files serving: another "
			"user's file in the tree is served only after " OPERATORS_WORD, name,
			(unsigned)st->st_uid, q->root, (unsigned)q->root_uid, q->name);
	else
		snprintf(q->message, sizeof(q->message), "its file %s is owned by uid %u, the "
			"owner of its tree %s, who owns none of the files serving, in a directory "
			"others than that owner may write in (or one that could not be told): "
			"another user's model may name a file of the tree's owner beside it, so "
			"it is served only after " OPERATORS_WORD, name, (unsigned)st->st_uid,
			q->root, q->name);
}

/* A uid's groups as the user database tells them (its primary group and
 * getgrouplist(3)), looked up once per load (linked_in): looked 0 until
 * then; none for a uid the database does not know or when it cannot be
 * asked. */
struct owner_groups {
	int looked;
	gid_t *list;
	int n;
};

/* Fills g with uid's groups (struct owner_groups). Work queue thread: the
 * database may be a network's. */
static void
owner_groups_look(uid_t uid, struct owner_groups *g)
{
	int err;
	struct passwd *pw = nss_user_by_uid(uid, &err);

	g->looked = 1;
	if (pw != NULL && nss_groups(pw, &g->list, &g->n) < 0) {
		g->list = NULL;
		g->n = 0;
	}
	free(pw);
}

/*
 * The access ACL of the file of q that file_of numbers i (diracl_file_acl):
 * a model file's read from its descriptor the first time a rule needs it,
 * then kept in q->files_acl for the rest of the load: linked_in and
 * index_owner_reads judge each shard, and each asked it again (an
 * fgetxattr each, up to three a shard). A shard index's is the one
 * shards.c read from the descriptor it read the index through
 * (model_source's index_acl_value). Work queue thread: on a remote
 * filesystem the server answers it.
 */
static const struct diracl_value *
file_acl(struct load_request *q, size_t i)
{
	static const struct diracl_value untold = { .kind = DIRACL_UNTOLD };
	const struct source_acl *ix = &q->source.index_acl_value;
	struct diracl_value *v;

	if (i >= q->source.nfiles) {
		q->index_acl = (struct diracl_value){ .kind = diracl_kind_of(ix->state, ix->nfs4),
			.value = ix->value, .len = ix->len };
		return &q->index_acl;
	}
	if (q->files_acl == NULL) {
		if ((q->files_acl = calloc(q->source.nfiles, sizeof(*q->files_acl))) == NULL)
			return &untold;
		q->nfiles_acl = q->source.nfiles;
	}
	v = &q->files_acl[i];
	if (v->kind == DIRACL_NONE && v->len == 0) {
		diracl_file_acl(q->source.files[i].fd, v);
		if (v->kind == DIRACL_NONE)
			v->len = 1;
	}
	return v;
}

/* Frees q->files_acl, the ACLs file_acl kept. */
static void
files_acl_free(struct load_request *q)
{
	for (size_t i = 0; q->files_acl != NULL && i < q->nfiles_acl; i++)
		diracl_value_free(&q->files_acl[i]);
	free(q->files_acl);
	q->files_acl = NULL;
	q->nfiles_acl = 0;
}

/*
 * Whether uid, not the file's owner, could read the file of q that file_of
 * numbers i by its mode bits, as the kernel asks them: where uid is in the
 * file's group the group's bits decide, else the others' (g: uid's groups,
 * looked up the first time they are asked). A mode whose two classes agree
 * needs no lookup; 0604 (the others may read, its group not: "all but
 * group G") denies every member of G, S_IROTH notwithstanding (review
 * rev197 L1). Where uid's groups cannot be told (no such user in the
 * database), a mode whose classes differ is no read right. Where the file
 * has an access ACL (file_acl), its group bits are the ACL's mask, not its
 * group's right (root's 0600 file with `u:wcached:r` reads 0640: review
 * rev222 H2), and a 0644 file may deny her by name (`u:alice:-`: review
 * rev226 H1): the ACL decides, as the kernel reads it (diracl_may_read),
 * whatever the mode; one that cannot be told is no read right.
 */
static int
owner_may_read(struct load_request *q, size_t i, uid_t uid, struct owner_groups *g)
{
	const struct stat *st;
	const char *name;
	const struct diracl_value *acl;
	int grp, oth;

	(void)file_of(q, i, &st, &name);
	acl = file_acl(q, i);
	grp = (st->st_mode & S_IRGRP) != 0;
	oth = (st->st_mode & S_IROTH) != 0;
	if (acl->kind == DIRACL_NONE && grp == oth)
		return grp && oth;
	if (!g->looked)
		owner_groups_look(uid, g);
	if (g->n == 0)
		return 0; /* getgrouplist always names the primary group */
	return diracl_may_read(acl, st, uid, g->list, g->n);
}

/*
 * Whether every writer of q's shard index (its ACL: model_source's
 * index_acl) but its owner could read q's shard i by its mode, as
 * owner_may_read asks it of one user: where the others may write the
 * index, or a group class that an ACL names (its group bits are the mask),
 * a file every user may read; where only its group may, one every member
 * of its group may read (diracl_all_read: the mode, or the file's ACL where
 * it has one: `g:GROUP:-` on a 0644 file denies GROUP, review rev226 H1).
 * An index no one else may write needs nothing (review rev222 H1).
 */
static int
index_writers_read(struct load_request *q, size_t i)
{
	const struct stat *ix = &q->source.index_st, *f = &q->source.files[i].st;

	if ((ix->st_mode & S_IWOTH) != 0 || ((ix->st_mode & S_IWGRP) != 0 && q->source.index_acl))
		return diracl_all_read(file_acl(q, i), f, (gid_t)-1);
	if ((ix->st_mode & S_IWGRP) != 0)
		return diracl_all_read(file_acl(q, i), f, ix->st_gid);
	return 1;
}

/*
 * linked_in's rule for a sharded model, whoever owns its tree: 0, or
 * -EPERM with q->message when a shard is owned by another user than its
 * shard index's owner, who could not read it by its mode (owner_may_read),
 * or when a shard is one that another writer of the index (its group or
 * the others, by its mode or its ACL's mask) could not read
 * (index_writers_read). The index chooses which files load, and whoever
 * may write it chooses them: its owner (in place, or renamed over in a
 * sticky place): her index in root's slot or team place, naming root's
 * private file beside the model, was served as her model, wcached lending
 * her its read right (review rev219 H1); and where its mode lets them,
 * her group or anyone, in place: alice rewrote bob's (or root's) 0664
 * index to name his private file (review rev222 H1). An index of root's
 * that no one else may write names any file. The groups of the index's
 * owner are looked up once, into *g (the caller frees its list).
 */
static int
index_owner_reads(struct load_request *q, struct owner_groups *g)
{
	const struct stat *ix = &q->source.index_st;
	uid_t iu = ix->st_uid;
	char named[PATH_MAX];

	if (q->source.format != FORMAT_SHARDED)
		return 0;
	for (size_t i = 0; i < q->source.nfiles; i++) {
		const struct wc_file *f = &q->source.files[i];
		const struct stat *st = &f->st;
		int writers = index_writers_read(q, i);
		const char *index;

		if (writers && (iu == 0 || st->st_uid == iu || owner_may_read(q, i, iu, g)))
			continue;
		index = file_said(q, ix, q->path, named, sizeof(named));
		if (!writers)
			snprintf(q->message, sizeof(q->message), "%s (mode %04o, group %u) "
				"is named by the shard index %s (mode %04o%s, group %u), which "
				"users who may not read that file may write: an index names only "
				"files whoever may write it could read, so it is not served; chmod "
				"g-w,o-w the index, or make the file readable to them", f->path,
				(unsigned)(st->st_mode & 07777), (unsigned)st->st_gid, index,
				(unsigned)(ix->st_mode & 07777),
				q->source.index_acl ? ", with an ACL" : "", (unsigned)ix->st_gid);
		else
			snprintf(q->message, sizeof(q->message), "%s is owned by uid %u "
				"(mode %04o, group %u), which uid %u, the owner of its shard index "
				"%s, may not read: an index names only files its owner could read, "
				"so it is not served; make the file readable to uid %u (its mode, "
				"or a group of hers), or give the index to the file's owner",
				f->path, (unsigned)st->st_uid, (unsigned)(st->st_mode & 07777),
				(unsigned)st->st_gid, (unsigned)iu, index, (unsigned)iu);
		return -EPERM;
	}
	return 0;
}

/*
 * Any load: 0, or -EPERM with q->message when a file of the model (its
 * shard index too) is not owned by the model's owner, who could not read
 * it either: others may not read it, and its group may not or the owner
 * is not in it (the user database's groups, asked once per load). Whoever
 * may put a file in a model's tree, by a rename or, where
 * fs.protected_hardlinks is 0, by a hard link of a file she cannot read
 * (any she can reach), was lent wcached's read right to it (review rev187
 * R3, rev195 M2): the number of its names said nothing of whose it is (a
 * file linked in keeps two only until its other name goes). A file anyone
 * may read lends nothing (a tree of hard links of one another, two names
 * of one model, a backup made with cp -l or rsync --link-dest, loads).
 *
 * The model's owner is its tree's (the tree the files were found beneath,
 * q->root, or the one the operator's load found before opening them); root
 * reads them all where it alone may write in the directory holding them
 * (only_writer): only root put them there. A model straight in a shared
 * directory (one others may write in, as a 1775 team directory) has that
 * directory for its tree, whose owner is not the model's: its owner is
 * that of the file it replaces (the one file or shard index the newest
 * generation's path resolved to, when it resolves to that path still),
 * and where none is known (its first load, a path changed), that of the
 * file its path names (a shard index's shards must be files its owner
 * could read). Where no tree is known, only files everyone may read (its
 * group and the others) are taken. Then a shard index's shards must be
 * files the index's owner could read, whoever owns the tree
 * (index_owner_reads).
 */
static int
linked_in(struct load_request *q)
{
	const char *tree = q->root != NULL ? q->root : q->found_root, *name;
	uid_t owner = q->root != NULL ? q->root_uid : q->found_uid;
	int err = 0, all = q->root != NULL && owner == 0 && only_writer(q, 0);
	struct owner_groups groups = { 0 };
	const struct stat *st;
	char who[384];

	if (q->root != NULL && q->resolved != NULL && registry_file_in(q->resolved, q->root) &&
		others_write(q) && q->source.nfiles > 0) {
		int replaces = q->named_path != NULL && strcmp(q->named_path, q->resolved) == 0;

		owner = replaces ? q->named_uid : q->source.format == FORMAT_SHARDED ?
			q->source.index_st.st_uid : q->source.files[0].st.st_uid;
		snprintf(who, sizeof(who), "uid %u (the owner of the file %s %.300s)",
			(unsigned)owner, replaces ? "it replaces at" : "its path names,",
			q->resolved);
	} else if (tree != NULL) {
		snprintf(who, sizeof(who), "uid %u (the owner of the model's tree %.300s)",
			(unsigned)owner, tree);
	} else {
		snprintf(who, sizeof(who), "anyone but its owner (the model's tree, whose owner "
			"might, could not be told)");
	}
	for (size_t i = 0; err == 0 && file_of(q, i, &st, &name); i++) {
		char names[96] = "", named[PATH_MAX];

		if (tree != NULL ? st->st_uid == owner || all ||
				owner_may_read(q, i, owner, &groups) :
			(st->st_mode & (S_IRGRP | S_IROTH)) == (S_IRGRP | S_IROTH))
			continue;
		name = file_said(q, st, name, named, sizeof(named));
		if (st->st_nlink > 1)
			snprintf(names, sizeof(names), " (it has %ju names; another may be "
				"anyone's link of it)", (uintmax_t)st->st_nlink);
		snprintf(q->message, sizeof(q->message), "%s%s is owned by uid %u (mode %04o, "
			"group %u), which %s may not read: another user's file put in a model's "
			"tree (renamed, or hard-linked where fs.protected_hardlinks=0) is not "
			"served: wcached would lend its read right to whoever put it there; copy "
			"it there instead, or make it readable to the model's owner", name, names,
			(unsigned)st->st_uid, (unsigned)(st->st_mode & 07777), (unsigned)st->st_gid,
			who);
		err = -EPERM;
	}
	free(groups.list);
	if (err == 0) {
		struct owner_groups ig = { 0 };

		err = index_owner_reads(q, &ig);
		free(ig.list);
	}
	return err;
}

/* Serializes the user database's enumeration (getpwent_r's state is the
 * process's), for group_private. */
static pthread_mutex_t pwent_lock = PTHREAD_MUTEX_INITIALIZER;

/*
 * Whether no user but uid is in the group gid: the group database knows
 * it, by uid's name, as uid's primary group, lists no other member, and
 * no other user it enumerates has it for primary group: a user-private
 * group (umask 002 on RHEL/Fedora, Debian's pam_umask usergroups), whose
 * write bit lets no one else in (review rev199 L1). Its name and its
 * being uid's primary group are asked too, as a network database may not
 * enumerate its users. A group the database does not know is not private
 * (a process may hold any gid root gave it), nor where a database cannot
 * be asked, nor root's group or a directory of root's: the database lists
 * users, not the processes that hold a gid, and gid 0 is given to others
 * (a container's arbitrary uid runs in group 0, and its images are made
 * `chmod g=u` for it: review rev201 M2). Work queue thread: the database
 * may be a network's.
 */
static int
group_private(gid_t gid, uid_t uid)
{
	struct group *gr;
	struct passwd *owner, pw, *pfound = NULL;
	size_t size = 16384;
	char *buf;
	int err, priv = 1;

	if (gid == 0 || uid == 0)
		return 0;
	if ((gr = nss_group_by_gid(gid, &err)) == NULL)
		return 0;
	/* The owner's own: her primary group, of her name. */
	owner = nss_user_by_uid(uid, &err);
	if (owner == NULL || owner->pw_gid != gid || strcmp(owner->pw_name, gr->gr_name) != 0)
		priv = 0;
	free(owner);
	for (char **mem = gr->gr_mem; priv && *mem != NULL; mem++) {
		struct passwd *member = nss_user_by_name(*mem, &err);

		if (member == NULL || member->pw_uid != uid)
			priv = 0;
		free(member);
	}
	free(gr);
	if (priv && (buf = malloc(size)) == NULL)
		priv = 0;
	if (priv) {
		/* Every user whose primary group it is: an entry larger than
		 * size (ERANGE) ends the walk, and the group counts as shared. */
		pthread_mutex_lock(&pwent_lock);
		setpwent();
		while (priv && (err = getpwent_r(&pw, buf, size, &pfound)) == 0 &&
			pfound != NULL)
			if (pfound->pw_gid == gid && pfound->pw_uid != uid)
				priv = 0;
		if (err != 0 && err != ENOENT)
			priv = 0;
		endpwent();
		pthread_mutex_unlock(&pwent_lock);
		free(buf);
	}
	return priv;
}

/*
 * Whether others than the owner of the directory whose fstat is st may
 * rename entries in it: writable by all, or by a group someone else is
 * in (group_private), and not sticky (review rev198 M1, rev199 L1).
 */
static int
others_rename_in(const struct stat *st)
{
	if ((st->st_mode & S_ISVTX) != 0 || (st->st_mode & (S_IWGRP | S_IWOTH)) == 0)
		return 0;
	return (st->st_mode & S_IWOTH) != 0 || !group_private(st->st_gid, st->st_uid);
}

/*
 * The directory path, reached by the judged walk in the run w (NULL: one
 * of its own; mountrule_open: one name at a time, nothing looked up in a
 * user's FUSE mount, whose server may never answer) and its fstat, its
 * ACL folded in (diracl_fstat), read from the walk's descriptor, never by
 * name: 0, or -errno where the walk (why, len bytes: its refusal, -EXDEV)
 * or the fstat failed (it cannot be told).
 */
static int
judged_stat(struct mountrule_walk *w, const char *path, struct stat *st, char *why, size_t len)
{
	int fd = mountrule_open(w, path, why, len), r;

	if (fd < 0)
		return fd;
	r = diracl_fstat(fd, st) == 0 ? 0 : -errno;
	close(fd);
	return r;
}

/* Whether st is the kept file id: its device and inode, and its ctime
 * where the id's is known (a restart's: the inode number may have been
 * given to another file since, review rev217 L1). */
static int
kept_file(const struct file_id *id, const struct stat *st)
{
	return id->dev == st->st_dev && id->ino == st->st_ino &&
		(!id->ctime_known || id->ctime_ns == file_time_ns(&st->st_ctim));
}

/*
 * Whether the files of q, wcached's own reload, may be taken where they
 * lie: where the directory holding them (as found) is one others may
 * rename entries in, only the files of the generation it replaces (the
 * same inodes), whoever owns them: anyone there may rename another file of
 * the owner's at a file's name (root's private secret.safetensors over
 * llama.safetensors, a model that is one file straight in a team's 2775
 * directory), and no owner tells who put it there (review rev201 H2). A
 * model no generation serves keeps none. The first file that is not one
 * in *name and *st.
 */
static int
files_kept(const struct load_request *q, const char **name, const struct stat **st)
{
	struct stat dir;

	if (!q->files_dir_known)
		return 1;
	memset(&dir, 0, sizeof(dir));
	dir.st_uid = q->files_uid;
	dir.st_gid = q->files_gid;
	dir.st_mode = q->files_mode;
	if (!others_rename_in(&dir))
		return 1;
	for (size_t i = 0; file_of(q, i, st, name); i++) {
		size_t k = 0;

		while (k < q->nkeep_files && !kept_file(&q->keep_files[k], *st))
			k++;
		if (k == q->nkeep_files)
			return 0;
	}
	return 1;
}

/* Whether l is a link the load of the generation a watched reload q
 * replaces went through: the same link inode, maker and text, in the same
 * directory (generation.h's gen_link). */
static int
kept_link(const struct load_request *q, const struct registry_link_seen *l)
{
	for (size_t k = 0; k < q->nkeep_links; k++) {
		const struct gen_link *o = &q->keep_links[k];

		if (o->dev == l->st->st_dev && o->ino == l->st->st_ino &&
			o->uid == l->st->st_uid && o->dir_dev == l->dir_st->st_dev &&
			o->dir_ino == l->dir_st->st_ino && strcmp(o->text, l->target) == 0)
			return 1;
	}
	return 0;
}

/*
 * link_taken's judge of a link l followed for its maker's files alone: she
 * owns files serving, but not the tree kept, and is not root. Where q's
 * tree is another than the one kept (a sibling swap), every file of q (its
 * shard index too) must be hers: the tree's owner did not choose the move,
 * and a sibling of that owner with that owner's files passed every check
 * (sibling_swap, same_owners), so her link to root's private model beside
 * root's slot (or team place) holding her files was served as hers (review
 * rev216 H1); her own files in another slot of root's are her swap. 0, or
 * -EXDEV with q->message.
 */
static int
makers_move(struct load_request *q, const struct registry_link_seen *l)
{
	const struct stat *st;
	const char *name;

	if (q->root != NULL && q->keep_root != NULL && strcmp(q->root, q->keep_root) == 0)
		return 0;
	for (size_t i = 0; file_of(q, i, &st, &name); i++) {
		char named[PATH_MAX];

		if (st->st_uid == l->st->st_uid)
			continue;
		name = file_said(q, st, name, named, sizeof(named));
		snprintf(q->message, sizeof(q->message), "its path %s now resolves into %s (was "
			"%s) through the symbolic link %s (to %.256s) made by uid %u, who owns "
			"files serving but not the model's tree (uid %u), and its file %s is owned "
			"by uid %u: such a link moves the model by itself only to files of its "
			"maker, so it is served only after " OPERATORS_WORD, q->path,
			q->root != NULL ? q->root : "another place",
			q->keep_root != NULL ? q->keep_root : "no tree kept", l->path, l->target,
			(unsigned)l->st->st_uid, (unsigned)q->keep_uid, name,
			(unsigned)st->st_uid, q->name);
		q->links_known = -1; /* refused: the walk ends here */
		return -EXDEV;
	}
	return 0;
}

/*
 * registry_walk_links' judge for q's load: any link, for an operator's
 * load or reload (which follows what its path names, and records it); for
 * a watched reload, a link its newest generation was loaded through,
 * unchanged (kept_link: a deployer's `llama -> v2` in root's team
 * directory, made once by a member of the team, holds up no update inside
 * v2, review rev195 L1), or one made by root, the kept tree's owner or an
 * owner of the files serving (to another tree only with files of hers:
 * makers_move). Else -EXDEV with q->message. Owning the
 * directory that holds a link is no right of its own: whoever may put a
 * directory of hers on the path (a name freed in a team directory, or her
 * own directory holding her `llama -> ../srv/v1`) would approve her own
 * link in it, to any sibling tree of root's, a private one too (review
 * rev198 H1); the owner of that directory, when trusted, is trusted as the
 * link's maker already, and a link unchanged in it is kept_link's. The
 * entry at a model's path, or at any directory on it, is not always its
 * owner's: in a shared sticky
 * directory (1775, where fs.protected_symlinks does not apply) anyone may
 * make a link at a name freed a moment by a redeploy, to another model of
 * the same owner (a private one of root's), and every check of the tree's
 * and the files' owners passed (review rev191 F1b, rev195 H1).
 */
static int
link_taken(const struct registry_link_seen *l, void *arg)
{
	struct load_request *q = arg;
	uid_t uid = l->st->st_uid;
	int bound = others_rename_in(l->dir_st);
	int judged = q->reload == RELOAD_WATCHED;

	/* A directory, or a link, in a place others may rename entries in:
	 * anyone of them may rename another of the owner's there at its name
	 * (root's private secret, or root's link to it, over llama), whoever
	 * made it: only the one the generation serving was loaded through is
	 * taken (review rev199 H2, H3), and none where that was not recorded
	 * (a warm restart's generation, H1) or where no generation serves (a
	 * model whose load failed: review rev201 H3). */
	if (l->target[0] == '\0' && (!bound || !judged || kept_link(q, l)))
		return bound;
	if (l->target[0] == '\0' || (bound && judged && !kept_link(q, l))) {
		int link = l->target[0] != '\0';

		snprintf(q->message, sizeof(q->message), "its path %s goes through the %s %s%s"
			"%.256s%s, in %s, a directory others than its owner (uid %u, mode %04o) "
			"may rename entries in (writable by its group or all, not sticky), and not "
			"the one the generation serving was loaded through (or that was not "
			"recorded, as after a warm restart, or none serves): anyone of them may "
			"rename another there at its name, so it is served only after "
			OPERATORS_WORD, q->path,
			link ? "symbolic link" : "directory", l->path, link ? " (to " : "",
			l->target, link ? ")" : "", l->dir, (unsigned)l->dir_st->st_uid,
			(unsigned)(l->dir_st->st_mode & 07777), q->name);
		q->links_known = -1; /* refused: the walk ends here */
		return -EXDEV;
	}
	if (q->reload != RELOAD_WATCHED || kept_link(q, l) || uid == 0 || uid == q->keep_uid)
		return 0;
	if (kept_owner(q, uid) || (q->keep_file_known && uid == q->keep_file_uid))
		return makers_move(q, l);
	snprintf(q->message, sizeof(q->message), "its path %s leads through the symbolic link "
		"%s (to %.256s) made by uid %u, in %s owned by uid %u: a link of a user who "
		"owns neither the model's tree (uid %u) nor its files serving (owning the "
		"directory it is in does not count), and not one the generation serving was "
		"loaded through, is followed only after " OPERATORS_WORD, q->path, l->path,
		l->target, (unsigned)uid, l->dir, (unsigned)l->dir_st->st_uid,
		(unsigned)q->keep_uid, q->name);
	q->links_known = -1; /* refused: the walk ends here */
	return -EXDEV;
}

/* Whether the walk w of q's path ended at what q's files were opened at:
 * the directory gen_resolved_path found them in, where the path names a
 * directory; else the file it names as opened (a model that is one file,
 * or a shard index), in that directory when it was told. */
static int
walk_bound(const struct load_request *q, const struct registry_walk *w)
{
	const struct stat *named = q->source.format == FORMAT_SHARDED ? &q->source.index_st :
		q->source.nfiles == 1 ? &q->source.files[0].st : NULL;

	if (S_ISDIR(w->end.st_mode))
		return q->files_dir_known && w->end.st_dev == q->files_dev &&
			w->end.st_ino == q->files_ino;
	return S_ISREG(w->end.st_mode) && named != NULL && w->end.st_dev == named->st_dev &&
		w->end.st_ino == named->st_ino &&
		(!q->files_dir_known ||
			(w->end_dir.st_dev == q->files_dev && w->end_dir.st_ino == q->files_ino));
}

/* The line of a watched reload whose path resolved to another place
 * while its files were opened (its tree: old). */
static void
say_moved(struct load_request *q, const char *old)
{
	snprintf(q->message, sizeof(q->message), "its path %s resolved to another place while "
		"its files were opened (its tree is %s); not loaded", q->path, old);
}

/*
 * Work queue thread, any load, after its files were opened and
 * gen_resolved_path found them at their place: walks q's whole path, every
 * symbolic link on it judged (link_taken) as an entry of the directory
 * holding it (registry_links.c), to the inode it names now, which must be
 * what the files were opened at (walk_bound): a link renamed over the
 * path, or away, between the open and the walk is no longer the one the
 * open followed (review rev195 H2). The links gone through, when it was,
 * in q->links (links_known 1) for the generation. A watched reload: 0, or
 * -EXDEV with q->message (a link refused, or the path led elsewhere: then
 * loaded again at its next change), or the walk's -errno with q->message;
 * any other load: 0. Any load: -EXDEV with q->message where the walk met a
 * mount it does not step onto (a user's FUSE mount, where a link renamed
 * in between leads: review rev216 H2); a watched reload then waits for the
 * operator's word, as for a link refused.
 */
static int
check_links(struct load_request *q)
{
	struct registry_walk *w = malloc(sizeof(*w));
	int err, bound;

	if (w == NULL) {
		snprintf(q->message, sizeof(q->message), "%s", strerror(ENOMEM));
		return q->reload == RELOAD_WATCHED ? -ENOMEM : 0;
	}
	err = registry_walk_links(q->path, link_taken, q, w);
	if (q->links_known < 0) {
		free(w);
		return -EXDEV; /* link_taken said why */
	}
	if (w->refused && q->reload != RELOAD_WATCHED) { /* a mount it would not cross */
		snprintf(q->message, sizeof(q->message), "its path was walked again after its "
			"files were opened: %.900s; not loaded", w->why);
	} else if (w->refused) { /* refused as same_tree refuses: waits */
		snprintf(q->message, sizeof(q->message), "its path was walked again after its "
			"files were opened: %.700s; it is served only after " OPERATORS_WORD,
			w->why, q->name);
	}
	if (w->refused) {
		free(w);
		return -EXDEV;
	}
	bound = err == 0 && walk_bound(q, w);
	if (bound && (q->links = malloc((w->nlinks > 0 ? w->nlinks : 1) *
			      sizeof(*q->links))) != NULL) {
		memcpy(q->links, w->links, w->nlinks * sizeof(*q->links));
		q->nlinks = w->nlinks;
		q->links_known = 1;
	}
	free(w);
	/* Judged and bound, recorded or not (then judged by maker next
	 * time); a walk that failed judged nothing past where it stopped, so
	 * a watched reload is refused for it, out of memory too (review
	 * rev198 L2), with its reason (L1), and tried again at the next
	 * change. */
	if (q->reload != RELOAD_WATCHED || bound)
		return 0;
	if (err == 0) {
		say_moved(q, q->keep_root != NULL ? q->keep_root : q->keep_resolved);
		return -EXDEV;
	}
	snprintf(q->message, sizeof(q->message), "its path %s could not be walked again after "
		"its files were opened: %s; not loaded", q->path, strerror(-err));
	return err;
}

/*
 * Whether the root q's files were found in, at the very path of the tree
 * it keeps, is another directory than the one recorded (its inode), in a
 * directory others than its owner may rename entries in (writable by its
 * group or all, not sticky): there anyone of them may rename another of
 * the owner's directories at the tree's name (root's private secret over
 * llama), and the path and the owner are the same (review rev198 M1). A
 * directory that cannot be told is taken as such a place.
 */
static int
renamed_in(const struct load_request *q)
{
	char why[MOUNTRULE_WHY];
	struct stat up;
	char *dir;
	int open;

	if (!q->keep_root_known || !q->root_known ||
		(q->root_dev == q->keep_root_dev && q->root_ino == q->keep_root_ino))
		return 0;
	dir = path_dir(q->root);
	open = dir == NULL || judged_stat(NULL, dir, &up, why, sizeof(why)) != 0 ||
		others_rename_in(&up);
	free(dir);
	return open;
}

/*
 * Whether q's files, found in the very tree it keeps (the same path), are
 * that tree's: its owner is the one kept; or, at a place its operator's
 * load found nothing at (q->keep_place), whoever made them where no one
 * else could have, and where others may write (open) only files of the
 * place's owner in a tree of hers, as at_place takes them.
 */
static int
same_root(const struct load_request *q, int open)
{
	if (q->keep_place == NULL)
		return q->root_uid == q->keep_uid && !renamed_in(q);
	return !open || (q->root_uid == q->keep_uid && owned_by(&q->source, q->keep_uid));
}

/*
 * Whether q may take its files as the owners of the files serving would
 * tell them: always, but for a warm restart's load of a model whose
 * served files' owners it could not tell (owners_untold): then only where
 * no one but the owner of the directory holding them may write in it
 * (only_writer; not where that directory could not be told). In a shared
 * sticky directory the tree's owner (root, of a 1777 place) says nothing
 * of whose a model's file is (review rev206 H1).
 */
static int
owners_told(const struct load_request *q)
{
	return !q->owners_untold || only_writer(q, q->files_uid);
}

static int
same_tree(struct load_request *q)
{
	const char *old, *file = NULL;
	const struct stat *st = NULL;
	char owners[300], named[PATH_MAX];
	int same, path_same, open = open_place(q), first = 0;

	if (q->keep_root == NULL && q->keep_resolved != NULL &&
		(q->keep_root = gen_tree_root(q->keep_resolved, &q->keep_uid)) != NULL)
		q->keep_named_file = registry_file_in(q->keep_resolved, q->keep_root);
	old = q->keep_root != NULL ? q->keep_root : q->keep_resolved;
	/* A root of the same path is the same tree only with the same owner:
	 * one removed or renamed away and made again by another user is his
	 * (review rev187 R2). A place the operator's load found nothing at
	 * keeps at_place's rules, and a model directory made at it is taken
	 * whoever made it only where no one else could have (open_place:
	 * review rev187 R5: a hub snapshot directory made in its repo's
	 * group-writable snapshots/ has the repo, the same path and owner,
	 * for its tree, rev195 M4); first: a first comer's, so refused. */
	path_same = q->root != NULL && q->keep_root != NULL && strcmp(q->root, q->keep_root) == 0;
	same = q->root != NULL && q->keep_root != NULL &&
		((path_same ? same_root(q, open) : sibling_swap(q)) || at_place(q, !open));
	if (!same && open && q->root != NULL && q->keep_root != NULL)
		first = (path_same && q->keep_place != NULL) || at_place(q, 1);
	if (old == NULL)
		snprintf(q->message, sizeof(q->message), "its path %s resolves into %s, but no "
			"load of it by the operator found its tree: it is served only after "
			OPERATORS_WORD, q->path,
			q->root != NULL ? q->root : "a place that moved as its files were opened",
			q->name);
	else if (q->root == NULL && q->link_unchecked)
		snprintf(q->message, sizeof(q->message), "its path %s reaches its files through "
			"a symbolic link inside its tree, which this kernel (no openat2) cannot "
			"check: it is served only after " OPERATORS_WORD, q->path, q->name);
	else if (q->root == NULL)
		say_moved(q, old);
	else if (first)
		snprintf(q->message, sizeof(q->message), "its path %s named nothing at the "
			"operator's last load, and %.*s, the directory above it that existed, is "
			"writable by others than its owner (uid %u, mode %04o): the files made "
			"there since (%s) could be anyone's who came first, and are served only "
			"after " OPERATORS_WORD, q->path, (int)q->keep_place_dir_len, q->keep_place,
			(unsigned)q->keep_uid, (unsigned)(q->keep_place_mode & 07777),
			owners_said(&q->source, NULL, owners, sizeof(owners)), q->name);
	else if (!same && path_same && q->root_uid == q->keep_uid && q->keep_place == NULL)
		snprintf(q->message, sizeof(q->message), "its path %s resolves into %s still, "
			"but that is another directory than the tree serving (a new inode), in a "
			"directory others than its owner may rename entries in (writable by its "
			"group or all, not sticky): a tree renamed in there is served only after "
			OPERATORS_WORD, q->path, q->root, q->name);
	else if (!same && path_same)
		snprintf(q->message, sizeof(q->message), "its path %s resolves into %s still, "
			"but that directory is now owned by uid %u (was uid %u): a tree made again "
			"by another user is served only after " OPERATORS_WORD, q->path, q->root,
			(unsigned)q->root_uid, (unsigned)q->keep_uid, q->name);
	else if (!same)
		snprintf(q->message, sizeof(q->message), "its path %s now resolves into %s "
			"(was %s): a moved tree is served only after " OPERATORS_WORD, q->path,
			q->root, old, q->name);
	else if ((same = owners_told(q)) == 0)
		snprintf(q->message, sizeof(q->message), "its files (of %s) lie in the tree %s, "
			"in a directory others than its owner may write in (or one that could not "
			"be told), and %s: anyone there may have put these at its path, so they "
			"are served only after " OPERATORS_WORD,
			owners_said(&q->source, NULL, owners, sizeof(owners)), q->root,
			q->owners_untold == OWNERS_UNTOLD_FAILED_LOAD ?
				"nothing served it since the operator's load of it failed, so "
				"whose its files were is not known" :
				"the warm restart could not tell whose the files it served "
				"before were (none was stored: if the file descriptor store had "
				"no room for its generation's descriptors, raise "
				"FileDescriptorStoreMax= in the unit; or a staged copy)", q->name);
	else if ((same = same_file_owner(q)) == 0)
		snprintf(q->message, sizeof(q->message), "its path %s names a file now owned by "
			"uid %u (was uid %u): a file made again by another user is served only "
			"after " OPERATORS_WORD, q->path, (unsigned)q->source.files[0].st.st_uid,
			(unsigned)q->keep_file_uid, q->name);
	else if ((same = same_owners(q, &file, &st)) == 0)
		same_owners_said(q, file, st);
	else if ((same = files_kept(q, &file, &st)) == 0)
		snprintf(q->message, sizeof(q->message), "its file %s is not one of the files "
			"serving (another inode, or its inode with another ctime where nothing "
			"held it, as a staged copy's origin, a shard index, a file on a remote "
			"filesystem, or any file while wcached was down: a file made at a freed "
			"inode number, or this one changed since, by a chmod or a write; or none "
			"serves), in a directory others than its owner (uid %u, mode %04o) may "
			"rename entries in (writable by its group or all, not sticky): anyone of "
			"them may rename another file there at its name, so it is served only "
			"after "
			OPERATORS_WORD, file_said(q, st, file, named, sizeof(named)),
			(unsigned)q->files_uid, (unsigned)(q->files_mode & 07777), q->name);
	else
		return check_links(q); /* -EXDEV, or its walk's -errno */
	return same ? 0 : -EXDEV;
}

/* rest, a relative path, as plain names (allocated): empty and "."
 * components dropped, as a trailing slash, "//" and "/./" spell the same
 * place (review rev180 F11); NULL when one is ".." (the place it names is
 * then not told by its spelling), when none is left, or out of memory. */
static char *
plain_names(const char *rest)
{
	char *out = malloc(strlen(rest) + 1), *o = out;

	for (const char *p = rest, *e; out != NULL; p = e + 1) {
		size_t len = (e = strchr(p, '/')) != NULL ? (size_t)(e - p) : strlen(p);

		if (len == 2 && p[0] == '.' && p[1] == '.')
			break;
		if (len > 0 && !(len == 1 && p[0] == '.')) {
			if (o != out)
				*o++ = '/';
			memcpy(o, p, len);
			o += len;
		}
		if (e == NULL && o != out) {
			*o = '\0';
			return out;
		}
		if (e == NULL)
			break;
	}
	free(out);
	return NULL;
}

/* What the judged walk of one directory prefix in place_of's look found. */
enum place_seen {
	PLACE_NOT_REACHED, /* the walk failed: nor is any prefix past it reached */
	PLACE_NAMED,       /* reached, its real path read from the descriptor */
	PLACE_UNNAMED,     /* reached, but its real path cannot be read (4096 bytes or
			    * more, deleted, or on a mount detached since the walk):
			    * a place that cannot be told */
	PLACE_ENDED,       /* the look ends: the walk refused a user's FUSE mount
			    * (-EXDEV), the look's budget is spent, or out of memory */
};

/*
 * The file path names, reached by the judged walk in the run w
 * (mountrule_open: one name at a time, nothing looked up in a user's FUSE
 * mount) and read from the walk's descriptor, never by name: PLACE_NAMED
 * with its real path in *real (allocated, as /proc/self/fd names it), its
 * fstat in *st and the descriptor in *fd (O_PATH; the caller closes it);
 * else the other place_seen, *real NULL and *fd -1. A file reached whose
 * name cannot be read is no file not reached: a prefix past it may be
 * reached ("X/.." where X's real path is too long; review rev212 L2).
 */
static enum place_seen
judged_place(struct mountrule_walk *w, const char *path, struct stat *st, int *fd, char **real)
{
	char why[8];
	int e;

	*real = NULL;
	if ((*fd = mountrule_open(w, path, why, sizeof(why))) < 0) {
		enum place_seen seen = *fd == -EXDEV || w->spent ? PLACE_ENDED : PLACE_NOT_REACHED;

		*fd = -1;
		return seen;
	}
	/* Its name: none where it is too long (ENAMETOOLONG), removed or on
	 * a mount detached since the walk (ENOENT: the kernel names a
	 * detached mount's file from that mount's own root, review rev215
	 * L1), or the mount table cannot be read. */
	if (diracl_fstat(*fd, st) == 0 &&
		(*real = mountrule_fd_realpath(w, *fd, path, NULL, 0)) != NULL)
		return PLACE_NAMED;
	e = errno;
	close(*fd);
	*fd = -1;
	/* Out of memory ends the look, as a refusal does: not the parent
	 * judged in the directory's place, nor the descriptor left open
	 * (review rev210 L1). */
	return e == ENOMEM ? PLACE_ENDED : PLACE_UNNAMED;
}

/*
 * The text of the link name (one name, no '/') in the directory dir (an
 * O_PATH descriptor of the judged walk's) into text (size bytes, ended),
 * read from the link's own descriptor: opened with no link followed and no
 * mount crossed (a mount on name is no link, and its server is not
 * asked); its length, or -1 where name is no link or cannot be read.
 */
static ssize_t
link_text_at(int dir, const char *name, char *text, size_t size)
{
	int fd = tree_openat2(dir, name, O_PATH | O_NOFOLLOW | O_CLOEXEC,
		RESOLVE_NO_XDEV | RESOLVE_NO_MAGICLINKS);
	ssize_t n = -1;

	if (fd >= 0) {
		n = readlinkat(fd, "", text, size - 1);
		close(fd);
	} else if (errno == ENOSYS) { /* no openat2: the name looked up in dir */
		n = readlinkat(dir, name, text, size - 1);
	}
	if (n > 0)
		text[n] = '\0';
	return n > 0 ? n : -1;
}

/* judged_place of the i-th directory prefix of text (the text before its
 * slash at[i]; "/" for a slash at 0). */
static enum place_seen
judged_prefix(struct mountrule_walk *w, const char *text, const size_t *at, size_t i,
	struct stat *st, int *fd, char **real)
{
	char *head = at[i] == 0 ? strdup("/") : strndup(text, at[i]);
	enum place_seen seen;

	if (head == NULL) {
		*fd = -1;
		*real = NULL;
		return PLACE_ENDED; /* out of memory ends the look, as in judged_place */
	}
	seen = judged_place(w, head, st, fd, real);
	free(head);
	return seen;
}

/*
 * The deepest directory prefix of text (a path, or a link's text joined
 * with the rest of the path) that the judged walk in the run w reaches:
 * judged_place's, with the length of that prefix's text in *head_len;
 * NULL where none does, or (*refused set: the look ends) where a walk
 * ends the look (PLACE_ENDED) or the deepest prefix reached has a name
 * that cannot be read (PLACE_UNNAMED: a place that cannot be told). A
 * prefix past one the walk does not reach is not reached either, nor one
 * past a refused one reached (the walk goes the same way up to it): the
 * deepest is tried first, then the rest bisected on whether the walk
 * reaches them (one reached whose name cannot be read is reached: review
 * rev212 L2), a few walks of one run (one mount table read) where a walk
 * per prefix, each reading the table, cost a chain of links with long
 * missing texts minutes of a work thread (review rev210 M1).
 */
static char *
deepest_place(struct mountrule_walk *w, const char *text, size_t *head_len, struct stat *st,
	int *fd, int *refused)
{
	size_t n = 0, *at = malloc((strlen(text) + 1) * sizeof(*at));
	enum place_seen deepest = PLACE_NOT_REACHED, seen = PLACE_NOT_REACHED;
	ssize_t lo = -1, hi;
	char *real = NULL;

	*fd = -1;
	if (at == NULL) {
		*refused = 1;
		return NULL;
	}
	for (const char *c = strchr(text, '/'); c != NULL; c = strchr(c + 1, '/'))
		at[n++] = (size_t)(c - text);
	hi = (ssize_t)n;
	/* The path's own directory first, most often there: one walk. */
	for (ssize_t mid = hi - 1; hi - lo > 1; mid = lo + (hi - lo) / 2) {
		struct stat got_st;
		char *got;
		int got_fd;

		if ((seen = judged_prefix(w, text, at, (size_t)mid, &got_st, &got_fd, &got)) ==
			PLACE_ENDED)
			break;
		if (seen == PLACE_NOT_REACHED) {
			hi = mid;
			continue;
		}
		free(real);
		if (*fd >= 0)
			close(*fd);
		real = got;
		*st = got_st;
		*fd = got_fd;
		deepest = seen;
		lo = mid;
	}
	if (seen == PLACE_ENDED || deepest == PLACE_UNNAMED) {
		free(real);
		real = NULL;
		if (*fd >= 0)
			close(*fd);
		*fd = -1;
		*refused = 1;
	} else if (real != NULL) {
		*head_len = at[lo];
	}
	free(at);
	return real;
}

/*
 * The budget of place_of's look, all its walks together (mountrule.h's
 * run): the names looked up, each an openat and a statx, and the links
 * followed. A look at an ordinary path takes tens of names and a few
 * links (the path's own directory, then a bisection of its directories:
 * at most some 12 walks of a text, each following the links on its way
 * again); a neighbour's links of PATH_MAX texts made each walk some
 * 65,000 names and the look minutes (review rev212 M2). 8192 names is
 * four times the most a PATH_MAX text holds, some 40 ms of a work
 * thread; 160 links, four walks' 40, leaves an ordinary path's links
 * followed again by each walk room, and a chain of more than 40 (which
 * the kernel refuses) ends there instead of being followed text by text.
 */
#define PLACE_STEPS 8192
#define PLACE_LINKS 160

/*
 * The place path names when it does not resolve (allocated): the real path
 * of the deepest directory above it that resolves, whose owner goes in
 * *owner, its mode in *mode and its path's length in *dir_len, joined
 * with the names below it (plain_names); the first of them,
 * when it is a symbolic link that points nowhere yet (a mount not up, a
 * volume not attached, a link made before its target), is followed by its
 * text, at most 40 times (review rev180 F9). Where the links cannot be
 * followed to a place (a loop, more than 40, or a text holding ".."
 * past a missing name: anyone who may rename entries in a directory on
 * the path may leave such a link at its name), the place the path names
 * as configured, its own entry (review rev204 H1: else that load records
 * nothing to judge by, and a config reload's retry of it is the
 * operator's load). NULL when it cannot be told.
 *
 * Each directory is reached by the judged walk and read from its
 * descriptor (judged_place, link_text_at), never by name: this runs after
 * a walk that failed, where a neighbour's FUSE mount absent then may be
 * back (review rev208 H3: a stat(2) by name of his mount held the thread,
 * GETATTR waiting for an INIT never answered). A directory the walk
 * refuses (a user's FUSE mount on it or above it), or reaches but cannot
 * name (its real path 4096 bytes or more), ends the search: the place is
 * then the path's as configured where its own directory was reached, else
 * none (nothing to judge by). So does the look's budget (PLACE_STEPS,
 * PLACE_LINKS), one line logged.
 */
static char *
place_of(const char *path, uid_t *owner, mode_t *mode, size_t *dir_len)
{
	char *p = path[0] == '/' ? strdup(path) : path_join(".", path), *place = NULL;
	char *spelled = NULL;
	struct stat spelled_st = { 0 };
	struct mountrule_walk w;
	size_t spelled_len = 0;
	int refused = 0;

	mountrule_walk_init(&w);
	w.max_steps = PLACE_STEPS;
	w.max_links = PLACE_LINKS;
	for (int links = 0; p != NULL && place == NULL && !refused && links <= 40; links++) {
		char *real, *rest = NULL, *name = NULL, *next = NULL, text[PATH_MAX];
		struct stat st = { 0 };
		size_t head_len = 0;
		int dir = -1;

		real = deepest_place(&w, p, &head_len, &st, &dir, &refused);
		if (real != NULL)
			rest = plain_names(p + head_len + 1);
		if (rest != NULL)
			name = strndup(rest, strcspn(rest, "/"));
		if (links == 0 && name != NULL && (spelled = path_join(real, rest)) != NULL) {
			spelled_st = st;
			spelled_len = strlen(real);
		}
		if (name != NULL && link_text_at(dir, name, text, sizeof(text)) > 0) {
			if (asprintf(&next, "%s/%s%s", text[0] == '/' ? "" : real, text,
				    rest + strcspn(rest, "/")) < 0)
				next = NULL;
		} else if (name != NULL && (place = path_join(real, rest)) != NULL) {
			*owner = st.st_uid;
			*mode = st.st_mode;
			*dir_len = strlen(real);
		}
		if (dir >= 0)
			close(dir);
		free(name);
		free(rest);
		free(real);
		free(p);
		p = next;
	}
	if (w.spent)
		log_warnx("%s: the look at the place this path names ended after %ld names and %d "
			"links walked (its budget: %d names, %d links; a neighbour's links can "
			"make it walk millions): the place is %s", path, w.steps, w.links,
			PLACE_STEPS, PLACE_LINKS, spelled != NULL ? "the path as configured" :
			"none (a reload wcached makes by itself waits for the operator's)");
	mountrule_walk_end(&w);
	free(p);
	if (place == NULL && spelled != NULL) {
		place = spelled;
		spelled = NULL;
		*owner = spelled_st.st_uid;
		*mode = spelled_st.st_mode;
		*dir_len = spelled_len;
	}
	free(spelled);
	return place;
}

/* How hub_root opens the directories it looks in: never through a link. */
#define DIR_NO_LINK (O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)

/*
 * Whether the file whose fstat is st is the file name of the snapshot
 * directory rev (a descriptor) of the hub repo repo (one too): a regular
 * file there, or a hub download's link ../../blobs/BLOB to the regular file
 * BLOB of the repo's blobs/, found with no other link followed. Nothing
 * else counts: not a link out of the repo (to another user's blob, review
 * rev185 F3), nor a chain of links, which the operator's reload takes.
 */
static int
is_hub_file_at(int repo, int rev, const char *name, const struct stat *st)
{
	char target[PATH_MAX];
	const char *blob = target + 12;
	struct stat at;
	ssize_t n;
	int blobs = -1, ok = fstatat(rev, name, &at, AT_SYMLINK_NOFOLLOW) == 0;

	if (ok && S_ISLNK(at.st_mode)) {
		n = readlinkat(rev, name, target, sizeof(target) - 1);
		if ((ok = n > 12) != 0)
			target[n] = '\0';
		ok = ok && strncmp(target, "../../blobs/", 12) == 0 &&
			strchr(blob, '/') == NULL && strcmp(blob, ".") != 0 &&
			strcmp(blob, "..") != 0;
		if (ok)
			blobs = openat(repo, "blobs", DIR_NO_LINK);
		ok = blobs >= 0 && fstatat(blobs, blob, &at, AT_SYMLINK_NOFOLLOW) == 0;
		if (blobs >= 0)
			close(blobs);
	}
	return ok && S_ISREG(at.st_mode) && at.st_dev == st->st_dev && at.st_ino == st->st_ino;
}

/*
 * Work queue thread: the tree of q's model when its path names a file in a
 * hub snapshot directory (<R>/models--X/snapshots/<rev>/, tree.h) and each
 * of its files is the file of its name there (a hub download's link into
 * blobs/, a shard beside its index): the hub repo, and its owner in
 * *owner, as for a model that is the snapshot directory; else NULL. An
 * index's shards are not beside the index's real path (blobs/HASH): the
 * generation has no resolved path, but has this tree (review rev180 F7).
 * The name alone makes it a repo, and needs no more: the owner is the
 * repo's own, so a snapshot a user made in another's repo (one writable
 * for all) is that other's tree, no sibling of hers (sibling_swap).
 *
 * The snapshot is the path's directory resolved after the files were
 * opened, which is not where they were opened: its owner could point the
 * path at another repo for the open and back at hers after it. So each
 * opened file must be at its place in the snapshot now, looked up from the
 * repo's directory, opened with no link followed, and its owner is that
 * directory's (fstat): the snapshot's entry a regular file or a link
 * ../../blobs/BLOB to the repo's own blob, never a link out of the repo,
 * which a stat(2) of the place followed (review rev185 F3: her snapshot's
 * absolute link to bob's 0600 blob, which the open had reached through
 * bob's repo, made bob's blob a file of her tree).
 */
static char *
hub_root(const struct load_request *q, uid_t *owner)
{
	char *dir = path_dir(q->path), *real = NULL, *root = NULL, *sub = NULL;
	struct stat st;
	int at, repo = -1, rev = -1;

	/* the directory's real path by the walk, never by name (a link renamed
	 * in since the load's walk may lead into a neighbour's FUSE mount) */
	if (dir != NULL)
		real = mountrule_realpath(NULL, dir[0] != '\0' ? dir : ".", NULL, 0);
	if (real == NULL || tree_split(real, &root, &sub) < 0)
		root = sub = NULL;
	at = sub != NULL && sub[0] != '\0' &&
		(repo = tree_open_dir_no_links(AT_FDCWD, root)) >= 0 &&
		(rev = tree_open_dir_no_links(repo, sub)) >= 0 && fstat(repo, &st) == 0;
	for (size_t i = 0; at && i < q->source.nfiles; i++) {
		const struct wc_file *f = &q->source.files[i];
		const char *name = strrchr(f->path, '/');

		at = is_hub_file_at(repo, rev, name != NULL ? name + 1 : f->path, &f->st);
	}
	if (at)
		*owner = st.st_uid;
	else {
		free(root);
		root = NULL;
	}
	if (rev >= 0)
		close(rev);
	if (repo >= 0)
		close(repo);
	free(sub);
	free(real);
	free(dir);
	return root;
}

/* Whether src's files are all uid's. */
static int
owned_by(const struct model_source *src, uid_t uid)
{
	for (size_t i = 0; i < src->nfiles; i++)
		if (src->files[i].st.st_uid != uid)
			return 0;
	return src->nfiles > 0;
}

/*
 * Whether the file q's path named as its files were opened, the one made at
 * a place (at_place), has an owner to tell: a shard index (its fstat as it
 * was read, model_source's index_st) or a model that is one file (its
 * file's), and that very file is at the place now: q->keep_place, found
 * in its directory opened with no link followed (a link renamed over a
 * directory component is followed by lstat(2), review rev187 R1), is
 * itself a regular file with the opened file's device and inode. Its
 * owner in *uid. The owner is asked of what was opened, never of a
 * stat(2) of the path afterwards (the path's owner could
 * rename a link to another user's file over it between the open and that
 * stat); and what was opened must itself be at the place after its open,
 * since the path is resolved at other moments than the open (before it,
 * realpath; after it, gen_resolved_path): a link to another user's index or
 * file renamed over the place only while it was opened, the user's own file
 * renamed back before and after, made that other user the "maker" (review
 * rev185 F1, F2). An inode at the place after its open was made there, or
 * put there by someone allowed to.
 */
static int
opened_owner(const struct load_request *q, uid_t *uid)
{
	const struct stat *o;
	const char *name = q->keep_place != NULL ? strrchr(q->keep_place, '/') : NULL;
	char *dir = name != NULL ? path_dir(q->keep_place) : NULL;
	int fd = dir != NULL ? tree_open_dir_no_links(AT_FDCWD, dir[0] != '\0' ? dir : "/") : -1;
	struct stat at;
	int ok;

	free(dir);
	if (q->source.format == FORMAT_SHARDED)
		o = &q->source.index_st;
	else if (q->source.nfiles == 1)
		o = &q->source.files[0].st;
	else
		o = NULL;
	ok = o != NULL && fd >= 0 && fstatat(fd, name + 1, &at, AT_SYMLINK_NOFOLLOW) == 0 &&
		S_ISREG(at.st_mode) && at.st_dev == o->st_dev && at.st_ino == o->st_ino;
	if (fd >= 0)
		close(fd);
	if (ok)
		*uid = o->st_uid;
	return ok;
}

/* Whether q's files are the file made at its place (q->keep_place) and
 * files of its maker only (opened_owner). */
static int
made_at_place(const struct load_request *q)
{
	uid_t maker;

	return q->resolved != NULL && strcmp(q->resolved, q->keep_place) == 0 &&
		opened_owner(q, &maker) && owned_by(&q->source, maker);
}

/*
 * Whether q, a watched reload of a model whose operator's load found
 * nothing at its path, opened its files in the tree of the directory that
 * holds the place that path named (q->keep_place): that directory, or its
 * hub repo (tree_split), and they are at that place (a file made there,
 * with files of its maker only: an index made there may name any file in
 * the directory, review rev182 F1; its maker the owner of the file as it
 * was opened, which is at the place still after its open, opened_owner),
 * or in a hub repo (which holds that repo's files only), or all the user's
 * who owned the directory the place was to be made in (keep_uid). A
 * directory holds other users' models too: a link at the place to another
 * user's file beside it waits for the operator's reload (review rev180
 * F5), as a link to another user's directory beside it does (sibling_swap).
 * Where others than its owner may write in the directory that existed
 * (first_comer 0: open_place), anyone could have been first at the place:
 * only that owner's files, in a tree of that owner's, are taken (review
 * rev187 R5).
 */
static int
at_place(const struct load_request *q, int first_comer)
{
	char *dir = q->keep_place != NULL ? path_dir(q->keep_place) : NULL, *root, *sub;
	int ok = dir != NULL && tree_split(dir, &root, &sub) == 0;

	if (ok) {
		ok = strcmp(q->root, root) == 0 &&
			((owned_by(&q->source, q->keep_uid) &&
				 (first_comer || q->root_uid == q->keep_uid)) ||
				(first_comer && (sub[0] != '\0' || made_at_place(q))));
		free(root);
		free(sub);
	}
	free(dir);
	return ok;
}

/*
 * Work queue thread, for an operator's load or reload: the tree it finds
 * (model_entry's operator_tree), from resolved, the realpath of its path
 * before its files are opened (NULL: the path did not resolve): its tree
 * root and the root's owner. A path that does not resolve (a model
 * configured before its files, or their directory, exist) gets the place
 * it names (place_of, found_place), the tree that place has as a model
 * directory (tree_split), and the owner of the deepest directory above it
 * that resolves: a sibling of that tree the same user owns is the
 * deployer's, as after a generation (sibling_swap), and a model that is
 * one file is taken at that place (at_place). A path that resolved but
 * whose tree cannot be told a moment later (renamed to and fro) is taken
 * as one that did not resolve (review rev204 H1). None when nothing above
 * it resolves: a reload wcached makes by itself then waits for the
 * operator's.
 */
static void
find_operator_tree(struct load_request *q, const char *resolved)
{
	char *sub;

	if (resolved != NULL)
		q->found_root = gen_tree_root(resolved, &q->found_uid);
	if (q->found_root != NULL)
		return;
	if ((q->found_place = place_of(q->path, &q->found_uid, &q->found_place_mode,
			  &q->found_place_dir_len)) != NULL &&
		tree_split(q->found_place, &q->found_root, &sub) == 0)
		free(sub);
	else
		q->found_root = NULL; /* tree_split failed: it freed both */
}

/* Whether two looks at a failed load's path (note_failed_path: its errno,
 * and its stat where it was there) saw it the same: the same inode,
 * unchanged since. */
static int
same_path_seen(int err1, const struct stat *st1, int err2, const struct stat *st2)
{
	if (err1 != 0 || err2 != 0)
		return err1 == err2;
	return st1->st_dev == st2->st_dev && st1->st_ino == st2->st_ino &&
		st1->st_mtim.tv_sec == st2->st_mtim.tv_sec &&
		st1->st_mtim.tv_nsec == st2->st_mtim.tv_nsec &&
		st1->st_ctim.tv_sec == st2->st_ctim.tv_sec &&
		st1->st_ctim.tv_nsec == st2->st_ctim.tv_nsec;
}

/* Work queue thread, after a load failed: the filesystem of its path (or
 * of the directory it should be in), and what a stat of the path sees, so
 * that the model is polled for the change that may mend it. Not q->fs: a
 * load refused later still closes its files in their filesystem's lane. */
static void
note_failed_path(struct load_request *q)
{
	char *dir = NULL, why[8];
	struct stat st = { 0 };
	int fd = mountrule_open(NULL, q->path, why, sizeof(why)), on_path = fd >= 0;

	/* One lookup of the path (none into a user's FUSE mount): its stat is
	 * what a poll compares with. */
	q->path_err = on_path ? 0 : -fd;
	if (!on_path && fd != -EXDEV && (dir = path_dir(q->path)) != NULL)
		fd = mountrule_open(NULL, dir[0] != '\0' ? dir : ".", why, sizeof(why));
	free(dir);
	q->path_noted = 1;
	if (fd >= 0) {
		q->path_known = fstype_of_fd(fd, &q->path_fs) == 0 && fstat(fd, &st) == 0;
		q->path_dev = st.st_dev;
		if (on_path && q->path_known)
			q->path_st = st;
		else if (on_path && fstat(fd, &q->path_st) == -1)
			q->path_err = errno;
		close(fd);
	}
}

/*
 * Work queue thread: whether the descriptors q's load keeps (its files,
 * their reopens for workers, its index, and the index's reopen gen_new
 * makes) stay below the reserve wcached keeps free for its clients
 * (registry_fd_reserve of r->fd_limit). Descriptors are given lowest
 * first, so one in the reserve means the load took the last ones outside
 * it: a 250-shard model would leave every new client refused (review
 * rev173 F9). 0, or -EMFILE with the message.
 */
static int
fd_room(struct load_request *q)
{
	rlim_t limit = q->r->fd_limit, reserve = registry_fd_reserve(limit);
	int top = q->index_fd;

	if (limit == 0 || limit == RLIM_INFINITY)
		return 0;
	for (size_t i = 0; i < q->source.nfiles; i++) {
		if (q->source.files[i].fd > top)
			top = q->source.files[i].fd;
		if (q->served_fds != NULL && q->served_fds[i] > top)
			top = q->served_fds[i];
	}
	if ((rlim_t)top + 1 < limit - reserve)
		return 0;
	return error_set(-EMFILE, "its %zu file%s took descriptors up to %d, into the %ju that "
		"wcached keeps free below its RLIMIT_NOFILE of %ju for its clients; raise "
		"LimitNOFILE= (or ulimit -n), or let workers release older generations "
		"(it is loaded again when one closes)",
		q->source.nfiles, q->source.nfiles == 1 ? "" : "s", top + 1, (uintmax_t)reserve,
		(uintmax_t)limit);
}

/* q found fd, its file named path, open for writing: q takes fd (a
 * descriptor of its own, read-only) and the file's real path, the one
 * opened whatever links path went through (a link in its own directory,
 * m.safetensors -> m-v2.safetensors, names m-v2's), for wait_for_writer. */
static void
note_busy(struct load_request *q, int fd, const char *path)
{
	char proc[32], real[PATH_MAX];
	ssize_t n;

	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	n = readlink(proc, real, sizeof(real) - 1);
	real[n > 0 ? n : 0] = '\0';
	q->busy_fd = fd;
	q->busy_path = strdup(real[0] == '/' ? real : path);
}

/*
 * Work queue thread, for a watched reload: has anyone a file q opened open
 * for writing now (q->writing)? Asked on the load's own descriptors, as
 * they are to serve, whatever event led here (a name's, a close's, lost
 * events, a poll): a generation made of a file still being written would
 * be modified in place by its next write, and serve nothing (review rev190
 * W1, rev192 W1'). A read lease (gen_lease_probe) is refused with EAGAIN while
 * any descriptor has the file open for writing; it needs the file's owner
 * or CAP_LEASE (EACCES otherwise; EINVAL where the filesystem has none),
 * q->writing_err then: the file is loaded as if nobody wrote it. Not
 * asked on a remote filesystem (q->fs): NFSv4 and SMB refuse a lease with
 * EAGAIN whenever the client holds no delegation or oplock, writer or not.
 * A lease taken is given back at once (a writer's open meanwhile waits
 * that long); it is asked for without waiting, so the loop may ask too
 * (written_now). The break's signal is SIGURG, which watch_start ignores,
 * not SIGIO, which would end the daemon. These descriptors are the load's
 * own, never a worker's nor a child's: a lease on a shared one would hold
 * its writers up to lease-break-time. Where the lease cannot be given
 * back, the load fails, and its descriptors, the lease's, are closed. A
 * file open for writing keeps a descriptor of its own (note_busy), which
 * the watch asks again until no writer is left (registry_writer_gone).
 */
static void
find_writer(struct load_request *q)
{
	if (q->fs.remote)
		return;
	for (size_t i = 0; i < q->source.nfiles && q->writing == 0; i++) {
		int fd = q->source.files[i].fd, stuck = 0, err = gen_lease_probe(fd, &stuck);

		if (stuck) {
			q->status = err;
			snprintf(q->message, sizeof(q->message), "%s: cannot give back the read "
				"lease that asked for its writers (fcntl F_SETLEASE F_UNLCK: %s): "
				"not loaded", q->source.files[i].path, strerror(-err));
			return;
		}
		if (err == -EAGAIN) {
			q->writing = i + 1;
			note_busy(q, fcntl(fd, F_DUPFD_CLOEXEC, 0), q->source.files[i].path);
		} else if (err < 0 && q->writing_err == 0) {
			q->writing_err = -err;
		}
	}
}

/* Whether uid owns files q, a watched reload, may load: its tree's owner,
 * or the owner of one of its newest generation's files (same_tree). */
static int
owner_kept(const struct load_request *q, uid_t uid)
{
	if ((q->keep_root != NULL || q->keep_place != NULL) && uid == q->keep_uid)
		return 1;
	if (q->keep_file_known && uid == q->keep_file_uid)
		return 1;
	for (size_t i = 0; i < q->nkeep_owners; i++)
		if (uid == q->keep_owners[i])
			return 1;
	return 0;
}

/* path_writer's question of fd (name, in the directory dir, or dir NULL:
 * the model's path itself), a descriptor of its own: a writer, and q
 * took fd (1), or not (0, fd closed). checked: probe_open opened fd, and
 * told already that it is a regular local file of an owner q takes. */
static int
probe_file(struct load_request *q, int fd, const char *dir, const char *name, bool checked)
{
	struct stat st;
	struct fs_info fs;
	char *path;
	int stuck = 0;

	if ((!checked && (fstat(fd, &st) == -1 || !S_ISREG(st.st_mode) ||
		!owner_kept(q, st.st_uid) || fstype_of_fd(fd, &fs) < 0 || fs.remote)) ||
		gen_lease_probe(fd, &stuck) != -EAGAIN) {
		close(fd);
		return 0;
	}
	path = dir != NULL ? path_join(dir, name) : NULL;
	note_busy(q, fd, path != NULL ? path : name);
	free(path);
	return 1;
}

/* Is a file named name in a directory a model's (what a directory model
 * or a shard index is made of)? */
static int
model_file_name(const char *name)
{
	return file_has_suffix(name, ".safetensors") ||
		file_has_suffix(name, ".safetensors.index.json");
}

/* The most files path_writer opens and asks about for one failed load, and
 * the most directory entries dir_writer reads (review rev200 L2). */
#define PATH_WRITER_FILES 4096
#define PATH_WRITER_ENTRIES (4 * PATH_WRITER_FILES)

/* How probe_open opens a file: read-only, beneath the directory, neither
 * through a link nor across a mount (review rev200 H1). */
#define PROBE_OPEN_FLAGS (O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY)
#define PROBE_RESOLVE (RESOLVE_BENEATH | RESOLVE_NO_XDEV | RESOLVE_NO_SYMLINKS | \
	RESOLVE_NO_MAGICLINKS)

/*
 * path_writer's open of name (a plain name) in the directory dfd, whose
 * device is dev: its descriptor, or -1 when it is not a regular file of
 * dfd's own filesystem whose owner the reload would take (owner_kept).
 * Asked before the open, and without a question to any filesystem server:
 * statx(2) with AT_STATX_DONT_SYNC answers from the inode's cached
 * attributes, and a file with another mount on it (a FUSE server a
 * neighbour mounted on his own file, allow_other, which never answers an
 * open) shows that mount's device. Then opened by openat2(2) with
 * RESOLVE_NO_XDEV, which refuses a mount crossed (EXDEV, at once) should a
 * mount appear in between; where the kernel has no openat2, by openat(2)
 * with O_NOFOLLOW, which such a mount, made between the statx and the
 * open, would still block: a race with a mount on a file of an owner the
 * reload takes, which only she (or root) may make. The descriptor's
 * fstat must be the file statx saw. A neighbour's file is never opened:
 * no lease asked, no oplock broken, no server asked (review rev200 H1).
 */
static int
probe_open(const struct load_request *q, int dfd, dev_t dev, const char *name)
{
	struct statx sx;
	struct stat st;
	int fd;

	if (strchr(name, '/') != NULL ||
		statx(dfd, name, AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT | AT_STATX_DONT_SYNC,
			STATX_TYPE | STATX_UID | STATX_INO, &sx) == -1 ||
		!S_ISREG(sx.stx_mode) || makedev(sx.stx_dev_major, sx.stx_dev_minor) != dev ||
		!owner_kept(q, sx.stx_uid))
		return -1;
	fd = tree_openat2(dfd, name, PROBE_OPEN_FLAGS, PROBE_RESOLVE);
	if (fd == -1 && errno == ENOSYS)
		fd = openat(dfd, name, PROBE_OPEN_FLAGS);
	if (fd >= 0 && (fstat(fd, &st) == -1 || st.st_dev != dev || st.st_ino != sx.stx_ino)) {
		close(fd);
		fd = -1;
	}
	return fd;
}

/* path_writer's directory dfd (taken), when its files may be asked:
 * dfd, its device in *dev; or -1 (dfd closed) where it is on a remote
 * filesystem (find_writer says why not there). */
static int
probe_dir(int dfd, dev_t *dev)
{
	struct stat st;
	struct fs_info fs;

	if (dfd >= 0 && (fstat(dfd, &st) == -1 || fstype_of_fd(dfd, &fs) < 0 || fs.remote)) {
		close(dfd);
		return -1;
	}
	if (dfd >= 0)
		*dev = st.st_dev;
	return dfd;
}

/* path_writer for the shards the shard index index_path names, in its
 * directory dfd (dir, its path; dev, its device): the files a load of it
 * opens (M1: another model's file beside it is not this model's writer),
 * at most PATH_WRITER_FILES of them. An index that cannot be read or
 * parsed names none (its own writer was asked first). */
static void
shards_writer(struct load_request *q, int dfd, dev_t dev, const char *dir,
	const char *index_path)
{
	struct shard_map map;

	if (shards_read_index(index_path, &map) < 0)
		return;
	for (size_t i = 0; i < map.nshards && i < PATH_WRITER_FILES && q->busy_fd < 0; i++) {
		int fd = probe_open(q, dfd, dev, map.shards[i]);

		if (fd >= 0)
			probe_file(q, fd, dir, map.shards[i], true);
	}
	shard_map_free(&map);
}

/* path_writer for the model files of the directory dfd (dir, its path;
 * dev, its device), when which file is its model cannot be told (no
 * model there, or too many): each a file of an owner the reload takes
 * (probe_open); the first open for writing answers. At most
 * PATH_WRITER_FILES files asked and PATH_WRITER_ENTRIES entries read
 * (review rev200 L2: others' files count toward the second only, so that
 * thousands of a neighbour's do not hide the owner's). Takes dfd. */
static void
dir_writer(struct load_request *q, int dfd, dev_t dev, const char *dir)
{
	DIR *d = fdopendir(dfd);
	struct dirent *e;
	unsigned asked = 0, entries = 0;

	if (d == NULL) {
		close(dfd);
		return;
	}
	while (q->busy_fd < 0 && asked < PATH_WRITER_FILES && entries++ < PATH_WRITER_ENTRIES &&
		(e = readdir(d)) != NULL) {
		int fd;

		if (!model_file_name(e->d_name) || (e->d_type != DT_REG && e->d_type != DT_UNKNOWN))
			continue;
		if ((fd = probe_open(q, dirfd(d), dev, e->d_name)) < 0)
			continue;
		asked++;
		probe_file(q, fd, dir, e->d_name, true);
	}
	closedir(d);
}

/* path_writer for the directory model dir (dfd, its descriptor, taken):
 * the model file the load opens there (shards_find_model), and when that
 * is a shard index, the shards it names; the directory's model files when
 * that cannot be told. */
static void
dir_model_writer(struct load_request *q, int dfd, const char *dir)
{
	char *model = NULL;
	bool is_index = false;
	dev_t dev = 0;
	int fd;

	if ((dfd = probe_dir(dfd, &dev)) < 0)
		return;
	if (shards_find_model(dir, &model, &is_index) < 0) {
		dir_writer(q, dfd, dev, dir);
		return;
	}
	/* An index of an owner the reload does not take is not read. */
	fd = probe_open(q, dfd, dev, file_basename(model));
	if (fd >= 0 && !probe_file(q, fd, dir, file_basename(model), true) && is_index)
		shards_writer(q, dfd, dev, dir, model);
	close(dfd);
	free(model);
}

/*
 * Work queue thread: q, a watched reload, could not open or validate its
 * files: is that because one is being written? A file rewritten from its
 * start (cp, shutil.copyfile, safetensors' save_file or torch.save onto
 * the path: O_TRUNC, then its bytes in order) is short, or its header
 * points past its end, until its writer is done: that is no error to
 * report (an ERROR line and the model's error, while the file is only
 * being written: review rev194 MEDIUM-2) but a file open for writing,
 * answered as find_writer's (wait_for_writer). Asked of the file path
 * names, and of the files a load of it opens: a shard index's shards (not
 * every model file beside it: another model's writer would hide this
 * one's error, review rev200 M1), a directory model's model file (and its
 * index's shards), or, where the directory holds no model or too many,
 * its model files. Each a regular file on the directory's own local
 * filesystem, opened read-only, and only a file whose owner the reload
 * would take (owner_kept), which is asked before the open (probe_open):
 * no lease on someone else's file, and no open of a neighbour's mount
 * (review rev200 H1).
 */
static void
path_writer(struct load_request *q)
{
	struct stat st;
	char *dir = NULL;
	int fd = open(q->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY), dfd = -1;
	dev_t dev = 0;

	if (fd < 0 || fstat(fd, &st) == -1) {
		if (fd >= 0)
			close(fd);
		return;
	}
	if (S_ISDIR(st.st_mode)) {
		dir_model_writer(q, fd, q->path);
		return;
	}
	if (probe_file(q, fd, NULL, q->path, false) ||
		!file_has_suffix(q->path, ".safetensors.index.json") ||
		(dir = path_dir(q->path)) == NULL)
		return;
	dfd = probe_dir(open(dir[0] != '\0' ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC),
		&dev);
	if (dfd >= 0) {
		shards_writer(q, dfd, dev, dir, q->path);
		close(dfd);
	}
	free(dir);
}

/*
 * Work queue thread: open, validate, compile, seal; and note the source's
 * filesystem, from which the loop decides whether to stage it, and in
 * whose lane its files close (closer.h) however the load ends: a remote
 * model's never wait in the local one (review rev177 A). The holes of its
 * files are counted here, off the loop, but refused, as its descriptors
 * are, only where the load keeps them (keeps_room). A watched reload asks
 * whether its files are being written (find_writer), and, when they
 * could not be opened or validated, whether that is why (path_writer).
 */
static void
load_work(struct workq_job *w)
{
	struct load_request *q = w->arg;
	struct gen_found_tree found = { .operators = q->reload != RELOAD_WATCHED };
	char *resolved, why[sizeof(q->message)] = "";
	int fd = mountrule_open(NULL, q->path, why, sizeof(why));

	/* A user's FUSE mount on the path, or a walk that failed however
	 * (where stat(2) would have, and where it would not: a chain of links
	 * longer than the walk follows): refused, with the walk's reason; the
	 * path is not opened by name, which would ask the server the walk did
	 * not judge (review rev207 H2). An operator's load that failed so
	 * still records the place its path names (review rev204 H1). */
	if (fd < 0) {
		if (why[0] == '\0')
			snprintf(why, sizeof(why), "%s: %s", q->path, strerror(-fd));
		q->status = error_set(fd, "%s", why);
		snprintf(q->message, sizeof(q->message), "%s", why);
		if (fd != -EXDEV && q->reload != RELOAD_WATCHED)
			find_operator_tree(q, NULL);
		note_failed_path(q);
		return;
	}
	q->opened_known = fstat(fd, &q->opened_st) == 0; /* what the walk found */
	/* Its real path: the kernel's name for what the walk reached, read
	 * from that very descriptor; a realpath(3) of the path looked it up
	 * by name again, where a neighbour may have renamed a link to his
	 * FUSE mount in since the walk, and waited on his server for good.
	 * None (a name that cannot be told): as realpath's failure was. */
	resolved = mountrule_fd_realpath(NULL, fd, q->path, NULL, 0);
	close(fd);
	if (q->reload != RELOAD_WATCHED)
		find_operator_tree(q, resolved);
	if ((q->status = open_model(q, q->path)) < 0) {
		free(resolved);
		snprintf(q->message, sizeof(q->message), "%s", error_get());
		if (q->reload == RELOAD_WATCHED)
			path_writer(q);
		note_failed_path(q);
		return;
	}
	gen_source_fs(&q->source, &q->fs);
	q->resolved = gen_resolved_path(q->path, resolved, &q->source, NULL, &found);
	q->files_dir_known = q->resolved != NULL && found.dir_known;
	q->link_unchecked = found.link_unchecked;
	q->files_dev = found.dir_dev;
	q->files_ino = found.dir_ino;
	q->files_uid = found.dir_uid;
	q->files_gid = found.dir_gid;
	q->files_mode = found.dir_mode;
	/* The tree's root and owner as the files were found beneath it (its
	 * descriptor), not a later stat of its path (review rev187 R2). */
	if ((q->root = hub_root(q, &q->root_uid)) == NULL && q->resolved != NULL) {
		q->root = found.root;
		q->root_uid = found.uid;
		q->root_known = found.root_known;
		q->root_dev = found.root_dev;
		q->root_ino = found.root_ino;
		found.root = NULL;
	}
	free(found.root);
	if (q->reload == RELOAD_WATCHED)
		q->tree_status = same_tree(q);
	else
		/* The links its generation goes through; refused only where
		 * its walk met a mount it does not cross. */
		q->tree_status = check_links(q);
	if (q->tree_status == 0)
		q->tree_status = linked_in(q);
	if (q->tree_status < 0) {
		note_failed_path(q);
		return; /* load_after: "unchanged", or refused */
	}
	if (q->reload == RELOAD_WATCHED)
		find_writer(q);
	if (q->status < 0) {
		note_failed_path(q);
		return;
	}
	if ((q->holes = gen_check_holes(&q->source)) < 0) {
		snprintf(q->message, sizeof(q->message), "%s", error_get());
		note_failed_path(q);
	}
}

/*
 * After a staging failed (work queue thread), or a load refused on the
 * loop once validated (load_failed): where its path is, as it was when
 * the load opened it (before the copy began), so that a poll sees a
 * replacement made during the copy (the copy fails "replaced during the
 * copy") as the change that mends it; what the path names now would look
 * unchanged, and the model would never load. 0 where the load never
 * stat'ed its path: off the loop it looks now (note_opened_path).
 */
static int
note_opened_stat(struct load_request *q)
{
	if (!q->opened_known)
		return 0;
	q->path_known = 1;
	q->path_err = 0;
	q->path_dev = q->opened_st.st_dev;
	q->path_st = q->opened_st;
	return 1;
}

static void
note_opened_path(struct load_request *q)
{
	if (!note_opened_stat(q))
		note_failed_path(q);
}

/* Drops what q opened of the model it loaded: its files, served
 * descriptors and index. */
static void
drop_opened(struct load_request *q)
{
	if (q->index != NULL)
		munmap((void *)q->index, q->index_size);
	q->index = NULL;
	if (q->index_fd >= 0)
		close(q->index_fd);
	q->index_fd = -1;
	files_acl_free(q);
	gen_close_files(q->r, &q->fs, q->served_fds, &q->source);
	q->served_fds = NULL;
}

/* Notes where q's source files came from (path and stat at open), for the
 * staged generation's origin. */
static int
note_origin(struct load_request *q)
{
	size_t n = q->source.nfiles;

	if ((q->origin = calloc(n ? n : 1, sizeof(*q->origin))) == NULL)
		return error_set(-ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		if ((q->origin[i].path = strdup(q->source.files[i].path)) == NULL)
			return error_set(-ENOMEM, "out of memory");
		q->origin[i].st = q->source.files[i].st;
		q->norigin = i + 1;
	}
	return 0;
}

/*
 * Work queue thread, for a model that stages: copies the validated source
 * to stage_dir (stage_copy checks space, reads and that nothing changed),
 * then opens and validates the copy as the model; the source is closed.
 * On failure nothing is left in stage_dir, unless wcached stops while the
 * copy that failed its validation is removed: the stop ends that removal
 * at its next file (the next start's sweep removes the rest), as it ends
 * the removal of a closed generation's copy (gen_free_staged).
 */
static void
stage_work(struct workq_job *w)
{
	struct load_request *q = w->arg;
	int err;

	q->stage.files = q->source.files;
	q->stage.nfiles = q->source.nfiles;
	q->stage.index_st = q->source.format == FORMAT_SHARDED ? &q->source.index_st : NULL;
	if ((q->status = stage_copy(&q->stage)) < 0 || (q->status = note_origin(q)) < 0) {
		snprintf(q->message, sizeof(q->message), "%s", error_get());
		note_opened_path(q);
		return;
	}
	drop_opened(q);
	/* The source's descriptors close on a lane thread, later: the copy's
	 * may be taken above them, so they are checked again (review rev177
	 * C). */
	if ((q->status = open_model(q, q->stage.path)) == 0 && (q->status = fd_room(q)) < 0)
		q->room_refused = 1;
	if (q->status < 0) {
		snprintf(q->message, sizeof(q->message), "the staged copy in %s: %s", q->stage.dir,
			error_get());
		drop_opened(q);
		if ((err = stage_remove_until_stop(q->stage.dir, &q->r->closing)) == -ECANCELED)
			log_info("%s", error_get());
		else if (err < 0)
			log_warnx("%s", error_get());
		stage_request_clear(&q->stage);
		note_opened_path(q);
	}
}

/*
 * Frees q and what it holds. A staged copy no generation took (its model
 * unloaded, a newer load superseded it, or wcached is stopping) is removed
 * on the work queue: a stop ends that removal at its next file, and the
 * next start's sweep removes the rest (the copy keeps its marker; no
 * generation keeps it from the sweep). So does a copy the stop itself
 * frees (a staging that ended as wcached stops): like a staging the stop
 * cuts short, it is left to the next start rather than holding the stop
 * for every unlink. Only the copies of the generations that served, which
 * the stop closes, are removed whole (gen_free_staged).
 */
static void
load_request_free(struct load_request *q)
{
	drop_opened(q);
	if (q->stage.dir != NULL) {
		stage_remove_later(q->r->loop, q->stage.dir, &q->r->closing, q->r->stage_dir);
		q->stage.dir = NULL;
	}
	stage_request_clear(&q->stage);
	gen_free_origin(q->origin, q->norigin);
	free(q->resolved);
	free(q->root);
	free(q->keep_root);
	free(q->keep_resolved);
	free(q->keep_place);
	free(q->keep_owners);
	free(q->keep_files);
	free(q->keep_links);
	free(q->links);
	free(q->named_path);
	free(q->found_root);
	free(q->found_place);
	free(q->stage_dir);
	if (q->busy_fd >= 0)
		closer_unmap_close(q->r->closer, CLOSER_LOCAL, NULL, 0, q->busy_fd);
	free(q->busy_path);
	free(q->waited);
	free(q->name);
	free(q->path);
	free(q);
}

/*
 * Same files (the same inodes) as generation g? A reload serves new inodes
 * only: files are replaced by rename(2), and an inode written in place is
 * the modified generation's, not a new one. On a remote filesystem an inode
 * number says less: another host's server may give a freed number to the
 * file that replaced it, so there the size and mtime must match too. A
 * staged generation compares its origin, size, mtime and ctime included:
 * its copy is not hurt by a write in place, so a source written since it
 * was copied is staged again, even one whose writer kept its size and put
 * its mtime back (cp -p over it writes it in place; rm then cp -p may get
 * the freed inode number back): the ctime moves either way.
 */
static int
same_inodes(const struct generation *g, const struct model_source *s)
{
	if (g == NULL || g->source.nfiles != s->nfiles ||
		(g->origin != NULL && g->norigin != s->nfiles))
		return 0;
	for (size_t i = 0; i < s->nfiles; i++) {
		const struct stat *a = g->origin != NULL ?
				       &g->origin[i].st : &g->source.files[i].st,
				  *b = &s->files[i].st;

		if (a->st_dev != b->st_dev || a->st_ino != b->st_ino)
			return 0;
		if ((g->origin != NULL || g->fs.remote) &&
			(a->st_size != b->st_size || a->st_mtim.tv_sec != b->st_mtim.tv_sec ||
				a->st_mtim.tv_nsec != b->st_mtim.tv_nsec))
			return 0;
		if (g->origin != NULL && (a->st_ctim.tv_sec != b->st_ctim.tv_sec ||
					  a->st_ctim.tv_nsec != b->st_ctim.tv_nsec))
			return 0;
	}
	return 1;
}

/* Does m's load q copy its files to stage_dir first (stage = yes, or auto
 * on a remote filesystem)? Loop thread, once the source is validated. */
static int
wants_stage(const struct model_entry *m, const struct load_request *q)
{
	return !q->staged && registry_stages(m, &q->fs);
}

/*
 * Does generation g serve what a reload q of its files would make now:
 * the same files (same_inodes), staged or not as m's stage key says for
 * their filesystem? A generation a warm restart kept from before its stage
 * key changed, or one staged under stage = auto on a filesystem that no
 * longer reads as remote, is not: a reload of it stages the files (or
 * serves them where they are) rather than answering "unchanged".
 */
static int
same_files(const struct model_entry *m, const struct generation *g,
	const struct load_request *q)
{
	return same_inodes(g, &q->source) && (g->origin != NULL) == registry_stages(m, &q->fs);
}

/* Has each of q's files the size and mtime g's had when opened? */
static int
same_sizes_mtimes(const struct generation *g, const struct load_request *q)
{
	for (size_t i = 0; i < q->source.nfiles; i++) {
		const struct stat *a = &g->source.files[i].st, *b = &q->source.files[i].st;

		if (a->st_size != b->st_size || a->st_mtim.tv_sec != b->st_mtim.tv_sec ||
			a->st_mtim.tv_nsec != b->st_mtim.tv_nsec)
			return 0;
	}
	return 1;
}

/*
 * Is q the operator's reload of m's current generation, modified in place
 * (generation.c), whose files (same_files) kept the size and mtime they had
 * when opened? Only their ctime moved then: a chmod or chown (even one that
 * changes nothing), or a write whose writer put the mtime back, which
 * wcached cannot tell apart. At the operator's word they are loaded again,
 * validated anew, as a new generation (logged by log_reloads_modified when
 * it is made), rather than only after a rewrite and rename of every file
 * (review rev181 F12). A write that moved a size or mtime stays refused
 * (rename(2) is the way), and a watched reload never does this: that the
 * files changed is all wcached saw. A predicate only: load_after asks it
 * where it decides, and logs where it acts on the answer.
 */
static int
reloads_modified(const struct model_entry *m, const struct load_request *q)
{
	const struct generation *g = m->current;

	/* (A staged generation's source written since its copy is not
	 * same_files: it is staged again, below.) */
	if (q->reload != RELOAD_OPERATOR || g == NULL || g->state != GEN_MODIFIED ||
		g->origin != NULL || !same_files(m, g, q))
		return 0;
	return same_sizes_mtimes(g, q);
}

/*
 * Is q the reload that loads m's current generation's files again after a
 * links-only move (generation.c's gen_note_relinked: q->revalidate names
 * it), finding the same files (same_files) with their sizes and mtimes?
 * A link added or removed beside a file cannot be told from a write with
 * its mtime put back, so the index is compiled anew from the bytes on
 * disk and compared (load_after): the same, the generation keeps serving
 * and takes the new fstats (no new generation: derived artifacts and
 * subscribers are keyed by it, and a neighbour's ln/rm loop would rebuild
 * them); else a new generation is made of the same inodes.
 */
static int
reloads_relinked(const struct model_entry *m, const struct load_request *q)
{
	const struct generation *g = m->current;

	return q->revalidate != 0 && g != NULL && g->number == q->revalidate &&
		gen_attachable(g) && g->origin == NULL && same_files(m, g, q) &&
		same_sizes_mtimes(g, q);
}

/* The one line of an operator's reload that loads a modified generation's
 * files again (reloads_modified), as its new generation is made. */
static void
log_reloads_modified(const struct model_entry *m)
{
	log_info("model \"%s\": generation %" PRIu64 " was modified in place, its files' "
		 "sizes and mtimes unchanged (a chmod or chown moves only the ctime); the "
		 "operator's reload loads its files again, validated anew, as a new generation",
		m->name, m->current->number);
}

static void take_resolved(struct generation *g, struct load_request *q);
static void refusal_decided(struct model_entry *m);

/*
 * load_after: q reloaded m's current generation g's files after a
 * links-only move (reloads_relinked). Its index the same bytes as g's
 * (the index holds no stat, client/format/index.h): g keeps serving and
 * takes q's fstats as its own (gen_adopt_stats), answered, 1. Else (a
 * header written in place, its mtime put back) one warning and 0: the
 * caller installs q as generation N+1 of the same inodes; N's holders keep
 * N. A write after q opened the files moves the ctime past the adopted
 * fstat with the link count unchanged: the next check marks g modified.
 */
static int
revalidated_same(struct registry *r, struct model_entry *m, struct load_request *q)
{
	struct generation *g = m->current;

	(void)r;
	if (q->index_size != g->index_size || memcmp(q->index, g->index, q->index_size) != 0) {
		log_warnx("model \"%s\": generation %" PRIu64 "'s %s was written in place (its "
			  "header changed, its mtime put back); its files are loaded again, "
			  "validated anew, as generation %" PRIu64, m->name, g->number,
			file_basename(g->source.files[g->relink_asked ? g->relinked_i : 0].path),
			m->last_generation + 1);
		return 0;
	}
	gen_adopt_stats(g, &q->source);
	if (q->tree_status == 0)
		take_resolved(g, q);
	free(m->error);
	m->error = NULL;
	refusal_decided(m);
	if (g->relink_asked)
		log_info("model \"%s\": generation %" PRIu64 ": its files, loaded again after a "
			 "link count change, validated anew: unchanged", m->name, g->number);
	g->relink_asked = 0;
	m->revalidate = 0;
	if (q->done != NULL)
		q->done(0, "unchanged, validated anew", g->number, q->arg);
	return 1;
}

/*
 * load_after, for the newest load q of m: a revalidation q carried
 * (q->revalidate) is answered, whatever q found: the generation it named
 * may be asked again (a links-only move seen again: the fstats were not
 * adopted, as for a replacement that failed, then paced).
 */
static void
relink_answered(struct model_entry *m, const struct load_request *q)
{
	if (q->revalidate == 0 || m->revalidate != q->revalidate)
		return;
	m->revalidate = 0;
	if (m->current != NULL && m->current->number == q->revalidate)
		m->current->relink_asked = 0;
}

/*
 * load_failed: q carried the revalidation of m's current generation g
 * after a links-only move, and failed. Where the failure is its file's
 * content (a parser's verdict: EINVAL, EBADMSG, EPROTO, E2BIG, ERANGE,
 * EFBIG, ENOTSUP; not a refusal, a missing path, a lack of room or memory,
 * nor an I/O error a remote filesystem may answer for a while: review
 * rev227 L1), g is one file, and the path names what g opened (its dev,
 * inode, size and mtime: not its ctime, which a link moves), the file
 * serving no longer validates: g is marked modified (fail closed). Else g
 * keeps serving, as after any failed replacement: another, broken file
 * renamed over the path of a linked file; and for a model of several files
 * the configured path (the shard index, the directory) says nothing of
 * which file failed: a broken shard renamed over a linked one marked g
 * modified (review rev227 M2).
 */
static void
relink_failed(struct registry *r, struct model_entry *m, const struct load_request *q)
{
	struct generation *g = m->current;
	const struct stat *a = g != NULL ? &g->opened_path.st : NULL, *b = &q->path_st;
	int e = -q->status;

	if (q->revalidate == 0 || g == NULL || g->number != q->revalidate ||
		!gen_attachable(g) || q->room_refused || q->tree_status < 0 ||
		q->busy_path != NULL || (e != EINVAL && e != EBADMSG && e != EPROTO &&
			e != E2BIG && e != ERANGE && e != EFBIG && e != ENOTSUP) ||
		g->source.nfiles != 1 || g->source.format == FORMAT_SHARDED ||
		!q->path_known || !g->opened_path.known ||
		a->st_dev != b->st_dev || a->st_ino != b->st_ino || a->st_size != b->st_size ||
		a->st_mtim.tv_sec != b->st_mtim.tv_sec || a->st_mtim.tv_nsec != b->st_mtim.tv_nsec)
		return;
	log_warnx("model \"%s\": generation %" PRIu64 "'s files no longer validate (loaded "
		  "again after a link count change: %s)", m->name, g->number, q->message);
	gen_mark_modified(r, g, g->source.files[g->relink_asked ? g->relinked_i : 0].path);
}

/* The info line of a staged generation, or the warning of a remote one
 * served where it is (stage = no: the operator took the risk). */
static void
log_staging(const struct model_entry *m, const struct generation *g, const struct load_request *q)
{
	if (q->staged) {
		double mb = (double)q->stage.bytes / 1e6;
		double secs = q->stage.seconds;
		double gib = (double)q->stage.bytes / (1024.0 * 1024.0 * 1024.0);

		if (gib >= 0.1)
			log_info("model \"%s\": generation %" PRIu64 " staged from %s to %s "
				 "(%.1f GiB in %.1f s, %.0f MB/s)", m->name, g->number,
				q->fs.name, g->staged.dir, gib, secs, secs > 0 ? mb / secs : 0.0);
		else
			log_info("model \"%s\": generation %" PRIu64 " staged from %s to %s "
				 "(%.1f MB in %.3f s, %.0f MB/s)", m->name, g->number,
				q->fs.name, g->staged.dir, mb, secs, secs > 0 ? mb / secs : 0.0);
	} else if (q->fs.remote && m->stage == FS_STAGE_NO) {
		log_warnx("model \"%s\": generation %" PRIu64 " served from %s without staging "
			  "(stage = no): a replacement made on another host can make workers' "
			  "reads of older generations fail with SIGBUS", m->name, g->number,
			q->fs.name);
	}
}

/* Loop thread: g, made or found unchanged by q, answers to what the
 * model's path resolves to now (for one unchanged: a symbolic link renamed
 * over to another directory of the same files, hub snapshots sharing every
 * blob), in the tree found then, or to nothing when that could not be told;
 * and goes through the links q's walk went through, when it ended at the
 * files (check_links; else those it had, if any). */
static void
take_resolved(struct generation *g, struct load_request *q)
{
	/* What its path named, told by the real path under its tree (a
	 * file straight in it: registry_file_in), kept with them and
	 * recorded in the store (generation.h's path_named). */
	g->path_named = q->resolved == NULL || q->root == NULL ||
			!path_under(q->resolved, q->root) ? GEN_NAMED_UNTOLD :
		registry_file_in(q->resolved, q->root) ? GEN_NAMED_FILE : GEN_NAMED_DIR;
	free(g->resolved_path);
	g->resolved_path = q->resolved;
	q->resolved = NULL;
	free(g->tree_root);
	g->tree_root = q->root;
	g->tree_uid = q->root_uid;
	g->tree_ino_known = q->root_known;
	g->tree_dev = q->root_dev;
	g->tree_ino = q->root_ino;
	q->root = NULL;
	if (q->links_known > 0) {
		free(g->links);
		g->links = q->links;
		g->nlinks = q->nlinks;
		q->links = NULL;
	}
}

/* Loop thread: an operator's load or reload q of path, m's configured
 * path, ended (failed or not, unless superseded): the tree it found is
 * what m's watched reloads keep while no generation records one. Taken
 * once: load_after, or install for a load of a new path (one that failed
 * leaves the configured path's). */
static void
take_operator_tree(struct model_entry *m, struct load_request *q, const char *path)
{
	if (q->reload == RELOAD_WATCHED || q->found_taken || strcmp(path, m->path) != 0)
		return;
	q->found_taken = 1;
	free(m->operator_tree.root);
	free(m->operator_tree.place);
	m->operator_tree.root = q->found_root;
	m->operator_tree.place = q->found_place;
	m->operator_tree.uid = q->found_uid;
	m->operator_tree.place_mode = q->found_place_mode;
	m->operator_tree.place_dir_len = q->found_place_dir_len;
	m->operator_tree.root_known = 0; /* a warm restart's record is superseded */
	registry_kept_clear(&m->operator_tree.kept);
	/* A tree found (not a place): where the load failed, it found files
	 * there, and whose they were tells nothing of whose a later file at
	 * its path is (review rev209 H1). So too while a generation serves:
	 * operator_tree is read only once none does, and a withdrawn
	 * generation's owners are kept then (registry_withdraw; this where
	 * they could not be: review rev210 L2). A load that succeeded made
	 * the generation newest, which a watched reload keeps instead. */
	m->operator_tree.owners_untold = q->found_root != NULL && q->found_place == NULL ?
		OWNERS_UNTOLD_FAILED_LOAD : 0;
	q->found_root = NULL;
	q->found_place = NULL;
}

static void load_failed(struct registry *r, struct model_entry *m, struct load_request *q);

/*
 * Loop thread, before q's load keeps its descriptors (a generation made of
 * them, or its source held while a copy is staged): refused when its files
 * are sparse (load_work's holes) or its descriptors reach into the reserve
 * (fd_room; a staged copy's are checked by stage_work). Only here: a
 * reload whose files are unchanged keeps none, and answers "unchanged"
 * whatever the descriptors in use (review rev177 B). 0, or -errno with
 * q->message.
 */
static int
keeps_room(struct load_request *q)
{
	if (q->holes < 0)
		return q->status = q->holes;
	if ((q->status = fd_room(q)) < 0) {
		snprintf(q->message, sizeof(q->message), "%s", error_get());
		q->room_refused = 1;
		note_opened_stat(q);
	}
	return q->status;
}

/* m's refusal by the model-tree rules (m->refused_tree) is decided: the
 * operator loaded or reloaded the model, or a generation of the files at
 * its path now was made or found serving. */
static void
refusal_decided(struct model_entry *m)
{
	m->refused_tree = 0;
	free(m->refused_line);
	m->refused_line = NULL;
}

/* q, a watched reload of m, was refused by the model-tree rules: its line
 * is kept (m->refused_line, for status), and the files wait for the
 * operator's word (review rev195 M1). Only same_tree's refusals (-EXDEV)
 * wait for it: linked_in's (-EPERM) are made at her reload too, and a
 * walk that failed (check_links) is tried again at the next change
 * (review rev198 L4, L1). */
static void
note_refused(struct model_entry *m, const struct load_request *q)
{
	if (q->reload != RELOAD_WATCHED || q->tree_status != -EXDEV)
		return; /* the operator's own load: nothing waits for her */
	free(m->refused_line);
	m->refused_line = strdup(q->message);
	m->refused_tree = 1;
}

/* Loop thread: turns a validated load into a generation of its model, if
 * it keeps room (keeps_room; a staged copy's was checked as it opened). */
static void
install(struct registry *r, struct model_entry *m, struct load_request *q)
{
	struct generation *g;
	char msg[256];

	if (!q->staged && keeps_room(q) < 0) {
		load_failed(r, m, q);
		return;
	}
	g = gen_new(r, m->name, m->last_generation + 1, &q->source, q->served_fds, q->index_fd,
		q->index, q->index_size);
	if (g == NULL) {
		/* A failed load like any other: logged, kept as the model's
		 * error, and answered with its reason. */
		q->status = -errno;
		snprintf(q->message, sizeof(q->message), "%s", error_get());
		load_failed(r, m, q);
		return;
	}
	q->served_fds = NULL;
	q->index_fd = -1;
	q->index = NULL;
	/* The source's filesystem, as load_work found it off the loop (for a
	 * staged generation: the origin's, not the copy's). */
	g->fs = q->fs;
	g->opened_path.known = q->opened_known;
	g->opened_path.st = q->opened_st;
	take_resolved(g, q);
	if (q->staged) {
		g->origin = q->origin;
		g->norigin = q->norigin;
		q->origin = NULL;
		q->norigin = 0;
		g->staged.dir = q->stage.dir;
		q->stage.dir = NULL;
		g->staged.bytes = q->stage.bytes;
		g->staged.disk_bytes = q->stage.disk_bytes;
		g->staged.seconds = q->stage.seconds;
	}
	registry_link(r, m, g);

	free(m->path);
	m->path = q->path;
	q->path = NULL;
	take_operator_tree(m, q, m->path); /* a load of a new path */
	/* The pin the load was asked with, unless a pin or unpin came since
	 * (registry_pin): that is newer, and stays. Either way g's pages get
	 * m->pin: its metadata locked now, off the loop (a header not in
	 * memory is read, from a remote server when served where it lies),
	 * every page when it becomes current (gen_promote) or, current
	 * already, when warm (warm_done). */
	if (m->pin_seq == q->pin_seq)
		m->pin = q->pin;
	m->warm = q->warm;
	free(m->error);
	m->error = NULL;
	refusal_decided(m);
	if (m->pin != PIN_NONE)
		gen_queue_pages(r, g, PAGE_PIN_METADATA);

	if (m->pending != NULL) {
		/* A newer replacement supersedes one still warming. */
		struct generation *old = m->pending;

		m->pending = NULL;
		gen_cancel_warming(r, old);
		gen_maybe_free(r, old);
	}
	log_info("model \"%s\": generation %" PRIu64 " from %s: %zu file%s, %" PRIu64 " bytes",
		m->name, g->number, m->path, g->source.nfiles, g->source.nfiles == 1 ? "" : "s",
		g->bytes);
	if (q->reload == RELOAD_WATCHED && q->keep_place != NULL) {
		/* Taken by itself where nothing was: say whose files (rev187 R5). */
		char owners[300];

		log_info("model \"%s\": generation %" PRIu64 " is the first at %s, where the "
			"operator's last load found nothing: its files are owned by %s", m->name,
			g->number, q->keep_place, owners_said(&g->source, g->origin, owners,
				sizeof(owners)));
	}
	log_staging(m, g, q);
	if (m->warm && r->pool != NULL)
		gen_start_warming(r, g);
	else
		gen_set_state(g, GEN_READY, m->warm ? "no warm pool" : "the model does not warm");
	if (m->current == NULL || m->current->state == GEN_FAILED || g->state == GEN_READY) {
		/* A first generation serves at once, warm or not; so does the
		 * replacement of one that failed while warming, which serves
		 * nothing meanwhile. */
		m->pending = g;
		gen_promote(r, m, g);
	} else {
		m->pending = g;
	}
	snprintf(msg, sizeof(msg), "generation %" PRIu64 " %s", g->number,
		m->current == g ? "is current" : "is warming and becomes current when warm");
	if (q->done != NULL)
		q->done(0, msg, g->number, q->arg);
	if (r->changed != NULL)
		r->changed(r);
}

static int queue_load(struct registry *r, const char *name, const char *path,
	enum pin_mode pin, int warm, enum reload_kind reload, registry_done_fn done, void *arg);
static void load_after(struct workq_job *w, int status);

/*
 * What still serves m after one of its loads failed, for the line that
 * says so: its current generation when attachable; otherwise nothing, and
 * why (its current generation was modified in place, or failed while
 * warming, and refuses every attach), and the replacement that will serve
 * once warm, if one warms. Into buf of len bytes.
 */
static const char *
still_served(const struct model_entry *m, char *buf, size_t len)
{
	const struct generation *g = m->current;
	char next[80] = "";

	if (g != NULL && gen_attachable(g)) {
		snprintf(buf, len, "generation %" PRIu64 " still serving", g->number);
		return buf;
	}
	if (m->pending != NULL)
		snprintf(next, sizeof(next), " until generation %" PRIu64 " is warm",
			m->pending->number);
	if (g == NULL)
		snprintf(buf, len, "not served%s", next);
	else if (g->state == GEN_MODIFIED)
		snprintf(buf, len, "not served%s: generation %" PRIu64 " was modified in place",
			next, g->number);
	else if (g->state == GEN_FAILED && g->gone != NULL)
		snprintf(buf, len, "not served%s: generation %" PRIu64 "'s files are gone from "
			"the server", next, g->number);
	else if (g->state == GEN_FAILED)
		snprintf(buf, len, "not served%s: generation %" PRIu64 " failed while warming",
			next, g->number);
	else
		snprintf(buf, len, "not served%s: generation %" PRIu64 " is %s", next, g->number,
			gen_state_name(g->state));
	return buf;
}

/* A load that failed (q->status, q->message): counted, logged once, and
 * kept as the model's error. */
static void
load_failed(struct registry *r, struct model_entry *m, struct load_request *q)
{
	char served[160];

	m->load_errors++;
	/* Refused on the loop after a validation that worked (staging could
	 * not start, or its generation could not be made): the path's own
	 * stat as the load opened it (note_opened_stat), a directory's or a
	 * shard index's too, which the watch armed again compares the path
	 * with. Not one of its files' (a directory, an index, or a staged
	 * copy's file never matched: the model was always reloaded). Never
	 * told: unknown, and no lookup on the loop; the watch then takes
	 * nothing for a change. */
	if (!q->path_known && !q->path_noted)
		note_opened_stat(q);
	relink_failed(r, m, q);
	/* Only a load of the path its watches are on: the operator's load of
	 * another path that failed leaves them as they are, and a stat of
	 * that path is nothing to compare the model's own with (the re-arm
	 * took the model's file for changed, and reloaded it). */
	if (strcmp(q->path, m->path) == 0)
		m->watch_rearm = m->error == NULL || !m->failed_path.known || !q->path_known ||
			!same_path_seen(m->failed_path.err, &m->failed_path.st, q->path_err,
				&q->path_st);
	m->failed_path.known = q->path_known;
	m->failed_path.fs = q->path_noted ? q->path_fs : q->fs;
	m->failed_path.dev = q->path_dev;
	m->failed_path.err = q->path_err;
	m->failed_path.st = q->path_st;
	/* Refused for descriptors: loaded again, as a reload wcached makes by
	 * itself, once a generation closes (registry_reload_held). A load of
	 * another path than the configured one is not (review rev177 F). */
	m->room_wait = q->room_refused && strcmp(q->path, m->path) == 0;
	free(m->error);
	m->error = strdup(q->message);
	log_errorx("model \"%s\": %s; %s", m->name, q->message,
		still_served(m, served, sizeof(served)));
	if (q->done != NULL)
		q->done(q->status, q->message, 0, q->arg);
	if (r->changed != NULL)
		r->changed(r);
}

/* What staging q's source touches: the remote filesystem it is on. */
static uint64_t
source_fs(const struct model_source *src, const struct fs_info *fs)
{
	return workq_fs(fs->remote, src->nfiles > 0 ? src->files[0].st.st_dev : 0);
}

/* What a load of path for m touches, as far as the loop knows without
 * looking: the filesystem of its current generation's files (their origin,
 * when staged) if that came from the same path, else WORKQ_UNKNOWN. Names
 * the load in what. */
static uint64_t
model_fs(const struct model_entry *m, const char *path, char *what, size_t len)
{
	const struct generation *g = m->current;

	if (g == NULL || strcmp(path, m->path) != 0) {
		snprintf(what, len, "model \"%s\": a load of %s", m->name, path);
		return WORKQ_UNKNOWN;
	}
	snprintf(what, len, "model \"%s\": a load of %s on %s", m->name, path, g->fs.name);
	return gen_origin_fs(g);
}

/* Queues q's copy (stage_work, then load_after) on the work queue: 0, or
 * -errno with q->message. */
static int
submit_stage(struct registry *r, struct load_request *q)
{
	char what[sizeof(q->job.what)];
	int err;

	snprintf(what, sizeof(what), "model \"%s\": staging %s from %s", q->name, q->path,
		q->fs.name);
	if ((err = workq_submit(&r->workq, &q->job, source_fs(&q->source, &q->fs), what,
		     stage_work, load_after)) < 0) {
		snprintf(q->message, sizeof(q->message), "cannot stage it: %s", uv_strerror(err));
		return q->status = err;
	}
	return 0;
}

/*
 * Sends q, validated, back to the work queue to be staged, or holds it
 * until the start-up sweep ends (registry_sweep_hold, registry_sweep.c):
 * 0 (q is the queue's or the sweep's, and m still loading), or -errno with
 * q->message.
 */
static int
queue_stage(struct registry *r, struct model_entry *m, struct load_request *q)
{
	const char *swept;

	if (r->stage_dir == NULL) {
		snprintf(q->message, sizeof(q->message), "cannot stage it: no stage_dir");
		return q->status = -EINVAL;
	}
	/* The request's own copy: a reload may change the key meanwhile. */
	if ((q->stage_dir = strdup(r->stage_dir)) == NULL) {
		snprintf(q->message, sizeof(q->message), "out of memory");
		return q->status = -ENOMEM;
	}
	q->staged = 1;
	q->stage.stage_dir = q->stage_dir;
	q->stage.model = q->name;
	q->stage.number = m->last_generation + 1;
	q->stage.model_path = q->path;
	q->stage.cancel = &r->closing;
	if ((swept = registry_sweep_hold(r, q, &q->held_next)) != NULL)
		log_debug("model \"%s\": its staging waits for the sweep of %s to end", q->name,
			swept);
	else if (submit_stage(r, q) < 0)
		return q->status;
	m->loading++;
	r->loads_in_flight++;
	m->staging = &q->stage;
	q->stage_queued_ms = registry_now_ms(r);
	return 0;
}

/*
 * Loop thread: the one line of a staging its model no longer wants (why:
 * unloaded, or a newer load superseded it), whose copy is thrown away:
 * stopped in flight (stage_cancel, queue_load and entry_free), finished
 * before the cancel reached it (load_request_free removes the copy), or
 * failed on its own meanwhile.
 */
static void
log_unwanted_staging(const struct load_request *q, const char *why)
{
	double secs = (double)(registry_now_ms(q->r) - q->stage_queued_ms) / 1000.0;

	if (q->status == -ECANCELED)
		log_info("model \"%s\": staging %s stopped after %.1f s: %s", q->name, q->path,
			secs, why);
	else if (q->status == 0)
		log_info("model \"%s\": staging %s finished after %.1f s but is not used: %s; "
			 "the copy is removed", q->name, q->path, secs, why);
	else
		log_info("model \"%s\": staging %s failed after %.1f s (%s), and %s", q->name,
			q->path, secs, q->message, why);
}

/*
 * Loop thread, just before q, a watched reload, makes its generation: is
 * one of its files open for writing (find_writer, asked again: a writer may
 * have opened one since the load's job asked, while its holes were counted
 * or the loop was busy)? Also 1 when a lease could not be given back
 * (q->status). A lease is never waited for, nor asked for on a remote
 * filesystem: nothing here blocks the loop.
 */
static int
written_now(struct load_request *q)
{
	if (q->reload == RELOAD_WATCHED && q->writing == 0)
		find_writer(q);
	return q->writing > 0 || q->status < 0;
}

void
registry_forget_writer(struct registry *r, struct model_entry *m)
{
	if (m->writer_fd >= 0)
		closer_unmap_close(r->closer, CLOSER_LOCAL, NULL, 0, m->writer_fd);
	m->writer_fd = -1;
	free(m->writer_path);
	m->writer_path = NULL;
	m->writer_since_ms = 0;
}

/* q, m's newest load, ended: it decides whether m waits for a writer
 * (wait_for_writer, which says a wait for the same file once: q->waited). */
static void
take_writer(struct registry *r, struct model_entry *m, struct load_request *q)
{
	if (m->writer_path != NULL) {
		free(q->waited);
		q->waited = m->writer_path;
		q->waited_since_ms = m->writer_since_ms;
		m->writer_path = NULL;
	}
	registry_forget_writer(r, m);
}

int
registry_writer_gone(struct model_entry *m)
{
	int stuck = 0;

	if (m->writer_path == NULL)
		return 0;
	/* No descriptor (none was left to dup): the reload asks. */
	return m->writer_fd < 0 || gen_lease_probe(m->writer_fd, &stuck) != -EAGAIN;
}

/*
 * q, m's watched reload, found a file open for writing (find_writer; or,
 * its files not valid, path_writer): no generation is made of it while it
 * is, and the model's error is left as it was. m keeps q's descriptor of
 * that file, which the watch asks again (registry_writer_gone) until no
 * writer is left, and then reloads m, wherever the file is (a directory
 * not watched, behind a link, polled) and whatever events it gives; the
 * close of a descriptor open for writing on it in a watched directory
 * (inotify's IN_CLOSE_WRITE) reloads m too. Status shows the wait. One
 * line each, at debug level when it is the file m waited for already.
 */
static void
wait_for_writer(struct registry *r, struct model_entry *m, struct load_request *q)
{
	char served[160];
	const char *path = q->busy_path != NULL ? q->busy_path :
		q->writing > 0 ? q->source.files[q->writing - 1].path : q->path;
	int again = q->waited != NULL && strcmp(q->waited, path) == 0;
	uint64_t since = again ? q->waited_since_ms : registry_now_ms(r);
	char *line = NULL;

	/* A failed load's own error stays in the line: the file written
	 * may not be the one that failed (review rev200 M1). */
	if (asprintf(&line, "%s is open for writing: not loaded while it is, but again once "
		"no descriptor open for writing on it is left%s%s%s", path,
		q->status < 0 ? " (the load failed: " : "", q->status < 0 ? q->message : "",
		q->status < 0 ? ")" : "") < 0)
		line = NULL;
	if (line != NULL)
		snprintf(q->message, sizeof(q->message), "%s", line);
	else
		snprintf(q->message, sizeof(q->message), "%s is open for writing: not loaded "
			"while it is, but again once no descriptor open for writing on it is left",
			path);
	free(line);
	if (again)
		log_debug("model \"%s\": %s; %s", m->name, q->message,
			still_served(m, served, sizeof(served)));
	else
		log_info("model \"%s\": %s; %s", m->name, q->message,
			still_served(m, served, sizeof(served)));
	m->writer_fd = q->busy_fd;  /* take_writer left none */
	q->busy_fd = -1;
	m->writer_path = strdup(path);
	m->writer_since_ms = since;
	if (q->done != NULL)
		q->done(-ETXTBSY, q->message, 0, q->arg);
	if (r->changed != NULL)
		r->changed(r);
}

/*
 * q, m's watched reload, is made though whether its files are open for
 * writing could not be told (find_writer: wcached neither owns a file nor
 * has CAP_LEASE, or its filesystem has no leases): as it was before the
 * question was asked, a file still being written may be loaded, and its
 * next write marks that generation modified. Said once per model and
 * reason.
 */
static void
say_writer_unknown(struct model_entry *m, const struct load_request *q)
{
	if (q->reload != RELOAD_WATCHED || q->writing_err == m->writer_unknown)
		return;
	m->writer_unknown = q->writing_err;
	if (q->writing_err == 0)
		return;
	log_info("model \"%s\": cannot tell whether its files are still being written (fcntl "
		 "F_SETLEASE: %s: it needs wcached to own them or CAP_LEASE): a watched reload "
		 "loads them whether they are or not", m->name, strerror(q->writing_err));
}

static void
load_after(struct workq_job *w, int status)
{
	struct load_request *q = w->arg;
	struct registry *r = q->r;
	struct model_entry *m = registry_entry_named(r, q->name);

	r->loads_in_flight--;
	if (m != NULL && m->entry_id != q->entry_id)
		m = NULL; /* the model was unloaded and added again meanwhile */
	if (m != NULL && m->loading > 0)
		m->loading--;
	if (m != NULL && m->queued_load == q)
		m->queued_load = NULL;
	if (m != NULL && m->staging == &q->stage)
		m->staging = NULL;
	if (m != NULL && m->load_id == q->id && status != UV_ECANCELED && !r->closing) {
		take_operator_tree(m, q, q->path);
		if (q->reload != RELOAD_WATCHED)
			refusal_decided(m); /* the operator's word, whatever it finds */
		take_writer(r, m, q);
	}
	if (status == UV_ECANCELED || r->closing) {
		if (q->done != NULL)
			q->done(-ECANCELED, "cancelled: wcached is stopping", 0, q->arg);
	} else if (m == NULL || m->load_id != q->id) {
		if (q->staged)
			log_unwanted_staging(q, m == NULL ? "the model was unloaded" :
							  "a newer load superseded it");
		if (q->done != NULL)
			q->done(-ECANCELED, q->withdrawn != NULL ? q->withdrawn :
				"superseded by a newer load or unload", 0, q->arg);
	} else if (q->status < 0 && q->busy_path != NULL) {
		wait_for_writer(r, m, q); /* not valid while it is written (path_writer) */
	} else if (q->status < 0) {
		load_failed(r, m, q);
	} else if (q->reload != RELOAD_NONE && same_files(m, m->pending, q)) {
		if (q->tree_status == 0)
			take_resolved(m->pending, q);
		if (q->done != NULL)
			q->done(0, "already warming as the next generation", m->pending->number,
				q->arg);
	} else if (q->reload != RELOAD_NONE && same_files(m, m->current, q) &&
		m->current->state != GEN_FAILED && !reloads_modified(m, q) &&
		!reloads_relinked(m, q)) {
		/* (A generation that failed while warming serves nothing: its
		 * files are loaded again, a new generation, below; so are a
		 * modified one's at the operator's word.) A watched reload
		 * whose tree was refused changes nothing: the generation
		 * keeps the tree it had. */
		if (q->tree_status == 0)
			take_resolved(m->current, q);
		if (q->done != NULL && m->current->state == GEN_MODIFIED)
			q->done(-ESTALE, "its files were modified in place; replace them with "
					 "rename(2) and reload again", 0, q->arg);
		else {
			/* The files serving are the configured ones: an error
			 * from an earlier failed load no longer applies. */
			free(m->error);
			m->error = NULL;
			refusal_decided(m);
			if (q->done != NULL)
				q->done(0, "unchanged", m->current->number, q->arg);
		}
	} else if (q->tree_status < 0) {
		q->status = q->tree_status;
		note_refused(m, q);
		load_failed(r, m, q);
	} else if (written_now(q)) {
		if (q->status < 0)
			load_failed(r, m, q);
		else
			wait_for_writer(r, m, q);
	} else if (wants_stage(m, q)) {
		say_writer_unknown(m, q);
		/* The model's stage key is known now (it is set after
		 * registry_load returns): copy, then install the copy. */
		if (keeps_room(q) == 0 && queue_stage(r, m, q) == 0)
			return;
		load_failed(r, m, q);
	} else {
		say_writer_unknown(m, q);
		/* Past the "unchanged" answer for this reason only: logged
		 * once, as the new generation is made. */
		if (reloads_modified(m, q))
			log_reloads_modified(m);
		if (!reloads_relinked(m, q) || !revalidated_same(r, m, q))
			install(r, m, q);
	}
	m = registry_entry_named(r, q->name); /* looked up again: done() may unload it */
	if (m != NULL && m->entry_id == q->entry_id && status != UV_ECANCELED && !r->closing &&
		m->load_id == q->id)
		relink_answered(m, q);
	if (m != NULL && m->entry_id == q->entry_id)
		/* Refused for descriptors while a generation closed: its
		 * retry waits for no other close (review rev182 F2). */
		registry_reload_held(r, m, m->room_wait && m->load_id == q->id &&
				r->closes_done != q->closes_seen ? RELOAD_CLOSED : NULL);
	load_request_free(q);
}

/* The run of a withdrawn load (withdraw_waiting): nothing to open. */
static void
skip_work(struct workq_job *w)
{
	(void)w;
}

/*
 * q, a load still waiting for its turn on the work queue (a remote
 * filesystem's share is busy: a server that hangs), is no longer wanted:
 * a newer load of its model superseded it (why NULL), or the model was
 * unloaded (why: the answer). It is taken back and handed to libuv with nothing to run,
 * rather than opening and validating files once the server answers only
 * to be discarded. Clients that gave up (`timeout 1 wcachectl load ...` in
 * a loop) otherwise left one such load each, run in turn. Its answer comes
 * from load_after on the loop, as any superseded load's does, and so never
 * from within registry_load or registry_unload (their callers rely on
 * that: a done may answer a client or end a batch). A load already
 * running ends as before.
 */
static void
withdraw_waiting(struct registry *r, struct load_request *q, const char *why)
{
	int err;

	if (q == NULL || !workq_withdraw(&r->workq, &q->job))
		return;
	q->withdrawn = why;
	log_debug("model \"%s\": a load of %s, still waiting for its turn, is withdrawn: %s",
		q->name, q->path, why != NULL ? why : "superseded by a newer load");
	if ((err = workq_submit(&r->workq, &q->job, WORKQ_LOCAL, q->job.what, skip_work,
		     load_after)) < 0) {
		/* Not reached in practice: a local job goes straight to
		 * uv_queue_work, which refuses only a NULL callback. Were it
		 * refused, it is answered here, within the caller, as withdrawn
		 * (load_id is not its own, or its entry is gone). */
		log_warnx("%s: cannot queue it: %s", q->job.what, uv_strerror(err));
		load_after(&q->job, err);
	}
}

void
registry_withdraw_waiting_load(struct registry *r, struct model_entry *m, const char *why)
{
	withdraw_waiting(r, m->queued_load, why);
}

/* m's newest generation, whose tree a watched reload keeps, or NULL. */
static const struct generation *
newest(const struct model_entry *m)
{
	return m->pending != NULL ? m->pending : m->current;
}

/* Whether g's path named one file (its model's one file, as opened or its
 * origin; a shard index, as it was read, when g is no staged copy nor a
 * restored generation, which keep no fstat of it): 1 with its owner in
 * *uid. */
static int
named_owner(const struct generation *g, uid_t *uid)
{
	if (g->source.format == FORMAT_SHARDED) {
		*uid = g->source.index_st.st_uid;
		return g->origin == NULL && g->source.index_st.st_ino != 0;
	}
	if (g->source.nfiles != 1)
		return 0;
	*uid = g->origin != NULL ? g->origin[0].st.st_uid : g->source.files[0].st.st_uid;
	return 1;
}

/* Any load of m: the file its newest generation's path resolved to
 * (named_owner) and its owner, in q's named_path and named_uid, for
 * linked_in. 0 or -ENOMEM. */
static int
keep_named(struct load_request *q, const struct model_entry *m)
{
	const struct generation *g = newest(m);

	if (g == NULL || g->resolved_path == NULL || !named_owner(g, &q->named_uid))
		return 0;
	return (q->named_path = strdup(g->resolved_path)) != NULL ? 0 : -ENOMEM;
}

/*
 * Whether a restored generation's path named a file (sibling_swap's
 * rule, review rev191 F1) where neither the store recorded it (a store
 * before format version 10: path_named GEN_NAMED_UNTOLD) nor its real
 * path can tell it: the
 * restart found it NULL (the path leads elsewhere now) or out of the
 * tree kept (path_under), and either read as "named no file",
 * which let a one-file model's deployer rename her link to root's
 * private model directory beside root's team place over her file's name
 * while wcached restarted, and have it served (review rev215 H1). Told
 * from the stored layout instead, failing closed: a generation of one
 * file (nfiles; its format is not stored) is taken for a one-file model,
 * whose path named that file (or a link to it) whatever its name (the
 * path's suffix would miss a link named otherwise); a directory model of
 * one file then only has its sibling swaps wait for the operator, never
 * its updates in its tree (so too where nothing serves it and its kept
 * file is one: keep_restart_files cannot tell a restart's from a
 * withdrawn generation's). A sharded one named a file where its path is
 * an index, the load's own rule (load_work). 0 or 1.
 */
static int
untold_named_file(const struct load_request *q, size_t nfiles)
{
	return nfiles == 1 || file_has_suffix(q->path, ".safetensors.index.json");
}

/*
 * A watched reload q of a model that nothing serves keeps what a warm
 * restart told of the files its stored generation served (k: their
 * owners and identities, from its stored descriptors), as it would keep
 * them from that generation had it been restored: the one file's owner
 * (same_file_owner), every file's owner (same_owners), the files
 * themselves (files_kept) and whether the file lay straight in its tree
 * (sibling_swap). Before, the restart's load kept the tree's root and
 * owner only, and a neighbour's file renamed at a one-file model's name
 * in a shared sticky directory while wcached restarted was served
 * (review rev206 H1). 0 or -ENOMEM.
 */
static int
keep_restart_files(struct load_request *q, const struct registry_kept_files *k)
{
	if (k->nfiles == 0)
		return 0;
	if ((q->keep_owners = calloc(k->nfiles, sizeof(*q->keep_owners))) == NULL ||
		(q->keep_files = calloc(k->nfiles, sizeof(*q->keep_files))) == NULL)
		return -ENOMEM;
	for (size_t i = 0; i < k->nfiles; i++) {
		q->keep_owners[i] = k->owners[i];
		q->keep_files[i].dev = k->ids[i].dev;
		q->keep_files[i].ino = k->ids[i].ino;
		q->keep_files[i].ctime_ns = k->ids[i].ctime_ns;
		q->keep_files[i].ctime_known = 1;
	}
	q->nkeep_owners = k->nfiles;
	q->nkeep_files = k->nfiles;
	/* A restored generation of one file is a model of one file (its
	 * format is not stored), as keep_tree takes one. */
	q->keep_file_known = k->nfiles == 1;
	q->keep_file_uid = k->owners[0];
	/* As the load that made the generation told it (k->named_told: a
	 * store of format version 10, or a generation withdrawn); else where
	 * the stored file is now tells what the path named only where it is
	 * still straight in the tree (k->named_file), and the layout tells it
	 * otherwise (untold_named_file, review rev215 H1). */
	q->keep_named_file = k->named_told ? k->named_file :
		k->named_file || untold_named_file(q, k->nfiles);
	return 0;
}

/* A watched reload q keeps the tree of m's newest generation g: its root
 * and owner, or the real path whose root load_work finds (a restored
 * generation's); when g records neither (or m has none), the tree m's
 * operator's last load found (operator_tree); when that found none too,
 * nothing, and same_tree refuses q. 0 or -ENOMEM. */
static int
keep_tree(struct load_request *q, const struct model_entry *m)
{
	const struct generation *g = newest(m);

	/* A restored generation's file is its stored descriptor's, fstat'ed
	 * by the restart's check (and a copy's origin, found the same inode
	 * by its path): its owner needs no more than a load's. */
	if (g != NULL && g->source.nfiles == 1 && g->source.format != FORMAT_SHARDED) {
		q->keep_file_known = 1;
		q->keep_file_uid = g->origin != NULL ? g->origin[0].st.st_uid :
			g->source.files[0].st.st_uid;
	}
	if (g != NULL && (q->keep_owners = calloc(g->source.nfiles + 1, sizeof(uid_t))) == NULL)
		return -ENOMEM;
	for (size_t i = 0; g != NULL && i < g->source.nfiles; i++)
		q->keep_owners[q->nkeep_owners++] = owner_of(&g->source, g->origin, i);
	if (g != NULL && (q->keep_files = calloc(g->source.nfiles + 1,
				  sizeof(*q->keep_files))) == NULL)
		return -ENOMEM;
	for (size_t i = 0; g != NULL && i <= g->source.nfiles; i++) {
		uid_t uid;
		const struct stat *st = i == g->source.nfiles ?
			(named_owner(g, &uid) && g->source.format == FORMAT_SHARDED ?
				&g->source.index_st : NULL) :
			g->origin != NULL ? &g->origin[i].st : &g->source.files[i].st;

		if (st == NULL)
			continue;
		/* Held by g only where g serves its files where they lie:
		 * a staged copy's origin and a shard index (parsed, then
		 * closed) are held by nothing, so their inode numbers may be
		 * freed (a neighbour's rm in a 2775 place) and given to the
		 * owner's next file: theirs only with their ctime too
		 * (review rev219 H2). Nor does a descriptor held here hold
		 * a file on a remote filesystem (g->fs: NFS, FUSE): another
		 * host's rm frees it on the server, which may give its number
		 * (NFS's fileid, the exported inode's) to the next file made
		 * there, the same st_ino through this client (review rev222
		 * M1). */
		/* A revalidation after a links-only move of remote files
		 * (gen_note_relinked, gen_relinked_also): each such inode
		 * (seen through the held descriptor) with the ctime the move
		 * gave it; every file a snapshot linked, not the first alone
		 * (review rev227 M3). */
		const struct stat *ct = g == m->current && g->relink_asked &&
				m->revalidate == g->number && g->origin == NULL &&
				g->relinked_sts != NULL && i < g->source.nfiles &&
				g->relinked_sts[i].st_nlink != 0 ? &g->relinked_sts[i] : st;

		q->keep_files[q->nkeep_files] = (struct file_id){ .dev = st->st_dev,
			.ino = st->st_ino, .ctime_ns = file_time_ns(&ct->st_ctim),
			.ctime_known = i == g->source.nfiles || g->origin != NULL ||
				g->fs.remote };
		q->nkeep_files++;
	}
	if (g != NULL && g->nlinks > 0) {
		if ((q->keep_links = malloc(g->nlinks * sizeof(*g->links))) == NULL)
			return -ENOMEM;
		memcpy(q->keep_links, g->links, g->nlinks * sizeof(*g->links));
		q->nkeep_links = g->nlinks;
	}
	/* Its shard index's owner too: the deployer's index over root's
	 * shards made the generation serving (review rev195 L3). */
	if (g != NULL && g->source.format == FORMAT_SHARDED &&
		named_owner(g, &q->keep_owners[q->nkeep_owners]))
		q->nkeep_owners++;
	if (g != NULL && g->tree_root != NULL) {
		q->keep_uid = g->tree_uid;
		q->keep_root_known = g->tree_ino_known;
		q->keep_root_dev = g->tree_dev;
		q->keep_root_ino = g->tree_ino;
		/* As the load that made g told it (path_named; a restored
		 * g's, as the store recorded it), else its real path, else
		 * the layout (untold_named_file). */
		q->keep_named_file = g->path_named != GEN_NAMED_UNTOLD ?
			g->path_named == GEN_NAMED_FILE :
			g->resolved_path != NULL && path_under(g->resolved_path, g->tree_root) ?
			registry_file_in(g->resolved_path, g->tree_root) :
			untold_named_file(q, g->source.nfiles);
		return (q->keep_root = strdup(g->tree_root)) != NULL ? 0 : -ENOMEM;
	}
	if (g != NULL && g->resolved_path != NULL)
		return (q->keep_resolved = strdup(g->resolved_path)) != NULL ? 0 : -ENOMEM;
	if (m->operator_tree.root == NULL)
		return 0;
	q->keep_uid = m->operator_tree.uid;
	q->keep_place_mode = m->operator_tree.place_mode;
	q->keep_place_dir_len = m->operator_tree.place_dir_len;
	q->keep_root_known = m->operator_tree.root_known;
	q->keep_root_dev = m->operator_tree.root_dev;
	q->keep_root_ino = m->operator_tree.root_ino;
	q->owners_untold = m->operator_tree.owners_untold;
	if (keep_restart_files(q, &m->operator_tree.kept) < 0 ||
		(q->keep_root = strdup(m->operator_tree.root)) == NULL ||
		(m->operator_tree.place != NULL &&
			(q->keep_place = strdup(m->operator_tree.place)) == NULL))
		return -ENOMEM;
	return 0;
}


/* Queues a load of path for the model name (entry created if new). */
static int
queue_load(struct registry *r, const char *name, const char *path, enum pin_mode pin, int warm,
	enum reload_kind reload, registry_done_fn done, void *arg)
{
	struct model_entry *m = registry_entry_named(r, name);
	struct load_request *q, *older;
	char what[sizeof(q->job.what)];
	int err;

	if (r->closing)
		return error_set(-ESHUTDOWN, "wcached is stopping");
	if (m == NULL && (err = registry_entry_new(r, name, path, pin, warm, &m)) < 0)
		return err; /* -ENOMEM, or -ENOSPC: no status slot left */
	if ((q = calloc(1, sizeof(*q))) == NULL || (q->name = strdup(name)) == NULL ||
		(q->path = strdup(path)) == NULL) {
		if (q != NULL)
			free(q->name);
		free(q);
		return error_set(-ENOMEM, "model \"%s\": out of memory", name);
	}
	if (keep_named(q, m) < 0 || (reload == RELOAD_WATCHED && keep_tree(q, m) < 0)) {
		free(q->keep_root);
		free(q->keep_resolved);
		free(q->keep_place);
		free(q->keep_owners);
		free(q->keep_files);
		free(q->keep_links);
		free(q->named_path);
		free(q->name);
		free(q->path);
		free(q);
		return error_set(-ENOMEM, "model \"%s\": out of memory", name);
	}
	q->r = r;
	q->pin = pin;
	q->pin_seq = m->pin_seq;
	q->warm = warm;
	q->reload = reload;
	q->index_fd = -1;
	q->busy_fd = -1;
	q->done = done;
	q->arg = arg;
	q->id = ++r->next_load_id;
	q->entry_id = m->entry_id;
	q->closes_seen = r->closes_done;
	q->revalidate = reload != RELOAD_NONE ? m->revalidate : 0;
	q->job.arg = q;
	if ((err = workq_submit(&r->workq, &q->job, model_fs(m, path, what, sizeof(what)), what,
		     load_work, load_after)) < 0) {
		free(q->keep_root);
		free(q->keep_resolved);
		free(q->keep_place);
		free(q->keep_owners);
		free(q->keep_files);
		free(q->keep_links);
		free(q->named_path);
		free(q->name);
		free(q->path);
		free(q);
		return error_set(err, "model \"%s\": %s", name, uv_strerror(err));
	}
	m->load_id = q->id;
	m->room_wait = 0; /* the newest load decides */
	m->loading++;
	r->loads_in_flight++;
	older = m->queued_load;
	m->queued_load = q;
	/* A staging still copying for an older load is superseded. */
	if (m->staging != NULL)
		stage_cancel(m->staging);
	/* Last: the older load's answer may change the registry. */
	withdraw_waiting(r, older, NULL);
	return 0;
}

int
registry_load(struct registry *r, const char *name, const char *path, enum pin_mode pin,
	int warm, registry_done_fn done, void *arg)
{
	return queue_load(r, name, path, pin, warm, RELOAD_NONE, done, arg);
}

/* The descriptors a generation keeps open: 2 a file (its own and the one
 * workers get) and 2 for its index. */
static uint64_t
gen_fds(const struct generation *g)
{
	return 2 * (uint64_t)g->source.nfiles + 2;
}

/*
 * Whether m's retired generations (neither current nor warming to be, yet
 * still open: held by attaches, a HOLD, a check, page work) are as many as
 * a reload may leave open; *held gets how many there are. Fewer than
 * r->retired_max (4) always leave room. Past that, room is left while
 * their descriptors stay within an eighth of wcached's soft RLIMIT_NOFILE
 * (r->fd_limit, read once at start; none when unlimited) and every
 * model's retired generations within half of it: a model of a
 * few files swapped under long-lived workers keeps getting its new
 * generations (hundreds under the unit's 65536), while one uid attaching
 * every generation of a 250-file model (review rev173 F9) stops at 16, and
 * of all the models it owns at half the descriptors.
 */
static int
retired_full(const struct registry *r, const struct model_entry *m, unsigned *held)
{
	unsigned n = 0;
	uint64_t mine = 0, all = 0;

	for (const struct generation *g = r->generations; g != NULL; g = g->next) {
		const struct model_entry *o = g->model;

		if (o != NULL && (g == o->current || g == o->pending))
			continue;  /* serving or to serve; an unloaded model's count */
		all += gen_fds(g);
		if (o == m) {
			n++;
			mine += gen_fds(g);
		}
	}
	*held = n;
	if (n < r->retired_max)
		return 0;
	if (r->fd_limit == 0)
		return 1;
	if (r->fd_limit == RLIM_INFINITY)
		return 0;
	return mine >= r->fd_limit / 8 || all >= r->fd_limit / 2;
}

/*
 * Queues a reload of m as kind asks (registry_reload's answers), or makes
 * it wait (reload_again, raised to kind: an operator's wins) for the load
 * of m in flight to end, or for room: while m's retired generations still
 * open are as many as a reload may leave (retired_full), with one warning
 * when it starts to wait (not again when released says it waited already)
 * and done(-EBUSY). Each generation held open keeps 2 descriptors a file
 * and 2 for its index, and its locked metadata: one uid that attaches
 * every generation would take wcached's descriptors from every other
 * model (review rev173 F9). A load in flight may have opened the files
 * before the change that asks for this reload, so it reloads once more
 * when that ends (of the path it leaves configured: an operator's load of
 * another path is never superseded by the old one).
 */
static int
reload_as(struct registry *r, struct model_entry *m, enum reload_kind kind,
	const char *released, registry_done_fn done, void *arg)
{
	unsigned held = 0;
	int full = m->loading == 0 && retired_full(r, m, &held);
	int warn = full && m->reload_again == RELOAD_NONE && released == NULL;
	char msg[160];

	if (m->loading == 0 && !full) {
		if (released != NULL)
			log_info("model \"%s\": %s; reloading", m->name, released);
		return queue_load(r, m->name, m->path, m->pin, m->warm, kind, done, arg);
	}
	if (kind > m->reload_again)
		m->reload_again = kind;
	if (!full) {
		if (done != NULL)
			done(0, "a load of this model is already in progress",
				m->current != NULL ? m->current->number : 0, arg);
		return 0;
	}
	snprintf(msg, sizeof(msg), "%u older generations are still attached; a new one "
		"is loaded once one of them is released", held);
	if (warn)
		log_warnx("model \"%s\": %s (generation %" PRIu64 " still serving)", m->name, msg,
			m->current != NULL ? m->current->number : 0);
	if (done != NULL)
		done(-EBUSY, msg, 0, arg);
	return 0;
}

void
registry_reload_held(struct registry *r, struct model_entry *m, const char *released)
{
	enum reload_kind again = m->reload_again;

	/* A load refused for descriptors waits for a generation to close. */
	if (m->room_wait && again == RELOAD_NONE && released != NULL &&
		strcmp(released, RELOAD_CLOSED) == 0)
		again = RELOAD_WATCHED;
	if (again == RELOAD_NONE || m->loading > 0 || r->closing)
		return;
	m->reload_again = RELOAD_NONE;
	if (reload_as(r, m, again, released, NULL, NULL) < 0)
		log_warnx("%s", error_get());
}

/* reload_as of the model called name: -ENOENT when unknown. */
static int
reload_named(struct registry *r, const char *name, enum reload_kind kind, registry_done_fn done,
	void *arg)
{
	struct model_entry *m = registry_entry_named(r, name);

	if (m == NULL)
		return error_set(-ENOENT, "model \"%s\" is not loaded", name);
	return reload_as(r, m, kind, NULL, done, arg);
}

int
registry_reload(struct registry *r, const char *name, registry_done_fn done, void *arg)
{
	return reload_named(r, name, RELOAD_OPERATOR, done, arg);
}

int
registry_reload_watched(struct registry *r, const char *name, registry_done_fn done, void *arg)
{
	return reload_named(r, name, RELOAD_WATCHED, done, arg);
}

/*
 * Loop thread: the start-up sweep ended (registry_sweep.c), or never ran:
 * the stagings held for it (held, linked through held_next, in the order
 * they came) go to the work queue now; when cancelled (wcached is
 * stopping, or the sweep never ran) they end as cancelled, as a staging
 * the queue cancels does (load_after).
 */
void
registry_stage_held(struct registry *r, struct load_request *held, int cancelled)
{
	struct load_request *q, *next;

	for (q = held; q != NULL; q = next) {
		next = q->held_next;
		q->held_next = NULL;
		if (cancelled || r->closing)
			load_after(&q->job, UV_ECANCELED);
		else if (submit_stage(r, q) < 0)
			load_after(&q->job, 0); /* fails q with its message */
	}
}

/* registry_others_rename_on's judge: the first directory or link of the
 * walk held by a directory others may rename entries in, said in why (len
 * bytes), ends the walk. */
struct rename_place {
	char *why;
	size_t len;
	int found;
};

/* Says dir (its fstat st) in p->why, as registry_others_rename_on's. */
static void
say_place(struct rename_place *p, const char *dir, const struct stat *st)
{
	snprintf(p->why, p->len, "%s (uid %u, mode %04o)", dir, (unsigned)st->st_uid,
		(unsigned)(st->st_mode & 07777));
	p->found = 1;
}

/* The judge itself: a directory or link held by such a directory is
 * said (say_place) and ends the walk (-EXDEV); else 0, nothing bound. */
static int
rename_place(const struct registry_link_seen *l, void *arg)
{
	if (!others_rename_in(l->dir_st))
		return 0;
	say_place(arg, l->dir, l->dir_st);
	return -EXDEV;
}

int
registry_others_rename_on(const char *path, char *why, size_t len)
{
	struct rename_place p = { .why = why, .len = len };
	struct registry_walk *w = malloc(sizeof(*w));
	struct mountrule_walk run;
	char *dir, *up;
	int err;

	if (w == NULL) {
		snprintf(why, len, "%s (not walked: out of memory)", path);
		return 1;
	}
	err = registry_walk_links(path, rename_place, &p, w);
	if (w->refused) {
		/* A mount the walk would not step onto (a user's FUSE mount,
		 * where a link renamed in leads): its user may rename anything
		 * there, and nothing past it was walked (review rev216 H2). */
		snprintf(p.why, p.len, "%s", w->why);
		p.found = 2;
	}
	if (!p.found && err == 0) {
		/* The model's files: the directory's entries, or the file's
		 * beside it. */
		const struct stat *holds = S_ISDIR(w->end.st_mode) ? &w->end : &w->end_dir;

		if (others_rename_in(holds)) {
			char *d = S_ISDIR(w->end.st_mode) ? strdup(path) : path_dir(path);

			say_place(&p, d != NULL ? d : path, holds);
			free(d);
		}
	}
	/* Not walked to its end (a name gone, a link's target renamed
	 * aside): the directory the walk stopped in holds the name it could
	 * not take, which others may rename something in at, whatever the
	 * path spells above it (review rev203 H2). */
	if (!p.found && err != 0 && w->stopped && others_rename_in(&w->stop_dir))
		say_place(&p, w->stop_where, &w->stop_dir);
	free(w);
	if (p.found || err == 0)
		return p.found;
	/* Not walked at all, or stopped in a private directory: the
	 * directories above it as spelled too, each by the judged walk (one
	 * run: the mount table read once), never by name: a stat(2) asked
	 * the server of a neighbour's FUSE mount met on the way, which may
	 * never answer. One gone cannot be told; one the walk refuses (a
	 * user's FUSE mount on the way: its user may rename anything there)
	 * is such a place. */
	mountrule_walk_init(&run);
	for (dir = path_dir(path); dir != NULL && !p.found; dir = up) {
		char refused[MOUNTRULE_WHY];
		struct stat st;
		int r = judged_stat(&run, dir, &st, refused, sizeof(refused));

		if (r == -EXDEV) {
			snprintf(p.why, p.len, "%s", refused);
			p.found = 2;
		} else if (r == 0 && S_ISDIR(st.st_mode) && others_rename_in(&st)) {
			say_place(&p, dir, &st);
		}
		up = dir[0] != '\0' && strcmp(dir, "/") != 0 && !p.found ? path_dir(dir) : NULL;
		free(dir);
	}
	mountrule_walk_end(&run);
	return p.found;
}
