/*
 * config.c: loads and validates wcached's configuration file (see config.h).
 *
 * inih splits "key = value" lines and strips comments; everything else is
 * ours, because the Debian build of inih cannot give us what we need:
 *
 * - Line numbers: the installed <ini.h> declares the handler without a line
 *   number (INI_HANDLER_LINENO is 0 there), so the file is fed to
 *   ini_parse_stream() through our own reader, which counts lines. The
 *   handler runs for the line the reader returned last, so ctx->lineno is
 *   the handler's line.
 * - Sections: inih calls the handler only for keys, so an empty [model x]
 *   or a second empty [wcached] would go unseen, and it cuts section names
 *   at 49 bytes (model names may have 128). The reader parses section
 *   headers itself and hands inih an empty line instead.
 * - Continuation lines: inih treats an indented line after a key as more of
 *   that key's value. The reader strips leading whitespace, so indenting keys
 *   is harmless and there are no continuation lines.
 * - Line length: inih reads lines into a 200-byte buffer and splits longer
 *   ones. The reader reads whole lines (up to CONFIG_LINE_MAX); a key line
 *   too long for inih's buffer is split here with inih's own rules and inih
 *   sees "key=<sentinel>", the handler then takes the value from ctx.
 *
 * The first error stops the parse; its message is "FILE:LINE: reason".
 *
 * This file is the structure of the file: the reader, sections, keys, the
 * errors with their lines, and loading, freeing and comparing configs. What
 * a value means (numbers, sizes, booleans, users and groups, paths) is in
 * config_value.c; the two share config_internal.h.
 */
#include "config.h"
#include "config_internal.h"

#include "error.h"
#include "log.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bounds.h" /* CONFIG_LINE_MAX: the longest line accepted, newline included */

/* What inih sees as the value of a key line that was too long for it; the
 * handler substitutes ctx->long_value (only set for such lines). */
#define LONG_VALUE_SENTINEL "\x01"

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
};

static const char *const model_keys[MK_COUNT] = {
	[MK_PATH] = "path",
	[MK_PIN] = "pin",
	[MK_WARM] = "warm",
	[MK_ALLOW_USERS] = "allow_users",
	[MK_ALLOW_GROUPS] = "allow_groups",
};

/* ---- errors ----------------------------------------------------------- */

/* Records the first error as "FILE:LINE: reason" (or "FILE: reason" when
 * line is 0) in the thread's error message. Later errors are ignored. */
static void __attribute__((format(printf, 4, 0)))
config_verror(struct parse_ctx *ctx, int line, int code, const char *fmt, va_list ap)
{
	char reason[1024];

	if (ctx->err != 0)
		return;
	vsnprintf(reason, sizeof(reason), fmt, ap);
	if (line > 0)
		ctx->err = error_set(code, "%s:%d: %s", ctx->cfg->file, line, reason);
	else
		ctx->err = error_set(code, "%s: %s", ctx->cfg->file, reason);
}

