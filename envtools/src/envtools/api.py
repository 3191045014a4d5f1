"""envtools as a library: the work of ``envtools install``, ``remove``, ``module`` and
``validate`` for a program that builds and checks environments (the channel pipeline).

The command line (:mod:`envtools.cli`) parses options and prints; these functions do the
same work with arguments and return values, so a program gets the env, the checks and
the errors a site admin gets from the commands, not a second installer beside them.
Every failure the command line would print as ``error:`` and ``hint:`` arrives here as
one :class:`EnvtoolsError` (``message``, ``hint``), a system error such as a full disk
included; nothing here prints findings or exits.

Each function imports the command it runs when it is called: the functions carry the
commands' own names, and ``import envtools.api`` (which the pipeline does at start-up,
for :func:`cuda_need`) stays light, without py-rattler.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from envtools.errors import EnvtoolsError, os_error

if TYPE_CHECKING:
    import rattler

__all__ = ["EnvtoolsError", "Validation", "cuda_need", "install", "made_by_envtools",
           "remove", "solve", "validate", "write_modulefiles"]


@contextmanager
def _errors(path: str | os.PathLike[str]) -> Iterator[None]:
    """A system error as the command line reports it (naming ``path`` when it names no
    file: the temporary directory it happened in is gone by then)."""
    try:
        yield
    except OSError as e:
        if not e.filename:
            e.filename = f"while writing {os.path.abspath(path)}"
        raise os_error(e) from e


def solve(channels: Iterable[str], specs: Iterable[str], *, platform: str | None = None,
          virtual_overrides: list[str] | None = None) -> list[rattler.RepoDataRecord]:
    """The packages ``envtools install`` would install for ``specs`` from ``channels``
    (local channel directories or URLs), on a machine of ``platform`` (None: this one;
    another is described by :func:`envtools.solve.virtual.for_platform`), with
    ``virtual_overrides`` as ``--virtual`` gives them (``["__cuda=12.4"]``)."""
    from envtools.base import aio
    from envtools.solve import virtual
    from envtools.solve.solver import channel_source
    from envtools.solve.solver import solve as _solve

    srcs = [channel_source(c) for c in channels]
    return aio.run(_solve(srcs, list(specs), virtual.for_platform(platform, virtual_overrides),
                          platform=platform))


def install(channels: Iterable[str], prefix: str | os.PathLike[str], specs: Iterable[str],
            *, virtual_overrides: list[str] | None = None,
            cache: str | os.PathLike[str] | None = None) -> Path:
    """``envtools install``: a new read-only env at ``prefix`` (which must not exist, or
    be empty) with its package cache at ``cache`` (default ``<prefix>.pkgs``); returns
    the prefix. A failure leaves nothing at ``prefix``."""
    from envtools.commands.install import install as _install

    with _errors(prefix):
        return _install(list(channels), Path(prefix), list(specs), virtual_overrides,
                        Path(cache) if cache else None)


def remove(prefix: str | os.PathLike[str]) -> None:
    """``envtools remove``: delete an env (read-only ones too) and the cache beside it."""
    from envtools.commands.install import remove as _remove

    with _errors(prefix):
        _remove(Path(prefix))


def made_by_envtools(prefix: str | os.PathLike[str]) -> bool:
    """Whether ``prefix`` is a read-only env that ``envtools install`` made (its marker)."""
    from envtools.prefix.readonly import read_marker

    marker = read_marker(Path(prefix))
    return bool(marker) and marker.get("created_by") == "envtools install"


def write_modulefiles(prefix: str | os.PathLike[str], name: str | None,
                      out: str | os.PathLike[str], fmt: str = "both") -> list[Path]:
    """``envtools module``: modulefiles for ``prefix`` under ``out`` (``fmt``: lmod, tcl
    or both); ``name`` None picks ``powerai/1.0`` (``-cuda`` for a CUDA env). Returns
    the files written."""
    from envtools.commands.module import write_modulefiles as _write

    with _errors(out):
        return _write(Path(prefix), name, Path(out), fmt)


@dataclass
class Validation:
    """What ``envtools validate`` found: ``report`` is the ``--json`` document (schema
    in envtools/README.md); ``imports`` the import smoke test's result for each module
    it imported: "ok", or the failure (empty when the test did not run)."""

    report: dict
    imports: dict[str, str]

    @property
    def exit_status(self) -> int:
        """As the command's: 0 without error-severity findings, else 1."""
        return int(self.report["exit_status"])


def validate(prefix: str | os.PathLike[str], *, virtual_overrides: list[str] | None = None,
             imports: bool = True, import_timeout: float = 60.0,
             full: bool = False) -> Validation:
    """``envtools validate --json``, every check including the import smoke test (unless
    ``imports`` is False); raises EnvtoolsError when ``prefix`` cannot be read."""
    from envtools.validate.run import to_json
    from envtools.validate.run import validate as _validate

    with _errors(prefix):
        ctx, _ = _validate(prefix, full, virtual_overrides, imports, import_timeout)
    outcomes = {
        name: "ok" if o.ok else (o.error if o.kind in ("crash", "timeout")
                                 else f"{o.kind}: {o.error}")
        for name, o in ctx.import_outcomes.items()
    }
    return Validation(to_json(ctx), outcomes)


def cuda_need(depends: Iterable[str]) -> str | None:
    """The CUDA a package's ``depends`` ask of the driver (``__cuda >=13.0``: "13.0"), or
    None for a package that needs none: what to solve a CUDA build with
    (``virtual_overrides=["__cuda=13.0"]``) on a machine without a GPU."""
    from envtools.solve.cudaenv import need_of

    return need_of(depends)
