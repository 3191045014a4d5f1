"""The ``envtools`` command line (also ``python -m envtools``).

Thin on purpose: each subcommand parses options and calls one module that does the work,
so the same functions are what the tests and the benchmark exercise. Built on argparse,
and every subcommand imports its module only when it runs: a clone of a 20,000-file env
takes a few tenths of a second, and a CLI framework's start-up (typer pulls in click,
pydantic and rich: ~0.1 s) would be a third of it.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from envtools.base.progress import exit_flushed, info, report_error
from envtools.errors import EnvtoolsError, os_error

DESCRIPTION = "Install, publish as modules, clone and validate read-only conda environments."


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keep the docstring paragraphs as written, show defaults where there are any."""

    def _get_help_string(self, action: argparse.Action) -> str:
        h = action.help or ""
        if action.default not in (None, False, argparse.SUPPRESS, []) and "%(default)" not in h:
            h += " [default: %(default)s]"
        return h


def _virtual_opt(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--virtual", action="append", metavar="SPEC",
        help="override a detected virtual package, e.g. __cuda=12.4 (repeatable; "
        "'__cuda=' removes it)",
    )


def _cmd_install(a: argparse.Namespace) -> int:
    """Solve and install SPEC into a new read-only PREFIX, keeping the package cache beside it.

    The prefix gets conda-meta/envtools/readonly.json; every envtools command refuses to
    write inside it. The explicit package set is in conda-meta/envtools/explicit.txt.
    """
    from envtools.commands.install import install

    with _writing(a.prefix):
        install(a.channel, a.prefix, a.spec, a.virtual, a.cache)
    return 0


def _cmd_remove(a: argparse.Namespace) -> int:
    """Delete an environment made by envtools (read-only ones too) and its <prefix>.pkgs."""
    from envtools.commands.install import remove

    remove(a.prefix)
    return 0


def _cmd_clone(a: argparse.Namespace) -> int:
    """Clone SRC to DEST quickly and exactly, then optionally --add packages.

    Package files are linked from SRC's package cache when it is readable (reflink, or a
    hardlink to a cache file nobody may write, never as root; for a user who does not own
    a root-owned cache, a symlink to each file of it, or with --link-mode dirs to whole
    directories, they cannot change), else copied from SRC; prefixes are relocated;
    pip-installed files are carried over. Built beside DEST and renamed
    into place: on failure or Ctrl-C nothing is left at DEST.
    """
    from envtools.commands.clone import clone
    from envtools.image.cli import clone_image, is_image

    if is_image(a.src):  # clone IMAGE DEST (envtools.image)
        return clone_image(a)
    with _writing(a.dest):
        report = clone(
            a.src, a.dest, add=a.add or [], allow_update=a.allow_update,
            channels=a.channel or [], link_mode=a.link_mode, use_cache=not a.no_cache,
            virtual_overrides=a.virtual,
        )
    report.print()
    return 0


def _cmd_add(a: argparse.Namespace) -> int:
    """Install packages into a writable env (a clone), as one transaction: conda install.

    Solves SPEC with the installed packages pinned (--update-deps: only preferred), from
    the channels the env was installed or cloned from plus any --channel; checks and
    extracts the new packages into your package cache (~/.cache/envtools/pkgs), links
    them in a staging directory inside the env, then moves them in. A failed solve,
    Ctrl-C, a kill or a full disk leaves the env as it was (after a kill -9 the next add
    or drop says "rolled back"). A read-only env is refused: clone it first.
    """
    from envtools.commands.changes import add

    with _writing(a.prefix):
        report = add(a.prefix, a.spec, channels=a.channel or [], update_deps=a.update_deps,
                     virtual_overrides=a.virtual)
    report.print()
    return 0


def _cmd_drop(a: argparse.Namespace) -> int:
    """Remove packages from a writable env, as one transaction: conda remove.

    Refused while another installed package depends on one of them (the message says
    which, and what it needs) unless --force. A read-only env is refused: clone it first.
    """
    from envtools.commands.changes import drop

    with _writing(a.prefix):
        report = drop(a.prefix, a.name, force=a.force)
    report.print()
    return 0


@contextmanager
def _writing(dest: Path) -> Iterator[None]:
    """A system error that names no file (a full disk during a write) names what was
    being made: its temporary directory is gone by the time the error is shown."""
    try:
        yield
    except OSError as e:
        if not e.filename:
            e.filename = f"while writing {os.path.abspath(dest)}"
        raise


def _cmd_detach(a: argparse.Namespace) -> int:
    """Give packages of a clone directories of their own, so pip and conda can change them.

    A user's clone made with --link-mode dirs links whole directories of packages to the
    site's read-only package cache (one link for thousands of files). pip and conda cannot
    uninstall or upgrade such a package in place (pip stops with "Permission denied" on
    a path in the cache, and changes nothing). This replaces each such link of the named
    packages (all, if none is named) by a real directory holding a symlink per file:
    nothing is copied, and the site env is not changed. `envtools validate` lists the
    linked packages (check linked-directories).
    """
    from envtools.commands.detach import detach

    done = detach(a.prefix, a.package or [])
    pkgs = sorted({p for p, _d in done})
    info(f"detached {len(done)} directories of {len(pkgs)} packages"
         + (f": {', '.join(pkgs)}" if pkgs else " (none were linked)"))
    return 0


