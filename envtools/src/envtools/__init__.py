"""DDL-CE envtools: install, publish (modulefiles), clone and validate read-only conda envs.

The rooms, top to bottom; a room imports only from the rooms below it (import-linter's
``envtools-rooms`` contract in the repository's .importlinter checks it, and that no
module of a room imports a sibling in a loop):

- ``__main__``, ``cli``: the command line, thin: it parses and calls one command.
- ``bench``: ``python -m envtools.bench``, the figures against their baselines (the
  start-up benchmark reaches sealed images through ddlrun --env).
- ``image`` | ``api``: sealed env images (seal, run, mount, and the IMAGE forms of
  validate, clone and module) | envtools as a library (what the channel pipeline calls).
- ``commands``: one module per command: install/remove, clone, add/drop, detach,
  module, gc, validate.
- ``validate``: the checks, one module per family, and the run over them.
- ``place`` | ``solve``: putting files into a prefix (linking, relocation, cache links,
  directory layers, the clone's plan and its parallel placing) | deciding what to
  install (channels, specs, py-rattler's solve, virtual packages, archives checked).
  Neither imports the other.
- ``cache``: the package cache beside an env (which directory holds a package, its tag).
- ``prefix``: one env on disk: records, the path rule (confine), envtools' own files in
  it, build-beside-and-rename and the in-place transaction.
- ``base``: coroutines, progress, process identities, ELF headers.
- ``errors``: the one exception type users see.
"""

__version__ = "0.1.0"
