/*
 * fuzz_config.c: libFuzzer harness for wcached's configuration reader
 * (daemon/config.c and daemon/config_value.c, over client/base/inifile.c and
 * inih), driven the way the daemon drives it: config_load() of a file. The
 * input is written into a memfd and loaded by its /proc/self/fd path, so
 * there is no disk I/O and the file's directory (the base of relative
 * paths) is /proc/self/fd.
 *
 * Properties checked, beyond "no crash, no leak, no undefined behaviour":
 *   - a refusal is -EINVAL with "FILE:LINE: reason", LINE a line of the
 *     input, or another negative code with "FILE: ..." or "FILE:LINE: ...";
 *     a failed load leaves its output untouched;
 *   - an accepted config holds what config.h promises: absolute socket paths
 *     that fit in sun_path and differ, settings in their ranges, valid and
 *     unique model names, absolute model paths, non-empty access lists when
 *     set;
 *   - written back as a file (every setting explicit, values as parsed) it
 *     loads again into the same config, so the reader accepts what it means
 *     and means what it accepts;
 *   - leading whitespace is ignored, as config.h says: with a space, tab,
 *     vertical tab, form feed or carriage return put in front of every line,
 *     and CRLF line ends, the file loads into the same config, or fails
 *     with the same message;
 *   - config_diff() of a config against itself reports nothing, and against
 *     NULL reports each model once; config_memory_budget() does not
 *     overflow for any amount of RAM.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/un.h>
#include <unistd.h>

#include "config.h"
#include "base/error.h"
#include "log.h"
#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_same(const struct config *a, const struct config *b);

/* The file the input is written to, the one the reprint goes to, and the
 * one the indented copy goes to. */
static int input_fd = -1, reprint_fd = -1, indent_fd = -1;
static char input_path[64], reprint_path[64], indent_path[64];

/* Replaces the contents of the memfd fd with len bytes. */
static void
put_file(int fd, const void *buf, size_t len)
{
	CHECK(ftruncate(fd, 0) == 0);
	CHECK(pwrite(fd, buf, len, 0) == (ssize_t)len);
}

/* Creates the two memfds once. */
static void
init_files(void)
{
	if (input_fd >= 0)
		return;
	input_fd = memfd_create("fuzz_config", MFD_CLOEXEC);
	reprint_fd = memfd_create("fuzz_config_reprint", MFD_CLOEXEC);
	indent_fd = memfd_create("fuzz_config_indent", MFD_CLOEXEC);
	CHECK(input_fd >= 0 && reprint_fd >= 0 && indent_fd >= 0);
	snprintf(input_path, sizeof(input_path), "/proc/self/fd/%d", input_fd);
	snprintf(reprint_path, sizeof(reprint_path), "/proc/self/fd/%d", reprint_fd);
	snprintf(indent_path, sizeof(indent_path), "/proc/self/fd/%d", indent_fd);
}

/* Lines of the input as getline() counts them. */
static long
count_lines(const uint8_t *data, size_t size)
{
	long n = 0;

	for (size_t i = 0; i < size; i++)
		n += data[i] == '\n';
	return n + (size > 0 && data[size - 1] != '\n');
}

/*
 * Loads the input with one whitespace character (space, tab, vertical tab,
 * form feed, carriage return, in turn) put in front of every line and CRLF
 * line ends, which change nothing (config.h: leading whitespace is ignored;
 * trailing whitespace is stripped), and compares: the same config, or the
 * same message for the same line. Line 1 keeps a byte order mark at its
 * start.
 * first is the result of the plain load (its config, or NULL and its
 * message in first_msg, after the file name).
 */
static void
check_indented(const uint8_t *data, size_t size, const struct config *first, const char *first_msg)
{
	static const char ws[] = " \t\v\f\r";
	char *text = malloc(3 * size + 1);
	struct config *cfg = NULL;
	size_t k = 0, n = 0;
	int r;

	if (size > 60000) {
		free(text); /* a line could grow past the 64 KiB limit */
		return;
	}
	CHECK(text != NULL);
	for (size_t i = 0; i < size; i++) {
		if ((i == 0 && data[0] != 0xEF) || (i > 0 && data[i - 1] == '\n'))
			text[k++] = ws[n++ % 5];
		if (data[i] == '\n')
			text[k++] = '\r';
		text[k++] = (char)data[i];
	}
	put_file(indent_fd, text, k);
	free(text);
	r = config_load(indent_path, &cfg);
	if (first != NULL && r == 0) {
		check_same(first, cfg);
		config_free(cfg);
		return;
	}
	if (first == NULL && r < 0 && strcmp(first_msg, error_get() + strlen(indent_path)) == 0)
		return;
	fprintf(stderr, "fuzz_config: indenting the lines changes the result: %s\n  was: %s\n",
		r == 0 ? "loaded" : error_get(), first != NULL ? "loaded" : first_msg);
	abort();
}

