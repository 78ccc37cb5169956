/*
 * wcache.h: the client library of wcache, a shared weight cache.
 *
 * A model is a set of named tensors that live in read-only mappings of the
 * model's files. wc_open_file() maps and validates a file in this process;
 * wc_attach() asks wcached for a model it has already opened, validated and
 * warmed, and maps the same page cache every other worker maps.
 *
 * Conventions: functions return 0 or a negative errno-style code (-EINVAL,
 * -ENOMEM, ...). After a failure, wc_errmsg() returns a message for the last
 * failure in the calling thread that names the file or model and the reason.
 * Out-parameters are untouched on failure. Destructors accept NULL.
 *
 * Lifetime: a wc_model, and every pointer a wc_tensor holds into it, is valid
 * until wc_release(). A model stays valid after wc_disconnect() of the client
 * that attached it, and in the child after fork() (mappings are inherited;
 * only the process that attached a model tells the daemon it released it).
 * A client belongs to the process that connected it: in a child, calls
 * that would use its connection (wc_attach(), wc_derive(), wc_set_timeout(),
 * wc_client_dispatch(), ending a build) fail with -ECHILD; wc_release() and
 * wc_disconnect() only free the child's copies, and close the child's copy
 * of the connection only while its number is still that socket (a child
 * that closed it, closefrom(), and got the number again keeps that file).
 * Connect again in the child.
 */
#ifndef WCACHE_H
#define WCACHE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define WC_EXPORT __attribute__((visibility("default")))
#else
#define WC_EXPORT
#endif

typedef struct wc_model wc_model;
typedef struct wc_client wc_client;
typedef struct wc_build wc_build;

typedef struct wc_tensor {
	const char *name;      /* NUL-terminated UTF-8 */
	const char *dtype;     /* safetensors spelling: "F32", "BF16", ... */
	uint32_t ndim;
	const uint64_t *shape; /* ndim entries */
	const void *data;      /* read-only, valid until wc_release() */
	uint64_t nbytes;
} wc_tensor;

/* Maps and validates a safetensors file, a shard index
 * (model.safetensors.index.json), a directory holding one of those, or a
 * WEIG file. Files are opened O_RDONLY | O_CLOEXEC and mapped PROT_READ. */
WC_EXPORT int wc_open_file(const char *path, wc_model **out);

/* The same for the one safetensors or WEIG file open as fd (by its magic),
 * read with pread and mapped PROT_READ; label names it in errors. fd stays
 * the caller's: it may be closed as soon as this returns. */
WC_EXPORT int wc_open_fd(int fd, const char *label, wc_model **out);

/* Unmaps the model; tells the daemon when the model was attached by this
 * process and its client is still connected. Accepts NULL. Never waits for
 * another thread's request on that client (a wc_attach(), a wc_derive()
 * waiting for another worker's build): the model is unmapped at once, and
 * that request's thread tells the daemon when it is done (the daemon reads
 * no other request of the connection before answering it). */
WC_EXPORT void wc_release(wc_model *m);

/* Number of tensors. */
WC_EXPORT size_t wc_model_count(const wc_model *m);

/* The i-th tensor in byte order of names; -ERANGE when i is out of range. */
WC_EXPORT int wc_model_tensor(const wc_model *m, size_t i, wc_tensor *out);

/*
 * Bulk form of wc_model_tensor() for bindings that read every tensor: fills
 * out[0 .. k) with tensors first .. first + k - 1, where k is the smaller of
 * n and wc_model_count(m) - first, and returns k (0 when first is at or past
 * the end), or a negative errno with nothing promised about out. One call
 * instead of one per tensor: a 200,000-tensor model is read in one go.
 */
WC_EXPORT int wc_model_tensors(const wc_model *m, size_t first, wc_tensor *out, size_t n);

/* The tensor called name; -ENOENT when there is none. */
WC_EXPORT int wc_model_find(const wc_model *m, const char *name, wc_tensor *out);

