"""The default solve and the MPI mutex without conda: py-rattler and the rendered recipes.

CI has no conda, so these hold the same promises with what it has: the recipes rendered
by ci (rattler-build's render) carry the priorities every solver reads (openmpi's build
number above mpich's, `external` down-weighted by a track_feature, the mutex dependency),
and py-rattler's solve against channel/ (when `make channel` made one) picks openmpi and
keeps one MPI.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from condahelp import CHANNEL, ROOT, UPSTREAM

FLAVOURS = ("openmpi", "mpich", "external")


def _render(recipe: str) -> list[tuple[dict, dict]]:
    from ci.render import render_recipe

    cfg = yaml.safe_load((ROOT / "conda_build_config.yaml").read_text())
    variants = {k: v for k, v in cfg.items() if k not in ("target_platforms", "upstream_channels")}
    out = []
    for n in render_recipe(ROOT / "recipes" / recipe / "recipe.yaml", variants, "linux-64"):
        out.append((n.variant, n.rendered.recipe.to_dict()))
    return out


@pytest.mark.parametrize("recipe", ["libddl", "ddl", "powerai"])
def test_rendered_priorities_prefer_openmpi_and_hide_external(recipe):
    rendered = _render(recipe)
    by: dict[tuple, dict] = {}
    for variant, d in rendered:
        key = (variant.get("build_type", ""), variant.get("python", ""))
        build = d["build"]
        down = int((build.get("variant") or {}).get("down_prioritize_variant") or 0)
        run = [str(r) for r in d["requirements"].get("run", [])]
        by.setdefault(key, {})[variant["mpi"]] = (int(build["number"]), down, run)
    assert by
    for key, flav in by.items():
        assert set(flav) == set(FLAVOURS), (key, flav)
        (on, od, orun), (mn, md, mrun), (_, ed, erun) = (flav[f] for f in FLAVOURS)
        assert on > mn, f"{recipe} {key}: openmpi's build number must be above mpich's"
        assert od == md == 0 and ed >= 1, f"{recipe} {key}: only `external` is down-weighted"
        assert "mpi 1.0.* openmpi" in orun and "mpi 1.0.* mpich" in mrun, (orun, mrun)
        assert not any(r.split()[0] in ("mpi", "openmpi", "mpich") for r in erun), erun


def test_mutex_recipe_has_conda_forges_shape():
    from ci.render import render_recipe

    nodes = render_recipe(ROOT / "recipes" / "upstream" / "mpi" / "recipe.yaml",
                          {"mpi": list(FLAVOURS)}, "linux-64")
    built = {n.build_string: n for n in nodes if not n.skip}
    assert set(built) == {"openmpi", "mpich"}
    assert all(n.subdir == "noarch" and n.version.startswith("1.0") for n in built.values())


def test_stand_in_mpi_packages_depend_on_the_mutex():
    from ci.wheel2conda import mutex_dep

    assert mutex_dep("openmpi") == "mpi 1.0.* openmpi"
    assert mutex_dep("mpich") == "mpi 1.0.* mpich"
    assert mutex_dep("numpy") is None


def _solve(specs: list[str], virtual: list[str] | None = None) -> dict:
    from envtools import api

    if not (CHANNEL / "noarch" / "repodata.json").exists():
        pytest.skip("needs channel/ from `make channel`")
    recs = api.solve([str(CHANNEL), str(UPSTREAM)], specs, virtual_overrides=virtual)
    return {r.name.normalized: r for r in recs}


def _solve_or_none(specs: list[str]) -> dict | None:
    from envtools.errors import EnvtoolsError

    try:
        return _solve(specs)
    except EnvtoolsError:
        return None


@pytest.mark.parametrize("cuda", [None, "13.0"])
def test_rattler_default_solve_is_openmpi(cuda):
    got = _solve(["powerai"], [f"__cuda={cuda}"] if cuda else None)
    kind = "cuda" if cuda else "cpu"
    assert str(got["powerai"].build).startswith(f"openmpi_{kind}_"), got["powerai"]
    assert str(got["mpi"].build) == "openmpi" and "mpich" not in got


def test_rattler_external_only_when_asked():
    got = _solve(["powerai=*=*external*"])
    assert str(got["powerai"].build).startswith("external_")
    assert not {"mpi", "openmpi", "mpich"} & set(got)


def test_rattler_mutex_keeps_one_mpi():
    got = _solve_or_none(["powerai=*=*openmpi*", "mpich"])
    assert got is None, f"openmpi and mpich solved together: {sorted(got)}"
    got = _solve(["powerai", "mpich"])  # the whole set switches flavour
    assert str(got["powerai"].build).startswith("mpich_") and "openmpi" not in got


def test_openmpi_stand_in_carries_the_mutex():
    recs = _solve(["openmpi"])
    assert any(str(d).startswith("mpi ") for d in recs["openmpi"].depends), recs["openmpi"].depends
    assert str(recs["mpi"].build) == "openmpi"


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([str(Path(__file__))]))
