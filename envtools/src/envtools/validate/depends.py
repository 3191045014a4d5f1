"""Checks of the package records: every dependency and constraint met, the CUDA the
packages need."""

from __future__ import annotations

import rattler

from envtools.solve import cudaenv
from envtools.validate.findings import Context


# ---------------------------------------------------------------- package dependencies
def check_depends(ctx: Context) -> None:
    """Every depends/constrains of every record against installed + virtual packages."""
    subdir = ctx.subdir
    installed: dict[str, rattler.PackageRecord] = {}
    for r in ctx.prefix.records:
        installed[r.name] = rattler.PackageRecord(
            name=r.name, version=r.version, build=rattler.BuildString(r.build),
            build_number=int(r.data.get("build_number", 0)), subdir=r.data.get("subdir", subdir),
        )
    virtuals = {v.name: v.record(subdir) for v in ctx.virtuals}
    spec_cache: dict[str, rattler.MatchSpec | None] = {}

    def spec_of(s: str) -> rattler.MatchSpec | None:
        if s not in spec_cache:
            try:
                spec_cache[s] = rattler.MatchSpec(s)
            except Exception:
                spec_cache[s] = None
        return spec_cache[s]

    def have(name: str) -> rattler.PackageRecord | None:
        return virtuals.get(name) if name.startswith("__") else installed.get(name)

    for r in ctx.prefix.records:
        for dep in r.data.get("depends", []):
            ms = spec_of(dep)
            if ms is None:
                ctx.add("depends", "warning", f"{r.name} has an unparsable dependency {dep!r}",
                        [r.name], hint="report it to the package's maintainers")
                continue
            name = ms.name.normalized
            if name == "__cuda":
                continue  # the driver against the env's CUDA: check_cuda, one finding
            got = have(name)
            if got is None:
                if name.startswith("__"):
                    ctx.add("depends", "error",
                            f"{r.name} {r.version} needs the virtual package {dep!r}, which this "
                            "machine does not provide", [r.name],
                            hint=f"run on a machine that has it, or describe the target node with "
                            f"--virtual {name}=VERSION")
                else:
                    ctx.add("depends", "error",
                            f"{r.name} {r.version} depends on {dep!r} but {name} is not installed",
                            [r.name, name],
                            hint=f"install it: envtools clone ENV NEW --add '{dep}' (or conda "
                            f"install '{dep}' in a writable clone)")
            elif not ms.matches(got):
                ctx.add("depends", "error",
                        f"{r.name} {r.version} depends on {dep!r} but {name} {got.version} "
                        "is installed", [r.name, name],
                        hint=f"install a {name} that satisfies {dep!r}, or a {r.name} built for "
                        f"{name} {got.version}")
        for con in r.data.get("constrains", []):
            ms = spec_of(con)
            if ms is None:
                continue
            name = ms.name.normalized
            if name == "__cuda":
                continue  # check_cuda
            got = have(name)
            if got is not None and not ms.matches(got):
                ctx.add("constrains", "error",
                        f"{r.name} {r.version} constrains {con!r} but {name} {got.version} "
                        "is installed", [r.name, name],
                        hint=f"change {name} to satisfy {con!r}, or remove one of them")
    ctx.checked["packages"] = len(ctx.prefix.records)


def check_cuda(ctx: Context) -> None:
    """The CUDA driver (the __cuda virtual package) against the CUDA the env is built for.

    The env's CUDA is the highest ``__cuda`` lower bound its packages state (pytorch's CUDA
    build depends on ``__cuda >=13.0``, cuda-version constrains it): one finding naming
    both versions and the packages, never one per package. No driver at all is a note:
    login nodes have none, and the env is still fine for compute nodes that do.
    """
    need = cudaenv.env_cuda(ctx.prefix.records)
    if need is None:
        return
    who = ", ".join(need.packages)
    cuda = next((v for v in ctx.virtuals if v.name == "__cuda"), None)
    if cuda is None:
        ctx.add("cuda-driver", "info",
                f"the env is built for CUDA {need.version} ({who}) but no CUDA driver was "
                "found here; GPU code will not run on this node", list(need.packages),
                hint="normal on login nodes; validate on a GPU node, or pass --virtual "
                "__cuda=VERSION to check against a node's driver")
        return
    if not cudaenv.supports(cuda.version, need):
        ctx.add("cuda-driver", "error",
                f"the CUDA driver here supports CUDA {cuda.version}, but the env is built for "
                f"CUDA {need.version} ({who} need __cuda >={need.version})",
                list(need.packages),
                hint=f"update the NVIDIA driver to one for CUDA {need.version} or newer, or "
                "use the CPU build of the env (e.g. envtools install ... 'powerai=*=cpu*')")
