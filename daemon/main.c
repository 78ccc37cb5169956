/*
 * main.c: wcached, the shared weight cache daemon.
 *
 * Reads the configuration (or, with --check, validates it and every model
 * and exits), opens the control socket and the client socket (its own, or
 * ones systemd passed), drops root, loads every configured model once
 * (batch.c), serves, and runs the libuv loop: clients attach models, warm
 * threads fill the page cache, signals reload (SIGHUP, reload.c) or stop
 * (SIGTERM, SIGINT, stop.c) the daemon. After the loop it closes what is
 * left and runs the loop until uv_loop_close() succeeds, so nothing leaks.
 * daemon.h says which file holds what.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "closer.h"
#include "config.h"
#include "control.h"
#include "daemon.h"
#include "base/error.h"
#include "base/escape.h"
#include "log.h"
#include "mountrule.h"
#include "listen.h"
#include "notify.h"
#include "registry.h"
#include "restore.h"
#include "server.h"
#include "stage.h"
#include "format/source.h"
#include "format/tree.h"
#include "generation.h"
#include "warm.h"
#include "derive.h"
#include "watch.h"
#include "workq.h"

#define DEFAULT_CONFIG "/etc/wcached.conf"
/* Threads of the work queue unless UV_THREADPOOL_SIZE says otherwise. */
#define WORK_THREADS 8
/* How long the exit waits for descriptors still closing (closer.h). */
#define CLOSER_STOP_WAIT_MS 1000

static void
usage(FILE *f)
{
	fprintf(f, "usage: wcached [-c FILE] [--check] [--debug]\n\n"
		   "Serves model weights to worker processes from one shared page cache.\n\n"
		   "  -c, --config FILE  configuration file (default " DEFAULT_CONFIG ")\n"
		   "      --check        validate the configuration and every model, then exit\n"
		   "                     0 when all are valid, 1 otherwise\n"
		   "  -d, --debug        log at debug level\n"
		   "  -h, --help         this help\n"
		   "  -V, --version      print the version\n");
}

/* Ends a run that prints on stdout (--help, --version, --check) with
 * status, or 1 with a line on stderr when its output could not be written
 * (a full disk, /dev/full): before, that exited 0, saying nothing (review
 * rev223 L9). */
static int
finish_stdout(int status)
{
	int e = 0;

	if (fflush(stdout) != 0)
		e = errno != 0 ? errno : EIO;
	else if (ferror(stdout))
		e = EIO; /* an earlier write failed, and its errno is gone */
	if (e == 0)
		return status;
	fprintf(stderr, "wcached: writing the output: %s\n", strerror(e));
	return 1;
}

/* Prints "wcached: PREFIX" and msg on f, msg escaped (base/escape.h): a
 * message can quote a path or a name a model file chose. */
static void
print_message(FILE *f, const char *prefix, const char *msg)
{
	fprintf(f, "wcached: %s", prefix);
	escape_print(f, msg);
	fputc('\n', f);
}

/* Whether this process is in group gid (its effective or a supplementary
 * group): what a chown of a file it owns to gid needs. */
static int
in_group(gid_t gid)
{
	gid_t groups[NGROUPS_MAX];
	int n = getgroups(NGROUPS_MAX, groups);

	if (getegid() == gid)
		return 1;
	for (int i = 0; i < n; i++)
		if (groups[i] == gid)
			return 1;
	return 0;
}

/* Cuts path into its directory (*parent: ".", "/" or path itself, cut)
 * and its last name, which it returns; trailing slashes are dropped first. */
static char *
split_last(char *path, const char **parent)
{
	size_t n = strlen(path);
	char *base;

	while (n > 1 && path[n - 1] == '/')
		path[--n] = '\0';
	if ((base = strrchr(path, '/')) == NULL) {
		*parent = ".";
		return path;
	}
	*base++ = '\0';
	*parent = path[0] != '\0' ? path : "/";
	return base;
}

/* Whether dir names DEFAULT_RUNTIME_DIR in any spelling: the same last
 * name in the same parent directory (/run/wcached/, /var/run/wcached where
 * /var/run links to /run): a string compare failed those (review rev224
 * L2). dir itself may be missing. */
static int
is_runtime_dir(const char *dir)
{
	char rt[] = DEFAULT_RUNTIME_DIR, *copy = strdup(dir);
	const char *rt_parent, *parent, *rt_base = split_last(rt, &rt_parent), *base;
	struct stat a, b;
	int same;

	if (copy == NULL)
		return 0;
	base = split_last(copy, &parent);
	same = strcmp(base, rt_base) == 0 && stat(parent, &a) == 0 && stat(rt_parent, &b) == 0 &&
	       a.st_dev == b.st_dev && a.st_ino == b.st_ino;
	free(copy);
	return same;
}

