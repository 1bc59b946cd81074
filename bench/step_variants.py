"""Ways to run the same training steps, timed in turns (issue 24): one warm process per variant, each
training one epoch when its turn comes, round after round. On a shared 2-core VM one process's speed
drifts 1.5-2x over minutes, so variants timed minutes apart, or in processes started one after another,
cannot be compared; here every round times each variant within seconds of the others, and each ratio
is taken within its round.

A variant is a JSON object:
- `model`: a built-in model (cnn on 8x8x1 images, mlp on 64 features; the bench's shapes and batch 128);
- `feed`: `numpy` (numpy arrays into fit, as bench/naive_script.py; its own tf.data pipeline with the
  autotuner on), `cached` (batches cached in tf.data, no shuffle: a floor for the input's cost),
  `memory` (agent/data.py's pipeline for a split held in memory, and the input-wait meter, as a job
  has them), `per_batch` (the pipeline `memory` replaced: tf.data shuffling the indices one by one,
  4 gathers in parallel);
- `meter`: how the input's wait is timed: `graph` (agent/input_wait.py: the agent's train function
  fetches through it, as a job does; the default for `memory` and `per_batch`), `tf.data` (the meter
  it replaced: a zip with a clock and a map after the pipeline, with the agent's train function), or
  false (Keras' own train function, nothing timed);
- `spe`: steps per call (16 unless given; `numpy` is fed with 1 unless given);
- `intra`, `inter`: TensorFlow's thread pools (its defaults unless given).

Reported per variant: the median of its rounds' ms per step (the epoch's wall time, fit's loop
included), its CPU ms per step, and the median of its per-round ratio to the first variant.

Usage: python bench/step_variants.py [--rounds 10] [VARIANT_JSON ...]
With no variants: the naive script's feed, the job's memory feed, the per-batch feed it replaced, and
cached batches, all on the cnn.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT = [{"name": "numpy", "feed": "numpy", "spe": 1}, {"name": "memory", "feed": "memory"},
           {"name": "per_batch", "feed": "per_batch"}, {"name": "cached", "feed": "cached"}]
BATCH = 128


def child(variant: dict) -> None:
    sys.path.insert(0, str(REPO))
    import numpy as np
    import tensorflow as tf

    if "intra" in variant:
        tf.config.threading.set_intra_op_parallelism_threads(int(variant["intra"]))
    if "inter" in variant:
        tf.config.threading.set_inter_op_parallelism_threads(int(variant["inter"]))
    import keras

    from agent.builtin_models import BUILTIN_BUILDERS
    from agent.data import memory_batches
    from agent.input_wait import InputWaitMeter
    from agent.models import ModelInputs
    from agent.step_functions import install_step_functions

    rng = np.random.default_rng(0)
    name = variant.get("model", "cnn")
    x = (rng.integers(0, 17, (24_064, 8, 8, 1)) if name == "cnn" else rng.standard_normal((80_000, 64))).astype("float32")
    y = rng.integers(0, 10, len(x))
    axes = tuple(range(x.ndim - 1))
    keras.utils.set_random_seed(7)
    model = BUILTIN_BUILDERS[name](ModelInputs(x.shape[1:], 10, {}, tuple(x.mean(axis=axes).tolist()),
                                               tuple(x.var(axis=axes).tolist())))
    feed = variant.get("feed", "memory")
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  steps_per_execution=int(variant.get("spe", 1 if feed == "numpy" else 16)))
    steps = len(x) // BATCH
    options = tf.data.Options()
    options.autotune.enabled = False
    if feed == "numpy":
        def run() -> None:
            model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    else:
        if feed == "cached":
            data = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True).cache().repeat()
        else:
            xt, yt = tf.constant(x), tf.constant(y)
            if feed == "memory":  # the job's own pipeline, its prefetch and options included
                data = memory_batches(xt, yt, BATCH, 7)
            elif feed == "per_batch":
                data = tf.data.Dataset.range(len(x)).shuffle(len(x), seed=7, reshuffle_each_iteration=True).repeat() \
                    .batch(BATCH, drop_remainder=True).map(lambda i: (tf.gather(xt, i), tf.gather(yt, i)),
                                                           num_parallel_calls=4)
            else:
                raise SystemExit(f"unknown feed {feed!r}")
        if feed != "memory":
            data = data.prefetch(8).with_options(options)
        meter = variant.get("meter", "graph" if feed in ("memory", "per_batch") else False)
        train_function = None
        if meter:
            waits = InputWaitMeter()
            train_function = install_step_functions(model, model.steps_per_execution, waits if meter == "graph" else None)
            if meter == "tf.data":
                data = _tf_data_meter(data, waits)

        def run() -> None:
            if train_function is not None:
                train_function.start_epochs(steps)
            model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
    run()  # traces
    print("ready", flush=True)
    for _ in sys.stdin:
        began, cpu = time.perf_counter(), time.process_time()
        run()
        print(json.dumps({"ms": 1000 * (time.perf_counter() - began) / steps,
                          "cpu_ms": 1000 * (time.process_time() - cpu) / steps}), flush=True)


def _tf_data_meter(dataset, waits):
    """The input-wait meter before 2026-12-07, as it was: the finished pipeline zipped with a clock, and a
    map that adds each batch's wait to the meter's variable."""
    import tensorflow as tf

    clock = tf.data.Dataset.from_tensors(0).repeat().map(lambda _: tf.timestamp())

    def record(asked_at, batch):
        added = waits._waited_s.assign_add(tf.timestamp() - asked_at)
        with tf.control_dependencies([added]):
            return tf.nest.map_structure(tf.identity, batch)

    options = tf.data.Options()
    options.experimental_optimization.map_parallelization = False
    options.experimental_optimization.inject_prefetch = False
    return tf.data.Dataset.zip((clock, dataset)).map(record).with_options(options)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("variants", nargs="*")
    args = ap.parse_args()
    if args.child:
        return child(json.loads(args.child))
    variants = [json.loads(v) for v in args.variants] or DEFAULT
    names = [v.get("name") or json.dumps(v, sort_keys=True) for v in variants]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    procs = []
    try:
        for v in variants:
            p = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(v)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
            while (line := p.stdout.readline()) and line.strip() != "ready":
                pass
            if not line:
                raise SystemExit(f"variant {v} did not start")
            procs.append(p)
        ms: list[list[float]] = [[] for _ in variants]
        cpu: list[list[float]] = [[] for _ in variants]
        for r in range(args.rounds):
            for i, p in enumerate(procs):
                p.stdin.write("go\n")
                p.stdin.flush()
                out = json.loads(p.stdout.readline())
                ms[i].append(out["ms"])
                cpu[i].append(out["cpu_ms"])
            print(json.dumps({"round": r + 1, **{n: round(m[-1], 2) for n, m in zip(names, ms)}}), flush=True)
        for n, m, c in zip(names, ms, cpu):
            ratios = [a / b for a, b in zip(ms[0], m)]
            print(json.dumps({"variant": n, "median_ms_per_step": round(statistics.median(m), 2),
                              "median_cpu_ms_per_step": round(statistics.median(c), 2),
                              f"median_speedup_vs_{names[0]}": round(statistics.median(ratios), 3),
                              "range": [round(min(ratios), 3), round(max(ratios), 3)]}), flush=True)
    finally:
        for p in procs:
            p.stdin.close()
            p.wait()


if __name__ == "__main__":
    main()
