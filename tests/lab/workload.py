#!/usr/bin/python3
"""The lab guest's workload: files with known checksums and SQLite transactions, each logged once durable.

Runs inside the Debian guest as lab-workload.service (this very file is
copied into the image as /usr/local/bin/lab-workload). Every step is
logged to committed.log only after it is on disk (COMMIT with SQLite's
synchronous=FULL, then fsync of the file and its directory), so every line
of the log names something a snapshot taken after it must hold. The tests
import `content` and `parse_log` to check archived days.

    tx N                    row N of lab.db's table tx committed
    file PATH SHA256        PATH (every 4th step) written and fsynced
"""

import hashlib
import os
import sqlite3
import sys
import time

ROOT_DIR = "/var/lib/lab"
DATA_DIR = "/data/lab"           # on the XFS data disk, when it is mounted
LOG = "committed.log"
DB = "lab.db"
STEP = 0.5                       # seconds between transactions


def content(n):
    """The bytes of file n: 4-64 KiB, a function of n alone."""
    seed = hashlib.sha256(f"lab file {n}".encode()).digest()
    size = 4096 * (1 + n % 16)
    return (seed * (size // len(seed) + 1))[:size]


def parse_log(text):
    """-> (set of committed transaction numbers, {path: sha256}) from a committed.log."""
    txs, files = set(), {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "tx":
            txs.add(int(parts[1]))
        elif len(parts) == 3 and parts[0] == "file":
            files[parts[1]] = parts[2]
    return txs, files


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path, data):
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(os.path.dirname(path))


def main():
    os.makedirs(os.path.join(ROOT_DIR, "files"), exist_ok=True)
    db = sqlite3.connect(os.path.join(ROOT_DIR, DB), isolation_level=None)
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS tx (n INTEGER PRIMARY KEY, payload BLOB, at REAL)")
    n = (db.execute("SELECT max(n) FROM tx").fetchone()[0] or 0) + 1
    log = open(os.path.join(ROOT_DIR, LOG), "a")
    _fsync_dir(ROOT_DIR)
    while True:
        db.execute("BEGIN")
        db.execute("INSERT INTO tx VALUES (?, ?, ?)", (n, hashlib.sha256(str(n).encode()).digest() * 64, time.time()))
        db.execute("COMMIT")
        lines = [f"tx {n}"]
        if n % 4 == 0:
            dirs = [ROOT_DIR] + ([DATA_DIR] if os.path.ismount(os.path.dirname(DATA_DIR)) else [])
            data = content(n)
            for d in dirs:
                path = os.path.join(d, "files", str(n))
                os.makedirs(os.path.dirname(path), exist_ok=True)
                _write(path, data)
                lines.append(f"file {path} {hashlib.sha256(data).hexdigest()}")
        log.write("".join(x + "\n" for x in lines))
        log.flush()
        os.fsync(log.fileno())
        n += 1
        time.sleep(STEP)


if __name__ == "__main__":
    sys.exit(main())
