"""Putting a package's files into a prefix: one file (linking), its prefix rewritten
(relocate), symlinks into a cache the user does not own (cachelinks), a directory per link
(layers), the bytecode compiled at install (bytecode), a clone's plan (plan) and the
parallel placing of it (placement)."""
