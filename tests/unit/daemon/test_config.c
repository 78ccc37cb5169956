/*
 * test_config.c: unit tests for daemon/config.c, the configuration loader.
 *
 * Each test writes a config file into a fresh temporary directory and loads
 * it: a full valid file, the defaults, relative path resolution, the
 * memory_budget forms, user and group lists, lines longer than inih's
 * default buffer and the 64 KiB limit, the model diff for SIGHUP, and
 * every error, checking the code and that the message is
 * "FILE:LINE: reason" with the right line.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "config.h"
#include "base/error.h"
#include "log.h"
#include "testutil.h"

/* Writes text to DIR/name and loads it. Stores the file's path in *path
 * (caller frees) when path is not NULL. */
static int
load_text(struct tu_dir *f, const char *name, const char *text, struct config **cfg,
	char **path)
{
	char *p = tu_write(f->dir, name, text, strlen(text));
	int r = config_load(p, cfg);

	if (path != NULL)
		*path = p;
	else
		free(p);
	return r;
}

/* Loads text and checks that it fails with code and a message that starts
 * with "PATH:LINE: " and contains reason. */
static void
check_error_code(struct tu_dir *f, const char *text, int code, int line, const char *reason)
{
	struct config *cfg = (struct config *)(uintptr_t)0x1;
	char *path = NULL, prefix[4200];
	const char *msg;
	int r;

	r = load_text(f, "wcached.conf", text, &cfg, &path);
	msg = error_get();
	if (r != code)
		print_message("config:\n%s\nresult %d, message: %s\n", text, r, msg);
	assert_int_equal(r, code);
	assert_ptr_equal(cfg, (struct config *)(uintptr_t)0x1); /* untouched */
	snprintf(prefix, sizeof(prefix), "%s:%d: ", path, line);
	if (strncmp(msg, prefix, strlen(prefix)) != 0 || strstr(msg, reason) == NULL)
		print_message("config:\n%s\nexpected \"%s...%s\"\ngot      \"%s\"\n", text, prefix,
			reason, msg);
	assert_true(strncmp(msg, prefix, strlen(prefix)) == 0);
	assert_non_null(strstr(msg, reason));
	free(path);
}

static void
check_error(struct tu_dir *f, const char *text, int line, const char *reason)
{
	check_error_code(f, text, -EINVAL, line, reason);
}

/* A file with every key set. */
static void
test_full(void **state)
{
	struct tu_dir *f = *state;
	struct config *cfg = NULL;
	const struct model_config *m;
	const char *text = "; wcached test configuration\n"
			   "# both comment styles\n"
			   "[wcached]\n"
			   "socket = /run/test/wcached.sock    ; client socket\n"
			   "control = /run/test/control.sock   ; control socket\n"
			   "control_group = root\n"
			   "prefetch_threads = 8\n"
			   "log_level = debug\n"
			   "memory_budget = 64G\n"
			   "max_clients = 2000\n"
			   "max_clients_per_uid = 100\n"
			   "restart_hold_seconds = 0\n"
			   "start_wait_seconds = 5\n"
			   "unread_reply_seconds = 7\n"
			   "user = root\n"
			   "\n"
			   "[model llama-3-8b]\n"
			   "path = /models/llama-3-8b              ; a directory\n"
			   "pin = all\n"
			   "warm = no\n"
			   "allow_users = root, 1234\n"
			   "allow_groups = 0 root\n"
			   "\n"
			   "[model Qwen2.5_7B]\n"
			   "path = /models/qwen/model.safetensors.index.json\n"
			   "pin = none\n";

	assert_int_equal(load_text(f, "wcached.conf", text, &cfg, NULL), 0);
	assert_string_equal(cfg->socket_path, "/run/test/wcached.sock");
	assert_string_equal(cfg->control_path, "/run/test/control.sock");
	assert_string_equal(cfg->control_group, "root");
	assert_int_equal(cfg->control_gid, 0);
	assert_int_equal(cfg->prefetch_threads, 8);
	assert_int_equal(cfg->log_level, LOG_LEVEL_DEBUG);
	assert_int_equal(cfg->memory_budget, CONFIG_BUDGET_BYTES);
	assert_true(cfg->memory_budget_value == 64ull << 30);
	assert_int_equal(cfg->max_clients, 2000);
	assert_int_equal(cfg->max_clients_per_uid, 100);
	assert_int_equal(cfg->restart_hold_seconds, 0);
	assert_int_equal(cfg->start_wait_seconds, 5);
	assert_int_equal(cfg->unread_reply_seconds, 7);
	assert_string_equal(cfg->user, "root");
	assert_int_equal(cfg->user_uid, 0);
	assert_int_equal(cfg->user_gid, 0);
	assert_string_equal(cfg->dir, f->dir);

	assert_int_equal(cfg->n_models, 2);
	m = &cfg->models[0];
	assert_string_equal(m->name, "llama-3-8b");
	assert_string_equal(m->path, "/models/llama-3-8b");
	assert_int_equal(m->pin, PIN_ALL);
	assert_false(m->warm);
	assert_int_equal(m->line, 17);
	assert_string_equal(m->allow_users, "root, 1234");
	assert_int_equal(m->n_uids, 2);
	assert_int_equal(m->uids[0], 0);
	assert_int_equal(m->uids[1], 1234);
	assert_string_equal(m->allow_groups, "0 root");
	assert_int_equal(m->n_gids, 2);
	assert_int_equal(m->gids[0], 0);
	assert_int_equal(m->gids[1], 0);

	m = &cfg->models[1];
	assert_string_equal(m->name, "Qwen2.5_7B");
	assert_string_equal(m->path, "/models/qwen/model.safetensors.index.json");
	assert_int_equal(m->pin, PIN_NONE);
	assert_true(m->warm);
	assert_int_equal(m->line, 24);
	assert_null(m->allow_users);
	assert_null(m->allow_groups);
	assert_int_equal(m->n_uids, 0);
	assert_int_equal(m->n_gids, 0);

	assert_ptr_equal(config_model_find(cfg, "Qwen2.5_7B"), &cfg->models[1]);
	assert_null(config_model_find(cfg, "qwen2.5_7b"));
	config_free(cfg);
}

