#!/bin/sh
# Make a working conda from conda's source tree, into a new venv.
#
#   tests/conda/make_conda.sh SRC DEST [PYTHON]
#   MENUINST_SRC=DIR tests/conda/make_conda.sh SRC DEST [PYTHON]
#
# conda is not on PyPI, but its source tree pip-installs with its dependencies from PyPI
# (classic solver: pycosat). pip's `conda` entry point (conda.cli.main_pip) refuses most
# commands, so `python -m conda init --install` then writes the real bin/conda and the
# shell hooks into the venv, as conda's own recipe does. DEST/.condarc makes the classic
# solver the default and names no channel, so every command states its channels
# (`--override-channels -c file://...`) and nothing reaches the network unasked.
#
# SRC: a checkout or an exported tree of github.com/conda/conda. An exported tree has no
# git history for hatch-vcs to read a version from: set CONDA_VERSION (e.g. 26.7.1) then.
# conda needs menuinst >=2, which PyPI does not have (its releases there stop at 1.x):
# MENUINST_SRC names a tree of github.com/conda/menuinst, installed first (MENUINST_VERSION
# for an exported tree, as CONDA_VERSION). Without it, pip must find menuinst >=2 itself.
# PYTHON: the interpreter for the venv (default python3), 3.10 or newer.
# When it is done, DEST/bin/conda works; DDLCE_CONDA=DEST/bin/conda points tests/conda at it.
set -eu

usage() { echo "usage: $0 SRC DEST [PYTHON]" >&2; exit 2; }
[ $# -ge 2 ] || usage
src=$1 dest=$2 python=${3:-python3}

if [ ! -f "$src/pyproject.toml" ] || [ ! -d "$src/conda" ]; then
    echo "error: $src is not a conda source tree (no pyproject.toml and conda/);" \
         "fix: pass a checkout or an export of github.com/conda/conda" >&2
    exit 2
fi
if [ -e "$dest" ] && [ -n "$(ls -A "$dest" 2>/dev/null)" ]; then
    echo "error: $dest exists and is not empty; fix: remove it or pick another DEST" >&2
    exit 2
fi
# pip_install_tree TREE VERSION_VARIABLE: pip install a source tree whose version comes
# from git (hatch-vcs, setuptools-scm); an exported tree takes it from the variable.
pip_install_tree() {
    tree=$1 var=$2
    version=$(eval "printf %s \"\${$var:-}\"")
    if git -C "$tree" describe --tags >/dev/null 2>&1; then
        "$dest/bin/python" -m pip install --quiet "$tree"
    elif [ -n "$version" ]; then
        # hatch-vcs and setuptools-scm read this instead of git
        SETUPTOOLS_SCM_PRETEND_VERSION=$version "$dest/bin/python" -m pip install --quiet "$tree"
    else
        echo "error: $tree has no git history to take its version from;" \
             "fix: set $var (the release the tree is, e.g. 26.7.1)" >&2
        exit 2
    fi
}

"$python" -m venv "$dest"
"$dest/bin/python" -m pip install --quiet --upgrade pip
if [ -n "${MENUINST_SRC:-}" ]; then
    pip_install_tree "$MENUINST_SRC" MENUINST_VERSION
fi
pip_install_tree "$src" CONDA_VERSION

# The venv is conda's root prefix: a .condarc there is read by every command it runs.
cat > "$dest/.condarc" <<'RC'
# Written by make_conda.sh: classic solver, no default channel, no network unless asked.
solver: classic
channels: []
default_channels: []
channel_priority: strict
auto_update_conda: false
notify_outdated_conda: false
report_errors: false
RC

# Replace pip's restricted entry point with conda's own (bin/conda, bin/activate, hooks).
"$dest/bin/python" -m conda init --install >/dev/null
"$dest/bin/conda" --version
