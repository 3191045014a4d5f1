"""Fixtures for the emulated-cluster tests: real network namespaces, always torn down.

Skipped, with the reason, where they cannot run (not root, no `ip netns`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from clusterkit import REASON, unique
from ddl_tools import cluster


@pytest.fixture(scope="session")
def cluster3() -> Iterator[cluster.Cluster]:
    """Three hosts on 1 Gbit/s shaped links; the 2-host tests use its first two hosts."""
    if REASON:
        pytest.skip(f"emulated cluster: {REASON}")
    with cluster.running(unique("t"), hosts=3, link="1gbit") as c:
        yield c
