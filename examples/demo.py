"""`make demo`: start the local stack, train examples/digits.yaml end to end, print what happened.

Exits 0 only if the job SUCCEEDED with validation accuracy >= 0.95.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / ".demo"
MIN_ACCURACY = 0.95


def main() -> int:
    from trainjobs.client import Client
    from trainjobs.loopback import free_port

    shutil.rmtree(DEMO / "machines", ignore_errors=True)
    env = {**os.environ, "TRAINJOBS_HOME": str(DEMO / "home")}
    for var in ("TRAINJOBS_DATABASE_URL", "STORAGE_EMULATOR_HOST", "TRAINJOBS_BUCKET"):
        env.pop(var, None)  # the demo always runs the embedded stack
    port = free_port()
    print(f"starting the local stack (embedded PostgreSQL, GCS emulator, API :{port}, worker) in {DEMO}")
    DEMO.mkdir(exist_ok=True)
    log = DEMO / "stack.log"
    with log.open("w") as out:  # a file, not a pipe: a full pipe would stall the stack
        stack = subprocess.Popen([sys.executable, "-m", "stack.cli", "up", "--port", str(port),
                                  "--data-dir", str(DEMO)], env=env, stderr=out, stdout=out, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while "\nready\n" not in log.read_text():
            if stack.poll() is not None or time.monotonic() > deadline:
                print(f"the stack did not start; its log:\n{log.read_text()[-3000:]}")
                return 1
            time.sleep(0.2)
        # Whether the job will run in a sandbox, as the stack said at start-up (worker/local/sandbox.py).
        print(next((line.split(": ", 1)[-1] for line in log.read_text().splitlines() if "local machines run" in line),
                   "(the stack did not say how local machines are isolated)"))
        os.environ["TRAINJOBS_HOME"] = env["TRAINJOBS_HOME"]
        return run_job(Client())
    finally:
        stack.terminate()  # `up` stops what it started: worker, API, machines, emulator, PostgreSQL
        try:
            stack.wait(60)
        except subprocess.TimeoutExpired:
            stack.kill()
            stack.wait()
        if stack.returncode != 0:  # it did not stop by itself: stop what it left behind
            subprocess.run([sys.executable, "-m", "stack.cli", "down", "--data-dir", str(DEMO)], env=env, cwd=ROOT)


def run_job(client) -> int:  # type: ignore[no-untyped-def]
    from trainjobs.client.terminal import job_detail, show as show_job

    spec = yaml.safe_load((ROOT / "examples" / "digits.yaml").read_text())
    job = client.submit(spec)
    print(f"submitted job {job['id']} ({spec['name']}): {spec['strategy']} over {spec['accelerator']['replicas']} "
          f"CPU replicas, {spec['precision']}")
    t0 = time.monotonic()

    def show(j):  # type: ignore[no-untyped-def]
        m = j.get("metrics") or {}
        extra = f"  epoch {m['epoch']}  val_accuracy {m.get('val_accuracy', 0):.3f}" if "epoch" in m else ""
        pct = f" {j['progress'] * 100:3.0f}%" if j.get("progress") is not None else ""
        print(f"  [{time.monotonic() - t0:6.1f}s] {j['status']:<12}{pct}{extra}")

    job = client.wait(job["id"], timeout=1800, poll=1.0, on_update=show)
    print("\ntransitions:")
    for e in client.events(job["id"]):
        print(f"  {e['from_status'] or '-':>12} -> {e['to_status']:<12} {e['reason']}")
    if job["status"] != "SUCCEEDED":
        print(f"\njob ended {job['status']}: {job['error']}")
        print(client.logs(job["id"])[-3000:])
        return 1
    m = job["metrics"] or {}
    print()
    show_job(job_detail(job))  # what `trainjobs status` prints: runtime, notes, final metrics, models, advice
    tflite = m.get("tflite_accuracy")
    tflite_text = f"{tflite:.4f}" if isinstance(tflite, float) else str(tflite)
    print(f"validation accuracy: {m.get('val_accuracy'):.4f} (Keras), TFLite int8: {tflite_text}")
    print("artifacts:")
    listing = client.artifacts(job["id"])
    for a in listing["artifacts"]:
        print(f"  {a['size']:>10}  {a['sha256'][:12]}  {a['path']}")
    target = DEMO / "artifacts" / job["id"]
    files = client.download_artifacts(job["id"], target)
    print(f"downloaded {len(files)} artifact(s) to {target}")
    ok = float(m.get("val_accuracy", 0)) >= MIN_ACCURACY
    print("demo OK" if ok else f"demo FAILED: accuracy below {MIN_ACCURACY}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
