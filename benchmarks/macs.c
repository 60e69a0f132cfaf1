/*
 * macs.c: the per-record cost of three MACs through OpenSSL, as the C core
 * calls them (benchmarks/README.md, "tag10"): HMAC-SHA256 from keyed states
 * copied per message, AES-256-GCM over AAD only with the IV reset per
 * message, Poly1305 through EVP_MAC with a fresh key per message.
 *
 *   cc -O2 benchmarks/macs.c -o /tmp/macs -lcrypto && /tmp/macs 600 1800 4160
 */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	const int n = 200000;
	unsigned char key[32] = { 1 }, out[64], pad[64], inner[32], iv[12] = { 0 };
	const EVP_MD *sha = EVP_MD_fetch(NULL, "SHA256", NULL);
	EVP_MD_CTX *in = EVP_MD_CTX_new(), *o = EVP_MD_CTX_new(), *c = EVP_MD_CTX_new();
	EVP_CIPHER_CTX *g = EVP_CIPHER_CTX_new();
	EVP_MAC_CTX *p = EVP_MAC_CTX_new(EVP_MAC_fetch(NULL, "POLY1305", NULL));

	memset(pad, 0x36, 64);
	EVP_DigestInit_ex2(in, sha, NULL);
	EVP_DigestUpdate(in, pad, 64);
	memset(pad, 0x5c, 64);
	EVP_DigestInit_ex2(o, sha, NULL);
	EVP_DigestUpdate(o, pad, 64);
	EVP_EncryptInit_ex2(g, EVP_CIPHER_fetch(NULL, "AES-256-GCM", NULL), key, NULL, NULL);
	for (int a = 1; a < argc; a++) {
		size_t len = (size_t)atoi(argv[a]), ol;
		unsigned char *msg = calloc(1, len);
		double t, th, tg, tp;
		int gl;

		t = now();
		for (int i = 0; i < n; i++) {
			EVP_MD_CTX_copy_ex(c, in);
			EVP_DigestUpdate(c, msg, len);
			EVP_DigestFinal_ex(c, inner, NULL);
			EVP_MD_CTX_copy_ex(c, o);
			EVP_DigestUpdate(c, inner, 32);
			EVP_DigestFinal_ex(c, out, NULL);
		}
		th = now() - t;
		t = now();
		for (int i = 0; i < n; i++) {
			memcpy(iv, &i, sizeof i);
			EVP_EncryptInit_ex2(g, NULL, NULL, iv, NULL);
			EVP_EncryptUpdate(g, NULL, &gl, msg, (int)len);
			EVP_EncryptFinal_ex(g, out, &gl);
			EVP_CIPHER_CTX_ctrl(g, EVP_CTRL_AEAD_GET_TAG, 16, out);
		}
		tg = now() - t;
		t = now();
		for (int i = 0; i < n; i++) {
			key[0] = (unsigned char)i;
			EVP_MAC_init(p, key, 32, NULL);
			EVP_MAC_update(p, msg, len);
			EVP_MAC_final(p, out, &ol, sizeof out);
		}
		tp = now() - t;
		printf("%zu bytes: hmac %.2f us, gmac %.2f us, poly1305 %.2f us a message\n",
		       len, th / n * 1e6, tg / n * 1e6, tp / n * 1e6);
		free(msg);
	}
	return 0;
}
