/*
 * timers.c: what wcached does on the clock rather than on an event: the
 * STATUS= lines for the service manager while models warm, notifications
 * the manager could not take yet, warm models that memory pressure shrank,
 * remote work that has not returned, and the deferred full checks of a
 * warm restart's generations. main.c starts the timers; stop.c closes
 * them.
 */
#include <inttypes.h>
#include <stdint.h>
#include <uv.h>

#include "base/error.h"
#include "daemon.h"
#include "log.h"
#include "notify.h"
#include "registry.h"
#include "restore.h"
#include "server.h"
#include "workq.h"

/* Sends a STATUS= line with warming progress; keeps the timer running only
 * while something warms. */
void
timers_send_status(struct daemon *d)
{
	uint64_t done, total;
	unsigned warming, models;

	registry_progress(&d->reg, &done, &total, &warming, &models);
	if (warming > 0) {
		notify_send("STATUS=warming %u of %u models: %.0f%% (%" PRIu64 " of %" PRIu64
			    " MiB)", warming, models,
			total ? 100.0 * (double)done / (double)total : 100.0,
			done >> 20, total >> 20);
		if (!uv_is_active((uv_handle_t *)&d->status_timer))
			uv_timer_again(&d->status_timer);
	} else {
		notify_send("STATUS=serving %u models, %" PRIu64 " MiB warm, %u clients", models,
			total >> 20, d->server ? server_clients(d->server) : 0);
		uv_timer_stop(&d->status_timer);
	}
}

void
timers_on_status(uv_timer_t *t)
{
	timers_send_status(t->data);
}

void
timers_on_residency(uv_timer_t *t)
{
	struct daemon *d = t->data;

	registry_check_residency(&d->reg);
}

void
timers_on_stall(uv_timer_t *t)
{
	struct daemon *d = t->data;

	workq_check_stalls(&d->reg.workq);
}

void
timers_on_checks(uv_timer_t *t)
{
	struct daemon *d = t->data;

	restore_checks(&d->reg);
}

/* Notifications the manager had no room for wait in notify.c; send them
 * when it reads again (never blocking the loop). */
void
timers_on_notify(uv_timer_t *t)
{
	struct daemon *d = t->data;

	if (notify_flush() < 0)
		log_warnx("%s", error_get());
	/* What the manager's full queue refused goes again (restore.h). */
	restore_sync(&d->reg);
	/* Generations held before a restart that nobody claimed close. */
	restore_expire_holds(&d->reg);
}
