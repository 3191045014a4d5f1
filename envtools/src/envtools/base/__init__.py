"""What every room of envtools may use: running py-rattler's coroutines (aio), progress and
messages on stderr (progress), process identities (procs), and reading ELF headers (elf).
Nothing here knows what an environment is."""