/* An empty file and a minimal model get every default. */
static void
test_defaults(void **state)
{
	struct tu_dir *f = *state;
	struct config *cfg = NULL;

	assert_int_equal(load_text(f, "empty.conf", "", &cfg, NULL), 0);
	assert_string_equal(cfg->socket_path, DEFAULT_SOCKET_PATH);
	assert_string_equal(cfg->control_path, DEFAULT_CONTROL_PATH);
	assert_string_equal(cfg->socket_path, "/run/wcached/wcached.sock");
	assert_string_equal(cfg->control_path, "/run/wcached/control.sock");
	assert_null(cfg->control_group);
	assert_int_equal(cfg->prefetch_threads, 2);
	assert_int_equal(cfg->log_level, LOG_LEVEL_INFO);
	assert_int_equal(cfg->memory_budget, CONFIG_BUDGET_NONE);
	assert_true(config_memory_budget(cfg, 1ull << 40) == 0);
	assert_int_equal(cfg->max_clients, 1024);
	assert_int_equal(cfg->max_clients_per_uid, 256);
	assert_int_equal(cfg->restart_hold_seconds, 60);
	assert_int_equal(cfg->start_wait_seconds, 30);
	assert_int_equal(cfg->unread_reply_seconds, 60);
	assert_null(cfg->user);
	assert_int_equal(cfg->n_models, 0);
	config_free(cfg);

	assert_int_equal(load_text(f, "min.conf", "[wcached]\n[model m]\npath=/m\n", &cfg, NULL),
		0);
	assert_int_equal(cfg->n_models, 1);
	assert_string_equal(cfg->models[0].name, "m");
	assert_int_equal(cfg->models[0].pin, PIN_METADATA);
	assert_true(cfg->models[0].warm);
	config_free(cfg);

	/* max_clients_per_uid follows a smaller max_clients when not set. */
	assert_int_equal(load_text(f, "mc.conf", "[wcached]\nmax_clients = 10\n", &cfg, NULL), 0);
	assert_int_equal(cfg->max_clients, 10);
	assert_int_equal(cfg->max_clients_per_uid, 10);
	config_free(cfg);

	config_free(NULL);
}

/* Comments, indentation, "key: value", booleans, a BOM and CRLF endings. */
static void
test_syntax_variants(void **state)
{
	struct tu_dir *f = *state;
	struct config *cfg = NULL;
	const char *text = "\xEF\xBB\xBF"
			   "[wcached]\r\n"
			   "    prefetch_threads = 3\r\n"
			   "\tlog_level: warn\r\n"
			   "[ model  a ] ; comment after a header\r\n"
			   "    path = /a;b   ; ';' without a space before it is part of "
			   "the value\r\n"
			   "    warm = off\r\n"
			   "[model b]\n"
			   "path=/b\n"
			   "warm=true\n";

	assert_int_equal(load_text(f, "v.conf", text, &cfg, NULL), 0);
	assert_int_equal(cfg->prefetch_threads, 3);
	assert_int_equal(cfg->log_level, LOG_LEVEL_WARN);
	assert_int_equal(cfg->n_models, 2);
	assert_string_equal(cfg->models[0].name, "a");
	assert_string_equal(cfg->models[0].path, "/a;b");
	assert_false(cfg->models[0].warm);
	assert_true(cfg->models[1].warm);
	config_free(cfg);

	/* Any leading whitespace is indentation, never a continuation of the
	 * previous key (found by fuzz_config: a vertical tab or form feed made
	 * b's path "DIR/path = /b" with no error). */
	text = "[model a]\npath = /a\n[model b]\n\vpath = /b\n\fwarm = no\n";
	assert_int_equal(load_text(f, "w.conf", text, &cfg, NULL), 0);
	assert_int_equal(cfg->n_models, 2);
	assert_string_equal(cfg->models[1].path, "/b");
	assert_false(cfg->models[1].warm);
	config_free(cfg);
}

/* Relative paths are joined with the config file's directory, which is made
 * absolute when the config path itself is relative. */
