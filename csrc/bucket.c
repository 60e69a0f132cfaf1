/*
 * bucket.c: the on-disk index, flushed in one sequential pass. Keys are
 * near-uniform hashes, so a key's home bucket is its top 64 bits scaled to
 * the bucket count: sorted entries map to ascending buckets, and a flush
 * walks the index once, front to back. A full bucket overflows into the
 * next (linear probing); a lookup stops at the first bucket not full.
 */
#define _GNU_SOURCE	/* qsort_r */
#include <stdlib.h>
#include "internal.h"

enum {
	COUNT = FDN_U32,	/* a bucket starts with its u32le entry count */
	ADDR = 8,		/* u64le log address after each key */
	RADIX_MIN = 4096,	/* sorted by their top bytes first once there are this many entries */
	SMALL = 24,		/* a digit's handful sorted by insertion up to this many */
	SORT_THREADS = 2,	/* the first-byte groups sorted on this many threads (64 k entries and up) */
	SORT_GRAIN = 16		/* fewest first-byte groups worth a thread's share */
};

uint64_t fdn_bucket_home(const uint8_t *key, size_t keylen, uint64_t nbuckets)
{
	uint8_t k[8] = { 0 };

	memcpy(k, key, keylen < sizeof k ? keylen : sizeof k);
	return (uint64_t)(((unsigned __int128)fdn_get64be(k) * nbuckets) >> 64);
}

/* A bucket of bsize bytes holds cap entries of keylen + 8 bytes; 0 if it cannot. */
static size_t capacity(size_t bsize, size_t keylen)
{
	if (keylen == 0 || bsize < COUNT)
		return 0;
	return (bsize - COUNT) / (keylen + ADDR);
}

int64_t fdn_bucket_find(const uint8_t *bucket, size_t bsize, size_t keylen,
	const uint8_t *key, uint64_t *out, size_t outcap)
{
	size_t cap = capacity(bsize, keylen), es = keylen + ADDR, found = 0;
	uint32_t count, i;

	if (keylen == 0 || bsize < COUNT)
		return FDN_EARG;
	if ((count = fdn_get32(bucket)) > cap)
		return FDN_EBUCKET;
	for (i = 0; i < count; i++) {
		const uint8_t *e = bucket + COUNT + i * es;
		if (memcmp(e, key, keylen) == 0) {
			if (found < outcap)
				out[found] = fdn_get64(e + keylen);
			found++;
		}
	}
	return (int64_t)found;
}

typedef struct {
	size_t keylen, entsize;
} order;

/* key bytes, then addr as a number, then any bytes after it */
static int cmp(const void *a, const void *b, void *arg)
{
	const order *o = arg;
	const uint8_t *x = a, *y = b;
	uint64_t ax, ay;
	int r;

	if ((r = memcmp(x, y, o->keylen)) != 0)
		return r;
	ax = fdn_get64(x + o->keylen);
	ay = fdn_get64(y + o->keylen);
	if (ax != ay)
		return ax < ay ? -1 : 1;
	return memcmp(x + o->keylen + ADDR, y + o->keylen + ADDR, o->entsize - o->keylen - ADDR);
}

/* memcpy of the two entry sizes in use inlined (hash and value mode): the sort's inner loop */
static inline void move(uint8_t *to, const uint8_t *from, size_t n)
{
	if (n == 40)
		memcpy(to, from, 40);
	else if (n == 16)
		memcpy(to, from, 16);
	else
		memcpy(to, from, n);
}

/* A handful of entries (one digit's) sorted by insertion: the order of cmp, with no call per
 * comparison and no qsort set-up per digit (~65 k digits a day 0's flush: qsort_r was most of it). */
static void insertion(uint8_t *ents, size_t n, size_t entsize, const order *o, uint8_t *hold)
{
	for (size_t i = 1; i < n; i++) {
		uint8_t *at = ents + i * entsize;
		size_t j = i;

		if (cmp(at - entsize, at, (void *)o) <= 0)
			continue;
		move(hold, at, entsize);
		do {
			move(ents + j * entsize, ents + (j - 1) * entsize, entsize);
			j--;
		} while (j > 0 && cmp(ents + (j - 1) * entsize, hold, (void *)o) > 0);
		move(ents + j * entsize, hold, entsize);
	}
}

/*
 * Distribute n entries in place by their byte `at` (American flag sort: cycles of swaps); end[d]
 * is then the end of digit d's entries. 256 digits: the places being filled stay in cache.
 */
