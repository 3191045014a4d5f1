"""The C++ half of the `ddl` torch.distributed backend.

`ddl_torch._C.make_backend(impl, rank, size, name)` returns a real c10d Backend whose
operations call `impl`'s methods (ddl_core.torch.backend's implementation on libddl).
ddl_core.torch.backend uses it when it is installed; scripts never import it.
"""

from __future__ import annotations

import torch  # noqa: F401 - loads libtorch (and torch's pybind11 types) before _C

from ._C import backend_impl, make_backend

__all__ = ["backend_impl", "make_backend"]
