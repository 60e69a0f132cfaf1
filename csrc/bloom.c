/*
 * bloom.c: keys set in the Bloom filter file pybloomfiltermmap3 made, from a
 * batch, with the GIL released. Its filter adds one key per Python call (a
 * tenth of a day 0's Python time); this sets the very bits its add() sets,
 * in the same file, so its own test (`in`) answers for them unchanged; and
 * tests a batch of keys the same way (fdn_bloom_test), through the mapping
 * the adds use: its test would touch every page of the filter through a
 * second mapping of the file, and a page mapped twice is counted twice in
 * the process's memory (a night's peak held the filter twice, ~1.4 MB).
 *
 * Its rule, for each seed s of the filter: h = MurmurHash3_x64_128(key, s),
 * bit (h[0] ^ h[1]) mod nbits of the array of host-order u32 words that
 * follows the file's preamble. The file ends with the byte of the last bit,
 * not a whole word, so the bits are set a byte at a time. MurmurHash3 is
 * Austin Appleby's, public domain.
 */
#include "internal.h"

static inline uint64_t rotl64(uint64_t x, int r)
{
	return x << r | x >> (64 - r);
}

static inline uint64_t fmix64(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdULL;
	k ^= k >> 33;
	k *= 0xc4ceb9fe1a85ec53ULL;
	k ^= k >> 33;
	return k;
}

static inline uint64_t get64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, sizeof v);	/* host order, as the reference reads its blocks */
	return v;
}

/* MurmurHash3_x64_128(key, len, seed): its two halves XORed, as the filter uses them */
static uint64_t murmur(const uint8_t *key, size_t len, uint32_t seed)
{
	const uint64_t c1 = 0x87c37b91114253d5ULL, c2 = 0x4cf5ad432745937fULL;
	uint64_t h1 = seed, h2 = seed, k1, k2;
	size_t i, nblocks = len / 16;
	const uint8_t *tail = key + nblocks * 16;

	for (i = 0; i < nblocks; i++) {
		k1 = get64(key + 16 * i);
		k2 = get64(key + 16 * i + 8);
		k1 *= c1; k1 = rotl64(k1, 31); k1 *= c2; h1 ^= k1;
		h1 = rotl64(h1, 27); h1 += h2; h1 = h1 * 5 + 0x52dce729;
		k2 *= c2; k2 = rotl64(k2, 33); k2 *= c1; h2 ^= k2;
		h2 = rotl64(h2, 31); h2 += h1; h2 = h2 * 5 + 0x38495ab5;
	}
	k1 = k2 = 0;
	switch (len & 15) {
	case 15: k2 ^= (uint64_t)tail[14] << 48; /* fall through */
	case 14: k2 ^= (uint64_t)tail[13] << 40; /* fall through */
	case 13: k2 ^= (uint64_t)tail[12] << 32; /* fall through */
	case 12: k2 ^= (uint64_t)tail[11] << 24; /* fall through */
	case 11: k2 ^= (uint64_t)tail[10] << 16; /* fall through */
	case 10: k2 ^= (uint64_t)tail[9] << 8; /* fall through */
	case 9: k2 ^= (uint64_t)tail[8];
		k2 *= c2; k2 = rotl64(k2, 33); k2 *= c1; h2 ^= k2; /* fall through */
	case 8: k1 ^= (uint64_t)tail[7] << 56; /* fall through */
	case 7: k1 ^= (uint64_t)tail[6] << 48; /* fall through */
	case 6: k1 ^= (uint64_t)tail[5] << 40; /* fall through */
	case 5: k1 ^= (uint64_t)tail[4] << 32; /* fall through */
	case 4: k1 ^= (uint64_t)tail[3] << 24; /* fall through */
	case 3: k1 ^= (uint64_t)tail[2] << 16; /* fall through */
	case 2: k1 ^= (uint64_t)tail[1] << 8; /* fall through */
	case 1: k1 ^= (uint64_t)tail[0];
		k1 *= c1; k1 = rotl64(k1, 31); k1 *= c2; h1 ^= k1;
	}
	h1 ^= len;
	h2 ^= len;
	h1 += h2;
	h2 += h1;
	h1 = fmix64(h1);
	h2 = fmix64(h2);
	h1 += h2;
	h2 += h1;
	return h1 ^ h2;
}

