/*
 * wire.h: the wcache client protocol (proto/PROTOCOL.md).
 *
 * Messages travel on a SOCK_SEQPACKET Unix socket, one message per packet,
 * so a message and the descriptors passed with it arrive together or not at
 * all. Every message starts with a 16-byte header; the payload follows and
 * its length must equal the header's length field exactly. All integers are
 * little-endian; there are no pointers on the wire.
 *
 * Encoders write into a caller's buffer and return the message length.
 * Decoders check the message against a minimum and a maximum size and the
 * exact layout of its type before reading anything, and never allocate.
 */
#ifndef WC_WIRE_H
#define WC_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define WIRE_MAGIC 0x31504357u /* "WCP1" as little-endian u32 */
#define WIRE_VERSION 1u
#define WIRE_HEADER_SIZE 16u
#define WIRE_MAX_MESSAGE 4096u /* header included */
#define WIRE_MAX_NAME 1024u    /* model name or path in ATTACH */
#define WIRE_MAX_FDS 252u      /* index + up to 250 files + status page; below SCM_MAX_FD */
#define WIRE_MAX_FILES (WIRE_MAX_FDS - 2u)
#define WIRE_MAX_KEY 64u       /* derived artifact key in DERIVE: [A-Za-z0-9._+-] */
#define WIRE_MAX_REASON 1024u  /* reason text in ABANDON */

enum wire_type {
	WIRE_ATTACH = 1,      /* client: payload = model name, 1..WIRE_MAX_NAME bytes, no NUL */
	WIRE_RELEASE = 2,     /* client: payload = u64 handle */
	WIRE_HOLD = 3,        /* client, after a reconnect: u64 generation it still maps,
				 then the model name, 1..WIRE_MAX_NAME bytes */
	WIRE_DERIVE = 4,      /* client: u32 wait_ms, u32 key_len, key (1..WIRE_MAX_KEY bytes
				 of [A-Za-z0-9._+-]), then the model name, 1..WIRE_MAX_NAME */
	WIRE_PUBLISH = 5,     /* client, a builder: u64 build token; one fd: the artifact memfd */
	WIRE_ABANDON = 6,     /* client, a builder: u64 build token, then a reason,
				 0..WIRE_MAX_REASON bytes, no NUL */
	WIRE_ORIGINS = 7,     /* client, only on a connection of its own (a wcached
				 before it closes the connection on it): u64 first,
				 then the model name as in ATTACH */
	WIRE_ATTACH_OK = 129, /* daemon: struct wire_attach_ok; fds: index memfd, then files */
	WIRE_RELEASE_OK = 130,/* daemon: empty payload */
	WIRE_HOLD_OK = 132,   /* daemon: u64 handle of the attach HOLD made */
	WIRE_BUILD = 133,     /* daemon: struct wire_attach_ok of the source, then u64
				 build token; fds as ATTACH_OK */
	WIRE_CHANGED = 131,   /* daemon, unsolicited (seq 0): u64 generation (0: no longer
				 served), then the model name, 1..WIRE_MAX_NAME bytes */
	WIRE_ORIGINS_OK = 134,/* daemon: u64 generation, u32 file_count (0: it serves
				 no staged copies), u32 first, then the origins of
				 files first.. (at most WIRE_ORIGINS_PER_REPLY),
				 WIRE_ORIGIN_SIZE bytes each */
	WIRE_ERROR = 255,     /* daemon: positive errno code 1..4095 (i32), then UTF-8
				 text (no NUL) */
};

struct wire_header {
	uint32_t magic;
	uint16_t version;
	uint16_t type;
	uint32_t length; /* payload bytes after the header */
	uint32_t seq;    /* chosen by the client, echoed in the reply */
};

/* Payload of WIRE_ATTACH_OK: 40 bytes. */
struct wire_attach_ok {
	uint64_t generation;
	uint64_t handle;      /* names this attach in RELEASE */
	uint64_t index_size;  /* size of the index memfd */
	uint32_t file_count;  /* descriptors after the index */
	uint32_t flags;       /* WIRE_ATTACH_STATUS or 0; other bits are malformed */
	uint64_t status_slot; /* with WIRE_ATTACH_STATUS: the model's u64 in the page */
};

/* ATTACH_OK flag: one more descriptor follows the files, the daemon's status
 * page (a read-only memfd of u64 slots), and status_slot is the model's slot,
 * which holds its current generation. */
#define WIRE_ATTACH_STATUS 1u

/* An ORIGINS_OK's fixed part, and each origin: what the file a staged copy
 * was made from was when wcached copied it (its fstat: st_dev, st_ino,
 * st_size, st_mtim and st_ctim in ns), as u64, u64, u64, i64, i64. */
#define WIRE_ORIGINS_FIXED 16u
#define WIRE_ORIGIN_SIZE 40u
#define WIRE_ORIGINS_PER_REPLY 100u
struct wire_origin {
	uint64_t dev;
	uint64_t ino;
	uint64_t size;
	int64_t mtime_ns;
	int64_t ctime_ns;
};

/* How many origins an ORIGINS_OK carries from first of file_count: as many
 * as are left, at most WIRE_ORIGINS_PER_REPLY (0 when first is past them). */
size_t wire_origins_in_reply(uint32_t file_count, uint32_t first);

/* The fields of an ORIGINS_OK; origins has n entries, of files first.. */
struct wire_origins_ok {
	uint64_t generation;
	uint32_t file_count;
	uint32_t first;
	size_t n;
	struct wire_origin origins[WIRE_ORIGINS_PER_REPLY];
};

