/*
 * config.c: loads and validates wcached's configuration file (see config.h).
 *
 * The file's syntax is read by client/base/inifile.c (inih, shared with
 * wcachectl); this file is what its sections and keys mean: [wcached] and
 * [model NAME], the keys of each, duplicates, the checks that need the whole
 * file, and loading, freeing and comparing configs. What a value means
 * (numbers, sizes, booleans, users and groups, paths) is in config_value.c;
 * the two share config_internal.h.
 *
 * The first error stops the parse; its message is "FILE:LINE: reason".
 */
#include "config.h"
#include "config_internal.h"

#include "base/error.h"
#include "base/inifile.h"
#include "log.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const wcached_keys[WK_COUNT] = {
	[WK_SOCKET] = "socket",
	[WK_CONTROL] = "control",
	[WK_CONTROL_GROUP] = "control_group",
	[WK_PREFETCH_THREADS] = "prefetch_threads",
	[WK_LOG_LEVEL] = "log_level",
	[WK_MEMORY_BUDGET] = "memory_budget",
	[WK_MAX_CLIENTS] = "max_clients",
	[WK_MAX_CLIENTS_PER_UID] = "max_clients_per_uid",
	[WK_USER] = "user",
	[WK_RESTART_HOLD_SECONDS] = "restart_hold_seconds",
	[WK_START_WAIT_SECONDS] = "start_wait_seconds",
	[WK_STAGE_DIR] = "stage_dir",
	[WK_UNREAD_REPLY_SECONDS] = "unread_reply_seconds",
};

static const char *const model_keys[MK_COUNT] = {
	[MK_PATH] = "path",
	[MK_PIN] = "pin",
	[MK_WARM] = "warm",
	[MK_ALLOW_USERS] = "allow_users",
	[MK_ALLOW_GROUPS] = "allow_groups",
	[MK_DERIVE] = "derive",
	[MK_DERIVE_GROUPS] = "derive_groups",
	[MK_DERIVE_TIMEOUT] = "derive_timeout",
	[MK_WATCH] = "watch",
	[MK_POLL_INTERVAL] = "poll_interval",
	[MK_STAGE] = "stage",
};

/* ---- errors ----------------------------------------------------------- */

/* Records the first error of the parse (see config_error()). */
static void __attribute__((format(printf, 4, 0)))
config_verror(struct parse_ctx *ctx, int line, int code, const char *fmt, va_list ap)
{
	char reason[1024];

	if (ctx->err != 0)
		return;
	vsnprintf(reason, sizeof(reason), fmt, ap);
	ctx->err = inifile_error_at(ctx->ini, line, code, "%s", reason);
}

/* An error at the current line (declared in config_internal.h). */
void
config_error(struct parse_ctx *ctx, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	config_verror(ctx, inifile_line(ctx->ini), code, fmt, ap);
	va_end(ap);
}

/* An error at a given line. */
static void __attribute__((format(printf, 4, 5)))
config_error_at(struct parse_ctx *ctx, int line, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	config_verror(ctx, line, code, fmt, ap);
	va_end(ap);
}

/* The model being parsed (valid only in SEC_MODEL). */
static struct model_config *
ctx_model(struct parse_ctx *ctx)
{
	return &ctx->cfg->models[ctx->model];
}

/* ---- sections --------------------------------------------------------- */

/* Checks the section that ends (at a new header or the end of the file). */
static void
section_end(struct parse_ctx *ctx)
{
	if (ctx->section == SEC_MODEL && ctx_model(ctx)->path == NULL) {
		struct model_config *m = ctx_model(ctx);

		config_error_at(ctx, m->line, -EINVAL, "model \"%s\": no path (add \"path = ...\")",
			m->name);
	}
	ctx->section = SEC_NONE;
}

