"""What the CLI's client verbs print: the jobs table, a job's detail, per-epoch metrics, the live
view of a job being followed (a rich progress bar on a terminal, one line per change elsewhere), and a
sweep's summary with its trials ranked by the objective.

Only formatting lives here; talking to the API is trainjobs/client/api.py, the verbs are trainjobs/client/cli.py.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timedelta, timezone
from typing import Any

from rich.console import Console, Group
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from trainjobs.client import step_time

UTC = timezone.utc  # datetime.UTC is 3.11+; the agent's wheel runs on the VM images' Python 3.10

PHASES = (("created", "created_at"), ("staging", "staging_at"), ("provisioning", "provisioning_at"),
          ("running", "running_at"), ("finished", "finished_at"))
EPOCH_COLUMNS = (("epoch", "epoch", "{}"), ("loss", "loss", "{:.4f}"), ("accuracy", "accuracy", "{:.4f}"),
                 ("val loss", "val_loss", "{:.4f}"), ("val acc", "val_accuracy", "{:.4f}"),
                 ("examples/s", "examples_per_sec", "{:,.0f}"), ("step ms", "step_time_ms", "{:.1f}"),
                 ("input wait", "input_wait_fraction", "{:.0%}"))
# Other tasks' metrics (issue 21), shown after the loss columns when a job reports them.
TASK_COLUMNS = (("mae", "mae", "{:.4g}"), ("r2", "r2", "{:.4f}"), ("auc", "auc", "{:.4f}"),
                ("val mae", "val_mae", "{:.4g}"), ("val r2", "val_r2", "{:.4f}"), ("val auc", "val_auc", "{:.4f}"))


def epoch_columns(epochs: list[dict[str, Any]]) -> tuple[tuple[str, str, str], ...]:
    """EPOCH_COLUMNS, less accuracy where no epoch has one, plus the task metrics some epoch has."""
    has = {k for rec in epochs for k, v in rec.items() if v is not None}
    base = [c for c in EPOCH_COLUMNS if c[1] not in ("accuracy", "val_accuracy") or c[1] in has]
    extra = [c for c in TASK_COLUMNS if c[1] in has]
    return (*base[:-3], *extra, *base[-3:])


def console(stderr: bool = False) -> Console:
    """Colour and live display on a terminal; plain wide lines in a pipe or file, so nothing a script
    reads is wrapped at 80 columns or carries escape codes."""
    stream = sys.stderr if stderr else sys.stdout
    tty = stream.isatty()
    return Console(file=stream, width=None if tty else 200, no_color=not tty, highlight=False, soft_wrap=not tty)


def show(renderable: Any) -> None:
    """A table or text on stdout; in a pipe, without the spaces rich pads each line with."""
    out = console()
    if out.is_terminal:
        out.print(renderable)
        return
    with out.capture() as captured:
        out.print(renderable)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))
    sys.stdout.flush()


def emit_json(obj: Any) -> None:
    """One JSON object per line: what --output json prints, and what a stream prints per event."""
    sys.stdout.write(json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def _at(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def age(value: str | None, now: datetime | None = None) -> str:
    at = _at(value)
    if at is None:
        return "-"
    return duration((now or datetime.now(UTC)) - at)


def duration(delta: Any) -> str:
    s = int(max(0, delta.total_seconds()))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def accelerator(job: dict[str, Any]) -> str:
    acc = (job.get("spec") or {}).get("accelerator") or {"type": "cpu"}
    if acc.get("type") == "tpu":
        return f"tpu {acc.get('tpu_type')}" + (" spot" if acc.get("spot") else "")
    if acc.get("type") == "gpu":
        return f"gpu {acc.get('gpu_type')} x{acc.get('count', 1)}" + (" spot" if acc.get("spot") else "")
    return f"cpu x{acc.get('replicas', 1)}"


def val_metric(job: dict[str, Any]) -> str:
    m = job.get("metrics") or {}
    for key in ("val_accuracy", "val_r2", "val_loss", "accuracy", "r2", "loss"):
        if isinstance(m.get(key), int | float):
            return f"{key} {m[key]:.4f}"
    return "-"


def progress(job: dict[str, Any]) -> str:
    return f"{job['progress'] * 100:.0f}%" if job.get("progress") is not None else "-"


def one_line(job: dict[str, Any]) -> str:
    """The job in one line: what `submit` and `cancel` print."""
    err = f"  error: {job['error']}" if job.get("error") else ""
    wait = f"  ({job['wait_reason']})" if job.get("wait_reason") else ""
    return f"{job['id']}  {job['status']:<12} {progress(job):>4}  {job['name']}{wait}{err}"


def jobs_table(jobs: list[dict[str, Any]]) -> Table | str:
    if not jobs:
        return "no jobs"
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in ("ID", "NAME", "STATUS", "ACCELERATOR", "PROGRESS", "AGE", "VAL METRIC"):
        table.add_column(name, no_wrap=True)
    now = datetime.now(UTC)
    for job in jobs:
        table.add_row(job["id"], job["name"], job["status"], accelerator(job), progress(job),
                      age(job.get("created_at"), now), val_metric(job))
    return table


def job_detail(job: dict[str, Any], events: list[dict[str, Any]] | None = None) -> Table:
    """`status`: what a person asks of a job, without flags: where it is, since when, how it runs, how
    it is doing."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    grid.add_row("job", f"{job['id']}  {job['name']}")
    status = job["status"] + (f" (attempt {job['attempt']})" if job.get("attempt") else "")  # 0: never started
    if job.get("wait_reason"):
        status += f": {job['wait_reason']}"
    grid.add_row("status", status)
    if job.get("error"):
        grid.add_row("error", job["error"])
    grid.add_row("accelerator", accelerator(job))
    if job.get("labels"):
        grid.add_row("labels", ", ".join(f"{k}={v}" for k, v in sorted(job["labels"].items())))
    grid.add_row("progress", progress(job))
    grid.add_row("phases", _phases(job))
    if rt := job.get("runtime"):
        grid.add_row("runtime", _runtime(rt))
        if isinstance(rt.get("dataset"), dict) and (data := _dataset(rt["dataset"])):
            grid.add_row("", f"data: {data}")
        for note in rt.get("notes") or []:
            grid.add_row("", f"note: {note}")
    if m := job.get("metrics"):
        shown_apart = (MODELS, step_time.BREAKDOWN, step_time.PROFILE)
        rest = {k: v for k, v in m.items() if v is not None and k not in shown_apart}
        grid.add_row("metrics", metrics_grid({k: v for k, v in rest.items() if not isinstance(v, dict | list)}))
        for k, v in rest.items():  # a record of its own (pruning, distillation, class weights...): a line each
            if isinstance(v, dict | list):
                grid.add_row(k.replace("_", " "), Text(_fmt(v)))
        if isinstance(rows := m.get(MODELS), list) and rows:
            grid.add_row("models", models_table(rows))
        if isinstance(b := m.get(step_time.BREAKDOWN), dict) and b:
            grid.add_row("step time", step_time.breakdown_table(b))
        if isinstance(p := m.get(step_time.PROFILE), dict):
            grid.add_row("profile", step_time.profile_line(p))
    for title, line in advice_rows(job.get("advice")):
        grid.add_row(title, line)
    for e in events or []:
        grid.add_row("event", f"{e['at']}  {e['from_status'] or '-':>12} -> {e['to_status']:<12} {e['reason']}")
    return grid


