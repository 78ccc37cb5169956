/*
 * index_check.h: the full check of a compiled index the daemon did not
 * build in this process: one a warm restart took back from the service
 * manager's file descriptor store (restore.h).
 *
 * index_open() checks only the header and that the tables lie inside the
 * index (O(1)), and the reader functions check each record on access, which
 * is what makes an attach cost the same whatever the tensor count. An index
 * this process compiled itself is right by construction; a stored one was
 * written by an earlier process, perhaps another version, so before the
 * daemon relies on it past its header (to lock the metadata, to keep
 * serving it) every record is checked once, off the event loop.
 */
#ifndef WC_INDEX_CHECK_H
#define WC_INDEX_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "format/index.h"

/*
 * Checks every record of the index blob (whose header h index_open()
 * accepted) against its nfiles files of the given sizes: the file count,
 * each file record (its name, its size equal to file_size[k]), each tensor
 * record (what index_tensor_at() checks, and its data inside its file),
 * tensor names strictly increasing (byte order, so that the binary search
 * finds every tensor and no name comes twice), and each metadata record,
 * keys strictly increasing. O(tensor count); touches only the index.
 *
 * first_data (NULL, or nfiles entries) receives, per file, the offset of its
 * first tensor's data, or the file's size when no tensor is in it: what
 * pin = metadata locks. Returns 0, or -EBADMSG naming the record in
 * error_get() (-ENOMEM); first_data is untouched on failure.
 */
int index_check(const uint8_t *blob, const struct index_header *h, const uint64_t *file_size,
	size_t nfiles, uint64_t *first_data);

#endif
