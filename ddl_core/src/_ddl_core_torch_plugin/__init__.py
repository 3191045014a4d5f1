"""The `torch.backends` entry point of the ddl distribution: torch calls `autoload()` while
`import torch` runs (TORCH_DEVICE_BACKEND_AUTOLOAD, on by default), which registers the
"ddl" backend so that `dist.init_process_group("ddl")` needs no import in the script.

A top-level module, not part of ddl_core, because torch turns any exception of an entry
point, its import included, into a RuntimeError that aborts `import torch`; an entry point
inside ddl_core would import ddl_core first, and with libddl or libmpi missing that import
fails before any code of ours could catch it. So this module imports nothing of ddl's at
import time, and `autoload()` catches whatever loading ddl_core.torch raises: `import
torch` then succeeds with one RuntimeWarning naming the cause, and "ddl" is registered as a
backend that raises the same cause (with its fix) from `init_process_group("ddl")` and from
the rendezvous a working ddl would have served (`ddl://`, `env://` under an MPI launcher
without MASTER_ADDR), so the error surfaces where the backend is used, not as "MASTER_ADDR
expected" or "Invalid backend".

When a script imports ddl_core.torch (or horovod.torch) before torch, torch's import runs
this hook while ddl_core.torch is half-imported; the hook then leaves the registration to
ddl_core.torch, which registers at its end.

Only the standard library at module level: this file must import wherever torch does.
"""

from __future__ import annotations

import importlib
import os
import sys
import urllib.parse
import warnings
from typing import Any

BACKEND_NAME = "ddl"

# What loading ddl's torch backend raised in this process (None: it loaded, or not tried).
failure: BaseException | None = None


def under_mpi() -> bool:
    """Whether an MPI launcher (Open MPI / PMIx, MPICH Hydra) started this process."""
    return any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE",
                                          "PMI_RANK"))


def wants_ddl_rendezvous(url: str) -> bool:
    """Whether an `env://` rendezvous goes through DDL: under an MPI launcher the rank and
    size come from MPI, so with MASTER_ADDR unset, or set (it then names rank 0's address,
    MASTER_PORT its port) without RANK and WORLD_SIZE, which torch's env:// would demand."""
    query = urllib.parse.parse_qs(urllib.parse.urlparse(url).query)
    has_rank = "RANK" in os.environ or "rank" in query
    has_size = "WORLD_SIZE" in os.environ or "world_size" in query
    return under_mpi() and ("MASTER_ADDR" not in os.environ or not (has_rank and has_size))


def autoload() -> None:
    """torch's hook. Never raises (but KeyboardInterrupt): see the module's docstring."""
    global failure
    if "ddl_core.torch" in sys.modules:
        return  # being imported right now; it calls register() when it is complete
    try:
        from ddl_core.torch import backend

        backend.register()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - nothing of ddl's may break `import torch`
        failure = exc
        try:
            _register_unavailable(exc)
        except Exception as reg_exc:  # noqa: BLE001 - torch.distributed itself is unusable
            note = f" (and registering the placeholder failed: {_cause(reg_exc)})"
        else:
            note = ""
        then = (f"torch goes on without it, and init_process_group({BACKEND_NAME!r}) "
                f"raises this error{note}")
        warnings.warn(_unavailable_text(exc, then), RuntimeWarning, stacklevel=2)


def _cause(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _fix(exc: BaseException) -> str:
    """The remedy for the usual causes, in the user's terms."""
    text = str(exc)
    if "libmpi" in text:
        fix = ("this ddl build needs an MPI library the environment lacks: install ddl's "
               "Open MPI or MPICH build (e.g. `conda install powerai=*=openmpi_*`), or for "
               "ddl's `external` build load the site's MPI (its module, or its lib directory "
               "on LD_LIBRARY_PATH) before starting Python")
    elif ("libddl" in text or "_ddl.cpython" in text
          or getattr(exc, "name", "") == "ddl_core._ddl"):
        fix = ("ddl's libddl or its Python extension cannot be loaded: reinstall the `ddl` "
               "package (or `pip install ./ddl_core` from a source tree)")
    elif isinstance(exc, ModuleNotFoundError):
        fix = (f"module {exc.name!r} is missing: reinstall the `ddl` package (and "
               "`ddl-torch` for the C++ backend)")
    else:
        fix = "reinstall the `ddl` package"
    return (f"{fix}; or set TORCH_DEVICE_BACKEND_AUTOLOAD=0 to stop torch loading "
            "backend plugins")


def _unavailable_text(exc: BaseException, then: str = "") -> str:
    return (f"DDL's torch.distributed backend {BACKEND_NAME!r} is unavailable: "
            f"{_cause(exc)}. {then + '. ' if then else ''}Fix: {_fix(exc)}")


def _raiser(exc: BaseException, where: str) -> Any:
    def unavailable(*args: Any, **kwargs: Any) -> Any:  # noqa: ARG001
        raise RuntimeError(f"{where}: {_unavailable_text(exc)}") from exc

    unavailable._ddl_unavailable = True  # type: ignore[attr-defined]
    return unavailable


def _register_unavailable(exc: BaseException) -> None:
    """Register "ddl" (backend and `ddl://` rendezvous) as raisers of `exc`, and make env://
    raise it where a working ddl would have served it; ddl_core.torch's register() replaces
    all three if it loads later in this process."""
    import torch.distributed as dist

    if not dist.is_available():
        return
    plugin = dist.Backend._plugins.get(BACKEND_NAME.upper())
    if plugin is None or not getattr(plugin.creator_fn, "_ddl_unavailable", False):
        dist.Backend.register_backend(BACKEND_NAME, _raiser(exc, "init_process_group('ddl')"),
                                      extended_api=True, devices=["cpu", "cuda"])
    # (torch.distributed.rendezvous is also a function's name there: take the module)
    rdzv = importlib.import_module("torch.distributed.rendezvous")
    handlers = getattr(rdzv, "_rendezvous_handlers", None)
    if handlers is None:
        return
    if BACKEND_NAME not in handlers:
        rdzv.register_rendezvous_handler(BACKEND_NAME, _raiser(exc, "rendezvous ddl://"))
    env = handlers.get("env")
    if env is not None and not getattr(env, "_ddl_wrapped", False):
        handlers["env"] = _env_needing_ddl(env, exc)


def _env_needing_ddl(original: Any, exc: BaseException) -> Any:
    def handler(url: str, *args: Any, **kwargs: Any) -> Any:
        if wants_ddl_rendezvous(url):
            raise RuntimeError(
                "rendezvous env:// under an MPI launcher without MASTER_ADDR (or without RANK "
                f"and WORLD_SIZE) goes through DDL: {_unavailable_text(exc)}; or export "
                "MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE") from exc
        return original(url, *args, **kwargs)

    handler._ddl_wrapped = True  # type: ignore[attr-defined]
    handler._ddl_unavailable = True  # type: ignore[attr-defined]
    handler._ddl_original = original  # type: ignore[attr-defined]
    return handler
