"""One module per ``envtools`` command (install and remove; clone; add and drop; detach;
module; gc; validate): the work each does, called by the command line (envtools.cli) and
the library (envtools.api)."""
