/*
 * lanes.c: four SHA-256 messages at once, on the CPU's SHA instructions.
 *
 * The one design decision: scores are computed four blocks at a time, the
 * rounds of the four interleaved, because one message's rounds are a chain
 * each waiting on the one before (sha256rnds2's latency), which leaves the
 * unit idle most cycles; four chains side by side keep it busy. OpenSSL
 * hashes one message at a time: the scores of 4 KiB blocks under HMAC ran
 * at 2.0 GB/s a core here, four lanes at 3.5 GB/s; day 0 and a first
 * archive took 7-10 % less CPU, a deep verify 27 % (benchmarks/README.md,
 * wave 19). A batch's blocks (fdn_scores) and a deep check's records of
 * one length and type (fdn_check) go through here, continuing from a
 * prefix state (the HMAC inner pad's) and, keyed, finishing with the outer
 * pad's; the digests are SHA-256's, bit for bit, which the tests check
 * against Python's on every length class of the padding. Where the CPU
 * has no SHA instructions fdn_lanes_ok() is 0 and callers use OpenSSL.
 */
#include "internal.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>

static const uint32_t K[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
	0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
	0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
	0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
	0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2
};

static const uint32_t H0[8] = {
	0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19
};

#define SHA __attribute__((target("sha,sse4.1,ssse3")))

#define EACH(X) X(0) X(1) X(2) X(3)
#define STEP(j) ADDK(j) RND1(j) HIGH(j) RND2(j)
#define SCH(j) MSG1(j) MSGA(j) MSG2(j)
#define ADDK(j) t##j = _mm_add_epi32(w##j[R & 3], k);
#define RND1(j) c##j = _mm_sha256rnds2_epu32(c##j, a##j, t##j);
#define HIGH(j) t##j = _mm_shuffle_epi32(t##j, 0x0E);
#define RND2(j) a##j = _mm_sha256rnds2_epu32(a##j, c##j, t##j);
#define MSG1(j) t##j = _mm_sha256msg1_epu32(w##j[R & 3], w##j[(R + 1) & 3]);
#define MSGA(j) t##j = _mm_add_epi32(t##j, _mm_alignr_epi8(w##j[(R + 3) & 3], w##j[(R + 2) & 3], 4));
#define MSG2(j) w##j[R & 3] = _mm_sha256msg2_epu32(t##j, w##j[(R + 3) & 3]);
/* Round group r (4 rounds) of each lane in turn: the four chains are independent, so the CPU runs
 * them side by side (written step by step across the lanes instead, this ran 10 % slower). w holds
 * words 4r..4r+3 and, for r < 12, becomes words 4r+16..4r+19 (the schedule needs the four vectors
 * before it). */
#define GROUP(r) { \
	enum { R = (r) }; \
	const __m128i k = _mm_loadu_si128((const __m128i *)&K[4 * R]); \
	EACH(STEP) \
	if (R < 12) { EACH(SCH) } \
}
#define LOAD(j) \
	a##j##0 = a##j; c##j##0 = c##j; \
	w##j[0] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p[j] + o)), swap); \
	w##j[1] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p[j] + o + 16)), swap); \
	w##j[2] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p[j] + o + 32)), swap); \
	w##j[3] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p[j] + o + 48)), swap);
#define ADD(j) a##j = _mm_add_epi32(a##j, a##j##0); c##j = _mm_add_epi32(c##j, c##j##0);

/* Compress nblk 64-byte blocks of each lane, lane j's read from p[j]. The state is held in
 * locals (a = A, B, E, F and c = C, D, G, H, as the instructions want it), one set per lane:
 * through the pointers every load of p's bytes might alias it. */
SHA static void compress(__m128i as[4], __m128i cs[4], const uint8_t *const p[4], size_t nblk)
{
	const __m128i swap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
	__m128i a0 = as[0], a1 = as[1], a2 = as[2], a3 = as[3];
	__m128i c0 = cs[0], c1 = cs[1], c2 = cs[2], c3 = cs[3];
	__m128i a00, a10, a20, a30, c00, c10, c20, c30, t0, t1, t2, t3;
	__m128i w0[4], w1[4], w2[4], w3[4];

	for (size_t o = 0; o < 64 * nblk; o += 64) {
		EACH(LOAD)
		GROUP(0) GROUP(1) GROUP(2) GROUP(3) GROUP(4) GROUP(5) GROUP(6) GROUP(7)
		GROUP(8) GROUP(9) GROUP(10) GROUP(11) GROUP(12) GROUP(13) GROUP(14) GROUP(15)
		EACH(ADD)
	}
	as[0] = a0; as[1] = a1; as[2] = a2; as[3] = a3;
	cs[0] = c0; cs[1] = c1; cs[2] = c2; cs[3] = c3;
}

SHA static void load(__m128i *a, __m128i *c, const uint32_t h[8])
{
	*a = _mm_set_epi32((int)h[0], (int)h[1], (int)h[4], (int)h[5]);
	*c = _mm_set_epi32((int)h[2], (int)h[3], (int)h[6], (int)h[7]);
}

SHA static void unload(__m128i a, __m128i c, uint32_t h[8])
{
	uint32_t x[4], y[4];

	_mm_storeu_si128((__m128i *)x, a);
	_mm_storeu_si128((__m128i *)y, c);
	h[0] = x[3]; h[1] = x[2]; h[4] = x[1]; h[5] = x[0];
	h[2] = y[3]; h[3] = y[2]; h[6] = y[1]; h[7] = y[0];
}

static void put_digest(const uint32_t h[8], uint8_t *d)
{
	for (int i = 0; i < 8; i++)
		fdn_put32be(d + 4 * i, h[i]);
}

