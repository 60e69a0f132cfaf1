/*
 * core.c: what every hot path shares: the OpenSSL algorithms, fetched once
 * per process, the HMAC key state, and the one way work is split.
 *
 * Parallel work is a contiguous range of blocks per thread, threads started
 * per call and joined before returning: a batch of thousands of blocks
 * amortises a thread start, and no state outlives the call but the
 * contexts a codec pools. Results never depend on the number of threads.
 * fdn_share hands the ranges out a slice at a time instead, so a thread
 * whose core is taken by other work (the image being read and hashed
 * beside an append, another process) holds up no one: the others take more;
 * its helpers are threads kept for the process (see below), not started
 * per call.
 */
#include <pthread.h>
#include "internal.h"

EVP_MD *fdn_sha256;
EVP_CIPHER *fdn_aes_ctr;
EVP_MAC *fdn_poly1305;	/* record tags of stores made with it (a codec asks for it) */

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void fetch(void)
{
	fdn_sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
	fdn_aes_ctr = EVP_CIPHER_fetch(NULL, "AES-256-CTR", NULL);
	fdn_poly1305 = EVP_MAC_fetch(NULL, "POLY1305", NULL);
}

int fdn_api_version(void)
{
	return FDN_API_VERSION;
}

int fdn_init(void)
{
	pthread_once(&once, fetch);
	return fdn_sha256 && fdn_aes_ctr ? FDN_OK : FDN_ECRYPTO;
}

int fdn_nblocks(size_t len, size_t bs, size_t *n)
{
	if (bs == len) {
		*n = 1;
		return FDN_OK;
	}
	if (bs == 0 || len % bs != 0)
		return FDN_EARG;
	*n = len / bs;
	return FDN_OK;
}

typedef struct {
	fdn_job fn;
	void *arg;
	size_t lo, hi;
	int rc;
	int started;
	pthread_t tid;
} part;

static void *run(void *p)
{
	part *w = p;
	w->rc = w->fn(w->arg, w->lo, w->hi);
	return NULL;
}

/* Run fn over [0, n) in at most threads contiguous parts of at least grain
 * items; part 0 runs in the calling thread. Returns the first failure in
 * part order, so the error reported does not depend on timing. */
int fdn_parallel(int threads, size_t n, size_t grain, fdn_job fn, void *arg)
{
	part parts[FDN_MAX_THREADS];
	size_t k, i;
	int rc = FDN_OK;

	if (grain == 0)
		grain = 1;
	k = threads < 1 ? 1 : (size_t)threads;
	if (k > FDN_MAX_THREADS)
		k = FDN_MAX_THREADS;
	if (k > (n + grain - 1) / grain)
		k = (n + grain - 1) / grain;
	if (k <= 1)
		return fn(arg, 0, n);
	for (i = 0; i < k; i++) {
		parts[i] = (part){ fn, arg, n * i / k, n * (i + 1) / k, 0, 0, 0 };
		if (i > 0)
			parts[i].started = pthread_create(&parts[i].tid, NULL, run, &parts[i]) == 0;
	}
	run(&parts[0]);
	for (i = 1; i < k; i++) {
		if (parts[i].started)
			pthread_join(parts[i].tid, NULL);
		else
			run(&parts[i]);	/* no thread to be had: do it here */
	}
	for (i = 0; i < k; i++)
		if (parts[i].rc != FDN_OK) {
			rc = parts[i].rc;
			break;
		}
	return rc;
}

typedef struct {
	fdn_job fn;
	void *arg;
	size_t n, slice, next;
	size_t bad;		/* first item of the first failed slice, or n */
	int rc;
	pthread_mutex_t lock;
} shared;

static int take(void *p, size_t lo, size_t hi)
{
	shared *s = p;

	(void)lo, (void)hi;
	for (;;) {
		size_t i = __atomic_fetch_add(&s->next, s->slice, __ATOMIC_RELAXED), end;
		int rc;
		if (i >= s->n || __atomic_load_n(&s->bad, __ATOMIC_RELAXED) < i)
			return FDN_OK;
		end = s->n - i > s->slice ? i + s->slice : s->n;
		if ((rc = s->fn(s->arg, i, end)) != FDN_OK) {
			pthread_mutex_lock(&s->lock);
			if (i < s->bad) {	/* the failure reported is the first in item order */
				s->bad = i;
				s->rc = rc;
			}
			pthread_mutex_unlock(&s->lock);
		}
	}
}

