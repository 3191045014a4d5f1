"""``envtools detach``: a clone's directory links to the package cache become real
directories of per-file symlinks."""

from __future__ import annotations

import os
from pathlib import Path

from envtools.errors import EnvtoolsError
from envtools.place import cachelinks
from envtools.place.layers import layer_links
from envtools.prefix.readonly import refuse_readonly
from envtools.prefix.record_index import load_prefix


def detach(prefix: str | os.PathLike[str], names: list[str]) -> list[tuple[str, str]]:
    """Give the packages ``names`` (all if empty) of the clone ``prefix`` directories of
    its own where it has links to the package cache: each becomes a real directory
    holding a symlink per file, as a clone without directory links has, so that pip and
    conda can remove or replace the files. Returns (package, directory) for each one.

    Each is built beside the link, then swapped in (the link is removed just before the
    rename: a directory cannot be renamed over a symlink).
    """
    import tempfile


    root = Path(os.path.abspath(prefix))
    refuse_readonly(root, "detach directories in")
    records = load_prefix(root).records
    known = {r.name for r in records}
    unknown = sorted(set(names) - known)
    if unknown:
        raise EnvtoolsError(f"{root} has no package named {', '.join(unknown)}",
                            f"the packages are: {', '.join(sorted(known))}")
    done: list[tuple[str, str]] = []
    for d, target in sorted(layer_links(root).items()):
        owner = next((r.name for r in records if cachelinks.link_target(
            r.extracted_package_dir, r.noarch_python, d) == target), None)
        if owner is None or (names and owner not in names):
            continue  # (not a clone's link to its package cache: validate's rule)
        link = root / d
        tmp = Path(tempfile.mkdtemp(prefix=f".{link.name}.envtools-detach-", dir=link.parent))
        try:
            for dirpath, dirnames, filenames in os.walk(target):
                rel = os.path.relpath(dirpath, target)
                here = tmp if rel == "." else tmp / rel
                for name in dirnames + filenames:
                    src = os.path.join(dirpath, name)
                    if os.path.islink(src):
                        os.symlink(os.readlink(src), here / name)
                    elif name in dirnames:
                        os.mkdir(here / name)
                    else:
                        os.symlink(src, here / name)
            os.chmod(tmp, 0o755)
            os.unlink(link)
            try:
                os.rename(tmp, link)
            except OSError:
                os.symlink(target, link)
                raise
        except BaseException:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
            raise
        done.append((owner, d))
    return done