/* Starts a [model NAME] section. */
static void
model_begin(struct parse_ctx *ctx, const char *name)
{
	struct config *cfg = ctx->cfg;
	struct model_config *m;

	if (*name == '\0') {
		config_error(ctx, -EINVAL, "model section without a name (use [model NAME])");
		return;
	}
	if (!model_name_valid(name)) {
		config_error(ctx, -EINVAL,
			"invalid model name \"%s\" (1 to %d of A-Z a-z 0-9 . _ -, not starting "
			"with '.' or '-')",
			name, CONFIG_MODEL_NAME_MAX);
		return;
	}
	for (size_t i = 0; i < cfg->n_models; i++) {
		if (strcmp(cfg->models[i].name, name) == 0) {
			config_error(ctx, -EINVAL, "duplicate model \"%s\" (first on line %d)",
				name, cfg->models[i].line);
			return;
		}
	}
	if (cfg->n_models >= CONFIG_MAX_MODELS) {
		config_error(ctx, -EINVAL, "too many models (max %d)", CONFIG_MAX_MODELS);
		return;
	}
	if (cfg->n_models == ctx->models_cap) {
		size_t ncap = ctx->models_cap != 0 ? ctx->models_cap * 2 : 8;
		struct model_config *nm = reallocarray(cfg->models, ncap, sizeof(*nm));

		if (nm == NULL) {
			config_error(ctx, -ENOMEM, "out of memory");
			return;
		}
		cfg->models = nm;
		ctx->models_cap = ncap;
	}
	m = &cfg->models[cfg->n_models];
	memset(m, 0, sizeof(*m));
	m->name = strdup(name);
	if (m->name == NULL) {
		config_error(ctx, -ENOMEM, "out of memory");
		return;
	}
	m->pin = PIN_METADATA;
	m->warm = true;
	m->derive_timeout = CONFIG_DEFAULT_DERIVE_TIMEOUT;
	m->poll_interval_ms = CONFIG_DEFAULT_POLL_INTERVAL_MS;
	m->line = inifile_line(ctx->ini);
	ctx->model = cfg->n_models++;
	ctx->section = SEC_MODEL;
	memset(ctx->model_key_line, 0, sizeof(ctx->model_key_line));
}

/* inifile's section callback: a "[NAME]" line. */
static int
section_cb(struct inifile *ini, const char *name, void *arg)
{
	struct parse_ctx *ctx = arg;

	ctx->ini = ini;
	section_end(ctx);
	if (ctx->err != 0)
		return ctx->err;
	if (strcmp(name, "wcached") == 0) {
		if (ctx->wcached_line != 0)
			config_error(ctx, -EINVAL, "duplicate section [wcached] (first on line %d)",
				ctx->wcached_line);
		ctx->wcached_line = inifile_line(ini);
		ctx->section = SEC_WCACHED;
		return ctx->err;
	}
	if (strncmp(name, "model", 5) == 0 &&
		(name[5] == '\0' || name[5] == ' ' || name[5] == '\t')) {
		const char *model = name + 5;

		while (*model == ' ' || *model == '\t')
			model++;
		model_begin(ctx, model);
		return ctx->err;
	}
	config_error(ctx, -EINVAL, "unknown section [%s] (expected [wcached] or [model NAME])",
		name);
	return ctx->err;
}

/* ---- keys ------------------------------------------------------------- */

/* A bad value of a key that takes words (log_level, pin, warm...):
 * "KEY: "VALUE" is WHAT". prefix as in config_parse_int_key. */
static void
word_error(struct parse_ctx *ctx, const char *prefix, const char *key, const char *value,
	const char *what)
{
	config_error(ctx, -EINVAL, "%s%s: \"%s\" is %s", prefix, key, value, what);
}

/* Reads value into key k of a section (prefix as in config_parse_int_key). */
typedef void value_fn(struct parse_ctx *ctx, int k, const char *prefix, const char *key,
	const char *value);

/*
 * Reads value into key k through set, one rule for every key: a value in
 * quotes ("..." or '...') of a key that is not a path (a path's quotes are
 * part of its name) is read without them; when it reads so, an error says
 * that the quotes are all that is wrong. `log_level = "debug"` read
 * `""debug""` and named the words it already was (review rev223 L9); the
 * numbers, sizes and users still did, and the hint named words that were
 * refused too (`(log_level = verbose)`: review rev224 L3, L7). When the
 * unquoted value does not read, its own error stands.
 */
