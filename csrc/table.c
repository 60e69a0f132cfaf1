/*
 * table.c: the index cache, one table per loaded arena summary. A multimap
 * from key to log addresses in insertion order: compare-by-value keeps
 * every address whose weak hash matches. Open addressing over power-of-two
 * slots, one slot per distinct key, each slot the head and tail of a chain
 * of entries; slots carry 32 bits of the hash so a miss seldom touches a key.
 */
#include <pthread.h>
#include <stdlib.h>
#include "internal.h"

enum {
	LOAD_NUM = 7, LOAD_DEN = 10,	/* grow past 70 % of slots in use */
	MIN_SLOTS = 16
};

typedef struct {
	uint32_t head;		/* first entry + 1; 0: empty slot */
	uint32_t tail;		/* last entry + 1 */
	uint32_t tag;		/* high half of the key's hash */
} slot;

struct fdn_table {
	size_t keylen;
	pthread_rwlock_t lock;	/* Python may call from several threads, GIL released */
	uint8_t *keys;		/* entries, in insertion order */
	uint64_t *addrs;
	uint32_t *next;		/* next entry with the same key + 1; 0: last */
	size_t n, cap;
	slot *slots;
	size_t nslots, used;	/* nslots is a power of two */
};

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
	uint8_t *k;
	uint64_t *a;
	uint32_t *nx;

	if (want >= UINT32_MAX)
		return FDN_ENOMEM;	/* entry numbers are u32 */
	while (cap < want)
		cap *= 2;
	if (cap == t->cap)
		return FDN_OK;
	if ((k = realloc(t->keys, cap * t->keylen)) == NULL)
		return FDN_ENOMEM;
	t->keys = k;
	if ((a = realloc(t->addrs, cap * sizeof *a)) == NULL)
		return FDN_ENOMEM;
	t->addrs = a;
	if ((nx = realloc(t->next, cap * sizeof *nx)) == NULL)
		return FDN_ENOMEM;
	t->next = nx;
	t->cap = cap;
	return FDN_OK;
}

static int grow_slots(fdn_table *t, size_t nslots)
{
	slot *s = calloc(nslots, sizeof *s);

	if (s == NULL)
		return FDN_ENOMEM;
	for (size_t i = 0; i < t->nslots; i++) {
		slot *o = &t->slots[i];
		if (o->head == 0)
			continue;
		/* rehash from the stored entry's key: the tag holds only half the hash */
		uint64_t h = hashkey(t->keys + (o->head - 1) * t->keylen, t->keylen);
		size_t j = h & (nslots - 1);
		while (s[j].head)
			j = (j + 1) & (nslots - 1);
		s[j] = *o;
	}
	free(t->slots);
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
		    memcmp(t->keys + (s->head - 1) * t->keylen, key, t->keylen) == 0))
			return s;
	}
}

fdn_table *fdn_table_new(size_t keylen, size_t hint)
{
	fdn_table *t;

	if (keylen == 0 || (t = calloc(1, sizeof *t)) == NULL)
		return NULL;
	t->keylen = keylen;
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
	free(t->keys);
	free(t->addrs);
	free(t->next);
	free(t->slots);
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

		if (s->head == 0 && (t->used + 1) * LOAD_DEN > t->nslots * LOAD_NUM) {
			if ((rc = grow_slots(t, t->nslots * 2)) != FDN_OK)
				goto out;
			s = probe(t, k, h);
		}
		memcpy(t->keys + e * t->keylen, k, t->keylen);
		t->addrs[e] = addrs[i];
		t->next[e] = 0;
		if (s->head == 0) {
			*s = (slot){ e + 1, e + 1, (uint32_t)(h >> 32) };
			t->used++;
		} else {
			t->next[s->tail - 1] = e + 1;
			s->tail = e + 1;
		}
		t->n++;
	}
out:
	pthread_rwlock_unlock(&t->lock);
	return rc;
}

/* Copy up to outcap addrs for key into out; returns how many there are. */
static size_t find(const fdn_table *t, const uint8_t *key, uint64_t *out, size_t outcap)
{
	slot *s = probe(t, key, hashkey(key, t->keylen));
	size_t found = 0;

	for (uint32_t e = s->head; e != 0; e = t->next[e - 1], found++)
		if (found < outcap)
			out[found] = t->addrs[e - 1];
	return found;
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
 * u64 little-endian) into out: the write buffer needs no second copy of its
 * keys and addrs for a flush. Returns the number of entries; if out cannot
 * hold them all it is left alone (call again with room for that many).
 */
int64_t fdn_table_entries(fdn_table *t, uint8_t *out, size_t outlen)
{
	size_t es = t->keylen + 8;
	int64_t n;

	pthread_rwlock_rdlock(&t->lock);
	n = (int64_t)t->n;
	if (t->n <= outlen / es)
		for (size_t e = 0; e < t->n; e++) {
			memcpy(out + e * es, t->keys + e * t->keylen, t->keylen);
			fdn_put64(out + e * es + t->keylen, t->addrs[e]);
		}
	pthread_rwlock_unlock(&t->lock);
	return n;
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
	size_t keylen, i, k;

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
	for (i = 0; i < n; i++) {
		addrs[i] = 0;
		which[i] = -1;
		if (skip && skip[i])
			continue;
		for (k = 0; k < nt; k++)
			if (find(ts[k], keys + i * keylen, &addrs[i], 1) > 0) {
				which[i] = (int32_t)k;
				break;
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
