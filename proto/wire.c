/*
 * wire.c: encoding and decoding of wcache client protocol messages
 * (proto/PROTOCOL.md).
 *
 * Every byte a peer sends is hostile until checked, so wire_decode() checks a
 * whole message against its minimum and maximum size, the magic, the version,
 * the type and the exact payload layout of that type before anything reads a
 * field. Integers are read and written with explicit little-endian shifts,
 * never by casting a buffer pointer to a struct, so the code is independent
 * of the host's byte order and of the buffer's alignment.
 *
 * This file only returns codes; it never prints and never calls error_set()
 * (proto/ depends on nothing else in the tree). The callers turn the codes
 * into messages that name the peer and the model.
 */
#include "proto/wire.h"
#include "proto/le.h"

#include <errno.h>
#include <string.h>

/* Payload sizes fixed by the protocol. */
#define WIRE_RELEASE_SIZE 8u
#define WIRE_ATTACH_OK_SIZE 40u
#define WIRE_ERROR_MIN 4u /* the i32 code */
#define WIRE_DERIVE_FIXED 8u /* u32 wait_ms, u32 key_len */
#define WIRE_BUILD_SIZE (WIRE_ATTACH_OK_SIZE + 8u)

/* Error codes carried by WIRE_ERROR are positive Linux errno values;
 * 4095 is the kernel's MAX_ERRNO. */
#define WIRE_ERROR_CODE_MAX 4095

/* The largest payload that fits in one message. */
#define WIRE_MAX_PAYLOAD (WIRE_MAX_MESSAGE - WIRE_HEADER_SIZE)

_Static_assert(WIRE_HEADER_SIZE == 16, "the wire header is 16 bytes");
_Static_assert(WIRE_HEADER_SIZE + WIRE_MAX_NAME <= WIRE_MAX_MESSAGE,
        "an ATTACH with the longest name fits in one message");
_Static_assert(WIRE_HEADER_SIZE + WIRE_ATTACH_OK_SIZE <= WIRE_MAX_MESSAGE,
        "an ATTACH_OK fits in one message");
_Static_assert(WIRE_HEADER_SIZE + WIRE_DERIVE_FIXED + WIRE_MAX_KEY + WIRE_MAX_NAME <=
	WIRE_MAX_MESSAGE, "a DERIVE with the longest key and name fits in one message");
_Static_assert(WIRE_HEADER_SIZE + 8 + WIRE_MAX_REASON <= WIRE_MAX_MESSAGE,
	"an ABANDON with the longest reason fits in one message");
_Static_assert(WIRE_HEADER_SIZE + WIRE_ORIGINS_FIXED + WIRE_ORIGINS_PER_REPLY * WIRE_ORIGIN_SIZE <=
	WIRE_MAX_MESSAGE, "an ORIGINS_OK with the most origins fits in one message");
/* The refusal texts below are static (an ERROR's reason points at them), so
 * they spell the limits out: these keep the texts and the limits in step. */
_Static_assert(WIRE_MAX_MESSAGE == 4096 && WIRE_MAX_NAME == 1024 && WIRE_MAX_REASON == 1024 &&
	WIRE_MAX_KEY == 64 && WIRE_MAX_FILES == 250, "the refusal texts spell these limits");
_Static_assert(WIRE_RELEASE_SIZE == 8 && WIRE_ATTACH_OK_SIZE == 40 && WIRE_BUILD_SIZE == 48,
	"the refusal texts spell these payload sizes");

int
wire_key_valid(const char *key, size_t len)
{
	if (key == NULL || len < 1 || len > WIRE_MAX_KEY)
		return 0;
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)key[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
			c == '.' || c == '_' || c == '+' || c == '-'))
			return 0;
	}
	return 1;
}

/* The ATTACH_OK fields at p (40 bytes) are well formed: flags known, and
 * file_count fits in one SCM_RIGHTS message with the index and status page. */
static int
attach_ok_valid(const uint8_t *p)
{
	return get_le32(p + 24) <= WIRE_MAX_FILES && (get_le32(p + 28) & ~WIRE_ATTACH_STATUS) == 0;
}

size_t
wire_origins_in_reply(uint32_t file_count, uint32_t first)
{
	uint32_t left = first < file_count ? file_count - first : 0;

	return left < WIRE_ORIGINS_PER_REPLY ? left : WIRE_ORIGINS_PER_REPLY;
}