/* The metadata value for key (safetensors __metadata__), NULL if absent. */
WC_EXPORT const char *wc_model_metadata(const wc_model *m, const char *key);

/* The i-th metadata entry in byte order of keys; -ERANGE past the end. */
WC_EXPORT int wc_model_metadata_at(const wc_model *m, size_t i, const char **key,
	const char **value);

/* The generation wcached served this model as; 0 for wc_open_file/fd(). */
WC_EXPORT uint64_t wc_model_generation(const wc_model *m);

/*
 * 1 when wcached now serves a newer generation under this model's name (or
 * no longer serves it), else 0; always 0 for wc_open_file/fd(). Costs no system
 * call: it reads the daemon's status page, which every attached model maps
 * read-only, so it is cheap enough to call on every request. A stale model
 * stays valid and readable; attach again to get the new generation, then
 * release the old one.
 */
WC_EXPORT int wc_model_stale(const wc_model *m);

/* Makes the model's tensor data writable in this process, copy-on-write:
 * every page stays the page cache other workers map until this process
 * writes to it; a write gives this process a private copy of that page and
 * never reaches the file, the daemon or another process. Afterwards the
 * data of every wc_tensor of m may be written through (the pointers do not
 * change). For bindings whose tensors cannot be read-only (torch). Files
 * are mapped MAP_NORESERVE, so the writable mapping is not charged up front
 * (except under vm.overcommit_memory=2: then -ENOMEM is possible).
 * -ENOTSUP when the files are mapped shared. */
WC_EXPORT int wc_model_cow(wc_model *m);

/*
 * A descriptor of file `file` of the model, for mapping it again (a
 * MAP_SHARED, PROT_READ view that a GPU driver may pin without the kernel
 * copying the pages of a private mapping): the derived artifact's memfd,
 * which has no path to open. Kept only by an artifact (from wc_derive(),
 * wc_build_publish*()): O_RDONLY, close-on-exec, of the memfd wcached
 * sealed against writes, shrinking and growing; and by a model from
 * wc_attach_fds(), one per file. Any other model keeps none (-ENOENT):
 * open its files by their paths. -ERANGE when file is out of range,
 * -EINVAL for no model.
 *
 * Borrowed: valid until wc_release(m) or wc_model_close_fd(m, file),
 * which close it; do not close it (dup it to keep it longer). A child of
 * fork() inherits it with the model, and the child's wc_release() closes
 * the child's copy only. wc_release() closes a kept descriptor only while
 * it is still the file the model got (the same device and inode, or an
 * fstat() that fails with another error than EBADF, as ESTALE on NFS) and
 * no model attached since got its number: in a process that closed it without
 * asking (closefrom(), close_range()), a number given since to another
 * file, or to a later model's descriptor of the same file (a re-attach:
 * wcached passes the same open file), is left open; one given to the same
 * file again by an open of its own (by its path) would be closed. While
 * another thread of the process receives descriptors from wcached, the
 * close waits until that receive's model has them (or they are closed),
 * so that a release never closes those of a model being attached: the
 * call returns at once, the descriptor is closed when that receive ends.
 * A receive begins only once its reply is there: a request waiting for
 * its reply (a wc_derive() waiting for a build) holds back no close.
 */
WC_EXPORT int wc_model_fd(const wc_model *m, size_t file);

/* Closes the descriptor m kept of file `file` (wc_model_fd() then says
 * -ENOENT); 0 also when it keeps none. For a caller of wc_attach_fds()
 * that needs only some files' descriptors: the model's mappings and
 * identities stay. No other thread may use the descriptor wc_model_fd()
 * lent for that file meanwhile. -ERANGE when file is out of range, -EINVAL
 * for no model. */
WC_EXPORT int wc_model_close_fd(wc_model *m, size_t file);