# The final metrics' names shown first, in this order: the ones each epoch reports (EPOCH_COLUMNS and
# TASK_COLUMNS), then the rest by name.
_FIRST = ("epoch", "loss", "accuracy", "val_loss", "val_accuracy", "mae", "r2", "auc", "val_mae", "val_r2", "val_auc")


def metrics_grid(m: dict[str, Any], per_row: int = 3) -> Text:
    """The final metrics' scalars as aligned `name value` pairs, `per_row` to a line (not one wrapped
    line); a long text (early_stopping's reason) on a line of its own after them."""
    names = [k for k in _FIRST if k in m] + sorted(k for k in m if k not in _FIRST)
    short = [k for k in names if len(_fmt(m[k])) <= 24]
    cells = [f"{k} {_fmt(m[k])}" for k in short]
    widths = [max((len(c) for c in cells[col::per_row]), default=0) for col in range(per_row)]
    lines = ["  ".join(c.ljust(widths[i % per_row]) for i, c in enumerate(cells[r:r + per_row])).rstrip()
             for r in range(0, len(cells), per_row)]
    lines += [f"{k} {_fmt(m[k])}" for k in names if k not in short]
    return Text("\n".join(lines))


def advice_rows(advice: Any) -> list[tuple[str, Text]]:
    """The advisor's advice (trainjobs/advice.py), three lines each: the rule and what to change, the
    numbers behind it, the gain they bound. As plain Text: nothing in it is read as rich markup."""
    rows: list[tuple[str, Text]] = []
    for a in advice if isinstance(advice, list) else []:
        if not isinstance(a, dict):
            continue
        evidence = a["evidence"] if isinstance(a.get("evidence"), dict) else {}
        rows += [("advice", Text(f"{a.get('rule')}: {a.get('suggestion')}")),
                 ("", Text("  because " + ", ".join(f"{k} {_fmt(v)}" for k, v in evidence.items()))),
                 ("", Text(f"  gain {a.get('expected_gain')}"))]
    return rows