/* The ORIGINS_OK payload of n bytes at p is well formed: file_count at most
 * WIRE_MAX_FILES, first below it (0 of 0), and the origins that must follow. */
static const char *
origins_ok_invalid(const uint8_t *p, uint32_t n)
{
	uint32_t count, first;

	if (n < WIRE_ORIGINS_FIXED)
		return "shorter than its 16 bytes";
	count = get_le32(p + 8);
	first = get_le32(p + 12);
	if (count > WIRE_MAX_FILES)
		return "more than 250 files";
	if (count == 0 ? first != 0 : first >= count)
		return "first is not a file";
	if (n != WIRE_ORIGINS_FIXED + wire_origins_in_reply(count, first) * WIRE_ORIGIN_SIZE)
		return "not as many origins as its count leaves";
	return NULL;
}

/* The checks of a name of n bytes at p (ATTACH, HOLD, CHANGED, DERIVE):
 * NULL when it is well formed, else which one failed. */
static const char *
name_invalid(const uint8_t *p, uint32_t n)
{
	if (n < 1)
		return "no model name";
	if (n > WIRE_MAX_NAME)
		return "model name longer than 1024 bytes";
	if (memchr(p, 0, n) != NULL)
		return "model name holds a NUL byte";
	return NULL;
}

/*
 * Checks that a payload of n bytes has the layout its type requires. The
 * message's total size is already known to be within WIRE_MAX_MESSAGE.
 * Returns NULL, or for an unknown type or a payload of the wrong size or
 * content which check failed (static text, for the peer's ERROR).
 */
static const char *
check_payload(uint16_t type, const uint8_t *p, uint32_t n)
{
	int32_t code;
	uint32_t key_len;

	switch (type) {
	case WIRE_ATTACH:
		return name_invalid(p, n);
	case WIRE_RELEASE:
	case WIRE_HOLD_OK:
	case WIRE_PUBLISH:
		return n == WIRE_RELEASE_SIZE ? NULL : "payload is not 8 bytes";
	case WIRE_ATTACH_OK:
		if (n != WIRE_ATTACH_OK_SIZE)
			return "payload is not 40 bytes";
		return attach_ok_valid(p) ? NULL : "unknown flags, or more than 250 files";
	case WIRE_BUILD:
		if (n != WIRE_BUILD_SIZE)
			return "payload is not 48 bytes";
		return attach_ok_valid(p) ? NULL : "unknown flags, or more than 250 files";
	case WIRE_DERIVE:
		if (n < WIRE_DERIVE_FIXED + 2)
			return "shorter than wait_ms, key_len, a key and a name";
		key_len = get_le32(p + 4);
		/* key_len <= WIRE_MAX_KEY first: the sum below cannot wrap. */
		if (key_len < 1 || key_len > WIRE_MAX_KEY)
			return "key_len is not 1..64";
		if (n < WIRE_DERIVE_FIXED + key_len + 1)
			return "no model name after the key";
		if (!wire_key_valid((const char *)p + WIRE_DERIVE_FIXED, key_len))
			return "the key holds a byte other than letters, digits and ._+-";
		return name_invalid(p + WIRE_DERIVE_FIXED + key_len,
			n - WIRE_DERIVE_FIXED - key_len);
	case WIRE_ABANDON:
		if (n < 8)
			return "shorter than its 8-byte token";
		if (n > 8 + WIRE_MAX_REASON)
			return "reason longer than 1024 bytes";
		return memchr(p + 8, 0, n - 8) != NULL ? "reason holds a NUL byte" : NULL;
	case WIRE_CHANGED:
	case WIRE_HOLD:
		if (n < 8)
			return "shorter than its 8-byte generation";
		return name_invalid(p + 8, n - 8);
	case WIRE_ORIGINS:
		if (n < 8)
			return "shorter than its 8-byte first file";
		if (get_le64(p) >= WIRE_MAX_FILES)
			return "first file past the 250 a model has";
		return name_invalid(p + 8, n - 8);
	case WIRE_RELEASE_OK:
		return n == 0 ? NULL : "payload is not empty";
	case WIRE_ORIGINS_OK:
		return origins_ok_invalid(p, n);
	case WIRE_ERROR:
		if (n < WIRE_ERROR_MIN)
			return "shorter than its 4-byte code";
		if (memchr(p + 4, 0, n - 4) != NULL)
			return "text holds a NUL byte";
		/* A code of 0 or below would read as success to a client that
		 * returns -code; refuse it here, once, for every receiver. */
		code = (int32_t)get_le32(p);
		if (code < 1 || code > WIRE_ERROR_CODE_MAX)
			return "code is not 1..4095";
		return NULL;
	default:
		return "unknown message type";
	}
}