static void
read_value(struct parse_ctx *ctx, value_fn *set, int k, int is_path, const char *prefix,
	const char *key, const char *value)
{
	size_t n = strlen(value);
	char *bare;

	if (is_path || n < 2 || (value[0] != '"' && value[0] != '\'') || value[n - 1] != value[0]) {
		set(ctx, k, prefix, key, value);
		return;
	}
	if ((bare = strndup(value + 1, n - 2)) == NULL) {
		config_error(ctx, -ENOMEM, "out of memory");
		return;
	}
	set(ctx, k, prefix, key, bare);
	if (ctx->err == 0)
		config_error(ctx, -EINVAL, "%s%s: %s: values are written without quotes (%s = %s)",
			prefix, key, value, key, bare);
	free(bare);
}

/* Finds key in a table; returns its index or -1. */
static int
key_index(const char *const *table, int n, const char *key)
{
	for (int i = 0; i < n; i++)
		if (strcmp(table[i], key) == 0)
			return i;
	return -1;
}

/* memory_budget = a number without a unit (value: its digits): which unit
 * was meant cannot be told, and 64 bytes, what it gave, evicted every
 * unpinned model at once; an error naming the spellings that say it
 * (review rev223 M1). */
static void
budget_unit_error(struct parse_ctx *ctx, const char *value)
{
	int n = (int)strspn(value, "0123456789");
	char pct[64] = "";

	if (n <= 3 && strtoul(value, NULL, 10) <= 100)
		snprintf(pct, sizeof(pct), ", or %.*s%% for that share of RAM", n, value);
	config_error(ctx, -EINVAL, "memory_budget: \"%s\": a size needs a unit: %.*sG for "
		"%.*s GiB, %.*sM for %.*s MiB (K, M, G, T; B for bytes)%s", value, n, value, n,
		value, n, value, n, value, pct);
}

/* The value of [wcached]'s key k (value_fn; prefix is ""). */
static void
wcached_value(struct parse_ctx *ctx, int k, const char *prefix, const char *key,
	const char *value)
{
	struct config *cfg = ctx->cfg;
	unsigned long long v;
	const char *why = NULL;
	unsigned id;
	char *copy;
	int r;

	(void)prefix;
	switch ((enum wcached_key)k) {
	case WK_SOCKET:
		config_socket_path(ctx, key, value, &cfg->socket_path);
		break;
	case WK_CONTROL:
		config_socket_path(ctx, key, value, &cfg->control_path);
		break;
	case WK_CONTROL_GROUP:
		if (config_resolve_id(ctx, "", key, value, 1, &id) < 0)
			break;
		if ((copy = strdup(value)) == NULL) {
			config_error(ctx, -ENOMEM, "out of memory");
			break;
		}
		cfg->control_group = copy;
		cfg->control_gid = (gid_t)id;
		break;
	case WK_PREFETCH_THREADS:
		if (config_parse_int_key(ctx, "", key, value, 1, CONFIG_MAX_PREFETCH_THREADS,
			    &v) == 0)
			cfg->prefetch_threads = (int)v;
		break;
	case WK_LOG_LEVEL:
		r = log_level_parse(value);
		if (r < 0)
			word_error(ctx, "", key, value, "not one of error, warn, info, debug");
		else
			cfg->log_level = r;
		break;
	case WK_MEMORY_BUDGET:
		r = config_parse_memory_budget(value, &cfg->memory_budget,
			&cfg->memory_budget_value, &why);
		if (r == -EDOM)
			budget_unit_error(ctx, value);
		else if (r < 0)
			config_error(ctx, -EINVAL, "memory_budget: \"%s\": %s", value, why);
		break;
	case WK_MAX_CLIENTS:
		if (config_parse_int_key(ctx, "", key, value, 1, CONFIG_MAX_CLIENTS_LIMIT, &v) == 0)
			cfg->max_clients = (unsigned)v;
		break;
	case WK_MAX_CLIENTS_PER_UID:
		if (config_parse_int_key(ctx, "", key, value, 1, CONFIG_MAX_CLIENTS_LIMIT, &v) == 0)
			cfg->max_clients_per_uid = (unsigned)v;
		break;
	case WK_USER:
		config_resolve_user(ctx, value);
		break;
	case WK_RESTART_HOLD_SECONDS:
		if (config_parse_int_key(ctx, "", key, value, 0, CONFIG_MAX_RESTART_HOLD_SECONDS,
			    &v) == 0)
			cfg->restart_hold_seconds = (unsigned)v;
		break;
	case WK_START_WAIT_SECONDS:
		if (config_parse_int_key(ctx, "", key, value, 0, CONFIG_MAX_START_WAIT_SECONDS,
			    &v) == 0)
			cfg->start_wait_seconds = (unsigned)v;
		break;
	case WK_UNREAD_REPLY_SECONDS:
		if (config_parse_int_key(ctx, "", key, value, 1, CONFIG_MAX_UNREAD_REPLY_SECONDS,
			    &v) == 0)
			cfg->unread_reply_seconds = (unsigned)v;
		break;
	case WK_STAGE_DIR:
		free(cfg->stage_dir);
		cfg->stage_dir = NULL;
		config_join_path(ctx, "", key, value, &cfg->stage_dir);
		break;
	case WK_COUNT:
		break;
	}
}

