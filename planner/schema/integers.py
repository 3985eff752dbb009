"""Integer helpers of the layout arithmetic: powers of two, divisors."""

from __future__ import annotations

from functools import lru_cache


def is_power_of_two(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


def divisors(n: int) -> list[int]:
    """All positive divisors of n, ascending (from its prime factors: fast for the worlds of
    huge machines, 2^44 ranks included; cached, so callers must not mutate the list)."""
    return list(_divisors(n))


@lru_cache(maxsize=1024)
def _divisors(n: int) -> tuple[int, ...]:
    out = [1]
    for p, k in _factorise(n).items():
        out = [d * p**e for d in out for e in range(k + 1)]
    return tuple(sorted(out))


def _factorise(n: int) -> dict[int, int]:
    factors: dict[int, int] = {}
    p = 2
    while p * p <= n:
        while n % p == 0:
            factors[p] = factors.get(p, 0) + 1
            n //= p
        p += 1 if p == 2 else 2
    if n > 1:
        factors[n] = factors.get(n, 0) + 1
    return factors
