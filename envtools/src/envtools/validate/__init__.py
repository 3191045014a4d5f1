"""The checks of ``envtools validate``: does everything in an environment still fit together?

One module per family of checks, over one :class:`~envtools.validate.findings.Context`
(findings): the package records (depends), the files against their records (files),
what pip installed (pip), the ELF files (binaries, with loader: what ld.so would do),
the import smoke test (imports, running smoke), a change that did not finish
(interrupted); run runs them in order and writes the --json document.

Each check yields :class:`Finding` objects with a severity, the packages involved and a
hint how to fix it. Users typically run this after adding packages to a clone (with
conda, pip or envtools), to learn whether their additions broke the curated set.

JSON output (``--json``), schema version 1::

    {
      "schema": "envtools-validate/1",
      "prefix": "/abs/path",
      "exit_status": 0 | 1,               # 0: no error-severity findings
      "summary": {"error": N, "warning": N, "info": N},
      "virtual_packages": ["__glibc=2.36=0", ...],
      "checked": {"packages": N, "files": N, "hashed": N, "pip_distributions": N,
                  "elf_files": N, "imports": N},
      "findings": [
        {"check": "depends", "severity": "error" | "warning" | "info",
         "message": "...", "packages": ["name", ...], "paths": ["rel/path", ...],
         "hint": "..."}
      ]
    }

Checks (the ``check`` field): depends, constrains, unsafe-path, missing-file,
altered-file, clobbered-file, explicit, pip-duplicate, pip-requires, pip-overwrote,
editable-install, linked-directories, elf-arch, elf-damaged, elf-unresolved,
elf-optional, elf-mpi-flavour, duplicate-library, python-abi, import-error, import-crash,
numpy-abi, import-shadowed, import-optional, import-timeout, import-skipped, cuda-driver,
interrupted-change.
Libraries are resolved the way ld.so loads them (:mod:`envtools.validate.loader`); modules are
imported by the env's python (:mod:`envtools.validate.smoke`, unless ``--no-imports``).

A record's path is data (see :mod:`envtools.prefix.confine`): one that is absolute, holds
``..``, or lies under a symlink is reported as ``unsafe-path`` and never opened. The one
kind of link validate follows is a clone's own link to its package cache
(cachelinks.link_target: a package file, or with ``--link-mode dirs`` a directory, that
leads to the same path in the cache directory its record names); any other link where
a record has a file is reported as ``altered-file``, and its target is not read.
"""