static void
test_relative_paths(void **state)
{
	struct tu_dir *f = *state;
	struct config *cfg = NULL;
	char *sub, *path, *expect, *cwd;
	const char *text = "[wcached]\n"
			   "socket = run/w.sock\n"
			   "control = ./ctl.sock\n"
			   "[model rel]\n"
			   "path = ./models//m.safetensors\n"
			   "[model abs]\n"
			   "path = /abs/m.safetensors\n"
			   "[model up]\n"
			   "path = ../other\n";

	assert_int_equal(asprintf(&sub, "%s/etc", f->dir) > 0, 1);
	assert_int_equal(mkdir(sub, 0755), 0);
	path = tu_write(sub, "wcached.conf", text, strlen(text));

	assert_int_equal(config_load(path, &cfg), 0);
	assert_string_equal(cfg->dir, sub);
	assert_int_equal(asprintf(&expect, "%s/run/w.sock", sub) > 0, 1);
	assert_string_equal(cfg->socket_path, expect);
	free(expect);
	assert_int_equal(asprintf(&expect, "%s/ctl.sock", sub) > 0, 1);
	assert_string_equal(cfg->control_path, expect);
	free(expect);
	assert_int_equal(asprintf(&expect, "%s/models//m.safetensors", sub) > 0, 1);
	assert_string_equal(cfg->models[0].path, expect);
	free(expect);
	assert_string_equal(cfg->models[1].path, "/abs/m.safetensors");
	assert_int_equal(asprintf(&expect, "%s/../other", sub) > 0, 1);
	assert_string_equal(cfg->models[2].path, expect);
	free(expect);
	config_free(cfg);

	/* The same file through a relative path from its parent directory. */
	cwd = getcwd(NULL, 0);
	assert_non_null(cwd);
	assert_int_equal(chdir(f->dir), 0);
	assert_int_equal(config_load("./etc/wcached.conf", &cfg), 0);
	assert_int_equal(chdir(cwd), 0);
	assert_string_equal(cfg->dir, sub);
	assert_string_equal(cfg->file, "./etc/wcached.conf");
	assert_int_equal(asprintf(&expect, "%s/run/w.sock", sub) > 0, 1);
	assert_string_equal(cfg->socket_path, expect);
	free(expect);
	config_free(cfg);

	free(cwd);
	free(path);
	free(sub);
}

/* Every accepted form of memory_budget and the byte count it gives. */
static void
test_memory_budget(void **state)
{
	static const struct {
		const char *value;
		enum config_budget kind;
		uint64_t stored;
		uint64_t bytes_of_1000g; /* config_memory_budget() with 1000 GiB of RAM */
	} cases[] = {
		{"64G", CONFIG_BUDGET_BYTES, 64ull << 30, 64ull << 30},
		{"512M", CONFIG_BUDGET_BYTES, 512ull << 20, 512ull << 20},
		{"1024b", CONFIG_BUDGET_BYTES, 1024, 1024},
		{"100B", CONFIG_BUDGET_BYTES, 100, 100},
		{"2KiB", CONFIG_BUDGET_BYTES, 2048, 2048},
		{"2KIB", CONFIG_BUDGET_BYTES, 2048, 2048},
		{"2gib", CONFIG_BUDGET_BYTES, 2ull << 30, 2ull << 30},
		{"3kb", CONFIG_BUDGET_BYTES, 3072, 3072},
		{"1 T", CONFIG_BUDGET_BYTES, 1ull << 40, 1ull << 40},
		{"16777215T", CONFIG_BUDGET_BYTES, 16777215ull << 40, 16777215ull << 40},
		{"80%", CONFIG_BUDGET_PERCENT, 80, 800ull << 30},
		{"100%", CONFIG_BUDGET_PERCENT, 100, 1000ull << 30},
		{"1%", CONFIG_BUDGET_PERCENT, 1, 10ull << 30},
		{"none", CONFIG_BUDGET_NONE, 0, 0},
	};
	struct tu_dir *f = *state;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct config *cfg = NULL;
		char text[200];

		snprintf(text, sizeof(text), "[wcached]\nmemory_budget = %s\n", cases[i].value);
		if (load_text(f, "mb.conf", text, &cfg, NULL) != 0)
			print_message("memory_budget = %s: %s\n", cases[i].value, error_get());
		assert_non_null(cfg);
		assert_int_equal(cfg->memory_budget, cases[i].kind);
		assert_true(cfg->memory_budget_value == cases[i].stored);
		assert_true(config_memory_budget(cfg, 1000ull << 30) == cases[i].bytes_of_1000g);
		config_free(cfg);
	}

	/* A percentage of an odd RAM size rounds down without overflow. */
	{
		struct config *cfg = NULL;

		assert_int_equal(load_text(f, "mb.conf", "[wcached]\nmemory_budget=50%\n", &cfg,
					 NULL),
			0);
		assert_true(config_memory_budget(cfg, UINT64_MAX) == UINT64_MAX / 2);
		assert_true(config_memory_budget(cfg, 3) == 1);
		config_free(cfg);
	}

	check_error(f, "[wcached]\nmemory_budget = 12X\n", 2,
		"memory_budget: \"12X\": unknown unit");
	check_error(f, "[wcached]\nmemory_budget = 0\n", 2, "greater than 0");
	/* No unit: 64 bytes before, whoever wrote it meant 64 GiB or 64 %
	 * (review rev223 M1). */
	check_error(f, "[wcached]\nmemory_budget = 64\n", 2,
		"memory_budget: \"64\": a size needs a unit: 64G for 64 GiB, 64M for 64 MiB "
		"(K, M, G, T; B for bytes), or 64% for that share of RAM");
	check_error(f, "[wcached]\nmemory_budget = 4096\n", 2,
		"memory_budget: \"4096\": a size needs a unit: 4096G for 4096 GiB, 4096M for "
		"4096 MiB (K, M, G, T; B for bytes)");
	assert_null(strstr(error_get(), "share of RAM"));
	check_error(f, "[wcached]\nmemory_budget = 101\n", 2, "B for bytes)");
	assert_null(strstr(error_get(), "share of RAM"));
	check_error(f, "[wcached]\nmemory_budget = 0%\n", 2, "from 1% to 100%");
	check_error(f, "[wcached]\nmemory_budget = 101%\n", 2, "from 1% to 100%");
	check_error(f, "[wcached]\nmemory_budget = 80%x\n", 2, "after '%'");
	check_error(f, "[wcached]\nmemory_budget = 16777216T\n", 2, "too large");
	check_error(f, "[wcached]\nmemory_budget = 99999999999999999999999\n", 2, "too large");
	check_error(f, "[wcached]\nmemory_budget = lots\n", 2, "expected a size");
	check_error(f, "[wcached]\nmemory_budget = -1G\n", 2, "expected a size");
	check_error(f, "[wcached]\nmemory_budget = 1.5G\n", 2, "whole numbers only");
}