static void flag(uint8_t *ents, size_t n, size_t entsize, size_t at, size_t end[256], uint8_t *hold,
	uint8_t *swap)
{
	size_t next[256], i;

	memset(next, 0, sizeof next);
	for (i = 0; i < n; i++)
		next[ents[i * entsize + at]]++;
	for (i = 0; i < 256; i++) {
		end[i] = (i ? end[i - 1] : 0) + next[i];
		next[i] = end[i] - next[i];	/* digit i's first place not yet settled */
	}
	for (size_t d = 0; d < 256; d++)
		while (next[d] < end[d]) {
			/* carry the entry at next[d] to its digit's next place, and the one found
			 * there on, until an entry of digit d comes back to fill next[d] */
			uint8_t *here = ents + next[d] * entsize, *t;
			size_t e = here[at];

			if (e == d) {
				next[d]++;
				continue;
			}
			move(hold, here, entsize);
			while (e != d) {
				uint8_t *to = ents + next[e]++ * entsize;
				size_t f = to[at];

				move(swap, to, entsize);
				move(to, hold, entsize);
				t = hold, hold = swap, swap = t;
				e = f;
			}
			move(here, hold, entsize);
			next[d]++;
		}
}

typedef struct {
	uint8_t *ents;
	const size_t *end;	/* the first byte's digits */
	order o;
} digits;

/* The entries of first-byte digits lo..hi, each group sorted in its own place (groups are
 * independent: any thread, any order): by the second byte, then each handful. */
static int sort_digits(void *arg, size_t lo, size_t hi)
{
	digits *d = arg;
	size_t es = d->o.entsize, sub[256];
	uint8_t *hold = malloc(2 * es);

	if (hold == NULL)
		return FDN_ENOMEM;
	for (size_t i = lo; i < hi; i++) {
		size_t a = i ? d->end[i - 1] : 0, n = d->end[i] - a;
		uint8_t *g = d->ents + a * es;
		if (n <= SMALL) {
			insertion(g, n, es, &d->o, hold);
			continue;
		}
		flag(g, n, es, 1, sub, hold, hold + es);
		for (size_t k = 0; k < 256; k++) {
			size_t b = k ? sub[k - 1] : 0, m = sub[k] - b;
			if (m <= 1)
				continue;
			if (m <= SMALL)
				insertion(g + b * es, m, es, &d->o, hold);
			else
				qsort_r(g + b * es, m, es, cmp, &d->o);
		}
	}
	free(hold);
	return FDN_OK;
}

/*
 * In place (a flush sorts the write buffer's own entries: no second copy of
 * them): hashes spread evenly, so distribute by the first byte, then each
 * group by the second (256 digits at a time: the places being filled stay in
 * cache, where 65,536 at once missed it at every move), then sort each
 * handful; the groups are shared by two threads (a day 0's flush is ~0.3 M
 * entries, at the end of the run, when nothing else is left to do).
 */
int fdn_sort_entries(uint8_t *ents, size_t len, size_t entsize, size_t keylen)
{
	order o = { keylen, entsize };
	size_t n, end[256];
	uint8_t *hold;
	digits dg;

	if (keylen == 0 || entsize < keylen + ADDR || len % entsize != 0)
		return FDN_EARG;
	n = len / entsize;
	if (n < RADIX_MIN || keylen < 2) {
		qsort_r(ents, n, entsize, cmp, &o);
		return FDN_OK;
	}
	if ((hold = malloc(2 * entsize)) == NULL)
		return FDN_ENOMEM;
	flag(ents, n, entsize, 0, end, hold, hold + entsize);
	free(hold);
	dg = (digits){ ents, end, o };
	return fdn_share(n >= 16 * RADIX_MIN ? SORT_THREADS : 1, 256, SORT_GRAIN, sort_digits, &dg);
}

typedef struct {
	uint8_t *region;
	uint64_t first, nregion, nbuckets;
	size_t bsize, keylen, cap;
} index_region;

static int region_init(index_region *r, uint8_t *region, size_t rlen, uint64_t first,
	uint64_t nregion, size_t bsize, size_t keylen, uint64_t nbuckets)
{
	*r = (index_region){ region, first, nregion, nbuckets, bsize, keylen,
		capacity(bsize, keylen) };
	if (r->cap == 0 || nbuckets == 0 || first > nbuckets ||
	    nregion > nbuckets - first || nregion > rlen / bsize)
		return FDN_EARG;
	return FDN_OK;
}

