/*
 * config.h: wcached's configuration file (INI syntax, read with inih).
 *
 *   [wcached]
 *   socket = /run/wcached/wcached.sock    ; client socket
 *   control = /run/wcached/control.sock   ; control socket
 *   control_group = wcache                ; group (name or gid) allowed on the control socket
 *   prefetch_threads = 2                  ; 1..64
 *   log_level = info                      ; error | warn | info | debug
 *   memory_budget = 64G                   ; bytes with K/M/G/T suffix, or "80%" of RAM, or none
 *   max_clients = 1024
 *   max_clients_per_uid = 256
 *   user = wcache                         ; user (name or uid) to run as
 *   restart_hold_seconds = 60             ; 0..86400: after a warm restart, how long a
 *                                         ; generation workers held waits for their HOLD
 *   start_wait_seconds = 30               ; 0..86400: how long start-up waits for every
 *                                         ; model to load before it serves those that did
 *   unread_reply_seconds = 60             ; 1..86400: a client connection that leaves its
 *                                         ; replies unread this long, one held back, closes
 *   stage_dir = /var/cache/wcached/staged ; local copies of models on shared storage
 *
 *   [model llama-3-8b]
 *   path = /models/llama-3-8b             ; safetensors file, shard index or directory, or WEIG
 *   pin = metadata                        ; none | metadata | all
 *   warm = yes                            ; yes | no
 *   allow_users = alice, 1001             ; names or uids, comma or space separated
 *   allow_groups = ml                     ; names or gids
 *   derive = no                           ; yes: workers may share derived artifacts
 *   derive_groups = ml-builders           ; names or gids that may build them
 *   derive_timeout = 600                  ; 1..86400 s a builder has to publish
 *   watch = auto                          ; auto | inotify | poll: how updates are seen
 *   poll_interval = 2                     ; 0.1..3600 s between polls of its paths
 *   stage = auto                          ; auto | yes | no: copy to stage_dir first
 *
 * The syntax is client/base/inifile.h's (inih's, shared with wcachectl):
 * comments start with ';' or '#' at the start of a line, or with ';' after
 * whitespace inside a line. Leading whitespace is ignored (there are no
 * continuation lines). Lines may be of any length up to 64 KiB.
 *
 * Relative paths (socket, control, a model's path) are relative to the
 * directory of the configuration file; the loaded config holds them joined
 * into absolute paths. Model paths are not opened or checked here: the
 * registry does that when it loads the model.
 *
 * Errors are strict: an unknown section or key, a bad value, a duplicate key
 * in a section, a second [wcached], a duplicate model, a model without path,
 * an unknown user or group, or a line that is not a section header, a
 * "key = value" pair or a comment. config_load() stops at the first error and
 * its message is "FILE:LINE: reason", for example
 *   /etc/wcached.conf:12: model "llama": unknown key "pth"
 */
#ifndef WC_CONFIG_H
#define WC_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto/defaults.h" /* DEFAULT_SOCKET_PATH, DEFAULT_CONTROL_PATH */
#include "fstype.h"
#include "proto/model_name.h"
#include "proto/pin.h"

#define CONFIG_DEFAULT_PREFETCH_THREADS 2
#define CONFIG_MAX_PREFETCH_THREADS 64
#define CONFIG_DEFAULT_MAX_CLIENTS 1024
#define CONFIG_DEFAULT_MAX_CLIENTS_PER_UID 256
#define CONFIG_MAX_CLIENTS_LIMIT 1000000 /* upper bound accepted for both */
#define CONFIG_MAX_MODELS 4096
#define CONFIG_DEFAULT_RESTART_HOLD_SECONDS 60
#define CONFIG_MAX_RESTART_HOLD_SECONDS 86400
#define CONFIG_DEFAULT_START_WAIT_SECONDS 30
#define CONFIG_MAX_START_WAIT_SECONDS 86400
#define CONFIG_DEFAULT_UNREAD_REPLY_SECONDS 60
#define CONFIG_MAX_UNREAD_REPLY_SECONDS 86400
#define CONFIG_DEFAULT_DERIVE_TIMEOUT 600
#define CONFIG_MAX_DERIVE_TIMEOUT 86400
#define CONFIG_MODEL_NAME_MAX MODEL_NAME_MAX /* model_name_valid() */
#define CONFIG_DEFAULT_POLL_INTERVAL_MS 2000
#define CONFIG_MIN_POLL_INTERVAL_MS 100
#define CONFIG_MAX_POLL_INTERVAL_MS 3600000
#define CONFIG_DEFAULT_STAGE_DIR "/var/cache/wcached/staged"

