/*
 * record.c: a block as it lies in an arena. Encrypt-then-MAC, with the tag
 * over the arena number and offset too, so a record is authentic only where
 * it was written; AES-CTR keyed by arena position, so any record decrypts
 * alone. A record is checked completely before one byte of it is believed.
 *
 * The tag is Poly1305 under a one-time key that is the tag key's AES-CTR
 * keystream at the record's own arena position (stores made before it:
 * HMAC-SHA256): a few hundred nanoseconds a record, where HMAC cost a
 * microsecond or more, on every record written and read. Each position
 * takes its one-time key from its own keystream bytes, so no key serves
 * two records unless a position is written twice under one iv, which the
 * format forbids for the payloads' sake already (docs/format.md 5.2).
 *
 * A block whose bytes are spread near evenly over all 256 values (media,
 * archives, ciphertext) is stored raw without trying zstd: the test costs
 * a histogram, zstd on such a block costs as much as its hash and wins
 * nothing. reference.py's flat() states the rule.
 *
 * Packing a batch on several threads compresses each block into a fixed
 * slot of a scratch buffer (the caller's, kept across calls, or one of its
 * own), lays the records out from their sizes, then each thread encrypts its records' payloads from there (or,
 * stored raw, from the input) straight to their place and tags them: no
 * serial pass moves the batch's bytes while the other threads wait. The
 * bytes depend only on the blocks, never on how many threads did the work.
 *
 * Unpacking a batch lays the output out from the headers, then checks and
 * decodes each record in one go, while it is in cache; a length that is
 * damaged or too big to plan for goes back to Python, to fdn_unpack.
 *
 * A run (codec 2, docs/format.md 5.2) is k neighbouring blocks compressed as
 * one frame whose slices are the payloads of k ordinary records: fewer,
 * larger zstd calls, and the blocks' shared bytes found. A reader of any
 * member checks all k records and decodes the frame; a thread keeps the run
 * it decoded last (for the length of one call), and the threads of a batch
 * take whole runs, so a run read whole is decoded once.
 */
#include <pthread.h>
#include <stdlib.h>
#include <zstd.h>
#include <zstd_errors.h>
#include "internal.h"

enum {
	POOL = FDN_MAX_THREADS,	/* idle work contexts a codec keeps, of each kind */
	ZWORK = 1,		/* the kind that compresses (work_get, work_put); 0 the others */
	GRAIN = 32,		/* fewest blocks worth a thread of their own */
	STEAL = 8,		/* records a thread takes at a time in a batch unpack */
	AES_BLOCK = 16,
	CHUNK = 1 << 30,	/* EVP lengths are int */
	FLAT_MIN = 256,		/* blocks tested for flatness: FLAT_MIN..FLAT_MAX bytes */
	FLAT_MAX = 1 << 20,
	FLAT_STRIDE = 3,	/* every third byte is counted */
	FLAT_RATIO = 181	/* ~2^7.5: the collision entropy that counts as flat */
};

/* What one thread needs to pack or unpack: made once, reused across calls. */
typedef struct {
	EVP_MD_CTX *md;
	EVP_CIPHER_CTX *aes;	/* keyed once; only the counter changes */
	EVP_CIPHER_CTX *taes;	/* the same under the tag key: one-time Poly1305 keys */
	EVP_MAC_CTX *poly;
	ZSTD_CCtx *zc;
	ZSTD_DCtx *zd;
	uint8_t *tmp;		/* decrypted payload awaiting decompression */
	size_t tmpcap;
	uint8_t *run;		/* the run decoded last: k * R bytes */
	size_t runcap;
	int rvalid;		/* run holds the run at rfirst (this call only) */
	uint64_t rfirst;
	uint32_t rS, rR;
	uint8_t rk;
} work;

struct fdn_codec {
	int enc;
	uint8_t enckey[FDN_KEY_SIZE];
	fdn_hkey mac;
	int poly;		/* tags are Poly1305 under tagkey's one-time keys; else HMAC under mac */
	uint8_t tagkey[FDN_KEY_SIZE];
	int zlevel;
	pthread_mutex_t lock;
	work *idle[2][POOL];	/* [ZWORK]: those that compress (fills): each holds a zstd context, ~0.3 MB */
	int nidle[2];
};

static void work_free(work *w)
{
	if (w == NULL)
		return;
	EVP_MD_CTX_free(w->md);
	EVP_CIPHER_CTX_free(w->aes);
	EVP_CIPHER_CTX_free(w->taes);
	EVP_MAC_CTX_free(w->poly);
	ZSTD_freeCCtx(w->zc);
	ZSTD_freeDCtx(w->zd);
	free(w->tmp);
	free(w->run);
	free(w);
}

/*
 * A work context from the codec's idle ones. Those that compress are kept
 * apart (z = ZWORK): taken from one stack, a context a seal had used was then taken
 * by a fill and grew a zstd context (~0.3 MB for a 64 KiB run) and a run
 * buffer, until every context of the pool held one; apart, only as many
 * hold one as fills ran at once.
 */
static work *work_get(fdn_codec *c, int z)
{
	work *w = NULL;

	pthread_mutex_lock(&c->lock);
	if (c->nidle[z] > 0)
		w = c->idle[z][--c->nidle[z]];
	pthread_mutex_unlock(&c->lock);
	if (w) {
		w->rvalid = 0;	/* a run decoded in another call, from other bytes */
		return w;
	}
	if ((w = calloc(1, sizeof *w)) == NULL || (w->md = EVP_MD_CTX_new()) == NULL)
		goto fail;
	if (c->enc && ((w->aes = EVP_CIPHER_CTX_new()) == NULL ||
	    !EVP_EncryptInit_ex2(w->aes, fdn_aes_ctr, c->enckey, NULL, NULL)))
		goto fail;
	if (c->poly && ((w->taes = EVP_CIPHER_CTX_new()) == NULL ||
	    !EVP_EncryptInit_ex2(w->taes, fdn_aes_ctr, c->tagkey, NULL, NULL) ||
	    (w->poly = EVP_MAC_CTX_new(fdn_poly1305)) == NULL))
		goto fail;
	return w;
fail:
	work_free(w);
	return NULL;
}

static void work_put(fdn_codec *c, work *w, int z)
{
	if (w == NULL)
		return;
	pthread_mutex_lock(&c->lock);
	if (c->nidle[z] < POOL) {
		c->idle[z][c->nidle[z]++] = w;
		w = NULL;
	}
	pthread_mutex_unlock(&c->lock);
	work_free(w);
}

/* *buf with room for need bytes; 0 when out of memory */
static int grow(uint8_t **buf, size_t *cap, size_t need)
{
	if (*cap >= need)
		return 1;
	free(*buf);
	*cap = 0;
	if ((*buf = malloc(need ? need : 1)) == NULL)
		return 0;
	*cap = need;
	return 1;
}

static int zero(const uint8_t *p, size_t n)
{
	return n == 0 || (p[0] == 0 && memcmp(p, p + 1, n - 1) == 0);
}

fdn_codec *fdn_codec_new(const uint8_t *enckey, size_t enclen,
	const uint8_t *mackey, size_t maclen, const uint8_t *tagkey, size_t taglen, int zlevel)
{
	fdn_codec *c;

	if ((enckey != NULL && enclen != FDN_KEY_SIZE) || (mackey == NULL && maclen != 0) ||
	    (tagkey != NULL && taglen != FDN_KEY_SIZE) ||
	    (zlevel != 0 && (zlevel < ZSTD_minCLevel() || zlevel > ZSTD_maxCLevel())) ||
	    fdn_init() != FDN_OK || (tagkey != NULL && fdn_poly1305 == NULL))
		return NULL;
	if ((c = calloc(1, sizeof *c)) == NULL)
		return NULL;
	if (fdn_hkey_init(&c->mac, mackey, maclen) != FDN_OK) {
		free(c);
		return NULL;
	}
	c->enc = enckey != NULL;
	if (c->enc)
		memcpy(c->enckey, enckey, FDN_KEY_SIZE);
	c->poly = tagkey != NULL;
	if (c->poly)
		memcpy(c->tagkey, tagkey, FDN_KEY_SIZE);
	c->zlevel = zlevel;
	pthread_mutex_init(&c->lock, NULL);
	return c;
}