/* An error at the current line (declared in config_internal.h). */
void
config_error(struct parse_ctx *ctx, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	config_verror(ctx, ctx->lineno, code, fmt, ap);
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
	if (!config_model_name_valid(name)) {
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
	m->pin = CONFIG_PIN_METADATA;
	m->warm = true;
	m->line = ctx->lineno;
	ctx->model = cfg->n_models++;
	ctx->section = SEC_MODEL;
	memset(ctx->model_key_line, 0, sizeof(ctx->model_key_line));
}

/* Handles a "[...]" line (s has no leading or trailing whitespace). */
static void
section_line(struct parse_ctx *ctx, char *s)
{
	char *end = strchr(s, ']');
	char *inner = s + 1, *rest;

	section_end(ctx);
	if (ctx->err != 0)
		return;
	if (end == NULL) {
		config_error(ctx, -EINVAL, "section header without closing ']'");
		return;
	}
	rest = end + 1;
	while (*rest == ' ' || *rest == '\t')
		rest++;
	if (*rest != '\0' && *rest != ';' && *rest != '#') {
		config_error(ctx, -EINVAL, "unexpected text after section header: \"%s\"", rest);
		return;
	}
	*end = '\0';
	while (*inner == ' ' || *inner == '\t')
		inner++;
	while (end > inner && (end[-1] == ' ' || end[-1] == '\t'))
		*--end = '\0';

	if (strcmp(inner, "wcached") == 0) {
		if (ctx->wcached_line != 0) {
			config_error(ctx, -EINVAL, "duplicate section [wcached] (first on line %d)",
				ctx->wcached_line);
			return;
		}
		ctx->wcached_line = ctx->lineno;
		ctx->section = SEC_WCACHED;
		return;
	}
	if (strncmp(inner, "model", 5) == 0 &&
		(inner[5] == '\0' || inner[5] == ' ' || inner[5] == '\t')) {
		char *name = inner + 5;

		while (*name == ' ' || *name == '\t')
			name++;
		model_begin(ctx, name);
		return;
	}
	config_error(ctx, -EINVAL, "unknown section [%s] (expected [wcached] or [model NAME])",
		inner);
}

/* ---- keys ------------------------------------------------------------- */

/* Finds key in a table; returns its index or -1. */
static int
key_index(const char *const *table, int n, const char *key)
{
	for (int i = 0; i < n; i++)
		if (strcmp(table[i], key) == 0)
			return i;
	return -1;
}

/* One key of [wcached]. */
static void
wcached_key(struct parse_ctx *ctx, const char *key, const char *value)
{
	struct config *cfg = ctx->cfg;
	int k = key_index(wcached_keys, WK_COUNT, key);
	unsigned long long v;
	const char *why = NULL;
	unsigned id;
	char *copy;
	int r;

	if (k < 0) {
		config_error(ctx, -EINVAL, "unknown key \"%s\" in [wcached]", key);
		return;
	}
	if (ctx->wcached_key_line[k] != 0) {
		config_error(ctx, -EINVAL, "duplicate key \"%s\" (first on line %d)", key,
			ctx->wcached_key_line[k]);
		return;
	}
	ctx->wcached_key_line[k] = ctx->lineno;

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
			config_error(ctx, -EINVAL,
				"log_level: \"%s\" is not one of error, warn, info, debug", value);
		else
			cfg->log_level = r;
		break;
	case WK_MEMORY_BUDGET:
		if (config_parse_memory_budget(value, &cfg->memory_budget,
			    &cfg->memory_budget_value, &why) < 0)
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
	case WK_COUNT:
		break;
	}
}

/* One key of a [model NAME] section. */
static void
model_key(struct parse_ctx *ctx, const char *key, const char *value)
{
	struct model_config *m = ctx_model(ctx);
	int k = key_index(model_keys, MK_COUNT, key);
	char prefix[CONFIG_MODEL_NAME_MAX + 16];
	unsigned *ids;
	size_t n;
	int b;

	snprintf(prefix, sizeof(prefix), "model \"%s\": ", m->name);
	if (k < 0) {
		config_error(ctx, -EINVAL, "%sunknown key \"%s\"", prefix, key);
		return;
	}
	if (ctx->model_key_line[k] != 0) {
		config_error(ctx, -EINVAL, "%sduplicate key \"%s\" (first on line %d)", prefix, key,
			ctx->model_key_line[k]);
		return;
	}
	ctx->model_key_line[k] = ctx->lineno;

	switch ((enum model_key)k) {
	case MK_PATH:
		config_join_path(ctx, prefix, key, value, &m->path);
		break;
	case MK_PIN:
		if (strcmp(value, "none") == 0)
			m->pin = CONFIG_PIN_NONE;
		else if (strcmp(value, "metadata") == 0)
			m->pin = CONFIG_PIN_METADATA;
		else if (strcmp(value, "all") == 0)
			m->pin = CONFIG_PIN_ALL;
		else
			config_error(ctx, -EINVAL,
				"%spin: \"%s\" is not one of none, metadata, all", prefix, value);
		break;
	case MK_WARM:
		b = config_parse_bool(value);
		if (b < 0)
			config_error(ctx, -EINVAL, "%swarm: \"%s\" is not yes or no", prefix,
				value);
		else
			m->warm = b != 0;
		break;
	case MK_ALLOW_USERS:
	case MK_ALLOW_GROUPS: {
		int is_group = k == MK_ALLOW_GROUPS;
		char *raw;

		if (config_resolve_id_list(ctx, prefix, key, value, is_group, &ids, &n) < 0)
			break;
		raw = strdup(value);
		if (raw == NULL) {
			free(ids);
			config_error(ctx, -ENOMEM, "out of memory");
			break;
		}
		if (is_group) {
			m->allow_groups = raw;
			m->gids = (gid_t *)ids;
			m->n_gids = n;
		} else {
			m->allow_users = raw;
			m->uids = (uid_t *)ids;
			m->n_uids = n;
		}
		break;
	}
	case MK_COUNT:
		break;
	}
}

