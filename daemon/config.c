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
 */
#include "config.h"

#include "error.h"
#include "log.h"

#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <ini.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

/* Longest line accepted, newline included. */
#define CONFIG_LINE_MAX 65536

/* What inih sees as the value of a key line that was too long for it; the
 * handler substitutes ctx->long_value (only set for such lines). */
#define LONG_VALUE_SENTINEL "\x01"

/* Largest buffer for getpwnam_r/getgrnam_r before giving up. */
#define NSS_BUFFER_MAX (1024 * 1024)

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
	WK_COUNT
};

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

enum model_key { MK_PATH, MK_PIN, MK_WARM, MK_ALLOW_USERS, MK_ALLOW_GROUPS, MK_COUNT };

static const char *const model_keys[MK_COUNT] = {
	[MK_PATH] = "path",
	[MK_PIN] = "pin",
	[MK_WARM] = "warm",
	[MK_ALLOW_USERS] = "allow_users",
	[MK_ALLOW_GROUPS] = "allow_groups",
};

enum section_kind { SEC_NONE, SEC_WCACHED, SEC_MODEL };

/* State shared by the reader and the handler during one config_load(). */
struct parse_ctx {
	struct config *cfg;
	FILE *fp;
	int lineno;       /* line the reader returned last */
	char *raw;        /* getline() buffer */
	size_t raw_cap;
	char *long_value; /* value of the current line when it was too long for inih */
	int err;          /* first error (negative), 0 while all is well */

	enum section_kind section;
	size_t model;                    /* index of the current model (SEC_MODEL) */
	int wcached_line;                /* line of [wcached], 0 when not seen */
	int wcached_key_line[WK_COUNT];  /* line where each [wcached] key was set */
	int model_key_line[MK_COUNT];    /* the same for the current model */
	size_t models_cap;
};

/* Records the first error as "FILE:LINE: reason" (or "FILE: reason" when
 * line is 0) in the thread's error message. Later errors are ignored. */
static void __attribute__((format(printf, 4, 0)))
ctx_verror(struct parse_ctx *ctx, int line, int code, const char *fmt, va_list ap)
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

/* An error at the current line. */
static void __attribute__((format(printf, 3, 4)))
ctx_error(struct parse_ctx *ctx, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	ctx_verror(ctx, ctx->lineno, code, fmt, ap);
	va_end(ap);
}

/* An error at a given line. */
static void __attribute__((format(printf, 4, 5)))
ctx_error_at(struct parse_ctx *ctx, int line, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	ctx_verror(ctx, line, code, fmt, ap);
	va_end(ap);
}

/* The model being parsed (valid only in SEC_MODEL). */
static struct model_config *
ctx_model(struct parse_ctx *ctx)
{
	return &ctx->cfg->models[ctx->model];
}

/* ---- value parsers ---------------------------------------------------- */

/* Parses a whole unsigned decimal number <= max: no sign, no spaces, no
 * suffix. Returns 0, -EINVAL (not a number) or -ERANGE (> max). */
static int
parse_unsigned(const char *s, unsigned long long max, unsigned long long *out)
{
	unsigned long long v = 0;

	if (*s == '\0')
		return -EINVAL;
	for (; *s != '\0'; s++) {
		if (*s < '0' || *s > '9')
			return -EINVAL;
		if (__builtin_mul_overflow(v, 10ull, &v) ||
			__builtin_add_overflow(v, (unsigned long long)(*s - '0'), &v))
			return -ERANGE;
	}
	if (v > max)
		return -ERANGE;
	*out = v;
	return 0;
}

/* Parses an integer key in [min, max] and reports errors with the key's
 * name. prefix is "" or "model \"NAME\": ". */
static int
parse_int_key(struct parse_ctx *ctx, const char *prefix, const char *key, const char *value,
	unsigned long long min, unsigned long long max, unsigned long long *out)
{
	unsigned long long v = 0;
	int r = parse_unsigned(value, ULLONG_MAX, &v);

	if (r == -EINVAL) {
		ctx_error(ctx, -EINVAL, "%s%s: \"%s\" is not a number", prefix, key, value);
		return -EINVAL;
	}
	if (r < 0 || v < min || v > max) {
		ctx_error(ctx, -EINVAL, "%s%s: %s is out of range (%llu..%llu)", prefix, key, value,
			min, max);
		return -EINVAL;
	}
	*out = v;
	return 0;
}