/*
 * The helpers of fdn_share: threads started once per process, each waiting
 * for a ticket (a share of someone's job). A caller posts its tickets, works
 * through the slices itself, then takes back the tickets no helper has
 * claimed (every slice is taken by then: there is nothing left for them) and
 * waits only for the helpers that are still on a slice. So a busy machine
 * never makes a caller wait for a thread to be scheduled just to find no
 * work, and no thread is started or joined per call (a day 0 makes ~2,000
 * such calls). A forked child starts with no helpers (its caller then does
 * the whole job: no ticket it posts can be left unclaimed for long).
 */
typedef struct ticket {
	shared *s;
	struct ticket *prev, *next;
	int state;		/* QUEUED, CLAIMED, DONE */
} ticket;

enum { QUEUED, CLAIMED, DONE };

static struct {
	pthread_mutex_t mu;
	pthread_cond_t work;	/* a ticket was posted */
	pthread_cond_t done;	/* a claimed ticket is done */
	ticket *head, *tail;
	int helpers;
	int wanted;		/* the helpers the calls under way could use: the sum of their threads - 1 */
} pool = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, NULL, 0, 0 };

enum { HELPERS_MAX = 16 };	/* (calls beside each other: the image's readers, a fill, a seal) */

static void unlink_ticket(ticket *t)
{
	if (t->prev)
		t->prev->next = t->next;
	else
		pool.head = t->next;
	if (t->next)
		t->next->prev = t->prev;
	else
		pool.tail = t->prev;
	t->prev = t->next = NULL;
}

static void *helper(void *unused)
{
	(void)unused;
	pthread_mutex_lock(&pool.mu);
	for (;;) {
		ticket *t;
		while ((t = pool.head) == NULL)
			pthread_cond_wait(&pool.work, &pool.mu);
		unlink_ticket(t);
		t->state = CLAIMED;
		pthread_mutex_unlock(&pool.mu);
		take(t->s, 0, 0);
		pthread_mutex_lock(&pool.mu);
		t->state = DONE;
		pthread_cond_broadcast(&pool.done);
	}
	return NULL;
}

static void after_fork(void)
{
	pthread_mutex_init(&pool.mu, NULL);
	pthread_cond_init(&pool.work, NULL);
	pthread_cond_init(&pool.done, NULL);
	pool.head = pool.tail = NULL;
	pool.helpers = pool.wanted = 0;
}

static pthread_once_t forked = PTHREAD_ONCE_INIT;

static void on_fork(void)
{
	pthread_atfork(NULL, NULL, after_fork);
}

/* Run fn over [0, n) in slices of at least grain items taken by up to
 * threads threads as they come free; the first failure in item order is
 * returned (slices after it may be skipped). */
int fdn_share(int threads, size_t n, size_t grain, fdn_job fn, void *arg)
{
	shared s = { fn, arg, n, 0, 0, n, FDN_OK, PTHREAD_MUTEX_INITIALIZER };
	ticket t[FDN_MAX_THREADS];
	size_t k = threads < 1 ? 1 : (size_t)threads, i;

	if (grain == 0)
		grain = 1;
	if (k > FDN_MAX_THREADS)
		k = FDN_MAX_THREADS;
	if (k <= 1 || n < 2 * grain)
		return fn(arg, 0, n);
	/* about eight slices a thread: small enough to even out, big enough to stay cheap */
	s.slice = n / (8 * k) > grain ? n / (8 * k) : grain;
	pthread_once(&forked, on_fork);
	pthread_mutex_lock(&pool.mu);
	/* as many helpers as every call under way may use at once, as when each call started its
	 * own: the process's share of busy cores does not shrink when several calls overlap */
	pool.wanted += (int)(k - 1);
	while (pool.helpers < pool.wanted && pool.helpers < HELPERS_MAX) {
		pthread_t tid;
		pthread_attr_t a;
		int ok;
		pthread_attr_init(&a);
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
		ok = pthread_create(&tid, &a, helper, NULL) == 0;
		pthread_attr_destroy(&a);
		if (!ok)
			break;	/* fewer helpers: the caller does more */
		pool.helpers++;
	}
	for (i = 0; i + 1 < k; i++) {
		t[i] = (ticket){ &s, pool.tail, NULL, QUEUED };
		if (pool.tail)
			pool.tail->next = &t[i];
		else
			pool.head = &t[i];
		pool.tail = &t[i];
	}
	if (k == 2)
		pthread_cond_signal(&pool.work);
	else
		pthread_cond_broadcast(&pool.work);
	pthread_mutex_unlock(&pool.mu);
	take(&s, 0, 0);
	pthread_mutex_lock(&pool.mu);
	for (i = 0; i + 1 < k; i++) {
		if (t[i].state == QUEUED) {	/* every slice is taken: nothing left for it */
			unlink_ticket(&t[i]);
			t[i].state = DONE;
		}
		while (t[i].state != DONE)
			pthread_cond_wait(&pool.done, &pool.mu);
	}
	pool.wanted -= (int)(k - 1);
	pthread_mutex_unlock(&pool.mu);
	pthread_mutex_destroy(&s.lock);
	return s.rc;
}