void fdn_codec_free(fdn_codec *c)
{
	if (c == NULL)
		return;
	for (int z = 0; z < 2; z++)
		while (c->nidle[z] > 0)
			work_free(c->idle[z][--c->nidle[z]]);
	fdn_hkey_free(&c->mac);
	OPENSSL_cleanse(c->enckey, sizeof c->enckey);
	OPENSSL_cleanse(c->tagkey, sizeof c->tagkey);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

/* counter block for arena position pos: (iv + pos / 16) mod 2^128, big-endian */
static void counter(uint8_t out[AES_BLOCK], const uint8_t iv[AES_BLOCK], uint64_t blk)
{
	unsigned carry = 0;

	for (int i = AES_BLOCK - 1; i >= 0; i--) {
		unsigned s = iv[i] + (unsigned)(blk & 0xff) + carry;
		out[i] = (uint8_t)s;
		carry = s >> 8;
		blk >>= 8;
	}
}

/* XOR len bytes with the arena keystream under aes's key from arena position pos. */
static int ctr(EVP_CIPHER_CTX *aes, const uint8_t *iv, uint64_t pos, uint8_t *dst,
	const uint8_t *src, size_t len)
{
	static const uint8_t zero[AES_BLOCK];
	uint8_t cb[AES_BLOCK], junk[AES_BLOCK];
	int outl;

	counter(cb, iv, pos / AES_BLOCK);
	if (!EVP_EncryptInit_ex2(aes, NULL, NULL, cb, NULL))
		return FDN_ECRYPTO;
	if (pos % AES_BLOCK && !EVP_EncryptUpdate(aes, junk, &outl, zero, (int)(pos % AES_BLOCK)))
		return FDN_ECRYPTO;
	while (len > 0) {
		int k = len > CHUNK ? CHUNK : (int)len;
		if (!EVP_EncryptUpdate(aes, dst, &outl, src, k))
			return FDN_ECRYPTO;
		dst += k;
		src += k;
		len -= k;
	}
	return FDN_OK;
}

/*
 * The tag of M = u32le(arena) || u32le(off) || header[0:48] || payload:
 * Poly1305(otk, M), otk the 32 bytes of the tag key's keystream at arena
 * positions off..off+31 (iv the arena's); or HMAC(mac, M), first 16 bytes.
 */
static int tag(fdn_codec *c, work *w, uint32_t arena, const uint8_t *iv, uint64_t off,
	const uint8_t *h, const uint8_t *payload, size_t len, uint8_t out[FDN_SCORE_SIZE])
{
	static const uint8_t zeros[FDN_KEY_SIZE];
	uint8_t where[2 * FDN_U32], otk[FDN_KEY_SIZE];
	size_t outl;
	int rc;

	fdn_put32(where, arena);
	fdn_put32(where + FDN_U32, (uint32_t)off);
	if (c->poly) {
		if (iv == NULL)
			return FDN_EARG;
		if ((rc = ctr(w->taes, iv, off, otk, zeros, sizeof otk)) != FDN_OK)
			return rc;
		rc = EVP_MAC_init(w->poly, otk, sizeof otk, NULL) &&
			EVP_MAC_update(w->poly, where, sizeof where) &&
			EVP_MAC_update(w->poly, h, FDN_H_TAG) &&
			(len == 0 || EVP_MAC_update(w->poly, payload, len)) &&
			EVP_MAC_final(w->poly, out, &outl, FDN_SCORE_SIZE) && outl == FDN_TAG_SIZE;
		OPENSSL_cleanse(otk, sizeof otk);
		return rc ? FDN_OK : FDN_ECRYPTO;
	}
	fdn_clean_upper();
	if ((rc = fdn_hmac_begin(&c->mac, w->md)) != FDN_OK)
		return rc;
	if (!EVP_DigestUpdate(w->md, where, sizeof where) ||
	    !EVP_DigestUpdate(w->md, h, FDN_H_TAG) ||
	    (len > 0 && !EVP_DigestUpdate(w->md, payload, len)))
		return FDN_ECRYPTO;
	return fdn_hmac_end(&c->mac, w->md, out);
}

/*
 * Check the record at arena offset off, whose bytes are p[0, avail). The
 * order of the checks is part of the format (reference.py follows it):
 * magic, header fields, lengths, completeness, then the tag.
 */
static int check(fdn_codec *c, work *w, uint32_t arena, const uint8_t *iv, uint64_t off,
	const uint8_t *p, size_t avail, int verify, fdn_entry *e)
{
	uint8_t t[FDN_SCORE_SIZE], kind, rj, rk;
	uint32_t S, R;
	int rc;

	if (avail < FDN_MAGIC_SIZE)
		return FDN_ETRUNCATED;
	if (memcmp(p + FDN_H_MAGIC, FDN_MAGIC, FDN_MAGIC_SIZE) != 0)
		return FDN_EMAGIC;
	if (avail < FDN_HEADER_SIZE)
		return FDN_ETRUNCATED;
	kind = p[FDN_H_CODEC];
	rj = p[FDN_H_RUNJ];
	rk = p[FDN_H_RUNK];
	if (kind > FDN_CODEC_RUN || (kind == FDN_CODEC_RUN ?
	    rk < 2 || rk > FDN_RUN_MAX || rj >= rk : rj || rk))
		return FDN_EMAGIC;
	S = fdn_get32(p + FDN_H_SLEN);
	R = fdn_get32(p + FDN_H_RLEN);
	if (kind == FDN_CODEC_RAW ? S != R : S >= R || (kind == FDN_CODEC_RUN && S == 0))
		return FDN_ELENGTH;
	if (off + FDN_HEADER_SIZE + S > FDN_ARENA_MAX)
		return FDN_ELENGTH;
	if (avail - FDN_HEADER_SIZE < S)
		return FDN_ETRUNCATED;
	if (verify) {
		if ((rc = tag(c, w, arena, iv, off, p, p + FDN_HEADER_SIZE, S, t)) != FDN_OK)
			return rc;
		if (CRYPTO_memcmp(t, p + FDN_H_TAG, FDN_TAG_SIZE) != 0)
			return FDN_ETAG;
	}
	e->off = off;
	e->slen = S;
	e->rlen = R;
	e->btype = p[FDN_H_BTYPE];
	e->codec = kind;
	e->runj = rj;
	e->runk = rk;
	memcpy(e->key, p + FDN_H_KEY, FDN_SCORE_SIZE);
	return FDN_OK;
}

typedef struct {
	fdn_codec *c;
	uint32_t arena;
	const uint8_t *iv;
	uint64_t offset;	/* arena offset of out[0] */
	uint8_t btype;
	const uint8_t *buf;
	size_t blen;
	const uint8_t *keys;
	uint8_t *out;
	uint64_t *pos;		/* each record's position in out, then in the arena */
	uint32_t *slen;
	uint8_t *codec;
	uint8_t *scratch;	/* batch pack: block i's compressed payload at i * blen */
	uint8_t *tags;		/* fdn_seal: each record's tag, 16 bytes each, or NULL */
	uint8_t *runs;		/* block i's place in its run and the run's length at 2i, 2i + 1 */
	uint8_t *plan;		/* fdn_fill with runs: the runs planned, as runs (read only while filling) */
} packjob;

/*
 * Whether p[0, n) is flat: its every third byte, m of them, has a collision
 * entropy of at least log2(FLAT_RATIO) ~ 7.5 bits a byte, i.e. FLAT_RATIO *
 * (sum of squared byte counts) <= m^2. A third of the bytes judge as well
 * (random bytes sit 14 standard deviations inside) for a third of the cost;
 * the odd stride meets every phase of 2-, 4- and 8-byte fields. Four
 * histograms, so neighbouring equal bytes do not wait on each other.
 */
static uint64_t squares(uint32_t h[4][256])
{
	uint64_t sq = 0;

	for (int b = 0; b < 256; b++) {
		uint64_t c = (uint64_t)h[0][b] + h[1][b] + h[2][b] + h[3][b];
		sq += c * c;
	}
	return sq;
}

/*
 * The sum of squares only grows as bytes are counted, so a block whose first
 * third already passes the bound is not flat: a compressible block (most of
 * those that are not flat) is judged on a third of its sample. The answer is
 * the same as counting every sample.
 */
static int flat(const uint8_t *p, size_t n)
{
	uint32_t h[4][256];
	uint64_t m = (n + FLAT_STRIDE - 1) / FLAT_STRIDE;
	size_t i, third = n / 3 - n / 3 % (4 * FLAT_STRIDE);

	if (n < FLAT_MIN || n > FLAT_MAX)
		return 0;
	memset(h, 0, sizeof h);
	for (i = 0; i + 3 * FLAT_STRIDE < n; i += 4 * FLAT_STRIDE) {
		if (i == third && FLAT_RATIO * squares(h) > m * m)
			return 0;
		h[0][p[i]]++;
		h[1][p[i + FLAT_STRIDE]]++;
		h[2][p[i + 2 * FLAT_STRIDE]]++;
		h[3][p[i + 3 * FLAT_STRIDE]]++;
	}
	for (; i < n; i += FLAT_STRIDE)
		h[0][p[i]]++;
	return FLAT_RATIO * squares(h) <= m * m;
}

/* Whether the writer tries zstd on block i (not flat: flat() says why). */
static int compressible(packjob *j, size_t i)
{
	return j->c->zlevel != 0 && j->blen > 1 && !flat(j->buf + i * j->blen, j->blen);
}

/* Put block i's payload, compressed if that is smaller, at dst; a raw payload only if raw
 * (else the compaction copies it from the block, once). tryz: compressible(j, i). */
static int fill_one(packjob *j, work *w, size_t i, uint8_t *dst, int raw, int tryz)
{
	const uint8_t *src = j->buf + i * j->blen;
	size_t r;

	if (tryz) {
		if (w->zc == NULL && (w->zc = ZSTD_createCCtx()) == NULL)
			return FDN_ENOMEM;
		r = ZSTD_compressCCtx(w->zc, dst, j->blen - 1, src, j->blen, j->c->zlevel);
		if (!ZSTD_isError(r)) {
			j->codec[i] = FDN_CODEC_ZSTD;
			j->slen[i] = (uint32_t)r;
			return FDN_OK;
		}
		if (ZSTD_getErrorCode(r) != ZSTD_error_dstSize_tooSmall)
			return FDN_EZSTD;
	}
	if (raw)
		memcpy(dst, src, j->blen);
	j->codec[i] = FDN_CODEC_RAW;
	j->slen[i] = (uint32_t)j->blen;
	return FDN_OK;
}

static int fill(packjob *j, work *w, size_t i, uint8_t *dst, int raw)
{
	return fill_one(j, w, i, dst, raw, compressible(j, i));
}

/*
 * Blocks [i, i + k) as a run: one frame of their k blen bytes, zero-padded
 * to k slices of s = ceil(F / k) bytes, at scratch[i * blen] (made in w->tmp
 * first when scratch is buf: the blocks are read until the frame is done).
 * A frame that does not leave s < blen is no run: each block alone.
 */
static int fill_run(packjob *j, work *w, size_t i, size_t k, int inplace)
{
	const uint8_t *src = j->buf + i * j->blen;
	uint8_t *dst = j->scratch + i * j->blen, *to = inplace ? w->tmp : dst;
	size_t total = k * j->blen, r, s = j->blen;
	int rc;

	if (w->zc == NULL && (w->zc = ZSTD_createCCtx()) == NULL)
		return FDN_ENOMEM;
	r = ZSTD_compressCCtx(w->zc, to, total, src, total, j->c->zlevel);
	if (!ZSTD_isError(r))
		s = (r + k - 1) / k;
	else if (ZSTD_getErrorCode(r) != ZSTD_error_dstSize_tooSmall)
		return FDN_EZSTD;
	if (s >= j->blen) {
		for (size_t m = i; m < i + k; m++) {
			j->runs[2 * m] = j->runs[2 * m + 1] = 0;
			if ((rc = fill_one(j, w, m, inplace ? w->tmp : j->scratch + m * j->blen, 0, 1)) != FDN_OK)
				return rc;
			if (inplace && j->codec[m] == FDN_CODEC_ZSTD)
				memcpy(j->scratch + m * j->blen, w->tmp, j->slen[m]);
		}
		return FDN_OK;
	}
	memset(to + r, 0, k * s - r);
	if (inplace)
		memcpy(dst, to, k * s);
	for (size_t m = 0; m < k; m++) {
		j->codec[i + m] = FDN_CODEC_RUN;
		j->slen[i + m] = (uint32_t)s;
		j->runs[2 * (i + m)] = (uint8_t)m;
		j->runs[2 * (i + m) + 1] = (uint8_t)k;
	}
	return FDN_OK;
}

/* fdn_fill's first pass with runs: whether each block is worth zstd, in codec[i] */
static int judge_range(void *arg, size_t lo, size_t hi)
{
	packjob *j = arg;

	for (size_t i = lo; i < hi; i++)
		j->codec[i] = (uint8_t)compressible(j, i);
	return FDN_OK;
}

/* fdn_fill's last pass with runs: each run by the thread whose range holds its first block. */
static int runs_range(void *arg, size_t lo, size_t hi)
{
	packjob *j = arg;
	work *w = work_get(j->c, ZWORK);
	int rc = w ? FDN_OK : FDN_ENOMEM, inplace = j->scratch == j->buf;
	size_t most = 1;

	for (size_t i = lo; i < hi; i++)
		if (j->plan[2 * i + 1] > most)
			most = j->plan[2 * i + 1];
	if (rc == FDN_OK && inplace && !grow(&w->tmp, &w->tmpcap, most * j->blen))
		rc = FDN_ENOMEM;
	for (size_t i = lo; i < hi && rc == FDN_OK; i++) {
		size_t k = j->plan[2 * i + 1];
		if (k >= 2) {
			if (j->plan[2 * i] == 0)
				rc = fill_run(j, w, i, k, inplace);
			continue;	/* a later member: its run's thread fills it */
		}
		j->runs[2 * i] = j->runs[2 * i + 1] = 0;
		rc = fill_one(j, w, i, inplace ? w->tmp : j->scratch + i * j->blen, 0, j->codec[i]);
		if (rc == FDN_OK && inplace && j->codec[i] == FDN_CODEC_ZSTD)
			memcpy(j->scratch + i * j->blen, w->tmp, j->slen[i]);
	}
	work_put(j->c, w, ZWORK);
	return rc;
}

/*
 * fdn_fill with runs of at most kmax: judge every block, then cut each
 * stretch of neighbouring compressible blocks into runs of kmax (a last
 * piece of one is a block of its own), then fill on the threads. The runs
 * depend on the blocks alone, never on the threads.
 */
static int fill_runs(packjob *j, size_t n, size_t kmax, int threads)
{
	size_t i = 0;
	int rc;

	if ((j->plan = calloc(2 * n, 1)) == NULL)
		return FDN_ENOMEM;
	if ((rc = fdn_share(threads, n, GRAIN, judge_range, j)) != FDN_OK)
		goto out;
	while (i < n) {
		size_t m = i;
		while (m < n && j->codec[m] && m - i < kmax)
			m++;
		if (m - i >= 2)
			for (size_t t = i; t < m; t++) {
				j->plan[2 * t] = (uint8_t)(t - i);
				j->plan[2 * t + 1] = (uint8_t)(m - i);
			}
		i = m > i ? m : i + 1;
	}
	rc = fdn_share(threads, n, GRAIN, runs_range, j);
out:
	free(j->plan);
	j->plan = NULL;
	return rc;
}

/* The longest run a writer makes of blocks of blen bytes with the setting run (< 2: none). */
static size_t run_max(fdn_codec *c, size_t blen, int run)
{
	size_t k = run < 0 ? 0 : (size_t)run;

	if (k > FDN_RUN_MAX)
		k = FDN_RUN_MAX;
	if (blen == 0 || k > FDN_RUN_BYTES / blen)
		k = FDN_RUN_BYTES / (blen ? blen : 1);
	return c->zlevel != 0 && blen > 1 ? k : 0;
}

/* Write block i's header around its payload at out + pos, encrypt, tag. The payload is
 * there already (src NULL), or is taken from src (encrypted on the way when the codec
 * encrypts: one pass over it, no copy first). */
static int seal(packjob *j, work *w, size_t i, uint64_t pos, const uint8_t *src)
{
	uint8_t *h = j->out + pos, t[FDN_SCORE_SIZE];
	uint64_t off = j->offset + pos;
	uint32_t S = j->slen[i];
	int rc;

	memcpy(h + FDN_H_MAGIC, FDN_MAGIC, FDN_MAGIC_SIZE);
	h[FDN_H_BTYPE] = j->btype;
	h[FDN_H_CODEC] = j->codec[i];
	h[FDN_H_RUNJ] = j->codec[i] == FDN_CODEC_RUN ? j->runs[2 * i] : 0;
	h[FDN_H_RUNK] = j->codec[i] == FDN_CODEC_RUN ? j->runs[2 * i + 1] : 0;
	fdn_put32(h + FDN_H_SLEN, S);
	fdn_put32(h + FDN_H_RLEN, (uint32_t)j->blen);
	memcpy(h + FDN_H_KEY, j->keys + i * FDN_SCORE_SIZE, FDN_SCORE_SIZE);
	if (src == NULL)
		src = h + FDN_HEADER_SIZE;
	if (j->c->enc) {
		if ((rc = ctr(w->aes, j->iv, off + FDN_HEADER_SIZE, h + FDN_HEADER_SIZE, src, S)) != FDN_OK)
			return rc;
	} else if (src != h + FDN_HEADER_SIZE)
		memcpy(h + FDN_HEADER_SIZE, src, S);
	if ((rc = tag(j->c, w, j->arena, j->iv, off, h, h + FDN_HEADER_SIZE, S, t)) != FDN_OK)
		return rc;
	memcpy(h + FDN_H_TAG, t, FDN_TAG_SIZE);
	if (j->tags != NULL)
		memcpy(j->tags + i * FDN_TAG_SIZE, t, FDN_TAG_SIZE);
	j->pos[i] = off;
	return FDN_OK;
}

/* Blocks lo..hi alone. With scratch == buf (fill in place) each payload is made aside, then put over
 * its own block (which is read by then); a raw block stays where it is. */
static int fill_range(void *arg, size_t lo, size_t hi)
{
	packjob *j = arg;
	work *w = work_get(j->c, ZWORK);
	int rc = w ? FDN_OK : FDN_ENOMEM, inplace = j->scratch == j->buf;

	if (rc == FDN_OK && inplace && !grow(&w->tmp, &w->tmpcap, j->blen))
		rc = FDN_ENOMEM;
	for (size_t i = lo; i < hi && rc == FDN_OK; i++)
		if ((rc = fill(j, w, i, inplace ? w->tmp : j->scratch + i * j->blen, 0)) == FDN_OK &&
		    inplace && j->codec[i] == FDN_CODEC_ZSTD)
			memcpy(j->scratch + i * j->blen, w->tmp, j->slen[i]);
	work_put(j->c, w, ZWORK);
	return rc;
}

static int seal_range(void *arg, size_t lo, size_t hi)
{
	packjob *j = arg;
	work *w = work_get(j->c, 0);
	int rc = w ? FDN_OK : FDN_ENOMEM;

	for (size_t i = lo; i < hi && rc == FDN_OK; i++) {
		const uint8_t *src = j->codec[i] == FDN_CODEC_RAW ? j->buf + i * j->blen : j->scratch + i * j->blen;
		if (j->codec[i] == FDN_CODEC_RUN)	/* slice m of the frame at its run's first block */
			src = j->scratch + (i - j->runs[2 * i]) * j->blen + (size_t)j->runs[2 * i] * j->slen[i];
		rc = seal(j, w, i, j->pos[i], src);
	}
	work_put(j->c, w, 0);
	return rc;
}

int64_t fdn_pack(fdn_codec *c, uint32_t arena, const uint8_t *iv,
	uint64_t offset, int btype, const uint8_t *buf, size_t len, size_t bs,
	const uint8_t *keys, size_t keyslen, uint8_t *out, size_t outcap,
	uint64_t *offs, size_t noffs, int threads, uint8_t *scratch, size_t scratchcap, int run)
{
	packjob j = { c, arena, iv, offset, (uint8_t)btype, buf, bs == len ? len : bs,
		keys, out, offs, NULL, NULL, NULL, NULL, NULL, NULL };
	uint64_t pos = 0;
	size_t n, i, kmax;
	work *w;
	int rc, own = 0;

	if (fdn_nblocks(len, bs, &n) != FDN_OK || btype < 0 || btype > 255 ||
	    keyslen != n * FDN_SCORE_SIZE || noffs != n || j.blen > UINT32_MAX ||
	    (c->enc && iv == NULL) || offset > FDN_ARENA_MAX ||
	    n > (FDN_ARENA_MAX - offset) / (FDN_HEADER_SIZE + j.blen) ||
	    outcap < n * (FDN_HEADER_SIZE + j.blen))
		return FDN_EARG;
	j.slen = malloc(n * sizeof *j.slen + 1);
	j.codec = malloc(n + 1);
	j.runs = calloc(2 * n + 1, 1);
	if (j.slen == NULL || j.codec == NULL || j.runs == NULL) {
		rc = FDN_ENOMEM;
		goto out;
	}
	kmax = n >= 2 ? run_max(c, j.blen, run) : 0;
	if (kmax < 2 && (threads <= 1 || n < 2 * GRAIN)) {
		/* one pass: each record goes straight where it belongs */
		if ((w = work_get(c, ZWORK)) == NULL) {
			rc = FDN_ENOMEM;
			goto out;
		}
		for (i = 0, rc = FDN_OK; i < n && rc == FDN_OK; i++) {
			if ((rc = fill(&j, w, i, out + pos + FDN_HEADER_SIZE, 1)) != FDN_OK ||
			    (rc = seal(&j, w, i, pos, NULL)) != FDN_OK)
				break;
			pos += FDN_HEADER_SIZE + j.slen[i];
		}
		work_put(c, w, ZWORK);
		goto out;
	}
	/* the caller's scratch (reused: its pages are not faulted in per call), else one of our own */
	if (scratch != NULL && scratchcap >= n * j.blen)
		j.scratch = scratch;
	else if ((j.scratch = malloc(n * j.blen)) != NULL)
		own = 1;
	else {
		rc = FDN_ENOMEM;
		goto out;
	}
	rc = kmax >= 2 ? fill_runs(&j, n, kmax, threads) : fdn_share(threads, n, GRAIN, fill_range, &j);
	if (rc != FDN_OK)
		goto out;
	for (i = 0; i < n; i++) {	/* the layout: each record's place from the sizes alone */
		offs[i] = pos;
		pos += FDN_HEADER_SIZE + j.slen[i];
	}
	rc = fdn_share(threads, n, GRAIN, seal_range, &j);
out:
	if (own)
		free(j.scratch);
	free(j.slen);
	free(j.codec);
	free(j.runs);
	return rc == FDN_OK ? (int64_t)pos : rc;
}

int fdn_fill(fdn_codec *c, const uint8_t *buf, size_t len, size_t bs,
	uint8_t *scratch, size_t scratchcap, uint32_t *sizes, uint8_t *codecs,
	size_t n, int threads, int run, uint8_t *runs)
{
	packjob j = { c, 0, NULL, 0, 0, buf, bs == len ? len : bs, NULL, NULL, NULL,
		sizes, codecs, scratch, NULL, runs, NULL };
	size_t k, kmax;

	if (fdn_nblocks(len, bs, &k) != FDN_OK || k != n || j.blen == 0 || j.blen > UINT32_MAX ||
	    scratch == NULL || scratchcap / j.blen < n)
		return FDN_EARG;
	if (runs != NULL)
		memset(runs, 0, 2 * n);
	kmax = runs != NULL && n >= 2 ? run_max(c, j.blen, run) : 0;
	if ((uintptr_t)scratch != (uintptr_t)buf && (uintptr_t)scratch < (uintptr_t)buf + len &&
	    (uintptr_t)buf < (uintptr_t)scratch + n * j.blen)
		return FDN_EARG;	/* overlapping, but not the blocks themselves */
	if (kmax >= 2)
		return fill_runs(&j, n, kmax, threads);
	return fdn_share(threads, n, GRAIN, fill_range, &j);
}

int64_t fdn_seal(fdn_codec *c, uint32_t arena, const uint8_t *iv,
	uint64_t offset, int btype, const uint8_t *buf, size_t len, size_t bs,
	const uint8_t *keys, size_t keyslen, const uint8_t *scratch, size_t scratchcap,
	const uint32_t *sizes, const uint8_t *codecs, const uint8_t *runs, size_t n, size_t first,
	uint64_t room, uint8_t *out, size_t outcap, uint64_t *offs, uint8_t *tags,
	size_t *count, int threads)
{
	size_t blen = bs == len ? len : bs, k, m;
	uint64_t pos = 0, limit = room < outcap ? room : outcap;
	packjob j;

	*count = 0;
	if (fdn_nblocks(len, bs, &m) != FDN_OK || m != n || first > n || btype < 0 || btype > 255 ||
	    keyslen != n * FDN_SCORE_SIZE || blen == 0 || blen > UINT32_MAX || scratchcap / blen < n ||
	    (c->enc && iv == NULL) || offset > FDN_ARENA_MAX)
		return FDN_EARG;
	if (limit > FDN_ARENA_MAX - offset)
		limit = FDN_ARENA_MAX - offset;
	if (first < n && codecs[first] == FDN_CODEC_RUN && (runs == NULL || runs[2 * first] != 0))
		return FDN_EARG;	/* a run is sealed whole */
	/* the layout: each record's place from the sizes alone, as many as fit; a run whole or not */
	for (k = first; k < n; k++) {
		uint64_t rec = FDN_HEADER_SIZE + (uint64_t)sizes[k];
		size_t rk = 1;
		if (codecs[k] == FDN_CODEC_RUN) {
			if (runs == NULL || runs[2 * k] != 0 || (rk = runs[2 * k + 1]) < 2 || rk > FDN_RUN_MAX ||
			    rk > n - k || sizes[k] == 0 || sizes[k] >= blen)
				return FDN_EARG;
			for (size_t m = 1; m < rk; m++)
				if (codecs[k + m] != FDN_CODEC_RUN || runs[2 * (k + m)] != m ||
				    runs[2 * (k + m) + 1] != rk || sizes[k + m] != sizes[k])
					return FDN_EARG;
		} else if (codecs[k] == FDN_CODEC_RAW ? sizes[k] != blen :
		    codecs[k] != FDN_CODEC_ZSTD || sizes[k] >= blen)
			return FDN_EARG;	/* not what fdn_fill leaves */
		if (rk * rec > limit - pos)
			break;
		for (size_t m = 0; m < rk; m++) {
			offs[k + m - first] = pos;
			pos += rec;
		}
		k += rk - 1;
	}
	j = (packjob){ c, arena, iv, offset, (uint8_t)btype, buf + first * blen, blen,
		keys + first * FDN_SCORE_SIZE, out, offs, (uint32_t *)sizes + first,
		(uint8_t *)codecs + first, (uint8_t *)scratch + first * blen, tags,
		runs ? (uint8_t *)runs + 2 * first : NULL, NULL };
	k -= first;
	if (k > 0) {
		int rc = fdn_share(threads, k, GRAIN, seal_range, &j);
		if (rc != FDN_OK)
			return rc;
	}
	*count = k;
	return (int64_t)pos;
}

/* The bytes a decode reads: buf[0] at arena offset base, len bytes. */
typedef struct {
	uint32_t arena;
	const uint8_t *buf;
	size_t len;
	uint64_t base;
} span;

/*
 * Record e is slice j of a run of k (codec 2): check the run's k records,
 * which lie back to back from o - j (64 + S) (each header agreeing: codec
 * 2, the same k, S and R, its own j; each tag), decrypt and join their
 * slices, decode the one frame of k R bytes (the padding after it zero
 * bytes, fewer than k of them) and copy block j to out. *bad: the record at
 * fault (the member whose check failed; e itself for the frame). e's own
 * tag first, unless own (the caller checked it), whether or not its run is
 * wholly in sp (FDN_ESPAN if not); a run this thread decoded in this call
 * already is not checked again (its bytes were, in full).
 */
static int run_decode(fdn_codec *c, work *w, const uint8_t *iv, const fdn_entry *e,
	const span *sp, uint8_t *out, uint64_t *bad, int own)
{
	uint64_t step = FDN_HEADER_SIZE + (uint64_t)e->slen, first, at;
	size_t k = e->runk, S = e->slen, R = e->rlen, F, r;
	unsigned long long content;
	fdn_entry f;
	int rc, whole;

	*bad = e->off;
	if (e->off < sp->base)
		return FDN_ESPAN;
	first = e->off - e->runj * step;
	whole = e->runj * step <= e->off - sp->base && k * step <= sp->len - (size_t)(first - sp->base);
	if (whole && w->rvalid && w->rfirst == first && w->rk == k && w->rS == S && w->rR == R)
		goto take;
	/* e's own tag before FDN_ESPAN too: a batch then says "not wholly here" only
	 * where a decode of e alone would, and its caller need not decode it again */
	if (!own && (rc = check(c, w, sp->arena, iv, e->off, sp->buf + (size_t)(e->off - sp->base),
				sp->len - (size_t)(e->off - sp->base), 1, &f)) != FDN_OK)
		return rc;
	if (!whole)
		return FDN_ESPAN;
	w->rvalid = 0;
	if (!grow(&w->tmp, &w->tmpcap, k * S) || !grow(&w->run, &w->runcap, k * R))
		return FDN_ENOMEM;
	for (size_t m = 0; m < k; m++) {
		const uint8_t *p;
		at = first + m * step;
		p = sp->buf + (size_t)(at - sp->base);
		*bad = at;
		if (m != e->runj) {	/* (e is checked) */
			if ((rc = check(c, w, sp->arena, iv, at, p, sp->len - (size_t)(at - sp->base), 1, &f)) != FDN_OK)
				return rc;
			if (f.codec != FDN_CODEC_RUN || f.runk != k || f.runj != m || f.slen != S || f.rlen != R)
				return FDN_EMAGIC;
		}
		if (c->enc) {
			if ((rc = ctr(w->aes, iv, at + FDN_HEADER_SIZE, w->tmp + m * S, p + FDN_HEADER_SIZE, S)) != FDN_OK)
				return rc;
		} else
			memcpy(w->tmp + m * S, p + FDN_HEADER_SIZE, S);
	}
	*bad = e->off;
	if (w->zd == NULL && (w->zd = ZSTD_createDCtx()) == NULL)
		return FDN_ENOMEM;
	/* exactly one frame, declaring exactly k R bytes, fewer than k zero bytes after it */
	F = ZSTD_findFrameCompressedSize(w->tmp, k * S);
	content = ZSTD_getFrameContentSize(w->tmp, k * S);
	if (ZSTD_isError(F) || content != (unsigned long long)k * R || k * S - F >= k ||
	    !zero(w->tmp + F, k * S - F))
		return FDN_EDECOMPRESS;
	r = ZSTD_decompressDCtx(w->zd, w->run, k * R, w->tmp, F);
	if (ZSTD_isError(r) || r != k * R)
		return FDN_EDECOMPRESS;
	w->rvalid = 1;
	w->rfirst = first;
	w->rk = (uint8_t)k;
	w->rS = (uint32_t)S;
	w->rR = (uint32_t)R;
take:
	memcpy(out, w->run + e->runj * R, R);
	return FDN_OK;
}

/* Decode the record e, whose bytes lie in sp and whose tag is checked (a run slice's: unless
 * not own, see run_decode), to out (e->rlen bytes); *bad as run_decode's. */
static int decode(fdn_codec *c, work *w, const uint8_t *iv, const fdn_entry *e,
	const span *sp, uint8_t *out, uint64_t *bad, int own)
{
	const uint8_t *payload = sp->buf + (size_t)(e->off - sp->base) + FDN_HEADER_SIZE, *src = payload;
	size_t r;
	int rc;

	*bad = e->off;
	if (e->codec == FDN_CODEC_RUN)
		return run_decode(c, w, iv, e, sp, out, bad, own);
	if (e->codec == FDN_CODEC_RAW) {
		if (c->enc)
			return ctr(w->aes, iv, e->off + FDN_HEADER_SIZE, out, payload, e->slen);
		memcpy(out, payload, e->slen);
		return FDN_OK;
	}
	if (c->enc) {
		if (w->tmpcap < e->slen) {
			free(w->tmp);
			w->tmpcap = 0;
			if ((w->tmp = malloc(e->slen)) == NULL)
				return FDN_ENOMEM;
			w->tmpcap = e->slen;
		}
		if ((rc = ctr(w->aes, iv, e->off + FDN_HEADER_SIZE, w->tmp, payload, e->slen)) != FDN_OK)
			return rc;
		src = w->tmp;
	}
	if (w->zd == NULL && (w->zd = ZSTD_createDCtx()) == NULL)
		return FDN_ENOMEM;
	/* exactly one frame, declaring exactly R bytes, decoding to them */
	if (ZSTD_getFrameContentSize(src, e->slen) != e->rlen ||
	    ZSTD_findFrameCompressedSize(src, e->slen) != e->slen)
		return FDN_EDECOMPRESS;
	r = ZSTD_decompressDCtx(w->zd, out, e->rlen, src, e->slen);
	return !ZSTD_isError(r) && r == e->rlen ? FDN_OK : FDN_EDECOMPRESS;
}

int64_t fdn_unpack(fdn_codec *c, uint32_t arena, const uint8_t *iv,
	uint64_t offset, const uint8_t *buf, size_t len, uint64_t base, fdn_entry *e,
	uint8_t *out, size_t outcap)
{
	span sp = { arena, buf, len, base };
	uint64_t bad = offset;
	work *w;
	int rc;

	if (offset >= FDN_ARENA_MAX || (c->enc && iv == NULL) || offset < base || offset - base > len ||
	    base > FDN_ARENA_MAX || len > FDN_ARENA_MAX - base)
		return FDN_EARG;
	if ((w = work_get(c, 0)) == NULL)
		return FDN_ENOMEM;
	rc = check(c, w, arena, iv, offset, buf + (size_t)(offset - base), len - (size_t)(offset - base), 1, e);
	if (rc == FDN_OK && outcap < e->rlen)
		rc = FDN_ESPACE;
	if (rc == FDN_OK)
		rc = decode(c, w, iv, e, &sp, out, &bad, 1);
	work_put(c, w, 0);
	e->off = bad;	/* the record at fault, when one is */
	return rc == FDN_OK ? (int64_t)e->rlen : rc;
}

/* A record that must not be believed, as opposed to a failure of the call. */
static int bad_record(int rc)
{
	return rc == FDN_EMAGIC || rc == FDN_ELENGTH || rc == FDN_ETAG ||
		rc == FDN_EDECOMPRESS || rc == FDN_ETRUNCATED || rc == FDN_ESPAN;
}

typedef struct {
	fdn_codec *c;
	uint32_t arena;
	const uint8_t *iv;
	const uint8_t *buf;	/* buf[0] is at arena offset base */
	size_t len;
	uint64_t base;
	const uint64_t *offs;
	uint8_t *out;
	const uint64_t *pos;
	int32_t *errs;
	uint8_t *btypes;
	uint8_t *keys;
	size_t n;
	size_t next;		/* the first chunk no thread has taken */
	const uint64_t *slots;	/* fdn_unpack_at: record i's data at out + slots[i] * bs */
	size_t bs;
	size_t *cuts;		/* chunk c is records [cuts[c], cuts[c + 1]) */
	size_t ncuts;		/* chunks */
} manyjob;

/* The arena offset of the first record of the run whose member's header is at off, or
 * UINT64_MAX when there is none there (not a whole codec 2 header within buf). */
static uint64_t run_first(const uint8_t *buf, size_t len, uint64_t base, uint64_t off)
{
	const uint8_t *p;
	uint64_t back;

	if (off < base || off - base > len || len - (size_t)(off - base) < FDN_HEADER_SIZE)
		return UINT64_MAX;
	p = buf + (size_t)(off - base);
	if (p[FDN_H_CODEC] != FDN_CODEC_RUN)
		return UINT64_MAX;
	back = p[FDN_H_RUNJ] * (FDN_HEADER_SIZE + (uint64_t)fdn_get32(p + FDN_H_SLEN));
	return back <= off ? off - back : UINT64_MAX;
}

/*
 * Cut records [0, n) into the chunks the threads take: STEAL records, or
 * more to end a run, so no run is split between two threads (each would
 * decode it). -> the cuts (cuts[0] = 0, cuts[*m] = n), or NULL without memory.
 */
static size_t *chunks(const uint8_t *buf, size_t len, uint64_t base, const uint64_t *offs,
	size_t n, size_t *m)
{
	size_t *cuts = malloc((n / STEAL + 2) * sizeof *cuts), k = 0, i = 0;

	if (cuts == NULL)
		return NULL;
	cuts[k++] = 0;
	while (i < n) {
		size_t end = n - i > STEAL ? i + STEAL : n;
		uint64_t f;
		while (end < n && (f = run_first(buf, len, base, offs[end])) != UINT64_MAX &&
		       f == run_first(buf, len, base, offs[end - 1]))
			end++;
		cuts[k++] = end;
		i = end;
	}
	*m = k - 1;
	return cuts;
}

/* Take the next chunk no thread has taken yet: records [*i, *end); 0 when none is left. */
static int take_chunk(size_t *next, const size_t *cuts, size_t ncuts, size_t *i, size_t *end)
{
	size_t c = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);

	if (c >= ncuts)
		return 0;
	*i = cuts[c];
	*end = cuts[c + 1];
	return 1;
}