/* What fstat() said of a file's descriptor when a model got it. */
typedef struct wc_file_identity {
	uint64_t dev;     /* st_dev */
	uint64_t ino;     /* st_ino */
	uint64_t size;    /* st_size */
	int64_t mtime_ns; /* st_mtim, nanoseconds since the epoch (INT64_MAX past 2262) */
	int64_t ctime_ns; /* st_ctim, the same */
} wc_file_identity;

/* The identity of file `file` of a model attached through wcached
 * (wc_attach(), wc_attach_fds(), an artifact), from the descriptor wcached
 * passed, taken when the model was attached: for a staged model, its copy
 * in stage_dir (which keeps its source's size and mtime). It tells whether
 * a file at a path is the one the model maps (the same dev and ino, and
 * size, mtime and ctime unchanged: not written since) without keeping a
 * descriptor. The model maps the file, so its inode number is not reused
 * while the model lives. -ENOENT for a model from wc_open_file/fd(),
 * -ERANGE when file is out of range, -EINVAL for no model or no out. */
WC_EXPORT int wc_model_file_identity(const wc_model *m, size_t file, wc_file_identity *out);

/* What file `file` of a model attached through wcached was copied from,
 * when wcached serves a staged copy of it (stage = yes, or auto on
 * NFS/9p/FUSE): the fstat of the source file when wcached copied it
 * (device, inode, size, mtime, ctime). A file at the source's path whose
 * fstat says all five is the file the copy holds, unchanged (a rename over
 * it, or a write, even with its mtime put back, changes its inode or
 * ctime). wcached is asked once per attach, on a connection of its own,
 * within the default deadline ($WCACHE_TIMEOUT). -ENOENT when the file is
 * not a staged copy (or the model was not attached through wcached),
 * -ENOTSUP when wcached does not say (older than this libwcache; a client
 * does not ask again until it connects again), -ESTALE when wcached serves
 * another generation now, -ERANGE when file is out of range, -EINVAL for
 * no model or no out; another -errno when wcached cannot be asked
 * (-ECONNRESET: it closed the connection before answering; -EUSERS: it
 * has max_clients connections). */
WC_EXPORT int wc_model_file_origin(wc_model *m, size_t file, wc_file_identity *out);

/* The number of files of the model (0 for NULL). */
WC_EXPORT size_t wc_model_file_count(const wc_model *m);

/* The name the model's index gives file `file`: for a sharded model the
 * shard's name as the weight map spells it, else the file's base name.
 * NULL past the end, for NULL, or for a damaged record. Valid until
 * wc_release(m). */
WC_EXPORT const char *wc_model_file_name(const wc_model *m, size_t file);

/* Message for the last failure in the calling thread ("" if none). */
WC_EXPORT const char *wc_errmsg(void);

/* The client socket wc_connect(NULL, ...) connects to: $WCACHE_SOCKET when
 * it is set and not empty, else /run/wcached/wcached.sock (wcached's
 * default). The string is the environment's or static: do not free it, and
 * copy it before changing WCACHE_SOCKET. */
WC_EXPORT const char *wc_default_socket(void);

/* Connects to wcached's client socket. socket_path NULL means
 * $WCACHE_SOCKET, else /run/wcached/wcached.sock. The connection's deadline
 * is $WCACHE_TIMEOUT seconds (0: wait forever), else 30 s; a value that is
 * not a number of seconds is -EINVAL. */
WC_EXPORT int wc_connect(const char *socket_path, wc_client **out);

/* wc_connect() with a deadline of timeout_ms milliseconds (0: wait forever;
 * negative: the default, as wc_connect()). The deadline bounds the connect
 * and every later wait of this client on the daemon (each wc_attach(), each
 * release's send): past it the call fails with -ETIMEDOUT, naming the
 * socket and the time waited, and the connection is closed (the next
 * wc_attach() connects again by itself). */
WC_EXPORT int wc_connect_timeout(const char *socket_path, int timeout_ms, wc_client **out);

/* Changes c's deadline, as wc_connect_timeout()'s timeout_ms. */
WC_EXPORT int wc_set_timeout(wc_client *c, int timeout_ms);

