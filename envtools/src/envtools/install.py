"""``envtools install``: solve and install a curated set into a read-only shared prefix.

The env is built in a temporary directory beside the prefix with the final path baked
into its files (rattler's ``alternative_target_prefix``), then renamed into place, so a
failed install leaves nothing half-made where users would find it. The package cache is
kept at ``<prefix>.pkgs`` so later clones can link from it instead of copying.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import rattler

from envtools import aio, archives, bytecode, cachetag, conda_records, record_index, virtual
from envtools.errors import EnvtoolsError
from envtools.hashing import STAT_CACHE, stat_key, write_package_parts
from envtools.prefix_records import Prefix
from envtools.progress import info
from envtools.readonly import (
    MARKER,
    default_cache_for,
    make_readonly,
    read_marker,
    refuse_readonly,
    write_prefix_info,
    write_site_markers,
)
from envtools.tempdirs import atomic_dir, remove_tree
from envtools.untracked import write_cache as write_untracked_cache

EXPLICIT = Path("conda-meta") / "envtools" / "explicit.txt"


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
    machine of that platform: :func:`envtools.virtual.for_platform`).

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


def write_explicit(prefix: Path, records: list[rattler.RepoDataRecord]) -> None:
    """The explicit package set, in conda's ``@EXPLICIT`` format (reproducible installs).

    Each sha256 is the repodata's, which every archive was checked against before it was
    extracted (:mod:`envtools.archives`): the file records only what was installed.
    """
    lines = ["# envtools: the explicit package set of this environment", "@EXPLICIT"]
    for r in sorted(records, key=lambda r: r.name.normalized):
        lines.append(f"{r.url}#sha256:{archives.expected_digest(r)[0].hex()}")
    (prefix / EXPLICIT).parent.mkdir(parents=True, exist_ok=True)
    (prefix / EXPLICIT).write_text("\n".join(lines) + "\n")


def install(
    channel: str | list[str],
    prefix: Path,
    specs: list[str],
    virtual_overrides: list[str] | None = None,
    cache: Path | None = None,
) -> Path:
    """Install ``specs`` into a new read-only ``prefix``; returns the prefix."""
    prefix = Path(os.path.abspath(prefix))
    refuse_readonly(prefix.parent, "install into")
    if prefix.exists():
        if not prefix.is_dir():
            # (checked first: asked for its marker, a plain file was called "already an
            # envtools read-only environment")
            raise EnvtoolsError(
                f"{prefix} is a file, not a directory: --prefix names the environment's "
                "directory",
                "choose a --prefix that does not exist yet (or an empty directory)",
            )
        if read_marker(prefix) is not None:
            raise EnvtoolsError(
                f"{prefix} is already an envtools read-only environment",
                f"remove it first with: envtools remove {prefix}",
            )
        if any(prefix.iterdir()):
            raise EnvtoolsError(
                f"{prefix} exists and is not empty",
                "choose a new --prefix, or remove the directory first",
            )
    channels = [channel] if isinstance(channel, str) else list(channel)
    srcs = [channel_source(c) for c in channels]
    for s in specs:
        parse_spec(s)
    cache = Path(os.path.abspath(cache)) if cache else default_cache_for(prefix)
    virtuals = virtual.resolve(virtual_overrides)

    t0 = time.monotonic()
    records = aio.run(solve(srcs, specs, virtuals))
    info(f"solved {len(records)} packages in {time.monotonic() - t0:.1f}s")
    timings = {"solve": time.monotonic() - t0}
    cache_existed = cache.exists()
    if cache_existed:
        # a cache left by an earlier install of this prefix; it was made read-only
        from envtools.readonly import make_writable

        make_writable(cache)
    try:
        # every archive checked against the repodata and its contents against the path
        # rule, then extracted into the cache (replacing what was there), before anything
        # is linked
        prepared = archives.prepare(records, cache, archives.site_packages(records))
        for stage, seconds in prepared.timings.items():
            timings[stage] = timings["solve"] + seconds
        _install_into(records, prepared, prefix, cache, srcs, specs, timings, t0)
    except BaseException:
        # a cache this run made goes with it, unless another run's env at the prefix
        # (which won a race to it) uses it now; one that was there (shared with other
        # envs) is read-only again, as they left it
        if not cache_existed and read_marker(prefix) is None:
            remove_tree(cache, settle=True)
        elif cache.exists():
            _drop_cache_locks(cache)
            make_readonly(cache)
        raise
    os.chmod(prefix, 0o555)
    timings["total"] = time.monotonic() - t0
    info(f"installed {len(records)} packages into {prefix} (read-only) in "
         f"{timings['total']:.1f}s; package cache: {cache}")
    if os.environ.get("ENVTOOLS_TIMINGS"):
        info(f"verified {prepared.archive_bytes} archive bytes in "
             f"{prepared.timings.get('verify', 0) - prepared.timings.get('fetch', 0):.3f}s; "
             "stages (s since start): " + ", ".join(f"{k} {v:.3f}" for k, v in timings.items()))
    return prefix


def _install_into(records: list, prepared: archives.Prepared, prefix: Path, cache: Path,
                  srcs: list[str], specs: list[str], timings: dict[str, float],
                  t0: float) -> None:
    """Install ``records`` (their archives ``prepared``) beside ``prefix`` and rename them
    into place, read-only."""
    with atomic_dir(prefix, "envtools install", settle=True) as tmp:
        _drop_cache_locks(cache)  # (a stale one naming another sha256 makes rattler re-fetch)
        run_installer(
            records=records,
            target_prefix=tmp,
            alternative_target_prefix=prefix,
            cache_dir=cache,
            show_progress=os.isatty(2),
        )
        archives.check_linked(tmp, prepared)
        timings["link"] = time.monotonic() - t0
        # (as conda does; records list the pycs; a noarch: python package's go into its cache
        # entry too, so that clones can link its directories whole)
        bytecode.compile_installed(tmp, prefix, cache)
        timings["compile"] = time.monotonic() - t0
        conda_records.conda_shape(tmp)  # (what conda doctor and conda-pack read)
        write_explicit(tmp, records)
        write_prefix_info(tmp, prefix, cache, srcs)
        site = archives.site_packages(records)
        # (PEP 668 and CEP 22: pip and conda refuse the read-only env, naming clone)
        write_site_markers(tmp, prefix, str(Path(site).parent) if site else None)
        marker = {
            "readonly": True,
            "created_by": "envtools install",
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "prefix": str(prefix),
            "channel": srcs[0],
            "channels": srcs,
            "specs": specs,
            "package_cache": str(cache),
            "how_to_change": f"envtools clone {prefix} DEST --add SPEC",
        }
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        _drop_cache_locks(cache)
        cachetag.tag_cache(cache)
        conda_records.write_cache_records(cache, records)  # (conda can use the cache)
        make_readonly(cache)
        records = Prefix.load(tmp).records
        index = record_index.write(tmp, records)
        # (what a --link-mode dirs clone links: planned once here, not in every clone)
        from envtools.clone import write_layer_plan

        write_layer_plan(tmp, records, stat_key(os.stat(index)))
        tracked = [e["_path"] for r in records for e in r.paths]
        cachetag.drop_from_env(tmp, set(tracked))
        write_untracked_cache(tmp, set(tracked))
        make_readonly(tmp)
        os.chmod(tmp / STAT_CACHE.parent, 0o755)
        for part in write_package_parts(tmp, records):
            os.chmod(part, 0o444)
        os.chmod(tmp / STAT_CACHE, 0o555)
        os.chmod(tmp / STAT_CACHE.parent, 0o555)
        os.chmod(tmp, 0o755)  # renamed below; read-only again right after


def _drop_cache_locks(cache: Path) -> None:
    """rattler's lock files are per-writer state; a read-only shared cache must not keep them."""
    for fp in cache.glob("*.lock"):
        fp.unlink(missing_ok=True)
    (cache / ".cache.lock").unlink(missing_ok=True)


def remove(prefix: Path) -> None:
    """Remove an envtools env (read-only ones included) and its package cache beside it."""
    from envtools.readonly import make_writable, read_prefix_info

    prefix = Path(os.path.abspath(prefix))
    if prefix.is_symlink():
        raise EnvtoolsError(f"{prefix} is a symbolic link, not an environment",
                            f"remove the link itself (rm {prefix}), or give the path it "
                            "points to")
    if not (prefix / "conda-meta").is_dir():
        raise EnvtoolsError(f"{prefix} is not a conda environment", "check the path")
    pinfo = read_prefix_info(prefix)
    cache = pinfo.get("package_cache")
    # Nothing outside the prefix is touched: the directories are made writable walking
    # without following links, and rmtree removes a symlink, never what it points to.
    # Paths in the records are not used: a file a hostile package put outside is not
    # listed here to be "removed", and install refuses such packages in the first place.
    make_writable(prefix)
    shutil.rmtree(prefix)
    # only the cache we created beside it (never a link to elsewhere); a shared cache stays
    default = default_cache_for(prefix)
    if cache and Path(cache) == default and default.is_dir() and not default.is_symlink():
        make_writable(default)
        shutil.rmtree(default)