const char *
wire_type_name(uint16_t type)
{
	switch (type) {
	case WIRE_ATTACH: return "ATTACH";
	case WIRE_RELEASE: return "RELEASE";
	case WIRE_HOLD: return "HOLD";
	case WIRE_DERIVE: return "DERIVE";
	case WIRE_PUBLISH: return "PUBLISH";
	case WIRE_ABANDON: return "ABANDON";
	case WIRE_ORIGINS: return "ORIGINS";
	case WIRE_ORIGINS_OK: return "ORIGINS_OK";
	case WIRE_ATTACH_OK: return "ATTACH_OK";
	case WIRE_RELEASE_OK: return "RELEASE_OK";
	case WIRE_HOLD_OK: return "HOLD_OK";
	case WIRE_BUILD: return "BUILD";
	case WIRE_CHANGED: return "CHANGED";
	case WIRE_ERROR: return "ERROR";
	default: return NULL;
	}
}

/* Records in why (when not NULL) which check refused the message; returns
 * code. */
static int
refused(struct wire_refusal *why, int code, const char *reason)
{
	if (why != NULL)
		why->reason = reason;
	return code;
}

/*
 * Checks buf[0..len) as one whole message and, if it is valid, fills *out
 * with the decoded header and a pointer to the payload inside buf (valid as
 * long as buf is). The checks run in this order, so the first failure names
 * the most basic problem:
 *   len < 16 or len > WIRE_MAX_MESSAGE        -EMSGSIZE
 *   magic is not WIRE_MAGIC                   -EBADMSG
 *   version is not WIRE_VERSION               -EPROTO
 *   unknown type                              -EBADMSG
 *   length field != len - 16                  -EBADMSG
 *   payload does not fit the type's layout    -EBADMSG
 * *out is untouched on failure; why (optional) says which check failed and,
 * from the version check on, holds the header as the peer sent it.
 */
int
wire_decode_why(const uint8_t *buf, size_t len, struct wire_message *out,
	struct wire_refusal *why)
{
	struct wire_header h;
	const char *reason;

	if (why != NULL)
		*why = (struct wire_refusal){ .reason = NULL };
	if (buf == NULL || out == NULL)
		return refused(why, -EINVAL, "no message");
	if (len < WIRE_HEADER_SIZE)
		return refused(why, -EMSGSIZE, "shorter than the 16-byte header");
	if (len > WIRE_MAX_MESSAGE)
		return refused(why, -EMSGSIZE, "longer than 4096 bytes");
	h.magic = get_le32(buf);
	h.version = get_le16(buf + 4);
	h.type = get_le16(buf + 6);
	h.length = get_le32(buf + 8);
	h.seq = get_le32(buf + 12);
	if (h.magic != WIRE_MAGIC)
		return refused(why, -EBADMSG, "not a wcache message (wrong magic)");
	if (why != NULL) {
		why->has_header = 1;
		why->h = h;
	}
	if (h.version != WIRE_VERSION)
		return refused(why, -EPROTO, "protocol version mismatch");
	if (wire_type_name(h.type) == NULL)
		return refused(why, -EBADMSG, "unknown message type");
	if (h.length != len - WIRE_HEADER_SIZE)
		return refused(why, -EBADMSG, "the length field is not the size of the payload");
	if (h.type == WIRE_CHANGED && h.seq != 0) /* announcements answer no request */
		return refused(why, -EBADMSG, "CHANGED with a seq other than 0");
	if ((reason = check_payload(h.type, buf + WIRE_HEADER_SIZE, h.length)) != NULL)
		return refused(why, -EBADMSG, reason);
	out->h = h;
	out->payload = buf + WIRE_HEADER_SIZE;
	return 0;
}