/* Attaches the model wcached serves under name (or under the exact
 * configured path). The returned model is independent of the client.
 *
 * Restarts: when the connection turns out to be dead (wcached exited,
 * crashed or restarted, or the connection was closed after an error), the
 * client connects once more to the same socket path, within what is left
 * of its deadline, and sends the request again, once; the caller does not
 * reconnect by hand. Models attached before keep working (their mappings
 * do not depend on the connection); their wc_release() only unmaps, since
 * the daemon that handed them out released them when the connection
 * closed. See proto/PROTOCOL.md, "Restarts".
 *
 * A model the daemon attached but this process cannot map (-ENOMEM, for
 * one) is released at once: the daemon does not count it. */
WC_EXPORT int wc_attach(wc_client *c, const char *model, wc_model **out);

/*
 * As wc_attach(), and the model keeps an O_RDONLY, close-on-exec descriptor
 * of each of its files, the ones wcached passed (for a staged model, those
 * of its copy in stage_dir), which wc_model_fd() lends and wc_release()
 * closes: one descriptor per file for as long as the model lives. For a
 * caller that must tell which file at a path is one of the model's (fstat
 * the descriptor), or map a file of it again without opening it by path.
 */
WC_EXPORT int wc_attach_fds(wc_client *c, const char *model, wc_model **out);

/* Ends the client: its connection closes once a release or a build's
 * publish or abandon running on another thread at the same time is done
 * with it (those may; nothing else may use c then or after). Models
 * attached through it stay valid; the daemon counts them as released (it
 * still never truncates their files). */
WC_EXPORT void wc_disconnect(wc_client *c);

/*
 * Derived artifacts: the model wcached serves under name, transformed by
 * key (1 to 64 letters, digits or "._+-": "f32-v1", "int8-rowwise-v2"),
 * computed once by one worker and then attached by every other worker like
 * a model (proto/PROTOCOL.md, "Derived artifacts"; the model's section in
 * wcached.conf says whether it has artifacts and who may compute them).
 *
 * Returns 0 when *out is the artifact, attached: a model of one file whose
 * wc_model_generation() is the source generation's number and which reads
 * stale (wc_model_stale()) when its model has a newer generation; release
 * it with wc_release(). Returns 1 when this process is the builder: *build
 * is set, the source generation is wc_build_source(*build), and the caller
 * computes the artifact and ends the build with wc_build_publish(),
 * wc_build_publish_each(), wc_build_publish_fd() or wc_build_abandon(), on
 * this client, before the model's derive_timeout. Returns a negative
 * errno otherwise, with wc_errmsg() naming the model, the key and why:
 * -EACCES (no artifact yet and this process may not build it), -EPERM (the
 * model has no derived artifacts), -ETIMEDOUT (another worker's build took
 * longer than the deadline), -ECANCELED (that build was abandoned or its
 * artifact refused), -EHOSTDOWN (its builder went away), -ENOENT, -EAGAIN
 * as wc_attach().
 *
 * While another worker builds, the call waits for it up to the client's
 * deadline (wc_connect_timeout(), wc_set_timeout(); 0 waits as long as the
 * build takes). A dead connection is replaced once, as in wc_attach().
 *
 * When wcached makes this process the builder but the source cannot be
 * mapped here (-ENOMEM under RLIMIT_AS, for one), the call abandons the
 * build at once, the failure in its reason (the workers waiting for the
 * key get -ECANCELED with it), releases the source and returns the
 * failure; as wc_attach(), an artifact that cannot be mapped is released.
 */
WC_EXPORT int wc_derive(wc_client *c, const char *model, const char *key, wc_model **out,
	wc_build **build);

/* The source generation a builder computes from: a model like an attached
 * one, valid until the build ends (wc_build_publish*, wc_build_abandon). */
WC_EXPORT const wc_model *wc_build_source(const wc_build *b);