/* allow_users and allow_groups with names and ids; unknown names fail with
 * their line. */
static void
test_allow_lists(void **state)
{
	struct tu_dir *f = *state;
	struct config *cfg = NULL;
	const char *text = "[model m]\n"
			   "path = /m\n"
			   "allow_users = root,0 ,  4294967294\t65534\n"
			   "allow_groups = root\n";

	assert_int_equal(load_text(f, "a.conf", text, &cfg, NULL), 0);
	assert_int_equal(cfg->models[0].n_uids, 4);
	assert_int_equal(cfg->models[0].uids[0], 0);
	assert_int_equal(cfg->models[0].uids[1], 0);
	assert_true(cfg->models[0].uids[2] == 4294967294u);
	assert_int_equal(cfg->models[0].uids[3], 65534);
	assert_int_equal(cfg->models[0].n_gids, 1);
	assert_int_equal(cfg->models[0].gids[0], 0);
	config_free(cfg);

	check_error(f,
		"[model m]\npath = /m\n\nallow_users = root, no-such-user-wcache\n",
		4, "model \"m\": allow_users: unknown user \"no-such-user-wcache\"");
	check_error(f, "[model m]\npath = /m\nallow_groups = no-such-group-wcache\n", 3,
		"model \"m\": allow_groups: unknown group \"no-such-group-wcache\"");
	check_error(f, "[model m]\npath = /m\nallow_users = 4294967295\n", 3,
		"allow_users: id 4294967295 is out of range");
	check_error(f, "[model m]\npath = /m\nallow_users = ,\n", 3, "allow_users: empty list");
	check_error(f, "[model m]\npath = /m\nallow_groups =\n", 3, "allow_groups: empty list");
	check_error(f, "[wcached]\ncontrol_group = no-such-group-wcache\n", 2,
		"control_group: unknown group \"no-such-group-wcache\"");
	check_error(f, "[wcached]\nuser = no-such-user-wcache\n", 2,
		"user: unknown user \"no-such-user-wcache\"");
}

/* derive, derive_groups and derive_timeout: defaults, values, errors, and
 * config_model_changes() seeing them. */
static void
test_derive_keys(void **state)
{
	struct tu_dir *f = *state;
	struct config *cfg = NULL, *other = NULL;

	assert_int_equal(load_text(f, "a.conf", "[model m]\npath = /m\n", &cfg, NULL), 0);
	assert_false(cfg->models[0].derive);
	assert_null(cfg->models[0].derive_groups);
	assert_int_equal(cfg->models[0].n_derive_gids, 0);
	assert_int_equal(cfg->models[0].derive_timeout, 600);
	assert_int_equal(load_text(f, "b.conf", "[model m]\npath = /m\nderive = yes\n"
					      "derive_groups = root, 65534\nderive_timeout = 30\n",
				 &other, NULL), 0);
	assert_true(other->models[0].derive);
	assert_string_equal(other->models[0].derive_groups, "root, 65534");
	assert_int_equal(other->models[0].n_derive_gids, 2);
	assert_int_equal(other->models[0].derive_gids[1], 65534);
	assert_int_equal(other->models[0].derive_timeout, 30);
	assert_int_equal(config_model_changes(&cfg->models[0], &other->models[0]),
		CONFIG_CHANGED_DERIVE);
	config_free(cfg);
	config_free(other);

	check_error(f, "[model m]\npath = /m\nderive = maybe\n", 3,
		"model \"m\": derive: \"maybe\" is not yes or no");
	check_error(f, "[model m]\npath = /m\nderive_groups = no-such-group-wcache\n", 3,
		"derive_groups: unknown group \"no-such-group-wcache\"");
	check_error(f, "[model m]\npath = /m\nderive_timeout = 0\n", 3,
		"derive_timeout: 0 is out of range (1..86400)");
	check_error(f, "[model m]\npath = /m\nderive_timeout = 86401\n", 3,
		"derive_timeout: 86401 is out of range");
	check_error(f, "[model m]\npath = /m\nderive = yes\nderive = no\n", 4,
		"duplicate key \"derive\"");
}

/* watch, poll_interval, stage and stage_dir: defaults, values, errors, and
 * config_model_changes() seeing them. */
