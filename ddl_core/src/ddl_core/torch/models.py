"""A small decoder-only transformer and its synthetic data, shared by the FSDP2 example
(ddl_core/examples/fsdp2_ddl.py), its test and `python -m ddl_core.bench ddp`.

Why here: the sharding stack (FSDP2, DeviceMesh) is exercised on a transformer, the model
it is made for, yet it must train in seconds on CPU ranks; one definition keeps the
example, the test that checks its loss curve and the benchmark measuring the same thing.
"""

from __future__ import annotations

import torch
from torch import nn


class TinyTransformer(nn.Module):
    """Token embedding + learned positions, pre-norm causal self-attention blocks, and a
    language-model head: next-token prediction over `vocab` tokens. forward(tokens of
    shape (batch, seq)) gives logits of shape (batch x seq, vocab)."""

    def __init__(self, vocab: int = 128, dim: int = 64, heads: int = 4, layers: int = 2,
                 seq: int = 32) -> None:
        super().__init__()
        self.seq = seq
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True,
                                       norm_first=True)
            for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        x = self.embed(tokens) + self.pos(torch.arange(n, device=tokens.device))
        mask = nn.Transformer.generate_square_subsequent_mask(n, device=tokens.device)
        for layer in self.layers:
            x = layer(x, src_mask=mask, is_causal=True)
        # Logits as (batch x seq, vocab): a 2-D matmul result, not a view of a 3-D one
        # (FSDP2 warns about a module returning a view: in-place ops on it lose its hook).
        return self.head(self.norm(x).reshape(-1, x.shape[-1]))


def token_batch(step: int, rank: int, batch: int = 8, seq: int = 32,
                vocab: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, next-token targets) for one rank's batch at one step: sequences that
    count up by a per-sequence stride modulo vocab, so there is something to learn and the
    loss falls. Deterministic in (step, rank): every run sees the same data."""
    g = torch.Generator().manual_seed(7919 * step + rank)
    start = torch.randint(0, vocab, (batch, 1), generator=g)
    stride = torch.randint(1, 5, (batch, 1), generator=g)
    seqs = (start + stride * torch.arange(seq + 1)) % vocab
    return seqs[:, :-1], seqs[:, 1:]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def shard(model: TinyTransformer, mesh: object) -> TinyTransformer:
    """FSDP2: each block its own unit (its parameters gathered just in time), then the
    rest; on a 2-D mesh (replicate, shard) that is HSDP."""
    from torch.distributed.fsdp import fully_shard

    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model