/* Parses yes/no (and true/false, on/off, 1/0). Returns 0/1, or -EINVAL. */
static int
parse_bool(const char *s)
{
	if (strcmp(s, "yes") == 0 || strcmp(s, "true") == 0 || strcmp(s, "on") == 0 ||
		strcmp(s, "1") == 0)
		return 1;
	if (strcmp(s, "no") == 0 || strcmp(s, "false") == 0 || strcmp(s, "off") == 0 ||
		strcmp(s, "0") == 0)
		return 0;
	return -EINVAL;
}

/* Parses memory_budget: "none", a byte count with an optional binary unit
 * (K, M, G, T, optionally followed by "B" or "iB"; "B" alone is bytes; case
 * does not matter; spaces between number and unit are allowed), or an
 * integer percentage of RAM from 1 to 100 ("80%"). On error stores the
 * reason in why. */
static int
parse_memory_budget(const char *s, enum config_budget *kind, uint64_t *value, const char **why)
{
	unsigned long long n = 0;
	const char *p = s;
	unsigned shift = 0;

	if (strcmp(s, "none") == 0) {
		*kind = CONFIG_BUDGET_NONE;
		*value = 0;
		return 0;
	}
	if (*p < '0' || *p > '9') {
		*why = "expected a size such as 64G or 512M, a percentage such as 80%, or none";
		return -EINVAL;
	}
	for (; *p >= '0' && *p <= '9'; p++) {
		if (__builtin_mul_overflow(n, 10ull, &n) ||
			__builtin_add_overflow(n, (unsigned long long)(*p - '0'), &n)) {
			*why = "number too large";
			return -EINVAL;
		}
	}
	while (*p == ' ' || *p == '\t')
		p++;
	if (*p == '%') {
		if (p[1] != '\0') {
			*why = "unexpected text after '%'";
			return -EINVAL;
		}
		if (n < 1 || n > 100) {
			*why = "percentage must be from 1% to 100%";
			return -EINVAL;
		}
		*kind = CONFIG_BUDGET_PERCENT;
		*value = n;
		return 0;
	}
	switch (toupper((unsigned char)*p)) {
	case '\0':
		break;
	case 'B':
		p++;
		break;
	case 'K':
		shift = 10;
		break;
	case 'M':
		shift = 20;
		break;
	case 'G':
		shift = 30;
		break;
	case 'T':
		shift = 40;
		break;
	default:
		*why = "unknown unit (use K, M, G, T or %)";
		return -EINVAL;
	}
	if (shift != 0) {
		p++;
		if (p[0] == 'i' && toupper((unsigned char)p[1]) == 'B')
			p += 2;
		else if (toupper((unsigned char)p[0]) == 'B')
			p++;
	}
	if (*p != '\0') {
		*why = "unknown unit (use K, M, G, T or %)";
		return -EINVAL;
	}
	if (n == 0) {
		*why = "must be greater than 0 (use none for no budget)";
		return -EINVAL;
	}
	if (n > (UINT64_MAX >> shift)) {
		*why = "size too large";
		return -EINVAL;
	}
	*kind = CONFIG_BUDGET_BYTES;
	*value = (uint64_t)n << shift;
	return 0;
}

/* Whether s is a valid model name (see config.h). */
static int
model_name_valid(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > CONFIG_MODEL_NAME_MAX || s[0] == '.' || s[0] == '-')
		return 0;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
			    c == '.' || c == '_' || c == '-'))
			return 0;
	}
	return 1;
}

/* ---- users and groups ------------------------------------------------- */

/* Initial buffer size for the reentrant NSS functions. */
static size_t
nss_buffer_size(int which)
{
	long n = sysconf(which);

	return n > 0 && n < NSS_BUFFER_MAX ? (size_t)n : 16384;
}

/* Whether a getpw*_r/getgr*_r error means "no such entry" (see the NOTES of
 * getpwnam(3): implementations use several codes for it). */
static int
nss_not_found(int e)
{
	return e == 0 || e == ENOENT || e == ESRCH || e == EBADF || e == EPERM;
}

/* Looks up a user by name, or by the uid id when name is NULL. Returns 0
 * with the uid and primary gid, -ENOENT when there is no such user, or
 * -errno. */