/* inih's handler: called for every "key = value" line with the line the
 * reader returned last. Errors are recorded in ctx; returning nonzero keeps
 * inih from recording a line of its own. */
static int
ini_handler_cb(void *user, const char *section, const char *name, const char *value)
{
	struct parse_ctx *ctx = user;

	(void)section; /* ours is ctx->section; inih never sees a header */
	if (ctx->err != 0)
		return 1;
	if (ctx->long_value != NULL && strcmp(value, LONG_VALUE_SENTINEL) == 0)
		value = ctx->long_value;
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
	return 1;
}

/* ---- the reader ------------------------------------------------------- */

/* inih's find_chars_or_comment(): the first character of s in chars, or
 * the ';' of an inline comment (one preceded by whitespace), or the end. */
static char *
find_chars_or_comment(char *s, const char *chars)
{
	int was_space = 0;

	while (*s != '\0' && (chars == NULL || strchr(chars, *s) == NULL) &&
		!(was_space && *s == ';')) {
		was_space = isspace((unsigned char)*s);
		s++;
	}
	return s;
}

/* Removes trailing whitespace in place. */
static void
rstrip(char *s)
{
	size_t n = strlen(s);

	while (n > 0 && isspace((unsigned char)s[n - 1]))
		s[--n] = '\0';
}

/* A key line too long for inih's buffer: splits it as inih would, keeps the
 * value in ctx->long_value and gives inih "key=SENTINEL" in str. */
static char *
long_key_line(struct parse_ctx *ctx, char *s, char *eq, char *str, int num)
{
	char *value = eq + 1, *vend;

	*eq = '\0';
	rstrip(s);
	if (strlen(s) + sizeof(LONG_VALUE_SENTINEL) + 1 > (size_t)num) {
		config_error(ctx, -EINVAL, "key name too long");
		return NULL;
	}
	vend = find_chars_or_comment(value, NULL);
	*vend = '\0';
	while (isspace((unsigned char)*value))
		value++;
	rstrip(value);
	ctx->long_value = strdup(value);
	if (ctx->long_value == NULL) {
		config_error(ctx, -ENOMEM, "out of memory");
		return NULL;
	}
	snprintf(str, (size_t)num, "%s=%s", s, LONG_VALUE_SENTINEL);
	return str;
}

/* inih's reader: returns the next line of the file in str (at most num - 1
 * bytes), after handling everything inih must not see (see the top of this
 * file). Returns NULL at the end of the file or after the first error. */