/* One key of [wcached]. */
static void
wcached_key(struct parse_ctx *ctx, const char *key, const char *value)
{
	int k = key_index(wcached_keys, WK_COUNT, key);

	if (k < 0) {
		config_error(ctx, -EINVAL, "unknown key \"%s\" in [wcached]", key);
		return;
	}
	if (ctx->wcached_key_line[k] != 0) {
		config_error(ctx, -EINVAL, "duplicate key \"%s\" (first on line %d)", key,
			ctx->wcached_key_line[k]);
		return;
	}
	ctx->wcached_key_line[k] = inifile_line(ctx->ini);
	read_value(ctx, wcached_value, k, k == WK_SOCKET || k == WK_CONTROL || k == WK_STAGE_DIR,
		"", key, value);
}

/* A yes-or-no key (config_parse_bool's words) into *out; an error said
 * through ctx leaves *out as it was. */
static void
bool_key(struct parse_ctx *ctx, const char *prefix, const char *key, const char *value,
	bool *out)
{
	int b = config_parse_bool(value);

	if (b < 0)
		word_error(ctx, prefix, key, value, "not yes or no");
	else
		*out = b != 0;
}

/* A key that names users or groups (allow_users, allow_groups,
 * derive_groups): its text as written into *raw and the ids it names into
 * *ids and *n; 0, or -1 with the error said through ctx and nothing set. */
static int
id_list_key(struct parse_ctx *ctx, const char *prefix, const char *key, const char *value,
	int is_group, char **raw, unsigned **ids, size_t *n)
{
	char *copy;

	if (config_resolve_id_list(ctx, prefix, key, value, is_group, ids, n) < 0)
		return -1;
	if ((copy = strdup(value)) == NULL) {
		free(*ids);
		config_error(ctx, -ENOMEM, "out of memory");
		return -1;
	}
	*raw = copy;
	return 0;
}

/* The value of a [model NAME] section's key k (value_fn). */
static void
model_value(struct parse_ctx *ctx, int k, const char *prefix, const char *key,
	const char *value)
{
	struct model_config *m = ctx_model(ctx);
	unsigned *ids;
	size_t n;

	switch ((enum model_key)k) {
	case MK_PATH:
		config_join_path(ctx, prefix, key, value, &m->path);
		break;
	case MK_PIN:
		if (pin_mode_parse(value, &m->pin) < 0)
			word_error(ctx, prefix, key, value, "not one of none, metadata, all");
		break;
	case MK_WARM:
		bool_key(ctx, prefix, key, value, &m->warm);
		break;
	case MK_ALLOW_USERS:
		if (id_list_key(ctx, prefix, key, value, 0, &m->allow_users, &ids, &n) == 0) {
			m->uids = (uid_t *)ids;
			m->n_uids = n;
		}
		break;
	case MK_ALLOW_GROUPS:
		if (id_list_key(ctx, prefix, key, value, 1, &m->allow_groups, &ids, &n) == 0) {
			m->gids = (gid_t *)ids;
			m->n_gids = n;
		}
		break;
	case MK_DERIVE:
		bool_key(ctx, prefix, key, value, &m->derive);
		break;
	case MK_DERIVE_GROUPS:
		if (id_list_key(ctx, prefix, key, value, 1, &m->derive_groups, &ids, &n) == 0) {
			m->derive_gids = (gid_t *)ids;
			m->n_derive_gids = n;
		}
		break;
	case MK_DERIVE_TIMEOUT: {
		unsigned long long v;

		if (config_parse_int_key(ctx, prefix, key, value, 1, CONFIG_MAX_DERIVE_TIMEOUT,
			    &v) == 0)
			m->derive_timeout = (unsigned)v;
		break;
	}
	case MK_WATCH:
		if (fs_watch_parse(value, &m->watch) < 0)
			word_error(ctx, prefix, key, value, "not one of auto, inotify, poll");
		break;
	case MK_POLL_INTERVAL:
		config_parse_seconds_ms(ctx, prefix, key, value, CONFIG_MIN_POLL_INTERVAL_MS,
			CONFIG_MAX_POLL_INTERVAL_MS, &m->poll_interval_ms);
		break;
	case MK_STAGE:
		if (fs_stage_parse(value, &m->stage) < 0)
			word_error(ctx, prefix, key, value, "not one of auto, yes, no");
		break;
	case MK_COUNT:
		break;
	}
}