static int
lookup_user(const char *name, uid_t id, uid_t *uid, gid_t *gid)
{
	size_t size = nss_buffer_size(_SC_GETPW_R_SIZE_MAX);

	for (;;) {
		struct passwd pw, *res = NULL;
		char *buf = malloc(size);
		int e;

		if (buf == NULL)
			return -ENOMEM;
		if (name != NULL)
			e = getpwnam_r(name, &pw, buf, size, &res);
		else
			e = getpwuid_r(id, &pw, buf, size, &res);
		if (res != NULL) {
			*uid = pw.pw_uid;
			*gid = pw.pw_gid;
			free(buf);
			return 0;
		}
		free(buf);
		if (e == ERANGE && size < NSS_BUFFER_MAX) {
			size *= 2;
			continue;
		}
		return nss_not_found(e) ? -ENOENT : -e;
	}
}

/* Looks up a group by name. Returns 0, -ENOENT or -errno. */
static int
lookup_group(const char *name, gid_t *gid)
{
	size_t size = nss_buffer_size(_SC_GETGR_R_SIZE_MAX);

	for (;;) {
		struct group gr, *res = NULL;
		char *buf = malloc(size);
		int e;

		if (buf == NULL)
			return -ENOMEM;
		e = getgrnam_r(name, &gr, buf, size, &res);
		if (res != NULL) {
			*gid = gr.gr_gid;
			free(buf);
			return 0;
		}
		free(buf);
		if (e == ERANGE && size < NSS_BUFFER_MAX) {
			size *= 2;
			continue;
		}
		return nss_not_found(e) ? -ENOENT : -e;
	}
}

/* Whether s is all digits (a numeric uid or gid rather than a name). */
static int
all_digits(const char *s)
{
	if (*s == '\0')
		return 0;
	for (; *s != '\0'; s++)
		if (*s < '0' || *s > '9')
			return 0;
	return 1;
}

/* Resolves one user or group token (a name, or a numeric id below the
 * invalid id (uid_t)-1) to an id. Reports errors as "PREFIXKEY: reason". */
static int
resolve_id(struct parse_ctx *ctx, const char *prefix, const char *key, const char *token,
	int is_group, unsigned *id)
{
	unsigned long long v = 0;
	uid_t uid = 0;
	gid_t gid = 0;
	int r;

	if (all_digits(token)) {
		if (parse_unsigned(token, (unsigned long long)UINT32_MAX - 1, &v) < 0) {
			ctx_error(ctx, -EINVAL, "%s%s: id %s is out of range", prefix, key, token);
			return -EINVAL;
		}
		*id = (unsigned)v;
		return 0;
	}
	r = is_group ? lookup_group(token, &gid) : lookup_user(token, 0, &uid, &gid);
	if (r == -ENOENT) {
		ctx_error(ctx, -EINVAL, "%s%s: unknown %s \"%s\"", prefix, key,
			is_group ? "group" : "user", token);
		return -EINVAL;
	}
	if (r < 0) {
		ctx_error(ctx, r, "%s%s: cannot look up %s \"%s\": %s", prefix, key,
			is_group ? "group" : "user", token, strerror(-r));
		return r;
	}
	*id = is_group ? (unsigned)gid : (unsigned)uid;
	return 0;
}

/* Resolves a comma- or space-separated list of users or groups into a new
 * array of ids in *ids (uid_t and gid_t are both 32-bit unsigned on Linux,
 * see the static assertion below). */
_Static_assert(sizeof(uid_t) == sizeof(unsigned) && sizeof(gid_t) == sizeof(unsigned),
	"uid_t and gid_t are stored as unsigned");

static int
resolve_id_list(struct parse_ctx *ctx, const char *prefix, const char *key, const char *value,
	int is_group, unsigned **ids, size_t *n_ids)
{
	char *copy = strdup(value), *save = NULL, *tok;
	unsigned *list = NULL;
	size_t n = 0, cap = 0;
	int r = 0;

	if (copy == NULL) {
		ctx_error(ctx, -ENOMEM, "out of memory");
		return -ENOMEM;
	}
	for (tok = strtok_r(copy, ", \t", &save); tok != NULL; tok = strtok_r(NULL, ", \t", &save)) {
		if (n == cap) {
			size_t ncap = cap != 0 ? cap * 2 : 8;
			unsigned *nl = reallocarray(list, ncap, sizeof(*list));

			if (nl == NULL) {
				ctx_error(ctx, -ENOMEM, "out of memory");
				r = -ENOMEM;
				break;
			}
			list = nl;
			cap = ncap;
		}
		r = resolve_id(ctx, prefix, key, tok, is_group, &list[n]);
		if (r < 0)
			break;
		n++;
	}
	free(copy);
	if (r == 0 && n == 0) {
		ctx_error(ctx, -EINVAL, "%s%s: empty list", prefix, key);
		r = -EINVAL;
	}
	if (r < 0) {
		free(list);
		return r;
	}
	*ids = list;
	*n_ids = n;
	return 0;
}