/* Check and decode record i; a bad record is no failure, only its errs[i]. */
static int many_one(manyjob *j, work *w, size_t i)
{
	size_t at = (size_t)(j->offs[i] - j->base);
	uint8_t *key = j->keys + i * FDN_SCORE_SIZE;
	span sp = { j->arena, j->buf, j->len, j->base };
	uint64_t bad;
	fdn_entry e;
	int rc;

	memset(key, 0, FDN_SCORE_SIZE);
	j->btypes[i] = 0;
	if (j->errs[i] != FDN_OK)
		return FDN_OK;	/* FDN_ESPACE: too big to plan for */
	/* a run slice's tag is checked with its run's, once a call (run_decode) */
	rc = check(j->c, w, j->arena, j->iv, j->offs[i], j->buf + at, j->len - at, 0, &e);
	if (rc == FDN_OK && e.codec != FDN_CODEC_RUN)
		rc = check(j->c, w, j->arena, j->iv, j->offs[i], j->buf + at, j->len - at, 1, &e);
	if (rc == FDN_OK && e.rlen != (j->slots ? j->bs : j->pos[i + 1] - j->pos[i]))
		rc = FDN_ESPACE;	/* the header changed since it was planned */
	if (rc == FDN_OK)
		rc = decode(j->c, w, j->iv, &e, &sp,
			j->slots ? j->out + j->slots[i] * j->bs : j->out + j->pos[i], &bad, 0);
	if (rc == FDN_OK) {
		j->btypes[i] = e.btype;
		memcpy(key, e.key, FDN_SCORE_SIZE);
	} else if (bad_record(rc) || rc == FDN_ESPACE) {
		j->errs[i] = rc;
		rc = FDN_OK;
	}
	return rc;
}

