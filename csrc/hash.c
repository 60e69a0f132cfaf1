/*
 * hash.c: naming blocks. A block's score is SHA-256 (or HMAC-SHA256 under
 * the store key) of its type byte and its bytes; a weak hash is a cheap
 * 64-bit mix used only to find candidate duplicates, which compare-by-value
 * then checks byte by byte, so its collisions cost time, never data.
 */
#include "internal.h"

int fdn_zero_flags(const uint8_t *buf, size_t len, size_t bs,
	uint8_t *out, size_t outlen)
{
	size_t n, i, blen;

	if (fdn_nblocks(len, bs, &n) != FDN_OK || outlen != n)
		return FDN_EARG;
	blen = bs == len ? len : bs;
	for (i = 0; i < n; i++) {
		const uint8_t *b = buf + i * blen;
		out[i] = blen == 0 || (b[0] == 0 && memcmp(b, b + 1, blen - 1) == 0);
	}
	return FDN_OK;
}

typedef struct {
	const uint8_t *buf;
	size_t blen;
	uint8_t btype;
	const fdn_hkey *key;	/* NULL: plain SHA-256 */
	const uint8_t *skip;
	uint8_t *out;
} scorejob;

static int score_range(void *arg, size_t lo, size_t hi)
{
	scorejob *j = arg;
	EVP_MD_CTX *c = EVP_MD_CTX_new();
	const uint8_t *msg[4];
	uint8_t *dig[4];
	int rc = c ? FDN_OK : FDN_ENOMEM, lanes = fdn_lanes_ok(), m = 0;

	for (size_t i = lo; i < hi && rc == FDN_OK; i++) {
		uint8_t *o = j->out + i * FDN_SCORE_SIZE;
		if (j->skip && j->skip[i]) {
			memset(o, 0, FDN_SCORE_SIZE);
			continue;
		}
		if (!lanes) {
			rc = fdn_score(j->key, c, j->btype, j->buf + i * j->blen, j->blen, o);
			continue;
		}
		/* four at a time; the last up to three, one at a time */
		msg[m] = j->buf + i * j->blen;
		dig[m++] = o;
		if (m == 4) {
			fdn_lanes4(j->key, j->btype, msg, j->blen, dig);
			m = 0;
		}
	}
	for (int k = 0; k < m && rc == FDN_OK; k++)
		rc = fdn_score(j->key, c, j->btype, msg[k], j->blen, dig[k]);
	EVP_MD_CTX_free(c);
	return rc;
}

/* The score of one block: SHA-256, or HMAC-SHA256 under key, of btype and the bytes. */
int fdn_score(const fdn_hkey *key, EVP_MD_CTX *c, uint8_t btype,
	const uint8_t *b, size_t len, uint8_t out[FDN_SCORE_SIZE])
{
	int rc;

	fdn_clean_upper();
	if (key) {
		rc = fdn_hmac_begin(key, c);
		if (rc == FDN_OK && !(EVP_DigestUpdate(c, &btype, 1) && EVP_DigestUpdate(c, b, len)))
			rc = FDN_ECRYPTO;
		return rc == FDN_OK ? fdn_hmac_end(key, c, out) : rc;
	}
	if (!EVP_DigestInit_ex2(c, fdn_sha256, NULL) || !EVP_DigestUpdate(c, &btype, 1) ||
	    !EVP_DigestUpdate(c, b, len) || !EVP_DigestFinal_ex(c, out, NULL))
		return FDN_ECRYPTO;
	return FDN_OK;
}

int fdn_scores(const uint8_t *buf, size_t len, size_t bs, int btype,
	const uint8_t *key, size_t keylen, int keyed,
	const uint8_t *skip, size_t nskip,
	uint8_t *out, size_t outlen, int threads)
{
	scorejob j = { buf, bs == len ? len : bs, (uint8_t)btype, NULL, skip, out };
	fdn_hkey hk;
	size_t n;
	int rc;

	if (fdn_nblocks(len, bs, &n) != FDN_OK || outlen / FDN_SCORE_SIZE != n ||
	    outlen % FDN_SCORE_SIZE != 0 || (skip && nskip != n) ||
	    btype < 0 || btype > 255 || (keyed && key == NULL && keylen != 0))
		return FDN_EARG;
	if ((rc = fdn_init()) != FDN_OK)
		return rc;
	if (keyed) {
		if ((rc = fdn_hkey_init(&hk, key, keylen)) != FDN_OK)
			return rc;
		j.key = &hk;
	}
	rc = fdn_share(threads, n, 64, score_range, &j);
	if (keyed)
		fdn_hkey_free(&hk);
	return rc;
}

enum { WORD = 8 };

static inline uint64_t rotl64(uint64_t x, int r)
{
	return x << r | x >> (64 - r);
}

/* The weak hash; reference.py states it in Python, word for word. */
static uint64_t weak(const uint8_t *b, size_t len, int btype, uint64_t seed)
{
	const uint64_t M = 0x9E3779B97F4A7C15ull;
	uint64_t h = seed ^ ((uint64_t)(btype + 1) * M) ^ (uint64_t)len;
	uint8_t tail[WORD] = { 0 };
	size_t i;

	for (i = 0; i + WORD <= len; i += WORD) {
		h ^= fdn_get64(b + i) * 0xFF51AFD7ED558CCDull;
		h = rotl64(h, 29) * M;
	}
	if (i < len) {
		memcpy(tail, b + i, len - i);
		h ^= fdn_get64(tail) * 0xFF51AFD7ED558CCDull;
		h = rotl64(h, 29) * M;
	}
	h ^= h >> 33;
	h *= 0xC4CEB9FE1A85EC53ull;
	h ^= h >> 29;
	return h;
}

int fdn_weak_hashes(const uint8_t *buf, size_t len, size_t bs, int btype,
	uint64_t seed, const uint8_t *skip, size_t nskip,
	uint8_t *out, size_t outlen)
{
	size_t n, i, blen = bs == len ? len : bs;

	if (fdn_nblocks(len, bs, &n) != FDN_OK || outlen / FDN_WEAK_SIZE != n ||
	    outlen % FDN_WEAK_SIZE != 0 || (skip && nskip != n) ||
	    btype < 0 || btype > 255)
		return FDN_EARG;
	for (i = 0; i < n; i++)
		fdn_put64be(out + i * FDN_WEAK_SIZE, skip && skip[i] ? 0 :
			weak(buf + i * blen, blen, btype, seed));
	return FDN_OK;
}

int fdn_equal(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
	return alen == blen && (alen == 0 || memcmp(a, b, alen) == 0);
}