static char *
ini_reader_cb(char *str, int num, void *stream)
{
	struct parse_ctx *ctx = stream;
	ssize_t len;
	char *s, *eq;

	free(ctx->long_value);
	ctx->long_value = NULL;
	if (ctx->err != 0 || num < 8)
		return NULL;
	errno = 0;
	len = getline(&ctx->raw, &ctx->raw_cap, ctx->fp);
	if (len < 0) {
		if (ferror(ctx->fp))
			config_error_at(ctx, 0, errno != 0 ? -errno : -EIO, "read error: %s",
				strerror(errno != 0 ? errno : EIO));
		return NULL;
	}
	ctx->lineno++;
	if (len > CONFIG_LINE_MAX) {
		config_error(ctx, -EINVAL, "line too long (%zd bytes, max %d)", len,
			CONFIG_LINE_MAX);
		return NULL;
	}
	if (strlen(ctx->raw) != (size_t)len) {
		config_error(ctx, -EINVAL, "line contains a NUL byte");
		return NULL;
	}
	s = ctx->raw;
	if (ctx->lineno == 1 && len >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0)
		s += 3; /* UTF-8 byte order mark */
	rstrip(s);
	/* All of isspace(), as inih's lskip() has it: a line that inih sees
	 * starting with a vertical tab or a form feed would be a continuation
	 * of the previous key (of any earlier section: inih sees no headers). */
	while (isspace((unsigned char)*s))
		s++;

	str[0] = '\0';
	if (*s == '\0' || *s == ';' || *s == '#')
		return str;
	if (*s == '[') {
		section_line(ctx, s);
		return ctx->err != 0 ? NULL : str;
	}
	eq = find_chars_or_comment(s, "=:");
	if (*eq != '=' && *eq != ':') {
		config_error(ctx, -EINVAL,
			"expected \"key = value\", a [section] or a comment, got \"%s\"", s);
		return NULL;
	}
	if (eq == s) {
		config_error(ctx, -EINVAL, "missing key name before '%c'", *eq);
		return NULL;
	}
	if (strlen(s) + 2 <= (size_t)num) {
		memcpy(str, s, strlen(s) + 1);
		return str;
	}
	return long_key_line(ctx, s, eq, str, num);
}

/* ---- load, free, compare --------------------------------------------- */

/* Checks that need the whole file. */
static void
config_finish(struct parse_ctx *ctx)
{
	struct config *cfg = ctx->cfg;
	int per_uid_line = ctx->wcached_key_line[WK_MAX_CLIENTS_PER_UID];

	section_end(ctx);
	if (cfg->max_clients_per_uid > cfg->max_clients) {
		if (per_uid_line != 0)
			config_error_at(ctx, per_uid_line, -EINVAL,
				"max_clients_per_uid (%u) is larger than max_clients (%u)",
				cfg->max_clients_per_uid, cfg->max_clients);
		else
			cfg->max_clients_per_uid = cfg->max_clients;
	}
	if (strcmp(cfg->socket_path, cfg->control_path) == 0) {
		int a = ctx->wcached_key_line[WK_SOCKET], b = ctx->wcached_key_line[WK_CONTROL];

		config_error_at(ctx, a > b ? a : b, -EINVAL,
			"socket and control are the same path \"%s\"", cfg->socket_path);
	}
}

int
config_load(const char *path, struct config **out)
{
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
	cfg->file = strdup(path);
	cfg->socket_path = strdup(DEFAULT_SOCKET_PATH);
	cfg->control_path = strdup(DEFAULT_CONTROL_PATH);
	if (cfg->file == NULL || cfg->socket_path == NULL || cfg->control_path == NULL) {
		config_free(cfg);
		return error_set(-ENOMEM, "out of memory");
	}
	r = config_dir(path, &cfg->dir);
	if (r < 0) {
		config_free(cfg);
		return r;
	}

	memset(&ctx, 0, sizeof(ctx));
	ctx.cfg = cfg;
	ctx.fp = fopen(path, "re");
	if (ctx.fp == NULL) {
		r = error_set(-errno, "%s: %s", path, strerror(errno));
		config_free(cfg);
		return r;
	}

	r = ini_parse_stream(ini_reader_cb, &ctx, ini_handler_cb, &ctx);
	if (ctx.err == 0) {
		if (r > 0)
			config_error_at(&ctx, r, -EINVAL, "syntax error");
		else if (r == -2)
			config_error_at(&ctx, 0, -ENOMEM, "out of memory");
		else if (r < 0)
			config_error_at(&ctx, 0, -EIO, "cannot parse (inih error %d)", r);
		else
			config_finish(&ctx);
	}
	fclose(ctx.fp);
	free(ctx.raw);
	free(ctx.long_value);
	if (ctx.err != 0) {
		config_free(cfg);
		return ctx.err;
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
	}
	free(cfg->models);
	free(cfg->file);
	free(cfg->dir);
	free(cfg->socket_path);
	free(cfg->control_path);
	free(cfg->control_group);
	free(cfg->user);
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