/*
 * Check and decode records, each while it is in cache. The threads take
 * STEAL records at a time rather than a fixed share each, so a thread whose
 * core is busy with other work holds up no one: the others take more.
 * Every record has its place in out, so the bytes do not depend on who
 * decoded what.
 */
static int many_range(void *arg, size_t lo, size_t hi)
{
	manyjob *j = arg;
	work *w = work_get(j->c, 0);
	size_t i, end;
	int rc = FDN_OK;

	(void)lo, (void)hi;	/* fdn_parallel only starts the threads */
	if (w == NULL)
		return FDN_ENOMEM;
	while (rc == FDN_OK && take_chunk(&j->next, j->cuts, j->ncuts, &i, &end))
		for (; i < end && rc == FDN_OK; i++)
			rc = many_one(j, w, i);
	work_put(j->c, w, 0);
	return rc;
}

int64_t fdn_unpack_many(fdn_codec *c, uint32_t arena, const uint8_t *iv,
	const uint8_t *buf, size_t len, uint64_t base, const uint64_t *offs,
	size_t n, uint8_t *out, size_t outcap, uint64_t *pos, int32_t *errs,
	uint8_t *btypes, uint8_t *keys, size_t keyslen, int threads)
{
	manyjob j = { c, arena, iv, buf, len, base, offs, out, pos, errs, btypes, keys, 0, 0, NULL, 0, NULL, 0 };
	uint64_t total = 0;
	size_t k;
	fdn_entry e;
	int rc;

	if ((c->enc && iv == NULL) || base > FDN_ARENA_MAX || len > FDN_ARENA_MAX - base ||
	    n > SIZE_MAX / FDN_SCORE_SIZE || keyslen != n * FDN_SCORE_SIZE)
		return FDN_EARG;
	/*
	 * Plan from the headers alone, unverified: a record that claims more
	 * than fits in out by itself is left for fdn_unpack, which checks its
	 * tag before room is made for it; so a damaged length costs no memory.
	 */
	for (k = 0; k < n; k++) {
		size_t at;
		uint64_t r = 0;
		if (offs[k] < base || offs[k] - base >= len)
			return FDN_EARG;
		at = (size_t)(offs[k] - base);
		errs[k] = FDN_OK;
		if (check(c, NULL, arena, iv, offs[k], buf + at, len - at, 0, &e) == FDN_OK)
			r = e.rlen;	/* a bad header takes no room: the check finds it again */
		if (r > outcap - total) {
			if (k > 0)
				break;	/* the rest in another call */
			errs[k] = FDN_ESPACE;
			r = 0;
		}
		pos[k] = total;
		total += r;
	}
	pos[k] = total;
	j.n = k;
	if ((j.cuts = chunks(buf, len, base, offs, k, &j.ncuts)) == NULL)
		return FDN_ENOMEM;
	rc = fdn_parallel(threads, k, GRAIN, many_range, &j);
	free(j.cuts);
	return rc == FDN_OK ? (int64_t)k : rc;
}

