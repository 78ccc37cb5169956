/*
 * closer.c: lanes of descriptors to close, each with its own thread while it
 * has any (see closer.h for why).
 *
 * Each owner has two lanes: what it chose (closer_close) and the daemon's
 * own (closer_unmap_close), so that no close a client chose holds up the
 * daemon's own (review rev186 F2, rev189 F4). The lanes are a list under
 * one mutex: a lane exists while it has descriptors queued or being
 * closed, and for LANE_IDLE_MS after, its thread waiting for more; then the
 * thread removes and frees it. The queue is an array used from head to
 * count and reset when it empties, so a burst of closes costs one thread
 * and a few reallocs. Threads are detached: closer_stop() waits for the
 * count of running ones to reach zero on a condition variable, with a
 * deadline, rather than joining threads that may never return.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "base/deadline.h"
#include "closer.h"
#include "log.h"

/* A lane's thread needs almost no stack: it only calls munmap() and
 * close(). */
#define LANE_STACK_SIZE ((size_t)256 * 1024)

/* How long a lane's thread waits for more once its queue is empty before
 * it ends: a run of unloads, one close each as the loop hands them over,
 * takes one thread, not one each (test_control's full status page, 8,190
 * load and unload round trips: 6,093 to 6,614 threads started before,
 * 2 or 3 now). */
#define LANE_IDLE_MS 100

/* A closer_then(): done(arg) once left lanes reached their mark (NULL
 * done: forgotten), in the closer's list until then. */
struct then {
	void (*done)(void *);
	void *arg;
	size_t left;
	struct then *next;
};

/* One thing to let go of: a mapping (base NULL if none), then a descriptor
 * (-1 if none). Or, with mark, nothing: the place of a closer_then() in the
 * lane (not counted anywhere). */
struct closing {
	void *base;
	size_t size;
	int fd;
	struct then *mark;
};

struct lane {
	struct closer *cl;
	uid_t owner;
	int own;             /* the daemon's own lane of owner (closer_unmap_close) */
	struct closing *q;   /* queued: q[head .. count) */
	size_t head, count, cap;
	unsigned pending;    /* queued, plus the one being closed */
	uint64_t close_started_ms; /* when the close in progress began */
	int idle;            /* its thread waits on more for something to close */
	pthread_cond_t more;
	struct lane *next;
};

struct closer {
	pthread_mutex_t lock;
	pthread_cond_t drained;  /* a lane's thread has exited */
	struct lane *lanes;
	struct then *thens;      /* closer_then()s whose lanes are not through */
	unsigned threads;        /* lanes with a running thread: every lane */
	unsigned long inline_closes;
	int stopping;            /* closer_stop: idle threads end at once */
};

int
closer_start(struct closer **out)
{
	struct closer *cl = calloc(1, sizeof(*cl));

	if (cl == NULL)
		return -ENOMEM;
	pthread_mutex_init(&cl->lock, NULL);
	pthread_cond_init(&cl->drained, NULL);
	*out = cl;
	return 0;
}

