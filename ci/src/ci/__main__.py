"""`python -m ci ...` entry point."""

from ci.cli import app

app()