/*
 * --check of a socket path (key = path): what would stop the daemon from
 * making its socket there: something that is not a socket in its place
 * (an error: wcached refuses to remove it), a directory this user (whom
 * wcached runs as when --check runs as its user, and root when `user =`
 * makes root create the sockets) cannot write and search (an error: the
 * start dies with EACCES; a warning when a socket is there already, which
 * systemd's socket activation may pass, though a stale one could not be
 * replaced), or a directory not there: an error (the start makes no
 * directory and dies with ENOENT), but for DEFAULT_RUNTIME_DIR in any
 * spelling, which the unit's RuntimeDirectory= makes at start (a warning;
 * before, any missing directory was excused so: review rev223 L5). A
 * directory --check cannot look at for another reason (EACCES: a parent
 * it may not search) is what the start meets where this user's view is
 * the start's (without `user =`, as for a directory it cannot write; or
 * run as root): an error, as its bind fails the same way (a warning before,
 * h314's leftover). Only where `user =` makes root create the sockets and
 * --check runs as another user is EACCES a warning naming the reason, as
 * before rev223 L5 (review rev224 L1); a file on the way (ENOTDIR), a link
 * loop (ELOOP), a name too long, are the same for every user: errors
 * (review rev226 L1: a warning and "ok", then the start died at bind).
 * Returns 1 for an error.
 */
static int
check_socket_path(const char *key, const char *path, int made_by_root)
{
	char *dir = strdup(path), *slash;
	struct stat st;
	int bad = 0, exists, missing;

	if (dir == NULL)
		return 1;
	exists = lstat(path, &st) == 0;
	if (exists && !S_ISSOCK(st.st_mode)) {
		fprintf(stderr, "wcached: %s = %s: exists and is not a socket; wcached will not "
				"remove it\n", key, path);
		bad = 1;
	} else if ((slash = strrchr(dir, '/')) != NULL) {
		*(slash == dir ? slash + 1 : slash) = '\0';
		missing = stat(dir, &st) < 0 ? errno : 0;
		if (missing == ENOENT && is_runtime_dir(dir)) {
			fprintf(stderr, "wcached: warning: %s = %s: %s: %s (wcached.service's "
					"RuntimeDirectory= makes it at start)\n", key, path, dir,
				strerror(missing));
		} else if (missing == ENOENT) {
			fprintf(stderr, "wcached: %s = %s: %s: %s (wcached does not make the "
					"directory: create it, or use %s, which wcached.service's "
					"RuntimeDirectory= makes)\n", key, path, dir,
				strerror(missing), DEFAULT_RUNTIME_DIR);
			bad = 1;
		} else if (missing != 0 &&
			   (missing != EACCES || !made_by_root || geteuid() == 0)) {
			fprintf(stderr, "wcached: %s = %s: uid %u cannot reach %s: %s (wcached "
					"cannot make the socket there and its start fails the "
					"same way%s)\n", key, path, (unsigned)geteuid(), dir,
				strerror(missing), missing == EACCES ? ": let that user search "
					"every directory above it" : "");
			bad = 1;
		} else if (missing != 0) {
			fprintf(stderr, "wcached: warning: %s = %s: %s: %s (--check could not look "
					"at the directory)\n", key, path, dir, strerror(missing));
		} else if (!S_ISDIR(st.st_mode)) {
			fprintf(stderr, "wcached: %s = %s: %s is not a directory\n", key, path,
				dir);
			bad = 1;
		} else if (!made_by_root &&
			   faccessat(AT_FDCWD, dir, W_OK | X_OK, AT_EACCESS) == -1) {
			int e = errno;

			fprintf(stderr, "wcached: %s%s = %s: uid %u cannot %s in %s: %s (%s)\n",
				exists ? "warning: " : "", key, path, (unsigned)geteuid(),
				exists ? "replace the socket" : "make the socket", dir, strerror(e),
				exists ? "fine when systemd passes the socket (socket activation), "
					 "not when wcached must make it again" :
					 "give the directory to wcached's user, or use systemd's "
					 "RuntimeDirectory=");
			bad = !exists;
		}
	}
	free(dir);
	return bad;
}

/*
 * --check of control_group: run as the daemon's user (not root), a group
 * it is not in is what its start meets: the control socket cannot be given
 * to that group (an error; it was a warning, and the start then died). As
 * root, or with `user =` (a wcached started as root makes its sockets
 * before it drops to that user), the socket is made as root and may go to
 * any group.
 */
static int
check_control_group(const struct config *cfg)
{
	if (cfg->control_group == NULL || geteuid() == 0 || cfg->user != NULL ||
	    in_group(cfg->control_gid))
		return 0;
	fprintf(stderr, "wcached: control_group = %s: this user (uid %u) is not in that group: "
			"wcached running as it cannot give the control socket to it (add the "
			"user to the group: SupplementaryGroups= in the unit)\n",
		cfg->control_group, (unsigned)geteuid());
	return 1;
}

