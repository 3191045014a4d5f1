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

from envtools.base import aio
from envtools.base.progress import info
from envtools.cache import tag as cachetag
from envtools.errors import EnvtoolsError
from envtools.place import bytecode
from envtools.place.plan import write_layer_plan
from envtools.prefix import conda_records, record_index
from envtools.prefix.hashing import STAT_CACHE, stat_key, write_package_parts
from envtools.prefix.readonly import (
    EXPLICIT,
    MARKER,
    default_cache_for,
    make_readonly,
    make_writable,
    read_marker,
    read_prefix_info,
    refuse_readonly,
    write_prefix_info,
    write_site_markers,
)
from envtools.prefix.records import Prefix
from envtools.prefix.tempdirs import atomic_dir, remove_tree
from envtools.prefix.untracked import write_cache as write_untracked_cache
from envtools.solve import archives, virtual
from envtools.solve.solver import channel_source, parse_spec, run_installer, solve


def write_explicit(prefix: Path, records: list[rattler.RepoDataRecord]) -> None:
    """The explicit package set, in conda's ``@EXPLICIT`` format (reproducible installs).

    Each sha256 is the repodata's, which every archive was checked against before it was
    extracted (:mod:`envtools.solve.archives`): the file records only what was installed.
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
