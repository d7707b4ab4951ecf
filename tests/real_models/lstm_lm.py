"""The LSTM language model of pytorch/examples ``word_language_model``: the decoder tied to the
encoder, ``uniform_``, ``zeros_``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .kit import Kit


class RNNModel(nn.Module):
    def __init__(
        self,
        kit: Kit,
        ntoken: int = 50,
        ninp: int = 16,
        nhid: int = 16,
        nlayers: int = 2,
        dropout: float = 0.2,
        tie_weights: bool = True,
    ) -> None:
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = kit.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = kit.Linear(nhid, ntoken)
        if tie_weights:
            if nhid != ninp:
                raise ValueError("When using the tied flag, nhid must be equal to emsize")
            self.decoder.weight = self.encoder.weight
        self.init_weights()
        self.nhid, self.nlayers = nhid, nlayers

    def init_weights(self) -> None:
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(
        self, input: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        decoded = self.decoder(self.drop(output)).view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden
