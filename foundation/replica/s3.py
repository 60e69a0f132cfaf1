"""A replica in an S3-compatible object store (boto3): AWS, MinIO, and the many others.

Over a real link a request costs a round trip or more, so throughput comes
from having several in flight: an object up to `multipart_threshold` goes
up in one put_object, a larger one as a multipart upload whose parts go up
`parallel` at a time, and replicate puts `parallel` objects at once on the
one thread-safe client (S3Backend.concurrent). botocore retries a request
that was throttled or hit a 5xx ("standard" retry mode); what is still
failing after that becomes Transient and `Retrying` retries the whole
object, with jittered backoff. When a put was cut, the newest unfinished
upload of the key is found again (list_multipart_uploads, list_parts) and
each part whose MD5 matches the local bytes is kept (on an SSE-KMS bucket
the ETag is no MD5: every part is sent again); a single put cut midway
starts again. Path-style addressing (the form every S3 clone accepts).
"""

import base64
import contextlib
import gc
import hashlib
import io
import threading

from foundation.replica import registry
from foundation.replica.backend import (
    AuthFailed, Backend, Permanent, RemoteError, RemoteFull, RemoteMissing, Transient,
    check_name, download, md5_of, span)
from foundation.replica.pool import run_all

PART = 8 << 20           # multipart part size (grown for an object of more than MAX_PARTS of them)
MAX_PARTS = 10000        # S3's limit
BOTO_ATTEMPTS = 3        # botocore's own tries of one request (standard mode: throttling, 5xx, resets)

_AUTH = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "ExpiredToken",
         "InvalidClientTokenId", "AuthorizationHeaderMalformed", "403"}
_FULL = {"XMinioStorageFull", "EntityTooLarge", "QuotaExceeded", "XMinioAdminBucketQuotaExceeded",
         "StorageFull", "InsufficientStorage"}
_TRANSIENT = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError",
              "ServiceUnavailable", "XMinioServerNotInitialized", "RequestLimitExceeded",
              "IncompleteBody", "BadDigest", "XAmzContentSHA256Mismatch"}   # a body cut or damaged on the
                                                # way (MinIO also says IncompleteBody as its disk fills)
_MISSING = {"NoSuchKey", "404", "NotFound"}


