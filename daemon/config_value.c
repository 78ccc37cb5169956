/*
 * config_value.c: the values of wcached's configuration file (see config.h):
 * numbers, sizes and percentages, booleans, model names, users and groups,
 * and paths.
 *
 * config.c reads the file and knows its sections and keys; it hands each
 * value here to be parsed or resolved. Keeping the value rules apart keeps
 * the reader about the file's structure (lines, sections, duplicates), and
 * keeps the user and group lookups (nss.h's, which may block on LDAP or
 * sssd) and path joining in one place. The functions that take the parse
 * context report their errors through config_error(), so every message
 * still carries the file and line of the value.
 */
#include "config_internal.h"

#include "base/decimal.h"
#include "base/error.h"
#include "base/inifile.h"
#include "nss.h"

#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

/* ---- value parsers ---------------------------------------------------- */

/* Parses a whole unsigned decimal number <= max: no sign, no spaces, no
 * suffix. Returns 0, -EINVAL (not a number) or -ERANGE (> max). */
static int
parse_unsigned(const char *s, unsigned long long max, unsigned long long *out)
{
	uint64_t v;
	int r = decimal_u64(s, strlen(s), &v);

	if (r < 0)
		return r;
	if (v > max)
		return -ERANGE;
	*out = v;
	return 0;
}

/* Parses an integer key in [min, max] and reports errors with the key's
 * name. prefix is "" or "model \"NAME\": ". */
int
config_parse_int_key(struct parse_ctx *ctx, const char *prefix, const char *key, const char *value,
	unsigned long long min, unsigned long long max, unsigned long long *out)
{
	unsigned long long v = 0;
	int r = parse_unsigned(value, ULLONG_MAX, &v);

	if (r == -EINVAL) {
		config_error(ctx, -EINVAL, "%s%s: \"%s\" is not a number", prefix, key, value);
		return -EINVAL;
	}
	if (r < 0 || v < min || v > max) {
		config_error(ctx, -EINVAL, "%s%s: %s is out of range (%llu..%llu)", prefix, key,
			value, min, max);
		return -EINVAL;
	}
	*out = v;
	return 0;
}

int
config_parse_seconds_ms(struct parse_ctx *ctx, const char *prefix, const char *key,
	const char *value, unsigned min_ms, unsigned max_ms, unsigned *out_ms)
{
	unsigned long long ms = 0;
	const char *p = value;
	int decimals = 0;

	if (*p < '0' || *p > '9')
		goto bad;
	for (; *p >= '0' && *p <= '9'; p++) {
		ms = ms * 10 + (unsigned long long)(*p - '0');
		if (ms > max_ms)
			goto range;
	}
	ms *= 1000;
	if (*p == '.') {
		unsigned long long scale = 100;

		for (p++; *p >= '0' && *p <= '9'; p++, decimals++) {
			if (decimals == 3)
				goto bad;
			ms += (unsigned long long)(*p - '0') * scale;
			scale /= 10;
		}
		if (decimals == 0)
			goto bad;
	}
	if (*p != '\0')
		goto bad;
	if (ms < min_ms || ms > max_ms)
		goto range;
	*out_ms = (unsigned)ms;
	return 0;
bad:
	config_error(ctx, -EINVAL, "%s%s: \"%s\" is not a number of seconds (e.g. 2 or 0.5)",
		prefix, key, value);
	return -EINVAL;
range:
	config_error(ctx, -EINVAL, "%s%s: %s is out of range (%u.%03u..%u seconds)", prefix, key,
		value, min_ms / 1000, min_ms % 1000, max_ms / 1000);
	return -EINVAL;
}

/* Parses yes/no (and true/false, on/off, 1/0). Returns 0/1, or -EINVAL. */
int
config_parse_bool(const char *s)
{
	if (strcmp(s, "yes") == 0 || strcmp(s, "true") == 0 || strcmp(s, "on") == 0 ||
		strcmp(s, "1") == 0)
		return 1;
	if (strcmp(s, "no") == 0 || strcmp(s, "false") == 0 || strcmp(s, "off") == 0 ||
		strcmp(s, "0") == 0)
		return 0;
	return -EINVAL;
}