/* The state after the 64-byte block pad, from SHA-256's initial one (an HMAC key pad). */
SHA void fdn_lanes_prefix(const uint8_t pad[64], uint32_t h[8])
{
	__m128i a[4], c[4];
	const uint8_t *p[4] = { pad, pad, pad, pad };

	for (int j = 0; j < 4; j++)
		load(&a[j], &c[j], H0);
	compress(a, c, p, 1);
	unload(a[0], c[0], h);
}

static int cpu = -1;	/* -1: not asked yet */
static int upper;	/* the CPU has AVX registers (and the OS saves them) */
static int off;		/* turned off by fdn_lanes(0) */

/* vzeroupper. Code before (OpenSSL's, glibc's) may leave the upper halves of the vector registers
 * in use; the SHA instructions, which exist only in the old SSE encoding, then ran here a deep
 * check's scores slower than OpenSSL (25.5 against 22.3 ms for 4,096 records; cleared, 16 ms), and
 * OpenSSL's own SHA-256 paid the same (an HMAC-tagged seal: 15 %). */
__attribute__((target("avx"))) static void clear(void)
{
	_mm256_zeroupper();
}

void fdn_clean_upper(void)
{
	if (cpu < 0)
		fdn_lanes_cpu();
	if (upper)
		clear();
}

/*
 * The scores of btype || msg[j] (len bytes each) for j < 4: SHA-256, or
 * HMAC-SHA256 under key, continuing from its inner pad's state (64 bytes
 * hashed) and hashing each inner digest once more from its outer pad's.
 */
SHA void fdn_lanes4(const fdn_hkey *key, uint8_t btype, const uint8_t *const msg[4], size_t len,
	uint8_t *const dig[4])
{
	const uint64_t done = key ? 64 : 0;
	__m128i a[4], c[4];
	uint8_t tail[4][128];
	const uint8_t *p[4];
	uint32_t h[8];
	size_t used = 0, k, nb;
	int j;

	fdn_clean_upper();
	for (j = 0; j < 4; j++) {
		load(&a[j], &c[j], key ? key->ih : H0);
		tail[j][0] = btype;
		p[j] = tail[j];
	}
	if (len >= 63) {
		/* the first block is the type byte and 63 of the message's; the rest go straight */
		for (j = 0; j < 4; j++)
			memcpy(tail[j] + 1, msg[j], 63);
		compress(a, c, p, 1);
		used = 63;
		for (j = 0; j < 4; j++)
			p[j] = msg[j] + used;
		compress(a, c, p, (len - used) / 64);
		used += (len - used) / 64 * 64;
		k = len - used;
		for (j = 0; j < 4; j++) {
			memcpy(tail[j], msg[j] + used, k);
			p[j] = tail[j];
		}
	} else {
		for (j = 0; j < 4; j++)
			memcpy(tail[j] + 1, msg[j], len);
		k = len + 1;
	}
	/* padding: 0x80, zeros, the message's length in bits, big-endian, ending a block */
	nb = k + 9 <= 64 ? 1 : 2;
	for (j = 0; j < 4; j++) {
		tail[j][k] = 0x80;
		memset(tail[j] + k + 1, 0, nb * 64 - k - 9);
		fdn_put64be(tail[j] + nb * 64 - 8, (done + 1 + len) * 8);
	}
	compress(a, c, p, nb);
	if (key) {
		for (j = 0; j < 4; j++) {
			unload(a[j], c[j], h);
			put_digest(h, tail[j]);
			tail[j][FDN_SCORE_SIZE] = 0x80;
			memset(tail[j] + FDN_SCORE_SIZE + 1, 0, 64 - FDN_SCORE_SIZE - 9);
			fdn_put64be(tail[j] + 56, (64 + FDN_SCORE_SIZE) * 8);
			load(&a[j], &c[j], key->oh);
		}
		compress(a, c, p, 1);
	}
	for (j = 0; j < 4; j++) {
		unload(a[j], c[j], h);
		put_digest(h, dig[j]);
	}
}

int fdn_lanes_cpu(void)
{
	unsigned int ax, bx, cx, dx, lo, hi;

	if (cpu < 0) {
		if (!__get_cpuid(1, &ax, &bx, &cx, &dx))
			return cpu = 0;
		if ((cx & bit_OSXSAVE) && (cx & bit_AVX)) {
			__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
			upper = (lo & 6) == 6;	/* the OS saves the SSE and AVX state */
		}
		cpu = (cx & bit_SSE4_1) && (cx & bit_SSSE3) &&
			__get_cpuid_count(7, 0, &ax, &bx, &cx, &dx) && (bx & (1u << 29));	/* SHA */
	}
	return cpu;
}

int fdn_lanes_ok(void)
{
	return !off && fdn_lanes_cpu();
}

/* Turn the lanes off (0) or back on where the CPU has them (1) -> whether they are on: tests and
 * benchmarks compare both ways. */
int fdn_lanes(int on)
{
	off = !on;
	return fdn_lanes_ok();
}

#else

void fdn_clean_upper(void)
{
}

int fdn_lanes_cpu(void)
{
	return 0;
}

int fdn_lanes_ok(void)
{
	return 0;
}

int fdn_lanes(int on)
{
	(void)on;
	return 0;
}

void fdn_lanes_prefix(const uint8_t pad[64], uint32_t h[8])
{
	(void)pad, (void)h;
}

void fdn_lanes4(const fdn_hkey *key, uint8_t btype, const uint8_t *const msg[4], size_t len,
	uint8_t *const dig[4])
{
	(void)key, (void)btype, (void)msg, (void)len, (void)dig;
}

#endif
