/*
 * table.c: the index cache, one table per loaded arena summary, and the
 * write buffer. A multimap from key to log addresses in insertion order:
 * compare-by-value keeps every address whose weak hash matches. Each entry
 * is stored as an index entry (key, then the address as u64le), so a flush
 * takes the write buffer's entries as they lie, with no second copy. Open
 * addressing over power-of-two slots of 8 bytes, one slot per distinct
 * key: the newest entry of its chain and 32 bits of the key's hash, so a
 * miss seldom touches a key.
 *
 * Memory: an entry costs keylen + 8 bytes (+ 4 once a key repeats), a slot 8. A table is made
 * for LOAD (70 %) of its hint and grown (doubled) only past GROW (85 %):
 * the write buffer's bound (16 MiB counted at keylen + 8 bytes, 419 k
 * entries in hash mode, plus one append) fits 512 k slots, so it never
 * doubles to 1 M (8 MiB) nor holds both arrays at its largest. Lookups of
 * the write buffer mostly hit (the Bloom filter answers misses first).
 * The three arrays are mappings of their own: growing one moves its pages
 * (mremap) instead of copying them, and a freed one goes back to the
 * system at once (from the heap, glibc's adaptive mmap threshold left the
 * old arrays of a growing table resident: ~10 MB of a full write buffer).
 */
#define _GNU_SOURCE	/* mremap */
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include "internal.h"

enum {
	LOAD_NUM = 7, LOAD_DEN = 10,	/* made for this load of its hint */
	GROW_NUM = 17, GROW_DEN = 20,	/* grown past this load (85 %) */
	MIN_SLOTS = 16,
	LOOKAHEAD = 16,			/* keys whose slots a lookup asks for at once */
	PREFETCHED = 4,			/* of the first tables of a lookup */
	ADDR = 8			/* u64le address after each key */
};

typedef struct {
	uint32_t head;		/* newest entry of the key + 1; 0: empty slot */
	uint32_t tag;		/* high half of the key's hash */
} slot;

struct fdn_table {
	size_t keylen, es;	/* es = keylen + ADDR: an entry's size */
	pthread_rwlock_t lock;	/* Python may call from several threads, GIL released */
	uint8_t *ents;		/* entries (key, u64le addr), in insertion order */
	uint32_t *prev;		/* the key's entry added before this one + 1; 0: first.
				 * NULL until a key is added twice (never, in a write buffer
				 * of compare-by-hash: fresh keys are distinct) */
	size_t n, cap;
	slot *slots;
	size_t nslots, used;	/* nslots is a power of two */
};

static size_t pages(size_t len)
{
	static size_t pg;

	if (pg == 0) {
		long p = sysconf(_SC_PAGESIZE);
		pg = p > 0 ? (size_t)p : 4096;
	}
	return len > SIZE_MAX - pg ? 0 : (len + pg - 1) / pg * pg;
}

