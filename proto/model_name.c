/*
 * model_name.c: the rule for a model's name (see model_name.h).
 */
#include "proto/model_name.h"

#include <string.h>

int
model_name_valid(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > MODEL_NAME_MAX || s[0] == '.' || s[0] == '-')
		return 0;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
			    c == '.' || c == '_' || c == '-'))
			return 0;
	}
	return 1;
}
