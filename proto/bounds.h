/*
 * bounds.h: the size limits the daemon and its clients must agree on. The
 * daemon never makes what a client would refuse: an index it builds passes
 * the client's index reader, and wcachectl reads the daemon's config file as
 * the daemon does. (The control socket's line limit is with its protocol, in
 * control_proto.h.)
 */
#ifndef WC_BOUNDS_H
#define WC_BOUNDS_H

#include "proto/wire.h"

/* A model's compiled index (FORMAT.md). */
#define INDEX_MAX_FILES 250         /* fits one SCM_RIGHTS message with the index */
#define INDEX_MAX_NDIM 64           /* dimensions of one tensor */
#define INDEX_MAX_NAME 4096         /* bytes of a tensor or file name */
#define INDEX_MAX_SIZE (1ull << 32) /* an index a client agrees to map */

_Static_assert(INDEX_MAX_FILES == WIRE_MAX_FILES,
	"an attach passes the index, every file and the status page");

/* A line of wcached.conf, its '\n' included; the reader refuses a longer one. */
#define CONFIG_LINE_MAX 65536

#endif
