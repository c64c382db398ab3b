"""Write the bundled synthetic ICU sample (examples/icu/) from worker/synthetic_icu.py.

The files are committed; this script documents how they were made and reproduces them:

    PYTHONPATH=. .venv/bin/python examples/icu/generate.py

``observations.csv.gz``: long format, one observation per line (stay_id, time in hours
since admission, variable, value); ``outcomes.csv.gz``: one line per stay (stay_id,
died). Times are the generator's hourly grid plus a uniform offset inside the hour, so
they look irregular but bin back to the same hour; values are rounded to 2 decimals.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pandas as pd

from worker.synthetic_icu import generate_icu

HERE = Path(__file__).resolve().parent
STAYS = 2000
HOURS = 48
SEED = 20261123


def main() -> None:
    rng = np.random.default_rng(SEED)
    series = generate_icu(STAYS, hours=HOURS, rng=rng)
    stay, hour, var = np.nonzero(series.masks)
    ids = np.array([f"icu-{i:05d}" for i in range(STAYS)])
    time = hour + np.floor(rng.random(len(hour)) * 60) / 60  # a minute inside the hour
    observations = pd.DataFrame(
        {
            "stay_id": ids[stay],
            "time": np.round(time, 4),
            "variable": np.array(series.schema.names)[var],
            "value": np.round(series.values[stay, hour, var].astype(np.float64), 2),
        }
    )
    outcomes = pd.DataFrame({"stay_id": ids, "died": np.where(series.labels > 0, "yes", "no")})
    for name, frame in (("observations", observations), ("outcomes", outcomes)):
        # mtime=0: the same bytes on every run.
        with gzip.GzipFile(HERE / f"{name}.csv.gz", "wb", mtime=0) as fh:
            fh.write(frame.to_csv(index=False).encode())


if __name__ == "__main__":
    main()
