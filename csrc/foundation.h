/*
 * foundation.h: the whole interface of the C core, written for cffi.
 *
 * C owns only the tight loops over buffers that Python hands it; Python
 * owns files, the meaning of the bytes, and the allocation of every output.
 * So every function takes the length of every buffer it touches, checks it,
 * and returns a negative FDN_E* code rather than write out of bounds.
 *
 * foundation/native/build.py feeds this file to ffibuilder.cdef() after
 * dropping the lines that start with '#': constants are enums, not macros.
 * The byte layouts are drawn in foundation/native/reference.py and
 * docs/format.md; internal.h holds the field offsets.
 */
#ifndef FDN_FOUNDATION_H
#define FDN_FOUNDATION_H

#include <stddef.h>
#include <stdint.h>

enum {
	FDN_API_VERSION = 3,	/* bump on any change visible to foundation/native */
	FDN_SCORE_SIZE = 32,	/* SHA-256, and the record's key field */
	FDN_WEAK_SIZE = 8,	/* weak hash, u64 big-endian */
	FDN_HEADER_SIZE = 64,	/* record header, see internal.h */
	FDN_TAG_SIZE = 16,	/* the record's tag: Poly1305, or truncated HMAC-SHA256 */
	FDN_KEY_SIZE = 32,	/* AES-256 key */
	FDN_IV_SIZE = 16,	/* AES-CTR initial counter block of an arena */
	FDN_MAX_THREADS = 64,
	FDN_RUN_MAX = 64,	/* most records in a run (codec 2) */
	FDN_RUN_BYTES = 1 << 20	/* a writer's most raw bytes in a run */
};

enum {
	FDN_OK = 0,
	FDN_EARG = -1,		/* a size or argument is out of range */
	FDN_ENOMEM = -2,
	FDN_ECRYPTO = -3,	/* OpenSSL failed */
	FDN_EZSTD = -4,		/* zstd failed to set up */
	FDN_ESPACE = -5,	/* an output buffer is too small: call again with more */
	/* a record is bad; the names are RecordError.kind in Python */
	FDN_EMAGIC = -10,	/* not a record header: magic, codec or reserved (run fields) */
	FDN_ELENGTH = -11,	/* impossible stored/raw lengths */
	FDN_ETAG = -12,		/* the tag does not match: damaged or forged */
	FDN_EDECOMPRESS = -13,	/* authentic, yet the payload does not decode to R bytes */
	FDN_ETRUNCATED = -14,	/* the buffer ends inside the record */
	FDN_ESCORE = -15,	/* the data does not match its score (fdn_check) */
	FDN_ESPAN = -16,	/* a run member whose run is not wholly in the bytes given */
	FDN_EBUCKET = -20	/* an index bucket's count exceeds its capacity */
};

int fdn_api_version(void);

/*
 * Blocks. A buffer of len bytes holds n = len / bs blocks (len % bs == 0),
 * or exactly one block when bs == len (a short or empty last block).
 */
int fdn_zero_flags(const uint8_t *buf, size_t len, size_t bs,
	uint8_t *out, size_t outlen);
int fdn_scores(const uint8_t *buf, size_t len, size_t bs, int btype,
	const uint8_t *key, size_t keylen, int keyed,
	const uint8_t *skip, size_t nskip,
	uint8_t *out, size_t outlen, int threads);
/* fdn_scores hashes four blocks at once where the CPU has SHA instructions;
 * fdn_lanes(0) turns that off, fdn_lanes(1) back on -> whether it is on. */
int fdn_lanes(int on);
int fdn_weak_hashes(const uint8_t *buf, size_t len, size_t bs, int btype,
	uint64_t seed, const uint8_t *skip, size_t nskip,
	uint8_t *out, size_t outlen);
int fdn_equal(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen);

/*
 * Records. A codec holds the keys and a pool of reusable OpenSSL and zstd
 * contexts; it is safe to use from several threads at once.
 */
typedef struct fdn_codec fdn_codec;