/*
 * --check of stage_dir: on a network or FUSE filesystem
 * (reload_stage_dir_remote), an error where a model has stage = yes, as the
 * start's, a warning otherwise, and nothing looked up there; on a local
 * one, when a model must stage (stage = yes), what
 * stage_prepare_dir (stage.h) will meet. An existing stage_dir must be a
 * directory of owner (wcached's user), not writable by its group or
 * others, and one it can write; a missing one must be creatable: its
 * parent must exist and be writable (as root with `user =`, wcached makes
 * the missing parents too: the nearest one that exists must be writable).
 * Nothing is created here. Returns 1 for an error.
 */
static int
check_stage_dir(const struct config *cfg, uid_t owner, int makes_parents)
{
	const char *dir = cfg->stage_dir;
	const char *model = NULL, *why = NULL;
	char *up, *slash;
	struct stat st;
	int err;

	if ((err = reload_stage_dir_remote(cfg)) != 0) {
		fprintf(stderr, "wcached: %s%s\n", err > 0 ? "warning: " : "", error_get());
		return err < 0;
	}
	for (size_t i = 0; i < cfg->n_models && model == NULL; i++)
		if (cfg->models[i].stage == FS_STAGE_YES)
			model = cfg->models[i].name;
	if (model == NULL)
		return 0;
	if (stat(dir, &st) == 0) {
		if (!S_ISDIR(st.st_mode))
			why = "is not a directory";
		else if (st.st_uid != owner)
			why = "does not belong to wcached's user";
		else if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
			why = "is writable by its group or others (chmod go-w)";
		else if ((st.st_mode & (S_IWUSR | S_IXUSR)) != (S_IWUSR | S_IXUSR))
			why = "is not writable by its owner";
		if (why != NULL)
			fprintf(stderr, "wcached: stage_dir = %s %s (uid %u, mode %04o; wcached "
					"runs as uid %u), and model \"%s\" has stage = yes\n", dir,
				why, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777),
				(unsigned)owner, model);
		return why != NULL;
	}
	if (errno != ENOENT) {
		fprintf(stderr, "wcached: stage_dir = %s: %s, and model \"%s\" has stage = yes\n",
			dir, strerror(errno), model);
		return 1;
	}
	/* Missing: the directory that would hold it (as root with user =, the
	 * nearest one that exists: wcached makes the others). */
	if ((up = strdup(dir)) == NULL)
		return 1;
	for (size_t n = strlen(up); n > 1 && up[n - 1] == '/';)
		up[--n] = '\0';
	while ((slash = strrchr(up, '/')) != NULL) {
		*(slash == up ? slash + 1 : slash) = '\0';
		if (stat(up, &st) == 0 || errno != ENOENT || !makes_parents || slash == up)
			break;
	}
	err = stat(up, &st) == -1 ? errno : !S_ISDIR(st.st_mode) ? ENOTDIR :
		faccessat(AT_FDCWD, up, W_OK | X_OK, AT_EACCESS) == -1 ? errno : 0;
	if (err != 0)
		fprintf(stderr, "wcached: stage_dir = %s cannot be created: %s: %s (uid %u), and "
				"model \"%s\" has stage = yes\n", dir, up, strerror(err),
			(unsigned)geteuid(), model);
	free(up);
	return err != 0;
}

/* --check of every model: opened, validated and given the sparse-file
 * check (gen_check_holes) as a load would, as this process can; one line
 * each. Returns 1 when one is not valid. */
static int
check_models(const struct config *cfg)
{
	struct model_source s;
	char why[MOUNTRULE_WHY];
	int bad = 0, fd;

	for (size_t i = 0; i < cfg->n_models; i++) {
		const struct model_config *m = &cfg->models[i];
		char prefix[CONFIG_MODEL_NAME_MAX + 16];
		struct index_header h;

		snprintf(prefix, sizeof(prefix), "model \"%s\": ", m->name);
		/* Refused, or the walk failed: nothing looks the path up by name
		 * after it (as load_work; review rev207 H2). */
		why[0] = '\0';
		if ((fd = mountrule_open(NULL, m->path, why, sizeof(why))) < 0) {
			if (why[0] == '\0')
				snprintf(why, sizeof(why), "%s: %s", m->path, strerror(-fd));
			print_message(stderr, prefix, why);
			bad = 1;
			continue;
		}
		close(fd);
		if (source_open(m->path, &s) < 0) {
			print_message(stderr, prefix, error_get());
			bad = 1;
			continue;
		}
		if (index_open(s.index, s.index_len, &h) == 0 && gen_check_holes(&s) >= 0) {
			printf("model \"%s\": ok: %" PRIu64 " tensors in %zu file%s (%s)\n",
				m->name, h.tensor_count, s.nfiles, s.nfiles == 1 ? "" : "s",
				source_format_name(s.format));
		} else {
			print_message(stderr, prefix, error_get());
			bad = 1;
		}
		source_close(&s);
	}
	return bad;
}

/*
 * Becomes `user =` (not root), from root: its groups (initgroups), its gid,
 * its uid, then makes sure root cannot be had back (setuid(0) must fail: it
 * succeeds where the capabilities survived the switch, as under
 * SECBIT_NO_SETUID_FIXUP, and a daemon that still holds them reads what
 * the user may not). The one switch of the start (drop_privileges) and of
 * --check's child (check_models_as_user), so that --check refuses what the
 * start refuses. 0, or a negative errno with the reason in error_get().
 */