/*
 * fdn_unpack_many for records of one block each, decoded straight to where
 * the caller wants them: record i's bs bytes at out + slots[i] * bs (a
 * window of an image, in image order, while the records come in log order),
 * so no copy follows. A record of another length is left undecoded with
 * FDN_ESPACE in errs[i] (the caller decodes it alone); a bad one has its code
 * there, as in fdn_unpack_many. Returns n, or FDN_EARG.
 */
int64_t fdn_unpack_at(fdn_codec *c, uint32_t arena, const uint8_t *iv,
	const uint8_t *buf, size_t len, uint64_t base, const uint64_t *offs,
	size_t n, uint8_t *out, size_t outcap, const uint64_t *slots, size_t bs,
	int32_t *errs, uint8_t *btypes, uint8_t *keys, size_t keyslen, int threads)
{
	manyjob j = { c, arena, iv, buf, len, base, offs, out, NULL, errs, btypes, keys, n, 0, slots, bs, NULL, 0 };
	size_t k;
	int rc;

	if ((c->enc && iv == NULL) || base > FDN_ARENA_MAX || len > FDN_ARENA_MAX - base ||
	    n > SIZE_MAX / FDN_SCORE_SIZE || keyslen != n * FDN_SCORE_SIZE || bs == 0)
		return FDN_EARG;
	for (k = 0; k < n; k++) {
		if (offs[k] < base || offs[k] - base >= len || slots[k] >= outcap / bs)
			return FDN_EARG;
		errs[k] = FDN_OK;	/* a length other than bs: many_one finds it (FDN_ESPACE) */
	}
	if ((j.cuts = chunks(buf, len, base, offs, n, &j.ncuts)) == NULL)
		return FDN_ENOMEM;
	rc = fdn_parallel(threads, n, GRAIN, many_range, &j);
	free(j.cuts);
	return rc == FDN_OK ? (int64_t)n : rc;
}

