"""Small tables (issue 37): the built-in mlp with nothing set but the epochs, against scikit-learn's linear
and tree baselines on the same held-out rows, before and after the small-table defaults, in one run.

Tables, as scikit-learn ships them (its load_* functions read the files inside the package; nothing is
downloaded): diabetes (442 rows, regression), breast_cancer (569, binary), wine (178, 3 classes), iris
(150, 3 classes), digits as a table (1797 rows of 64 pixel columns, 10 classes).

For each table and split seed: 20% of the rows are held out (stratified by class; sklearn's
train_test_split with the seed), never uploaded; the rest is a CSV uploaded to the product, which
stages its own validation split from it (the default 20%). Two jobs on each upload, both submitted
through the client to `trainjobs up` (bench/up.py: API, worker, local provisioner):
- `new`: {"model": {"name": "mlp"}, "training": {"epochs": E}}: what a user who sets nothing gets;
- `old`: the same with the defaults before issue 37 written out (hidden_units [128, 64], dropout 0.1,
  per_replica_batch_size 32, learning_rate 0.001, early_stopping false), which explicit settings keep.
Each is judged from its downloaded SavedModel on the held-out rows: R² (regression), else accuracy
(AUC too for binary). The baselines are fitted on every uploaded row (the job's training and validation
splits together) and scored on the same held-out rows: linear (LinearRegression, or StandardScaler +
LogisticRegression) and tree (RandomForest, 300 trees).

Printed: one line per (table, split, epochs) and a summary per (table, epochs) with the means over the
splits of each score and of new - linear, old - linear, new - tree, and the runtime notes a `new` job
gave. One split of a 150-row table holds out 30 rows (one row: 0.033 of accuracy), so read the means.

Usage: TRAINJOBS_TEST_DATABASE_URL=postgresql://... python bench/small_tables.py
       [--tables diabetes,breast_cancer,wine,iris,digits] [--splits 3] [--epochs 10,60] [--concurrency 2]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from bench.small_job_bench import empty_database  # noqa: E402
from bench.up import TrainjobsUp  # noqa: E402
from stack.embedded import start_gcs_emulator, use_emulator  # noqa: E402

BUCKET = "trainjobs-smalltables"
TASKS = {"diabetes": "regression", "breast_cancer": "binary", "wine": "classification", "iris": "classification",
         "digits": "classification"}
# The settings issue 37's defaults replaced, written out: what a job without them trained with before.
OLD_PARAMS: dict[str, Any] = {"hidden_units": [128, 64], "dropout": 0.1}
OLD_TRAINING: dict[str, Any] = {"per_replica_batch_size": 32, "learning_rate": 0.001, "early_stopping": False}


def load(table: str) -> tuple[np.ndarray, np.ndarray]:
    from sklearn import datasets

    if table == "diabetes":  # the raw file: ages in years, not the scaled copy load_diabetes returns by default
        x, y = datasets.load_diabetes(return_X_y=True, scaled=False)
    else:
        x, y = getattr(datasets, f"load_{table}")(return_X_y=True)
    return np.asarray(x, dtype=np.float64), np.asarray(y)


def held_out(table: str, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(uploaded x, y, held-out x, y): 20% held out, by class where there are classes."""
    from sklearn.model_selection import train_test_split

    x, y = load(table)
    stratify = None if TASKS[table] == "regression" else y
    xu, xt, yu, yt = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=stratify)
    return xu, yu, xt, yt


def write_csv(path: Path, x: np.ndarray, y: np.ndarray) -> Path:
    header = ",".join([*(f"f{i}" for i in range(x.shape[1])), "label"])
    rows = [",".join([*(f"{v:.8g}" for v in row), f"{t:.8g}" if isinstance(t, float) else str(t)])
            for row, t in zip(x, y.tolist(), strict=True)]
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def spec(table: str, epochs: int, old: bool) -> dict[str, Any]:
    model: dict[str, Any] = {"name": "mlp"}
    training: dict[str, Any] = {"epochs": epochs}
    if old:
        model["params"] = OLD_PARAMS
        training.update(OLD_TRAINING)
    return {"name": f"small-{table}-{'old' if old else 'new'}-{epochs}", "task": TASKS[table],
            "accelerator": {"type": "cpu"}, "model": model, "training": training}


def scores(task: str, predicted: np.ndarray, y: np.ndarray) -> dict[str, float]:
    from sklearn.metrics import accuracy_score, r2_score, roc_auc_score

    if task == "regression":
        return {"r2": float(r2_score(y, predicted.reshape(-1)))}
    if task == "binary":
        p = predicted.reshape(-1)
        return {"accuracy": float(accuracy_score(y, p > 0.5)), "auc": float(roc_auc_score(y, p))}
    return {"accuracy": float(accuracy_score(y, predicted.argmax(axis=-1)))}


