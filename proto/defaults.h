/*
 * defaults.h: where wcached listens unless configured otherwise, and the
 * environment variables a client reads instead. wcached's config defaults,
 * libwcache's wc_connect(NULL), wcachectl and (through wc_default_socket())
 * the Python package all take these, so a client finds the daemon without
 * configuration.
 */
#ifndef WC_DEFAULTS_H
#define WC_DEFAULTS_H

/* The directory of both sockets: what systemd/wcached.service's
 * RuntimeDirectory=wcached makes at start; wcached itself makes no socket
 * directory. */
#define DEFAULT_RUNTIME_DIR "/run/wcached"
#define DEFAULT_SOCKET_PATH DEFAULT_RUNTIME_DIR "/wcached.sock"  /* client socket (PROTOCOL.md) */
#define DEFAULT_CONTROL_PATH DEFAULT_RUNTIME_DIR "/control.sock" /* control socket (wcachectl) */

#define SOCKET_ENV "WCACHE_SOCKET"   /* a client's socket instead of the default */
#define CONTROL_ENV "WCACHE_CONTROL" /* wcachectl's control socket instead of the default */

#endif