/* How memory_budget was given. */
enum config_budget {
	CONFIG_BUDGET_NONE = 0,    /* absent or "none": no budget */
	CONFIG_BUDGET_BYTES = 1,   /* memory_budget_value is a byte count (> 0) */
	CONFIG_BUDGET_PERCENT = 2, /* memory_budget_value is 1..100 percent of RAM */
};

/* One [model NAME] section. All strings are owned by the config. */
struct model_config {
	char *name;            /* 1..128 bytes of [A-Za-z0-9._-], not starting with '.' or '-' */
	char *path;            /* absolute (joined with the config file's directory) */
	enum pin_mode pin;     /* the "pin" key, default PIN_METADATA */
	bool warm;             /* default true */
	/* Access lists. When both raw strings are NULL the model has no list and
	 * any peer that can reach the client socket may attach it. When either
	 * is set, a peer may attach it only if its uid is in uids or one of its
	 * groups is in gids (the registry/server applies this rule). */
	char *allow_users;     /* raw value as written, or NULL when absent */
	char *allow_groups;    /* raw value as written, or NULL when absent */
	uid_t *uids;           /* allow_users resolved, n_uids entries, in order written */
	size_t n_uids;
	gid_t *gids;           /* allow_groups resolved, n_gids entries */
	size_t n_gids;
	/* Derived artifacts (README, "Derived weights"): off unless derive is
	 * set; who may build them: root, wcached's own user, and members of
	 * derive_gids (none when derive_groups is absent). */
	bool derive;           /* default false */
	char *derive_groups;   /* raw value, or NULL when absent */
	gid_t *derive_gids;    /* derive_groups resolved */
	size_t n_derive_gids;
	unsigned derive_timeout; /* seconds a builder has to publish, 1..86400, default 600 */
	/* Shared storage (README, "Models on shared storage"): how updates are
	 * seen, how often paths are polled, whether the files are copied to
	 * stage_dir before they are served. */
	enum fs_watch watch;   /* default FS_WATCH_AUTO */
	unsigned poll_interval_ms; /* 100..3600000, default 2000 */
	enum fs_stage stage;   /* default FS_STAGE_AUTO */
	int line;              /* line of the [model NAME] header */
};

/* A loaded configuration. Every field has its default when the file does not
 * set it. Everything is owned by the struct and freed by config_free(). */
struct config {
	char *file;            /* the path config_load() was given */
	char *dir;             /* absolute directory of the file, base of relative paths */

	/* [wcached] */
	char *socket_path;     /* absolute; fits in sun_path */
	char *control_path;    /* absolute; fits in sun_path */
	char *control_group;   /* raw value, or NULL when absent */
	gid_t control_gid;     /* resolved control_group; valid when control_group != NULL */
	int prefetch_threads;  /* 1..64, default 2 */
	int log_level;         /* enum log_level (log.h), default LOG_LEVEL_INFO */
	enum config_budget memory_budget;
	uint64_t memory_budget_value; /* bytes or percent, see enum config_budget */
	unsigned max_clients;         /* 1..CONFIG_MAX_CLIENTS_LIMIT, default 1024 */
	unsigned max_clients_per_uid; /* 1..max_clients, default min(256, max_clients) */
	char *user;            /* raw value, or NULL when absent (stay as started) */
	char *user_name;       /* that user's name in the passwd entry (for a uid too) */
	uid_t user_uid;        /* resolved user; valid when user != NULL */
	gid_t user_gid;        /* that user's primary group from the passwd entry */
	unsigned restart_hold_seconds; /* 0..86400, default 60 (restore.h) */
	unsigned start_wait_seconds;   /* 0..86400, default 30: serving waits for loads */
	unsigned unread_reply_seconds; /* 1..86400, default 60: a client connection whose
					  replies stay unread this long, one held back, is closed */
	/* Absolute; where staged copies go (default CONFIG_DEFAULT_STAGE_DIR). */
	char *stage_dir;

