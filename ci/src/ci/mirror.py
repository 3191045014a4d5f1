"""The local source mirror: recipe sources satisfied offline, checked by sha256.

A mirror is a directory of files keyed by file name (``<sha256>`` symlinks are kept
beside them, so a file can also be found by hash). A recipe keeps its official URL and
sha256; ``ci`` looks the file name up here, verifies the hash and hands rattler-build a
``file://`` URL. On Debian, the mirror can be filled from Debian's source packages: an
upstream tarball that Debian ships unmodified as ``<pkg>_<ver>.orig.tar.gz`` is the same
file, byte for byte (the sha256 check proves it).

A Python source distribution is named ``pypi://<project>/<file>`` (e.g.
``pypi://numpy/numpy-2.4.6.tar.gz``): ci fetches it with ``pip download --no-binary``,
so it comes from whatever index pip is configured for (a site's proxy or a local
wheelhouse), and checks its sha256 like any other source.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ci.errors import CiError

# Upstream file name -> (Debian source package, upstream version). Extend as recipes grow.
DEBIAN_ORIG: dict[str, tuple[str, str]] = {
    "Python-3.11.2.tgz": ("python3.11", "3.11.2"),
}


class ChecksumError(CiError):
    """A source whose sha256 does not match the recipe's pin."""

    def __init__(self, path: Path, expected: str, actual: str) -> None:
        super().__init__(
            f"sha256 mismatch for {path}: expected {expected}, got {actual}.",
            "The file is corrupt or not the one the recipe pins: delete it and let ci fetch "
            "it again, or fix the recipe's sha256 if the new file is the intended one.",
            code=1,
        )
        self.path, self.expected, self.actual = path, expected, actual


class MirrorMiss(CiError):
    """The mirror does not hold a source and it could not be fetched."""

    code = 1


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in chunks (tarballs can be large)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify(path: Path, expected: str) -> None:
    """Raise :class:`ChecksumError` naming the file and both hashes on a mismatch."""
    actual = sha256_of(path)
    if actual != expected.lower():
        raise ChecksumError(path, expected.lower(), actual)


def debian_archive_uris(sources_dir: Path = Path("/etc/apt")) -> list[str]:
    """Archive base URIs from this host's own apt configuration (never hard-coded).

    Reads deb822 ``*.sources`` and one-line ``*.list`` files; security archives are left
    out because they do not carry the orig tarballs of unchanged upstream versions.
    """
    uris: list[str] = []
    files = [sources_dir / "sources.list", *sorted((sources_dir / "sources.list.d").glob("*"))]
    for f in files:
        if not f.is_file() or not (f.name.endswith(".sources") or f.name.endswith(".list")):
            continue
        text = f.read_text(errors="replace")
        for m in re.finditer(r"^URIs:\s*(\S+)", text, re.M):
            uris.append(m.group(1))
        for m in re.finditer(r"^deb(?:-src)?\s+(?:\[[^\]]*\]\s+)?(\S+)", text, re.M):
            uris.append(m.group(1))
    return [u.rstrip("/") for u in dict.fromkeys(uris) if "security" not in u and "debian" in u]


def pypi_sdist(url: str) -> tuple[str, str] | None:
    """``pypi://<project>/<project>-<version>.tar.gz`` -> (project, version), else None."""
    if not url.startswith("pypi://"):
        return None
    project, _, filename = url[len("pypi://"):].partition("/")
    stem = filename.removesuffix(".tar.gz").removesuffix(".zip")
    name, sep, version = stem.rpartition("-")
    if not (project and sep and version and name.replace("_", "-").lower()
            == project.replace("_", "-").lower()):
        raise MirrorMiss(
            f"{url}: not a source distribution URL",
            "write it as pypi://<project>/<project>-<version>.tar.gz",
        )
    return project, version


def fetch_sdist(project: str, version: str, dest: Path) -> Path:
    """The sdist of ``project==version``, downloaded by pip into ``dest``'s folder (pip's
    own index configuration decides where from)."""
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".sdist-") as tmp:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
             "--no-deps", "--no-binary=:all:", "-d", tmp,
             f"{project}=={version}"], capture_output=True, text=True)
        got = [f for f in Path(tmp).iterdir() if f.name.endswith((".tar.gz", ".zip"))]
        if proc.returncode != 0 or not got:
            raise MirrorMiss(
                f"pip could not download the sdist of {project}=={version}: "
                + (proc.stderr.strip().splitlines() or ["no file"])[-1],
                "check that a package index is reachable (pip config), or copy the file "
                f"into {dest.parent}",
            )
        out = dest.with_suffix(dest.suffix + ".part")
        shutil.move(got[0], out)
    return out


def debian_orig_url(base: str, package: str, version: str) -> str:
    """Pool URL of a Debian orig tarball (pool/main/<first letter>/<package>/...)."""
    prefix = package[:4] if package.startswith("lib") else package[0]
    return f"{base}/pool/main/{prefix}/{package}/{package}_{version}.orig.tar.gz"


@dataclass
class SourceMirror:
    """A directory of verified source files."""

    root: Path

    def path_for(self, filename: str) -> Path:
        return self.root / filename

    def fetch(self, url: str, sha256: str, *, offline_only: bool = False) -> Path:
        """Return a verified local copy of ``url``'s file, filling the mirror if needed.

        Order: the mirror; the official URL (unless ``offline_only``); Debian's orig
        tarball for known files. Whatever is found is verified before it is kept.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        filename = url.rsplit("/", 1)[-1]
        dest = self.path_for(filename)
        if dest.exists():
            verify(dest, sha256)
            return dest
        sdist = pypi_sdist(url)
        if sdist:
            if offline_only:
                raise MirrorMiss(f"source {filename} is not in the mirror {self.root}",
                                 f"copy it into {self.root} on a connected machine")
            return _keep(fetch_sdist(*sdist, dest), dest, sha256,
                         f"{filename} (pip download {sdist[0]}=={sdist[1]})")
        candidates: list[str] = [] if offline_only else [url]
        if filename in DEBIAN_ORIG:
            pkg, ver = DEBIAN_ORIG[filename]
            candidates += [debian_orig_url(b, pkg, ver) for b in debian_archive_uris()]
        errors: list[str] = []
        for cand in candidates:
            tmp = dest.with_suffix(dest.suffix + ".part")
            try:
                with urllib.request.urlopen(cand, timeout=30) as r, tmp.open("wb") as f:
                    shutil.copyfileobj(r, f)
            except Exception as exc:  # noqa: BLE001 - any network failure means "try next"
                errors.append(f"{cand}: {exc}")
                tmp.unlink(missing_ok=True)
                continue
            return _keep(tmp, dest, sha256, cand)
        raise MirrorMiss(
            f"source {filename} (sha256 {sha256}) is not in the mirror {self.root} and could "
            f"not be fetched ({'; '.join(errors) or 'no candidate URL'}). Copy the file into "
            f"{self.root} on a connected machine and rerun."
        )


def _keep(tmp: Path, dest: Path, sha256: str, source: str) -> Path:
    """Move a downloaded ``tmp`` into place as ``dest`` if it matches ``sha256``; else
    delete it and raise ChecksumError naming where it came from (``source``)."""
    try:
        verify(tmp, sha256)
    except ChecksumError as exc:
        tmp.unlink(missing_ok=True)
        raise ChecksumError(Path(source), exc.expected, exc.actual) from None
    tmp.rename(dest)
    return dest
