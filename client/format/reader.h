/*
 * reader.h: what a format reader is, for the openers above the readers.
 *
 * A reader only parses: it is given private copies of the bytes of one file
 * (the head its head_len function asks for, and the tail; see file_bytes in
 * base/file.h), validates them and adds the file's tensors to an index
 * builder. It opens nothing and knows nothing of models made of several
 * files, of directories or of the other formats. The readers are
 * safetensors.c (st_reader) and weig.c (weig_reader,
 * weig_big_endian_reader); open.c reads a file through one, and source.c
 * lists them in its table of formats.
 *
 * Header only: a type shared by the readers below and the openers above.
 */
#ifndef WC_READER_H
#define WC_READER_H

#include <stdint.h>

#include "base/file.h"
#include "format/index.h"

/*
 * A reader's parser (st_parse_bytes, weig_parse_bytes, ...): validates the
 * private bytes in, adds its tensors to b as file file_no; name is the file
 * for messages. 0, or a negative errno with a message naming the file.
 */
typedef int (*format_parse_fn)(const char *name, const struct file_bytes *in,
	uint32_t file_no, struct index_builder *b);

/* A format's reader: how much of a file its parser needs, and the parser. */
struct format_reader {
	file_head_fn head_len;
	uint64_t max_head; /* most head bytes it may ask for */
	format_parse_fn parse;
};

#endif
