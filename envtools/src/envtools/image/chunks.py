"""Per-chunk sha256s of an image, so that checking a copy is spread over cores.

One sha256 over a whole image runs on one core (1.5 GB/s with SHA-NI: about 0.5 s for
the 723 MiB powerai image), longer than copying it from page cache to page cache, so a
node that checks its staged copy with it can never stage within 2x of a plain copy.
`envtools seal` therefore also writes the sha256 of every CHUNK_BYTES of the image into
IMAGE.json (``chunk_bytes``, ``chunk_sha256``); a copy whose every chunk matches is the
image those sidecars describe, as one whose whole sha256 matches, and the chunks can be
hashed on as many cores as a node has (hashlib releases the GIL for large buffers, so
threads suffice). The whole-file sha256 stays the image's name (IMAGE.sha256, for
``sha256sum -c`` and for users), and IMAGE.json binds the two: what trusts one trusts
the other. An image sealed before chunks existed has none, and is checked whole.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Sequence

#: the chunk: the staging stream's unit (ddl_core.runner.stagenode reads 4 MiB at a time),
#: small enough that a node's cores share an image evenly, large enough that the list in
#: IMAGE.json stays small (64 bytes per 4 MiB: 12 KB for powerai's image)
CHUNK_BYTES = 4 << 20
#: the chunk sizes a manifest may name (a power of two in this range)
MIN_CHUNK, MAX_CHUNK = 1 << 20, 64 << 20
#: hashing threads at most (beyond this the disk or the page cache is the limit)
MAX_THREADS = 8


#: chunks in one manifest at most: IMAGE.json stays well under the 1 MiB its readers take
MAX_CHUNKS = 8192


def chunk_for(size: int) -> int:
    """The chunk size seal uses for an image of ``size`` bytes: CHUNK_BYTES, doubled
    until the list fits MAX_CHUNKS (images over 32 GiB)."""
    chunk = CHUNK_BYTES
    while count(size, chunk) > MAX_CHUNKS and chunk < MAX_CHUNK:
        chunk *= 2
    return chunk


def count(size: int, chunk: int) -> int:
    """How many chunks of ``chunk`` bytes an image of ``size`` bytes has."""
    return (size + chunk - 1) // chunk


def threads() -> int:
    """The cores this process may run on, up to MAX_THREADS."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(MAX_THREADS, n))


def matches(digests: Sequence[str], i: int, data: bytes | memoryview) -> bool:
    """Whether ``data`` is chunk ``i`` as sealed: the one comparison every check of a
    copy makes (a file here, a stream in ddl_core.runner.stagenode)."""
    return i < len(digests) and hashlib.sha256(data).hexdigest() == digests[i]


def digest_file(path: str | os.PathLike[str], chunk: int = CHUNK_BYTES
                ) -> tuple[str, list[str]]:
    """(whole sha256, every chunk's sha256) of a file, in one read of it: what seal
    writes beside an image. The whole hash runs in a thread of its own beside the
    chunks' (each its own core), so sealing pays one pass, not two."""
    whole = hashlib.sha256()
    parts: list[str] = []
    with open(path, "rb", buffering=0) as fh:
        while data := fh.read(chunk):
            t = threading.Thread(target=whole.update, args=(data,))
            t.start()
            parts.append(hashlib.sha256(data).hexdigest())
            t.join()
    return whole.hexdigest(), parts


def first_bad(fd: int, size: int, chunk: int, digests: Sequence[str],
              nthreads: int | None = None) -> int | None:
    """Check the ``size`` bytes of ``fd`` against ``digests`` on ``nthreads`` cores;
    the offset of the first chunk that differs (or is short), else None. Reads with
    pread, so the descriptor's offset is left alone."""
    if count(size, chunk) != len(digests):
        return 0
    n = nthreads or threads()
    bad: list[int] = []
    lock = threading.Lock()
    nxt = [0]

    def work() -> None:
        while True:
            with lock:
                i = nxt[0]
                if i >= len(digests) or bad:
                    return
                nxt[0] = i + 1
            want = min(chunk, size - i * chunk)
            data = os.pread(fd, want, i * chunk)
            if len(data) != want or not matches(digests, i, data):
                with lock:
                    bad.append(i)

    pool = [threading.Thread(target=work, name=f"chunk-sha256-{k}", daemon=True)
            for k in range(min(n, len(digests)) or 1)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return min(bad) * chunk if bad else None