/*
 * Parse records from buf (buf[0] at arena offset base) into ents. Stops at
 * the end of buf or at zeros (*err = FDN_OK), when ents is full
 * (FDN_ESPACE: call again from *end), or at a bad or incomplete record (its
 * error). *end is the arena offset after the last good record.
 */
int64_t fdn_scan(fdn_codec *c, uint32_t arena, const uint8_t *iv, const uint8_t *buf,
	size_t len, uint64_t base, int verify, fdn_entry *ents, size_t nents,
	uint64_t *end, int *err)
{
	size_t pos = 0, count = 0;
	work *w = NULL;
	int rc = FDN_OK;

	*end = base;
	if (base > FDN_ARENA_MAX || len > FDN_ARENA_MAX - base)
		return *err = FDN_EARG;
	if (verify && (w = work_get(c, 0)) == NULL)
		return *err = FDN_ENOMEM;
	while (pos < len) {
		size_t avail = len - pos;
		if (count == nents) {
			rc = FDN_ESPACE;
			break;
		}
		if (zero(buf + pos, avail < FDN_HEADER_SIZE ? avail : FDN_HEADER_SIZE))
			break;
		if ((rc = check(c, w, arena, iv, base + pos, buf + pos, avail, verify, &ents[count])) != FDN_OK)
			break;
		pos += FDN_HEADER_SIZE + ents[count++].slen;
	}
	work_put(c, w, 0);
	*end = base + pos;
	*err = rc;
	return (int64_t)count;
}