typedef struct {
	uint64_t off;		/* arena offset of the record */
	uint32_t slen;		/* stored payload length S */
	uint32_t rlen;		/* raw block length R */
	uint8_t btype;
	uint8_t codec;		/* 0 raw, 1 zstd, 2 run slice */
	uint8_t key[32];
	uint8_t runj;		/* codec 2: this record's place j in its run of runk */
	uint8_t runk;
} fdn_entry;

fdn_codec *fdn_codec_new(const uint8_t *enckey, size_t enclen,
	const uint8_t *mackey, size_t maclen, const uint8_t *tagkey, size_t taglen, int zlevel);
void fdn_codec_free(fdn_codec *c);
int64_t fdn_pack(fdn_codec *c, uint32_t arena, const uint8_t *iv,
	uint64_t offset, int btype, const uint8_t *buf, size_t len, size_t bs,
	const uint8_t *keys, size_t keyslen, uint8_t *out, size_t outcap,
	uint64_t *offs, size_t noffs, int threads, uint8_t *scratch, size_t scratchcap, int run);
/*
 * fdn_pack in two steps, so that a batch is compressed before it is known
 * where its records go (the compression of one batch then runs beside the
 * sealing of the one before). fdn_fill decides each of the n blocks of buf
 * as fdn_pack would: codecs[i] and sizes[i] its stored codec and length, a
 * zstd payload at scratch[i * blen] (scratch: n * blen bytes; it may be buf
 * itself, whose compressed blocks are then replaced by their payloads: no
 * buffer but the blocks' own). fdn_seal then
 * writes the records of blocks [first, first + k) at arena offset `offset`
 * into out, the most that fit in min(room, outcap) bytes (k may be 0), each
 * one's arena offset to offs and tag to tags (16 bytes each; both with room
 * for n - first), *count = k; returns the bytes written. The records are
 * byte for byte those fdn_pack writes at the same offsets.
 *
 * run > 1: neighbouring compressible (not flat) blocks are compressed as one
 * zstd frame per run of 2..min(run, 64, FDN_RUN_BYTES / blen) of them, the
 * frame cut into equal slices (codec 2, docs/format.md 5.2): runs[2i] and
 * runs[2i + 1] are block i's place j and its run's length k (0 and 0 for a
 * block of its own), the zero-padded frame at scratch[first * blen], slice j
 * at scratch[first * blen + j * sizes[i]]. fdn_seal places a run whole or
 * not at all. runs NULL: no runs (as run = 1).
 */
int fdn_fill(fdn_codec *c, const uint8_t *buf, size_t len, size_t bs,
	uint8_t *scratch, size_t scratchcap, uint32_t *sizes, uint8_t *codecs,
	size_t n, int threads, int run, uint8_t *runs);
int64_t fdn_seal(fdn_codec *c, uint32_t arena, const uint8_t *iv,
	uint64_t offset, int btype, const uint8_t *buf, size_t len, size_t bs,
	const uint8_t *keys, size_t keyslen, const uint8_t *scratch, size_t scratchcap,
	const uint32_t *sizes, const uint8_t *codecs, const uint8_t *runs, size_t n, size_t first,
	uint64_t room, uint8_t *out, size_t outcap, uint64_t *offs, uint8_t *tags,
	size_t *count, int threads);
/*
 * The record at arena offset `offset` of buf (buf[0] at arena offset base,
 * len bytes): a run slice (codec 2) needs its whole run in buf, else
 * FDN_ESPAN. On a bad record e->off names the record at fault (a member of
 * the run whose check failed), else the record itself.
 */
int64_t fdn_unpack(fdn_codec *c, uint32_t arena, const uint8_t *iv,
	uint64_t offset, const uint8_t *buf, size_t len, uint64_t base, fdn_entry *e,
	uint8_t *out, size_t outcap);
/*
 * A batch of records, all inside buf (buf[0] at arena offset base), at the
 * arena offsets offs[0, n), in any order, repeats allowed. Decodes the
 * first k records whose data fit in out together (returns k >= 1 when n >
 * 0): record i's data is out[pos[i], pos[i + 1]) (pos has room for n + 1;
 * errs, btypes and keys for n, keys 32 bytes each). A bad record is no
 * failure of the call: its FDN_E* code goes to errs[i] (0 when good) and it
 * takes no room in out; FDN_ESPACE there means the record does not fit in
 * out alone (decode it with fdn_unpack, which checks its tag first), and
 * FDN_ESPAN that fdn_unpack of the record with these bytes finds the same
 * (its own tag holds; its run is not wholly in buf).
 */
