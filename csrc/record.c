/*
 * record.c: a block as it lies in an arena. Encrypt-then-MAC, with the tag
 * over the arena number and offset too, so a record is authentic only where
 * it was written; AES-CTR keyed by arena position, so any record decrypts
 * alone. A record is checked completely before one byte of it is believed.
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
 */
#include <pthread.h>
#include <stdlib.h>
#include <zstd.h>
#include <zstd_errors.h>
#include "internal.h"

enum {
	POOL = FDN_MAX_THREADS,	/* idle work contexts a codec keeps */
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
	ZSTD_CCtx *zc;
	ZSTD_DCtx *zd;
	uint8_t *tmp;		/* decrypted payload awaiting decompression */
	size_t tmpcap;
} work;

struct fdn_codec {
	int enc;
	uint8_t enckey[FDN_KEY_SIZE];
	fdn_hkey mac;
	int zlevel;
	pthread_mutex_t lock;
	work *idle[POOL];
	int nidle;
};

static void work_free(work *w)
{
	if (w == NULL)
		return;
	EVP_MD_CTX_free(w->md);
	EVP_CIPHER_CTX_free(w->aes);
	ZSTD_freeCCtx(w->zc);
	ZSTD_freeDCtx(w->zd);
	free(w->tmp);
	free(w);
}

static work *work_get(fdn_codec *c)
{
	work *w = NULL;

	pthread_mutex_lock(&c->lock);
	if (c->nidle > 0)
		w = c->idle[--c->nidle];
	pthread_mutex_unlock(&c->lock);
	if (w)
		return w;
	if ((w = calloc(1, sizeof *w)) == NULL || (w->md = EVP_MD_CTX_new()) == NULL)
		goto fail;
	if (c->enc && ((w->aes = EVP_CIPHER_CTX_new()) == NULL ||
	    !EVP_EncryptInit_ex2(w->aes, fdn_aes_ctr, c->enckey, NULL, NULL)))
		goto fail;
	return w;
fail:
	work_free(w);
	return NULL;
}

static void work_put(fdn_codec *c, work *w)
{
	if (w == NULL)
		return;
	pthread_mutex_lock(&c->lock);
	if (c->nidle < POOL) {
		c->idle[c->nidle++] = w;
		w = NULL;
	}
	pthread_mutex_unlock(&c->lock);
	work_free(w);
}

fdn_codec *fdn_codec_new(const uint8_t *enckey, size_t enclen,
	const uint8_t *mackey, size_t maclen, int zlevel)
{
	fdn_codec *c;

	if ((enckey != NULL && enclen != FDN_KEY_SIZE) || (mackey == NULL && maclen != 0) ||
	    (zlevel != 0 && (zlevel < ZSTD_minCLevel() || zlevel > ZSTD_maxCLevel())) ||
	    fdn_init() != FDN_OK)
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
	c->zlevel = zlevel;
	pthread_mutex_init(&c->lock, NULL);
	return c;
}