static void
test_shared_storage_keys(void **state)
{
	struct tu_dir *f = *state;
	struct config *cfg = NULL, *other = NULL;
	char want[4200];

	assert_int_equal(load_text(f, "a.conf", "[model m]\npath = /m\n", &cfg, NULL), 0);
	assert_int_equal(cfg->models[0].watch, FS_WATCH_AUTO);
	assert_int_equal(cfg->models[0].poll_interval_ms, 2000);
	assert_int_equal(cfg->models[0].stage, FS_STAGE_AUTO);
	assert_string_equal(cfg->stage_dir, "/var/cache/wcached/staged");
	assert_int_equal(load_text(f, "b.conf", "[wcached]\nstage_dir = staged\n[model m]\n"
					      "path = /m\nwatch = poll\npoll_interval = 0.25\n",
				 &other, NULL), 0);
	snprintf(want, sizeof(want), "%s/staged", f->dir);
	assert_string_equal(other->stage_dir, want); /* relative to the file's directory */
	assert_int_equal(other->models[0].watch, FS_WATCH_POLL);
	assert_int_equal(other->models[0].poll_interval_ms, 250);
	assert_int_equal(config_model_changes(&cfg->models[0], &other->models[0]),
		CONFIG_CHANGED_WATCH);
	config_free(other);
	other = NULL;
	assert_int_equal(load_text(f, "c.conf",
		"[model m]\npath = /m\nstage = no\nwatch = inotify\npoll_interval = 3600\n",
		&other, NULL), 0);
	assert_int_equal(other->models[0].stage, FS_STAGE_NO);
	assert_int_equal(other->models[0].watch, FS_WATCH_INOTIFY);
	assert_int_equal(other->models[0].poll_interval_ms, 3600000);
	assert_int_equal(config_model_changes(&cfg->models[0], &other->models[0]),
		CONFIG_CHANGED_WATCH | CONFIG_CHANGED_STAGE);
	assert_string_equal(fs_stage_name(other->models[0].stage), "no");
	assert_string_equal(fs_watch_name(other->models[0].watch), "inotify");
	config_free(cfg);
	config_free(other);

	check_error(f, "[model m]\npath = /m\nwatch = fanotify\n", 3,
		"model \"m\": watch: \"fanotify\" is not one of auto, inotify, poll");
	check_error(f, "[model m]\npath = /m\nstage = maybe\n", 3,
		"model \"m\": stage: \"maybe\" is not one of auto, yes, no");
	check_error(f, "[model m]\npath = /m\npoll_interval = 0.05\n", 3,
		"poll_interval: 0.05 is out of range (0.100..3600 seconds)");
	check_error(f, "[model m]\npath = /m\npoll_interval = 3600.5\n", 3,
		"poll_interval: 3600.5 is out of range");
	check_error(f, "[model m]\npath = /m\npoll_interval = 99999999999999999999\n", 3,
		"is out of range");
	for (int i = 0; i < 6; i++) {
		static const char *const bad[] = { "", "abc", "1.", ".5", "1.2345", "2s" };
		char text[128];

		snprintf(text, sizeof(text), "[model m]\npath = /m\npoll_interval = %s\n", bad[i]);
		check_error(f, text, 3, "is not a number of seconds");
	}
	check_error(f, "[wcached]\nstage_dir =\n", 2, "stage_dir");
}

/* A value longer than inih's default 200-byte line buffer, with an inline
 * comment. */
static void
test_long_line(void **state)
{
	struct tu_dir *f = *state;
	struct config *cfg = NULL;
	char path[1001], *text;

	path[0] = '/';
	for (size_t i = 1; i < sizeof(path) - 1; i++)
		path[i] = i % 50 == 0 ? '/' : (char)('a' + i % 26);
	path[sizeof(path) - 1] = '\0';
	assert_int_equal(asprintf(&text,
				 "[model long]\n"
				 "path   =   %s   ; a long path\n"
				 "warm = no\n",
				 path) > 0,
		1);
	assert_int_equal(load_text(f, "long.conf", text, &cfg, NULL), 0);
	assert_string_equal(cfg->models[0].path, path);
	assert_false(cfg->models[0].warm);
	config_free(cfg);
	free(text);

	/* The same through the model key error path: the line number holds. */
	assert_int_equal(asprintf(&text, "[model long]\npath = /x\n\npth = %s\n", path) > 0, 1);
	check_error(f, text, 4, "model \"long\": unknown key \"pth\"");
	free(text);
}