	/* [model NAME] sections, in file order; names are unique. */
	struct model_config *models;
	size_t n_models;
};

/* Reads and validates the configuration file at path. On success stores a
 * new config in *out (free it with config_free()) and returns 0. On failure
 * returns a negative errno-style code, leaves *out untouched and sets the
 * message (error_get()): -EINVAL for a syntax or validation error
 * ("FILE:LINE: reason"), the open or read error ("FILE: No such file or
 * directory"), the error of a user or group lookup that failed for another
 * reason than "no such name" ("FILE:LINE: ... cannot look up ..."), or
 * -ENOMEM.
 *
 * Looks up user and group names with getpwnam_r/getgrnam_r, which may block
 * for a while when NSS asks a directory service (LDAP, sssd). It has no
 * global state of its own. */
int config_load(const char *path, struct config **out);

/* Frees a config from config_load(). Accepts NULL. */
void config_free(struct config *cfg);

/* The model called name, or NULL. Linear search (the list is short). */
const struct model_config *config_model_find(const struct config *cfg, const char *name);

/* The memory budget in bytes for a host with ram_bytes of RAM: the byte
 * count, or ram_bytes * percent / 100, or 0 when there is no budget. */
uint64_t config_memory_budget(const struct config *cfg, uint64_t ram_bytes);

/* Bits of config_model_changes(): what differs between two models of the
 * same name. Line numbers and raw access-list spelling are not compared
 * (the resolved uid and gid lists are, as ordered sets). */
#define CONFIG_CHANGED_PATH 0x1u   /* path differs: load a new generation */
#define CONFIG_CHANGED_PIN 0x2u    /* pin differs */
#define CONFIG_CHANGED_WARM 0x4u   /* warm differs */
#define CONFIG_CHANGED_ACCESS 0x8u /* allow_users/allow_groups differ */
#define CONFIG_CHANGED_DERIVE 0x10u /* derive, derive_groups or derive_timeout differ */
#define CONFIG_CHANGED_WATCH 0x20u  /* watch or poll_interval differ */
#define CONFIG_CHANGED_STAGE 0x40u  /* stage differs: load a new generation */

/* Returns the CONFIG_CHANGED_* bits for a and b (0 when equivalent). */
unsigned config_model_changes(const struct model_config *a, const struct model_config *b);

/* What config_diff() reports for a model. */
enum config_change {
	CONFIG_MODEL_REMOVED, /* in old only: old_model set, new_model NULL */
	CONFIG_MODEL_ADDED,   /* in new only: old_model NULL, new_model set */
	CONFIG_MODEL_CHANGED, /* in both, changes != 0: both set */
};

typedef void (*config_diff_fn)(enum config_change change, const struct model_config *old_model,
	const struct model_config *new_model, unsigned changes, void *arg);

/* Compares the models of two configs by name, for SIGHUP: calls fn once for
 * every removed model (in old's order), then once for every added or changed
 * model (in new's order). Unchanged models are not reported. Settings of the
 * [wcached] section are not compared: the caller decides which of those it
 * can apply without a restart (socket paths cannot). old may be NULL (every
 * model of new is added). */
void config_diff(const struct config *old_cfg, const struct config *new_cfg, config_diff_fn fn,
	void *arg);

#endif /* WC_CONFIG_H */