int64_t fdn_scan_cols(fdn_codec *c, uint32_t arena, const uint8_t *iv, const uint8_t *buf,
	size_t len, uint64_t base, int verify, fdn_entry *ents, size_t nents,
	uint64_t *offs, uint8_t *btypes, uint8_t *keys, size_t keylen,
	uint8_t *tags, uint64_t *end, int *err)
{
	int64_t k;

	if (keylen > FDN_SCORE_SIZE) {
		*end = base;
		return *err = FDN_EARG;
	}
	k = fdn_scan(c, arena, iv, buf, len, base, verify, ents, nents, end, err);
	for (int64_t i = 0; i < k; i++) {
		offs[i] = ents[i].off;
		btypes[i] = ents[i].btype;
		memcpy(keys + (size_t)i * keylen, ents[i].key, keylen);
		memcpy(tags + (size_t)i * FDN_TAG_SIZE,
		       buf + (size_t)(ents[i].off - base) + FDN_H_TAG, FDN_TAG_SIZE);
	}
	return k;
}

typedef struct {
	fdn_codec *c;
	uint32_t arena;
	const uint8_t *iv;
	const uint8_t *buf;	/* buf[0] is at arena offset base */
	size_t len;
	uint64_t base;
	int depth;		/* FDN_TAGS, FDN_DECODED or FDN_SCORED */
	const fdn_hkey *skey;	/* NULL: scores are plain SHA-256 */
	const fdn_entry *ents;
	int32_t *errs;
	size_t n;
	size_t next;		/* the first chunk no thread has taken */
	size_t *cuts;		/* as manyjob's */
	size_t ncuts;
} checkjob;