/* Every kind of error, with its line and reason. */
static void
test_errors(void **state)
{
	struct tu_dir *f = *state;
	char name129[200], text[400];

	check_error(f,
		"[wcached]\nsocket = /s\n\n[model llama]\npath = /m\n"
		"; comment\n\n\n\n\n\npth = /m\n",
		12, "model \"llama\": unknown key \"pth\"");
	check_error(f, "[wcached]\nsockt = /s\n", 2, "unknown key \"sockt\" in [wcached]");
	check_error(f, "[wcached]\n[foo]\nx = 1\n", 2, "unknown section [foo]");
	check_error(f, "[Model x]\npath=/x\n", 1, "unknown section [Model x]");
	check_error(f, "socket = /s\n", 1, "key \"socket\" outside a section");

	/* Bad values. */
	check_error(f, "[wcached]\nprefetch_threads = abc\n", 2,
		"prefetch_threads: \"abc\" is not a number");
	check_error(f, "[wcached]\nprefetch_threads = 0\n", 2,
		"prefetch_threads: 0 is out of range (1..64)");
	check_error(f, "[wcached]\nprefetch_threads = 65\n", 2, "out of range (1..64)");
	check_error(f, "[wcached]\nprefetch_threads = -1\n", 2, "not a number");
	check_error(f, "[wcached]\nprefetch_threads = 2x\n", 2, "not a number");
	check_error(f, "[wcached]\nprefetch_threads = 99999999999999999999999\n", 2,
		"out of range");
	check_error(f, "[wcached]\nprefetch_threads =\n", 2, "not a number");
	check_error(f, "[wcached]\nlog_level = loud\n", 2,
		"log_level: \"loud\" is not one of error, warn, info, debug");
	check_error(f, "[wcached]\nmax_clients = 0\n", 2, "max_clients: 0 is out of range");
	check_error(f, "[wcached]\nrestart_hold_seconds = 86401\n", 2,
		"restart_hold_seconds: 86401 is out of range (0..86400)");
	check_error(f, "[wcached]\nstart_wait_seconds = -1\n", 2, "not a number");
	check_error(f, "[wcached]\nunread_reply_seconds = 0\n", 2,
		"unread_reply_seconds: 0 is out of range (1..86400)");
	check_error(f, "[wcached]\nstart_wait_seconds = 86401\n", 2,
		"start_wait_seconds: 86401 is out of range (0..86400)");
	check_error(f, "[wcached]\nmax_clients_per_uid = 1000001\n", 2, "out of range");
	check_error(f, "[wcached]\nmax_clients = 10\nmax_clients_per_uid = 20\n", 3,
		"max_clients_per_uid (20) is larger than max_clients (10)");
	check_error(f, "[model m]\npath = /m\npin = some\n", 3,
		"model \"m\": pin: \"some\" is not one of none, metadata, all");
	check_error(f, "[model m]\npath = /m\nwarm = maybe\n", 3,
		"model \"m\": warm: \"maybe\" is not yes or no");
	/* A word in quotes: told to go without them, not quoted twice
	 * (`""debug"" is not one of ... debug`: review rev223 L9). */
	check_error(f, "[wcached]\nlog_level = \"debug\"\n", 2,
		"log_level: \"debug\": values are written without quotes (log_level = debug)");
	check_error(f, "[model m]\npath = /m\npin = 'all'\n", 3,
		"model \"m\": pin: 'all': values are written without quotes (pin = all)");
	check_error(f, "[model m]\npath = /m\nderive = \"yes\"\n", 3,
		"derive: \"yes\": values are written without quotes (derive = yes)");
	check_error(f, "[model m]\npath = /m\nwarm = \"\n", 3, "warm: \"\"\" is not yes or no");
	/* The hint only where the bare value reads, and for every key that is
	 * no path: `(log_level = verbose)` named a refused word, and numbers,
	 * sizes and users were quoted twice (`""2"" is not a number`: review
	 * rev224 L3, L7). */
	check_error(f, "[wcached]\nlog_level = \"verbose\"\n", 2,
		"log_level: \"verbose\" is not one of error, warn, info, debug");
	check_error(f, "[wcached]\nlog_level = \"\"\n", 2,
		"log_level: \"\" is not one of error, warn, info, debug");
	check_error(f, "[wcached]\nprefetch_threads = \"2\"\n", 2,
		"prefetch_threads: \"2\": values are written without quotes "
		"(prefetch_threads = 2)");
	check_error(f, "[wcached]\nprefetch_threads = \"0\"\n", 2,
		"prefetch_threads: 0 is out of range (1..64)");
	check_error(f, "[wcached]\nmemory_budget = \"64G\"\n", 2,
		"memory_budget: \"64G\": values are written without quotes (memory_budget = 64G)");
	check_error(f, "[wcached]\nmax_clients = '10'\n", 2,
		"max_clients: '10': values are written without quotes (max_clients = 10)");
	check_error(f, "[wcached]\nrestart_hold_seconds = \"5\"\n", 2,
		"values are written without quotes (restart_hold_seconds = 5)");
	check_error(f, "[wcached]\nuser = \"root\"\n", 2,
		"user: \"root\": values are written without quotes (user = root)");
	check_error(f, "[wcached]\ncontrol_group = \"0\"\n", 2,
		"values are written without quotes (control_group = 0)");
	check_error(f, "[model m]\npath = /m\npoll_interval = \"2\"\n", 3,
		"model \"m\": poll_interval: \"2\": values are written without quotes");
	check_error(f, "[model m]\npath = /m\nallow_users = \"0\"\n", 3,
		"values are written without quotes (allow_users = 0)");
	/* A path's quotes are part of its name. */
	{
		struct config *cfg = NULL;
		const char *p;

		assert_int_equal(load_text(f, "q.conf", "[model m]\npath = \"q\"\n", &cfg, NULL),
			0);
		p = cfg->models[0].path;
		assert_string_equal(p + strlen(p) - 4, "/\"q\"");
		config_free(cfg);
	}
	check_error(f, "[model m]\npath =\n", 2, "model \"m\": path: empty value");
	check_error(f, "[wcached]\nsocket = \n", 2, "socket: empty value");
	check_error(f, "[wcached]\ncontrol = /run/x.sock\nsocket = /run/x.sock\n", 3,
		"socket and control are the same path");
	/* The same socket in another spelling (review rev112 #6). */
	check_error(f, "[wcached]\ncontrol = /run/x.sock\nsocket = //run/./x.sock\n", 3,
		"socket \"//run/./x.sock\" and control \"/run/x.sock\" name the same socket");
	check_error(f, "[wcached]\ncontrol = /./x.sock\nsocket = /x.sock\n", 3,
		"name the same socket");
	/* sun_path holds 107 bytes and a NUL: 107 fits, 108 does not. */
	memset(name129, 'x', 106);
	name129[106] = '\0';
	snprintf(text, sizeof(text), "[wcached]\ncontrol = /%s\n", name129);
	{
		struct config *cfg = NULL;

		assert_int_equal(load_text(f, "s107.conf", text, &cfg, NULL), 0);
		assert_int_equal(strlen(cfg->control_path), 107);
		config_free(cfg);
	}
	snprintf(text, sizeof(text), "[wcached]\nsocket = /%sx\n", name129);
	check_error(f, text, 2, "socket: \"/xxx");
	check_error(f, text, 2, "is too long for a unix socket (108 bytes, max 107)");

	/* Duplicates and structure. */
	check_error(f, "[model a]\npath = /a\n[model b]\npath = /b\n[model a]\npath = /c\n", 5,
		"duplicate model \"a\" (first on line 1)");
	check_error(f, "[wcached]\nsocket = /a\nsocket = /b\n", 3,
		"duplicate key \"socket\" (first on line 2)");
	check_error(f, "[model a]\npath = /a\nwarm = yes\npath = /b\n", 4,
		"model \"a\": duplicate key \"path\" (first on line 2)");
	check_error(f, "[wcached]\n\n[wcached]\n", 3,
		"duplicate section [wcached] (first on line 1)");
	check_error(f, "[wcached]\n[model nopath]\npin = all\n[model b]\npath = /b\n", 2,
		"model \"nopath\": no path");
	check_error(f, "[model nopath]\n", 1, "model \"nopath\": no path");
	check_error(f, "[model]\npath = /x\n", 1, "model section without a name");
	check_error(f, "[model .hidden]\npath = /x\n", 1, "invalid model name \".hidden\"");
	check_error(f, "[model -x]\npath = /x\n", 1, "invalid model name \"-x\"");
	check_error(f, "[model a b]\npath = /x\n", 1, "invalid model name \"a b\"");
	check_error(f, "[model a/b]\npath = /x\n", 1, "invalid model name \"a/b\"");
	memset(name129, 'n', 129);
	name129[129] = '\0';
	snprintf(text, sizeof(text), "[model %s]\npath = /x\n", name129);
	check_error(f, text, 1, "invalid model name");
	name129[128] = '\0'; /* 128 bytes is the longest valid name */
	snprintf(text, sizeof(text), "[model %s]\npath = /x\n", name129);
	{
		struct config *cfg = NULL;

		assert_int_equal(load_text(f, "n128.conf", text, &cfg, NULL), 0);
		assert_string_equal(cfg->models[0].name, name129);
		config_free(cfg);
	}

	/* Lines inih cannot parse. */
	check_error(f, "[wcached]\nsocket = /s\nthis is not a key\n", 3,
		"expected \"key = value\"");
	check_error(f, "[wcached\nsocket = /s\n", 1, "section header without closing ']'");
	check_error(f, "[wcached] socket = /s\n", 1, "unexpected text after section header");
	check_error(f, "[wcached]\n= value\n", 2, "missing key name");
	check_error(f, "[wcached]\nsocket ; = /s\n", 2, "expected \"key = value\"");
	check_error(f, "[wcached]\n  : value\n", 2, "missing key name before ':'");
	check_error(f, "[model a]\npath = /a\n[wcached\n", 3, "section header without closing ']'");
	check_error(f, "[wcached ; comment]\n", 1, "section header without closing ']'");
	check_error(f, "[model a]\npath = /a\n[wcached] # comment\n[model b] x\n", 4,
		"unexpected text after section header: \"x\"");

	/* 64 KiB per line, newline included. */
	{
		char *line = malloc(70000);
		struct config *cfg = NULL;

		assert_non_null(line);
		memset(line, 'x', 70000);
		/* The line's first bytes; 'x' follow, and the newline below.
		 * NOLINTNEXTLINE(bugprone-not-null-terminated-result) */
		memcpy(line, "[wcached]\nsocket = /", 20);
		memcpy(line + 65535 + 10, "\n", 2); /* line 2: 65536 bytes, newline included */
		assert_int_equal(load_text(f, "l64k.conf", line, &cfg, NULL), -EINVAL);
		assert_non_null(strstr(error_get(), ":2: socket: path too long (65526 bytes)"));
		memcpy(line + 65535 + 10, "x\n", 3);
		check_error(f, line, 2, "line too long (more than 65536 bytes)");
		free(line);
	}
}