enum { SHA256_BLOCK = 64 };

int fdn_hkey_init(fdn_hkey *k, const uint8_t *key, size_t len)
{
	uint8_t pad[SHA256_BLOCK], hashed[FDN_SCORE_SIZE];
	unsigned int hl;
	size_t i;
	int ok;

	k->in = k->out = NULL;
	if (fdn_init() != FDN_OK)
		return FDN_ECRYPTO;
	if (len > SHA256_BLOCK) {
		if (!EVP_Digest(key, len, hashed, &hl, fdn_sha256, NULL))
			return FDN_ECRYPTO;
		key = hashed;
		len = hl;
	}
	k->in = EVP_MD_CTX_new();
	k->out = EVP_MD_CTX_new();
	if (k->in == NULL || k->out == NULL) {
		fdn_hkey_free(k);
		return FDN_ENOMEM;
	}
	memset(pad, 0x36, sizeof pad);
	for (i = 0; i < len; i++)
		pad[i] ^= key[i];
	ok = EVP_DigestInit_ex2(k->in, fdn_sha256, NULL) &&
		EVP_DigestUpdate(k->in, pad, sizeof pad);
	if (fdn_lanes_cpu())
		fdn_lanes_prefix(pad, k->ih);
	memset(pad, 0x5c, sizeof pad);
	for (i = 0; i < len; i++)
		pad[i] ^= key[i];
	ok = ok && EVP_DigestInit_ex2(k->out, fdn_sha256, NULL) &&
		EVP_DigestUpdate(k->out, pad, sizeof pad);
	if (fdn_lanes_cpu())
		fdn_lanes_prefix(pad, k->oh);
	OPENSSL_cleanse(pad, sizeof pad);
	OPENSSL_cleanse(hashed, sizeof hashed);
	if (!ok) {
		fdn_hkey_free(k);
		return FDN_ECRYPTO;
	}
	return FDN_OK;
}

void fdn_hkey_free(fdn_hkey *k)
{
	EVP_MD_CTX_free(k->in);
	EVP_MD_CTX_free(k->out);
	k->in = k->out = NULL;
	OPENSSL_cleanse(k->ih, sizeof k->ih);
	OPENSSL_cleanse(k->oh, sizeof k->oh);
}

/* Start a message: c continues from the key's inner state. */
int fdn_hmac_begin(const fdn_hkey *k, EVP_MD_CTX *c)
{
	return EVP_MD_CTX_copy_ex(c, k->in) ? FDN_OK : FDN_ECRYPTO;
}

/* Finish a message begun with fdn_hmac_begin and fed with EVP_DigestUpdate. */
int fdn_hmac_end(const fdn_hkey *k, EVP_MD_CTX *c, uint8_t out[FDN_SCORE_SIZE])
{
	uint8_t inner[FDN_SCORE_SIZE];

	if (!EVP_DigestFinal_ex(c, inner, NULL) || !EVP_MD_CTX_copy_ex(c, k->out) ||
	    !EVP_DigestUpdate(c, inner, sizeof inner) || !EVP_DigestFinal_ex(c, out, NULL))
		return FDN_ECRYPTO;
	return FDN_OK;
}
