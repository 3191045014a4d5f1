"""What to install and whether it may be: channels, specs and py-rattler's solve and
installer (solver), virtual packages (virtual), the CUDA a set needs (cudaenv), package
archives checked against the repodata (archives), and adding packages to an env that
exists (adding)."""
