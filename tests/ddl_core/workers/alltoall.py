"""alltoall and alltoallv x every dtype x odd counts, against numpy; zero counts; a wrong
receive count raises MismatchError on every rank and the next call works."""

from __future__ import annotations

import numpy as np
from common import DTYPES, same

import ddl_core as ddl

ddl.init()
r, n = ddl.rank(), ddl.size()
failures: list[str] = []


def expect(ok: bool, what: str) -> None:
    if not ok:
        failures.append(what)


def block(q: int, j: int, count: int, dt: np.dtype) -> np.ndarray:
    """What rank q sends rank j: values that fit every dtype, distinct per pair."""
    return ((np.arange(count) + 3 * q + 5 * j) % 100).astype(dt)


for dname, dt in DTYPES.items():
    for count in (0, 1, 3, 7, 97, 4099):
        x = np.concatenate([block(r, j, count, dt) for j in range(n)])
        got = ddl.alltoall(x)
        want = np.concatenate([block(q, r, count, dt) for q in range(n)])
        expect(same(got, want), f"alltoall {dname} {count}")
        expect(same(x, np.concatenate([block(r, j, count, dt) for j in range(n)])),
               f"alltoall input changed {dname}")


def vcount(q: int, j: int) -> int:
    return (7 * q + 3 * j) % 5  # (zeros included)


for dname, dt in DTYPES.items():
    x = np.concatenate([block(r, j, vcount(r, j), dt) for j in range(n)])
    sc = [vcount(r, j) for j in range(n)]
    expect(tuple(ddl.alltoall_counts(sc)) == tuple(vcount(q, r) for q in range(n)),
           f"alltoall_counts {dname}")
    got = ddl.alltoallv(x, sc)
    want = np.concatenate([block(q, r, vcount(q, r), dt) for q in range(n)])
    expect(same(got, want), f"alltoallv {dname}")

# a receive count that disagrees with its sender: every rank raises, nothing truncated
sc = [2] * n
x = np.arange(2 * n, dtype=np.int32)
rc = [2] * n
if r == n - 1:
    rc[0] = 1
try:
    ddl.alltoallv(x, sc, rc)
    expect(False, "a wrong receive count was accepted")
except ddl.MismatchError as e:
    if r == n - 1:
        expect("rank 0 sends 2 elements" in str(e) and "expects 1" in str(e), str(e))
got = ddl.alltoall(np.full(n, r, np.int64))
expect(same(got, np.arange(n, dtype=np.int64)), "alltoall after a mismatch")
try:
    ddl.alltoall(np.arange(n + 1, dtype=np.float32) if n > 1 else np.zeros(0))
    expect(n == 1, "an alltoall that does not split over the ranks was accepted")
except ValueError as e:
    expect("multiple of" in str(e), str(e))

if failures:
    raise SystemExit(f"rank {r}: " + "; ".join(failures[:5]))
print("OK alltoall", flush=True)
