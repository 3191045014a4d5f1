"""The `torch.backends` entry point: torch calls `autoload()` while `import torch` runs
(TORCH_DEVICE_BACKEND_AUTOLOAD, on by default), which registers the "ddl" backend so that
`dist.init_process_group("ddl")` needs no import in the script.

Kept outside ddl_core.torch: when a script imports ddl_core.torch (or horovod.torch)
before torch, torch's import runs this hook while ddl_core.torch is half-imported; then
the hook leaves the registration to ddl_core.torch, which registers at its end.
"""

from __future__ import annotations

import sys
import warnings


def autoload() -> None:
    if "ddl_core.torch" in sys.modules:
        return  # being imported right now; it calls register() when it is complete
    try:
        from ddl_core.torch import backend

        backend.register()
    except Exception as exc:  # noqa: BLE001 - a broken plugin must not break `import torch`
        warnings.warn(f"the DDL backend for torch.distributed is unavailable: {exc!r}",
                      RuntimeWarning, stacklevel=2)
