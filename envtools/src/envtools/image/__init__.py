"""Sealed env images: an env as one reproducible SquashFS file, mounted where it was built.

API (what ``envtools seal|run|mount``, ``validate|clone|module IMAGE``, ddlrun's
``--env IMAGE`` staging and the startup benchmark use; every call raises
:class:`envtools.errors.EnvtoolsError` with a message and a hint on bad input)::

    from envtools.image import seal, verify, run, Manifest

    m = seal(prefix, out, force=False)        # -> Manifest (with image_sha256, image_bytes)
        # writes OUT, OUT.sha256 ("<hex>  <name>", sha256sum -c form) and OUT.json (the
        # manifest); refuses an OUT in the prefix, an existing OUT, an env validate finds
        # broken (unless force); writes nothing into the prefix
    m = verify(image, expected_sha256=None)   # -> Manifest; before any mount:
        # size and sha256 against IMAGE.sha256 (or expected_sha256), zstd SquashFS magic,
        # the manifest inside == IMAGE.json, platform == this node's (host_platform())
    rc = run(image, ["python", "-c", "..."], mount_with="auto", env=None, cwd=None,
             expected_sha256=None, hash_it=True)  # -> the command's status (128+N: signal N)
        # verify, then mount at m.prefix in the command's private namespace; nothing
        # stays mounted afterwards, also when the command or envtools is SIGKILLed;
        # hash_it=False skips only the sha256 check of the contents, for a caller that
        # just checked this file (CLI: envtools run --hashed-by-caller IMAGE -- CMD)
    path, fd = open_image(image); m = verify_fd(path, fd, expected_sha256, hash_it)
    rc = run_verified(fd, m, argv, mount_with, env, cwd)  # (envtools.image.verify / .run)
        # run again and again on one open, verified image, without hashing it again
    Manifest: prefix, platform, envtools_version, records_sha256, packages, files,
              env_bytes, compression, format, image_sha256, image_bytes,
              chunk_bytes, chunk_sha256 (beside only: envtools.image.chunks)
    sidecars(image) -> (IMAGE.sha256, IMAGE.json)   # what must travel with a copy
    host_platform() -> "linux-64" | "linux-ppc64le" | "linux-aarch64"
    seal_benchmark(prefix, workdir) -> dict   # envtools.image.bench: seal time, sizes,
                                              # second seal's sha256; format_seal_rows()

Modules, one job each: :mod:`.manifest` (the manifest, parsed and range-checked),
:mod:`.seal` (mksquashfs), :mod:`.chunks` (per-chunk sha256s), :mod:`.verify` (before
mounting), :mod:`.namespace` (how a mount is made private to one command, what it
needs), :mod:`.run` (run a command in it), :mod:`.mount` (an admin's node-wide mount),
:mod:`.modulefile` (modulefiles of an image), :mod:`.bench` (seal figures), :mod:`.cli`
(the subcommands).

Imports are lazy: ``envtools --help`` pays for none of this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from envtools.image.manifest import Manifest, host_platform, sidecars
    from envtools.image.run import run, run_verified
    from envtools.image.seal import seal
    from envtools.image.verify import verify

__all__ = ["Manifest", "host_platform", "run", "run_verified", "seal", "seal_benchmark",
           "sidecars", "verify"]
_WHERE = {"Manifest": "manifest", "host_platform": "manifest", "sidecars": "manifest",
          "seal": "seal", "verify": "verify", "run": "run", "run_verified": "run",
          "seal_benchmark": "bench"}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(name)
    import importlib

    return getattr(importlib.import_module(f"envtools.image.{_WHERE[name]}"), name)
