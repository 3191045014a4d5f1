"""What ci knows about each published package (channel/.ci-state.json).

Kept beside the packages so that a rerun can skip what is unchanged (the recipe digest)
and the report can show build times and test results of packages built in earlier runs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

STATE_FILE = ".ci-state.json"


def load_state(channel: Path) -> dict[str, dict]:
    p = channel / STATE_FILE
    if not p.exists():
        return {}
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError:
        return {}


def save_state(channel: Path, state: dict[str, dict]) -> None:
    """Write atomically: a reader never sees half a file."""
    channel.mkdir(parents=True, exist_ok=True)
    tmp = channel / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
    os.chmod(tmp, 0o644)  # (the channel is read by every user: see index.world_readable)
    os.replace(tmp, channel / STATE_FILE)
