"""DDL-CE channel pipeline: render -> graph -> build -> index -> test -> report (+ CI matrix)."""

__version__ = "0.1.0"
