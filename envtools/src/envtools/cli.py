"""The ``envtools`` command line (also ``python -m envtools``).

Thin on purpose: each subcommand parses options and calls one module that does the work,
so the same functions are what the tests and the benchmark exercise.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from envtools.errors import EnvtoolsError
from envtools.progress import console

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Install, publish as modules, clone and validate read-only conda environments.",
    context_settings={"help_option_names": ["-h", "--help"]},
)

VirtualOpt = Annotated[
    Optional[list[str]],  # noqa: UP045 - typer needs Optional on 3.10
    typer.Option(
        "--virtual",
        help="Override a detected virtual package, e.g. __cuda=12.4 (repeatable; "
        "'__cuda=' removes it).",
    ),
]


@app.command()
def install(
    spec: Annotated[list[str], typer.Argument(help="Package specs, e.g. powerai or powerai=1.0")],
    channel: Annotated[str, typer.Option(help="Local channel directory or channel URL.")],
    prefix: Annotated[Path, typer.Option(help="New environment directory (must not exist).")],
    cache: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Package cache directory [default: <prefix>.pkgs]."),
    ] = None,
    virtual: VirtualOpt = None,
) -> None:
    """Solve and install SPEC into a new read-only PREFIX, keeping the package cache beside it.

    The prefix gets conda-meta/envtools/readonly.json; every envtools command refuses to
    write inside it. The explicit package set is in conda-meta/envtools/explicit.txt.
    """
    from envtools.install import install as do_install

    do_install(channel, prefix, spec, virtual, cache)


@app.command()
def remove(prefix: Annotated[Path, typer.Argument(help="Environment to delete.")]) -> None:
    """Delete an environment made by envtools (read-only ones too) and its <prefix>.pkgs."""
    from envtools.install import remove as do_remove

    do_remove(prefix)


@app.command()
def clone(
    src: Annotated[Path, typer.Argument(help="Environment to clone (may be read-only).")],
    dest: Annotated[Path, typer.Argument(help="New environment (must not exist or be empty).")],
    add: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option("--add", help="Package spec to add after cloning (repeatable)."),
    ] = None,
    allow_update: Annotated[
        bool, typer.Option(help="Let --add change the versions of already installed packages.")
    ] = False,
    channel: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(help="Channel for --add [default: the channels the env came from]."),
    ] = None,
    link_mode: Annotated[
        str,
        typer.Option(help="auto (reflink, else hardlink to read-only cache files when not "
                     "root, else copy), reflink, copy."),
    ] = "auto",
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Ignore the package cache: copy and relocate.")
    ] = False,
    virtual: VirtualOpt = None,
) -> None:
    """Clone SRC to DEST quickly and exactly, then optionally --add packages.

    Package files are linked from SRC's package cache when it is readable (reflink, or a
    hardlink to a cache file nobody may write, never as root), else copied from SRC; prefixes
    are relocated; pip-installed files are carried over. Built beside DEST and renamed
    into place: on failure or Ctrl-C nothing is left at DEST.
    """
    from envtools.clone import clone as do_clone

    report = do_clone(
        src, dest, add=add or [], allow_update=allow_update, channels=channel or [],
        link_mode=link_mode, use_cache=not no_cache, virtual_overrides=virtual,
    )
    report.print()


@app.command()
def module(
    prefix: Annotated[Path, typer.Argument(help="The environment to publish.")],
    name: Annotated[str, typer.Option(help="Module name/version, e.g. powerai/1.0.")],
    out: Annotated[Path, typer.Option(help="Modulefile root (what goes on MODULEPATH).")],
    format: Annotated[str, typer.Option(help="lmod, tcl or both.")] = "both",
) -> None:
    """Write modulefiles that do what `conda activate` does, reversibly.

    Lmod (NAME.lua) and/or Environment Modules (Tcl, NAME): PATH, CONDA_PREFIX,
    CONDA_DEFAULT_ENV, CONDA_SHLVL, CONDA_PROMPT_MODIFIER, the env's activate.d scripts
    and conda-meta/state env_vars, a python family conflict, whatis/help, and an
    extensions() list for `module spider`. `module unload` restores the environment.
    """
    from envtools.module import write_modulefiles

    for p in write_modulefiles(prefix, name, out, format):
        console.print(f"wrote {p}", highlight=False)


@app.command()
def validate(
    prefix: Annotated[Path, typer.Argument(help="The environment to check.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print findings as JSON.")] = False,
    full: Annotated[
        bool, typer.Option(help="Re-hash every file, ignoring the stat cache.")
    ] = False,
    virtual: VirtualOpt = None,
) -> None:
    """Check that everything in PREFIX still fits together.

    Exit status: 0 no error-severity findings, 1 errors found, 2 cannot read PREFIX.
    """
    from envtools.validate import run_validate

    code = run_validate(prefix, json_out=json_out, full=full, virtual_overrides=virtual)
    raise typer.Exit(code)


def main() -> None:
    """Entry point: run the app; exit through :func:`_exit` (see there)."""
    try:
        _main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        _exit(code)


def _exit(code: int) -> None:
    """Flush and leave without interpreter finalization.

    py-rattler's runtime threads can abort the process while Python finalizes after a
    solve/install ("PyGILState_Release ... must be current"), turning a finished,
    successful command into exit -6. All our work is done and flushed by now.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _main() -> None:
    """Run the app, turning EnvtoolsError into a message and an exit status."""
    try:
        rc = app(standalone_mode=False)  # returns typer.Exit's code instead of exiting
        sys.exit(rc if isinstance(rc, int) else 0)
    except EnvtoolsError as e:
        console.print(f"[bold red]error:[/] {e.message}", highlight=False, soft_wrap=True)
        if e.hint:
            console.print(f"[bold]hint:[/] {e.hint}", highlight=False, soft_wrap=True)
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        console.print("interrupted; nothing was left behind", highlight=False)
        sys.exit(130)
    except Exception as e:  # usage errors from typer's bundled click
        if hasattr(e, "show") and hasattr(e, "exit_code"):
            e.show()
            sys.exit(e.exit_code)
        if type(e).__name__ == "Abort":
            sys.exit(130)
        raise