/* Record i's verdict into errs[i], but for its score: *score is then the block to score (NULL:
 * nothing to score). Only a failure of the call is returned. */
static int check_one(checkjob *j, work *w, uint8_t **data, size_t *cap, size_t i, const uint8_t **score)
{
	const fdn_entry *e = &j->ents[i];
	const uint8_t *rec = j->buf + (size_t)(e->off - j->base), *d = rec + FDN_HEADER_SIZE;
	span sp = { j->arena, j->buf, j->len, j->base };
	uint8_t t[FDN_SCORE_SIZE];
	uint64_t bad;
	int rc;

	j->errs[i] = FDN_OK;
	*score = NULL;
	if ((rc = tag(j->c, w, j->arena, j->iv, e->off, rec, d, e->slen, t)) != FDN_OK)
		return rc;
	if (CRYPTO_memcmp(t, rec + FDN_H_TAG, FDN_TAG_SIZE) != 0) {
		j->errs[i] = FDN_ETAG;
		return FDN_OK;
	}
	if (j->depth < FDN_DECODED)
		return FDN_OK;
	if (e->codec != FDN_CODEC_RAW || j->c->enc) {
		/* the length is authentic now: room for it is no risk */
		if (*cap < e->rlen) {
			free(*data);
			*cap = 0;
			if ((*data = malloc(e->rlen)) == NULL)
				return FDN_ENOMEM;
			*cap = e->rlen;
		}
		rc = decode(j->c, w, j->iv, e, &sp, *data, &bad, 1);
		if (rc == FDN_EDECOMPRESS || (e->codec == FDN_CODEC_RUN && bad_record(rc))) {
			/* a run that does not decode: its own tag is good, so "decompress" */
			j->errs[i] = FDN_EDECOMPRESS;
			return FDN_OK;
		}
		if (rc != FDN_OK)
			return rc;
		d = *data;
	}
	if (j->depth >= FDN_SCORED && e->rlen > 0)
		*score = d;
	return FDN_OK;
}

/* Records pend[0, n), their blocks at d[0, n), scored against their key fields: four at once on
 * the CPU's lanes when n is 4 (the caller groups four only with the lanes on, and only of one
 * length and type), else alone. */
static int check_scores(checkjob *j, work *w, const size_t *pend, const uint8_t *const *d, int n)
{
	uint8_t t[4][FDN_SCORE_SIZE], *dig[4] = { t[0], t[1], t[2], t[3] };
	const fdn_entry *e = &j->ents[pend[0]];
	int rc;

	if (n == 4)
		fdn_lanes4(j->skey, e->btype, d, e->rlen, dig);
	else
		for (int k = 0; k < n; k++) {
			e = &j->ents[pend[k]];
			if ((rc = fdn_score(j->skey, w->md, e->btype, d[k], e->rlen, t[k])) != FDN_OK)
				return rc;
		}
	for (int k = 0; k < n; k++)
		if (memcmp(t[k], j->ents[pend[k]].key, FDN_SCORE_SIZE) != 0)
			j->errs[pend[k]] = FDN_ESCORE;
	return FDN_OK;
}

/*
 * As many_range: threads take STEAL records at a time, so a busy core holds up no one. Records
 * to score wait in groups of up to four of one length and type, each decoded into a buffer of its
 * own (slot k of data), and are scored four at once (lanes.c) when a group fills.
 */
static int check_range(void *arg, size_t lo, size_t hi)
{
	checkjob *j = arg;
	work *w = work_get(j->c, 0);
	uint8_t *data[4] = { NULL }, *swap;
	size_t cap[4] = { 0 }, pend[4], i, end, c;
	const uint8_t *d[4], *s;
	int rc = FDN_OK, n = 0, lanes = fdn_lanes_ok();

	(void)lo, (void)hi;
	if (w == NULL)
		return FDN_ENOMEM;
	while (rc == FDN_OK && take_chunk(&j->next, j->cuts, j->ncuts, &i, &end))
		for (; i < end && rc == FDN_OK; i++) {
			/* decoded into slot n, the first one no waiting record holds */
			if ((rc = check_one(j, w, &data[n], &cap[n], i, &s)) != FDN_OK || s == NULL)
				continue;
			if (n > 0 && (j->ents[i].rlen != j->ents[pend[0]].rlen ||
				      j->ents[i].btype != j->ents[pend[0]].btype)) {
				/* another length or type: the group goes alone, this record's slot becomes 0 */
				if ((rc = check_scores(j, w, pend, d, n)) != FDN_OK)
					break;
				swap = data[0], data[0] = data[n], data[n] = swap;
				c = cap[0], cap[0] = cap[n], cap[n] = c;
				n = 0;
			}
			pend[n] = i;
			d[n++] = s;
			if (n == 4 || !lanes) {
				rc = check_scores(j, w, pend, d, n);
				n = 0;
			}
		}
	if (rc == FDN_OK && n > 0)
		rc = check_scores(j, w, pend, d, n);
	for (int k = 0; k < 4; k++)
		free(data[k]);
	work_put(j->c, w, 0);
	return rc;
}

int64_t fdn_check(fdn_codec *c, uint32_t arena, const uint8_t *iv,
	const uint8_t *buf, size_t len, uint64_t base, uint64_t start, int depth,
	const uint8_t *skey, size_t skeylen, fdn_entry *ents, size_t nents,
	uint64_t *offs, uint32_t *raws, uint8_t *btypes, uint8_t *tags,
	int32_t *errs, uint64_t *end, int *err, int threads)
{
	checkjob j = { c, arena, iv, buf, len, base, depth, NULL, ents, errs, 0, 0, NULL, 0 };
	fdn_hkey hk;
	int64_t k;
	int rc;

	if ((c->enc && iv == NULL) || (skey == NULL && skeylen != 0) || depth < FDN_TAGS || depth > FDN_SCORED ||
	    start < base || start - base > len || base > FDN_ARENA_MAX || len > FDN_ARENA_MAX - base) {
		*end = start;
		return *err = FDN_EARG;
	}
	/* the walk from start; a run's members before it are read from buf */
	if ((k = fdn_scan(c, arena, iv, buf + (size_t)(start - base), len - (size_t)(start - base), start, 0,
			  ents, nents, end, err)) < 0)
		return k;
	j.n = (size_t)k;
	for (size_t i = 0; i < j.n; i++) {
		offs[i] = ents[i].off;
		raws[i] = ents[i].rlen;
		btypes[i] = ents[i].btype;
		memcpy(tags + i * FDN_TAG_SIZE, buf + (ents[i].off - base) + FDN_H_TAG, FDN_TAG_SIZE);
	}
	if ((j.cuts = chunks(buf, len, base, offs, j.n, &j.ncuts)) == NULL)
		return FDN_ENOMEM;
	if (depth >= FDN_SCORED && skey != NULL) {
		if ((rc = fdn_hkey_init(&hk, skey, skeylen)) != FDN_OK) {
			free(j.cuts);
			return rc;
		}
		j.skey = &hk;
	}
	rc = fdn_parallel(threads, j.n, GRAIN, check_range, &j);
	if (j.skey)
		fdn_hkey_free(&hk);
	free(j.cuts);
	return rc == FDN_OK ? k : rc;
}