/* One key of a [model NAME] section. */
static void
model_key(struct parse_ctx *ctx, const char *key, const char *value)
{
	int k = key_index(model_keys, MK_COUNT, key);
	char prefix[CONFIG_MODEL_NAME_MAX + 16];

	snprintf(prefix, sizeof(prefix), "model \"%s\": ", ctx_model(ctx)->name);
	if (k < 0) {
		config_error(ctx, -EINVAL, "%sunknown key \"%s\"", prefix, key);
		return;
	}
	if (ctx->model_key_line[k] != 0) {
		config_error(ctx, -EINVAL, "%sduplicate key \"%s\" (first on line %d)", prefix, key,
			ctx->model_key_line[k]);
		return;
	}
	ctx->model_key_line[k] = inifile_line(ctx->ini);
	read_value(ctx, model_value, k, k == MK_PATH, prefix, key, value);
}

/* inifile's key callback: a "key = value" line. */
static int
key_cb(struct inifile *ini, const char *name, const char *value, void *arg)
{
	struct parse_ctx *ctx = arg;

	ctx->ini = ini;
	switch (ctx->section) {
	case SEC_NONE:
		config_error(ctx, -EINVAL,
			"key \"%s\" outside a section (put it under [wcached] or [model NAME])",
			name);
		break;
	case SEC_WCACHED:
		wcached_key(ctx, name, value);
		break;
	case SEC_MODEL:
		model_key(ctx, name, value);
		break;
	}
	return ctx->err;
}

/* ---- load, free, compare --------------------------------------------- */

/* path in out, spelled plainly: repeated slashes and "." components dropped
 * ("/run//x.sock" and "/run/./x.sock" are "/run/x.sock"). ".." is left as
 * it is: through a symbolic link it may not lead where it seems to. */
static void
path_plain(const char *path, char *out, size_t size)
{
	size_t len = 0;

	while (*path != '\0' && len + 1 < size) {
		if (path[0] == '/' && (path[1] == '/' ||
			(path[1] == '.' && (path[2] == '/' || path[2] == '\0')))) {
			path += path[1] == '/' ? 1 : 2;
			continue;
		}
		out[len++] = *path++;
	}
	out[len] = '\0';
}

/*
 * Whether socket paths a and b (absolute) name the same socket in two
 * spellings: the same plain spelling (path_plain), or the same last name in
 * one directory reached two ways (a symbolic link, ".."), when both
 * directories exist. wcached would make its control socket, then find it
 * where the client socket goes and die blaming another program.
 */
static int
same_socket(const char *a, const char *b)
{
	char pa[PATH_MAX], pb[PATH_MAX];
	char *sa, *sb;
	struct stat da, db;

	path_plain(a, pa, sizeof(pa));
	path_plain(b, pb, sizeof(pb));
	if (strcmp(pa, pb) == 0)
		return 1;
	if ((sa = strrchr(pa, '/')) == NULL || (sb = strrchr(pb, '/')) == NULL ||
		strcmp(sa + 1, sb + 1) != 0)
		return 0;
	*(sa == pa ? sa + 1 : sa) = '\0';
	*(sb == pb ? sb + 1 : sb) = '\0';
	return stat(pa, &da) == 0 && stat(pb, &db) == 0 && da.st_dev == db.st_dev &&
	       da.st_ino == db.st_ino;
}