int
wire_decode(const uint8_t *buf, size_t len, struct wire_message *out)
{
	return wire_decode_why(buf, len, out, NULL);
}

/*
 * The payload getters below take a message wire_decode() accepted. Each one
 * checks the message's type and checks the payload layout again (a caller may
 * have built the wire_message by hand), and returns -EBADMSG when the message
 * is not of the type asked for or does not have its layout. Out-parameters
 * are untouched on failure.
 */
static int
check_message(const struct wire_message *m, uint16_t type)
{
	if (m == NULL || m->payload == NULL)
		return -EINVAL;
	if (m->h.type != type || m->h.length > WIRE_MAX_PAYLOAD)
		return -EBADMSG;
	return check_payload(type, m->payload, m->h.length) == NULL ? 0 : -EBADMSG;
}

/* The model name of an ATTACH: name_len bytes at *name, not NUL-terminated,
 * pointing into the message's buffer. */
int
wire_get_attach(const struct wire_message *m, const char **name, size_t *name_len)
{
	int rc = check_message(m, WIRE_ATTACH);

	if (rc < 0)
		return rc;
	if (name == NULL || name_len == NULL)
		return -EINVAL;
	*name = (const char *)m->payload;
	*name_len = m->h.length;
	return 0;
}

/* The u64 of a RELEASE or HOLD_OK (8 bytes, nothing else). */
static int
get_u64(const struct wire_message *m, uint16_t type, uint64_t *v)
{
	int rc = check_message(m, type);

	if (rc < 0)
		return rc;
	if (v == NULL)
		return -EINVAL;
	*v = get_le64(m->payload);
	return 0;
}

/* The handle a RELEASE names. */
int
wire_get_release(const struct wire_message *m, uint64_t *handle)
{
	return get_u64(m, WIRE_RELEASE, handle);
}

/* The handle of the attach a HOLD made. */
int
wire_get_hold_ok(const struct wire_message *m, uint64_t *handle)
{
	return get_u64(m, WIRE_HOLD_OK, handle);
}

/* The build token of a PUBLISH. */
int
wire_get_publish(const struct wire_message *m, uint64_t *token)
{
	return get_u64(m, WIRE_PUBLISH, token);
}

/* Reads the 40 bytes of ATTACH_OK fields at p. */
static void
read_attach_ok(const uint8_t *p, struct wire_attach_ok *out)
{
	out->generation = get_le64(p);
	out->handle = get_le64(p + 8);
	out->index_size = get_le64(p + 16);
	out->file_count = get_le32(p + 24);
	out->flags = get_le32(p + 28);
	out->status_slot = get_le64(p + 32);
}

/* The fields of an ATTACH_OK. */
int
wire_get_attach_ok(const struct wire_message *m, struct wire_attach_ok *out)
{
	int rc = check_message(m, WIRE_ATTACH_OK);

	if (rc < 0)
		return rc;
	if (out == NULL)
		return -EINVAL;
	read_attach_ok(m->payload, out);
	return 0;
}

/* The source attach and the build token of a BUILD. */
int
wire_get_build(const struct wire_message *m, struct wire_attach_ok *source, uint64_t *token)
{
	int rc = check_message(m, WIRE_BUILD);

	if (rc < 0)
		return rc;
	if (source == NULL || token == NULL)
		return -EINVAL;
	read_attach_ok(m->payload, source);
	*token = get_le64(m->payload + WIRE_ATTACH_OK_SIZE);
	return 0;
}

/* The fields of a DERIVE; key and name point into the message. */
int
wire_get_derive(const struct wire_message *m, struct wire_derive *out)
{
	int rc = check_message(m, WIRE_DERIVE);
	uint32_t key_len;

	if (rc < 0)
		return rc;
	if (out == NULL)
		return -EINVAL;
	key_len = get_le32(m->payload + 4);
	out->wait_ms = get_le32(m->payload);
	out->key = (const char *)m->payload + WIRE_DERIVE_FIXED;
	out->key_len = key_len;
	out->name = out->key + key_len;
	out->name_len = m->h.length - WIRE_DERIVE_FIXED - key_len;
	return 0;
}

/* The build token and the reason (reason_len bytes, maybe 0, not
 * NUL-terminated) of an ABANDON. */
