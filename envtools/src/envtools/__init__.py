"""DDL-CE envtools: install, publish (modulefiles), clone and validate read-only conda envs."""

__version__ = "0.1.0"
