/*
 * diagnose.h: naming the formats a model file is often mistaken for.
 *
 * People point a safetensors reader at what they downloaded: a pickled
 * PyTorch checkpoint (pytorch_model.bin, model.pt), a GGUF file, a NumPy
 * array, a Keras HDF5 file. Their first bytes are not a safetensors header
 * length, and "header length 578712552184433488 exceeds the maximum" helps
 * nobody. diagnose_format() recognises them by their magic bytes and says
 * what the file is and, where one exists, how to convert it.
 */
#ifndef WC_DIAGNOSE_H
#define WC_DIAGNOSE_H

#include <stdbool.h>
#include <stdint.h>

/* The command that converts a PyTorch checkpoint, named in messages. */
#define DIAGNOSE_CONVERTER "python3 -m wcache.convert"

/*
 * When the size bytes at file are a format other than safetensors that we
 * recognise, sets the error message (naming the file as name, the format
 * and the converter) and returns -EINVAL; else returns 0.
 */
int diagnose_format(const char *name, const uint8_t *file, uint64_t size);

/*
 * Recognises files that are not safetensors at all (empty, a Git LFS
 * pointer, an HTML page, the formats of diagnose_format(), too short) from
 * the first size bytes at file and explains them: -EINVAL with the message;
 * 0 when the file may be safetensors.
 */
int diagnose_not_safetensors(const char *name, const uint8_t *file, uint64_t size);

/* True if the 8 bytes at p are printable ASCII or whitespace: a text file
 * where a safetensors header length should be. */
bool diagnose_looks_like_text(const uint8_t *p);

#endif