/* The bytes of the bit array that hold bits 0..nbits-1. */
size_t fdn_bloom_bytes(uint64_t nbits)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	return (size_t)((nbits + 7) / 8);
#else
	return (size_t)((nbits + 31) / 32 * 4);
#endif
}

enum { AHEAD = 16 };	/* keys whose bits are found, and their bytes fetched, before any is set */

/* Where bit lies in the file's bytes. */
static inline size_t bit_byte(uint64_t bit)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	return (size_t)(bit / 8);	/* bit % 32 of u32 word bit / 32 */
#else
	return (size_t)(bit / 32 * 4 + 3 - bit % 32 / 8);
#endif
}

/* Set bit (set), or say whether it is set. */
static inline uint8_t touch(uint8_t *words, uint64_t bit, int set)
{
	if (set) {
		words[bit_byte(bit)] |= (uint8_t)(1u << (bit % 8));
		return 1;
	}
	return words[bit_byte(bit)] >> (bit % 8) & 1;
}

/*
 * A batch's bits fall all over a filter of many MB: each is a cache miss,
 * often a page not yet mapped in. So AHEAD keys' bits are found first and
 * their bytes asked for (prefetch), then set or tested, the misses of those
 * keys overlapping instead of met one after the other. maybe NULL: set the
 * keys' bits; else maybe[k] = 1 if every bit of key k is set (the filter's
 * `in`), and nothing is written.
 */
static int walk(uint8_t *words, size_t wordslen, uint64_t nbits, const uint32_t *seeds,
	size_t nseeds, const uint8_t *keys, size_t keyslen, size_t keylen, size_t step, uint8_t *maybe)
{
	size_t at[AHEAD * 32], i, s, k, m;
	int set = maybe == NULL;

	if (nbits == 0 || fdn_bloom_bytes(nbits) > wordslen ||
	    keylen == 0 || step < keylen || keyslen % step || nseeds == 0)
		return FDN_EARG;
	for (i = 0; i < keyslen; i += m * step) {
		size_t per = nseeds < 32 ? AHEAD : 1;
		m = (keyslen - i) / step < per ? (keyslen - i) / step : per;
		for (k = 0; k < m; k++) {
			uint8_t all = 1;
			for (s = nseeds; s-- > 0;) {	/* the filter's own order (the bits are the same in any) */
				uint64_t bit = murmur(keys + i + k * step, keylen, seeds[s]) % nbits;
				if (per == 1) {	/* too many seeds to hold: no look ahead */
					all &= touch(words, bit, set);
					continue;
				}
				at[k * nseeds + s] = (size_t)bit;
				if (set)
					__builtin_prefetch(words + bit_byte(bit), 1);
				else
					__builtin_prefetch(words + bit_byte(bit), 0);
			}
			if (per == 1 && !set)
				maybe[i / step + k] = all;
		}
		if (per == 1)
			continue;
		for (k = 0; k < m; k++) {
			uint8_t all = 1;
			for (s = 0; s < nseeds; s++)
				all &= touch(words, at[k * nseeds + s], set);
			if (!set)
				maybe[i / step + k] = all;
		}
	}
	return FDN_OK;
}

int fdn_bloom_add(uint8_t *words, size_t wordslen, uint64_t nbits, const uint32_t *seeds,
	size_t nseeds, const uint8_t *keys, size_t keyslen, size_t keylen, size_t step)
{
	return walk(words, wordslen, nbits, seeds, nseeds, keys, keyslen, keylen, step, NULL);
}

/* maybe[k] = 1 if every bit of key k is set (the filter may hold it: what its `in` answers), else 0. */
int fdn_bloom_test(const uint8_t *words, size_t wordslen, uint64_t nbits, const uint32_t *seeds,
	size_t nseeds, const uint8_t *keys, size_t keyslen, size_t keylen, size_t step, uint8_t *maybe)
{
	/* (walk writes nothing when it is given maybe) */
	return walk((uint8_t *)words, wordslen, nbits, seeds, nseeds, keys, keyslen, keylen, step, maybe);
}
