"""Random regexes over a given set of atoms, for comparing the compiled constraint core with
its Python reference on many shapes (concatenations, alternations, counted and open
repetitions, nested up to four levels)."""
from __future__ import annotations

import random

QUANTIFIERS = ("*", "+", "?", "{2,5}", "{0,3}", "{3}", "{1,12}")


def random_regex(rng: random.Random, atoms, quantifiers=QUANTIFIERS, depth: int = 0) -> str:
    roll = rng.random()
    if depth > 3 or roll < 0.35:
        return rng.choice(atoms)
    if roll < 0.6:
        return "".join(random_regex(rng, atoms, quantifiers, depth + 1)
                       for _ in range(rng.randint(2, 4)))
    if roll < 0.75:
        return "(" + "|".join(random_regex(rng, atoms, quantifiers, depth + 1)
                              for _ in range(rng.randint(2, 3))) + ")"
    return "(" + random_regex(rng, atoms, quantifiers, depth + 1) + ")" + rng.choice(quantifiers)