static int
become_user(const struct config *c)
{
	if (initgroups(c->user_name, c->user_gid) == -1 || setgid(c->user_gid) == -1 ||
		setuid(c->user_uid) == -1)
		return error_set(-errno, "user = %s: cannot switch to uid %u gid %u: %s", c->user,
			(unsigned)c->user_uid, (unsigned)c->user_gid, strerror(errno));
	if (setuid(0) != -1)
		return error_set(-EPERM, "user = %s: could regain root after switching",
			c->user);
	return 0;
}

/*
 * --check run as root of a configuration with `user = NAME`: wcached opens
 * its models only after becoming that user (drop_privileges), so they are
 * checked in a child that becomes it the same way (become_user: its groups,
 * gid, uid, and root out of reach): a model only root may read fails here
 * as it fails the daemon. Returns 1 when one is not valid or the child
 * could not become the user.
 */
static int
check_models_as_user(const struct config *cfg)
{
	pid_t pid;
	int st;

	printf("models checked as user %s (uid %u, gid %u), as wcached opens them\n",
		cfg->user_name, (unsigned)cfg->user_uid, (unsigned)cfg->user_gid);
	fflush(stdout);
	fflush(stderr);
	if ((pid = fork()) == -1) {
		fprintf(stderr, "wcached: fork: %s\n", strerror(errno));
		return 1;
	}
	if (pid == 0) {
		int bad;

		if (become_user(cfg) < 0) {
			print_message(stderr, "", error_get());
			_exit(1);
		}
		bad = check_models(cfg);
		fflush(stdout);
		fflush(stderr);
		_exit(bad);
	}
	while (waitpid(pid, &st, 0) == -1)
		if (errno != EINTR) {
			fprintf(stderr, "wcached: waitpid: %s\n", strerror(errno));
			return 1;
		}
	return !WIFEXITED(st) || WEXITSTATUS(st) != 0;
}

/*
 * --check: validates the config and every model; prints one line each.
 * What it can check depends on who runs it: as the daemon's user (sudo -u
 * wcache wcached --check, as wcached(8) advises) everything is checked with
 * that user's rights; as root with `user = NAME`, the sockets and stage_dir
 * as root (wcached makes them as root) and the models as that user; as root
 * without `user =`, everything as root, which a wcached started as another
 * user (systemd's User=) may not have: one line says so.
 */
static int
check(const char *path)
{
	struct config *cfg;
	int bad = 0, root = geteuid() == 0, as_user;

	if (config_load(path, &cfg) < 0) {
		print_message(stderr, "", error_get());
		return 1;
	}
	as_user = root && cfg->user != NULL && cfg->user_uid != 0;
	/* With `user =`, root makes the sockets: this user's rights on their
	 * directories say nothing (run as root, --check is root anyway). */
	bad |= check_socket_path("socket", cfg->socket_path, cfg->user != NULL);
	bad |= check_socket_path("control", cfg->control_path, cfg->user != NULL);
	if (!root && cfg->user != NULL)
		fprintf(stderr, "wcached: note: user = %s: a wcached started as root makes its "
				"sockets as root, so their directories and control_group were not "
				"checked for uid %u (run --check as root for those)\n", cfg->user,
			(unsigned)geteuid());
	bad |= check_control_group(cfg);
	bad |= check_stage_dir(cfg, as_user ? cfg->user_uid : geteuid(), as_user);
	bad |= as_user ? check_models_as_user(cfg) : check_models(cfg);
	if (root && !as_user)
		fprintf(stderr, "wcached: note: checked as root, and %s: a wcached started as "
				"another user (systemd's User=) may not read every model, nor "
				"write the socket directories or stage_dir; run --check as that "
				"user (sudo -u wcache wcached --check -c FILE) to check with its "
				"rights\n", cfg->user != NULL ? "user = is root" :
				"the configuration sets no user =");
	/* Valid, but a daemon that serves nothing is rarely what was meant
	 * (the packaged configuration starts that way): a warning, not an error. */
	if (cfg->n_models == 0)
		fprintf(stderr, "wcached: warning: %s configures no model: wcached would serve "
				"nothing; add a [model NAME] section with path = ... (see "
				"wcached.conf(5))\n", path);
	printf("%s: %s\n", path,
		bad ? "errors found" : cfg->n_models == 0 ? "ok, no models" : "ok");
	config_free(cfg);
	return bad;
}

/* The models changed since the last turn of the loop: the watched
 * directories follow them, once for them all. */
static void
on_watch_idle(uv_idle_t *idle)
{
	struct daemon *d = idle->data;

	uv_idle_stop(idle);
	if (d->watch != NULL)
		watch_sync(d->watch);
}

