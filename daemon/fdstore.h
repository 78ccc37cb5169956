/*
 * fdstore.h: what wcached will keep in systemd's file descriptor store
 * across a restart (issue 12), as a pure module: the names of the stored
 * descriptors (FDNAME=) and the description of the registry that goes with
 * them in a sealed memfd. No socket, no registry: the daemon fills a
 * struct fdstore_desc from its registry, encodes it, and on the next start
 * decodes what $LISTEN_FDS handed back; tests/fuzz/fuzz_fdstore.c drives
 * the decoder with hostile bytes.
 *
 * The format is in proto/PROTOCOL.md, "The file descriptor store". In
 * short: little-endian, a 24-byte header (magic "WCFDSTOR", version, model
 * count, status page size), then each model (name, configured path, status
 * page slot, last generation number, generations, derived artifacts),
 * each generation (number, role, pin state applied, holders and, since
 * version 6, how many of them each uid was, the index memfd's FDNAME and
 * size, files), each file (FDNAME, st_dev, st_ino,
 * st_size, st_mtim in ns, for a staged copy the st_dev and st_ino of the
 * file it was copied from, then st_ctim in ns, st_nlink and the origin's
 * st_ctim), each derived artifact (key, source generation, the artifact
 * memfd's and its index memfd's FDNAME and size, the builder's uid and
 * pid, the build time and, since version 7, the builder's gid and
 * supplementary groups), and, since version 8, each model ends with the
 * line of the refusal its files wait behind (u16 length, 0: none) and,
 * since version 9, the tree its next load wcached makes by itself is
 * judged against (fdstore_tree; a u16 length 0: none). Since version 10
 * each generation records what its path named (after its holders' uids),
 * and a tree the files its model served where no generation of it is
 * described (after the tree's place).
 * Strings are a u16 length and that many bytes, no NUL. Versions 9
 * (generations and trees without those), 8
 * (models without a tree), 7 (nor a wait line), 6 (artifacts without
 * their builder's groups), 5 (generations without their holders' uids
 * either), 4 (nor files
 * their ctime), 3 (nor their origin) and 2 (no artifacts either) are still
 * read.
 *
 * The decoder trusts nothing: every count and length is checked against
 * its minimum and maximum before anything is read or allocated, sizes are
 * added with overflow checks, the buffer must end exactly where the last
 * file does, and the result must satisfy fdstore_check() (unique names,
 * slots and generation numbers, at most one current and one pending
 * generation per model, holders' uids in ascending order whose counts sum
 * to the holders, ctimes 0 where nlink 0 says they are not recorded,
 * one artifact per source generation and key, of a generation the model
 * describes, no builder's groups where its gid says they are not
 * recorded). Every error is one line in error_get() naming the
 * field ("fdstore: model 2 (\"llama\"): generation 1: file 0: fdname: ...").
 *
 * Three files implement it, one concern each: fdstore_name.c the name
 * scheme, fdstore_check.c the rules (fdstore_check()), fdstore.c the
 * encoding, the decoding and the sealed memfd that carries the bytes.
 */
#ifndef WC_FDSTORE_H
#define WC_FDSTORE_H

#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "proto/pin.h"
#include "proto/wire.h"

#define FDSTORE_MAGIC "WCFDSTOR"          /* 8 bytes, no NUL */
#define FDSTORE_VERSION 10u               /* 10: a generation records whether its path
					     named a file straight in its tree, and a
					     model's tree the owners and identities of
					     the files it served where no generation of
					     it is described (review rev215 H1, rev209
					     M1);
					     9: a model records the tree (or place)
					     a load wcached makes by itself is
					     judged against (review rev204 H2, H3);
					     8: a model records the line of the refusal
					     its files wait behind (the operator's
					     `wcachectl reload NAME`);
					     7: artifacts record their builder's gid
					     and supplementary groups;
					     6: generations record their holders' uids;
					     5: files record their st_ctim and st_nlink,
					     and a staged copy its origin's st_ctim;
					     4: a staged copy's file names its origin's
					     st_dev and st_ino; 3: models carry their
					     derived artifacts */