def _cmd_module(a: argparse.Namespace) -> int:
    """Write modulefiles that do what `conda activate` does, reversibly.

    Lmod (NAME.lua) and/or Environment Modules (Tcl, NAME): PATH, CONDA_PREFIX,
    CONDA_DEFAULT_ENV, CONDA_SHLVL, CONDA_PROMPT_MODIFIER, the env's activate.d scripts
    and conda-meta/state env_vars, a python family conflict, whatis/help, and an
    extensions() list for `module spider`. `module unload` restores the environment.
    """
    from envtools.commands.module import write_modulefiles
    from envtools.image.cli import is_image, module_image

    if is_image(a.prefix):  # module IMAGE (envtools.image)
        return module_image(a)
    for p in write_modulefiles(a.prefix, a.name, a.out, a.format):
        info("wrote ", str(p))
    return 0


def _cmd_gc(a: argparse.Namespace) -> int:
    """Remove what killed envtools runs left behind: .NAME.envtools-tmp-* directories.

    A clone or install builds its env in a temporary directory beside the destination
    and renames it into place. SIGKILL (kill -9, the OOM killer, a job time limit) runs
    no clean-up, so that directory stays. Each records its owner (host, pid, start time)
    and is locked while the owner lives; gc removes one only when its owner is certainly
    gone, and keeps (and names) everything else: live runs, other users' and other
    hosts' directories, and anything without envtools' owner record. Every envtools
    install or clone also does this for the directory it writes into.
    """
    from envtools.commands.gc import collect, default_dirs

    collect(a.dirs or default_dirs(), a.dry_run)
    return 0


def _cmd_validate(a: argparse.Namespace) -> int:
    """Check that everything in PREFIX still fits together.

    Exit status: 0 no error-severity findings, 1 errors found, 2 cannot read PREFIX.
    The --json schema is in envtools/README.md.
    """
    from envtools.commands.validate import run_validate
    from envtools.image.cli import is_image, validate_image

    if is_image(a.prefix):  # validate IMAGE (envtools.image)
        return validate_image(a)
    return run_validate(a.prefix, json_out=a.json, full=a.full, virtual_overrides=a.virtual,
                        imports=not a.no_imports, import_timeout=a.import_timeout)


