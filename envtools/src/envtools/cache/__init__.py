"""The package cache kept beside an env: which of its directories holds each package (find),
and the backup tag that belongs on the cache and never on an env (tag)."""