static void
on_registry_changed(struct registry *r)
{
	struct daemon *d = r->owner;
	uint64_t done, total;
	unsigned warming, models;

	/* Immediate status only when warming just ended; the timer covers
	 * progress in between. */
	/* Models come and go through the control socket too: keep the
	 * watched directories in step, at the loop's next turn (on_watch_idle). */
	if (d->watch != NULL)
		uv_idle_start(&d->watch_idle, on_watch_idle);
	restore_sync(r);
	registry_progress(r, &done, &total, &warming, &models);
	if (warming == 0 && d->serving)
		timers_send_status(d);
}

static void
on_swapped(struct registry *r, struct model_entry *m, uint64_t generation)
{
	struct daemon *d = r->owner;

	server_announce(d->server, m, generation);
	derive_collect(&d->derive);
	restore_sync(r);
}

/* registry's relinked hook: m's files are loaded again, validated anew,
 * as the watch paces it (watch.h's watch_revalidate). */
static void
on_relinked(struct registry *r, struct model_entry *m)
{
	struct daemon *d = r->owner;

	if (d->watch != NULL)
		watch_revalidate(d->watch, m->name);
}

static void
close_walk(uv_handle_t *h, void *arg)
{
	if (!uv_is_closing(h))
		uv_close(h, NULL);
}

/* control_context.reload_config: `wcachectl reload` without a name. */
static int
control_reload(void *arg, registry_done_fn done, void *done_arg)
{
	return reload_config(arg, done, done_arg);
}

/* A start that fails from start_control() on: the socket files this start
 * made are removed first (so that wcachectl finds no control socket rather
 * than a dead one), then fatalx() with the error (error_get()). */
static _Noreturn void
start_fatal(struct daemon *d)
{
	char msg[ERROR_MAX];

	snprintf(msg, sizeof(msg), "%s", error_get());
	stop_remove_sockets(d);
	fatalx("%s", msg);
}

/* Opens the control socket: 0600, or 0660 for control_group. Its
 * failures end the start through start_fatal(), as the client socket's do:
 * a control_start() that fails removes the socket file made just before. */
static void
start_control(struct daemon *d)
{
	int has_group = d->cfg->control_group != NULL, fd, r;

	/* A socket unit may pass it as "control"; else we make it. */
	if ((r = listen_fds_take("control", SOCK_STREAM, &fd)) < 0)
		start_fatal(d);
	if (r == 0) {
		fd = control_listen_path(d->cfg->control_path, has_group ? 0660 : 0600,
			has_group ? d->cfg->control_gid : (gid_t)-1);
		if (fd < 0)
			start_fatal(d);
		stop_made_socket(&d->created_control, d->cfg->control_path);
	}
	d->control_ctx = (struct control_context){
		.reg = &d->reg,
		.derive = &d->derive,
		.mem = &d->mem,
		.started_ms = uv_now(&d->loop),
		.reload_config = control_reload,
		.arg = d,
		.daemon_uid = geteuid(),
		.has_group = has_group,
		.group = d->cfg->control_gid,
	};
	if (control_start(&d->loop, fd, &d->control_ctx, &d->control) < 0)
		start_fatal(d);
}

/* control_group should be operators only: when it is the group of the
 * client socket (the group workers join to attach), every worker could
 * also load any file, unload, evict: said once at start. */
static void
warn_shared_group(const struct config *cfg)
{
	struct stat st;

	if (cfg->control_group != NULL && stat(cfg->socket_path, &st) == 0 &&
		st.st_gid == cfg->control_gid)
		log_warnx("control_group = %s is also the group of the client socket %s: every "
			  "worker that may attach may also control wcached (load any file it "
			  "can read, unload, evict); give control_group to operators only",
			cfg->control_group, cfg->socket_path);
}

/*
 * Raises the soft RLIMIT_NOFILE to the hard one, as systemd advises for a
 * program that needs many descriptors and never calls select(): wcached
 * waits with epoll (libuv) and starts no other program. The server derives
 * its descriptor budget from the soft limit (server_budget.c); a login
 * session's 1024 (Debian's default) let one client that never reads its
 * replies take its uid's whole share. Under the unit (LimitNOFILE=, soft =
 * hard) nothing changes and nothing is logged.
 */
static void
raise_nofile(void)
{
	struct rlimit rl;
	rlim_t soft;

	if (getrlimit(RLIMIT_NOFILE, &rl) == -1 || rl.rlim_cur >= rl.rlim_max)
		return;
	soft = rl.rlim_cur;
	rl.rlim_cur = rl.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &rl) == -1)
		log_warn("RLIMIT_NOFILE: raising the soft limit %ju to the hard limit %ju",
			(uintmax_t)soft, (uintmax_t)rl.rlim_max);
	else
		log_info("RLIMIT_NOFILE: soft limit raised from %ju to the hard limit %ju",
			(uintmax_t)soft, (uintmax_t)rl.rlim_max);
}

/*
 * user = NAME: when started as root, hand the sockets wcached created to
 * that user and become it, before any model is opened (so models are read
 * with the user's rights, as under systemd's User=).
 */