int64_t fdn_unpack_many(fdn_codec *c, uint32_t arena, const uint8_t *iv,
	const uint8_t *buf, size_t len, uint64_t base, const uint64_t *offs,
	size_t n, uint8_t *out, size_t outcap, uint64_t *pos, int32_t *errs,
	uint8_t *btypes, uint8_t *keys, size_t keyslen, int threads);
/* fdn_unpack_many of one-block records, record i's data at out + slots[i] * bs. */
int64_t fdn_unpack_at(fdn_codec *c, uint32_t arena, const uint8_t *iv,
	const uint8_t *buf, size_t len, uint64_t base, const uint64_t *offs,
	size_t n, uint8_t *out, size_t outcap, const uint64_t *slots, size_t bs,
	int32_t *errs, uint8_t *btypes, uint8_t *keys, size_t keyslen, int threads);
int64_t fdn_scan(fdn_codec *c, uint32_t arena, const uint8_t *iv, const uint8_t *buf,
	size_t len, uint64_t base, int verify, fdn_entry *ents, size_t nents,
	uint64_t *end, int *err);
/*
 * fdn_scan, with what it found also in columns (every array has room for
 * nents): record i's offset in offs[i], type in btypes[i], the first keylen
 * bytes of its key field in keys[keylen i, keylen (i + 1)) and its tag in
 * tags[16 i, 16 i + 16); so a caller builds no object per record.
 */
int64_t fdn_scan_cols(fdn_codec *c, uint32_t arena, const uint8_t *iv, const uint8_t *buf,
	size_t len, uint64_t base, int verify, fdn_entry *ents, size_t nents,
	uint64_t *offs, uint8_t *btypes, uint8_t *keys, size_t keylen,
	uint8_t *tags, uint64_t *end, int *err);
enum { FDN_TAGS = 0, FDN_DECODED = 1, FDN_SCORED = 2 };	/* fdn_check's depth */
/*
 * Check records completely, as verify does, from arena offset start of buf
 * (buf[0] at arena offset base; start >= base). The walk follows the headers as fdn_scan does without
 * verifying, and stops where it stops (*end, *err; FDN_ESPACE when nents
 * records are found: call again from *end), with ents as its scratch; then
 * every record it found is checked, spread over `threads` threads, as deep
 * as `depth` says: FDN_TAGS its tag, FDN_DECODED its decryption and
 * decoding too, FDN_SCORED its data against its key field too (the score
 * fdn_scores makes: keyed by skey when skey is not NULL).
 * Record i's offset, raw length, type and tag go to offs[i], raws[i],
 * btypes[i] and tags[16 i, 16 i + 16), its verdict to errs[i]: FDN_OK,
 * FDN_ETAG, FDN_EDECOMPRESS or FDN_ESCORE (a bad record is no failure of
 * the call). A run slice whose run does not decode (another member is bad,
 * or the run is not wholly in buf) is FDN_EDECOMPRESS; FDN_ETAG is only
 * ever a record's own tag. Every array has room for nents. Returns the number of records.
 */
int64_t fdn_check(fdn_codec *c, uint32_t arena, const uint8_t *iv,
	const uint8_t *buf, size_t len, uint64_t base, uint64_t start, int depth,
	const uint8_t *skey, size_t skeylen, fdn_entry *ents, size_t nents,
	uint64_t *offs, uint32_t *raws, uint8_t *btypes, uint8_t *tags,
	int32_t *errs, uint64_t *end, int *err, int threads);

/*
 * Index buckets: u32le count, then count entries of keylen + 8 bytes
 * (key, u64le addr). Regions are whole buckets [first, first + nregion).
 */