/* Errors that are not about a line. */
static void
test_file_errors(void **state)
{
	struct tu_dir *f = *state;
	struct config *cfg = (struct config *)(uintptr_t)0x1;
	char *missing, *path;
	static const char nul_text[] = "[wcached]\nsocket = /s\0x\n";

	assert_int_equal(asprintf(&missing, "%s/missing.conf", f->dir) > 0, 1);
	assert_int_equal(config_load(missing, &cfg), -ENOENT);
	assert_non_null(strstr(error_get(), missing));
	assert_non_null(strstr(error_get(), "No such file"));
	free(missing);

	/* A directory is refused by its type (before, it opened and its read
	 * failed). FIFOs and sockets are test_inifile.c's. */
	assert_int_equal(config_load(f->dir, &cfg), -EISDIR);
	assert_non_null(strstr(error_get(), f->dir));
	assert_non_null(strstr(error_get(), ": not a regular file (a directory)"));

	/* A NUL byte in a line. */
	path = tu_write(f->dir, "nul.conf", nul_text, sizeof(nul_text) - 1);
	assert_int_equal(config_load(path, &cfg), -EINVAL);
	assert_non_null(strstr(error_get(), ":2: line contains a NUL byte"));
	free(path);
	assert_ptr_equal(cfg, (struct config *)(uintptr_t)0x1);

	/* An empty path (wcached -c '') is named as such; fopen("") said
	 * only ": No such file or directory". */
	assert_int_equal(config_load("", &cfg), -ENOENT);
	assert_string_equal(error_get(), "\"\": an empty path names no file");

	/* /dev/zero is refused by its type, before any byte is read (a
	 * getline() of it once ran until memory ran out; then its first NUL
	 * byte ended the read). */
	assert_int_equal(config_load("/dev/zero", &cfg), -EINVAL);
	assert_string_equal(error_get(), "/dev/zero: not a regular file (a character device)");
	/* An endless line is refused after 64 KiB, not read into memory
	 * whole. */
	{
		size_t big = 4u << 20;
		char *text = malloc(big + 1);

		assert_non_null(text);
		memset(text, 'a', big);
		memcpy(text, "[wcached]\n; ", 12);
		text[big] = '\0';
		path = tu_write(f->dir, "long.conf", text, big);
		assert_int_equal(config_load(path, &cfg), -EINVAL);
		assert_non_null(strstr(error_get(), "long.conf:2: line too long (more than "
			"65536 bytes)"));
		free(path);
		free(text);
	}
	assert_ptr_equal(cfg, (struct config *)(uintptr_t)0x1);
}