/* Checks the message of a refused load. */
static void
check_error(int r, const char *path, long lines)
{
	const char *m = error_get();
	size_t plen = strlen(path);
	char *end;
	long line;

	CHECK(r < 0);
	if (strncmp(m, path, plen) != 0 || m[plen] != ':') {
		fprintf(stderr, "fuzz_config: message does not name the file: %s\n", m);
		abort();
	}
	m += plen + 1;
	if (*m == ' ') {
		/* "FILE: reason": only for errors that are not about a line */
		CHECK(r != -EINVAL);
		return;
	}
	line = strtol(m, &end, 10);
	if (end == m || *end != ':' || end[1] != ' ' || line < 1 || line > lines) {
		fprintf(stderr, "fuzz_config: bad line in message (file has %ld lines): %s\n",
			lines, error_get());
		abort();
	}
	CHECK(end[2] != '\0');
}

/* Checks what config.h promises about an accepted config. */
static void
check_invariants(const struct config *cfg)
{
	struct sockaddr_un sun;

	CHECK(cfg->socket_path[0] == '/' && strlen(cfg->socket_path) < sizeof(sun.sun_path));
	CHECK(cfg->control_path[0] == '/' && strlen(cfg->control_path) < sizeof(sun.sun_path));
	CHECK(strcmp(cfg->socket_path, cfg->control_path) != 0);
	CHECK(cfg->prefetch_threads >= 1 && cfg->prefetch_threads <= CONFIG_MAX_PREFETCH_THREADS);
	CHECK(cfg->log_level >= LOG_LEVEL_ERROR && cfg->log_level <= LOG_LEVEL_DEBUG);
	CHECK(cfg->max_clients >= 1 && cfg->max_clients <= CONFIG_MAX_CLIENTS_LIMIT);
	CHECK(cfg->max_clients_per_uid >= 1 && cfg->max_clients_per_uid <= cfg->max_clients);
	switch (cfg->memory_budget) {
	case CONFIG_BUDGET_NONE:
		CHECK(cfg->memory_budget_value == 0);
		break;
	case CONFIG_BUDGET_BYTES:
		CHECK(cfg->memory_budget_value > 0);
		break;
	case CONFIG_BUDGET_PERCENT:
		CHECK(cfg->memory_budget_value >= 1 && cfg->memory_budget_value <= 100);
		break;
	default:
		CHECK(!"memory_budget kind");
	}
	/* A percentage of any amount of RAM, exactly, without overflow. */
	if (cfg->memory_budget == CONFIG_BUDGET_PERCENT)
		CHECK(config_memory_budget(cfg, UINT64_MAX) ==
			(uint64_t)((unsigned __int128)UINT64_MAX * cfg->memory_budget_value / 100));
	else
		CHECK(config_memory_budget(cfg, UINT64_MAX) == cfg->memory_budget_value);
	CHECK(cfg->n_models <= CONFIG_MAX_MODELS);
	for (size_t i = 0; i < cfg->n_models; i++) {
		const struct model_config *m = &cfg->models[i];

		CHECK(model_name_valid(m->name));
		CHECK(config_model_find(cfg, m->name) == m); /* unique */
		CHECK(m->path != NULL && m->path[0] == '/');
		CHECK(m->pin == PIN_NONE || m->pin == PIN_METADATA ||
			m->pin == PIN_ALL);
		CHECK((m->allow_users == NULL) == (m->n_uids == 0));
		CHECK((m->allow_groups == NULL) == (m->n_gids == 0));
		CHECK(m->line >= 1);
	}
}

/* Writes cfg as a config file with every setting explicit. */
static char *
reprint(const struct config *cfg, size_t *len)
{
	char *text = NULL;
	FILE *f = open_memstream(&text, len);

	CHECK(f != NULL);
	fprintf(f, "[wcached]\nsocket = %s\ncontrol = %s\n", cfg->socket_path, cfg->control_path);
	if (cfg->control_group != NULL)
		fprintf(f, "control_group = %s\n", cfg->control_group);
	fprintf(f, "prefetch_threads = %d\nlog_level = %s\n", cfg->prefetch_threads,
		log_level_name(cfg->log_level));
	if (cfg->memory_budget == CONFIG_BUDGET_NONE)
		fputs("memory_budget = none\n", f);
	else
		fprintf(f, "memory_budget = %llu%s\n",
			(unsigned long long)cfg->memory_budget_value,
			cfg->memory_budget == CONFIG_BUDGET_PERCENT ? "%" : "B");
	fprintf(f, "max_clients = %u\nmax_clients_per_uid = %u\n", cfg->max_clients,
		cfg->max_clients_per_uid);
	if (cfg->user != NULL)
		fprintf(f, "user = %s\n", cfg->user);
	fprintf(f, "restart_hold_seconds = %u\nstart_wait_seconds = %u\nstage_dir = %s\n",
		cfg->restart_hold_seconds, cfg->start_wait_seconds, cfg->stage_dir);
	for (size_t i = 0; i < cfg->n_models; i++) {
		const struct model_config *m = &cfg->models[i];

		fprintf(f, "\n[model %s]\npath = %s\npin = %s\nwarm = %s\n", m->name, m->path,
			pin_mode_name(m->pin), m->warm ? "yes" : "no");
		fprintf(f, "derive = %s\nderive_timeout = %u\n", m->derive ? "yes" : "no",
			m->derive_timeout);
		if (m->derive_groups != NULL)
			fprintf(f, "derive_groups = %s\n", m->derive_groups);
		fprintf(f, "watch = %s\npoll_interval = %u.%03u\nstage = %s\n",
			fs_watch_name(m->watch), m->poll_interval_ms / 1000,
			m->poll_interval_ms % 1000, fs_stage_name(m->stage));
		if (m->allow_users != NULL)
			fprintf(f, "allow_users = %s\n", m->allow_users);
		if (m->allow_groups != NULL)
			fprintf(f, "allow_groups = %s\n", m->allow_groups);
	}
	CHECK(fclose(f) == 0);
	return text;
}

