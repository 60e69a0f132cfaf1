/*
 * internal.h: what the C files share and Python never sees.
 *
 * The record header's field offsets are derived from the field sizes, so
 * the layout is written down once. Hashing goes through OpenSSL EVP with
 * algorithms fetched once per process and contexts reused per thread, but
 * for the scores of a batch and of a deep check: four at a time on the
 * CPU's SHA instructions (lanes.c) where it has them.
 */
#ifndef FDN_INTERNAL_H
#define FDN_INTERNAL_H

#include <string.h>
#include <openssl/evp.h>
#include "foundation.h"

enum {
	FDN_U8 = 1, FDN_U16 = 2, FDN_U32 = 4,
	FDN_MAGIC_SIZE = 4,
	/* record header, all integers little-endian */
	FDN_H_MAGIC = 0,
	FDN_H_BTYPE = FDN_H_MAGIC + FDN_MAGIC_SIZE,
	FDN_H_CODEC = FDN_H_BTYPE + FDN_U8,
	FDN_H_RESERVED = FDN_H_CODEC + FDN_U8,
	FDN_H_SLEN = FDN_H_RESERVED + FDN_U16,
	FDN_H_RLEN = FDN_H_SLEN + FDN_U32,
	FDN_H_KEY = FDN_H_RLEN + FDN_U32,
	FDN_H_TAG = FDN_H_KEY + FDN_SCORE_SIZE,
	FDN_H_END = FDN_H_TAG + FDN_TAG_SIZE,
	FDN_H_RUNJ = FDN_H_RESERVED,		/* codec 2: the record's place j in its run */
	FDN_H_RUNK = FDN_H_RESERVED + FDN_U8,	/* codec 2: the run's length k */
	FDN_CODEC_RAW = 0,
	FDN_CODEC_ZSTD = 1,
	FDN_CODEC_RUN = 2
};
_Static_assert((int)FDN_H_END == (int)FDN_HEADER_SIZE, "header fields must sum to FDN_HEADER_SIZE");

#define FDN_MAGIC "FDNr"
#define FDN_ARENA_MAX ((uint64_t)1 << 32)	/* arena offsets are u32 */

static inline uint32_t fdn_get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void fdn_put32(uint8_t *p, uint32_t v)
{
	p[0] = v; p[1] = v >> 8; p[2] = v >> 16; p[3] = v >> 24;
}

static inline uint64_t fdn_get64(const uint8_t *p)
{
	return (uint64_t)fdn_get32(p) | (uint64_t)fdn_get32(p + 4) << 32;
}

static inline void fdn_put64(uint8_t *p, uint64_t v)
{
	fdn_put32(p, (uint32_t)v);
	fdn_put32(p + 4, (uint32_t)(v >> 32));
}

static inline uint64_t fdn_get64be(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v = v << 8 | p[i];
	return v;
}

static inline void fdn_put32be(uint8_t *p, uint32_t v)
{
	p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

static inline void fdn_put64be(uint8_t *p, uint64_t v)
{
	for (int i = 7; i >= 0; i--, v >>= 8)
		p[i] = (uint8_t)v;
}

/* core.c */
int fdn_init(void);
extern EVP_MD *fdn_sha256;
extern EVP_CIPHER *fdn_aes_ctr;
extern EVP_MAC *fdn_poly1305;
int fdn_nblocks(size_t len, size_t bs, size_t *n);

typedef int (*fdn_job)(void *arg, size_t lo, size_t hi);
int fdn_parallel(int threads, size_t n, size_t grain, fdn_job fn, void *arg);
int fdn_share(int threads, size_t n, size_t grain, fdn_job fn, void *arg);

/* An HMAC-SHA256 key with ipad and opad already absorbed: keyed once, then
 * each message costs a context copy instead of two extra compressions. */
typedef struct {
	EVP_MD_CTX *in;
	EVP_MD_CTX *out;
	uint32_t ih[8], oh[8];	/* the same two states for lanes.c, when the CPU has lanes */
} fdn_hkey;

int fdn_hkey_init(fdn_hkey *k, const uint8_t *key, size_t len);
void fdn_hkey_free(fdn_hkey *k);
int fdn_hmac_begin(const fdn_hkey *k, EVP_MD_CTX *c);
int fdn_hmac_end(const fdn_hkey *k, EVP_MD_CTX *c, uint8_t out[FDN_SCORE_SIZE]);

/* hash.c: a block's score (key NULL: plain SHA-256) */
int fdn_score(const fdn_hkey *key, EVP_MD_CTX *c, uint8_t btype,
	const uint8_t *b, size_t len, uint8_t out[FDN_SCORE_SIZE]);

/* lanes.c: SHA-256 of four equal-length messages at once (fdn_lanes_ok() says whether here);
 * fdn_clean_upper() before SHA instructions (see there), once fdn_lanes_cpu() has been asked */
void fdn_clean_upper(void);
int fdn_lanes_cpu(void);
int fdn_lanes_ok(void);
void fdn_lanes_prefix(const uint8_t pad[64], uint32_t h[8]);
void fdn_lanes4(const fdn_hkey *key, uint8_t btype, const uint8_t *const msg[4], size_t len,
	uint8_t *const dig[4]);

#endif
