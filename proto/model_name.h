/*
 * model_name.h: what a model's name may be, one rule for every side that
 * checks one: wcached's configuration ([model NAME]), its control socket's
 * load, and wcachectl, which checks a load's NAME before it connects, so a
 * bad name is a usage error whether or not wcached runs.
 */
#ifndef WC_MODEL_NAME_H
#define WC_MODEL_NAME_H

#define MODEL_NAME_MAX 128 /* bytes, not counting the NUL */

/* 1 when s is a valid model name (1..MODEL_NAME_MAX bytes of
 * [A-Za-z0-9._-], not starting with '.' or '-'), else 0. */
int model_name_valid(const char *s);

#endif /* WC_MODEL_NAME_H */