/* ---- paths ------------------------------------------------------------ */

/* Joins a relative value with the config file's directory; copies an
 * absolute one. Leading "./" components are dropped. */
static int
join_path(struct parse_ctx *ctx, const char *prefix, const char *key, const char *value,
	char **out)
{
	const char *dir = ctx->cfg->dir;
	char *p;

	if (*value == '\0') {
		ctx_error(ctx, -EINVAL, "%s%s: empty value", prefix, key);
		return -EINVAL;
	}
	if (value[0] == '/') {
		p = strdup(value);
	} else {
		while (value[0] == '.' && value[1] == '/') {
			value += 2;
			while (*value == '/')
				value++;
		}
		if (*value == '\0' || strcmp(value, ".") == 0)
			p = strdup(dir);
		else if (asprintf(&p, "%s%s%s", dir, strcmp(dir, "/") == 0 ? "" : "/", value) < 0)
			p = NULL;
	}
	if (p == NULL) {
		ctx_error(ctx, -ENOMEM, "out of memory");
		return -ENOMEM;
	}
	if (strlen(p) >= PATH_MAX) {
		ctx_error(ctx, -EINVAL, "%s%s: path too long (%zu bytes)", prefix, key, strlen(p));
		free(p);
		return -EINVAL;
	}
	*out = p;
	return 0;
}

/* join_path() for a unix socket address, which must fit in sun_path. */
static int
socket_path(struct parse_ctx *ctx, const char *key, const char *value, char **out)
{
	struct sockaddr_un sun;
	char *p;
	int r = join_path(ctx, "", key, value, &p);

	if (r < 0)
		return r;
	if (strlen(p) >= sizeof(sun.sun_path)) {
		ctx_error(ctx, -EINVAL,
			"%s: \"%s\" is too long for a unix socket (%zu bytes, max %zu)", key, p,
			strlen(p), sizeof(sun.sun_path) - 1);
		free(p);
		return -EINVAL;
	}
	free(*out);
	*out = p;
	return 0;
}

/* Computes the absolute directory holding the config file. */
static int
config_dir(const char *path, char **out)
{
	char *abs, *slash;

	if (path[0] == '/') {
		abs = strdup(path);
	} else {
		char *cwd = getcwd(NULL, 0);

		if (cwd == NULL)
			return error_set(-errno, "%s: cannot get the current directory: %s", path,
				strerror(errno));
		while (path[0] == '.' && path[1] == '/') {
			path += 2;
			while (*path == '/')
				path++;
		}
		if (asprintf(&abs, "%s%s%s", cwd, strcmp(cwd, "/") == 0 ? "" : "/", path) < 0)
			abs = NULL;
		free(cwd);
	}
	if (abs == NULL)
		return error_set(-ENOMEM, "out of memory");
	slash = strrchr(abs, '/');
	if (slash == abs)
		slash[1] = '\0'; /* the file is in "/" */
	else
		*slash = '\0';
	*out = abs;
	return 0;
}

/* ---- sections --------------------------------------------------------- */