/* strcmp for strings that may be NULL. */
static int
same_str(const char *a, const char *b)
{
	return (a == NULL && b == NULL) || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

/* Whether two configs hold the same settings (their files differ). */
static void
check_same(const struct config *a, const struct config *b)
{
	CHECK(strcmp(a->socket_path, b->socket_path) == 0);
	CHECK(strcmp(a->control_path, b->control_path) == 0);
	CHECK(same_str(a->control_group, b->control_group));
	CHECK(a->control_group == NULL || a->control_gid == b->control_gid);
	CHECK(a->prefetch_threads == b->prefetch_threads && a->log_level == b->log_level);
	CHECK(a->memory_budget == b->memory_budget &&
		a->memory_budget_value == b->memory_budget_value);
	CHECK(a->max_clients == b->max_clients && a->max_clients_per_uid == b->max_clients_per_uid);
	CHECK(same_str(a->user, b->user));
	CHECK(a->restart_hold_seconds == b->restart_hold_seconds);
	CHECK(a->start_wait_seconds == b->start_wait_seconds);
	CHECK(strcmp(a->stage_dir, b->stage_dir) == 0);
	CHECK(a->user == NULL || (a->user_uid == b->user_uid && a->user_gid == b->user_gid));
	CHECK(a->n_models == b->n_models);
	for (size_t i = 0; i < a->n_models; i++) {
		const struct model_config *x = &a->models[i], *y = &b->models[i];

		CHECK(strcmp(x->name, y->name) == 0);
		CHECK(config_model_changes(x, y) == 0);
		CHECK(same_str(x->allow_users, y->allow_users));
		CHECK(same_str(x->allow_groups, y->allow_groups));
		CHECK(x->n_uids == y->n_uids && x->n_gids == y->n_gids);
		CHECK(x->n_uids == 0 || memcmp(x->uids, y->uids, x->n_uids * sizeof(uid_t)) == 0);
		CHECK(x->n_gids == 0 || memcmp(x->gids, y->gids, x->n_gids * sizeof(gid_t)) == 0);
	}
}

/* config_diff() callback: counts the calls of each kind. */
static void
count_change(enum config_change change, const struct model_config *old_model,
	const struct model_config *new_model, unsigned changes, void *arg)
{
	size_t *counts = arg;

	CHECK((unsigned)change <= CONFIG_MODEL_CHANGED);
	CHECK(change != CONFIG_MODEL_ADDED || (old_model == NULL && new_model != NULL));
	CHECK(change != CONFIG_MODEL_REMOVED || (old_model != NULL && new_model == NULL));
	CHECK(change != CONFIG_MODEL_CHANGED || changes != 0);
	counts[change]++;
}

/* Checks config_diff() against itself and against nothing. */
static void
check_diff(const struct config *cfg)
{
	size_t counts[3] = { 0, 0, 0 };

	config_diff(cfg, cfg, count_change, counts);
	CHECK(counts[0] == 0 && counts[1] == 0 && counts[2] == 0);
	config_diff(NULL, cfg, count_change, counts);
	CHECK(counts[CONFIG_MODEL_ADDED] == cfg->n_models);
	config_diff(cfg, NULL, count_change, counts);
	CHECK(counts[CONFIG_MODEL_REMOVED] == cfg->n_models && counts[CONFIG_MODEL_CHANGED] == 0);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct config marker; /* what an untouched output still points to */
	struct config *cfg = &marker, *again = &marker;
	char *text;
	size_t len = 0;
	int r;

	init_files();
	put_file(input_fd, data, size);
	error_set(0, "%s", "");
	r = config_load(input_path, &cfg);
	if (r < 0) {
		char msg[1024];

		CHECK(cfg == &marker);
		check_error(r, input_path, count_lines(data, size));
		snprintf(msg, sizeof(msg), "%s", error_get() + strlen(input_path));
		check_indented(data, size, NULL, msg);
		return 0;
	}
	CHECK(r == 0 && cfg != NULL);
	check_invariants(cfg);
	check_diff(cfg);
	check_indented(data, size, cfg, NULL);

	text = reprint(cfg, &len);
	put_file(reprint_fd, text, len);
	r = config_load(reprint_path, &again);
	if (r != 0) {
		fprintf(stderr, "fuzz_config: the reprinted config does not load: %s\n%s",
			error_get(), text);
		abort();
	}
	check_same(cfg, again);
	free(text);
	config_free(again);
	config_free(cfg);
	return 0;
}
