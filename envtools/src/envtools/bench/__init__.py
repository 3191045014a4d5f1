"""``python -m envtools.bench``: envtools' figures, each against its baseline, measured in one
run: clone and install (clone), ``envtools add`` and ``drop`` (add), validate (validate),
a job's start-up from a shared filesystem (startup);
what they share is in measure, running envtools as another user in asuser. The benchmarks
use the other rooms through their public names only (a test checks it)."""