uint64_t fdn_bucket_home(const uint8_t *key, size_t keylen, uint64_t nbuckets);
int64_t fdn_bucket_find(const uint8_t *bucket, size_t bsize, size_t keylen,
	const uint8_t *key, uint64_t *out, size_t outcap);
int fdn_sort_entries(uint8_t *ents, size_t len, size_t entsize, size_t keylen);
int64_t fdn_merge(uint8_t *region, size_t rlen, uint64_t first,
	uint64_t nregion, size_t bsize, size_t keylen, const uint8_t *ents,
	size_t elen, uint64_t nbuckets, uint8_t *spill, size_t spillcap);
int64_t fdn_lookup(const uint8_t *region, size_t rlen, uint64_t first,
	uint64_t nregion, size_t bsize, size_t keylen, const uint8_t *key,
	uint64_t nbuckets, uint64_t *out, size_t outcap, int *more);

/*
 * Summary table: an in-memory multimap key -> addrs, insertion ordered.
 * fdn_table_take hands its entries (key, u64le addr) over as they lie;
 * the caller frees them with fdn_entries_free.
 */
typedef struct fdn_table fdn_table;

fdn_table *fdn_table_new(size_t keylen, size_t hint);
void fdn_table_free(fdn_table *t);
int fdn_table_add(fdn_table *t, const uint8_t *keys, size_t klen,
	const uint64_t *addrs, size_t n);
int64_t fdn_table_find(fdn_table *t, const uint8_t *key, size_t keylen,
	uint64_t *out, size_t outcap);
uint64_t fdn_table_len(fdn_table *t);
void fdn_table_clear(fdn_table *t);
int64_t fdn_table_entries(fdn_table *t, uint8_t *out, size_t outlen);
int64_t fdn_table_take(fdn_table *t, uint8_t **out);
void fdn_entries_free(uint8_t *ents, size_t len);
int fdn_tables_lookup(fdn_table **ts, size_t nt, const uint8_t *keys,
	size_t klen, const uint8_t *skip, size_t nskip, uint64_t *addrs,
	int32_t *which, size_t n);
int64_t fdn_tables_absent(fdn_table **ts, size_t nt, const uint8_t *keys,
	size_t klen, uint64_t *out, size_t n);

/* Set the bits of the keylen-byte key at the start of every step bytes of keys in the bit
 * array of a pybloomfiltermmap3 filter (its u32 words, nbits bits, and hash seeds), as its
 * add() does; or test them, maybe[k] = 1 where its `in` would answer True (bloom.c). */
size_t fdn_bloom_bytes(uint64_t nbits);
int fdn_bloom_add(uint8_t *words, size_t wordslen, uint64_t nbits, const uint32_t *seeds,
	size_t nseeds, const uint8_t *keys, size_t keyslen, size_t keylen, size_t step);
int fdn_bloom_test(const uint8_t *words, size_t wordslen, uint64_t nbits, const uint32_t *seeds,
	size_t nseeds, const uint8_t *keys, size_t keyslen, size_t keylen, size_t step, uint8_t *maybe);

/*
 * A restore's plan of one window in whole arrays (plan.c): the sweep of an
 * arena's summary into a window's table of positions, the sort by log
 * address with the refs laid side by side, the cuts into spans, the runs of
 * consecutive leaves of a span.
 */
int64_t fdn_plan_sweep(fdn_table *t, const uint8_t *akeys, size_t klen,
	const uint64_t *aaddrs, size_t n, uint64_t *found, uint8_t *done,
	size_t nfound);
int fdn_plan_order(const uint64_t *found, size_t m, const int64_t *live,
	size_t nlive, const uint8_t *refs, size_t rlen, size_t rs,
	uint64_t *addrs, int64_t *positions, uint8_t *keyed, size_t keyedlen);
int64_t fdn_plan_cuts(const uint64_t *addrs, size_t n, uint64_t gap,
	uint64_t span, size_t blocks, uint64_t most, uint64_t *ends,
	size_t cap);
int64_t fdn_plan_runs(const int64_t *leaf, size_t nleaf, const int64_t *positions,
	size_t n, uint64_t *starts, size_t cap);

#endif