/* A zeroed array of len bytes in a mapping of its own (NULL if it cannot be had). */
static void *map(size_t len)
{
	void *p;

	if (pages(len) == 0)
		return NULL;
	p = mmap(NULL, pages(len), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

static void unmap(void *p, size_t len)
{
	if (p != NULL)
		munmap(p, pages(len));
}

/* The array p of len bytes made want bytes long, its pages moved, not copied. */
static void *remap(void *p, size_t len, size_t want)
{
	void *q;

	if (p == NULL)
		return map(want);
	if (pages(want) == 0)
		return NULL;
	if (pages(want) == pages(len))
		return p;
	q = mremap(p, pages(len), pages(want), MREMAP_MAYMOVE);
	return q == MAP_FAILED ? NULL : q;
}

static uint64_t hashkey(const uint8_t *k, size_t len)
{
	uint64_t h = 0x9E3779B97F4A7C15ull ^ len;

	for (size_t i = 0; i < len; i += 8) {
		uint8_t w[8] = { 0 };
		memcpy(w, k + i, len - i < 8 ? len - i : 8);
		h = (h ^ fdn_get64(w)) * 0xFF51AFD7ED558CCDull;
		h ^= h >> 32;
	}
	h ^= h >> 33;
	h *= 0xC4CEB9FE1A85EC53ull;
	return h ^ h >> 29;
}

static size_t slots_for(size_t keys)
{
	size_t s = MIN_SLOTS;

	while (s < SIZE_MAX / LOAD_DEN && keys * LOAD_DEN > s * LOAD_NUM)
		s <<= 1;
	return s;
}

static int grow_entries(fdn_table *t, size_t want)
{
	size_t cap = t->cap ? t->cap : 64;
	uint8_t *e;
	uint32_t *p;

	if (want >= UINT32_MAX)
		return FDN_ENOMEM;	/* entry numbers are u32 */
	while (cap < want)
		cap *= 2;
	if (cap == t->cap)
		return FDN_OK;
	if (cap > SIZE_MAX / t->es)
		return FDN_ENOMEM;
	/* (a failure leaves the old array in place, and cap still its size) */
	if ((e = remap(t->ents, t->cap * t->es, cap * t->es)) == NULL)
		return FDN_ENOMEM;
	t->ents = e;
	if (t->prev == NULL) {
		t->cap = cap;
		return FDN_OK;
	}
	if ((p = remap(t->prev, t->cap * sizeof *p, cap * sizeof *p)) == NULL) {
		/* ents back to its old size (a shrink stays in place) */
		if (t->cap == 0) {
			unmap(e, cap * t->es);
			t->ents = NULL;
		} else if ((e = remap(e, cap * t->es, t->cap * t->es)) != NULL) {
			t->ents = e;
		}
		return FDN_ENOMEM;
	}
	t->prev = p;
	t->cap = cap;
	return FDN_OK;
}

static int grow_slots(fdn_table *t, size_t nslots)
{
	slot *s = map(nslots * sizeof *s);

	if (s == NULL)
		return FDN_ENOMEM;
	for (size_t i = 0; i < t->nslots; i++) {
		slot *o = &t->slots[i];
		if (o->head == 0)
			continue;
		/* rehash from the stored entry's key: the tag holds only half the hash */
		uint64_t h = hashkey(t->ents + (o->head - 1) * t->es, t->keylen);
		size_t j = h & (nslots - 1);
		while (s[j].head)
			j = (j + 1) & (nslots - 1);
		s[j] = *o;
	}
	unmap(t->slots, t->nslots * sizeof *s);
	t->slots = s;
	t->nslots = nslots;
	return FDN_OK;
}

/* The slot holding key, or the empty slot where it would go. */
static slot *probe(const fdn_table *t, const uint8_t *key, uint64_t h)
{
	size_t mask = t->nslots - 1, j = h & mask;
	uint32_t tag = (uint32_t)(h >> 32);

	for (;; j = (j + 1) & mask) {
		slot *s = &t->slots[j];
		if (s->head == 0 || (s->tag == tag &&
		    memcmp(t->ents + (s->head - 1) * t->es, key, t->keylen) == 0))
			return s;
	}
}

fdn_table *fdn_table_new(size_t keylen, size_t hint)
{
	fdn_table *t;

	if (keylen == 0 || keylen > SIZE_MAX / 2 || (t = calloc(1, sizeof *t)) == NULL)
		return NULL;
	t->keylen = keylen;
	t->es = keylen + ADDR;
	pthread_rwlock_init(&t->lock, NULL);
	if (grow_entries(t, hint ? hint : 1) != FDN_OK || grow_slots(t, slots_for(hint)) != FDN_OK) {
		fdn_table_free(t);
		return NULL;
	}
	return t;
}

void fdn_table_free(fdn_table *t)
{
	if (t == NULL)
		return;
	pthread_rwlock_destroy(&t->lock);
	unmap(t->ents, t->cap * t->es);
	unmap(t->prev, t->cap * sizeof *t->prev);
	unmap(t->slots, t->nslots * sizeof *t->slots);
	free(t);
}

int fdn_table_add(fdn_table *t, const uint8_t *keys, size_t klen,
	const uint64_t *addrs, size_t n)
{
	int rc;

	if (klen != n * t->keylen)
		return FDN_EARG;
	pthread_rwlock_wrlock(&t->lock);
	if ((rc = grow_entries(t, t->n + n)) != FDN_OK)
		goto out;
	for (size_t i = 0; i < n; i++) {
		const uint8_t *k = keys + i * t->keylen;
		uint64_t h = hashkey(k, t->keylen);
		uint32_t e = (uint32_t)t->n;
		slot *s = probe(t, k, h);

		if (s->head == 0 && (t->used + 1) * GROW_DEN > t->nslots * GROW_NUM) {
			if ((rc = grow_slots(t, t->nslots * 2)) != FDN_OK)
				goto out;
			s = probe(t, k, h);
		}
		if (s->head != 0 && t->prev == NULL &&
		    (t->prev = map(t->cap * sizeof *t->prev)) == NULL) {	/* zeroed: no chains yet */
			rc = FDN_ENOMEM;
			goto out;
		}
		memcpy(t->ents + e * t->es, k, t->keylen);
		fdn_put64(t->ents + e * t->es + t->keylen, addrs[i]);
		if (t->prev != NULL)
			t->prev[e] = s->head;	/* newest first: an add never walks a chain */
		if (s->head == 0) {
			s->tag = (uint32_t)(h >> 32);
			t->used++;
		}
		s->head = e + 1;
		t->n++;
	}
out:
	pthread_rwlock_unlock(&t->lock);
	return rc;
}

/* Copy up to outcap addrs for key (of hash h) into out, oldest first; returns how many there are. */
static size_t find_h(const fdn_table *t, const uint8_t *key, uint64_t h, uint64_t *out, size_t outcap)
{
	slot *s = probe(t, key, h);
	size_t found = 0, i;

	for (uint32_t e = s->head; e != 0; e = t->prev ? t->prev[e - 1] : 0)
		found++;
	/* the chain runs newest to oldest: the i-th link is the (found - 1 - i)-th added */
	i = found;
	for (uint32_t e = s->head; e != 0 && outcap; e = t->prev ? t->prev[e - 1] : 0)
		if (--i < outcap)
			out[i] = fdn_get64(t->ents + (e - 1) * t->es + t->keylen);
	return found;
}

static size_t find(const fdn_table *t, const uint8_t *key, uint64_t *out, size_t outcap)
{
	return find_h(t, key, hashkey(key, t->keylen), out, outcap);
}

int64_t fdn_table_find(fdn_table *t, const uint8_t *key, size_t keylen,
	uint64_t *out, size_t outcap)
{
	size_t found;

	if (keylen != t->keylen)
		return FDN_EARG;
	pthread_rwlock_rdlock(&t->lock);
	found = find(t, key, out, outcap);
	pthread_rwlock_unlock(&t->lock);
	return (int64_t)found;
}

uint64_t fdn_table_len(fdn_table *t)
{
	uint64_t n;

	pthread_rwlock_rdlock(&t->lock);
	n = t->n;
	pthread_rwlock_unlock(&t->lock);
	return n;
}

void fdn_table_clear(fdn_table *t)
{
	pthread_rwlock_wrlock(&t->lock);
	t->n = 0;
	t->used = 0;
	memset(t->slots, 0, t->nslots * sizeof *t->slots);
	pthread_rwlock_unlock(&t->lock);
}

/*
 * Every entry in insertion order as index entries (key, then the addr as
 * u64 little-endian) into out. Returns the number of entries; if out cannot
 * hold them all it is left alone (call again with room for that many).
 */
int64_t fdn_table_entries(fdn_table *t, uint8_t *out, size_t outlen)
{
	int64_t n;

	pthread_rwlock_rdlock(&t->lock);
	n = (int64_t)t->n;
	if (t->n <= outlen / t->es)
		memcpy(out, t->ents, t->n * t->es);
	pthread_rwlock_unlock(&t->lock);
	return n;
}

/*
 * Hand the entries over as they lie (what a flush sorts and merges: no copy
 * of them beside the table), the slots and chains freed first; the table is
 * left empty. *out is the caller's, n entries, to be freed with
 * fdn_entries_free(*out, n * (keylen + 8)) (NULL when there are none).
 * Returns n.
 */
int64_t fdn_table_take(fdn_table *t, uint8_t **out)
{
	int64_t n;
	slot *s = map(MIN_SLOTS * sizeof *s);

	if (s == NULL)
		return FDN_ENOMEM;
	pthread_rwlock_wrlock(&t->lock);
	unmap(t->slots, t->nslots * sizeof *t->slots);
	unmap(t->prev, t->cap * sizeof *t->prev);
	n = (int64_t)t->n;
	*out = NULL;
	if (n > 0) {
		/* cut to length: the pages past the last entry go back now */
		uint8_t *e = remap(t->ents, t->cap * t->es, t->n * t->es);
		*out = e ? e : t->ents;
		if (e == NULL)	/* (kept whole: freed as n entries, the tail pages are lost) */
			munmap(t->ents + pages(t->n * t->es), pages(t->cap * t->es) - pages(t->n * t->es));
	} else {
		unmap(t->ents, t->cap * t->es);
	}
	t->ents = NULL;
	t->prev = NULL;
	t->slots = s;
	t->n = t->cap = t->used = 0;
	t->nslots = MIN_SLOTS;
	pthread_rwlock_unlock(&t->lock);
	return n;
}

void fdn_entries_free(uint8_t *ents, size_t len)
{
	unmap(ents, len);
}

/* Lock each distinct table once: a list may name the same table twice. */
static void lock_all(fdn_table **ts, size_t nt, int lock)
{
	for (size_t i = 0; i < nt; i++) {
		size_t j;
		for (j = 0; j < i && ts[j] != ts[i]; j++)
			;
		if (j < i)
			continue;
		if (lock)
			pthread_rwlock_rdlock(&ts[i]->lock);
		else
			pthread_rwlock_unlock(&ts[i]->lock);
	}
}

int fdn_tables_lookup(fdn_table **ts, size_t nt, const uint8_t *keys,
	size_t klen, const uint8_t *skip, size_t nskip, uint64_t *addrs,
	int32_t *which, size_t n)
{
	size_t keylen, i, k, c;

	if (nt == 0) {
		for (i = 0; i < n; i++) {
			addrs[i] = 0;
			which[i] = -1;
		}
		return FDN_OK;
	}
	keylen = ts[0]->keylen;
	for (k = 1; k < nt; k++)
		if (ts[k]->keylen != keylen)
			return FDN_EARG;
	if (nt > INT32_MAX || klen != n * keylen || (skip && nskip != n))
		return FDN_EARG;
	lock_all(ts, nt, 1);
	for (i = 0; i < n; i += c) {
		/* a key's hash once for every table; the slots of a run of keys asked for before
		 * the first is probed, so their cache misses overlap (tables past the first few
		 * seldom answer: the newest, asked first, hold most of what a batch repeats) */
		uint64_t h[LOOKAHEAD];
		size_t j;
		c = n - i < LOOKAHEAD ? n - i : LOOKAHEAD;
		for (j = 0; j < c; j++) {
			h[j] = hashkey(keys + (i + j) * keylen, keylen);
			for (k = 0; k < nt && k < PREFETCHED; k++)
				__builtin_prefetch(&ts[k]->slots[h[j] & (ts[k]->nslots - 1)]);
		}
		for (j = 0; j < c; j++) {
			addrs[i + j] = 0;
			which[i + j] = -1;
			if (skip && skip[i + j])
				continue;
			for (k = 0; k < nt; k++)
				if (find_h(ts[k], keys + (i + j) * keylen, h[j], &addrs[i + j], 1) > 0) {
					which[i + j] = (int32_t)k;
					break;
				}
		}
	}
	lock_all(ts, nt, 0);
	return FDN_OK;
}

/*
 * The positions of the keys that no table holds, all-zero keys (null refs)
 * left out: what a salvage needs of a whole day's refs, answered in one call
 * with nothing per key handed back but the few that are missing.
 */
int64_t fdn_tables_absent(fdn_table **ts, size_t nt, const uint8_t *keys,
	size_t klen, uint64_t *out, size_t n)
{
	size_t keylen, i, k, m = 0;
	uint64_t a;

	if (nt == 0 || nt > INT32_MAX)
		return FDN_EARG;
	keylen = ts[0]->keylen;
	for (k = 1; k < nt; k++)
		if (ts[k]->keylen != keylen)
			return FDN_EARG;
	if (klen % keylen || klen / keylen > n)
		return FDN_EARG;
	lock_all(ts, nt, 1);
	for (i = 0; i < klen / keylen; i++) {
		const uint8_t *key = keys + i * keylen;
		size_t z = 0;

		while (z < keylen && key[z] == 0)
			z++;
		if (z == keylen)
			continue;
		for (k = 0; k < nt; k++)
			if (find(ts[k], key, &a, 1) > 0)
				break;
		if (k == nt)
			out[m++] = i;
	}
	lock_all(ts, nt, 0);
	return (int64_t)m;
}
