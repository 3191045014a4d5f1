"""Read and write a prefix's ``conda-meta`` records as plain JSON.

We read the JSON ourselves (rather than through ``rattler.PrefixRecord``) because clone
and validate need every field verbatim, must write records back with only a few fields
changed, and must stay fast on environments with tens of thousands of files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from envtools.errors import EnvtoolsError
from envtools.prefix.conda_records import prefix_paths
from envtools.prefix.confine import check_name, write_new


class Record:
    """One installed package: its conda-meta JSON (``data``) and where it came from.

    A record from the env's index (:mod:`envtools.prefix.record_index`) comes with only what a
    clone needs (``summary``: name, version, build, noarch, extracted_package_dir, link
    and :meth:`plan_fields`); its ``data`` is read from the record file on first use.
    """

    __slots__ = ("path", "_data", "_summary")

    def __init__(self, path: Path, data: dict | None = None, summary: tuple | None = None):
        self.path = path
        self._data = data
        self._summary = summary

    def __repr__(self) -> str:
        return f"Record({str(self.path)!r})"

    @property
    def data(self) -> dict:
        if self._data is None:
            self._data = read_record_file(self.path)
        return self._data

    @property
    def name(self) -> str:
        return self._summary[0] if self._summary else self.data["name"]

    @property
    def version(self) -> str:
        return self._summary[1] if self._summary else str(self.data["version"])

    @property
    def build(self) -> str:
        return self._summary[2] if self._summary else self.data.get("build", "")

    @property
    def noarch_python(self) -> bool:
        if self._summary:
            return self._summary[3]
        na = self.data.get("noarch")
        return na == "python" or (isinstance(na, dict) and na.get("type") == "python")

    @property
    def extracted_package_dir(self) -> str | None:
        return self._summary[4] if self._summary else self.data.get("extracted_package_dir")

    @property
    def link(self) -> dict | None:
        return self._summary[5] if self._summary else self.data.get("link")

    def plan_fields(self) -> list[tuple]:
        """Per file: (path, path_type, prefix_placeholder, file_mode, sha256, size_in_bytes
        or 0), what placing it needs."""
        if self._summary:
            return self._summary[6]
        return [(e["_path"], e.get("path_type"), e.get("prefix_placeholder"),
                 e.get("file_mode"), e.get("sha256"), e.get("size_in_bytes") or 0)
                for e in self.paths]

    def summary(self) -> tuple:
        """What the index stores for this record (see the class docstring)."""
        return (self.name, self.version, self.build, self.noarch_python,
                self.extracted_package_dir, self.link, self.plan_fields())

    @property
    def fn(self) -> str:
        return self.data.get("fn") or self.path.name.replace(".json", ".conda")

    @property
    def dist(self) -> str:
        """``name-version-build``: the record file's stem and the cache directory name."""
        return f"{self.name}-{self.version}-{self.build}"

    @property
    def paths(self) -> list[dict]:
        """The record's file entries, each ``_path`` relative to the prefix (conda writes a
        noarch: python package's own files package-relative: see
        :func:`envtools.prefix.conda_records.prefix_paths`)."""
        pd = self.data.get("paths_data") or {}
        entries = pd.get("paths")
        if entries is None:  # very old records list only ``files``
            entries = [{"_path": f, "path_type": "hardlink"} for f in self.data.get("files", [])]
        elif self.noarch_python:
            entries = prefix_paths(entries, self.data.get("files"))
        return entries

    def spec(self) -> str:
        return f"{self.name}=={self.version}={self.build}"


def read_record_file(fp: Path) -> dict:
    """One record's JSON, or a clear error naming the damaged file."""
    try:
        with open(fp, "rb") as fh:
            return json.load(fh)
    except (OSError, ValueError) as e:
        raise EnvtoolsError(
            f"cannot read package record {fp}: {e}",
            "the environment's metadata is damaged; reinstall or re-clone it",
            exit_code=1,
        ) from e