#define FDSTORE_VERSION_NO_WAITS 7u       /* what the encoder writes when no model
					     waits (fdstore_model's waits) nor
					     records a tree: the oldest version that
					     holds it, which a wcached before version
					     8 still reads */
#define FDSTORE_VERSION_NO_TREES 8u       /* what it writes when some model waits
					     and none records a tree */
#define FDSTORE_VERSION_NO_NAMED 9u       /* what it writes when some model records
					     a tree and no generation records what its
					     path named nor a tree its files (named
					     FDSTORE_NAMED_UNRECORDED, nkept 0): a
					     wcached before version 10 still reads it */
#define FDSTORE_VERSION_MIN 2u            /* 2: generations record their holders; read as
					     a version 7 without holders' uids, artifacts,
					     origins or ctimes */
#define FDSTORE_HEADER_SIZE 24u
#define FDSTORE_MAX_BYTES (16u << 20)     /* the description's memfd */
#define FDSTORE_MAX_MODELS 4096u
#define FDSTORE_MAX_GENERATIONS 64u       /* per model: current, pending, held */
#define FDSTORE_MAX_FILES 250u            /* per generation (INDEX_MAX_FILES) */
#define FDSTORE_MAX_HOLDER_UIDS 65536u    /* per generation: the uids of its holders */
#define FDSTORE_MAX_ARTIFACTS 64u         /* derived artifacts per model */
#define FDSTORE_MAX_BUILDER_GROUPS 65536u /* per artifact: its builder's supplementary
					     groups (the kernel's NGROUPS_MAX) */
#define FDSTORE_GID_UNRECORDED 0xffffffffu /* an artifact's builder_gid when its
					     builder's groups are not recorded
					     ((gid_t)-1 is no group's) */
#define FDSTORE_MAX_KEY WIRE_MAX_KEY      /* an artifact's key (wire_key_valid) */
#define FDSTORE_MAX_FDS 16384u            /* every stored fd: FileDescriptorStoreMax= */
#define FDSTORE_MAX_FDNAME 255u           /* systemd's limit for FDNAME= */
#define FDSTORE_MAX_MODEL_NAME 1024u      /* WIRE_MAX_NAME */
#define FDSTORE_MAX_PATH 4095u
#define FDSTORE_MAX_WAIT_LINE 32768u      /* a model's wait line, in bytes */
#define FDSTORE_MAX_PIN PIN_ALL           /* enum pin_mode (pin.h): none, metadata, all */
#define FDSTORE_MAX_KEPT (FDSTORE_MAX_FILES + 1u) /* per tree: a generation's files and
					     its shard index */
#define FDSTORE_MAX_KEPT_ALL 65536u       /* kept files of every tree together */

/* Version 10: what a generation's path named at the load that made it
 * (fdstore_generation's and fdstore_tree's named), as a watched reload
 * judges a swap of its tree (registry_load.c's sibling_swap, review rev191
 * F1). */
enum fdstore_named {
	FDSTORE_NAMED_UNRECORDED = 0, /* not recorded: a version 2 to 9 description,
					 or a load whose real path was not told */
	FDSTORE_NAMED_DIR = 1,        /* not a file straight in its tree's root: a
					 directory (a model directory, a hub snapshot),
					 or a file deeper in its tree (a hub repo's) */
	FDSTORE_NAMED_FILE = 2,       /* a file straight in its tree's root: a one-file
					 model, a link to one, a shard index */
};
#define FDSTORE_MAX_NAMED FDSTORE_NAMED_FILE

/* The fixed FDNAMEs; per generation, fdstore_name_index/_file(); per
 * derived artifact, fdstore_name_artifact/_artifact_index(). */
#define FDSTORE_NAME_STATUS "wc-status"   /* the status page memfd */
#define FDSTORE_NAME_DESC "wc-desc"       /* the sealed memfd of this description */
#define FDSTORE_NAME_PREFIX "wc-"         /* every name the daemon stores */

/* Seals of the description's memfd: nothing can change it once written. */
#define FDSTORE_SEALS (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

/* What a generation is for, as the registry had it. */
enum fdstore_role {
	FDSTORE_CURRENT = 1, /* served to new attaches */
	FDSTORE_PENDING = 2, /* loading or warming, not yet served */
	FDSTORE_HELD = 3,    /* replaced, still held by workers */
};

struct fdstore_file {
	char *fdname;     /* the model file's descriptor in the store */
	uint64_t dev;     /* st_dev, st_ino, st_size, st_mtim when opened */
	uint64_t ino;
	uint64_t size;
	int64_t mtime_ns; /* st_mtim as nanoseconds since the epoch (file_time_ns) */
	/* A staged copy's (stage.h): the st_dev and st_ino of the file it was
	 * copied from, when it was copied (its size and mtime are the copy's).
	 * 0 and 0: the file is not a copy, or a version 2 or 3 description,
	 * which did not record them, described it. */
	uint64_t origin_dev;
	uint64_t origin_ino;
	/* Version 5: st_ctim (ns since the epoch) and st_nlink when opened, and
	 * a staged copy's origin's st_ctim when it was copied (0 for a file
	 * that is not a copy). A writer can put the mtime back (utimensat),
	 * never the ctime: a restarted daemon compares it as a running one
	 * does (file_ctime_moved, base/file.h). nlink 0: the ctimes are not
	 * recorded (a version 2 to 4 description described the file, or a
	 * model carried from one), and they are 0. */
	int64_t ctime_ns;
	uint64_t nlink;
	int64_t origin_ctime_ns;
};

/* One uid among a generation's holders, and how many of them it was. */
struct fdstore_holder {
	uint32_t uid;
	uint32_t count;         /* 1 .. holders */
};

struct fdstore_generation {
	uint64_t number;        /* 1 .. the model's last_generation */
	uint8_t role;           /* enum fdstore_role */
	uint8_t pin;            /* enum pin_mode actually applied, 0 .. FDSTORE_MAX_PIN */
	uint32_t holders;       /* client references (and HOLDs still expected) when
				   stored: the HOLDs a restarted daemon accepts */
	/* Version 6: those holders by uid, uids ascending (so unique), counts
	 * 1 or more summing to holders: a restarted daemon accepts a uid's
	 * HOLDs up to its count, and none from a uid not listed. nuids 0: not
	 * recorded (a version 2 to 5 description, or a generation some of
	 * whose holders' uids the daemon could not tell): any uid allowed to
	 * use the model may take the holders' places, as before. */
	uint32_t nuids;         /* 0 .. FDSTORE_MAX_HOLDER_UIDS */
	struct fdstore_holder *uids;
	/* Version 10: what its path named at the load that made it (enum
	 * fdstore_named), told by that load's own real path: a restart that
	 * finds the path moved since cannot tell it (review rev215 H1).
	 * FDSTORE_NAMED_UNRECORDED: not recorded. */
	uint8_t named;
	char *index_fdname;     /* the sealed index memfd in the store */
	uint64_t index_size;    /* its exact size in bytes */
	uint32_t nfiles;        /* 1 .. FDSTORE_MAX_FILES */
	struct fdstore_file *files;
};

/* A derived artifact (derive.h): a sealed memfd a worker built from one of
 * the model's generations, and its sealed index. Its two names share the
 * model's slot and a number n of the artifact's own: "wc-<slot>-d<n>-a"
 * and "wc-<slot>-d<n>-i". */
struct fdstore_artifact {
	char *key;              /* 1 .. FDSTORE_MAX_KEY bytes, wire_key_valid() */
	uint64_t source;        /* the generation it was built from: one of the model's
				   described generations; with key, unique in the model */
	char *fdname;           /* the sealed artifact memfd: wc-<slot>-d<n>-a */
	uint64_t size;          /* its exact size, 1 .. INT64_MAX */
	char *index_fdname;     /* its sealed index memfd: wc-<slot>-d<n>-i, the same n */
	uint64_t index_size;    /* 1 .. UINT32_MAX */
	uint32_t builder_uid;   /* who published it, for status */
	uint32_t builder_pid;   /* 1 .. INT32_MAX */
	uint64_t build_ms;      /* how long its build took */
	/* Version 7: the builder's gid and supplementary groups as its
	 * connection had them when it published (what derive_groups judged
	 * then): a restarted daemon judges them as it would judge that
	 * connection now. builder_gid FDSTORE_GID_UNRECORDED, with no
	 * groups: not recorded (a version 3 to 6 description described it,
	 * or a model carried from one): the user database is asked for the
	 * uid's groups instead (restore_rules.c). */
	uint32_t builder_gid;
	uint32_t builder_ngroups; /* 0 .. FDSTORE_MAX_BUILDER_GROUPS; 0 when not recorded */
	uint32_t *builder_groups;
};

struct fdstore_model {
	char *name;             /* as configured */
	char *path;             /* the configured path, absolute */
	uint64_t slot;          /* in the status page, 1 .. status_size / 8 - 1 */
	uint64_t last_generation; /* numbers continue from here */
	uint32_t ngenerations;  /* 0 .. FDSTORE_MAX_GENERATIONS */
	struct fdstore_generation *generations;
	uint32_t nartifacts;    /* 0 .. FDSTORE_MAX_ARTIFACTS */
	struct fdstore_artifact *artifacts;
	/* Version 8: the model was not served from what its path names now,
	 * which waits for the operator's `wcachectl reload NAME` (a refused
	 * watched reload, a warm restart that could not restore it in a place
	 * others may rename entries in): the refusal's line, 1 ..
	 * FDSTORE_MAX_WAIT_LINE bytes, no NUL. NULL: it waits for nothing (or
	 * a version 2 to 7 description described it). The next start keeps
	 * the wait (review rev203 H1). */
	char *waits;
	/* Version 9: what a load of it that wcached makes by itself (a
	 * restart's load of a model it could not restore, or that had no
	 * generation to store) is judged against, as a watched reload's
	 * (registry.h's operator_tree): the tree its newest generation was
	 * loaded from, or the tree and place the operator's last load of it
	 * found. root NULL: none recorded (nor anything else of it: all 0;
	 * a version 2 to 8 description described it). */
	struct fdstore_tree {
		char *root;            /* absolute, 1 .. FDSTORE_MAX_PATH bytes */
		uint32_t uid;          /* its owner (of the directory above place) */
		uint8_t root_known;    /* 0 or 1: root_dev and root_ino recorded (else 0) */
		uint64_t root_dev;
		uint64_t root_ino;
		char *place;           /* absolute, or NULL (then place_mode and
					  place_dir_len 0) */
		uint32_t place_mode;   /* the mode of place's directory that existed */
		uint32_t place_dir_len; /* that directory's length in place: 0 ..
					  strlen(place) */
		/* Version 10: where the model describes no generation (none
		 * fitted in the store, its store failed, nothing serves it),
		 * the owners and identities of the files its tree's generation
		 * served (that generation's files, a staged copy's origins, its
		 * shard index where it read one), as a restart tells them from
		 * stored descriptors (registry.h's registry_kept_files), and what
		 * its path named (enum fdstore_named): the next start's reload
		 * keeps them (review rev209 M1). nkept 0: none recorded (then
		 * named FDSTORE_NAMED_UNRECORDED, kept NULL); only with a root. */
		uint8_t named;
		uint32_t nkept;        /* 0 .. FDSTORE_MAX_KEPT */
		struct fdstore_kept {
			uint32_t uid;  /* st_uid */
			uint64_t dev;  /* st_dev */
			uint64_t ino;  /* st_ino */
			/* st_ctim (ns since the epoch, file_time_ns): nothing
			 * holds the inode while wcached is down, and a
			 * filesystem gives a freed inode number to the next
			 * file made (ext4 does); that file's ctime is its
			 * own, never the recorded one (review rev217 L1). */
			int64_t ctime_ns;
		} *kept;
	} tree;
};

struct fdstore_desc {
	uint64_t status_size;   /* the status page's size in bytes, 16 .. 1 MiB, a multiple of 8 */
	uint32_t nmodels;       /* 0 .. FDSTORE_MAX_MODELS */
	struct fdstore_model *models;
};

/* "wc-<slot>-<gen>-i", the index memfd of a generation, and
 * "wc-<slot>-<gen>-<k>", its k-th file, into buf of cap bytes. Decimal,
 * unique per (slot, gen, k), at most 3 + 20 + 1 + 20 + 1 + 10 bytes.
 * Returns the length, or -ENAMETOOLONG when cap is too small. */
int fdstore_name_index(char *buf, size_t cap, uint64_t slot, uint64_t gen);
int fdstore_name_file(char *buf, size_t cap, uint64_t slot, uint64_t gen, uint32_t k);

/* "wc-<slot>-d<n>-a", derived artifact n's memfd, and "wc-<slot>-d<n>-i",
 * its index memfd (n >= 1, the 'd' keeps them apart from any generation's
 * name). Returns the length, or -ENAMETOOLONG. */
int fdstore_name_artifact(char *buf, size_t cap, uint64_t slot, uint64_t n);
int fdstore_name_artifact_index(char *buf, size_t cap, uint64_t slot, uint64_t n);

/* What a stored name means. */
enum fdstore_name_kind {
	FDSTORE_NAME_KIND_STATUS = 1,
	FDSTORE_NAME_KIND_DESC,
	FDSTORE_NAME_KIND_INDEX,
	FDSTORE_NAME_KIND_FILE,
	FDSTORE_NAME_KIND_ARTIFACT,       /* wc-<slot>-d<n>-a */
	FDSTORE_NAME_KIND_ARTIFACT_INDEX, /* wc-<slot>-d<n>-i */
};

struct fdstore_name {
	enum fdstore_name_kind kind;
	uint64_t slot;             /* all but STATUS and DESC */
	uint64_t generation;       /* INDEX and FILE */
	uint32_t file;             /* FILE */
	uint64_t artifact;         /* ARTIFACT and ARTIFACT_INDEX: n */
};

/* Parses a name of the scheme above, strictly (decimal without leading
 * zeros, slot, generation and artifact number >= 1, file <
 * FDSTORE_MAX_FILES). 0, or
 * -EINVAL with the reason in error_get() for anything else (a name that
 * does not start with "wc-" is not the daemon's). */
int fdstore_name_parse(const char *name, struct fdstore_name *out);

/* The rules a description obeys, beyond the limits of each field: names
 * valid and unique over the whole description (and neither "wc-status"
 * nor "wc-desc"), model names and slots unique, generation numbers unique
 * per model and at most its last_generation, one current and one pending
 * generation at most per model; a generation's holders' uids ascending,
 * with counts of 1 or more that sum to its holders; a file's ctimes 0 when
 * its nlink is 0 (not recorded); each artifact's key valid, its source one
 * of the model's described generations, (source, key) unique per model,
 * its two names "wc-<slot>-d<n>-a" and "-i" of the model's slot and one n,
 * no builder's groups when its builder_gid is FDSTORE_GID_UNRECORDED;
 * a generation's and a tree's named at most FDSTORE_MAX_NAMED, a tree's
 * kept files only with its root and only where its model describes no
 * generation, its named only with kept files, and FDSTORE_MAX_KEPT_ALL of
 * them in all;
 * FDSTORE_MAX_FDS descriptors in all. 0, or -EINVAL naming the field. */
int fdstore_check(const struct fdstore_desc *d);

/* Encodes d (which must pass fdstore_check()) into a malloc'd buffer of
 * *len bytes that the caller frees. 0, -EINVAL naming the field, -E2BIG
 * past FDSTORE_MAX_BYTES, or -ENOMEM. */
int fdstore_encode(const struct fdstore_desc *d, uint8_t **buf, size_t *len);

/* Decodes len bytes of hostile input, version FDSTORE_VERSION_MIN to
 * FDSTORE_VERSION, into a new description (free it with fdstore_free()).
 * 0, or -EBADMSG (malformed: the message names the field and the offset),
 * -EPROTO (another version) or -ENOMEM; *out is untouched on failure and
 * nothing is leaked. Encoding the result gives the oldest version that
 * holds it, 7 at least (an older one's files with origins 0 and 0 before
 * version 4, ctimes and nlink 0 before version 5, and its generations
 * without holders' uids before version 6, and its artifacts with their
 * builder's gid FDSTORE_GID_UNRECORDED and no groups before version 7,
 * and its generations' and trees' named FDSTORE_NAMED_UNRECORDED and no
 * kept files before version 10). */
int fdstore_decode(const uint8_t *buf, size_t len, struct fdstore_desc **out);

/* 1 when a and b describe the same things field by field, else 0. */
int fdstore_equal(const struct fdstore_desc *a, const struct fdstore_desc *b);

/* Frees a description from fdstore_decode() (or built the same way: every
 * pointer malloc'd). Accepts NULL. */
void fdstore_free(struct fdstore_desc *d);

/* The descriptors model m names in the store: each generation's index and
 * files, each artifact's memfd and index. */
size_t fdstore_model_fds(const struct fdstore_model *m);

/* Does model m name the stored descriptor name? 1 or 0. */
int fdstore_model_names(const struct fdstore_model *m, const char *name);

/*
 * Carries prev, a model of an earlier description whose descriptors the
 * store still holds under its names, into dm, the same model (name and
 * slot) described without generations or artifacts: dm gets copies of
 * prev's generations and artifacts, and the higher of the two last
 * generation numbers. The result obeys fdstore_check() when the rest of
 * dm's description names none of prev's names. 0, -EINVAL when dm is not
 * such a model, or -ENOMEM; dm is untouched on failure.
 */
int fdstore_carry(struct fdstore_model *dm, const struct fdstore_model *prev);

/* Puts len bytes into a new memfd called "wcached-fdstore", sealed with
 * FDSTORE_SEALS; *fd is then the caller's. 0 or a negative errno naming
 * the step. */
int fdstore_memfd_make(const uint8_t *buf, size_t len, int *fd);

/* Reads the description memfd fd back after checking it (a regular file
 * sealed with FDSTORE_SEALS, 24 .. FDSTORE_MAX_BYTES bytes); *buf is
 * malloc'd, the caller's; fd stays the caller's. 0 or a negative errno. */
int fdstore_memfd_read(int fd, uint8_t **buf, size_t *len);

#endif /* WC_FDSTORE_H */