int
wire_get_abandon(const struct wire_message *m, uint64_t *token, const char **reason,
	size_t *reason_len)
{
	int rc = check_message(m, WIRE_ABANDON);

	if (rc < 0)
		return rc;
	if (token == NULL || reason == NULL || reason_len == NULL)
		return -EINVAL;
	*token = get_le64(m->payload);
	*reason = (const char *)m->payload + 8;
	*reason_len = m->h.length - 8;
	return 0;
}

/* The code (a positive errno value) and the text of an ERROR; the text is
 * text_len bytes at *text, not NUL-terminated, possibly empty, and not
 * guaranteed to be valid UTF-8. */
int
wire_get_error(const struct wire_message *m, int32_t *code, const char **text, size_t *text_len)
{
	int rc = check_message(m, WIRE_ERROR);

	if (rc < 0)
		return rc;
	if (code == NULL || text == NULL || text_len == NULL)
		return -EINVAL;
	*code = (int32_t)get_le32(m->payload);
	*text = (const char *)m->payload + 4;
	*text_len = m->h.length - 4;
	return 0;
}

/* Writes the 16-byte header for a payload of length bytes. */
static void
put_header(uint8_t *buf, uint16_t type, uint32_t length, uint32_t seq)
{
	put_le32(buf, WIRE_MAGIC);
	put_le16(buf + 4, (uint16_t)WIRE_VERSION);
	put_le16(buf + 6, type);
	put_le32(buf + 8, length);
	put_le32(buf + 12, seq);
}

/*
 * Encoders. Each writes one whole message to buf and returns its length:
 * -EINVAL when the arguments could not form a valid message (the decoder
 * would refuse it), -EMSGSIZE when cap is too small for it. buf is untouched
 * on failure.
 */

/* ATTACH: name is len bytes (1..WIRE_MAX_NAME, no NUL), not necessarily
 * NUL-terminated. */
ssize_t
wire_put_attach(uint8_t *buf, size_t cap, uint32_t seq, const char *name, size_t len)
{
	if (buf == NULL || name == NULL || len < 1 || len > WIRE_MAX_NAME ||
	        memchr(name, 0, len) != NULL)
		return -EINVAL;
	if (cap < WIRE_HEADER_SIZE || len > cap - WIRE_HEADER_SIZE)
		return -EMSGSIZE;
	put_header(buf, WIRE_ATTACH, (uint32_t)len, seq);
	memcpy(buf + WIRE_HEADER_SIZE, name, len);
	return (ssize_t)(WIRE_HEADER_SIZE + len);
}

/* A message of type whose payload is the u64 v alone. */
static ssize_t
put_u64(uint8_t *buf, size_t cap, uint16_t type, uint32_t seq, uint64_t v)
{
	if (buf == NULL)
		return -EINVAL;
	if (cap < WIRE_HEADER_SIZE + WIRE_RELEASE_SIZE)
		return -EMSGSIZE;
	put_header(buf, type, WIRE_RELEASE_SIZE, seq);
	put_le64(buf + WIRE_HEADER_SIZE, v);
	return WIRE_HEADER_SIZE + WIRE_RELEASE_SIZE;
}

/* RELEASE of the attach the daemon named handle. */
ssize_t
wire_put_release(uint8_t *buf, size_t cap, uint32_t seq, uint64_t handle)
{
	return put_u64(buf, cap, WIRE_RELEASE, seq, handle);
}

/* HOLD_OK: the handle of the attach a HOLD made. */
ssize_t
wire_put_hold_ok(uint8_t *buf, size_t cap, uint32_t seq, uint64_t handle)
{
	return put_u64(buf, cap, WIRE_HOLD_OK, seq, handle);
}

/* PUBLISH of the build token names. */
ssize_t
wire_put_publish(uint8_t *buf, size_t cap, uint32_t seq, uint64_t token)
{
	return put_u64(buf, cap, WIRE_PUBLISH, seq, token);
}

/* Writes ok's 40 bytes at p; 0, or -EINVAL when ok is not well formed. */
static int
write_attach_ok(uint8_t *p, const struct wire_attach_ok *ok)
{
	if (ok == NULL || (ok->flags & ~WIRE_ATTACH_STATUS) != 0 || ok->file_count > WIRE_MAX_FILES)
		return -EINVAL;
	put_le64(p, ok->generation);
	put_le64(p + 8, ok->handle);
	put_le64(p + 16, ok->index_size);
	put_le32(p + 24, ok->file_count);
	put_le32(p + 28, ok->flags);
	put_le64(p + 32, ok->status_slot);
	return 0;
}