void fdn_codec_free(fdn_codec *c)
{
	if (c == NULL)
		return;
	while (c->nidle > 0)
		work_free(c->idle[--c->nidle]);
	fdn_hkey_free(&c->mac);
	OPENSSL_cleanse(c->enckey, sizeof c->enckey);
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

/* XOR len bytes with the arena keystream from arena position pos. */
static int ctr(work *w, const uint8_t *iv, uint64_t pos, uint8_t *dst,
	const uint8_t *src, size_t len)
{
	static const uint8_t zero[AES_BLOCK];
	uint8_t cb[AES_BLOCK], junk[AES_BLOCK];
	int outl;

	counter(cb, iv, pos / AES_BLOCK);
	if (!EVP_EncryptInit_ex2(w->aes, NULL, NULL, cb, NULL))
		return FDN_ECRYPTO;
	if (pos % AES_BLOCK && !EVP_EncryptUpdate(w->aes, junk, &outl, zero, (int)(pos % AES_BLOCK)))
		return FDN_ECRYPTO;
	while (len > 0) {
		int k = len > CHUNK ? CHUNK : (int)len;
		if (!EVP_EncryptUpdate(w->aes, dst, &outl, src, k))
			return FDN_ECRYPTO;
		dst += k;
		src += k;
		len -= k;
	}
	return FDN_OK;
}

/* HMAC(mac, u32le(arena) || u32le(off) || header[0:48] || payload) */
static int tag(fdn_codec *c, work *w, uint32_t arena, uint64_t off,
	const uint8_t *h, const uint8_t *payload, size_t len, uint8_t out[FDN_SCORE_SIZE])
{
	uint8_t where[2 * FDN_U32];
	int rc;

	fdn_put32(where, arena);
	fdn_put32(where + FDN_U32, (uint32_t)off);
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
static int check(fdn_codec *c, work *w, uint32_t arena, uint64_t off,
	const uint8_t *p, size_t avail, int verify, fdn_entry *e)
{
	uint8_t t[FDN_SCORE_SIZE];
	uint32_t S, R;
	int rc;

	if (avail < FDN_MAGIC_SIZE)
		return FDN_ETRUNCATED;
	if (memcmp(p + FDN_H_MAGIC, FDN_MAGIC, FDN_MAGIC_SIZE) != 0)
		return FDN_EMAGIC;
	if (avail < FDN_HEADER_SIZE)
		return FDN_ETRUNCATED;
	if (p[FDN_H_CODEC] > FDN_CODEC_ZSTD || p[FDN_H_RESERVED] || p[FDN_H_RESERVED + 1])
		return FDN_EMAGIC;
	S = fdn_get32(p + FDN_H_SLEN);
	R = fdn_get32(p + FDN_H_RLEN);
	if (p[FDN_H_CODEC] == FDN_CODEC_RAW ? S != R : S >= R)
		return FDN_ELENGTH;
	if (off + FDN_HEADER_SIZE + S > FDN_ARENA_MAX)
		return FDN_ELENGTH;
	if (avail - FDN_HEADER_SIZE < S)
		return FDN_ETRUNCATED;
	if (verify) {
		if ((rc = tag(c, w, arena, off, p, p + FDN_HEADER_SIZE, S, t)) != FDN_OK)
			return rc;
		if (CRYPTO_memcmp(t, p + FDN_H_TAG, FDN_TAG_SIZE) != 0)
			return FDN_ETAG;
	}
	e->off = off;
	e->slen = S;
	e->rlen = R;
	e->btype = p[FDN_H_BTYPE];
	e->codec = p[FDN_H_CODEC];
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

/* Put block i's payload, compressed if that is smaller, at dst; a raw payload only if raw
 * (else the compaction copies it from the block, once). */
static int fill(packjob *j, work *w, size_t i, uint8_t *dst, int raw)
{
	const uint8_t *src = j->buf + i * j->blen;
	size_t r;

	if (j->c->zlevel != 0 && j->blen > 1 && !flat(src, j->blen)) {
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
	h[FDN_H_RESERVED] = h[FDN_H_RESERVED + 1] = 0;
	fdn_put32(h + FDN_H_SLEN, S);
	fdn_put32(h + FDN_H_RLEN, (uint32_t)j->blen);
	memcpy(h + FDN_H_KEY, j->keys + i * FDN_SCORE_SIZE, FDN_SCORE_SIZE);
	if (src == NULL)
		src = h + FDN_HEADER_SIZE;
	if (j->c->enc) {
		if ((rc = ctr(w, j->iv, off + FDN_HEADER_SIZE, h + FDN_HEADER_SIZE, src, S)) != FDN_OK)
			return rc;
	} else if (src != h + FDN_HEADER_SIZE)
		memcpy(h + FDN_HEADER_SIZE, src, S);
	if ((rc = tag(j->c, w, j->arena, off, h, h + FDN_HEADER_SIZE, S, t)) != FDN_OK)
		return rc;
	memcpy(h + FDN_H_TAG, t, FDN_TAG_SIZE);
	if (j->tags != NULL)
		memcpy(j->tags + i * FDN_TAG_SIZE, t, FDN_TAG_SIZE);
	j->pos[i] = off;
	return FDN_OK;
}

static int fill_range(void *arg, size_t lo, size_t hi)
{
	packjob *j = arg;
	work *w = work_get(j->c);
	int rc = w ? FDN_OK : FDN_ENOMEM;

	for (size_t i = lo; i < hi && rc == FDN_OK; i++)
		rc = fill(j, w, i, j->scratch + i * j->blen, 0);
	work_put(j->c, w);
	return rc;
}

/* fill_range with scratch == buf: each payload made aside, then put over its own block (which is
 * read by then); a raw block stays where it is. */
static int fill_in_place(void *arg, size_t lo, size_t hi)
{
	packjob *j = arg;
	work *w = work_get(j->c);
	int rc = w ? FDN_OK : FDN_ENOMEM;

	if (rc == FDN_OK && w->tmpcap < j->blen) {
		free(w->tmp);
		w->tmpcap = 0;
		if ((w->tmp = malloc(j->blen)) == NULL)
			rc = FDN_ENOMEM;
		else
			w->tmpcap = j->blen;
	}
	for (size_t i = lo; i < hi && rc == FDN_OK; i++)
		if ((rc = fill(j, w, i, w->tmp, 0)) == FDN_OK && j->codec[i] == FDN_CODEC_ZSTD)
			memcpy(j->scratch + i * j->blen, w->tmp, j->slen[i]);
	work_put(j->c, w);
	return rc;
}

static int seal_range(void *arg, size_t lo, size_t hi)
{
	packjob *j = arg;
	work *w = work_get(j->c);
	int rc = w ? FDN_OK : FDN_ENOMEM;

	for (size_t i = lo; i < hi && rc == FDN_OK; i++)
		rc = seal(j, w, i, j->pos[i], j->codec[i] == FDN_CODEC_RAW ?
			j->buf + i * j->blen : j->scratch + i * j->blen);
	work_put(j->c, w);
	return rc;
}

int64_t fdn_pack(fdn_codec *c, uint32_t arena, const uint8_t *iv,
	uint64_t offset, int btype, const uint8_t *buf, size_t len, size_t bs,
	const uint8_t *keys, size_t keyslen, uint8_t *out, size_t outcap,
	uint64_t *offs, size_t noffs, int threads, uint8_t *scratch, size_t scratchcap)
{
	packjob j = { c, arena, iv, offset, (uint8_t)btype, buf, bs == len ? len : bs,
		keys, out, offs, NULL, NULL, NULL, NULL };
	uint64_t pos = 0;
	size_t n, i;
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
	if (j.slen == NULL || j.codec == NULL) {
		rc = FDN_ENOMEM;
		goto out;
	}
	if (threads <= 1 || n < 2 * GRAIN) {
		/* one pass: each record goes straight where it belongs */
		if ((w = work_get(c)) == NULL) {
			rc = FDN_ENOMEM;
			goto out;
		}
		for (i = 0, rc = FDN_OK; i < n && rc == FDN_OK; i++) {
			if ((rc = fill(&j, w, i, out + pos + FDN_HEADER_SIZE, 1)) != FDN_OK ||
			    (rc = seal(&j, w, i, pos, NULL)) != FDN_OK)
				break;
			pos += FDN_HEADER_SIZE + j.slen[i];
		}
		work_put(c, w);
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
	if ((rc = fdn_share(threads, n, GRAIN, fill_range, &j)) != FDN_OK)
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
	return rc == FDN_OK ? (int64_t)pos : rc;
}

int fdn_fill(fdn_codec *c, const uint8_t *buf, size_t len, size_t bs,
	uint8_t *scratch, size_t scratchcap, uint32_t *sizes, uint8_t *codecs,
	size_t n, int threads)
{
	packjob j = { c, 0, NULL, 0, 0, buf, bs == len ? len : bs, NULL, NULL, NULL,
		sizes, codecs, scratch, NULL };
	size_t k;

	if (fdn_nblocks(len, bs, &k) != FDN_OK || k != n || j.blen == 0 || j.blen > UINT32_MAX ||
	    scratch == NULL || scratchcap / j.blen < n)
		return FDN_EARG;
	if (scratch == buf)
		return fdn_share(threads, n, GRAIN, fill_in_place, &j);
	if ((uintptr_t)scratch < (uintptr_t)buf + len && (uintptr_t)buf < (uintptr_t)scratch + n * j.blen)
		return FDN_EARG;	/* overlapping, but not the blocks themselves */
	return fdn_share(threads, n, GRAIN, fill_range, &j);
}

int64_t fdn_seal(fdn_codec *c, uint32_t arena, const uint8_t *iv,
	uint64_t offset, int btype, const uint8_t *buf, size_t len, size_t bs,
	const uint8_t *keys, size_t keyslen, const uint8_t *scratch, size_t scratchcap,
	const uint32_t *sizes, const uint8_t *codecs, size_t n, size_t first,
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
	/* the layout: each record's place from the sizes alone, as many as fit */
	for (k = first; k < n; k++) {
		uint64_t rec = FDN_HEADER_SIZE + (uint64_t)sizes[k];
		if (codecs[k] == FDN_CODEC_RAW ? sizes[k] != blen :
		    codecs[k] != FDN_CODEC_ZSTD || sizes[k] >= blen)
			return FDN_EARG;	/* not what fdn_fill leaves */
		if (rec > limit - pos)
			break;
		offs[k - first] = pos;
		pos += rec;
	}
	j = (packjob){ c, arena, iv, offset, (uint8_t)btype, buf + first * blen, blen,
		keys + first * FDN_SCORE_SIZE, out, offs, (uint32_t *)sizes + first,
		(uint8_t *)codecs + first, (uint8_t *)scratch + first * blen, tags };
	k -= first;
	if (k > 0) {
		int rc = fdn_share(threads, k, GRAIN, seal_range, &j);
		if (rc != FDN_OK)
			return rc;
	}
	*count = k;
	return (int64_t)pos;
}

static int decode(fdn_codec *c, work *w, const uint8_t *iv, const fdn_entry *e,
	const uint8_t *payload, uint8_t *out)
{
	const uint8_t *src = payload;
	size_t r;
	int rc;

	if (e->codec == FDN_CODEC_RAW) {
		if (c->enc)
			return ctr(w, iv, e->off + FDN_HEADER_SIZE, out, payload, e->slen);
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
		if ((rc = ctr(w, iv, e->off + FDN_HEADER_SIZE, w->tmp, payload, e->slen)) != FDN_OK)
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
	uint64_t offset, const uint8_t *rec, size_t reclen, fdn_entry *e,
	uint8_t *out, size_t outcap)
{
	work *w;
	int rc;

	if (offset >= FDN_ARENA_MAX || (c->enc && iv == NULL))
		return FDN_EARG;
	if ((w = work_get(c)) == NULL)
		return FDN_ENOMEM;
	rc = check(c, w, arena, offset, rec, reclen, 1, e);
	if (rc == FDN_OK && outcap < e->rlen)
		rc = FDN_ESPACE;
	if (rc == FDN_OK)
		rc = decode(c, w, iv, e, rec + FDN_HEADER_SIZE, out);
	work_put(c, w);
	return rc == FDN_OK ? (int64_t)e->rlen : rc;
}

/* A record that must not be believed, as opposed to a failure of the call. */
static int bad_record(int rc)
{
	return rc == FDN_EMAGIC || rc == FDN_ELENGTH || rc == FDN_ETAG ||
		rc == FDN_EDECOMPRESS || rc == FDN_ETRUNCATED;
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
	size_t next;		/* the first record no thread has taken */
	const uint64_t *slots;	/* fdn_unpack_at: record i's data at out + slots[i] * bs */
	size_t bs;
} manyjob;

/* Check and decode record i; a bad record is no failure, only its errs[i]. */
static int many_one(manyjob *j, work *w, size_t i)
{
	size_t at = (size_t)(j->offs[i] - j->base);
	uint8_t *key = j->keys + i * FDN_SCORE_SIZE;
	fdn_entry e;
	int rc;

	memset(key, 0, FDN_SCORE_SIZE);
	j->btypes[i] = 0;
	if (j->errs[i] != FDN_OK)
		return FDN_OK;	/* FDN_ESPACE: too big to plan for */
	rc = check(j->c, w, j->arena, j->offs[i], j->buf + at, j->len - at, 1, &e);
	if (rc == FDN_OK && e.rlen != (j->slots ? j->bs : j->pos[i + 1] - j->pos[i]))
		rc = FDN_ESPACE;	/* the header changed since it was planned */
	if (rc == FDN_OK)
		rc = decode(j->c, w, j->iv, &e, j->buf + at + FDN_HEADER_SIZE,
			j->slots ? j->out + j->slots[i] * j->bs : j->out + j->pos[i]);
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
	work *w = work_get(j->c);
	int rc = FDN_OK;

	(void)lo, (void)hi;	/* fdn_parallel only starts the threads */
	if (w == NULL)
		return FDN_ENOMEM;
	while (rc == FDN_OK) {
		size_t i = __atomic_fetch_add(&j->next, STEAL, __ATOMIC_RELAXED), end;
		if (i >= j->n)
			break;
		end = j->n - i > STEAL ? i + STEAL : j->n;
		for (; i < end && rc == FDN_OK; i++)
			rc = many_one(j, w, i);
	}
	work_put(j->c, w);
	return rc;
}

int64_t fdn_unpack_many(fdn_codec *c, uint32_t arena, const uint8_t *iv,
	const uint8_t *buf, size_t len, uint64_t base, const uint64_t *offs,
	size_t n, uint8_t *out, size_t outcap, uint64_t *pos, int32_t *errs,
	uint8_t *btypes, uint8_t *keys, size_t keyslen, int threads)
{
	manyjob j = { c, arena, iv, buf, len, base, offs, out, pos, errs, btypes, keys, 0, 0, NULL, 0 };
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
		if (check(c, NULL, arena, offs[k], buf + at, len - at, 0, &e) == FDN_OK)
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
	if ((rc = fdn_parallel(threads, k, GRAIN, many_range, &j)) != FDN_OK)
		return rc;
	return (int64_t)k;
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
	manyjob j = { c, arena, iv, buf, len, base, offs, out, NULL, errs, btypes, keys, n, 0, slots, bs };
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
	if ((rc = fdn_parallel(threads, n, GRAIN, many_range, &j)) != FDN_OK)
		return rc;
	return (int64_t)n;
}

static int zero(const uint8_t *p, size_t n)
{
	return n == 0 || (p[0] == 0 && memcmp(p, p + 1, n - 1) == 0);
}

/*
 * Parse records from buf (buf[0] at arena offset base) into ents. Stops at
 * the end of buf or at zeros (*err = FDN_OK), when ents is full
 * (FDN_ESPACE: call again from *end), or at a bad or incomplete record (its
 * error). *end is the arena offset after the last good record.
 */
int64_t fdn_scan(fdn_codec *c, uint32_t arena, const uint8_t *buf,
	size_t len, uint64_t base, int verify, fdn_entry *ents, size_t nents,
	uint64_t *end, int *err)
{
	size_t pos = 0, count = 0;
	work *w = NULL;
	int rc = FDN_OK;

	*end = base;
	if (base > FDN_ARENA_MAX || len > FDN_ARENA_MAX - base)
		return *err = FDN_EARG;
	if (verify && (w = work_get(c)) == NULL)
		return *err = FDN_ENOMEM;
	while (pos < len) {
		size_t avail = len - pos;
		if (count == nents) {
			rc = FDN_ESPACE;
			break;
		}
		if (zero(buf + pos, avail < FDN_HEADER_SIZE ? avail : FDN_HEADER_SIZE))
			break;
		if ((rc = check(c, w, arena, base + pos, buf + pos, avail, verify, &ents[count])) != FDN_OK)
			break;
		pos += FDN_HEADER_SIZE + ents[count++].slen;
	}
	work_put(c, w);
	*end = base + pos;
	*err = rc;
	return (int64_t)count;
}

int64_t fdn_scan_cols(fdn_codec *c, uint32_t arena, const uint8_t *buf,
	size_t len, uint64_t base, int verify, fdn_entry *ents, size_t nents,
	uint64_t *offs, uint8_t *btypes, uint8_t *keys, size_t keylen,
	uint8_t *tags, uint64_t *end, int *err)
{
	int64_t k;

	if (keylen > FDN_SCORE_SIZE) {
		*end = base;
		return *err = FDN_EARG;
	}
	k = fdn_scan(c, arena, buf, len, base, verify, ents, nents, end, err);
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
	uint64_t base;
	int depth;		/* FDN_TAGS, FDN_DECODED or FDN_SCORED */
	const fdn_hkey *skey;	/* NULL: scores are plain SHA-256 */
	const fdn_entry *ents;
	int32_t *errs;
	size_t n;
	size_t next;		/* the first record no thread has taken */
} checkjob;

/* Record i's verdict into errs[i]; only a failure of the call is returned. */
static int check_one(checkjob *j, work *w, uint8_t **data, size_t *cap, size_t i)
{
	const fdn_entry *e = &j->ents[i];
	const uint8_t *rec = j->buf + (size_t)(e->off - j->base), *d = rec + FDN_HEADER_SIZE;
	uint8_t t[FDN_SCORE_SIZE];
	int rc;

	j->errs[i] = FDN_OK;
	if ((rc = tag(j->c, w, j->arena, e->off, rec, d, e->slen, t)) != FDN_OK)
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
		if ((rc = decode(j->c, w, j->iv, e, d, *data)) == FDN_EDECOMPRESS) {
			j->errs[i] = rc;
			return FDN_OK;
		}
		if (rc != FDN_OK)
			return rc;
		d = *data;
	}
	if (j->depth >= FDN_SCORED && e->rlen > 0) {
		if ((rc = fdn_score(j->skey, w->md, e->btype, d, e->rlen, t)) != FDN_OK)
			return rc;
		if (memcmp(t, e->key, FDN_SCORE_SIZE) != 0)
			j->errs[i] = FDN_ESCORE;
	}
	return FDN_OK;
}

/* Take the next STEAL of n records no thread has taken yet: [*i, *end); 0 when none is left. */
static int take(size_t *next, size_t n, size_t *i, size_t *end)
{
	*i = __atomic_fetch_add(next, STEAL, __ATOMIC_RELAXED);
	*end = *i < n && n - *i > STEAL ? *i + STEAL : n;
	return *i < n;
}

/* As many_range: threads take STEAL records at a time, so a busy core holds up no one. */
static int check_range(void *arg, size_t lo, size_t hi)
{
	checkjob *j = arg;
	work *w = work_get(j->c);
	uint8_t *data = NULL;
	size_t cap = 0, i, end;
	int rc = FDN_OK;

	(void)lo, (void)hi;
	if (w == NULL)
		return FDN_ENOMEM;
	while (rc == FDN_OK && take(&j->next, j->n, &i, &end))
		for (; i < end && rc == FDN_OK; i++)
			rc = check_one(j, w, &data, &cap, i);
	free(data);
	work_put(j->c, w);
	return rc;
}

int64_t fdn_check(fdn_codec *c, uint32_t arena, const uint8_t *iv,
	const uint8_t *buf, size_t len, uint64_t base, int depth,
	const uint8_t *skey, size_t skeylen, fdn_entry *ents, size_t nents,
	uint64_t *offs, uint32_t *raws, uint8_t *btypes, uint8_t *tags,
	int32_t *errs, uint64_t *end, int *err, int threads)
{
	checkjob j = { c, arena, iv, buf, base, depth, NULL, ents, errs, 0, 0 };
	fdn_hkey hk;
	int64_t k;
	int rc;

	if ((c->enc && iv == NULL) || (skey == NULL && skeylen != 0) || depth < FDN_TAGS || depth > FDN_SCORED) {
		*end = base;
		return *err = FDN_EARG;
	}
	if ((k = fdn_scan(c, arena, buf, len, base, 0, ents, nents, end, err)) < 0)
		return k;
	j.n = (size_t)k;
	for (size_t i = 0; i < j.n; i++) {
		offs[i] = ents[i].off;
		raws[i] = ents[i].rlen;
		btypes[i] = ents[i].btype;
		memcpy(tags + i * FDN_TAG_SIZE, buf + (ents[i].off - base) + FDN_H_TAG, FDN_TAG_SIZE);
	}
	if (depth >= FDN_SCORED && skey != NULL) {
		if ((rc = fdn_hkey_init(&hk, skey, skeylen)) != FDN_OK)
			return rc;
		j.skey = &hk;
	}
	rc = fdn_parallel(threads, j.n, GRAIN, check_range, &j);
	if (j.skey)
		fdn_hkey_free(&hk);
	return rc == FDN_OK ? k : rc;
}
