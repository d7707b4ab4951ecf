"""Moving torch's CPU generator (mt19937) on by any number of words without drawing them.

mt19937's step is linear over GF(2) on its 19937-bit state, so ``J`` steps are the state
times ``x**J`` modulo the step's characteristic polynomial ``PHI`` (degree 19937, 135 terms).
:func:`advance` computes that remainder on Python integers (squarings by a byte table,
reductions by ``PHI``'s sparse terms) and applies it as one XOR of rows of the next 20,560
untempered words, which numpy's own mt19937 generates (Haramoto, Matsumoto et al.,
"Efficient Jump Ahead for F2-Linear Random Number Generators", 2008; docs/design.md,
"Exact initialization drawn in parallel").

A short distance is drawn through by numpy instead (about 3 ns a word, no memory), a long one
jumped (a few ms once the distance's polynomial is cached, tens of ms to compute it): see
:func:`jump_pays`. Either way the state bytes are exactly those torch's generator has after
drawing the words: the key, ``left``, ``next``, the seed and the cached normal samples.

>>> import torch
>>> g = torch.Generator().manual_seed(0)
>>> _ = torch.empty(100_000).uniform_(generator=g)
>>> drawn = g.get_state()
>>> torch.equal(advance(torch.Generator().manual_seed(0).get_state(), 100_000), drawn)
True
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["PHI_EXPONENTS", "Counters", "advance", "counters", "jump_pays", "x_pow_mod"]

#: the exponents of mt19937's characteristic polynomial (Berlekamp-Massey on its output;
#: tests/program/test_jump.py computes them again)
PHI_EXPONENTS = (
    0, 1189, 1416, 1585, 1643, 1870, 2493, 2773, 3000, 3227, 3454, 3681, 3908, 4135, 4362,
    4753, 5661, 6337, 6569, 7129, 7477, 7525, 7583, 7752, 7979, 8206, 9505, 9901, 9969, 10128,
    10693, 10761, 10920, 11089, 11147, 11157, 11215, 11321, 11374, 11384, 11485, 11611, 11712,
    11717, 11838, 11881, 11944, 11997, 12277, 12335, 12393, 12504, 12509, 12620, 12673, 12731,
    12736, 12789, 12905, 12958, 12963, 13137, 13185, 13190, 13243, 13301, 13412, 13528, 13533,
    13639, 13697, 13760, 13813, 13866, 14093, 14151, 14209, 14320, 14325, 14436, 14547, 14552,
    14605, 14721, 14774, 14779, 14953, 15001, 15006, 15059, 15117, 15228, 15344, 15349, 15455,
    15513, 15576, 15629, 15682, 15909, 15967, 16025, 16136, 16141, 16252, 16363, 16368, 16421,
    16537, 16590, 16595, 16817, 16822, 16875, 16933, 17044, 17160, 17271, 17329, 17445, 17498,
    17725, 17783, 17841, 17952, 18068, 18179, 18237, 18406, 18633, 18691, 18860, 19087, 19314,
    19937,
)  # fmt: skip
_DEGREE = 19937
_N = 624  # words in the key
_lock = threading.Lock()  # (the tables and counters below, shared by threads)
_PHI = sum(1 << e for e in PHI_EXPONENTS)
#: byte -> its bits spread to every other bit (squaring over GF(2))
_SPREAD = np.array(
    [sum(((b >> i) & 1) << (2 * i) for i in range(8)) for b in range(256)], dtype="<u2"
)
#: top byte t above the degree -> t * x**DEGREE + (t * x**DEGREE mod PHI), to clear it
_TABLE: list[int] = []


def _reduction_table() -> list[int]:
    with _lock:  # (threads may jump for the first time at once)
        if _TABLE:
            return _TABLE
        table = []
        for t in range(256):
            value = t << _DEGREE
            top = value.bit_length() - 1
            reduced = value
            while top >= _DEGREE:
                if reduced >> top & 1:
                    reduced ^= _PHI << (top - _DEGREE)
                top -= 1
            table.append((t << _DEGREE) ^ reduced)
        _TABLE.extend(table)
    return _TABLE


def _square_mod(g: int) -> int:
    data = np.frombuffer(g.to_bytes((_DEGREE + 7) // 8, "little"), dtype=np.uint8)
    square = int.from_bytes(_SPREAD[data].tobytes(), "little")
    table = _reduction_table()
    for byte in range((square.bit_length() - _DEGREE + 7) // 8 - 1, -1, -1):
        top = (square >> (_DEGREE + 8 * byte)) & 0xFF
        if top:
            square ^= table[top] << (8 * byte)
    return square


def x_pow_mod(k: int) -> int:
    """``x**k`` modulo mt19937's characteristic polynomial, as an int (bit i: x**i)."""
    if k < _DEGREE:
        return 1 << k
    g = 1
    for bit in bin(k)[2:]:
        g = _square_mod(g)
        if bit == "1":
            g <<= 1
            if g >> _DEGREE & 1:
                g ^= _PHI
    return g


#: distance -> the exponents of ``x**distance mod PHI``'s terms, the most recent last
_TERMS: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
_KEPT = 128


