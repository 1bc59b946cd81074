"""A census-like table (issue 21's tabular columns): numbers, categories and a free-text column, the
label a rule over all three with noise, so no one kind of column predicts it alone.

Columns: age, workclass (4 values), education (6), city (40 values, one cell in 25 missing),
hours-per-week, "native country" (a header with a space: not a valid input name as is), notes (a few
words from a pool, some of which move the odds) and income, '>50K' or '<=50K'. Rows are drawn from a
seeded generator: `census(n, seed)` with another seed gives held-out rows from the same population.
"""

from __future__ import annotations

import csv
import io

import numpy as np

WORKCLASS = {"Private": 0.0, "Self-emp": 0.6, "Government": 0.3, "Without-pay": -2.0}
EDUCATION = {"HS-grad": -0.8, "Some-college": -0.3, "Bachelors": 0.6, "Masters": 1.1, "Doctorate": 1.6, "11th": -1.6}
CITIES = [f"City{i:02d}" for i in range(40)]
CITY_EFFECT = {c: (1.2 if i % 5 == 0 else -0.3) for i, c in enumerate(CITIES)}
COUNTRIES = ["United-States", "Mexico", "India", "Germany", "Philippines"]
GOOD_WORDS = ["promoted", "manager", "bonus", "senior"]
BAD_WORDS = ["laid-off", "part-time", "seasonal", "intern"]
NEUTRAL_WORDS = ["works", "in", "the", "office", "team", "since", "years", "with", "a", "local", "company"]
HEADER = ["age", "workclass", "education", "city", "hours-per-week", "native country", "notes", "income"]


def rows(n: int, seed: int) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        age = int(rng.integers(18, 80))
        work = str(rng.choice(list(WORKCLASS), p=[0.6, 0.15, 0.2, 0.05]))
        edu = str(rng.choice(list(EDUCATION)))
        city = str(rng.choice(CITIES))
        hours = int(np.clip(rng.normal(40, 10), 5, 90))
        country = str(rng.choice(COUNTRIES))
        good, bad = int(rng.integers(0, 3)), int(rng.integers(0, 3))
        words = list(rng.choice(NEUTRAL_WORDS, 4)) + list(rng.choice(GOOD_WORDS, good)) + list(rng.choice(BAD_WORDS, bad))
        rng.shuffle(words)
        note = " ".join(words).capitalize() + "."
        logit = (0.04 * (age - 40) + WORKCLASS[work] + EDUCATION[edu] + CITY_EFFECT[city] + 0.03 * (hours - 40)
                 + 0.9 * good - 0.9 * bad - 0.3 + rng.normal(0, 0.5))
        income = ">50K" if logit > 0 else "<=50K"
        out.append([str(age), work, edu, "" if rng.random() < 0.04 else city, str(hours), country, note, income])
    return out


def census(n: int, seed: int) -> bytes:
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(HEADER)
    writer.writerows(rows(n, seed))
    return text.getvalue().encode()
