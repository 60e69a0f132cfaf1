"""The store key: one random master key in a key file, never in the store.

Everything secret is derived from the 32-byte master key with HKDF-SHA256,
salted with the store's uuid, one subkey per purpose (AES-CTR encryption,
record and arena MACs, keyed block scores, the weak-hash seed), so a key
file opens exactly one store. The key file may wrap the master key under a
passphrase with Argon2id (memory-hard) and AES-GCM; a wrong passphrase
fails the GCM tag, a wrong key fails the store's key check.

Key file (JSON, mode 0600):
    {"format": "foundation-key", "version": 1, "store": "<uuid>",
     "key": "<base64 master>"}                          # no passphrase
    {"format": "foundation-key", "version": 1, "store": "<uuid>",
     "kdf": {"name": "argon2id", "salt": "<b64>", "iterations": 3,
             "lanes": 4, "memory_cost": 65536},
     "wrapped": "<b64 nonce(12) || AES-256-GCM(kek, master, aad=uuid)>"}
"""

import base64
import collections
import hashlib
import hmac
import json
import os

from foundation.errors import BadInput, KeyMissing, WrongKey

# Unencrypted stores still tag every record so that a flipped bit is caught;
# the MAC key is then this public constant: integrity, not authenticity.
UNKEYED_MAC = b"foundation-unkeyed-v1"

ARGON2 = {"iterations": 3, "lanes": 4, "memory_cost": 64 * 1024}  # KiB: 64 MiB


class Keys(collections.namedtuple("Keys", "enc mac score weak_seed")):
    """The subkeys of one store; `enc` is None for an unencrypted store."""

    __slots__ = ()  # a value, as a frozen dataclass is (foundation/fields.py says why not one)

    @classmethod
    def derive(cls, master, store_uuid):
        salt = uuid_bytes(store_uuid)

        def sub(info):
            return hkdf(master, salt, b"foundation " + info)

        return cls(sub(b"enc"), sub(b"mac"), sub(b"score"),
                   int.from_bytes(sub(b"weak")[:8], "big"))

    @classmethod
    def unkeyed(cls):
        return cls(None, UNKEYED_MAC, None, 0)

    def tag_key(self):
        """The key of Poly1305 record tags (docs/format.md §2, §5.2), derived from the MAC key, so
        an unencrypted store's is public like its MAC key: integrity, not authenticity."""
        return hmac.new(self.mac, b"foundation record tag", "sha256").digest()

    def check_value(self):
        """A value stored in the store's config to recognise the right key."""
        return hmac.new(self.mac, b"foundation key check", "sha256").hexdigest()[:32]


def uuid_bytes(text):
    """uuid.UUID(text).bytes for the forms it reads (hyphens, braces, a urn:uuid: prefix), without
    importing uuid: it loads platform, ~2-4 ms of every writing command's start."""
    hexdigits = text.replace("urn:", "").replace("uuid:", "").strip("{}").replace("-", "")
    if len(hexdigits) != 32 or not all(c in "0123456789abcdefABCDEF" for c in hexdigits):
        raise ValueError("badly formed hexadecimal UUID string")
    return bytes.fromhex(hexdigits)


def hkdf(master, salt, info):
    """HKDF-SHA256 (RFC 5869) of 32 bytes, one HMAC block: the standard library's hmac, so that
    opening a store does not load cryptography (tests/test_keys.py holds it to cryptography's HKDF)."""
    prk = hmac.new(salt, master, hashlib.sha256).digest()
    return hmac.new(prk, info + b"\x01", hashlib.sha256).digest()


def _kek(passphrase, kdf):
    from cryptography.hazmat.primitives.kdf.argon2 import Argon2id

    return Argon2id(salt=base64.b64decode(kdf["salt"]), length=32,
                    iterations=kdf["iterations"], lanes=kdf["lanes"],
                    memory_cost=kdf["memory_cost"]).derive(passphrase.encode())


def create_key_file(path, store_uuid, passphrase=None):
    """Write a new random master key to `path` (refusing to overwrite); return it."""
    master = os.urandom(32)
    doc = {"format": "foundation-key", "version": 1, "store": store_uuid}
    if passphrase:
        kdf = dict(name="argon2id", salt=base64.b64encode(os.urandom(16)).decode(), **ARGON2)
        nonce = os.urandom(12)
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        ct = AESGCM(_kek(passphrase, kdf)).encrypt(nonce, master, store_uuid.encode())
        doc["kdf"] = kdf
        doc["wrapped"] = base64.b64encode(nonce + ct).decode()
    else:
        doc["key"] = base64.b64encode(master).decode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise BadInput(f"key file {path} already exists; refusing to overwrite a key") from None
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    return master


def load_key_file(path, store_uuid=None, passphrase=None):
    """Return the master key in `path`; asks for a passphrase through the callback if wrapped."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise KeyMissing(f"key file {path} does not exist; pass the key file created by `foundation init`") from None
    except (OSError, ValueError) as e:
        raise KeyMissing(f"key file {path} cannot be read ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != "foundation-key":
        raise KeyMissing(f"{path} is not a Foundation key file")
    if store_uuid and doc.get("store") != store_uuid:
        raise WrongKey(f"key file {path} belongs to store {doc.get('store')}, not to this store ({store_uuid}); use the key file made for this store")
    if "key" in doc:
        return base64.b64decode(doc["key"])
    if callable(passphrase):
        passphrase = passphrase()
    if not passphrase:
        raise KeyMissing(f"key file {path} is protected by a passphrase; set FOUNDATION_PASSPHRASE or run on a terminal")
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    blob = base64.b64decode(doc["wrapped"])
    try:
        return AESGCM(_kek(passphrase, doc["kdf"])).decrypt(blob[:12], blob[12:], doc["store"].encode())
    except InvalidTag:
        raise WrongKey(f"wrong passphrase for key file {path}") from None