def _terms(k: int) -> np.ndarray:
    """The exponents of ``x**k mod PHI``'s nonzero terms (kept for the last 128 distances)."""
    with _lock:
        if k in _TERMS:
            _TERMS.move_to_end(k)
            return _TERMS[k]
    g = x_pow_mod(k)
    bits = np.unpackbits(
        np.frombuffer(g.to_bytes((_DEGREE + 7) // 8, "little"), dtype=np.uint8), bitorder="little"
    )
    terms = np.flatnonzero(bits[:_DEGREE])
    with _lock:
        _TERMS[k] = terms
        while len(_TERMS) > _KEPT:
            _TERMS.popitem(last=False)
    return terms


def _untempered(key: np.ndarray) -> np.ndarray:
    """The 20,560 untempered words from ``key`` on: the key, then the next 32 twists' keys
    (numpy's mt19937 twists them)."""
    generator = np.random.MT19937()
    generator.state = {"bit_generator": "MT19937", "state": {"key": key, "pos": _N}}
    keys = [key]
    while len(keys) * _N < _DEGREE + _N:
        generator.random_raw(_N, output=False)
        keys.append(generator.state["state"]["key"])
    return np.concatenate(keys)


def _jumped_key(key: np.ndarray, distance: int) -> np.ndarray:
    """The key ``distance`` words after ``key`` (both with every word used: numpy's
    ``pos == 624``); its first word is right in its top bit only, which is all a twist reads."""
    words = _untempered(key)
    rows = np.lib.stride_tricks.sliding_window_view(words, _N)
    terms = _terms(distance)
    out = np.zeros(_N, dtype=np.uint32)
    for lo in range(0, len(terms), 2048):
        out ^= np.bitwise_xor.reduce(rows[terms[lo : lo + 2048]], axis=0)
    return out


# --- the cost model: measured on a 2-vCPU Xeon (docs/benchmarks.md) --------------------------
#: seconds a word drawn through by numpy costs
_DRAW = 3e-9
#: seconds applying a polynomial costs
_APPLY = 4e-3
#: seconds a polynomial costs per bit of its distance (when not cached)
_PER_BIT = 1.7e-3


def jump_pays(words: int, repeated: bool = False) -> bool:
    """Whether jumping ``words`` ahead costs less than drawing them through (``repeated``: a
    distance jumped again and again, whose polynomial is computed once)."""
    if words < _DEGREE:
        return False
    distance = _N * ((words - 1) // _N - 1)
    cached = repeated or distance in _TERMS
    return _APPLY + (0 if cached else _PER_BIT * distance.bit_length()) < _DRAW * words


@dataclass
class Counters:
    """What moving generators on cost this process (threads add to it; CPU seconds)."""

    jumps: int = 0
    jump_seconds: float = 0.0
    skipped_words: int = 0
    skip_seconds: float = 0.0


_counters = Counters()


def counters() -> Counters:
    """The process's totals so far (a copy)."""
    with _lock:
        return Counters(**vars(_counters))


def advance(state: torch.Tensor, words: int, jump: bool | None = None) -> torch.Tensor:
    """The state bytes of torch's CPU generator after ``words`` more 32-bit words from
    ``state`` (``torch.Generator.get_state()``). ``jump``: jump (True) or draw through
    (False); default: whichever costs less (:func:`jump_pays`)."""
    if words <= 0:
        return state
    raw = state.numpy().copy()
    left = int(raw[8:12].view("<i4")[0])
    key = raw[24 : 24 + 8 * _N].view("<u8").astype(np.uint32)
    used = _N + 1 - left  # words of the key drawn (numpy's pos)
    target = used + words  # from the start of ``key``
    started = time.thread_time()  # (CPU seconds of this thread: ranks share cores)
    jumped = False
    if target <= _N:
        pos = target
    elif jump if jump is not None else jump_pays(words):
        twists = (target - 1) // _N  # the key wanted is this many twists on
        distance = _N * (twists - 1)
        if distance:
            key = _jumped_key(key, distance)
        generator = np.random.MT19937()
        generator.state = {"bit_generator": "MT19937", "state": {"key": key, "pos": _N}}
        generator.random_raw(target - _N * twists, output=False)
        key, pos = generator.state["state"]["key"], generator.state["state"]["pos"]
        jumped = True
    else:
        generator = np.random.MT19937()
        generator.state = {"bit_generator": "MT19937", "state": {"key": key, "pos": used}}
        generator.random_raw(words, output=False)
        key, pos = generator.state["state"]["key"], generator.state["state"]["pos"]
    raw[8:12] = np.array([_N + 1 - pos], dtype="<i4").view(np.uint8)
    raw[16:24] = np.array([pos], dtype="<u8").view(np.uint8)
    raw[24 : 24 + 8 * _N] = key.astype("<u8").view(np.uint8)
    with _lock:
        elapsed = time.thread_time() - started
        if jumped:
            _counters.jumps += 1
            _counters.jump_seconds += elapsed
        else:
            _counters.skip_seconds += elapsed
        _counters.skipped_words += words
    return torch.from_numpy(raw)