def check_record(fp: Path, data: dict) -> None:
    """Refuse a record missing what every reader of it relies on (name, version and build
    as strings, each file entry a path string), naming the file, instead of failing later
    somewhere with a KeyError."""
    for key in ("name", "version", "build"):
        if not isinstance(data.get(key), str):
            what = "has no" if key not in data else "has a malformed"
            raise _damaged(fp, f"it {what} {key!r}")
    pd = data.get("paths_data")
    entries = pd.get("paths") if isinstance(pd, dict) else pd
    if pd is not None and not isinstance(entries, list):
        raise _damaged(fp, "its 'paths_data' is not a list of files")
    for e in entries or ():
        if not isinstance(e, dict) or not isinstance(e.get("_path"), str):
            raise _damaged(fp, f"its 'paths_data' has a malformed entry {str(e)[:80]!r}")
    files = data.get("files")
    if files is not None and not (isinstance(files, list)
                                  and all(isinstance(f, str) for f in files)):
        raise _damaged(fp, "its 'files' is not a list of paths")


def _damaged(fp: Path, why: str) -> EnvtoolsError:
    return EnvtoolsError(
        f"package record {fp} is damaged: {why}",
        "the environment's metadata was edited or corrupted: restore that file, or "
        "reinstall (or re-clone) the environment",
        exit_code=1,
    )


class Prefix:
    """A conda prefix and its package records, loaded once."""

    __slots__ = ("root", "records", "index_key")

    def __init__(self, root: Path, records: list[Record] | None = None,
                 index_key: tuple | None = None):
        self.root = root
        self.records = records if records is not None else []
        #: the stat key of the record index the records came from (record_index.py),
        #: None when they were read as JSON
        self.index_key = index_key

    @classmethod
    def load(cls, root: str | os.PathLike[str]) -> Prefix:
        """Load every ``conda-meta/*.json`` record, failing clearly if P is not an env."""
        p = Path(root).absolute()
        meta = p / "conda-meta"
        try:
            is_dir, has_meta = p.is_dir(), meta.is_dir()
        except OSError as e:  # EACCES on the way: is_dir() only hides "not there"
            raise EnvtoolsError(f"cannot read {p}: {e.strerror}",
                                "you need read and search permission on the environment and "
                                "its conda-meta/ (ask its owner, or check the path)") from e
        if not is_dir:
            raise EnvtoolsError(
                f"{p} does not exist or is not a directory",
                "give the path of a conda environment (the directory holding conda-meta/)",
            )
        if not has_meta:
            raise EnvtoolsError(
                f"{p} is not a conda environment: it has no conda-meta/ directory",
                "give the environment's root directory, e.g. envs/powerai, not a subfolder",
            )
        records = []
        try:
            names = sorted(os.listdir(meta))
        except OSError as e:
            raise EnvtoolsError(f"cannot read {meta}: {e.strerror}", "check permissions") from e
        for name in names:
            # (envtools' own files are in conda-meta/envtools/, never conda-meta/*.json)
            if not name.endswith(".json"):
                continue
            fp = meta / name
            data = read_record_file(fp)
            if not isinstance(data, dict) or "name" not in data:
                continue
            check_record(fp, data)
            records.append(Record(fp, data))
        return cls(p, records)

    def by_name(self) -> dict[str, Record]:
        return {r.name: r for r in self.records}

    def owned_paths(self) -> dict[str, Record]:
        """Map every relative path a record lists to its (last) owning record."""
        owned: dict[str, Record] = {}
        for r in self.records:
            for e in r.paths:
                owned[e["_path"]] = r
        return owned


def record_file(meta_dir: Path, data: dict) -> Path:
    """Where a record lives in conda-meta: ``name-version-build.json`` (one file name:
    the fields come from data, see :mod:`envtools.prefix.confine`)."""

    name = f"{data.get('name')}-{data.get('version')}-{data.get('build')}.json"
    return meta_dir / check_name(name, "package record")


def write_record(meta_dir: Path, data: dict) -> Path:
    """Write one new record as ``name-version-build.json`` (never over a file, never
    through a link).

    ``json.dumps`` without indent runs in C; ``json.dump(fh, indent=2)`` runs the pure
    Python encoder, which cost more than linking the files themselves in clone.
    """

    fp = record_file(meta_dir, data)
    write_new(str(fp), json.dumps(data).encode())
    return fp