def baselines(task: str, xu: np.ndarray, yu: np.ndarray, xt: np.ndarray, yt: np.ndarray) -> dict[str, dict[str, float]]:
    from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor
    from sklearn.linear_model import LinearRegression, LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if task == "regression":
        models = {"linear": LinearRegression(), "tree": RandomForestRegressor(300, random_state=0)}
        return {k: scores(task, m.fit(xu, yu).predict(xt), yt) for k, m in models.items()}
    models = {"linear": make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000)),
              "tree": RandomForestClassifier(300, random_state=0)}
    out = {}
    for k, m in models.items():
        p = m.fit(xu, yu).predict_proba(xt)
        out[k] = scores(task, p[:, 1] if task == "binary" else p, yt)
    return out


def served(saved_model: Path, x: np.ndarray) -> np.ndarray:
    import tensorflow as tf

    loaded = tf.saved_model.load(str(saved_model))  # held: its functions need its variables
    return np.asarray(loaded.serve(tf.constant(x.astype(np.float32))).numpy())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tables", default=",".join(TASKS))
    ap.add_argument("--splits", type=int, default=3)
    ap.add_argument("--epochs", default="10,60")
    ap.add_argument("--concurrency", type=int, default=2)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `finally` stops the stack
    scratch = Path(tempfile.mkdtemp(prefix="smalltables-"))
    emulator = start_gcs_emulator(None, bucket=BUCKET)
    stack = None
    try:
        use_emulator(emulator, BUCKET)
        os.environ["TRAINJOBS_BUCKET"] = BUCKET
        stack = TrainjobsUp(empty_database("trainjobs_smalltables"), scratch, concurrency=args.concurrency)
        client = stack.client
        cases = []  # every job submitted at once: the stack runs `concurrency` at a time
        for table in args.tables.split(","):
            for seed in range(args.splits):
                xu, yu, xt, yt = held_out(table, seed)
                uploaded = client.upload_dataset(write_csv(scratch / f"{table}-{seed}.csv", xu, yu))["dataset"]
                base = baselines(TASKS[table], xu, yu, xt, yt)
                for epochs in (int(e) for e in args.epochs.split(",")):
                    jobs = {}
                    for old in (False, True):
                        job_spec = spec(table, epochs, old) | {"dataset": {"source": uploaded}}
                        jobs["old" if old else "new"] = client.submit(job_spec)["id"]
                    cases.append((table, seed, epochs, xt, yt, base, jobs))
        rows: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for table, seed, epochs, xt, yt, base, jobs in cases:
            row: dict[str, Any] = {"table": table, "split": seed, "epochs": epochs, **base}
            for name, job_id in jobs.items():
                job = client.wait(job_id, timeout=3600, poll=1.0)
                if job["status"] != "SUCCEEDED":
                    raise RuntimeError(f"{table} {name}: job {job['status']}: {job.get('error')}")
                out = scratch / job_id
                client.download_artifacts(job_id, out)
                row[name] = scores(TASKS[table], served(out / "saved_model", xt), yt)
                row[f"{name}_epochs_trained"] = len(json.loads((out / "history.json").read_text()))
                if name == "new":
                    row["new_notes"] = [n for n in job["runtime"].get("notes", []) if "small table" in n]
            key = "r2" if TASKS[table] == "regression" else "accuracy"
            row |= {"new_minus_linear": round(row["new"][key] - row["linear"][key], 4),
                    "old_minus_linear": round(row["old"][key] - row["linear"][key], 4),
                    "new_minus_tree": round(row["new"][key] - row["tree"][key], 4)}
            rows.setdefault((table, epochs), []).append(row)
            print(json.dumps(row), flush=True)
        for (table, epochs), rs in rows.items():
            key = "r2" if TASKS[table] == "regression" else "accuracy"
            mean = {f"mean_{k}": round(statistics.mean(r[k][key] for r in rs), 4) for k in ("new", "old", "linear", "tree")}
            diff = {f"mean_{k}": round(statistics.mean(r[k] for r in rs), 4)
                    for k in ("new_minus_linear", "old_minus_linear", "new_minus_tree")}
            worst = {"worst_new_minus_linear": min(r["new_minus_linear"] for r in rs),
                     "worst_old_minus_linear": min(r["old_minus_linear"] for r in rs)}
            print(json.dumps({"summary": table, "epochs": epochs, "splits": len(rs), "score": key, **mean, **diff,
                              **worst, "new_notes": rs[0]["new_notes"]}), flush=True)
    finally:
        if stack is not None:
            stack.stop()
        emulator.stop()


if __name__ == "__main__":
    main()