# The final metrics' comparison of every model the job exported (agent/optimization.py: summary).
MODELS = "optimization"
_MODEL_FIELDS = {"name", "format", "quantization", "bytes", "gzip_bytes", "params", "sparsity", "latency_ms_1",
                 "latency_ms_32"}


def models_table(rows: list[dict[str, Any]]) -> Table:
    """One row per exported model: its score on the validation examples, sizes, weights, CPU latency."""
    scores = [k for k in rows[0] if k not in _MODEL_FIELDS]
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("MODEL", no_wrap=True)
    table.add_column("QUANT", no_wrap=True)
    for title in [*(s.upper() for s in scores), "SIZE", "GZIP", "PARAMS", "SPARSITY", "1 EX", "32 EX"]:
        table.add_column(title, justify="right", no_wrap=True)
    for r in rows:
        table.add_row(str(r.get("name")), str(r.get("quantization")), *(_fmt(r.get(s)) for s in scores),
                      _size(r.get("bytes")), _size(r.get("gzip_bytes")), _fmt(r.get("params")),
                      _percent(r.get("sparsity")), _ms(r.get("latency_ms_1")), _ms(r.get("latency_ms_32")))
    return table


def _size(n: Any) -> str:
    if not isinstance(n, int | float):
        return "-"
    if n < 1024:
        return f"{n:.0f} B"
    return f"{n / 1024:.1f} KiB" if n < 1024 ** 2 else f"{n / 1024 ** 2:.1f} MiB"


def _percent(v: Any) -> str:
    return f"{v * 100:.1f}%" if isinstance(v, int | float) else "-"


def _ms(v: Any) -> str:
    return f"{v:.3g} ms" if isinstance(v, int | float) else "-"


def _phases(job: dict[str, Any]) -> str:
    """Each phase's start and how long it lasted (to the next phase, or until now)."""
    reached = [(name, at) for name, key in PHASES if (at := _at(job.get(key))) is not None]
    parts = []
    for i, (name, at) in enumerate(reached):
        if name == "finished":
            parts.append(f"finished {at:%Y-%m-%d %H:%M:%S}")
            continue
        until = reached[i + 1][1] if i + 1 < len(reached) else datetime.now(UTC)
        parts.append(f"{name} {at:%H:%M:%S} ({duration(until - at)})")
    return ", ".join(parts)


def _runtime(rt: dict[str, Any]) -> str:
    """What the agent chose, leaving out what it did not say (a program counts its own steps)."""
    shown = [("strategy {}", "strategy"), ("{} replica" + ("" if rt.get("replicas") == 1 else "s"), "replicas"), ("precision {}", "precision"),
             ("global batch {}", "global_batch_size"), ("learning rate {}", "learning_rate"),
             ("steps_per_execution {}", "steps_per_execution"), ("{} steps/epoch", "steps_per_epoch"),
             ("program {}", "entrypoint"), ("requirements installed in {}s", "install_s")]
    return ", ".join(form.format(_fmt(rt[key])) for form, key in shown if rt.get(key) is not None)


def _dataset(d: dict[str, Any]) -> str:
    """The runtime's `dataset` (staging's summary) in a few words."""
    parts = [f"{d['train_examples']} training" if isinstance(d.get("train_examples"), int) else "",
             f"{d['validation_examples']} validation examples" if isinstance(d.get("validation_examples"), int) else "",
             f"{d['dropped_examples']} dropped" if d.get("dropped_examples") else "",
             f"features {_fmt(d['feature_shape'], 40)}" if d.get("feature_shape") else "",
             f"task {d['task']}" if d.get("task") else ""]
    return ", ".join(p for p in parts if p)