/* The fields of a DERIVE. key and name point into the message, not
 * NUL-terminated. */
struct wire_derive {
	uint32_t wait_ms;      /* how long to wait for another worker's build; 0: not at all */
	const char *key;
	size_t key_len;
	const char *name;
	size_t name_len;
};

/* 1 when key[0..len) is a valid derived artifact key: 1..WIRE_MAX_KEY
 * bytes, each a letter, a digit or one of "._+-". */
int wire_key_valid(const char *key, size_t len);

/* A decoded message: the header plus a view of its payload in the buffer. */
struct wire_message {
	struct wire_header h;
	const uint8_t *payload;
};

/* Checks buf[0..len) as one whole message (magic, version, known type,
 * length == len - 16, length within the type's bounds, ATTACH_OK flags known
 * and file_count <= WIRE_MAX_FILES, ERROR code 1..4095). Returns 0, -EMSGSIZE for a
 * size outside 16..WIRE_MAX_MESSAGE, -EPROTO for another version, -EBADMSG
 * for anything else. */
int wire_decode(const uint8_t *buf, size_t len, struct wire_message *out);

/* Why wire_decode_why() refused a message. */
struct wire_refusal {
	int has_header;          /* the magic was right: h is the header as sent (its
				    seq is what an ERROR about it echoes) */
	struct wire_header h;
	const char *reason;      /* which check failed: static text, e.g. "protocol
				    version mismatch", "model name holds a NUL byte" */
};

/* wire_decode(), and on failure, when why is not NULL, which check refused
 * the message and the header the peer sent (as far as it could be read). */
int wire_decode_why(const uint8_t *buf, size_t len, struct wire_message *out,
	struct wire_refusal *why);

/* The name of a message type ("ATTACH"), NULL for an unknown type. */
const char *wire_type_name(uint16_t type);

/* Decoders of payloads; each requires its exact size and returns -EBADMSG
 * when m is not of that type. */
int wire_get_attach(const struct wire_message *m, const char **name, size_t *name_len);
int wire_get_release(const struct wire_message *m, uint64_t *handle);
int wire_get_attach_ok(const struct wire_message *m, struct wire_attach_ok *out);
int wire_get_error(const struct wire_message *m, int32_t *code, const char **text,
	size_t *text_len);
int wire_get_changed(const struct wire_message *m, uint64_t *generation, const char **name,
	size_t *name_len);
int wire_get_hold(const struct wire_message *m, uint64_t *generation, const char **name,
	size_t *name_len);
int wire_get_hold_ok(const struct wire_message *m, uint64_t *handle);
int wire_get_derive(const struct wire_message *m, struct wire_derive *out);
int wire_get_publish(const struct wire_message *m, uint64_t *token);
int wire_get_abandon(const struct wire_message *m, uint64_t *token, const char **reason,
	size_t *reason_len);
int wire_get_build(const struct wire_message *m, struct wire_attach_ok *source, uint64_t *token);
int wire_get_origins(const struct wire_message *m, uint32_t *first, const char **name,
	size_t *name_len);
int wire_get_origins_ok(const struct wire_message *m, struct wire_origins_ok *out);

/* Encoders: write the whole message to buf (cap bytes) and return its length,
 * -EMSGSIZE when cap is too small, or -EINVAL for arguments that cannot form
 * a valid message. */
ssize_t wire_put_attach(uint8_t *buf, size_t cap, uint32_t seq, const char *name, size_t len);
ssize_t wire_put_release(uint8_t *buf, size_t cap, uint32_t seq, uint64_t handle);
ssize_t wire_put_attach_ok(uint8_t *buf, size_t cap, uint32_t seq,
	const struct wire_attach_ok *ok);
ssize_t wire_put_release_ok(uint8_t *buf, size_t cap, uint32_t seq);
ssize_t wire_put_error(uint8_t *buf, size_t cap, uint32_t seq, int32_t code, const char *text);
ssize_t wire_put_changed(uint8_t *buf, size_t cap, uint64_t generation, const char *name,
	size_t len);
ssize_t wire_put_hold(uint8_t *buf, size_t cap, uint32_t seq, uint64_t generation,
	const char *name, size_t len);
ssize_t wire_put_hold_ok(uint8_t *buf, size_t cap, uint32_t seq, uint64_t handle);
ssize_t wire_put_derive(uint8_t *buf, size_t cap, uint32_t seq, const struct wire_derive *d);
ssize_t wire_put_publish(uint8_t *buf, size_t cap, uint32_t seq, uint64_t token);
/* reason is NUL-terminated; a longer one is cut to WIRE_MAX_REASON bytes at
 * a UTF-8 character boundary. */
ssize_t wire_put_abandon(uint8_t *buf, size_t cap, uint32_t seq, uint64_t token,
	const char *reason);
ssize_t wire_put_build(uint8_t *buf, size_t cap, uint32_t seq,
	const struct wire_attach_ok *source, uint64_t token);
ssize_t wire_put_origins(uint8_t *buf, size_t cap, uint32_t seq, uint32_t first,
	const char *name, size_t len);
/* ok->n origins (at most WIRE_ORIGINS_PER_REPLY, as many as are left from
 * ok->first of ok->file_count; none when file_count is 0). */
ssize_t wire_put_origins_ok(uint8_t *buf, size_t cap, uint32_t seq,
	const struct wire_origins_ok *ok);

#endif