class S3Backend(Backend):
    def __init__(self, spec):
        super().__init__()
        self.spec = spec
        self.url = spec.url
        self.bucket = spec.bucket
        self.base = spec.path
        self.concurrent = spec.parallel
        self._s3 = None
        self._lock = threading.Lock()      # the client's making, and the byte counts

    def _client(self):
        """The boto3 client, made (and the bucket checked) at the first call; shared by every thread."""
        with self._lock:
            return self._s3 or self._make_client()

    def _make_client(self):
        if self._s3 is None:
            from botocore.config import Config
            s = self.spec
            config = Config(s3={"addressing_style": "path"},
                            retries={"mode": "standard", "total_max_attempts": BOTO_ATTEMPTS},
                            max_pool_connections=s.parallel * (s.parallel + 1),   # objects x their parts
                            connect_timeout=s.timeout, read_timeout=s.timeout, signature_version="s3v4",
                            request_checksum_calculation="when_required",
                            response_checksum_validation="when_required")
            self._s3 = _new_client(endpoint_url=s.endpoint, region_name=s.region, aws_access_key_id=s.access_key,
                                   aws_secret_access_key=s.secret_key, config=config,
                                   verify=s.ca_file or (False if s.insecure else None))
        return self._s3

    @contextlib.contextmanager
    def _errors(self, what):
        """Every failure as a RemoteError."""
        from botocore import exceptions as bx
        try:
            yield
        except RemoteError:
            raise
        except bx.ClientError as e:
            code, status = _code(e), e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            msg = f"{what}: the server answered {code} {e.response.get('Error', {}).get('Message', '')}".strip()
            if code == "NoSuchBucket":   # no request of its own checks the bucket first: a round trip saved
                raise Permanent(self.url, f"bucket {self.bucket} does not exist at {self.spec.endpoint or 'AWS'}: "
                                          "create it, or correct the url") from None
            if code == "RequestTimeTooSkewed":
                raise Permanent(self.url, f"{msg}: this machine's clock is too far from the server's; set the "
                                          "clock right (NTP)") from e
            if code in _AUTH or status in (401, 403):
                raise AuthFailed(self.url, msg) from e
            # A MinIO whose disk filled up answers 500 InternalError "...(no space left on device)".
            if code in _FULL or status in (413, 507) or "no space left on device" in msg.lower():
                raise RemoteFull(self.url, msg) from e
            if code in _TRANSIENT or status >= 500 or status == 429:
                raise Transient(self.url, msg) from e
            raise Permanent(self.url, msg) from e
        except bx.NoCredentialsError as e:
            raise AuthFailed(self.url, f"{what}: no credentials (set access_key and secret_key, or "
                                       "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)") from e
        except bx.SSLError as e:
            if "CERTIFICATE_VERIFY_FAILED" in str(e):
                raise Permanent(self.url, f"the endpoint's certificate is not trusted ({e}): set ca_file to the "
                                          "certificate that signed it, or insecure = true") from e
            raise Transient(self.url, f"{what}: {e}") from e
        except (bx.HTTPClientError, bx.ConnectionError, bx.ResponseStreamingError, OSError) as e:
            raise Transient(self.url, f"{what}: {e}") from e

    def _key(self, name):
        return f"{self.base}/{name}" if self.base else name

    # -- the interface

    def put(self, name, path, offset=0, length=None, token="", progress=None):
        length = span(path, offset, length)
        key = self._key(check_name(name))
        with self._errors(f"uploading {name}"):
            s3 = self._client()
            if progress:
                progress(0)
            if length <= self.spec.multipart_threshold:
                data = self._read(path, offset, length)
                s3.put_object(Bucket=self.bucket, Key=key, Body=self._body(data), **self._digest(data))
                self._count(length)
                if progress:
                    progress(length)
                return
            uploads = self._uploads(key)
            upload, parts = None, {}
            if token and uploads:
                upload = uploads[0]["UploadId"]
                parts = self._parts(key, upload)
            if upload is None:
                upload = s3.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
            size = max(PART, -(-length // MAX_PARTS))
            etags, todo, done = {}, [], 0
            for number, start in enumerate(range(0, length, size), 1):
                n = min(size, length - start)
                old = parts.get(number)
                if old and old["Size"] == n and old["ETag"].strip('"') == md5_of(path, offset + start, n):
                    etags[number] = old["ETag"]
                    done += n
                else:
                    todo.append((key, upload, number, path, offset + start, n))
            if progress and done:
                progress(done)
            for number, etag, n in run_all(self._put_part, todo, self.concurrent):
                etags[number] = etag
                done += n
                if progress:
                    progress(done)
            s3.complete_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload, MultipartUpload={
                "Parts": [{"PartNumber": k, "ETag": etags[k]} for k in sorted(etags)]})
            for u in uploads:          # older attempts that cannot be resumed any more
                if u["UploadId"] != upload:
                    self._abort(key, u["UploadId"])

    def _put_part(self, key, upload, number, path, offset, n):
        """Upload one part -> (number, ETag, n); run in a worker thread."""
        data = self._read(path, offset, n)
        # Content-MD5 makes the server refuse a damaged part (BadDigest); the ETag it answers is
        # not an MD5 on an SSE-KMS bucket, so it is not compared.
        etag = self._client().upload_part(Bucket=self.bucket, Key=key, UploadId=upload, PartNumber=number,
                                          Body=self._body(data), ContentMD5=_md5(data)[1])["ETag"]
        self._count(n)
        return number, etag, n

    def _digest(self, data):
        """What makes the server refuse a damaged body: over plain http botocore signs the body's
        SHA-256, which the server checks (and a Content-MD5 would cost as much again); over https the
        body goes unsigned, so its Content-MD5."""
        return {"ContentMD5": _md5(data)[1]} if self._client().meta.endpoint_url.startswith("https:") else {}

    def _read(self, path, offset, n):
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(n)
        if len(data) != n:
            raise ValueError(f"{path} shrank while it was uploaded")
        return data

    def _body(self, data):
        """What botocore sends: the bytes, or under a bandwidth limit a reader paced as it is read."""
        return data if self.limiter is None else _Paced(data, self._pace)

    def _count(self, n):
        with self._lock:
            self.sent += n

    def _uploads(self, key):
        """The unfinished multipart uploads of exactly `key`, newest first."""
        out = []
        for page in self._client().get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket,
                                                                                   Prefix=key):
            out += [u for u in page.get("Uploads", []) if u["Key"] == key]
        return sorted(out, key=lambda u: u["Initiated"], reverse=True)

    def _parts(self, key, upload):
        """{part number: part} of an unfinished upload; {} if it is gone."""
        from botocore.exceptions import ClientError
        parts = {}
        try:
            for page in self._client().get_paginator("list_parts").paginate(Bucket=self.bucket, Key=key,
                                                                            UploadId=upload):
                parts.update((p["PartNumber"], p) for p in page.get("Parts", []))
        except ClientError as e:
            if _code(e) != "NoSuchUpload":
                raise
        return parts

    def _abort(self, key, upload):
        from botocore.exceptions import ClientError
        with contextlib.suppress(ClientError):
            self._client().abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload)

    def _open(self, name, offset=0, length=None):
        """The body stream of bytes [offset, offset+length) of object `name`, or None past its end."""
        from botocore.exceptions import ClientError
        kw = {}
        if offset or length is not None:
            kw["Range"] = f"bytes={offset}-" + ("" if length is None else str(offset + length - 1))
        try:
            return self._client().get_object(Bucket=self.bucket, Key=self._key(check_name(name)), **kw)["Body"]
        except ClientError as e:
            if _code(e) in _MISSING:
                raise RemoteMissing(self.url, name) from None
            if _code(e) == "InvalidRange":
                return None
            raise

    def _stream(self, body, write):
        with contextlib.closing(body):
            while True:
                n = self._chunk_size()
                self._pace(n)
                data = body.read(n)
                if not data:
                    return
                with self._lock:
                    self.received += len(data)
                write(data)

    def get(self, name, offset=0, length=None):
        if length == 0:
            return b""
        out = bytearray()
        with self._errors(f"reading {name}"):
            body = self._open(name, offset, length)
            if body is not None:
                self._stream(body, out.extend)
        return bytes(out)

    def get_file(self, name, path, progress=None):
        def fetch(write):
            with self._errors(f"downloading {name}"):
                self._stream(self._open(name), write)
        download(path, fetch, progress)

    def size(self, name):
        from botocore.exceptions import ClientError
        with self._errors(f"looking up {name}"):
            try:
                return self._client().head_object(Bucket=self.bucket, Key=self._key(check_name(name)))["ContentLength"]
            except ClientError as e:
                if _code(e) in _MISSING:
                    return None
                raise

    def list(self, prefix=""):
        out = {}
        cut = len(self._key(""))
        with self._errors("listing"):
            for page in self._client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                                Prefix=self._key(prefix)):
                out.update((o["Key"][cut:], o["Size"]) for o in page.get("Contents", []))
        return out

    def delete(self, name):
        with self._errors(f"deleting {name}"):
            self._client().delete_object(Bucket=self.bucket, Key=self._key(check_name(name)))

    def cleanup(self, prefix=""):
        start = self._key(prefix)
        with self._errors("removing unfinished uploads"):
            found = []      # listed for the whole bucket: MinIO answers a prefix only if it is a whole key
            for page in self._client().get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket):
                found += [u for u in page.get("Uploads", []) if u["Key"].startswith(start)]
            for u in found:
                self._abort(u["Key"], u["UploadId"])
            return len(found)

    def close(self):
        s3, self._s3 = self._s3, None
        if s3 is not None:
            with contextlib.suppress(Exception):
                s3.close()


