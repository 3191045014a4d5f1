"""Virtual packages (__glibc, __cuda, __linux, __archspec...): detected, or given by the user.

Solving and validating on a login node must be able to describe a compute node (a GPU
driver the login node lacks), hence ``--virtual __cuda=12.4`` overrides detection.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import rattler

from envtools.errors import EnvtoolsError


@dataclass(frozen=True)
class Virtual:
    name: str
    version: str
    build: str = "0"

    def record(self, subdir: str) -> rattler.PackageRecord:
        """A PackageRecord so a MatchSpec can be matched against it like any package."""
        return rattler.PackageRecord(
            name=self.name,
            version=self.version,
            build=rattler.BuildString(self.build),
            build_number=0,
            subdir=subdir,
        )

    def generic(self) -> rattler.GenericVirtualPackage:
        return rattler.GenericVirtualPackage(
            rattler.PackageName(self.name),
            rattler.Version(self.version),
            rattler.BuildString(self.build),
        )


def parse_override(text: str) -> Virtual:
    """``__cuda=12.4`` or ``__glibc=2.28=0``; ``__cuda=`` (empty) removes a detected one."""
    if not text.startswith("__") or "=" not in text:
        raise EnvtoolsError(
            f"bad --virtual value {text!r}",
            "write NAME=VERSION[=BUILD] with a name starting with '__', e.g. --virtual __cuda=12.4",
        )
    parts = text.split("=")
    name, version = parts[0], parts[1]
    build = parts[2] if len(parts) > 2 and parts[2] else "0"
    if version:
        try:
            rattler.Version(version)
        except Exception as e:  # rattler raises its own exception types
            raise EnvtoolsError(f"bad version in --virtual {text!r}: {e}", "e.g. 12.4") from e
    return Virtual(name, version, build)


def detect() -> list[Virtual]:
    """What this machine offers, as rattler detects it (CUDA driver via libcuda)."""
    out = []
    try:
        found = rattler.VirtualPackage.detect()
    except Exception:  # detection must never stop validation
        found = []
    for v in found:
        g = v.into_generic()
        out.append(Virtual(g.name.normalized, str(g.version), str(g.build_string)))
    return out


def resolve(overrides: list[str] | None) -> list[Virtual]:
    """Detected virtual packages with user overrides applied (by name)."""
    return _apply(detect(), overrides)


def _apply(found: Iterable[Virtual], overrides: list[str] | None) -> list[Virtual]:
    """``found`` with each override put in place of the one of its name (or removing it)."""
    vs = {v.name: v for v in found}
    for text in overrides or []:
        o = parse_override(text)
        if o.version:
            vs[o.name] = o
        else:
            vs.pop(o.name, None)
    return list(vs.values())


#: a machine of a linux platform other than this one, where nothing can be detected: an
#: older glibc than most nodes have (2.28, as on RHEL 8), so what is solved for it runs on
#: the nodes of that platform, not only on new ones
FOREIGN_LINUX = (Virtual("__glibc", "2.28"), Virtual("__unix", "0"), Virtual("__linux", "5.0"))


def host_platform() -> str:
    """This machine's conda subdir (``linux-64``, ``linux-aarch64``, ...)."""
    return str(rattler.Subdir.current())


def for_platform(platform: str | None, overrides: list[str] | None) -> list[Virtual]:
    """The virtual packages of a machine of ``platform`` (None: this one), overrides applied.

    This machine's are detected (:func:`resolve`); for another platform (solving what a
    cross-built package needs) nothing can be detected, so a linux one is described by
    :data:`FOREIGN_LINUX`, and ``--virtual`` values are applied to that the same way.
    """
    if platform is None or platform == host_platform():
        return resolve(overrides)
    if not platform.startswith("linux-"):
        raise EnvtoolsError(
            f"cannot describe a machine of platform {platform!r} from here",
            "solve for a linux-* platform, or on a machine of that platform",
        )
    return _apply(FOREIGN_LINUX, overrides)