/* ATTACH_OK: flags known and file_count at most WIRE_MAX_FILES. */
ssize_t
wire_put_attach_ok(uint8_t *buf, size_t cap, uint32_t seq, const struct wire_attach_ok *ok)
{
	uint8_t tmp[WIRE_ATTACH_OK_SIZE];

	if (buf == NULL || write_attach_ok(tmp, ok) < 0)
		return -EINVAL;
	if (cap < WIRE_HEADER_SIZE + WIRE_ATTACH_OK_SIZE)
		return -EMSGSIZE;
	put_header(buf, WIRE_ATTACH_OK, WIRE_ATTACH_OK_SIZE, seq);
	memcpy(buf + WIRE_HEADER_SIZE, tmp, sizeof(tmp));
	return WIRE_HEADER_SIZE + WIRE_ATTACH_OK_SIZE;
}

/* BUILD: the source's ATTACH_OK fields, then the build token. */
ssize_t
wire_put_build(uint8_t *buf, size_t cap, uint32_t seq, const struct wire_attach_ok *source,
	uint64_t token)
{
	uint8_t tmp[WIRE_ATTACH_OK_SIZE];

	if (buf == NULL || write_attach_ok(tmp, source) < 0)
		return -EINVAL;
	if (cap < WIRE_HEADER_SIZE + WIRE_BUILD_SIZE)
		return -EMSGSIZE;
	put_header(buf, WIRE_BUILD, WIRE_BUILD_SIZE, seq);
	memcpy(buf + WIRE_HEADER_SIZE, tmp, sizeof(tmp));
	put_le64(buf + WIRE_HEADER_SIZE + WIRE_ATTACH_OK_SIZE, token);
	return WIRE_HEADER_SIZE + WIRE_BUILD_SIZE;
}

/* DERIVE: a valid key (wire_key_valid) and a name of 1..WIRE_MAX_NAME
 * bytes without NUL. */
ssize_t
wire_put_derive(uint8_t *buf, size_t cap, uint32_t seq, const struct wire_derive *d)
{
	size_t len;

	if (buf == NULL || d == NULL || !wire_key_valid(d->key, d->key_len) || d->name == NULL ||
		d->name_len < 1 || d->name_len > WIRE_MAX_NAME ||
		memchr(d->name, 0, d->name_len) != NULL)
		return -EINVAL;
	len = WIRE_DERIVE_FIXED + d->key_len + d->name_len;
	if (cap < WIRE_HEADER_SIZE + len)
		return -EMSGSIZE;
	put_header(buf, WIRE_DERIVE, (uint32_t)len, seq);
	put_le32(buf + WIRE_HEADER_SIZE, d->wait_ms);
	put_le32(buf + WIRE_HEADER_SIZE + 4, (uint32_t)d->key_len);
	memcpy(buf + WIRE_HEADER_SIZE + WIRE_DERIVE_FIXED, d->key, d->key_len);
	memcpy(buf + WIRE_HEADER_SIZE + WIRE_DERIVE_FIXED + d->key_len, d->name, d->name_len);
	return (ssize_t)(WIRE_HEADER_SIZE + len);
}

/* The generation and model name of a CHANGED or a HOLD. */
static int
get_u64_name(const struct wire_message *m, uint16_t type, uint64_t *generation,
	const char **name, size_t *name_len)
{
	int rc = check_message(m, type);

	if (rc < 0)
		return rc;
	if (generation == NULL || name == NULL || name_len == NULL)
		return -EINVAL;
	*generation = get_le64(m->payload);
	*name = (const char *)m->payload + 8;
	*name_len = m->h.length - 8;
	return 0;
}

int
wire_get_changed(const struct wire_message *m, uint64_t *generation, const char **name,
	size_t *name_len)
{
	return get_u64_name(m, WIRE_CHANGED, generation, name, name_len);
}

int
wire_get_hold(const struct wire_message *m, uint64_t *generation, const char **name,
	size_t *name_len)
{
	return get_u64_name(m, WIRE_HOLD, generation, name, name_len);
}