static void
drop_privileges(struct daemon *d)
{
	const struct config *c = d->cfg;

	if (c->user == NULL)
		return;
	/* Who it was started as first: `user = root` from uid 64111 keeps
	 * 64111, not root (review rev223 L10). */
	if (geteuid() != 0) {
		if (geteuid() != c->user_uid)
			log_warnx("user = %s: not started as root, staying uid %u", c->user,
				(unsigned)geteuid());
		return;
	}
	if (c->user_uid == 0) {
		log_warnx("user = %s: that is root: wcached keeps running as root", c->user);
		return;
	}
	/* The control socket keeps control_group's group, set as it was made. */
	if ((d->created_socket.path != NULL &&
		lchown(d->created_socket.path, c->user_uid, c->user_gid) == -1) ||
		(d->created_control.path != NULL &&
			lchown(d->created_control.path, c->user_uid,
				c->control_group != NULL ? (gid_t)-1 : c->user_gid) == -1)) {
		int e = errno;

		error_set(-e, "user = %s: chown of the sockets: %s", c->user, strerror(e));
		start_fatal(d);
	}
	if (become_user(c) < 0)
		start_fatal(d);
	d->control_ctx.daemon_uid = c->user_uid;
	log_info("running as user %s (uid %u)", c->user, (unsigned)c->user_uid);
}

/*
 * The start-up line. failed counts the configured models whose load failed
 * (the batch's count). A load is answered once the model is loaded, before
 * it warms, so by now a model's warm-up may have failed (status says
 * failed, attaches are refused) or may still run: both are counted as they
 * stand at this moment, so that the line never calls a model good that
 * status calls failed. A warm-up that fails later says so in its own line
 * (generation.c: 'model "x": warming generation N failed: ...').
 */
static void
log_serving(const struct daemon *d, unsigned failed)
{
	unsigned warm_failed = 0, warming = 0;
	char more[80] = "";
	size_t len;

	for (const struct model_entry *m = d->reg.models; m != NULL; m = m->next) {
		if (m->current != NULL && m->current->state == GEN_FAILED)
			warm_failed++;
		else if (m->current != NULL && gen_is_warming(m->current))
			warming++;
	}
	if (warm_failed > 0)
		snprintf(more, sizeof(more), ", %u failed while warming", warm_failed);
	len = strlen(more);
	if (warming > 0)
		snprintf(more + len, sizeof(more) - len, ", %u still warming", warming);
	log_info("serving on %s (%u model%s failed to load%s)", d->cfg->socket_path, failed,
		failed == 1 ? "" : "s", more);
}

/* The configured models have been loaded (or failed): serve. */
static void
start_serving(struct daemon *d, unsigned failed, void *arg)
{
	struct server_options sopt = { .max_clients = d->cfg->max_clients,
		.max_clients_per_uid = d->cfg->max_clients_per_uid, .derive = &d->derive,
		.closer = d->closer, .unread_reply_ms = d->cfg->unread_reply_seconds * 1000u };

	(void)arg;
	if (d->stopping)
		return;
	if (server_start(&d->loop, &d->reg, d->listen_fd, &sopt, &d->server) < 0)
		fatalx("%s", error_get());
	d->listen_fd = -1; /* the server owns it */
	d->serving = 1;
	d->control_ctx.server = d->server;
	watch_sync(d->watch);
	uv_timer_start(&d->status_timer, timers_on_status, 1000, 1000);
	uv_timer_start(&d->checks_timer, timers_on_checks, RESTORE_CHECKS_DELAY_MS, 0);
	log_serving(d, failed);
	batch_check_fit(d);
	notify_send("READY=1");
	timers_send_status(d);
}

static void
on_signal(uv_signal_t *s, int signum)
{
	struct daemon *d = s->data;

	if (signum != SIGHUP) {
		stop_daemon(d);
		return;
	}
	if (reload_config(d, NULL, NULL) < 0) {
		notify_send("READY=1");
		timers_send_status(d);
	}
}

