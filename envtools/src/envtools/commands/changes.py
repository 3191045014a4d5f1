"""``envtools add`` and ``envtools drop``: conda install and conda remove for a writable env.

A user's clone has no conda in it, and ``clone --add`` works only while cloning, so these
change an env in place, as a transaction (:mod:`envtools.prefix.txn`): solved, checked,
extracted and linked into a staging directory first (the same code as ``clone --add``,
:mod:`envtools.solve.adding`), then moved in by renames. A read-only env (an ``envtools
install``) is refused with the hint to clone it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from envtools.base.progress import info
from envtools.errors import EnvtoolsError
from envtools.prefix import confine, record_index, txn
from envtools.prefix.hashing import STAT_CACHE, package_part, rekey_moved, write_package_parts
from envtools.prefix.readonly import refuse_readonly
from envtools.prefix.records import Prefix, Record
from envtools.solve import adding
from envtools.solve.solver import parse_spec


@dataclass
class ChangeReport:
    """What add or drop did (printed at the end)."""

    prefix: Path
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)  # stage -> s since start

    def print(self) -> None:
        for w in self.warnings:
            info(f"[yellow]warning:[/] {w}")
        if not self.added and not self.removed:
            info(f"nothing to change in {self.prefix}: already as asked")
            return
        if self.added:
            info(f"added: {', '.join(self.added)}")
        if self.removed:
            info(f"removed: {', '.join(self.removed)}")
        info(f"changed {self.prefix} in {self.seconds:.2f}s")
        if os.environ.get("ENVTOOLS_TIMINGS"):
            info("stages (s since start): " + ", ".join(
                f"{k} {v:.3f}" for k, v in self.timings.items()))


def _check_env(prefix: Path, verb: str) -> Path:
    prefix = Path(os.path.abspath(prefix))
    refuse_readonly(prefix, verb)
    if not (prefix / "conda-meta").is_dir() or prefix.is_symlink():
        raise EnvtoolsError(f"{prefix} is not a conda environment (no conda-meta/ in it)",
                            "give the path of an environment, e.g. one made by envtools clone")
    return prefix


def _history(prefix: Path, stage: Path, cmd: str, added: list[str], removed: list[str]) -> str:
    """conda-meta/history with this change appended, written in the stage."""
    data = confine.read_regular(str(prefix / "conda-meta" / "history")) or b""
    lines = [f"==> {time.strftime('%Y-%m-%d %H:%M:%S')} <==", f"# cmd: {cmd}"]
    # (conda's form: +name-version-build)
    lines += [f"-{d.replace('=', '-')}" for d in removed] + [
        f"+{d.replace('=', '-')}" for d in added]
    (stage / "conda-meta").mkdir(exist_ok=True)
    (stage / "conda-meta" / "history").write_bytes(data + ("\n".join(lines) + "\n").encode())
    return "conda-meta/history"


def _files_of(prefix: Path, r: Record) -> list[str]:
    """What dropping ``r`` moves out: its files, the bytecode python wrote for its
    modules, its stat cache part and its record (only what is there)."""
    root = str(prefix)
    out: list[str] = []
    rels = [e["_path"] for e in r.paths if isinstance(e, dict) and e.get("_path")]
    confine.check_paths(rels, f"record of {r.name}")
    real: dict[str, bool] = {"": True}
    for rel in rels:
        parent = rel.rpartition("/")[0]
        if parent not in real:
            real[parent] = confine.is_real(root, parent) or not os.path.lexists(
                f"{root}/{parent}")
        if not real[parent]:  # (moving it would move the shared cache's file)
            raise EnvtoolsError(
                f"{prefix / rel} lies in a directory linked to a package cache (a clone made "
                "with --link-mode dirs)",
                f"give the package directories of its own first: envtools detach {prefix} "
                f"{r.name}; then run this again")
        if os.path.lexists(f"{root}/{rel}"):
            out.append(rel)
        if rel.endswith(".py"):
            d, _, base = rel.rpartition("/")
            pyc_dir = f"{d}/__pycache__" if d else "__pycache__"
            try:
                names = os.listdir(f"{root}/{pyc_dir}")
            except OSError:
                continue
            stem = base[:-3] + "."
            out += [f"{pyc_dir}/{n}" for n in names
                    if n.startswith(stem) and n.endswith(".pyc") and f"{pyc_dir}/{n}" not in rels]
    part = STAT_CACHE / f"{package_part(r.dist)}.marshal"
    if (prefix / part).exists():
        out.append(str(part))
    out.append(str(r.path.relative_to(prefix)))
    return list(dict.fromkeys(out))


def _empty_dirs_after(prefix: Path, gone: list[str]) -> None:
    """Remove the directories the dropped files leave empty (deepest first), as conda does."""
    dirs = {rel.rpartition("/")[0] for rel in gone}
    expanded: set[str] = set()
    for d in dirs:
        while d and d not in expanded:
            expanded.add(d)
            d = d.rpartition("/")[0]
    for d in sorted(expanded, key=lambda x: -x.count("/")):
        if d.startswith("conda-meta"):
            continue
        try:
            os.rmdir(prefix / d)
        except OSError:
            pass


def _stage_tree(stage: Path) -> tuple[list[str], list[str]]:
    """(files and symlinks, directories) in the stage, relative, parents first."""
    files: list[str] = []
    dirs: list[str] = []
    for dirpath, dnames, fnames in os.walk(stage):
        rel_dir = os.path.relpath(dirpath, stage)
        rel_dir = "" if rel_dir == "." else rel_dir
        for n in list(dnames):
            p = os.path.join(dirpath, n)
            rel = f"{rel_dir}/{n}" if rel_dir else n
            if os.path.islink(p):
                files.append(rel)
                dnames.remove(n)
            else:
                dirs.append(rel)
        files += [f"{rel_dir}/{n}" if rel_dir else n for n in fnames]
    return files, dirs


def _plan_in(prefix: Path, files: list[str], dirs: list[str], out: list[str],
             report: ChangeReport, owned_paths) -> tuple[list[str], list[str]]:
    """The directories to make and the files that must go first (replaced by new ones)."""
    root = str(prefix)
    outs = set(out)
    owned: dict[str, Record] | None = None
    make = []
    for d in dirs:
        if os.path.lexists(f"{root}/{d}"):
            if not os.path.isdir(f"{root}/{d}") or os.path.islink(f"{root}/{d}"):
                raise EnvtoolsError(
                    f"{prefix / d} is a file or a symbolic link, and the new packages install "
                    "a directory there", "move it away first, or clone the env again")
        else:
            make.append(d)
    extra = []
    for rel in files:
        p = f"{root}/{rel}"
        if rel in outs or not os.path.lexists(p):
            continue
        if os.path.isdir(p) and not os.path.islink(p):
            raise EnvtoolsError(f"{prefix / rel} is a directory, and a new package installs a "
                                "file there", "move it away first")
        if rel != "conda-meta/history":
            if owned is None:
                owned = owned_paths()  # (only when a new file replaces one: rare)
            owner = owned.get(rel)
            report.warnings.append(f"{rel} (from {owner.name if owner else 'no package'}) is "
                                   "replaced by the new package's file (as conda does)")
        extra.append(rel)
    return make, out + extra


def add(
    prefix: str | os.PathLike[str],
    specs: list[str],
    channels: list[str] | None = None,
    update_deps: bool = False,
    virtual_overrides: list[str] | None = None,
) -> ChangeReport:
    """Install ``specs`` into the writable env ``prefix`` (see the module docstring)."""

    t0 = time.monotonic()
    prefix = _check_env(Path(prefix), "add packages to")
    for s in specs:
        parse_spec(s)
    report = ChangeReport(prefix)
    cmd = f"envtools add {prefix} {' '.join(specs)}"
    with txn.changing(prefix, cmd) as t:
        installed = adding.installed_records(prefix)
        # the env's records, read only where used (a big env's are 25 MB of JSON)
        by_name = {r.name.normalized: Record(
            prefix / "conda-meta" / f"{r.name.normalized}-{r.version}-{r.build}.json")
            for r in installed}
        chans = list(dict.fromkeys([*(channels or []),
                                    *adding.recorded_channels(prefix, installed)]))
        if not chans:
            raise EnvtoolsError(f"{prefix} records no channel to add packages from",
                                "name one: envtools add PREFIX SPEC --channel DIR_OR_URL")
        report.timings["records"] = time.monotonic() - t0
        sol = adding.solve_added(installed, specs, chans, update_deps, virtual_overrides,
                                 "--update-deps")
        report.timings["solve"] = time.monotonic() - t0
        if not sol.new and not sol.removed:
            report.seconds = time.monotonic() - t0
            return report
        (t.stage / "conda-meta").mkdir()
        # rattler links only the new packages into the empty stage: the kept ones are
        # "ignored" (neither installed nor removed there), python's among them still
        # telling it where noarch: python packages go
        adding.link_added(t.stage, prefix, sol, prefix, [], installed_for_installer=[],
                          installer_removes=False,
                          ignored={r.name.normalized for r in sol.kept()})
        report.timings["link"] = time.monotonic() - t0
        staged = Prefix.load(t.stage).records
        # a package rattler (re)linked although it stays (its record differed): replaced
        going = {r.name.normalized for r in sol.removed} | {
            r.name for r in staged if r.name in by_name}
        out: list[str] = []
        for name in sorted(going):
            if name in by_name:
                out += _files_of(prefix, by_name[name])
        report.added = adding.added_names(sol)
        report.removed = [f"{r.name}={r.version}={r.build}" for n, r in sorted(by_name.items())
                          if n in going]
        parts: list[str] = []
        if staged:
            (t.stage / STAT_CACHE).mkdir(parents=True, exist_ok=True)
            parts = [fp.name for fp in write_package_parts(t.stage, staged)]
        _history(prefix, t.stage, cmd, report.added, report.removed)
        report.timings["parts"] = time.monotonic() - t0
        files, dirs = _stage_tree(t.stage)
        dirs, out = _plan_in(prefix, files, dirs, out, report,
                             lambda: Prefix.load(prefix).owned_paths())
        t.commit(out, files, dirs)
        rekey_moved(prefix, parts)  # (the renames moved the files' ctime)
        report.timings["commit"] = time.monotonic() - t0
        _after(prefix, out)
    report.seconds = time.monotonic() - t0
    return report


def drop(prefix: str | os.PathLike[str], names: list[str], force: bool = False) -> ChangeReport:
    """Remove the packages ``names`` from the writable env ``prefix``; refused while other
    packages depend on them, unless ``force``."""
    t0 = time.monotonic()
    prefix = _check_env(Path(prefix), "drop packages from")
    report = ChangeReport(prefix)
    cmd = f"envtools drop {prefix} {' '.join(names)}"
    with txn.changing(prefix, cmd) as t:
        if not names:  # (only the recovery txn.changing did)
            return report
        env = Prefix.load(prefix)
        by_name = env.by_name()
        wanted = [n.strip().lower() for n in names]
        unknown = [n for n in wanted if n not in by_name]
        if unknown:
            import difflib

            near = sorted({m for n in unknown for m in difflib.get_close_matches(n, by_name)})
            raise EnvtoolsError(
                f"not installed in {prefix}: {', '.join(unknown)}",
                (f"did you mean {', '.join(near)}? " if near else "")
                + "list what is installed with: ls " + str(prefix / "conda-meta"))
        breaks = dependents(env.records, set(wanted))
        if breaks and not force:
            what = "; ".join(f"{n} needs {', '.join(deps)}" for n, deps in sorted(breaks.items()))
            raise EnvtoolsError(
                f"cannot drop {', '.join(wanted)} from {prefix}: other packages depend on "
                f"it: {what}",
                f"drop those too (envtools drop {prefix} {' '.join(wanted)} "
                f"{' '.join(sorted(breaks))}), or add --force to drop anyway and leave them "
                "broken (envtools validate reports them)")
        for n, deps in sorted(breaks.items()):
            report.warnings.append(f"{n} is left without {', '.join(deps)} (--force)")
        out: list[str] = []
        for n in wanted:
            out += _files_of(prefix, by_name[n])
        report.removed = [f"{n}={by_name[n].version}={by_name[n].build}" for n in wanted]
        hist = _history(prefix, t.stage, cmd, [], report.removed)
        _dirs, out = _plan_in(prefix, [hist], [], out, report, dict)
        t.commit(out, [hist], [])
        _after(prefix, out)
    report.seconds = time.monotonic() - t0
    return report


def dependents(records: list[Record], names: set[str]) -> dict[str, list[str]]:
    """Per package that stays, the requirements of it that name one of ``names``."""
    out: dict[str, list[str]] = {}
    for r in records:
        if r.name in names:
            continue
        for dep in r.data.get("depends") or []:
            dep_name = str(dep).split()[0].split("::")[-1].lower() if str(dep).split() else ""
            if dep_name in names:
                out.setdefault(r.name, []).append(str(dep))
    return out


def _after(prefix: Path, gone: list[str]) -> None:
    """Once committed: empty directories go, and the record index is rewritten if the env
    had one (a stale one is only ignored, so this may fail without harm)."""
    _empty_dirs_after(prefix, [g for g in gone if g != "conda-meta/history"])
    if (prefix / record_index.INDEX).exists():
        try:
            record_index.write(prefix, Prefix.load(prefix).records)
        except (OSError, EnvtoolsError):
            pass