static uint64_t
now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The lane of owner (own: the daemon's own of owner) as the log names it
 * ("uid 1000", "wcached's own of uid 1000", "wcached's files on local
 * storage"), in a buffer of the calling thread's. */
static const char *
lane_name(uid_t owner, int own)
{
	static __thread char buf[48];

	if (owner == CLOSER_DAEMON)
		return "wcached's files on remote storage";
	if (owner == CLOSER_LOCAL)
		return "wcached's files on local storage";
	snprintf(buf, sizeof(buf), "%suid %u", own ? "wcached's own of " : "", (unsigned)owner);
	return buf;
}

/* owner's lane (own: the daemon's own of owner), or NULL; with cl->lock
 * held. */
static struct lane *
lane_find(struct closer *cl, uid_t owner, int own)
{
	for (struct lane *l = cl->lanes; l != NULL; l = l->next)
		if (l->owner == owner && l->own == own)
			return l;
	return NULL;
}

/* Lets go of what was queued: the mapping, then the descriptor. */
static void
let_go(const struct closing *c)
{
	if (c->base != NULL)
		munmap(c->base, c->size);
	if (c->fd >= 0)
		close(c->fd); /* Linux: the descriptor is gone even on EINTR */
}

/* One of t's lanes reached its mark: the last calls done and frees t.
 * With cl->lock held. */
static void
then_reached(struct closer *cl, struct then *t)
{
	struct then **pp;

	if (--t->left > 0)
		return;
	for (pp = &cl->thens; *pp != t; pp = &(*pp)->next)
		;
	*pp = t->next;
	if (t->done != NULL)
		t->done(t->arg);
	free(t);
}

/* Waits up to LANE_IDLE_MS for more in l's empty queue (not once the
 * closer stops); whether more came. With cl->lock held. */
static int
more_within_idle(struct lane *l)
{
	struct closer *cl = l->cl;
	struct timespec until = deadline_in_ms(CLOCK_MONOTONIC, LANE_IDLE_MS);

	l->idle = 1;
	while (l->head == l->count && !cl->stopping &&
		pthread_cond_timedwait(&l->more, &cl->lock, &until) != ETIMEDOUT)
		;
	l->idle = 0;
	return l->head < l->count;
}

/* Lets go of the lane's mappings and descriptors in order until none is
 * left for LANE_IDLE_MS, then removes the lane and exits. */
static void *
lane_run(void *arg)
{
	struct lane *l = arg;
	struct closer *cl = l->cl;
	struct lane **pp;

	pthread_mutex_lock(&cl->lock);
	do {
		while (l->head < l->count) {
			struct closing c = l->q[l->head++];

			if (c.mark != NULL) {
				then_reached(cl, c.mark);
				continue;
			}
			l->close_started_ms = now_ms();
			pthread_mutex_unlock(&cl->lock);
			let_go(&c);
			pthread_mutex_lock(&cl->lock);
			l->pending--;
		}
	} while (more_within_idle(l));
	for (pp = &cl->lanes; *pp != l; pp = &(*pp)->next)
		;
	*pp = l->next;
	cl->threads--;
	pthread_cond_broadcast(&cl->drained);
	pthread_mutex_unlock(&cl->lock);
	pthread_cond_destroy(&l->more);
	free(l->q);
	free(l);
	return NULL;
}

/* Appends c to l's queue; 0 or -ENOMEM. With cl->lock held. */
static int
lane_push(struct lane *l, const struct closing *c)
{
	if (l->head > 0 && l->head == l->count)
		l->head = l->count = 0;
	if (l->count == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 16;
		struct closing *q = realloc(l->q, cap * sizeof(*q));

		if (q == NULL)
			return -ENOMEM;
		l->q = q;
		l->cap = cap;
	}
	if (l->pending == 0)
		l->close_started_ms = now_ms(); /* an idle lane's: its next */
	l->q[l->count++] = *c;
	l->pending += c->mark == NULL;
	if (l->idle)
		pthread_cond_signal(&l->more);
	return 0;
}

/* A new lane for owner (own: the daemon's own) holding c, with its thread
 * started; 0 or -errno (nothing changed). With cl->lock held. */
static int
lane_new(struct closer *cl, uid_t owner, int own, const struct closing *c)
{
	struct lane *l = calloc(1, sizeof(*l));
	pthread_condattr_t ca;
	pthread_attr_t attr;
	pthread_t thread;
	int err;

	if (l == NULL)
		return -ENOMEM;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&l->more, &ca);
	pthread_condattr_destroy(&ca);
	l->cl = cl;
	l->owner = owner;
	l->own = own;
	l->close_started_ms = now_ms();
	if (lane_push(l, c) < 0) {
		pthread_cond_destroy(&l->more);
		free(l);
		return -ENOMEM;
	}
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, LANE_STACK_SIZE);
	l->next = cl->lanes;
	cl->lanes = l;
	cl->threads++;
	/* The thread takes the lock before it looks at the lane: the list is
	 * in order before it runs. */
	err = pthread_create(&thread, &attr, lane_run, l);
	pthread_attr_destroy(&attr);
	if (err != 0) {
		cl->lanes = l->next;
		cl->threads--;
		pthread_cond_destroy(&l->more);
		free(l->q);
		free(l);
		return -err;
	}
	return 0;
}

/* Queues c in owner's lane (closer_close) or the daemon's own lane of
 * owner (own: closer_unmap_close). */
static void
lane_queue(struct closer *cl, uid_t owner, int own, const struct closing *c)
{
	struct lane *l;
	int err;

	if (c->base == NULL && c->fd < 0)
		return;
	if (cl == NULL) {
		let_go(c);
		return;
	}
	pthread_mutex_lock(&cl->lock);
	l = lane_find(cl, owner, own);
	err = l != NULL ? lane_push(l, c) : lane_new(cl, owner, own, c);
	if (err < 0)
		cl->inline_closes++;
	pthread_mutex_unlock(&cl->lock);
	if (err < 0) {
		log_warnx("closing %s of %s here: no %s for a closing thread",
			c->fd >= 0 ? "a descriptor" : "a mapping", lane_name(owner, own),
			err == -ENOMEM ? "memory" : "thread");
		let_go(c);
	}
}

