"""Channels, specs, the solve and py-rattler's installer: what install, add and clone
--add share."""

from __future__ import annotations

import os
from pathlib import Path

import rattler

from envtools.base import aio
from envtools.errors import EnvtoolsError
from envtools.solve import virtual


def channel_source(channel: str) -> str:
    """Accept a local channel directory or a URL; check a directory really is a channel."""
    if "://" in channel:
        return channel
    p = Path(channel).absolute()
    if not p.is_dir():
        raise EnvtoolsError(
            f"channel {channel!r} is neither a URL nor an existing directory",
            "pass --channel DIR (holding noarch/repodata.json) or a channel URL",
        )
    if not any((p / sub / "repodata.json").is_file() for sub in os.listdir(p)
               if (p / sub).is_dir()):
        raise EnvtoolsError(
            f"{p} is not an indexed conda channel: no <subdir>/repodata.json in it",
            f"index it first, e.g. python -c \"import asyncio, rattler; "
            f"asyncio.run(rattler.index.index_fs('{p}'))\"",
        )
    return str(p)


def parse_spec(spec: str) -> rattler.MatchSpec:
    try:
        return rattler.MatchSpec(spec)
    except Exception as e:
        raise EnvtoolsError(f"bad package spec {spec!r}: {e}", "e.g. powerai or powerai=1.0") from e


async def solve(
    channels: list[str],
    specs: list[str],
    virtuals: list[virtual.Virtual],
    pinned: list | None = None,
    locked: list | None = None,
    shown: list[str] | None = None,
    platform: str | None = None,
) -> list[rattler.RepoDataRecord]:
    """Solve ``specs`` against ``channels``, turning solver failures into a clear error
    (naming ``shown``, the specs the user gave, when others were added to them).
    ``platform``: the subdir to solve for (with noarch) instead of this machine's, as the
    channel pipeline does for the targets it cross-builds (``virtuals`` then describe a
    machine of that platform: :func:`envtools.solve.virtual.for_platform`).

    pip goes with python, as conda does (``add_pip_as_python_dependency``): users expect
    ``python -m pip`` in every env. A channel set without pip (the fixture channel, a
    site channel used alone) is solved again without it rather than refused.
    """
    parsed = [parse_spec(s) for s in specs]
    last: Exception | None = None
    for with_pip in (True, False):
        try:
            return await rattler.solve(
                sources=channels,
                specs=parsed,
                virtual_packages=[v.generic() for v in virtuals],
                pinned_packages=pinned or [],
                locked_packages=locked or [],
                add_pip_as_python_dependency=with_pip,
                **({"platforms": [platform, "noarch"]} if platform else {}),
            )
        except EnvtoolsError:
            raise
        except Exception as e:
            last = e
    e = last
    if e is not None:
        raise EnvtoolsError(
            f"cannot solve {' '.join(shown or specs)} "
            f"{f'for {platform} ' if platform else ''}from {', '.join(channels)}:\n{e}",
            "check the package name and version exist in the channel (and --virtual for a GPU "
            "node), e.g. list them with: python -c \"import json;print(json.load(open("
            "'CHANNEL/noarch/repodata.json'))['packages'].keys())\"",
        ) from e


def run_installer(**kwargs) -> None:
    """``rattler.install(**kwargs)``, its failures turned into one clear error.

    py-rattler raises one exception per failed transaction with a chain of "Caused by:"
    lines; the first line names the package and the last one the cause (a damaged
    archive, a full disk). A Rust panic arrives as pyo3's PanicException, a
    BaseException: caught here too, so it is reported rather than printed as a traceback.
    """
    try:
        aio.run(rattler.install(**kwargs))
    except (KeyboardInterrupt, SystemExit, EnvtoolsError):
        raise
    except BaseException as e:  # noqa: BLE001 - see the docstring
        raise installer_error(e, kwargs.get("cache_dir")) from e


#: words in py-rattler's errors that mean the archive itself is damaged
_CORRUPT = ("corrupt", "checksum", "invalid zip", "failed to unpack", "fill whole buffer",
            "unexpected end", "not a number", "invalid gzip", "bz2", "zstd", "panicked")


def installer_error(e: BaseException, cache: Path | None) -> EnvtoolsError:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [type(e).__name__]
    causes = [ln[len("Caused by:"):].strip() for ln in lines if ln.startswith("Caused by:")]
    msg = lines[0] + (f": {causes[-1]}" if causes and causes[-1] not in lines[0] else "")
    text = str(e).lower()
    if "no space left" in text or "os error 28" in text or "quota exceeded" in text:
        hint = ("the filesystem is full: free space for the environment and its package "
                f"cache{f' ({cache})' if cache else ''}, or choose another place; nothing of "
                "this run was kept")
    elif any(w in text for w in _CORRUPT):
        hint = ("the package archive is damaged: replace it in the channel (rebuild or copy "
                "it again), re-index the channel, and run again; nothing of this run was kept")
    else:
        hint = "nothing of this run was kept; fix the cause above and run again"
    return EnvtoolsError(f"cannot install the packages: {msg}", hint, exit_code=1)