/* Parses memory_budget: "none", a byte count with a binary unit (K, M, G,
 * T, optionally followed by "B" or "iB"; "B" alone is bytes; case does not
 * matter; spaces between number and unit are allowed), or an integer
 * percentage of RAM from 1 to 100 ("80%"). A number without a unit is
 * refused with -EDOM (why unset): "64" meant 64 bytes, read as 64 GiB or
 * 64 % by whoever wrote it (review rev223 M1). Any other error is -EINVAL,
 * with the reason in why. */
int
config_parse_memory_budget(const char *s, enum config_budget *kind, uint64_t *value,
	const char **why)
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
	if (*p == '.' || *p == ',') {
		*why = "whole numbers only (write 1536M, not 1.5G)";
		return -EINVAL;
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
		if (n != 0)
			return -EDOM;
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
		if (toupper((unsigned char)p[0]) == 'I' && toupper((unsigned char)p[1]) == 'B')
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

/* ---- users and groups ------------------------------------------------- */

/*
 * Looks up a group by name (is_group: stores its gid), or a user by name or,
 * when name is NULL, by the uid id (stores the uid and the primary gid;
 * with pw_name, a copy of the user's name). Returns 0, -ENOENT when there
 * is no such entry, or -errno (nss.h).
 */
static int
nss_lookup(int is_group, const char *name, uid_t id, uid_t *uid, gid_t *gid, char **pw_name)
{
	struct passwd *pw = NULL;
	struct group *gr = NULL;
	int e;

	if (is_group)
		gr = nss_group_by_name(name, &e);
	else
		pw = name != NULL ? nss_user_by_name(name, &e) : nss_user_by_uid(id, &e);
	if (gr != NULL) {
		*gid = gr->gr_gid;
		e = 0;
	}
	if (pw != NULL) {
		*uid = pw->pw_uid;
		*gid = pw->pw_gid;
		e = 0;
		if (pw_name != NULL && (*pw_name = strdup(pw->pw_name)) == NULL)
			e = ENOMEM;
	}
	free(pw);
	free(gr);
	if (e != 0)
		return -e;
	return gr != NULL || pw != NULL ? 0 : -ENOENT;
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
int
config_resolve_id(struct parse_ctx *ctx, const char *prefix, const char *key, const char *token,
	int is_group, unsigned *id)
{
	unsigned long long v = 0;
	uid_t uid = 0;
	gid_t gid = 0;
	int r;

	if (all_digits(token)) {
		if (parse_unsigned(token, (unsigned long long)UINT32_MAX - 1, &v) < 0) {
			config_error(ctx, -EINVAL, "%s%s: id %s is out of range", prefix, key,
				token);
			return -EINVAL;
		}
		*id = (unsigned)v;
		return 0;
	}
	r = nss_lookup(is_group, token, 0, &uid, &gid, NULL);
	if (r == -ENOENT) {
		config_error(ctx, -EINVAL, "%s%s: unknown %s \"%s\"", prefix, key,
			is_group ? "group" : "user", token);
		return -EINVAL;
	}
	if (r < 0) {
		config_error(ctx, r, "%s%s: cannot look up %s \"%s\": %s", prefix, key,
			is_group ? "group" : "user", token, strerror(-r));
		return r;
	}
	*id = is_group ? (unsigned)gid : (unsigned)uid;
	return 0;
}

/* Resolves a comma- or space-separated list of users or groups into a new
 * array of ids in *ids (uid_t and gid_t are both 32-bit unsigned on Linux,
 * see the static assertion in config_internal.h). */
int
config_resolve_id_list(struct parse_ctx *ctx, const char *prefix, const char *key,
	const char *value, int is_group, unsigned **ids, size_t *n_ids)
{
	char *copy = strdup(value), *save = NULL, *tok;
	unsigned *list = NULL;
	size_t n = 0, cap = 0;
	int r = 0;

	if (copy == NULL) {
		config_error(ctx, -ENOMEM, "out of memory");
		return -ENOMEM;
	}
	for (tok = strtok_r(copy, ", \t", &save); tok != NULL;
		tok = strtok_r(NULL, ", \t", &save)) {
		if (n == cap) {
			size_t ncap = cap != 0 ? cap * 2 : 8;
			unsigned *nl = reallocarray(list, ncap, sizeof(*list));

			if (nl == NULL) {
				config_error(ctx, -ENOMEM, "out of memory");
				r = -ENOMEM;
				break;
			}
			list = nl;
			cap = ncap;
		}
		r = config_resolve_id(ctx, prefix, key, tok, is_group, &list[n]);
		if (r < 0)
			break;
		n++;
	}
	free(copy);
	if (r == 0 && n == 0) {
		config_error(ctx, -EINVAL, "%s%s: empty list", prefix, key);
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

/*
 * The "user" key of [wcached]: a user name, or a numeric uid that must
 * exist (the daemon needs that user's primary group). Stores the raw value,
 * the uid and the primary gid in the config.
 */
int
config_resolve_user(struct parse_ctx *ctx, const char *value)
{
	struct config *cfg = ctx->cfg;
	unsigned long long v;
	char *name = NULL;
	int r;

	if (*value == '\0') {
		config_error(ctx, -EINVAL, "user: empty value");
		return -EINVAL;
	}
	if (all_digits(value)) {
		if (parse_unsigned(value, (unsigned long long)UINT32_MAX - 1, &v) < 0) {
			config_error(ctx, -EINVAL, "user: id %s is out of range", value);
			return -EINVAL;
		}
		r = nss_lookup(0, NULL, (uid_t)v, &cfg->user_uid, &cfg->user_gid, &name);
	} else {
		r = nss_lookup(0, value, 0, &cfg->user_uid, &cfg->user_gid, &name);
	}
	if (r == -ENOENT) {
		config_error(ctx, -EINVAL, "user: unknown user \"%s\"", value);
		return -EINVAL;
	}
	if (r < 0) {
		config_error(ctx, r, "user: cannot look up \"%s\": %s", value, strerror(-r));
		return r;
	}
	if ((cfg->user = strdup(value)) == NULL) {
		free(name);
		config_error(ctx, -ENOMEM, "out of memory");
		return -ENOMEM;
	}
	free(cfg->user_name);
	cfg->user_name = name;
	return 0;
}

/* ---- paths ------------------------------------------------------------ */

/* Joins a relative value with the config file's directory; copies an
 * absolute one. Leading "./" components are dropped. */
int
config_join_path(struct parse_ctx *ctx, const char *prefix, const char *key, const char *value,
	char **out)
{
	char *p;

	if (*value == '\0') {
		config_error(ctx, -EINVAL, "%s%s: empty value", prefix, key);
		return -EINVAL;
	}
	if (inifile_join(ctx->cfg->dir, value, &p) < 0) {
		config_error(ctx, -ENOMEM, "out of memory");
		return -ENOMEM;
	}
	if (strlen(p) >= PATH_MAX) {
		config_error(ctx, -EINVAL, "%s%s: path too long (%zu bytes)", prefix, key,
			strlen(p));
		free(p);
		return -EINVAL;
	}
	*out = p;
	return 0;
}

/* config_join_path() for a unix socket address, which must fit in sun_path. */
int
config_socket_path(struct parse_ctx *ctx, const char *key, const char *value, char **out)
{
	struct sockaddr_un sun;
	char *p;
	int r = config_join_path(ctx, "", key, value, &p);

	if (r < 0)
		return r;
	if (strlen(p) >= sizeof(sun.sun_path)) {
		config_error(ctx, -EINVAL,
			"%s: \"%s\" is too long for a unix socket (%zu bytes, max %zu)", key, p,
			strlen(p), sizeof(sun.sun_path) - 1);
		free(p);
		return -EINVAL;
	}
	free(*out);
	*out = p;
	return 0;
}