static int diff_calls;
static char diff_log[512];

static void
record_diff(enum config_change change, const struct model_config *old_model,
	const struct model_config *new_model, unsigned changes, void *arg)
{
	size_t len = strlen(diff_log);
	const char *kind = change == CONFIG_MODEL_ADDED ? "added" :
		change == CONFIG_MODEL_REMOVED ? "removed" : "changed";
	const char *name = new_model != NULL ? new_model->name : old_model->name;

	assert_ptr_equal(arg, &diff_calls);
	diff_calls++;
	snprintf(diff_log + len, sizeof(diff_log) - len, "%s %s %x;", kind, name, changes);
}

/* config_diff() and config_model_changes() for SIGHUP. */
static void
test_diff(void **state)
{
	struct tu_dir *f = *state;
	struct config *a = NULL, *b = NULL;

	assert_int_equal(load_text(f, "a.conf",
				 "[model same]\npath=/s\nallow_users = 0 root\n"
				 "[model gone]\npath=/g\n"
				 "[model moved]\npath=/m1\n"
				 "[model flags]\npath=/f\npin=none\nwarm=no\n"
				 "[model acl]\npath=/a\nallow_users=0\n",
				 &a, NULL),
		0);
	assert_int_equal(load_text(f, "b.conf",
				 "[model new]\npath=/n\n"
				 "[model acl]\npath=/a\nallow_users=0\nallow_groups=0\n"
				 "[model flags]\npath=/f\npin=all\nwarm=yes\n"
				 "[model moved]\npath=/m2\n"
				 "[model same]\npath=/s\nallow_users = root,0\n",
				 &b, NULL),
		0);

	diff_calls = 0;
	diff_log[0] = '\0';
	config_diff(a, b, record_diff, &diff_calls);
	assert_string_equal(diff_log, "removed gone 0;added new 0;changed acl 8;changed flags 6;"
				      "changed moved 1;");
	assert_int_equal(diff_calls, 5);

	diff_log[0] = '\0';
	config_diff(NULL, a, record_diff, &diff_calls);
	assert_string_equal(diff_log,
		"added same 0;added gone 0;added moved 0;added flags 0;added acl 0;");

	diff_log[0] = '\0';
	config_diff(b, b, record_diff, &diff_calls);
	assert_string_equal(diff_log, "");

	assert_int_equal(config_model_changes(&a->models[0], config_model_find(b, "same")), 0);
	config_free(a);
	config_free(b);
}

/* log_level_parse(), used by the loader and by main's -d/-v options. */
static void
test_log_level_parse(void **state)
{
	(void)state;
	assert_int_equal(log_level_parse("error"), LOG_LEVEL_ERROR);
	assert_int_equal(log_level_parse("warn"), LOG_LEVEL_WARN);
	assert_int_equal(log_level_parse("warning"), LOG_LEVEL_WARN);
	assert_int_equal(log_level_parse("info"), LOG_LEVEL_INFO);
	assert_int_equal(log_level_parse("debug"), LOG_LEVEL_DEBUG);
	assert_int_equal(log_level_parse("INFO"), -EINVAL);
	assert_int_equal(log_level_parse(""), -EINVAL);
	assert_string_equal(log_level_name(LOG_LEVEL_WARN), "warn");
	assert_string_equal(log_level_name(7), "?");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_full, tu_dir_setup, tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_defaults, tu_dir_setup, tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_syntax_variants, tu_dir_setup,
			tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_relative_paths, tu_dir_setup, tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_memory_budget, tu_dir_setup, tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_derive_keys, tu_dir_setup, tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_shared_storage_keys, tu_dir_setup,
			tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_derive_keys, tu_dir_setup, tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_allow_lists, tu_dir_setup, tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_long_line, tu_dir_setup, tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_errors, tu_dir_setup, tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_file_errors, tu_dir_setup, tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_diff, tu_dir_setup, tu_dir_teardown),
		cmocka_unit_test(test_log_level_parse),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