/* inifile's end callback: the checks that need the whole file. */
static int
end_cb(struct inifile *ini, void *arg)
{
	struct parse_ctx *ctx = arg;
	struct config *cfg = ctx->cfg;
	int per_uid_line = ctx->wcached_key_line[WK_MAX_CLIENTS_PER_UID];

	ctx->ini = ini;
	section_end(ctx);
	if (cfg->max_clients_per_uid > cfg->max_clients) {
		if (per_uid_line != 0)
			config_error_at(ctx, per_uid_line, -EINVAL,
				"max_clients_per_uid (%u) is larger than max_clients (%u)",
				cfg->max_clients_per_uid, cfg->max_clients);
		else
			cfg->max_clients_per_uid = cfg->max_clients;
	}
	if (same_socket(cfg->socket_path, cfg->control_path)) {
		int a = ctx->wcached_key_line[WK_SOCKET], b = ctx->wcached_key_line[WK_CONTROL];

		if (strcmp(cfg->socket_path, cfg->control_path) == 0)
			config_error_at(ctx, a > b ? a : b, -EINVAL,
				"socket and control are the same path \"%s\"", cfg->socket_path);
		else
			config_error_at(ctx, a > b ? a : b, -EINVAL,
				"socket \"%s\" and control \"%s\" name the same socket (one "
				"path, spelled two ways): give the control socket a path of its "
				"own",
				cfg->socket_path, cfg->control_path);
	}
	return ctx->err;
}

int
config_load(const char *path, struct config **out)
{
	static const struct inifile_handler handler = { section_cb, key_cb, end_cb };
	struct parse_ctx ctx;
	struct config *cfg;
	int r;

	cfg = calloc(1, sizeof(*cfg));
	if (cfg == NULL)
		return error_set(-ENOMEM, "out of memory");
	cfg->prefetch_threads = CONFIG_DEFAULT_PREFETCH_THREADS;
	cfg->log_level = LOG_LEVEL_INFO;
	cfg->memory_budget = CONFIG_BUDGET_NONE;
	cfg->max_clients = CONFIG_DEFAULT_MAX_CLIENTS;
	cfg->max_clients_per_uid = CONFIG_DEFAULT_MAX_CLIENTS_PER_UID;
	cfg->restart_hold_seconds = CONFIG_DEFAULT_RESTART_HOLD_SECONDS;
	cfg->start_wait_seconds = CONFIG_DEFAULT_START_WAIT_SECONDS;
	cfg->unread_reply_seconds = CONFIG_DEFAULT_UNREAD_REPLY_SECONDS;
	cfg->file = strdup(path);
	cfg->socket_path = strdup(DEFAULT_SOCKET_PATH);
	cfg->control_path = strdup(DEFAULT_CONTROL_PATH);
	cfg->stage_dir = strdup(CONFIG_DEFAULT_STAGE_DIR);
	if (cfg->file == NULL || cfg->socket_path == NULL || cfg->control_path == NULL ||
		cfg->stage_dir == NULL) {
		config_free(cfg);
		return error_set(-ENOMEM, "out of memory");
	}
	r = inifile_dir(path, &cfg->dir);
	if (r < 0) {
		config_free(cfg);
		return r;
	}

	memset(&ctx, 0, sizeof(ctx));
	ctx.cfg = cfg;
	r = inifile_read(path, &handler, &ctx);
	if (r < 0) {
		config_free(cfg);
		return r;
	}
	*out = cfg;
	return 0;
}

void
config_free(struct config *cfg)
{
	if (cfg == NULL)
		return;
	for (size_t i = 0; i < cfg->n_models; i++) {
		struct model_config *m = &cfg->models[i];

		free(m->name);
		free(m->path);
		free(m->allow_users);
		free(m->allow_groups);
		free(m->uids);
		free(m->gids);
		free(m->derive_groups);
		free(m->derive_gids);
	}
	free(cfg->models);
	free(cfg->file);
	free(cfg->dir);
	free(cfg->socket_path);
	free(cfg->control_path);
	free(cfg->control_group);
	free(cfg->user);
	free(cfg->user_name);
	free(cfg->stage_dir);
	free(cfg);
}