static uint8_t *bucket(const index_region *r, uint64_t b)
{
	return r->region + (b - r->first) * r->bsize;
}

/* Whether bucket b's first count entries hold ent. */
static int has(const index_region *r, const uint8_t *b, const uint8_t *ent, uint32_t count)
{
	size_t es = r->keylen + ADDR;

	for (uint32_t i = 0; i < count; i++)
		if (memcmp(b + COUNT + i * es, ent, es) == 0)
			return 1;
	return 0;
}

/*
 * An entry already in its bucket is not added again (merging is idempotent:
 * a flush cut short is merged again). Only the entries a bucket held before
 * the call need a look: of sorted entries, those this call put there differ
 * from the one being merged, but for an exact repeat, which comes right after
 * its twin (then, or if the entries turn out unsorted, or without memory for
 * the counts, every entry is looked at, as the rule says). A day 0's flush
 * into a new index thus compares nothing, where it compared each entry with
 * ~25 others.
 */
int64_t fdn_merge(uint8_t *region, size_t rlen, uint64_t first,
	uint64_t nregion, size_t bsize, size_t keylen, const uint8_t *ents,
	size_t elen, uint64_t nbuckets, uint8_t *spill, size_t spillcap)
{
	size_t es = keylen + ADDR, nspill = 0, i;
	uint64_t end = first + nregion, b;
	uint32_t *before;
	int sorted = 1;
	index_region r;

	if (region_init(&r, region, rlen, first, nregion, bsize, keylen, nbuckets) != FDN_OK ||
	    elen % es != 0 || spillcap < elen)
		return FDN_EARG;
	for (b = first; b < end; b++)	/* refuse a damaged region before changing it */
		if (fdn_get32(bucket(&r, b)) > r.cap)
			return FDN_EBUCKET;
	if ((before = malloc(nregion * sizeof *before + 1)) != NULL)
		for (b = first; b < end; b++)
			before[b - first] = fdn_get32(bucket(&r, b));
	for (i = 0; i < elen; i += es) {
		const uint8_t *e = ents + i;
		int all = before == NULL;
		if (i > 0 && !all) {
			const uint8_t *p = e - es;
			int c = memcmp(p, e, keylen);
			if (c > 0 || (c == 0 && fdn_get64(p + keylen) > fdn_get64(e + keylen)))
				sorted = 0;
			all = !sorted || memcmp(p, e, es) == 0;
		}
		b = fdn_bucket_home(e, keylen, nbuckets);
		if (b < first)
			b = first;	/* a spill carried from the region before */
		for (; b < end; b++) {
			uint8_t *bk = bucket(&r, b);
			uint32_t count = fdn_get32(bk);
			if (has(&r, bk, e, all ? count : before[b - first]))
				break;	/* already flushed: merging is idempotent */
			if (count < r.cap) {
				memcpy(bk + COUNT + count * es, e, es);
				fdn_put32(bk, count + 1);
				break;
			}
		}
		if (b >= end) {
			memcpy(spill + nspill, e, es);
			nspill += es;
		}
	}
	free(before);
	return (int64_t)nspill;
}

int64_t fdn_lookup(const uint8_t *region, size_t rlen, uint64_t first,
	uint64_t nregion, size_t bsize, size_t keylen, const uint8_t *key,
	uint64_t nbuckets, uint64_t *out, size_t outcap, int *more)
{
	uint64_t end = first + nregion, b;
	size_t found = 0;
	index_region r;

	*more = 0;
	if (region_init(&r, (uint8_t *)region, rlen, first, nregion, bsize, keylen, nbuckets) != FDN_OK)
		return FDN_EARG;
	b = fdn_bucket_home(key, keylen, nbuckets);
	if (b < first)
		b = first;	/* continuing a search from the region before */
	if (b >= end)
		return FDN_EARG;
	for (; b < end; b++) {
		const uint8_t *bk = bucket(&r, b);
		int64_t k = fdn_bucket_find(bk, bsize, keylen, key,
			out + (found < outcap ? found : outcap), found < outcap ? outcap - found : 0);
		if (k < 0)
			return k;
		found += (size_t)k;
		if (fdn_get32(bk) < r.cap)
			return (int64_t)found;
	}
	*more = end < nbuckets;
	return (int64_t)found;
}