/* The first file (a u64 on the wire, below WIRE_MAX_FILES: the decoder
 * checked) and model name of an ORIGINS. */
int
wire_get_origins(const struct wire_message *m, uint32_t *first, const char **name,
	size_t *name_len)
{
	uint64_t f;
	int rc;

	if (first == NULL)
		return -EINVAL;
	if ((rc = get_u64_name(m, WIRE_ORIGINS, &f, name, name_len)) < 0)
		return rc;
	*first = (uint32_t)f;
	return 0;
}

int
wire_get_origins_ok(const struct wire_message *m, struct wire_origins_ok *out)
{
	int rc = check_message(m, WIRE_ORIGINS_OK);
	const uint8_t *p;

	if (rc < 0)
		return rc;
	if (out == NULL)
		return -EINVAL;
	out->generation = get_le64(m->payload);
	out->file_count = get_le32(m->payload + 8);
	out->first = get_le32(m->payload + 12);
	out->n = out->file_count == 0 ? 0 : wire_origins_in_reply(out->file_count, out->first);
	p = m->payload + WIRE_ORIGINS_FIXED;
	for (size_t i = 0; i < out->n; i++, p += WIRE_ORIGIN_SIZE)
		out->origins[i] = (struct wire_origin){ .dev = get_le64(p), .ino = get_le64(p + 8),
			.size = get_le64(p + 16), .mtime_ns = (int64_t)get_le64(p + 24),
			.ctime_ns = (int64_t)get_le64(p + 32) };
	return 0;
}

/* A message of type: u64 generation, then the name (1..WIRE_MAX_NAME
 * bytes, no NUL). */
static ssize_t
put_u64_name(uint8_t *buf, size_t cap, uint16_t type, uint32_t seq, uint64_t generation,
	const char *name, size_t len)
{
	if (buf == NULL || name == NULL || len < 1 || len > WIRE_MAX_NAME ||
		memchr(name, 0, len) != NULL)
		return -EINVAL;
	if (cap < WIRE_HEADER_SIZE + 8 + len)
		return -EMSGSIZE;
	put_header(buf, type, (uint32_t)(8 + len), seq);
	put_le64(buf + WIRE_HEADER_SIZE, generation);
	memcpy(buf + WIRE_HEADER_SIZE + 8, name, len);
	return (ssize_t)(WIRE_HEADER_SIZE + 8 + len);
}

/* CHANGED: always sequence number 0. */
ssize_t
wire_put_changed(uint8_t *buf, size_t cap, uint64_t generation, const char *name, size_t len)
{
	return put_u64_name(buf, cap, WIRE_CHANGED, 0, generation, name, len);
}

/* HOLD: the generation of name that the client still maps. */
ssize_t
wire_put_hold(uint8_t *buf, size_t cap, uint32_t seq, uint64_t generation, const char *name,
	size_t len)
{
	return put_u64_name(buf, cap, WIRE_HOLD, seq, generation, name, len);
}

/* ORIGINS: the first file wanted (below WIRE_MAX_FILES) and a name as
 * ATTACH's. */
ssize_t
wire_put_origins(uint8_t *buf, size_t cap, uint32_t seq, uint32_t first, const char *name,
	size_t len)
{
	if (first >= WIRE_MAX_FILES)
		return -EINVAL;
	return put_u64_name(buf, cap, WIRE_ORIGINS, seq, first, name, len);
}

ssize_t
wire_put_origins_ok(uint8_t *buf, size_t cap, uint32_t seq, const struct wire_origins_ok *ok)
{
	size_t len;
	uint8_t *p;

	if (buf == NULL || ok == NULL || ok->file_count > WIRE_MAX_FILES ||
		(ok->file_count == 0 ? ok->first != 0 : ok->first >= ok->file_count) ||
		ok->n != (ok->file_count == 0 ? 0 :
			wire_origins_in_reply(ok->file_count, ok->first)))
		return -EINVAL;
	len = WIRE_ORIGINS_FIXED + ok->n * WIRE_ORIGIN_SIZE;
	if (cap < WIRE_HEADER_SIZE + len)
		return -EMSGSIZE;
	put_header(buf, WIRE_ORIGINS_OK, (uint32_t)len, seq);
	p = buf + WIRE_HEADER_SIZE;
	put_le64(p, ok->generation);
	put_le32(p + 8, ok->file_count);
	put_le32(p + 12, ok->first);
	p += WIRE_ORIGINS_FIXED;
	for (size_t i = 0; i < ok->n; i++, p += WIRE_ORIGIN_SIZE) {
		put_le64(p, ok->origins[i].dev);
		put_le64(p + 8, ok->origins[i].ino);
		put_le64(p + 16, ok->origins[i].size);
		put_le64(p + 24, (uint64_t)ok->origins[i].mtime_ns);
		put_le64(p + 32, (uint64_t)ok->origins[i].ctime_ns);
	}
	return (ssize_t)(WIRE_HEADER_SIZE + len);
}

