/*
 * store_untreed: rewrites a wcached file descriptor store description
 * (stdin to stdout) as a wcached before format version 9 wrote it: every
 * model's tree dropped, so the encoder writes the version before 9; with
 * the argument 9, as a wcached of format version 9 wrote it: what each
 * generation's path named and each tree's kept files dropped (version 10's
 * fields), the trees kept. The tests of the upgrade's warm restart
 * (test_restart_judged) put it in the fake service manager's store in
 * place of the one wcached wrote.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fdstore.h"

int
main(int argc, char **argv)
{
	int v9 = argc > 1 && strcmp(argv[1], "9") == 0;
	static uint8_t in[16 << 20];
	size_t n = fread(in, 1, sizeof(in), stdin), len;
	struct fdstore_desc *d;
	uint8_t *out;
	int ok;

	if (n == sizeof(in) || fdstore_decode(in, n, &d) < 0) {
		fprintf(stderr, "store_untreed: stdin is no description\n");
		return 1;
	}
	for (uint32_t i = 0; i < d->nmodels; i++) {
		struct fdstore_model *m = &d->models[i];

		for (uint32_t g = 0; g < m->ngenerations; g++)
			m->generations[g].named = FDSTORE_NAMED_UNRECORDED;
		free(m->tree.kept);
		m->tree.kept = NULL;
		m->tree.nkept = 0;
		m->tree.named = FDSTORE_NAMED_UNRECORDED;
		if (v9)
			continue;
		free(m->tree.root);
		free(m->tree.place);
		m->tree = (struct fdstore_tree){ .root = NULL };
	}
	ok = fdstore_encode(d, &out, &len) == 0;
	fdstore_free(d);
	if (!ok || fwrite(out, 1, len, stdout) != len) {
		fprintf(stderr, "store_untreed: cannot encode it\n");
		return 1;
	}
	free(out);
	return 0;
}
