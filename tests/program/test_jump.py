"""Moving torch's CPU generator on without drawing (src/lazynn/_program/jump.py, stream.py):
the state bytes equal those torch has after drawing the words, jumped or drawn through, from
any place in the key; the release's word table and its self-test.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import lazynn._program.stream as stream_module
from lazynn._program.jump import PHI_EXPONENTS, advance, counters, x_pow_mod
from lazynn._program.stream import Stream, fill_words, self_test, skipping


def _berlekamp_massey(bits: list[int]) -> tuple[int, int]:
    """The shortest linear recurrence of a bit sequence over GF(2): (connection polynomial as
    an int, its degree)."""
    c, b, degree, m = 1, 1, 0, 1
    window = 0  # bit j-1: bits[i - j]
    for i, bit in enumerate(bits):
        discrepancy = bit ^ (bin((c >> 1) & window).count("1") & 1)
        if discrepancy:
            t = c
            c ^= b << m
            if 2 * degree <= i:
                degree, b, m = i + 1 - degree, t, 1
            else:
                m += 1
        else:
            m += 1
        window = ((window << 1) | bit) & ((1 << 20_000) - 1)
    return c, degree


def test_the_characteristic_polynomial_is_mt19937s() -> None:
    """Recomputed from numpy's mt19937 output (bit 0 of the untempered words)."""
    generator = np.random.MT19937()
    generator._legacy_seeding(5)
    keys = [generator.state["state"]["key"].copy()]
    for _ in range(70):
        generator.random_raw(624)
        keys.append(generator.state["state"]["key"].copy())
    words = np.concatenate(keys)
    c, degree = _berlekamp_massey([int(b) for b in (words[: 2 * 19937 + 100] & 1)])
    assert degree == 19937
    assert tuple(degree - j for j in range(degree, -1, -1) if c >> j & 1) == PHI_EXPONENTS


def _drawn(seed: int, before: int, words: int, small_normal: bool) -> tuple[torch.Tensor, ...]:
    """The generator's state after ``before`` words (and a cached normal), then after ``words``
    more drawn by torch."""
    generator = torch.Generator().manual_seed(seed)
    if before:
        torch.empty(before).uniform_(generator=generator)
    if small_normal:  # (leaves a cached double normal in the state: kept by a skip)
        torch.empty(3).normal_(generator=generator)
    start = generator.get_state()
    torch.empty(words).uniform_(generator=generator)
    return start, generator.get_state()


@pytest.mark.parametrize("before", [0, 1, 300, 623, 624, 1000])
@pytest.mark.parametrize(
    "words", [1, 2, 623, 624, 625, 1247, 1248, 1249, 19_936, 19_937, 30_000, 123_457]
)
@pytest.mark.parametrize("jump", [False, True])
def test_advancing_equals_drawing_from_any_place_in_the_key(
    before: int, words: int, jump: bool
) -> None:
    start, drawn = _drawn(7, before, words, small_normal=before == 300)
    assert torch.equal(advance(start, words, jump=jump), drawn)


@pytest.mark.parametrize("words", [1_000_003, 10_000_019, 123_456_789])
def test_long_jumps_reduce_by_the_polynomial_and_equal_drawing(words: int) -> None:
    start, _ = _drawn(11, 5, 0, small_normal=True)
    jumped = advance(start, words, jump=True)
    walked = advance(start, words, jump=False)  # (numpy draws every word)
    assert torch.equal(jumped, walked)
    if words < 20_000_000:  # (and torch agrees)
        _, drawn = _drawn(11, 5, words, small_normal=True)
        assert torch.equal(jumped, drawn)


def test_nothing_to_skip_keeps_the_state_and_counters_count_jumps() -> None:
    start, _ = _drawn(3, 0, 0, small_normal=False)
    assert advance(start, 0) is start
    before = counters()
    advance(start, 50_000, jump=True)
    after = counters()
    assert after.jumps == before.jumps + 1
    assert after.skipped_words == before.skipped_words + 50_000
    assert x_pow_mod(5) == 32  # (below the degree: x**k itself)


@pytest.mark.parametrize(
    ("kind", "dtype", "total", "words"),
    [
        ("uniform", torch.float32, 17, 17),
        ("uniform", torch.float64, 17, 34),
        ("uniform", torch.bfloat16, 5, 5),
        ("normal", torch.float32, 16, 16),
        ("normal", torch.float32, 17, 33),
        ("normal", torch.float32, 1001, 1017),
        ("normal", torch.float64, 33, 98),
        ("normal", torch.bfloat16, 17, 32),
        ("normal", torch.float16, 1001, 1008),
        ("normal", torch.float32, 15, None),  # (the scalar path: a cached sample decides)
        ("normal", torch.int64, 100, None),
    ],
)
def test_the_word_table_is_torchs(
    kind: str, dtype: torch.dtype, total: int, words: int | None
) -> None:
    assert fill_words(kind, dtype, total, total) == words
    if words is None or dtype == torch.int64:
        return
    generator = torch.Generator().manual_seed(0)
    start = generator.get_state()
    fill = torch.Tensor.uniform_ if kind == "uniform" else torch.Tensor.normal_
    fill(torch.empty(total, dtype=dtype), generator=generator)
    assert torch.equal(advance(start, words, jump=False), generator.get_state())


def test_the_self_test_passes_on_this_release() -> None:
    assert self_test() == ""
    assert skipping()


def test_a_release_whose_draws_differ_is_drawn_serially_with_one_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A table that no longer matches torch (as a new release's might): the self-test fails,
    lazynn warns once naming the release, skips nothing, and the numbers stay exact."""
    from lazynn._program.draws import draw_slice

    real = stream_module.fill_words
    monkeypatch.setattr(
        stream_module, "fill_words", lambda k, d, t, u: None if real(k, d, t, u) is None else 1
    )
    monkeypatch.setattr(stream_module, "_warned", type(stream_module._warned)())
    skipping.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert not skipping()
            assert not skipping()
        assert [type(w.message) for w in caught] == [RuntimeWarning]
        assert f"torch {torch.__version__}" in str(caught[0].message)
        assert not Stream(torch.Generator()).jumps
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            torch.manual_seed(0)
            whole = torch.empty(100, 3).normal_()
            after = torch.get_rng_state()
            torch.manual_seed(0)
            part = torch.empty(10, 3)
            draw_slice(part, torch.Tensor.normal_, (100, 3), 150, (), {})
        assert torch.equal(part, whole[50:60])
        assert torch.equal(torch.get_rng_state(), after)
    finally:
        skipping.cache_clear()