void
closer_close(struct closer *cl, uid_t owner, int fd)
{
	lane_queue(cl, owner, 0, &(struct closing){ NULL, 0, fd, NULL });
}

void
closer_unmap_close(struct closer *cl, uid_t owner, void *base, size_t size, int fd)
{
	lane_queue(cl, owner, 1, &(struct closing){ base, size, fd, NULL });
}

void
closer_then(struct closer *cl, const uid_t *owners, size_t n, void (*done)(void *), void *arg)
{
	struct then *t = cl != NULL ? calloc(1, sizeof(*t)) : NULL;
	size_t left;

	if (t == NULL) {
		done(arg);
		return;
	}
	t->done = done;
	t->arg = arg;
	pthread_mutex_lock(&cl->lock);
	/* A lane that is not there, or has nothing pending (its thread
	 * waits for more), has let go of everything; the mark goes behind
	 * what its thread has yet to take. */
	for (size_t i = 0; i < n; i++) {
		struct lane *l = lane_find(cl, owners[i], 1);

		if (l != NULL && l->pending > 0 &&
			lane_push(l, &(struct closing){ NULL, 0, -1, t }) == 0)
			t->left++;
	}
	if ((left = t->left) > 0) {
		t->next = cl->thens;
		cl->thens = t;
	}
	pthread_mutex_unlock(&cl->lock); /* t is the lanes' now, if left */
	if (left == 0) {
		free(t);
		done(arg);
	}
}

void
closer_forget(struct closer *cl, void *arg)
{
	if (cl == NULL)
		return;
	pthread_mutex_lock(&cl->lock);
	for (struct then *t = cl->thens; t != NULL; t = t->next)
		if (t->arg == arg)
			t->done = NULL;
	pthread_mutex_unlock(&cl->lock);
}

unsigned
closer_pending(struct closer *cl, uid_t owner)
{
	return closer_stuck(cl, owner, 0);
}

unsigned
closer_stuck(struct closer *cl, uid_t owner, unsigned min_ms)
{
	struct lane *l;
	unsigned n = 0;

	if (cl == NULL)
		return 0;
	pthread_mutex_lock(&cl->lock);
	l = lane_find(cl, owner, 0);
	/* A lane with any pending has a close running or about to (its
	 * thread starting or waking: close_started_ms is when it was queued).
	 * The daemon's own closes (a large artifact freed) are in a lane of
	 * their own. */
	if (l != NULL && (min_ms == 0 || now_ms() - l->close_started_ms >= min_ms))
		n = l->pending;
	pthread_mutex_unlock(&cl->lock);
	return n;
}

unsigned
closer_total(struct closer *cl)
{
	unsigned n = 0;

	if (cl == NULL)
		return 0;
	pthread_mutex_lock(&cl->lock);
	for (struct lane *l = cl->lanes; l != NULL; l = l->next)
		n += l->pending;
	pthread_mutex_unlock(&cl->lock);
	return n;
}

unsigned long
closer_closed_inline(struct closer *cl)
{
	unsigned long n;

	if (cl == NULL)
		return 0;
	pthread_mutex_lock(&cl->lock);
	n = cl->inline_closes;
	pthread_mutex_unlock(&cl->lock);
	return n;
}

void
closer_stop(struct closer *cl, unsigned wait_ms)
{
	struct timespec deadline;

	if (cl == NULL)
		return;
	deadline = deadline_in_ms(CLOCK_REALTIME, wait_ms);
	pthread_mutex_lock(&cl->lock);
	cl->stopping = 1;
	for (struct lane *l = cl->lanes; l != NULL; l = l->next)
		pthread_cond_signal(&l->more);
	while (cl->threads > 0 &&
		pthread_cond_timedwait(&cl->drained, &cl->lock, &deadline) != ETIMEDOUT)
		;
	if (cl->threads > 0) {
		for (struct lane *l = cl->lanes; l != NULL; l = l->next)
			if (l->pending > 0) /* else its thread is ending */
				log_warnx("%s: %u descriptor%s still closing after %u ms (a "
					  "FUSE or NFS server that does not answer, or a "
					  "lingering socket); exiting without waiting",
					lane_name(l->owner, l->own), l->pending,
					l->pending == 1 ? "" : "s", wait_ms);
		pthread_mutex_unlock(&cl->lock);
		return; /* the threads still use it */
	}
	pthread_mutex_unlock(&cl->lock);
	pthread_cond_destroy(&cl->drained);
	pthread_mutex_destroy(&cl->lock);
	free(cl);
}
