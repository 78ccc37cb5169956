/*
 * pin.h: what a model keeps locked in memory (mlock), in one vocabulary for
 * the configuration file's "pin" key, the control socket's load pin=...
 * option (which wcachectl checks before it connects), the registry and the
 * status and metrics output.
 */
#ifndef WC_PIN_H
#define WC_PIN_H

enum pin_mode {
	PIN_NONE = 0,     /* "none": nothing */
	PIN_METADATA = 1, /* "metadata": the index and the files' headers (the default) */
	PIN_ALL = 2,      /* "all": the whole model, within RLIMIT_MEMLOCK */
};

/* Parses a pin word ("none", "metadata", "all") into *out. Returns 0, or
 * -EINVAL with *out untouched; the caller words the message. */
int pin_mode_parse(const char *s, enum pin_mode *out);

/* The word of p, as pin_mode_parse() reads it. */
const char *pin_mode_name(enum pin_mode p);

#endif /* WC_PIN_H */