def _fmt(v: Any, room: int = 160) -> str:
    """A value in a line of at most about `room` characters: a record as `name value, ...` and a list as
    its items, cut short with how many more there are, never a Python repr of a dict."""
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e-3 or abs(v) >= 1e5 else f"{v:.4f}".rstrip("0").rstrip(".")
    if isinstance(v, dict | list):
        items = [f"{k} {_fmt(x, room // 2)}" for k, x in v.items()] if isinstance(v, dict) else \
            [_fmt(x, room // 2) for x in v]
        shown: list[str] = []
        for item in items:
            if sum(len(x) + 2 for x in shown) + len(item) > room:
                shown.append(f"... ({len(items) - len(shown)} more)")
                break
            shown.append(item)
        text = ", ".join(shown)
        return f"{{{text}}}" if isinstance(v, dict) and room < 160 else f"[{text}]" if room < 160 else text
    return str(v)


def epochs_table(epochs: list[dict[str, Any]], job: dict[str, Any] | None = None) -> Table | str:
    """One row per epoch; without any, what that means for this job (`job`: the job as last read)."""
    if not epochs:
        return no_epochs(job)
    table = Table(box=None, pad_edge=False, header_style="bold")
    columns = epoch_columns(epochs)
    for title, *_ in columns:
        table.add_column(title.upper(), justify="right", no_wrap=True)
    for rec in epochs:
        table.add_row(*(fmt.format(rec[key]) if rec.get(key) is not None else "-" for _, key, fmt in columns))
    return table


def no_epochs(job: dict[str, Any] | None) -> str:
    """What a job without an epoch in its metrics has: none yet, none at all, or a program's own metrics."""
    job = job or {}
    status = job.get("status")
    if status not in ("SUCCEEDED", "FAILED", "CANCELLED"):
        return "no epochs finished yet" + (f" (the job is {status})" if status else "")
    if (job.get("spec") or {}).get("program"):
        reported = [k for k, v in (job.get("metrics") or {}).items() if v is not None]
        shown = f"; its final metrics: {', '.join(reported)} (trainjobs status {job.get('id')})" if reported else ""
        return f"the program reported no epochs{shown}"
    return f"no epoch finished: the job is {status}"


def epoch_line(rec: dict[str, Any], epochs: int | None) -> str:
    of = f"/{epochs}" if epochs else ""
    cells = [f"{title} {fmt.format(rec[key])}" for title, key, fmt in epoch_columns([rec])[1:]
             if rec.get(key) is not None]
    return f"epoch {rec.get('epoch')}{of}  " + "  ".join(cells)


# --- sweeps (issue 22) -----------------------------------------------------------------------------

def usd(v: float) -> str:
    """Dollars to the cent, or to a hundredth of a cent under a dollar (a CPU trial costs less than a cent)."""
    return f"${v:,.2f}" if v >= 1 else f"${v:.4f}"


def trial_counts(counts: dict[str, int]) -> str:
    """A sweep's `trials`: how many are in each state, of how many it runs at most."""
    shown = (("complete", "COMPLETE"), ("pruned", "PRUNED"), ("failed", "FAIL"), ("running", "RUNNING"))
    by_state = ", ".join(f"{counts.get(key, 0)} {word}" for word, key in shown)
    return f"{by_state} of {counts.get('planned', '?')} planned"


def sweep_line(sweep: dict[str, Any]) -> str:
    """The sweep in one line: what `sweep submit`, `sweep cancel` and a waited sweep's changes print."""
    note = f"  ({sweep['note']})" if sweep.get("note") else ""
    return f"{sweep['id']}  {sweep['status']:<10}  {trial_counts(sweep['trials'])}  {sweep['name']}{note}"


def by_objective(trials: list[dict[str, Any]], goal: str) -> list[dict[str, Any]]:
    """Best first for the goal; trials with no value yet (running, pruned, failed) after, by number."""
    def rank(t: dict[str, Any]) -> tuple[bool, float, int]:
        v = t.get("value")
        return v is None, 0.0 if v is None else (-v if goal == "maximize" else v), t["number"]

    return sorted(trials, key=rank)


def _param(v: Any) -> str:
    """A parameter's value to 4 significant digits: a learning rate of 0.00178 is not 0.0018."""
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _params(params: dict[str, Any]) -> str:
    return "  ".join(f"{path}={_param(v)}" for path, v in params.items())


def sweep_detail(sweep: dict[str, Any]) -> Table:
    """The head of `sweep status`: where the sweep is, what it optimises, its best trial, what it cost."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    grid.add_row("sweep", f"{sweep['id']}  {sweep['name']}")
    grid.add_row("status", sweep["status"] + (f": {sweep['wait_reason']}" if sweep.get("wait_reason") else ""))
    if sweep.get("note"):
        grid.add_row("note", sweep["note"])
    objective = sweep["objective"]
    grid.add_row("objective", f"{objective['metric']}, {objective['goal']}")
    grid.add_row("trials", trial_counts(sweep["trials"]))
    if best := sweep.get("best"):
        grid.add_row("best", f"trial {best['number']}  {objective['metric']} {_fmt(best['value'])}  "
                             f"{_params(best['params'])}  job {best['job_id']}")
    else:
        grid.add_row("best", "no trial has completed yet")
    used = duration(timedelta(seconds=sweep["accelerator_seconds"]))
    grid.add_row("cost", f"{usd(sweep['cost_usd'])}, accelerators {used}")
    return grid


def trials_table(sweep: dict[str, Any], trials: list[dict[str, Any]]) -> Table | str:
    """Every trial, best first for the sweep's goal: its parameters, how far it trained, its job, its cost."""
    if not trials:
        return "no trials yet"
    paths = list(sweep["spec"].get("parameters") or {})
    paths += [p for t in trials for p in t["params"] if p not in paths]
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in ("TRIAL", "STATE", sweep["objective"]["metric"].upper(), *paths, "EPOCHS", "JOB STATUS", "COST"):
        table.add_column(name, no_wrap=True)
    for t in by_objective(trials, sweep["objective"]["goal"]):
        table.add_row(str(t["number"]), t["state"], "-" if t.get("value") is None else _fmt(t["value"]),
                      *("-" if (v := t["params"].get(p)) is None else _param(v) for p in paths),
                      str(len(t.get("curve") or [])), t["job_status"], usd(t["cost_usd"]))
    return table


def sweep_report(sweep: dict[str, Any], trials: list[dict[str, Any]]) -> Group:
    """`sweep status`: the head, then the trials table."""
    return Group(sweep_detail(sweep), "", trials_table(sweep, trials))


def sweeps_table(sweeps: list[dict[str, Any]]) -> Table | str:
    if not sweeps:
        return "no sweeps"
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in ("ID", "NAME", "STATUS", "TRIALS", "BEST", "COST", "AGE"):
        table.add_column(name, no_wrap=True)
    now = datetime.now(UTC)
    for s in sweeps:
        counts = s["trials"]
        ended = sum(counts.get(k, 0) for k in ("COMPLETE", "PRUNED", "FAIL"))
        best = f"{s['objective']['metric']} {_fmt(s['best']['value'])}" if s.get("best") else "-"
        table.add_row(s["id"], s["name"], s["status"], f"{ended}/{counts.get('planned', '?')}", best,
                      usd(s["cost_usd"]), age(s.get("created_at"), now))
    return table


class LiveView:
    """The view of a followed job. On a terminal: a progress bar with epoch, step, ETA, loss, accuracy,
    examples/s and input wait, and a line per finished epoch above it. Elsewhere: a line per status
    change and per epoch, nothing that redraws."""

    def __init__(self, out: Console):
        self.out = out
        self.bar: Progress | None = None
        self.task: TaskID | None = None
        self.status: str | None = None
        self.latest: dict[str, Any] = {}
        self.epochs: int | None = None
        if out.is_terminal:
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                                TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[stats]}"),
                                console=out, transient=True)
            self.bar.start()
            self.task = self.bar.add_task("waiting", total=1.0, stats="")

    def job(self, job: dict[str, Any]) -> None:
        """A fresh read of the job: status, progress, runtime."""
        rt = job.get("runtime") or {}
        self.epochs = rt.get("epochs") or (job.get("spec") or {}).get("training", {}).get("epochs") or self.epochs
        if job["status"] != self.status:
            self.status = job["status"]
            reason = f"  ({job['wait_reason']})" if job.get("wait_reason") else ""
            self.out.print(f"{time.strftime('%H:%M:%S')}  {job['status']}{reason}")
        if self.bar is not None and self.task is not None:
            done = float(job.get("progress") or 0.0)
            self.bar.update(self.task, completed=done, description=self._where(done, rt), stats=self._stats())

    def metric(self, rec: dict[str, Any]) -> None:
        """A finished epoch."""
        self.latest = rec
        self.out.print(epoch_line(rec, self.epochs))
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, stats=self._stats())

    def _where(self, done: float, rt: dict[str, Any]) -> str:
        if not self.epochs or self.status != "RUNNING":
            return self.status or ""
        epoch = min(int(done * self.epochs), self.epochs - 1)
        where = f"epoch {epoch + 1}/{self.epochs}"
        if steps := rt.get("steps_per_epoch"):
            step = round((done * self.epochs - epoch) * steps)
            where += f" step {step}/{steps}"
        return where

    def _stats(self) -> str:
        m = self.latest
        cells = [(k, m.get(key), fmt) for k, key, fmt in (("loss", "loss", "{:.4f}"), ("acc", "accuracy", "{:.4f}"),
                                                          ("ex/s", "examples_per_sec", "{:,.0f}"),
                                                          ("input wait", "input_wait_fraction", "{:.0%}"))]
        return "  ".join(f"{k} {fmt.format(v)}" for k, v, fmt in cells if v is not None)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
