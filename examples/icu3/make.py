"""Write the bundled 3-class synthetic ICU sample's outcomes (examples/icu3/outcomes.csv.gz)
from the synthetic ICU sample of examples/icu (its observations are shared, not copied).

The file is committed; this script documents how it was made and reproduces it byte for
byte (gzip with no name and a zero timestamp):

    .venv/bin/python examples/icu3/make.py

The outcome ``discharge`` of each of the 2,000 stays, one of three classes, by a fixed
rule on examples/icu's files (synthetic data: no real stay behind it): ``died`` where
examples/icu's outcome ``died`` is ``yes``; otherwise ``ward`` where the stay's lactate
observed in its last 24 hours averages above 2 mmol/L (the public reference mean of
examples/icu/schema.yaml), else ``home`` (no lactate observed then included).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # examples/reproducible.py (script or loaded by path)
from reproducible import write_sample  # noqa: E402

ICU = HERE.parent / "icu"
OUT = HERE / "outcomes.csv.gz"
LACTATE_MEAN = 2.0  # mmol/L: examples/icu/schema.yaml's public mean
LATE_HOURS = 24.0  # the last 24 of the 48 hours


def outcomes_text() -> str:
    """The CSV: ``stay_id,discharge``, one line per stay, in examples/icu's order."""
    obs = pd.read_csv(ICU / "observations.csv.gz")
    died = pd.read_csv(ICU / "outcomes.csv.gz")
    late = obs[(obs["variable"] == "lactate") & (obs["time"] >= 48.0 - LATE_HOURS)]
    lactate = late.groupby("stay_id")["value"].mean()
    high = died["stay_id"].map(lactate).fillna(0.0) > LACTATE_MEAN
    discharge = [
        "died" if d == "yes" else ("ward" if h else "home")
        for d, h in zip(died["died"], high, strict=True)
    ]
    lines = ["stay_id,discharge"] + [
        f"{s},{c}" for s, c in zip(died["stay_id"], discharge, strict=True)
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    write_sample(OUT, outcomes_text)


if __name__ == "__main__":
    main()