const struct model_config *
config_model_find(const struct config *cfg, const char *name)
{
	if (cfg == NULL || name == NULL)
		return NULL;
	for (size_t i = 0; i < cfg->n_models; i++)
		if (strcmp(cfg->models[i].name, name) == 0)
			return &cfg->models[i];
	return NULL;
}

uint64_t
config_memory_budget(const struct config *cfg, uint64_t ram_bytes)
{
	switch (cfg->memory_budget) {
	case CONFIG_BUDGET_BYTES:
		return cfg->memory_budget_value;
	case CONFIG_BUDGET_PERCENT:
		/* ram / 100 * pct + remainder part, without overflow. */
		return ram_bytes / 100 * cfg->memory_budget_value +
			ram_bytes % 100 * cfg->memory_budget_value / 100;
	case CONFIG_BUDGET_NONE:
		break;
	}
	return 0;
}

/* Whether every id of a is in b. */
static int
ids_subset(const unsigned *a, size_t na, const unsigned *b, size_t nb)
{
	for (size_t i = 0; i < na; i++) {
		size_t j = 0;

		while (j < nb && b[j] != a[i])
			j++;
		if (j == nb)
			return 0;
	}
	return 1;
}

/* Whether two id lists hold the same ids (order and repeats ignored). */
static int
ids_equal(const unsigned *a, size_t na, const unsigned *b, size_t nb)
{
	return ids_subset(a, na, b, nb) && ids_subset(b, nb, a, na);
}

unsigned
config_model_changes(const struct model_config *a, const struct model_config *b)
{
	unsigned changes = 0;

	if (strcmp(a->path, b->path) != 0)
		changes |= CONFIG_CHANGED_PATH;
	if (a->pin != b->pin)
		changes |= CONFIG_CHANGED_PIN;
	if (a->warm != b->warm)
		changes |= CONFIG_CHANGED_WARM;
	if ((a->allow_users == NULL) != (b->allow_users == NULL) ||
		(a->allow_groups == NULL) != (b->allow_groups == NULL) ||
		!ids_equal((const unsigned *)a->uids, a->n_uids, (const unsigned *)b->uids,
			b->n_uids) ||
		!ids_equal((const unsigned *)a->gids, a->n_gids, (const unsigned *)b->gids,
			b->n_gids))
		changes |= CONFIG_CHANGED_ACCESS;
	if (a->derive != b->derive || a->derive_timeout != b->derive_timeout ||
		!ids_equal((const unsigned *)a->derive_gids, a->n_derive_gids,
			(const unsigned *)b->derive_gids, b->n_derive_gids))
		changes |= CONFIG_CHANGED_DERIVE;
	if (a->watch != b->watch || a->poll_interval_ms != b->poll_interval_ms)
		changes |= CONFIG_CHANGED_WATCH;
	if (a->stage != b->stage)
		changes |= CONFIG_CHANGED_STAGE;
	return changes;
}

void
config_diff(const struct config *old_cfg, const struct config *new_cfg, config_diff_fn fn,
	void *arg)
{
	if (old_cfg != NULL) {
		for (size_t i = 0; i < old_cfg->n_models; i++) {
			const struct model_config *m = &old_cfg->models[i];

			if (config_model_find(new_cfg, m->name) == NULL)
				fn(CONFIG_MODEL_REMOVED, m, NULL, 0, arg);
		}
	}
	if (new_cfg == NULL)
		return;
	for (size_t i = 0; i < new_cfg->n_models; i++) {
		const struct model_config *m = &new_cfg->models[i];
		const struct model_config *o = config_model_find(old_cfg, m->name);
		unsigned changes;

		if (o == NULL) {
			fn(CONFIG_MODEL_ADDED, NULL, m, 0, arg);
			continue;
		}
		changes = config_model_changes(o, m);
		if (changes != 0)
			fn(CONFIG_MODEL_CHANGED, o, m, changes, arg);
	}
}
