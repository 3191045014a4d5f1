"""Modulefiles for a sealed env that a site mounts at its prefix on each node.

``envtools module IMAGE ...`` runs this inside the mounted image (``python -m
envtools.image.modulefile PREFIX IMAGE --out ...``): the modulefiles are the ones
``envtools module PREFIX`` writes (:func:`envtools.commands.module.write_modulefiles`, from the
env's own records and activate.d scripts), so ``module load`` does exactly what it does
for the env installed at that prefix. Each gets a guard in front: on a node where the
image is not mounted (its manifest, ``conda-meta/envtools/image.json``, is not at the
prefix), loading fails with one message naming the image and the two ways to get it
(the admin's ``envtools mount IMAGE``, or ``envtools run IMAGE -- CMD`` without root),
instead of a module that sets PATH to a directory that is not there.

The prefix and image path come from the manifest and the command line: both are
checked and escaped as :mod:`envtools.commands.module` does every literal.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from envtools.base.progress import exit_flushed, info, report_error
from envtools.commands.module import check_literal, lua_str, tcl_str, write_modulefiles
from envtools.errors import EnvtoolsError, os_error
from envtools.image.manifest import INNER


def _message(name: str, prefix: str, image: str) -> str:
    return (f"{name} is the sealed env image {image}, which is not mounted at {prefix} on "
            f"this node. Ask the site to mount it there (as root, e.g. in the job prolog: "
            f"envtools mount {image}), or run your command in it without root: "
            f"envtools run {image} -- CMD")


def lua_guard(name: str, prefix: str, image: str) -> str:
    marker = lua_str(f"{prefix}/{INNER}")
    return (f'if mode() == "load" and not isFile({marker}) then\n'
            f"  LmodError({lua_str(_message(name, prefix, image))})\nend\n")


def tcl_guard(name: str, prefix: str, image: str) -> str:
    marker = tcl_str(f"{prefix}/{INNER}")
    return (f"if {{[module-info mode load] && ![file isfile {marker}]}} {{\n"
            f"    error {tcl_str(_message(name, prefix, image))}\n}}\n")


def add_guard(path: Path, name: str, prefix: str, image: str) -> None:
    """Put the not-mounted guard at the top of a written modulefile (after Tcl's
    ``#%Module`` cookie, which must stay the first line)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".lua":
        text = lua_guard(name, prefix, image) + text
    else:
        first, _, rest = text.partition("\n")
        text = f"{first}\n{tcl_guard(name, prefix, image)}{rest}"
    path.write_text(text, encoding="utf-8")


def write_image_modulefiles(prefix: Path, image: str, name: str | None, out: Path,
                            fmt: str) -> list[Path]:
    """Modulefiles of the env mounted at ``prefix`` from ``image``, with the guard."""
    check_literal("the image's path", image, "move the image to a path of printable "
                  "characters, then write its modulefiles")
    written = write_modulefiles(prefix, name, out, fmt)
    for p in written:
        mod = str(p.relative_to(Path(out).absolute()))
        add_guard(p, mod[:-4] if mod.endswith(".lua") else mod, str(prefix), image)
    return written


def main() -> None:

    ap = argparse.ArgumentParser(prog="envtools module IMAGE")
    ap.add_argument("prefix", type=Path)
    ap.add_argument("image")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--format", default="both")
    ap.add_argument("--name")
    a = ap.parse_args()
    try:
        for p in write_image_modulefiles(a.prefix, a.image, a.name, a.out, a.format):
            info("wrote ", str(p))
        code = 0
    except EnvtoolsError as e:
        code = report_error(e)
    except OSError as e:
        code = report_error(os_error(e))
    exit_flushed(code)


if __name__ == "__main__":
    main()
