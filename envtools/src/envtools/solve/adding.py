"""Adding packages to an env that exists: the solve and the link, shared by ``clone --add``
and ``envtools add``.

Both solve the new specs against what the env holds (pinned, or only preferred with
``allow_update``), check the new archives as ``envtools install`` does (against the
repodata, the path rule, and the env's own files and symlinks), extract them into the
user's own package cache, and link them with rattler at the env's final path
(``alternative_target_prefix``). They differ only in where the link happens: ``clone``
links into the clone it is building, ``add`` into an empty staging directory whose files
are then moved into the env as one transaction (:mod:`envtools.prefix.txn`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from envtools.base import aio
from envtools.cache import tag as cachetag
from envtools.errors import EnvtoolsError
from envtools.prefix import confine
from envtools.prefix.conda_records import conda_shape
from envtools.prefix.readonly import read_prefix_info
from envtools.prefix.records import Record
from envtools.solve import archives, virtual
from envtools.solve.solver import channel_source, parse_spec, run_installer, solve


def channels_of(records: list) -> list[str]:
    """The channels an env's package records name, in order."""
    seen: list[str] = []
    for r in records:  # (a rattler record has it parsed; ours reads its JSON)
        ch = str(r.channel or "") if hasattr(r, "channel") else r.data.get("channel")
        if ch and ch not in seen:
            seen.append(ch)
    return seen


def recorded_channels(prefix: Path, records: list) -> list[str]:
    """The channels the env came from: those its install or clone recorded (the site's
    channel and its upstream), then those its packages name."""

    out: list[str] = []
    for c in [*(read_prefix_info(prefix).get("channels") or []), *channels_of(records)]:
        if isinstance(c, str) and c and c not in out:
            out.append(c)
    return out


def add_cache_dir() -> Path:
    """Where added packages are kept, extracted (later clones of the clone link from
    here): the user's own, ``$XDG_CACHE_HOME/envtools/pkgs``. Not rattler's shared cache:
    envtools replaces an entry with the fresh extraction it verified, which must not pull
    a directory from under another tool."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "envtools" / "pkgs"


def key(r) -> tuple[str, str, str]:
    """(name, version, build) of a rattler record: what tells two packages apart."""
    return (r.name.normalized, str(r.version), str(r.build))


@dataclass
class Solution:
    """What a solve against an installed env decided."""

    records: list  # every package of the env afterwards (RepoDataRecords)
    installed: list  # what the env holds now (PrefixRecords)
    new: list = field(default_factory=list)  # to link (RepoDataRecords)
    removed: list = field(default_factory=list)  # to unlink (PrefixRecords): other versions

    def kept(self) -> list:
        """The installed packages the solve keeps as they are."""
        gone = {key(r) for r in self.removed}
        return [r for r in self.installed if key(r) not in gone]


def installed_records(prefix: Path) -> list:
    """The env's package records as rattler reads them (what its solver pins)."""
    import rattler

    meta = prefix / "conda-meta"
    return [rattler.PrefixRecord.from_path(p) for p in sorted(meta.glob("*.json"))]


def channel_sources(channels: list[str]) -> list[str]:

    return list(dict.fromkeys(channel_source(c[7:] if c.startswith("file://") else c)
                              for c in channels))


def _spec_name(spec: str) -> str | None:

    name = parse_spec(spec).name
    return name.normalized if name is not None else None


def solve_added(
    installed: list,
    specs: list[str],
    channels: list[str],
    allow_update: bool,
    virtual_overrides: list[str] | None,
    update_flag: str = "--allow-update",
) -> Solution:
    """Solve ``specs`` on top of ``installed`` (pinned unless ``allow_update``)."""

    sources = channel_sources(channels)
    # every installed package stays: rattler's solve returns only what the specs need,
    # and its installer removes whatever is installed but not in the solution
    wanted = {_spec_name(s) for s in specs}
    keep = [r.name.normalized for r in installed if r.name.normalized not in wanted]
    try:
        records = aio.run(
            solve(
                sources,
                [*specs, *keep],
                virtual.resolve(virtual_overrides),
                pinned=None if allow_update else installed,
                locked=installed if allow_update else None,
                shown=specs,
            )
        )
    except EnvtoolsError as e:
        if not allow_update:
            e.hint = (
                "the env's packages are pinned; if the new packages need other versions "
                f"of them, add {update_flag}. " + e.hint
            )
        raise
    before = {key(r) for r in installed}
    after = {key(r) for r in records}
    return Solution(records=records, installed=installed,
                    new=[r for r in records if key(r) not in before],
                    removed=[r for r in installed if key(r) not in after])


def link_added(
    target: Path,
    final: Path,
    sol: Solution,
    env: Path,
    env_records: list[Record],
    installed_for_installer: list | None = None,
    installer_removes: bool = True,
    ignored: set[str] | None = None,
) -> None:
    """Check, extract and link ``sol.new`` into ``target`` with ``final``'s path baked in.

    ``env`` is the directory holding the env's files now (the clone being built, or the
    env itself): nothing new may go through or replace a symlink there. ``env_records``
    are its records (their paths are checked against the path rule: rattler removes what
    they list when a package changes version). ``installed_for_installer``: what rattler
    is told is installed in ``target`` (default: ``sol.installed``). ``installer_removes``:
    whether rattler removes the packages the solve replaces (``clone --add``; ``add``
    removes them itself, checking their paths as it does).
    """

    for r in env_records if installer_removes else ():
        confine.check_paths(r.data.get("files") or [], f"record of {r.name}")
    cache = add_cache_dir()
    # (the symlinks the env's packages ship: add checks the env on disk instead, where
    # check_prefix refuses any path under a symlink that is there, without reading every
    # record's file list)
    existing = {f[0]: f[1] for r in env_records for f in r.plan_fields()
                if f[1] == "softlink"} if installer_removes else {}
    prepared = archives.prepare(
        sol.new, cache, archives.site_packages(sol.records), prefix=env, existing=existing)
    run_installer(
        records=sol.records,
        target_prefix=target,
        alternative_target_prefix=final,
        installed_packages=sol.installed if installed_for_installer is None
        else installed_for_installer,
        ignored_packages=ignored,
        cache_dir=cache,
        show_progress=os.isatty(2),
    )
    archives.check_linked(target, prepared)

    conda_shape(target, {r.name.normalized for r in sol.new})
    # the installer tags the prefix as a cache (see envtools.cache.tag); an env never has
    # the tag before, so one there now is the installer's unless an added package owns it
    if (target / cachetag.NAME).exists():
        meta = target / "conda-meta"
        owned: set[str] = set()
        for r in sol.new:
            fp = meta / f"{r.name.normalized}-{r.version}-{r.build}.json"
            if fp.is_file():
                owned |= {e.get("_path") for e in Record(fp).paths if isinstance(e, dict)}
        cachetag.drop_from_env(target, owned)


def added_names(sol: Solution) -> list[str]:
    return [f"{r.name.normalized}={r.version}={r.build}" for r in sol.new]
