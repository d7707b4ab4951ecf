"""Every torch.nn layer whose sizes the input can tell is covered or consciously excluded.

The test enumerates torch.nn at run time, so a future torch that adds such a layer fails it
until the layer is given a lazy twin or a line in EXCLUDED saying why not.
"""

from __future__ import annotations

import inspect

from torch import nn

import lazynn

#: Constructor arguments whose value an input's shape determines.
SIZE_ARGUMENTS = frozenset(
    {
        "in_features", "in1_features", "in2_features", "in_channels", "num_features",
        "num_channels", "input_size", "embed_dim", "d_model", "normalized_shape",
        "num_parameters", "num_embeddings",
    }
)  # fmt: skip

#: torch.nn classes that take such an argument but have no lazy twin, and why.
EXCLUDED = {
    # A vocabulary size is the largest index + 1, which no batch can be trusted to contain.
    "Embedding": "num_embeddings cannot be read from a batch",
    "EmbeddingBag": "num_embeddings cannot be read from a batch",
    # Abstract bases, not layers.
    "RNNBase": "abstract base of RNN/LSTM/GRU",
    "RNNCellBase": "abstract base of the cells",
}

#: torch.nn classes taking *args (their sizes are not in the signature): checked by name.
OPAQUE = {"RNN": "input_size", "LSTM": "input_size", "GRU": "input_size"}


def sized_classes() -> dict[str, set[str]]:
    found = {}
    for name in dir(nn):
        cls = getattr(nn, name)
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)) or name.startswith("Lazy"):
            continue
        params = set(inspect.signature(cls.__init__).parameters)
        sizes = params & SIZE_ARGUMENTS
        if name in OPAQUE:
            sizes = {OPAQUE[name]}
        if sizes:
            found[name] = sizes
    return found


def test_every_sized_torch_layer_is_covered_or_excluded() -> None:
    missing = []
    for name in sized_classes():
        twin = getattr(lazynn, f"Lazy{name}", None)
        if twin is None and name not in EXCLUDED:
            missing.append(name)
        if twin is not None:
            assert twin.cls_to_become is getattr(nn, name), name
            assert name not in EXCLUDED, f"{name} is covered: drop it from EXCLUDED"
    assert not missing, f"torch.nn layers with input-determined sizes and no lazy twin: {missing}"


def test_exclusions_are_real_torch_classes() -> None:
    assert set(EXCLUDED) <= set(sized_classes())
