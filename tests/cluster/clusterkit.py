"""Helpers for the emulated-cluster tests (a module of its own: tests/ddl_core has a
conftest too, and `from conftest import` would find whichever was imported first)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ddl_tools import cluster

BIN = Path(sys.executable).parent
WORKERS = Path(__file__).parent / "workers"
REASON = cluster.skip_reason()
needs_netns = pytest.mark.skipif(REASON is not None, reason=f"emulated cluster: {REASON}")


def unique(tag: str) -> str:
    """A cluster name no one else's concurrent run uses (names are at most 8 chars)."""
    return f"{tag}{os.getpid() % 100000:05d}"[:8]


def ddlrun(*args: str, env: dict[str, str] | None = None,
           timeout: float = 180) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, PYTHONUNBUFFERED="1", DDL_TIMEOUT="60", **(env or {}))
    return subprocess.run([str(BIN / "ddlrun"), *args], capture_output=True, text=True,
                          timeout=timeout, env=full)


def places(proc: subprocess.CompletedProcess[str]) -> list[dict[str, object]]:
    rows = [json.loads(line[6:]) for line in proc.stdout.splitlines()
            if line.startswith("PLACE ")]
    return sorted(rows, key=lambda d: d["rank"])  # type: ignore[arg-type, return-value]
