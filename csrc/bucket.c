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
	RADIX = 1 << 16,	/* sort by the top 16 bits first... */
	RADIX_MIN = 4096	/* ...once there are this many entries */
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

/*
 * In place (a flush sorts the write buffer's own entries: no second copy of
 * them): hashes spread evenly, so distribute by the top 16 bits with cycles
 * of swaps (American flag sort), then sort each handful.
 */
int fdn_sort_entries(uint8_t *ents, size_t len, size_t entsize, size_t keylen)
{
	order o = { keylen, entsize };
	size_t n, i, *end, *next;
	uint8_t *hold, *swap;

	if (keylen == 0 || entsize < keylen + ADDR || len % entsize != 0)
		return FDN_EARG;
	n = len / entsize;
	if (n < RADIX_MIN || keylen < 2) {
		qsort_r(ents, n, entsize, cmp, &o);
		return FDN_OK;
	}
	end = calloc(RADIX, sizeof *end);
	next = malloc(RADIX * sizeof *next);
	hold = malloc(2 * entsize);
	if (end == NULL || next == NULL || hold == NULL) {
		free(end);
		free(next);
		free(hold);
		return FDN_ENOMEM;
	}
	swap = hold + entsize;	/* (the two trade places as the cycle goes on) */
	for (i = 0; i < n; i++)
		end[ents[i * entsize] << 8 | ents[i * entsize + 1]]++;
	for (i = 0; i < RADIX; i++) {
		next[i] = i ? end[i - 1] : 0;	/* digit i's first place not yet settled */
		end[i] += next[i];
	}
	for (size_t d = 0; d < RADIX; d++)
		while (next[d] < end[d]) {
			/* carry the entry at next[d] to its digit's next place, and the one found
			 * there on, until an entry of digit d comes back to fill next[d] */
			uint8_t *at = ents + next[d] * entsize;
			size_t e = at[0] << 8 | at[1];

			if (e == d) {
				next[d]++;
				continue;
			}
			move(hold, at, entsize);
			while (e != d) {
				uint8_t *to = ents + next[e]++ * entsize, *t;
				size_t f = to[0] << 8 | to[1];

				move(swap, to, entsize);
				move(to, hold, entsize);
				t = hold, hold = swap, swap = t;
				e = f;
			}
			move(at, hold, entsize);
			next[d]++;
		}
	for (i = 0; i < RADIX; i++) {
		size_t lo = i ? end[i - 1] : 0;
		if (end[i] - lo > 1)
			qsort_r(ents + lo * entsize, end[i] - lo, entsize, cmp, &o);
	}
	free(end);
	free(next);
	free(hold < swap ? hold : swap);
	return FDN_OK;
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

static int has(const index_region *r, const uint8_t *b, const uint8_t *ent)
{
	uint32_t count = fdn_get32(b);
	size_t es = r->keylen + ADDR;

	for (uint32_t i = 0; i < count; i++)
		if (memcmp(b + COUNT + i * es, ent, es) == 0)
			return 1;
	return 0;
}

int64_t fdn_merge(uint8_t *region, size_t rlen, uint64_t first,
	uint64_t nregion, size_t bsize, size_t keylen, const uint8_t *ents,
	size_t elen, uint64_t nbuckets, uint8_t *spill, size_t spillcap)
{
	size_t es = keylen + ADDR, nspill = 0, i;
	uint64_t end = first + nregion, b;
	index_region r;

	if (region_init(&r, region, rlen, first, nregion, bsize, keylen, nbuckets) != FDN_OK ||
	    elen % es != 0 || spillcap < elen)
		return FDN_EARG;
	for (b = first; b < end; b++)	/* refuse a damaged region before changing it */
		if (fdn_get32(bucket(&r, b)) > r.cap)
			return FDN_EBUCKET;
	for (i = 0; i < elen; i += es) {
		const uint8_t *e = ents + i;
		b = fdn_bucket_home(e, keylen, nbuckets);
		if (b < first)
			b = first;	/* a spill carried from the region before */
		for (; b < end; b++) {
			uint8_t *bk = bucket(&r, b);
			uint32_t count = fdn_get32(bk);
			if (has(&r, bk, e))
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
