"""Synchronized batch normalization on CPU over DDL.

torch.nn.SyncBatchNorm refuses CPU tensors (its kernels and DDP's check are GPU-only), so
small per-rank batches on CPU nodes would normalise with noisy per-rank statistics (the
seeds' "batch normalization" consideration). This layer computes the batch mean and
variance over all ranks: one fused allreduce of (sum, sum of squares, count) per layer
in the forward pass; autograd differentiates through the allreduce (its backward is an
allreduce of the incoming gradient), which is exactly the cross-rank term of the
SyncBatchNorm gradient.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import ddl_core


class _AllreduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # noqa: ARG004
        out = x.detach().clone().contiguous()
        ddl_core.allreduce(out, op="sum", out=out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # noqa: ARG004
        g = grad.detach().clone().contiguous()
        ddl_core.allreduce(g, op="sum", out=g)
        return g


def allreduce_sum(x: torch.Tensor) -> torch.Tensor:
    """Differentiable sum over ranks."""
    return _AllreduceSum.apply(x)


class SyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm{1,2,3}d whose training statistics span every rank (eval: running stats)."""

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2-D input (got {x.dim()}-D)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        if not (self.training or not self.track_running_stats):
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                False, 0.0, self.eps)
        ddl_core.init()
        dims = [0, *range(2, x.dim())]
        c = x.shape[1]
        xf = x.float()
        local = torch.cat([xf.sum(dims), (xf * xf).sum(dims),
                           torch.full((1,), x.numel() / c, dtype=torch.float32)])
        total = allreduce_sum(local)
        n = total[-1]
        mean = total[:c] / n
        var = (total[c:2 * c] / n - mean * mean).clamp_min(0)
        if self.training and self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                m = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                     else self.momentum)
                unbiased = var * (n / (n - 1).clamp_min(1))
                self.running_mean.mul_(1 - m).add_(m * mean.to(self.running_mean.dtype))
                self.running_var.mul_(1 - m).add_(m * unbiased.to(self.running_var.dtype))
        shape = [1, c] + [1] * (x.dim() - 2)
        y = (xf - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y.to(x.dtype)

    @classmethod
    def convert_sync_batchnorm(cls, module: nn.Module) -> nn.Module:
        """Replace every BatchNorm*d (and torch's SyncBatchNorm) in `module` by this layer,
        keeping parameters and running statistics."""
        out = module
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, cls):
            out = cls(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats)
            if module.affine:
                with torch.no_grad():
                    out.weight = module.weight
                    out.bias = module.bias
            if module.track_running_stats:
                out.running_mean = module.running_mean
                out.running_var = module.running_var
                out.num_batches_tracked = module.num_batches_tracked
            out.training = module.training
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child))
        return out
