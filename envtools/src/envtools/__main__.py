"""Allow ``python -m envtools`` as well as the ``envtools`` console script."""

from envtools.cli import main

if __name__ == "__main__":
    main()
