/*
 * control_proto.h: what wcached's control socket and its clients
 * (wcachectl, the metrics HTTP responder) agree on, besides where it is
 * (defaults.h). The protocol itself is described in proto/PROTOCOL.md,
 * section "Control protocol", and in daemon/control.h.
 *
 * Every reply object carries "protocol": CONTROL_PROTOCOL_VERSION. The
 * number changes when a member changes meaning or disappears; new members
 * may appear in any version, and readers ignore members they do not know.
 */
#ifndef WC_CONTROL_PROTO_H
#define WC_CONTROL_PROTO_H

#define CONTROL_PROTOCOL_VERSION 1

/* A request line is at most this many bytes, without its '\n'; wcached
 * answers a longer one with an error and closes the connection, so
 * wcachectl refuses to send one. (The socket's default path is
 * DEFAULT_CONTROL_PATH in defaults.h.) */
#define CONTROL_LINE_MAX 4096

#endif /* WC_CONTROL_PROTO_H */