/* Checks the section that ends (at a new header or the end of the file). */
static void
section_end(struct parse_ctx *ctx)
{
	if (ctx->section == SEC_MODEL && ctx_model(ctx)->path == NULL) {
		struct model_config *m = ctx_model(ctx);

		ctx_error_at(ctx, m->line, -EINVAL, "model \"%s\": no path (add \"path = ...\")",
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
		ctx_error(ctx, -EINVAL, "model section without a name (use [model NAME])");
		return;
	}
	if (!model_name_valid(name)) {
		ctx_error(ctx, -EINVAL,
			"invalid model name \"%s\" (1 to %d of A-Z a-z 0-9 . _ -, not starting "
			"with '.' or '-')",
			name, CONFIG_MODEL_NAME_MAX);
		return;
	}
	for (size_t i = 0; i < cfg->n_models; i++) {
		if (strcmp(cfg->models[i].name, name) == 0) {
			ctx_error(ctx, -EINVAL, "duplicate model \"%s\" (first on line %d)", name,
				cfg->models[i].line);
			return;
		}
	}
	if (cfg->n_models >= CONFIG_MAX_MODELS) {
		ctx_error(ctx, -EINVAL, "too many models (max %d)", CONFIG_MAX_MODELS);
		return;
	}
	if (cfg->n_models == ctx->models_cap) {
		size_t ncap = ctx->models_cap != 0 ? ctx->models_cap * 2 : 8;
		struct model_config *nm = reallocarray(cfg->models, ncap, sizeof(*nm));

		if (nm == NULL) {
			ctx_error(ctx, -ENOMEM, "out of memory");
			return;
		}
		cfg->models = nm;
		ctx->models_cap = ncap;
	}
	m = &cfg->models[cfg->n_models];
	memset(m, 0, sizeof(*m));
	m->name = strdup(name);
	if (m->name == NULL) {
		ctx_error(ctx, -ENOMEM, "out of memory");
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
		ctx_error(ctx, -EINVAL, "section header without closing ']'");
		return;
	}
	rest = end + 1;
	while (*rest == ' ' || *rest == '\t')
		rest++;
	if (*rest != '\0' && *rest != ';' && *rest != '#') {
		ctx_error(ctx, -EINVAL, "unexpected text after section header: \"%s\"", rest);
		return;
	}
	*end = '\0';
	while (*inner == ' ' || *inner == '\t')
		inner++;
	while (end > inner && (end[-1] == ' ' || end[-1] == '\t'))
		*--end = '\0';

	if (strcmp(inner, "wcached") == 0) {
		if (ctx->wcached_line != 0) {
			ctx_error(ctx, -EINVAL, "duplicate section [wcached] (first on line %d)",
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
	ctx_error(ctx, -EINVAL, "unknown section [%s] (expected [wcached] or [model NAME])", inner);
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
		ctx_error(ctx, -EINVAL, "unknown key \"%s\" in [wcached]", key);
		return;
	}
	if (ctx->wcached_key_line[k] != 0) {
		ctx_error(ctx, -EINVAL, "duplicate key \"%s\" (first on line %d)", key,
			ctx->wcached_key_line[k]);
		return;
	}
	ctx->wcached_key_line[k] = ctx->lineno;

	switch ((enum wcached_key)k) {
	case WK_SOCKET:
		socket_path(ctx, key, value, &cfg->socket_path);
		break;
	case WK_CONTROL:
		socket_path(ctx, key, value, &cfg->control_path);
		break;
	case WK_CONTROL_GROUP:
		if (resolve_id(ctx, "", key, value, 1, &id) < 0)
			break;
		if ((copy = strdup(value)) == NULL) {
			ctx_error(ctx, -ENOMEM, "out of memory");
			break;
		}
		cfg->control_group = copy;
		cfg->control_gid = (gid_t)id;
		break;
	case WK_PREFETCH_THREADS:
		if (parse_int_key(ctx, "", key, value, 1, CONFIG_MAX_PREFETCH_THREADS, &v) == 0)
			cfg->prefetch_threads = (int)v;
		break;
	case WK_LOG_LEVEL:
		r = log_level_parse(value);
		if (r < 0)
			ctx_error(ctx, -EINVAL,
				"log_level: \"%s\" is not one of error, warn, info, debug", value);
		else
			cfg->log_level = r;
		break;
	case WK_MEMORY_BUDGET:
		if (parse_memory_budget(value, &cfg->memory_budget, &cfg->memory_budget_value,
			    &why) < 0)
			ctx_error(ctx, -EINVAL, "memory_budget: \"%s\": %s", value, why);
		break;
	case WK_MAX_CLIENTS:
		if (parse_int_key(ctx, "", key, value, 1, CONFIG_MAX_CLIENTS_LIMIT, &v) == 0)
			cfg->max_clients = (unsigned)v;
		break;
	case WK_MAX_CLIENTS_PER_UID:
		if (parse_int_key(ctx, "", key, value, 1, CONFIG_MAX_CLIENTS_LIMIT, &v) == 0)
			cfg->max_clients_per_uid = (unsigned)v;
		break;
	case WK_USER:
		if (*value == '\0') {
			ctx_error(ctx, -EINVAL, "user: empty value");
			break;
		}
		if (all_digits(value)) {
			if (parse_unsigned(value, (unsigned long long)UINT32_MAX - 1, &v) < 0) {
				ctx_error(ctx, -EINVAL, "user: id %s is out of range", value);
				break;
			}
			r = lookup_user(NULL, (uid_t)v, &cfg->user_uid, &cfg->user_gid);
		} else {
			r = lookup_user(value, 0, &cfg->user_uid, &cfg->user_gid);
		}
		if (r == -ENOENT) {
			ctx_error(ctx, -EINVAL, "user: unknown user \"%s\"", value);
			break;
		}
		if (r < 0) {
			ctx_error(ctx, r, "user: cannot look up \"%s\": %s", value, strerror(-r));
			break;
		}
		if ((cfg->user = strdup(value)) == NULL)
			ctx_error(ctx, -ENOMEM, "out of memory");
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
		ctx_error(ctx, -EINVAL, "%sunknown key \"%s\"", prefix, key);
		return;
	}
	if (ctx->model_key_line[k] != 0) {
		ctx_error(ctx, -EINVAL, "%sduplicate key \"%s\" (first on line %d)", prefix, key,
			ctx->model_key_line[k]);
		return;
	}
	ctx->model_key_line[k] = ctx->lineno;

	switch ((enum model_key)k) {
	case MK_PATH:
		join_path(ctx, prefix, key, value, &m->path);
		break;
	case MK_PIN:
		if (strcmp(value, "none") == 0)
			m->pin = CONFIG_PIN_NONE;
		else if (strcmp(value, "metadata") == 0)
			m->pin = CONFIG_PIN_METADATA;
		else if (strcmp(value, "all") == 0)
			m->pin = CONFIG_PIN_ALL;
		else
			ctx_error(ctx, -EINVAL, "%spin: \"%s\" is not one of none, metadata, all",
				prefix, value);
		break;
	case MK_WARM:
		b = parse_bool(value);
		if (b < 0)
			ctx_error(ctx, -EINVAL, "%swarm: \"%s\" is not yes or no", prefix, value);
		else
			m->warm = b != 0;
		break;
	case MK_ALLOW_USERS:
	case MK_ALLOW_GROUPS: {
		int is_group = k == MK_ALLOW_GROUPS;
		char *raw;

		if (resolve_id_list(ctx, prefix, key, value, is_group, &ids, &n) < 0)
			break;
		raw = strdup(value);
		if (raw == NULL) {
			free(ids);
			ctx_error(ctx, -ENOMEM, "out of memory");
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
		ctx_error(ctx, -EINVAL,
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
		ctx_error(ctx, -EINVAL, "key name too long");
		return NULL;
	}
	vend = find_chars_or_comment(value, NULL);
	*vend = '\0';
	while (isspace((unsigned char)*value))
		value++;
	rstrip(value);
	ctx->long_value = strdup(value);
	if (ctx->long_value == NULL) {
		ctx_error(ctx, -ENOMEM, "out of memory");
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
			ctx_error_at(ctx, 0, errno != 0 ? -errno : -EIO, "read error: %s",
				strerror(errno != 0 ? errno : EIO));
		return NULL;
	}
	ctx->lineno++;
	if (len > CONFIG_LINE_MAX) {
		ctx_error(ctx, -EINVAL, "line too long (%zd bytes, max %d)", len, CONFIG_LINE_MAX);
		return NULL;
	}
	if (strlen(ctx->raw) != (size_t)len) {
		ctx_error(ctx, -EINVAL, "line contains a NUL byte");
		return NULL;
	}
	s = ctx->raw;
	if (ctx->lineno == 1 && len >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0)
		s += 3; /* UTF-8 byte order mark */
	rstrip(s);
	while (*s == ' ' || *s == '\t')
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
		ctx_error(ctx, -EINVAL,
			"expected \"key = value\", a [section] or a comment, got \"%s\"", s);
		return NULL;
	}
	if (eq == s) {
		ctx_error(ctx, -EINVAL, "missing key name before '%c'", *eq);
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
			ctx_error_at(ctx, per_uid_line, -EINVAL,
				"max_clients_per_uid (%u) is larger than max_clients (%u)",
				cfg->max_clients_per_uid, cfg->max_clients);
		else
			cfg->max_clients_per_uid = cfg->max_clients;
	}
	if (strcmp(cfg->socket_path, cfg->control_path) == 0) {
		int a = ctx->wcached_key_line[WK_SOCKET], b = ctx->wcached_key_line[WK_CONTROL];

		ctx_error_at(ctx, a > b ? a : b, -EINVAL,
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
	cfg->socket_path = strdup(CONFIG_DEFAULT_SOCKET);
	cfg->control_path = strdup(CONFIG_DEFAULT_CONTROL);
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
			ctx_error_at(&ctx, r, -EINVAL, "syntax error");
		else if (r == -2)
			ctx_error_at(&ctx, 0, -ENOMEM, "out of memory");
		else if (r < 0)
			ctx_error_at(&ctx, 0, -EIO, "cannot parse (inih error %d)", r);
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
