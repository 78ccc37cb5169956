/*
 * control_proto.h: what wcached's control socket and its clients
 * (wcachectl, the metrics HTTP responder) agree on. The protocol itself is
 * described in proto/PROTOCOL.md, section "Control protocol", and in
 * daemon/control.h.
 *
 * Every reply object carries "protocol": CONTROL_PROTOCOL_VERSION. The
 * number changes when a member changes meaning or disappears; new members
 * may appear in any version, and readers ignore members they do not know.
 */
#ifndef WC_CONTROL_PROTO_H
#define WC_CONTROL_PROTO_H

#define CONTROL_PROTOCOL_VERSION 1
#define CONTROL_DEFAULT_PATH "/run/wcached/control.sock"

#endif /* WC_CONTROL_PROTO_H */
