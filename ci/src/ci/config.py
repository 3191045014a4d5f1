"""Settings shared by every stage: where things live and the variant matrix.

`conda_build_config.yaml` is both rattler-build's variant config and the home of a few
ci-only keys (`target_platforms`, `upstream_channels`); this module splits the two so that
rattler-build only ever sees variant keys.
"""

from __future__ import annotations

import os
import platform as _platform
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import yaml

CI_KEYS = ("target_platforms", "upstream_channels")


def host_subdir() -> str:
    """The conda subdir of the machine running ci."""
    machine = _platform.machine()
    return {"x86_64": "linux-64", "ppc64le": "linux-ppc64le", "aarch64": "linux-aarch64"}.get(
        machine, f"linux-{machine}"
    )


def cache_root() -> Path:
    """Cache outside the clone so stand-ins survive `git clean` and are shared by clones."""
    return Path(os.environ.get("DDLCE_CACHE", Path.home() / ".cache" / "ddl-ce"))


@dataclass
class Settings:
    """Paths and the variant matrix for one ci run."""

    root: Path
    recipes_dir: Path
    cbc_path: Path
    channel_dir: Path
    work_dir: Path
    cache: Path = field(default_factory=cache_root)
    variants: dict = field(default_factory=dict)
    target_platforms: list[str] = field(default_factory=lambda: [host_subdir()])
    upstream_channels: list[str] = field(default_factory=list)
    # Channels actually used (the configured upstream, or the stand-in channel offline).
    channels: list[str] = field(default_factory=list)
    dropped_variants: list[str] = field(default_factory=list)

    @property
    def upstream_dir(self) -> Path:
        return self.cache / "upstream-channel"

    @property
    def mirror_dir(self) -> Path:
        return self.cache / "source-mirror"

    @property
    def wheels_dir(self) -> Path:
        return self.cache / "wheels"

    def pins(self) -> dict[str, str]:
        """First value of every scalar variant key: the release's curated versions."""
        return {
            k: str(v[0])
            for k, v in self.variants.items()
            if isinstance(v, list) and v and k != "zip_keys" and not isinstance(v[0], list)
        }


def load_settings(
    root: Path,
    *,
    recipes_dir: Path | None = None,
    cbc_path: Path | None = None,
    channel_dir: Path | None = None,
    work_dir: Path | None = None,
) -> Settings:
    """Read conda_build_config.yaml; a missing or malformed file is a clear error."""
    cbc = cbc_path or root / "conda_build_config.yaml"
    if not cbc.is_file():
        raise FileNotFoundError(
            f"{cbc} not found: ci needs a conda_build_config.yaml (see ci/README.md)"
        )
    data = yaml.safe_load(cbc.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{cbc}: expected a mapping of variant keys to lists")
    s = Settings(
        root=root,
        recipes_dir=recipes_dir or root / "recipes",
        cbc_path=cbc,
        channel_dir=channel_dir or root / "channel",
        work_dir=work_dir or root / "build" / "ci",
    )
    s.target_platforms = list(data.get("target_platforms") or [host_subdir()])
    s.upstream_channels = list(data.get("upstream_channels") or [])
    s.variants = {k: v for k, v in data.items() if k not in CI_KEYS}
    return s


def have_cuda_compiler() -> bool:
    """Whether CUDA variants can be built here."""
    return shutil.which("nvcc") is not None
