"""One environment on disk: its ``conda-meta`` records (records, conda_records, record_index),
the path rule every path from data passes (confine), envtools' own files in it (readonly,
hashing's stat cache, untracked, noarch), and the two ways of changing it safely: build
beside and rename (tempdirs), or a transaction in place (txn)."""