def _subcommand(sub, name: str, fn) -> argparse.ArgumentParser:
    first, _, rest = (fn.__doc__ or "").partition("\n")
    p = sub.add_parser(name, help=first, description=first + "\n" + textwrap.dedent(rest),
                       formatter_class=_Formatter)
    p.set_defaults(func=fn)
    return p


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; one function so ``--help`` texts can be tested."""
    ap = argparse.ArgumentParser(prog="envtools", description=DESCRIPTION,
                                 formatter_class=_Formatter)
    sub = ap.add_subparsers(title="commands", metavar="COMMAND")

    p = _subcommand(sub, "install", _cmd_install)
    p.add_argument("spec", nargs="+", help="package specs, e.g. powerai or powerai=1.0")
    p.add_argument("--channel", required=True, action="append",
                   help="local channel directory or channel URL (repeatable: the site's "
                   "channel, then its upstream, e.g. channel-upstream; recorded in the env "
                   "for envtools add)")
    p.add_argument("--prefix", type=Path, required=True,
                   help="new environment directory (must not exist)")
    p.add_argument("--cache", type=Path,
                   help="package cache directory [default: <prefix>.pkgs]")
    _virtual_opt(p)

    p = _subcommand(sub, "remove", _cmd_remove)
    p.add_argument("prefix", type=Path, help="environment to delete")

    p = _subcommand(sub, "clone", _cmd_clone)
    p.add_argument("src", type=Path, help="environment to clone (may be read-only), or an "
                   "image made by envtools seal")
    p.add_argument("dest", type=Path, help="new environment (must not exist or be empty)")
    p.add_argument("--add", action="append", metavar="SPEC",
                   help="package spec to add after cloning (repeatable)")
    p.add_argument("--allow-update", action="store_true",
                   help="let --add change the versions of already installed packages")
    p.add_argument("--channel", action="append",
                   help="channel for --add [default: the channels the env came from]")
    p.add_argument("--link-mode", choices=("auto", "dirs", "reflink", "symlink", "copy"),
                   default="auto",
                   help="auto: reflink, else hardlink to read-only cache files when not root, "
                   "else (a root-owned cache, hardlinks refused) a symlink per file to it, "
                   "else copy; dirs: as auto, and one link for each directory a package owns "
                   "wholly (fastest; pip/conda need `envtools detach` before they change such "
                   "a package); symlink: a symlink per file, also to a cache another user owns")
    p.add_argument("--no-cache", action="store_true",
                   help="ignore the package cache: copy from SRC and relocate")
    _virtual_opt(p)

    p = _subcommand(sub, "add", _cmd_add)
    p.add_argument("prefix", type=Path, help="a writable env (your clone)")
    p.add_argument("spec", nargs="+", help="package specs, e.g. tqdm or 'tqdm>=4'")
    p.add_argument("--channel", action="append",
                   help="another channel to take packages from (repeatable) [default: the "
                   "channels the env records]")
    p.add_argument("--update-deps", action="store_true",
                   help="let the installed packages change version if the new ones need it")
    _virtual_opt(p)

    p = _subcommand(sub, "drop", _cmd_drop)
    p.add_argument("prefix", type=Path, help="a writable env (your clone)")
    p.add_argument("name", nargs="*", help="package names (none: only roll back what a "
                   "killed add or drop left, which validate reports as interrupted-change)")
    p.add_argument("--force", action="store_true",
                   help="drop them even though other installed packages depend on them")

    p = _subcommand(sub, "detach", _cmd_detach)
    p.add_argument("prefix", type=Path, help="your clone")
    p.add_argument("package", nargs="*", help="package names [default: all]")

    p = _subcommand(sub, "module", _cmd_module)
    p.add_argument("prefix", type=Path, help="the environment to publish, or an image "
                   "(envtools seal) that the site mounts at its prefix on each node")
    p.add_argument("--name", help="module name/version, e.g. powerai/1.0 [default: the "
                   "package the env was installed for and its major.minor version, with "
                   "-cuda for a CUDA build: powerai/1.0 or powerai/1.0-cuda]")
    p.add_argument("--out", type=Path, required=True,
                   help="modulefile root (what goes on MODULEPATH)")
    p.add_argument("--format", choices=("lmod", "tcl", "both"), default="both",
                   help="which module system to write for")

    p = _subcommand(sub, "validate", _cmd_validate)
    p.add_argument("prefix", type=Path, help="the environment to check, or an image "
                   "(envtools seal: verified, then checked mounted)")
    p.add_argument("--json", action="store_true", help="print findings as JSON")
    p.add_argument("--full", action="store_true",
                   help="re-hash every file, ignoring the stat cache")
    p.add_argument("--no-imports", action="store_true",
                   help="skip the import smoke test (importing every package's top-level "
                   "modules in the env's python)")
    p.add_argument("--import-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="time limit for importing one module")
    _virtual_opt(p)

    from envtools.image.cli import register  # seal, run, mount

    register(sub, _subcommand)

    p = _subcommand(sub, "gc", _cmd_gc)
    p.add_argument("dirs", nargs="*", type=Path, metavar="DIR",
                   help="directories that hold envs, or temporary directories themselves "
                   "[default: . and ddlrun --env's default stage dirs, TMPDIR/ddl-stage-UID "
                   "and /dev/shm/ddl-stage-UID]")
    p.add_argument("-n", "--dry-run", action="store_true",
                   help="only say what would be removed")
    return ap


def main(argv: list[str] | None = None) -> None:
    """Entry point: run one subcommand; exit through
    :func:`~envtools.base.progress.exit_flushed` (see there).

    The cyclic garbage collector is off: a command lives for a second or less and builds
    hundreds of thousands of objects from the package records, none of them cyclic
    garbage, so each collection walks them all for nothing (a fifth of the time to load
    a 46,000-file env's records), and would also copy the pages forked placement
    processes share with this one.
    """
    gc.disable()
    signal.signal(signal.SIGINT, signal.default_int_handler)  # (see envtools.__main__)
    try:
        code = _run(argv)
    except SystemExit as e:  # argparse: --help (0) and usage errors (2)
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        info("interrupted; nothing was left behind")
        code = 130
    exit_flushed(code)


def _run(argv: list[str] | None) -> int:
    """Parse and dispatch, turning EnvtoolsError into a message and an exit status."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if not hasattr(args, "func"):
        ap.print_help()
        return 2
    try:
        return args.func(args)
    except EnvtoolsError as e:
        return report_error(e)
    except KeyboardInterrupt:
        info("interrupted; nothing was left behind")
        return 130
    except OSError as e:
        return report_error(os_error(e))
    except Exception as e:  # noqa: BLE001 - never a traceback at the command line
        return report_error(_internal_error(e))
    except BaseException as e:  # a Rust panic in py-rattler (pyo3's PanicException)
        if isinstance(e, SystemExit):
            raise
        return report_error(_internal_error(e))


def _internal_error(e: BaseException) -> EnvtoolsError:
    """A failure envtools has no message for: one line, the traceback only on request."""
    if os.environ.get("ENVTOOLS_DEBUG"):
        import traceback

        traceback.print_exception(e)
    return EnvtoolsError(f"unexpected {type(e).__name__}: {e}",
                         "this is a bug in envtools (or in a library it uses); run again with "
                         "ENVTOOLS_DEBUG=1 for the traceback and report it", exit_code=1)
