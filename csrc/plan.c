/*
 * plan.c: a restore's plan of one window in whole arrays, so that Python
 * sees a window, never a block (foundation/store/read.py, log-order reads).
 *
 * fdn_plan_sweep   takes from one arena's summary (its keys and addresses)
 *                  the address of every key of a window's table not found yet;
 * fdn_plan_order   sorts a window's located blocks by log address (ties by
 *                  position, as a stable sort) and lays their refs side by side;
 * fdn_plan_cuts    cuts the sorted addresses into spans: the largest reads of
 *                  the log, each in one arena, that stop at a gap wider than
 *                  `gap`, before `span` bytes or `blocks` records;
 * fdn_plan_runs    the runs of consecutive leaves in a span's blocks (one
 *                  pwrite each).
 *
 * Their reference twins are in foundation/native/reference.py.
 */
#include <stdlib.h>
#include <string.h>

#include "foundation.h"

int64_t fdn_plan_sweep(fdn_table *t, const uint8_t *akeys, size_t klen,
	const uint64_t *aaddrs, size_t n, uint64_t *found, uint8_t *done,
	size_t nfound)
{
	/* The records are asked a chunk at a time, as one lookup (fdn_tables_lookup: the slots of
	 * a run of keys fetched before the first is probed, one lock a chunk): a newest day's
	 * restore sweeps ~500 k records of a year's arenas through a table of ~65 k keys, and a
	 * lookup a record, each waiting for its slot's cache miss, took 16 ms for 480 k records
	 * where this takes 11 (benchmarks/bench_sweep.py). */
	enum { CHUNK = 256 };
	uint64_t js[CHUNK];
	int32_t which[CHUNK];
	size_t keylen, i, k, c;
	int64_t filled = 0;
	int rc;

	if (n == 0)
		return 0;
	keylen = klen / n;
	if (keylen == 0 || klen != n * keylen)
		return FDN_EARG;
	for (i = 0; i < n; i += c) {
		c = n - i < CHUNK ? n - i : CHUNK;
		if ((rc = fdn_tables_lookup(&t, 1, akeys + i * keylen, c * keylen, NULL, 0, js, which, c)) != FDN_OK)
			return rc;
		for (k = 0; k < c; k++) {
			uint64_t j = js[k];

			if (which[k] < 0)
				continue;
			if (j >= nfound)
				return FDN_EARG;
			if (!done[j]) {
				/* a block the window holds twice is found by its first position */
				found[j] = aaddrs[i + k];
				done[j] = 1;
				filled++;
			}
		}
	}
	return filled;
}

typedef struct {
	uint64_t addr;
	uint64_t k;
} pair;

static int cmp_pair(const void *a, const void *b)
{
	const pair *x = a, *y = b;

	if (x->addr != y->addr)
		return x->addr < y->addr ? -1 : 1;
	return x->k < y->k ? -1 : x->k > y->k;
}

int fdn_plan_order(const uint64_t *found, size_t m, const int64_t *live,
	size_t nlive, const uint8_t *refs, size_t rlen, size_t rs,
	uint64_t *addrs, int64_t *positions, uint8_t *keyed, size_t keyedlen)
{
	pair *p;
	size_t x;

	if (rs == 0 || rlen % rs || (live && nlive != m) || keyedlen != m * rs)
		return FDN_EARG;
	if (m == 0)
		return FDN_OK;
	p = malloc(m * sizeof *p);
	if (!p)
		return FDN_ENOMEM;
	for (x = 0; x < m; x++) {
		uint64_t pos = live ? (uint64_t)live[x] : x;

		if (pos >= rlen / rs) {
			free(p);
			return FDN_EARG;
		}
		p[x].addr = found[x];
		p[x].k = x;
	}
	qsort(p, m, sizeof *p, cmp_pair);
	for (x = 0; x < m; x++) {
		int64_t pos = live ? live[p[x].k] : (int64_t)p[x].k;

		addrs[x] = p[x].addr;
		positions[x] = pos;
		memcpy(keyed + x * rs, refs + (size_t)pos * rs, rs);
	}
	free(p);
	return FDN_OK;
}

/* The first index in [lo, hi) whose address is above v (addrs sorted), hi if none. */
static size_t above(const uint64_t *addrs, size_t lo, size_t hi, uint64_t v)
{
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (addrs[mid] > v)
			hi = mid;
		else
			lo = mid + 1;
	}
	return lo;
}

int64_t fdn_plan_cuts(const uint64_t *addrs, size_t n, uint64_t gap,
	uint64_t span, size_t blocks, uint64_t most, uint64_t *ends,
	size_t cap)
{
	size_t i = 0, g = 1, k = 0;

	if (blocks == 0 || span < most)
		return FDN_EARG;
	while (i < n) {
		uint64_t a = addrs[i];
		size_t hi = n - i > blocks ? i + blocks : n, j;

		/* the next gap after i: the first g > i with addrs[g] - addrs[g - 1] > gap */
		if (g <= i)
			g = i + 1;
		while (g < n && addrs[g] - addrs[g - 1] <= gap)
			g++;
		/* the first address past the span's byte limit (a later arena's are past it too) */
		j = above(addrs, i + 1, hi, a + span - most);
		if (g < j)
			j = g;
		if (j < i + 1)
			j = i + 1;
		if (k == cap)
			return FDN_ESPACE;
		ends[k++] = j;
		i = j;
	}
	return (int64_t)k;
}

int64_t fdn_plan_runs(const int64_t *leaf, size_t nleaf, const int64_t *positions,
	size_t n, uint64_t *starts, size_t cap)
{
	size_t i, k = 0;
	int64_t prev = 0;

	if (cap < 1)	/* room for the end at least (n == 0) */
		return FDN_ESPACE;
	for (i = 0; i < n; i++) {
		int64_t l;

		if (positions[i] < 0 || (uint64_t)positions[i] >= nleaf)
			return FDN_EARG;
		l = leaf[positions[i]];
		if (i == 0 || l != prev + 1) {
			if (k + 1 >= cap)
				return FDN_ESPACE;
			starts[k++] = i;
		}
		prev = l;
	}
	starts[k++] = n;
	return (int64_t)k;
}