/* RELEASE_OK: an empty payload. */
ssize_t
wire_put_release_ok(uint8_t *buf, size_t cap, uint32_t seq)
{
	if (buf == NULL)
		return -EINVAL;
	if (cap < WIRE_HEADER_SIZE)
		return -EMSGSIZE;
	put_header(buf, WIRE_RELEASE_OK, 0, seq);
	return WIRE_HEADER_SIZE;
}

/*
 * Returns how many of the first n bytes of text to keep so that the kept
 * part ends on a UTF-8 character boundary: when text is longer than n, a
 * character whose continuation bytes start at text[n] is dropped whole.
 */
static size_t
utf8_cut(const char *text, size_t len, size_t n)
{
	size_t cut;

	if (len <= n)
		return len;
	cut = n;
	/* Back off over continuation bytes (10xxxxxx); a valid character has at
	 * most three, and invalid input stops after three too. */
	for (int i = 0; i < 3 && cut > 0 && ((unsigned char)text[cut] & 0xC0) == 0x80; i++)
		cut--;
	if (((unsigned char)text[cut] & 0xC0) == 0x80)
		cut = n; /* not UTF-8 here: a plain cut is as good as any */
	return cut;
}

/* ABANDON: the build token and why; the reason is cut to WIRE_MAX_REASON
 * bytes at a UTF-8 character boundary (a NUL ends it). */
ssize_t
wire_put_abandon(uint8_t *buf, size_t cap, uint32_t seq, uint64_t token, const char *reason)
{
	size_t len;

	if (buf == NULL || reason == NULL)
		return -EINVAL;
	len = utf8_cut(reason, strnlen(reason, WIRE_MAX_REASON + 1), WIRE_MAX_REASON);
	if (cap < WIRE_HEADER_SIZE + 8 + len)
		return -EMSGSIZE;
	put_header(buf, WIRE_ABANDON, (uint32_t)(8 + len), seq);
	put_le64(buf + WIRE_HEADER_SIZE, token);
	memcpy(buf + WIRE_HEADER_SIZE + 8, reason, len);
	return (ssize_t)(WIRE_HEADER_SIZE + 8 + len);
}

/*
 * ERROR: code is a positive errno value (1..4095), text a NUL-terminated
 * message. Text that would not fit in WIRE_MAX_MESSAGE is cut at a UTF-8
 * character boundary instead of failing, so an error can always be reported;
 * -EMSGSIZE only when cap is smaller than the (cut) message.
 */
ssize_t
wire_put_error(uint8_t *buf, size_t cap, uint32_t seq, int32_t code, const char *text)
{
	size_t len;

	if (buf == NULL || text == NULL || code < 1 || code > WIRE_ERROR_CODE_MAX)
		return -EINVAL;
	len = utf8_cut(text, strnlen(text, WIRE_MAX_PAYLOAD), WIRE_MAX_PAYLOAD - WIRE_ERROR_MIN);
	if (cap < WIRE_HEADER_SIZE + WIRE_ERROR_MIN ||
	        len > cap - WIRE_HEADER_SIZE - WIRE_ERROR_MIN)
		return -EMSGSIZE;
	put_header(buf, WIRE_ERROR, (uint32_t)(WIRE_ERROR_MIN + len), seq);
	put_le32(buf + WIRE_HEADER_SIZE, (uint32_t)code);
	memcpy(buf + WIRE_HEADER_SIZE + WIRE_ERROR_MIN, text, len);
	return (ssize_t)(WIRE_HEADER_SIZE + WIRE_ERROR_MIN + len);
}