int
main(int argc, char **argv)
{
	static const struct option options[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "check", no_argument, NULL, 'C' },
		{ "debug", no_argument, NULL, 'd' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct daemon d = { .config_path = DEFAULT_CONFIG, .listen_fd = -1 };
	struct warm_options wopt = { 0 };
	struct restore *stored = NULL;
	char *const *keep;
	size_t nkeep;
	int opt, do_check = 0, debug = 0, notifying, fdstore, stage_remote, r;

	opterr = 0; /* one line of ours per mistake, not getopt's and the usage */
	while ((opt = getopt_long(argc, argv, "c:dhV", options, NULL)) != -1) {
		switch (opt) {
		case 'c':
			/* A usage error, as wcachectl -c "" is (review rev223 L9). */
			if (optarg[0] == '\0') {
				fprintf(stderr, "wcached: --config needs a path, not an empty "
						"one (see 'wcached --help')\n");
				return 2;
			}
			d.config_path = optarg;
			break;
		case 'C':
			do_check = 1;
			break;
		case 'd':
			debug = 1;
			break;
		case 'h':
			usage(stdout);
			return finish_stdout(0);
		case 'V':
			printf("wcached %s\n", WCACHE_VERSION);
			return finish_stdout(0);
		default:
			/* A long option given a value it does not take sets optopt
			 * too (--debug=1): name what was written. */
			if (strncmp(argv[optind - 1], "--", 2) == 0 && optopt != 'c')
				fprintf(stderr, "wcached: %s: unknown option, or one that takes "
						"no value", argv[optind - 1]);
			else if (optopt == 'c')
				fprintf(stderr, "wcached: %s needs a FILE", argv[optind - 1]);
			else
				fprintf(stderr, "wcached: unknown option -%c", optopt);
			fprintf(stderr, " (see 'wcached --help')\n");
			return 2;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "wcached: unexpected argument \"%s\" (see 'wcached --help')\n",
			argv[optind]);
		return 2;
	}
	/* A model path that is a link to a descriptor (/dev/stdin) is refused
	 * without naming /dev/fd/N as the spelling that works: here it would
	 * name wcached's own descriptor, not one the operator holds. */
	tree_fd_hint = false;
	/* No mount a neighbour's FUSE server may hold is crossed (mountrule.h). */
	mountrule_install();
	if (do_check)
		return finish_stdout(check(d.config_path));

	log_init(LOG_LEVEL_INFO, "wcached");
	if (config_load(d.config_path, &d.cfg) < 0)
		fatalx("%s", error_get());
	d.debug = debug;
	log_setlevel(debug ? LOG_LEVEL_DEBUG : d.cfg->log_level);
	raise_nofile();
	signal(SIGPIPE, SIG_IGN);
	/* A file size limit (RLIMIT_FSIZE) fails a staging copy with EFBIG, not the daemon. */
	signal(SIGXFSZ, SIG_IGN);
	if ((notifying = notify_init()) < 0)
		log_warnx("%s", error_get());
	/* Under a manager with a file descriptor store: take back what the
	 * previous process stored (restore.h). */
	if ((fdstore = notifying > 0 && restore_enabled()))
		stored = restore_take();

	/* Threads of libuv's work queue (loads, staging, page work, polls):
	 * half of them may wait on remote filesystems (workq.h). */
	workq_default_pool_size(WORK_THREADS);
	if ((r = uv_loop_init(&d.loop)) < 0)
		fatalx("uv_loop_init: %s", uv_strerror(r));
	if (workq_start_pool(&d.loop) < 0)
		fatalx("%s", error_get());
	if (closer_start(&d.closer) < 0)
		fatalx("closer: out of memory");
	wopt.threads = (unsigned)d.cfg->prefetch_threads;
	if ((r = warm_pool_new(&d.loop, &wopt, &d.pool)) < 0)
		fatalx("%s%s", error_get(), workq_thread_hint(r));
	if (!fdstore && registry_init(&d.reg, &d.loop, d.pool) < 0)
		fatalx("%s", error_get());
	if (fdstore) {
		int status_fd = restore_status_fd(stored);

		if (registry_init_stored(&d.reg, &d.loop, d.pool, status_fd) == 0)
			restore_status_taken(stored);
		else if (status_fd < 0)
			fatalx("%s", error_get());
		else {
			log_warnx("warm restart: %s; a new status page", error_get());
			if (registry_init_stored(&d.reg, &d.loop, d.pool, -1) < 0)
				fatalx("%s", error_get());
		}
		restore_slots(stored, &d.reg);
	}
	d.reg.owner = &d;
	d.reg.closer = d.closer;
	d.reg.changed = on_registry_changed;
	d.reg.swapped = on_swapped;
	d.reg.relinked = on_relinked;
	d.reg.closed = restore_forget;
	d.reg.memory_budget = reload_memory_budget(&d, d.cfg);
	d.reg.restart_hold_ms = (int)d.cfg->restart_hold_seconds * 1000;
	if (derive_init(&d.derive, &d.reg, &server_derive_hooks) < 0)
		fatalx("derived artifacts: out of memory");
	d.derive.closer = d.closer;
	derive_set_memory_limit(&d.derive, &d.mem);
	uv_idle_init(&d.loop, &d.watch_idle);
	d.watch_idle.data = &d;
	if (watch_start(&d.loop, &d.reg, &d.watch) < 0)
		fatalx("%s", error_get());

	/* Signals first: from the moment a socket exists, a SIGTERM must
	 * stop the daemon cleanly. */
	uv_signal_init(&d.loop, &d.sigterm);
	uv_signal_init(&d.loop, &d.sigint);
	uv_signal_init(&d.loop, &d.sighup);
	d.sigterm.data = d.sigint.data = d.sighup.data = &d;
	uv_signal_start(&d.sigterm, on_signal, SIGTERM);
	uv_signal_start(&d.sigint, on_signal, SIGINT);
	uv_signal_start(&d.sighup, on_signal, SIGHUP);

	/* stage_dir on a network or FUSE filesystem (reload_stage_dir_remote):
	 * judged before a warm restart looks its stored copies up there on
	 * the loop (restore_model), before any staging or sweep, and before
	 * the sockets exist, so that a start it refuses (a model has stage =
	 * yes) is never seen serving for a moment (review rev221 M2). Else a
	 * warning: nothing is made (L2), looked up, restored or swept there,
	 * and each staging is refused (M3). */
	if ((stage_remote = reload_stage_dir_remote(d.cfg)) < 0)
		start_fatal(&d);
	if (stage_remote)
		log_warnx("%s", error_get());

	/* The control socket, then the client socket (taken or created now,
	 * so a second daemon fails at once; served when the configured models
	 * are loaded); then drop root, before any model is opened. */
	start_control(&d);
	r = listen_fds_take("client", SOCK_SEQPACKET, &d.listen_fd);
	if (r < 0)
		start_fatal(&d);
	if (r == 0) {
		if ((d.listen_fd = server_listen_path(d.cfg->socket_path, 0660)) < 0)
			start_fatal(&d);
		stop_made_socket(&d.created_socket, d.cfg->socket_path);
	}
	listen_fds_unset();
	/* stage_dir before dropping root, so that it can be given to the user. */
	if (d.cfg->user != NULL && geteuid() == 0 && !stage_remote)
		reload_set_stage_dir(&d, d.cfg, d.cfg->user_uid, d.cfg->user_gid, 0);
	drop_privileges(&d);
	warn_shared_group(d.cfg);
	if (d.reg.stage_dir == NULL && !stage_remote)
		reload_set_stage_dir(&d, d.cfg, (uid_t)-1, (gid_t)-1, 0);
	uv_timer_init(&d.loop, &d.status_timer);
	d.status_timer.data = &d;
	uv_timer_init(&d.loop, &d.residency_timer);
	d.residency_timer.data = &d;
	uv_timer_start(&d.residency_timer, timers_on_residency, RESIDENCY_CHECK_MS,
		RESIDENCY_CHECK_MS);
	uv_timer_init(&d.loop, &d.stall_timer);
	d.stall_timer.data = &d;
	uv_timer_start(&d.stall_timer, timers_on_stall, STALL_CHECK_MS, STALL_CHECK_MS);
	uv_timer_init(&d.loop, &d.start_timer);
	d.start_timer.data = &d;
	uv_timer_init(&d.loop, &d.notify_timer);
	d.notify_timer.data = &d;
	uv_timer_init(&d.loop, &d.checks_timer);
	d.checks_timer.data = &d;
	uv_timer_init(&d.loop, &d.stop_timer);
	d.stop_timer.data = &d;
	if (notifying)
		uv_timer_start(&d.notify_timer, timers_on_notify, 200, 200);

	struct batch *b = batch_new(&d, start_serving, NULL);
	for (size_t i = 0; i < d.cfg->n_models; i++) {
		const struct model_config *m = &d.cfg->models[i];
		int restoring = fdstore ? restore_model(stored, &d.reg, m->name, m->path, m->pin,
						m->warm, batch_restore_done, b) : 0;

		if (restoring == RESTORE_MODEL_WAITS) {
			/* Listed, waiting for the operator's reload: failed. */
			batch_set_access(&d, m);
			b->failed++;
		} else if (restoring == RESTORE_MODEL_JUDGED) {
			/* Listed, judged against its recorded tree. */
			batch_set_access(&d, m);
			batch_judged_load(b, m->name);
		} else if (restoring) {
			batch_set_access(&d, m);
			b->pending++;
		} else {
			batch_load(b, m);
		}
	}
	/* What a crashed or stopped wcached left in stage_dir but the copies
	 * a warm restart is checking, before any staging starts (stagings are
	 * queued from the loop). */
	restore_copies(stored, &keep, &nkeep);
	registry_stage_sweep(&d.reg, keep, nkeep);
	/* A remote one only now: the restores above had none to look copies
	 * up in (restore_model copies it), and no sweep ran. */
	if (stage_remote)
		reload_set_stage_dir(&d, d.cfg, (uid_t)-1, (gid_t)-1, 1);
	if (fdstore)
		restore_started(stored, &d.reg);
	d.start_batch = b;
	uv_timer_start(&d.start_timer, batch_on_start_wait,
		(uint64_t)d.cfg->start_wait_seconds * 1000, 0);
	batch_release(b); /* may serve at once (nothing to wait for) */
	uv_run(&d.loop, UV_RUN_DEFAULT);

	/* Every handle is closed; close anything left and drain the loop. */
	uv_walk(&d.loop, close_walk, NULL);
	uv_run(&d.loop, UV_RUN_DEFAULT);
	if ((r = uv_loop_close(&d.loop)) < 0)
		log_warnx("uv_loop_close: %s", uv_strerror(r));
	/* Every connection's socket is in the closer by now. */
	closer_stop(d.closer, CLOSER_STOP_WAIT_MS);
	stop_remove_sockets(&d);
	notify_close();
	config_free(d.cfg);
	log_info("stopped");
	return 0;
}