_made = threading.Lock()
_loader = None     # botocore's service models, read once per process


def _new_client(**kw):
    """An S3 client that asks for no `Expect: 100-continue` before a body (a round trip per object on
    a long link). Clients share the service models (reading them costs more than the rest of a
    client), and are made without the cyclic garbage collector, which loading them sets off over
    and over in a process with a large heap."""
    global _loader
    import boto3
    import botocore.session
    from botocore.handlers import add_expect_header
    with _made:
        collecting = gc.isenabled()
        gc.disable()
        try:
            core = botocore.session.Session()
            if _loader is None:
                _loader = core.get_component("data_loader")
            core.register_component("data_loader", _loader)
            client = boto3.session.Session(botocore_session=core).client("s3", **kw)
        finally:
            if collecting:
                gc.enable()
    client.meta.events.unregister("before-call.s3", add_expect_header)
    return client


def _code(e):
    return getattr(e, "response", {}).get("Error", {}).get("Code", "")


def _md5(data):
    """(hex, base64) MD5 of data: the ETag S3 answers, and the Content-MD5 it checks."""
    d = hashlib.md5(data, usedforsecurity=False).digest()
    return d.hex(), base64.b64encode(d).decode()


class _Paced(io.BytesIO):
    """Bytes read through the bandwidth limit: each byte is paced the first time it is read, so
    botocore's rewinds (a retry, or the payload hash it takes before sending over plain http) cost
    no second wait."""

    def __init__(self, data, pace):
        super().__init__(data)
        self.pace, self.high = pace, 0

    def read(self, n=-1):
        data = super().read(n)
        end = self.tell()
        if end > self.high:
            self.pace(end - self.high)
            self.high = end
        return data

registry.register(S3Backend, "s3")
