/*
 * config_internal.h: what config.c and config_value.c share while one
 * config_load() runs. Private to daemon/config*.c; everyone else uses
 * config.h.
 *
 * client/base/inifile.c reads the file's syntax; config.c gives its sections and
 * keys their meaning and owns the parse context; config_value.c parses and
 * resolves the values it is handed (numbers, sizes, booleans, model names,
 * users and groups, paths). Both report errors through config_error(),
 * which puts the file and the current line in front of the reason.
 */
#ifndef WC_CONFIG_INTERNAL_H
#define WC_CONFIG_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "config.h"
#include "base/inifile.h"

/* The keys of [wcached]; config.c holds their names. */
enum wcached_key {
	WK_SOCKET,
	WK_CONTROL,
	WK_CONTROL_GROUP,
	WK_PREFETCH_THREADS,
	WK_LOG_LEVEL,
	WK_MEMORY_BUDGET,
	WK_MAX_CLIENTS,
	WK_MAX_CLIENTS_PER_UID,
	WK_USER,
	WK_RESTART_HOLD_SECONDS,
	WK_START_WAIT_SECONDS,
	WK_STAGE_DIR,
	WK_UNREAD_REPLY_SECONDS,
	WK_COUNT
};

/* The keys of [model NAME]. */
enum model_key {
	MK_PATH, MK_PIN, MK_WARM, MK_ALLOW_USERS, MK_ALLOW_GROUPS, MK_DERIVE, MK_DERIVE_GROUPS,
	MK_DERIVE_TIMEOUT, MK_WATCH, MK_POLL_INTERVAL, MK_STAGE, MK_COUNT
};

/* The section a line is in: none before the first header. */
enum section_kind { SEC_NONE, SEC_WCACHED, SEC_MODEL };

/* What one config_load() knows while inifile_read() runs. */
struct parse_ctx {
	struct config *cfg;  /* being filled; freed by config_load() on error */
	struct inifile *ini; /* the file being read: its path and current line */
	int err;             /* first error (negative), 0 while all is well */

	enum section_kind section;       /* the section of the current line */
	size_t model;                    /* index of the current model (SEC_MODEL) */
	int wcached_line;                /* line of [wcached], 0 when not seen */
	int wcached_key_line[WK_COUNT];  /* line where each [wcached] key was set, 0 if not */
	int model_key_line[MK_COUNT];    /* the same for the current model */
	size_t models_cap;               /* allocated entries of cfg->models */
};

/* uid_t and gid_t lists are resolved into, and compared as, arrays of
 * unsigned (both are 32-bit unsigned on Linux). */
_Static_assert(sizeof(uid_t) == sizeof(unsigned) && sizeof(gid_t) == sizeof(unsigned),
	"uid_t and gid_t are stored as unsigned");

/* ---- config.c --------------------------------------------------------- */

/* Records the first error of the parse as "FILE:LINE: reason", at the
 * current line, in ctx->err and the thread's error message. Later errors
 * are ignored. */
void config_error(struct parse_ctx *ctx, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* ---- config_value.c --------------------------------------------------- */

/* The functions that take ctx report their errors with config_error() and
 * return 0 or a negative errno-style code; prefix is "" for [wcached] or
 * "model \"NAME\": " for a model's keys. */

/* An integer key in [min, max]. */
int config_parse_int_key(struct parse_ctx *ctx, const char *prefix, const char *key,
	const char *value, unsigned long long min, unsigned long long max,
	unsigned long long *out);

/* yes/no, true/false, on/off, 1/0: returns 1 or 0, or -EINVAL. */
int config_parse_bool(const char *s);

/* memory_budget: "none", a size with a binary unit, or a percentage of RAM.
 * Returns 0, -EDOM for a number without a unit, or -EINVAL with the reason
 * in *why. */
int config_parse_memory_budget(const char *s, enum config_budget *kind, uint64_t *value,
	const char **why);

/* One user or group (a name or a numeric id) resolved to an id. */
int config_resolve_id(struct parse_ctx *ctx, const char *prefix, const char *key,
	const char *token, int is_group, unsigned *id);

/* A comma- or space-separated list of users or groups resolved into a new
 * array of n_ids ids (never empty); the caller frees *ids. */
int config_resolve_id_list(struct parse_ctx *ctx, const char *prefix, const char *key,
	const char *value, int is_group, unsigned **ids, size_t *n_ids);

/* The "user" key: sets cfg->user, cfg->user_uid and cfg->user_gid. */
int config_resolve_user(struct parse_ctx *ctx, const char *value);

/* A duration in seconds, with up to 3 decimals ("2", "0.5"), from min_ms
 * to max_ms milliseconds, into *out_ms; on error reports "PREFIXKEY: ..."
 * and returns -EINVAL. */
int config_parse_seconds_ms(struct parse_ctx *ctx, const char *prefix, const char *key,
	const char *value, unsigned min_ms, unsigned max_ms, unsigned *out_ms);

/* A path key's value joined with the config file's directory
 * (inifile_join()), new in *out: an empty value, or a result of PATH_MAX
 * bytes or more, is an error. */
int config_join_path(struct parse_ctx *ctx, const char *prefix, const char *key,
	const char *value, char **out);

/* config_join_path() for a unix socket address (must fit in sun_path); on
 * success frees the old *out and stores the new path. */
int config_socket_path(struct parse_ctx *ctx, const char *key, const char *value, char **out);

#endif /* WC_CONFIG_INTERNAL_H */