/*
 * Publishes the artifact: writes tensors[0 .. n) and nmeta metadata pairs
 * (metadata[2i] a key, metadata[2i + 1] its value; NULL when nmeta is 0)
 * as a safetensors file into a new memfd, straight from the tensors' data,
 * and sends it to wcached, which seals and validates it and serves it to
 * every waiting worker. Each tensor's name, dtype (safetensors spelling),
 * shape and data are read during the call only; nbytes must be that of its
 * shape. On success *out is the artifact, attached, as from wc_derive().
 * Ends b whatever happens (b is freed and the source released): a tensor
 * the writer refuses abandons the build with the writer's message; -EBUSY,
 * -EBADMSG and others are wcached's refusal, with its reason.
 */
WC_EXPORT int wc_build_publish(wc_build *b, const wc_tensor *tensors, size_t n,
	const char *const *metadata, size_t nmeta, wc_model **out);

/* What wc_build_publish_each() calls once tensors[index]'s data is read. */
typedef void wc_written_fn(size_t index, void *arg);

/*
 * As wc_build_publish(), and calls written(index, arg) as soon as
 * tensors[index]'s data has been written into the artifact (in the order
 * the file holds them: upstream's, by dtype, widest first, then by name;
 * each tensor once, on the calling thread, before the artifact is sent):
 * from then on the caller may free or reuse that tensor's memory. A builder
 * that frees each tensor there never holds its whole result and the whole
 * artifact at once: its peak memory is the artifact's size plus one tensor,
 * not twice the artifact's, and the artifact's pages can reuse the ones
 * just freed. written must not call into libwcache. A write that fails
 * leaves the tensors after it uncalled (they were not read).
 */
WC_EXPORT int wc_build_publish_each(wc_build *b, const wc_tensor *tensors, size_t n,
	const char *const *metadata, size_t nmeta, wc_written_fn *written, void *arg,
	wc_model **out);

/*
 * Publishes a memfd the caller filled with a whole safetensors or WEIG file
 * (memfd_create with MFD_ALLOW_SEALING). The caller keeps memfd, and must
 * not keep a shared mapping of it made through a writable descriptor, a
 * read-only (PROT_READ) one included: wcached seals it against writes, and
 * the kernel refuses the seal (-EBUSY) while one exists. On success *out is the
 * artifact. Ends b whatever happens, as wc_build_publish().
 */
WC_EXPORT int wc_build_publish_fd(wc_build *b, int memfd, wc_model **out);

/* Tells wcached that the build failed, with reason (UTF-8, cut at 1024
 * bytes; NULL for none), which the waiting workers get in their error; ends
 * b. Accepts NULL. */
WC_EXPORT void wc_build_abandon(wc_build *b, const char *reason);

/*
 * For event-loop workers: a descriptor that becomes readable when wcached
 * announces that a model this client holds has a new generation (or is no
 * longer served). Poll it for POLLIN; when readable, call
 * wc_client_dispatch(), then check wc_model_stale() on the models you hold.
 * Announcements are a wake-up, not a record: wc_model_stale() is the truth.
 * The descriptor belongs to the client; do not close it. It changes when
 * the client reconnects (after a restart of wcached, in wc_attach() or
 * wc_client_dispatch()): call wc_client_fd() again after each of them
 * rather than keeping the number. Announcements resume on the new
 * descriptor for the models attached from then on. -EINVAL for a NULL
 * client (the reason in wc_errmsg()).
 */
WC_EXPORT int wc_client_fd(const wc_client *c);

/* Reads pending announcements without blocking; returns how many were read
 * (0 if none), or a negative errno when the connection failed. When wcached
 * has hung up (it exited or restarted), connects again to the same path
 * (bounded by the client's deadline) and returns the count so far; the
 * error is returned only when that connect fails. While another thread's
 * request on c is in progress, returns 0 at once: that request reads the
 * connection, drops the announcements it meets and replaces a dead one. */
WC_EXPORT int wc_client_dispatch(wc_client *c);

#ifdef __cplusplus
}
#endif
#endif /* WCACHE_H */
