"""Where a local machine's processes run (issue 36, finding 10): in a bubblewrap sandbox of their own, or
as the worker's own processes.

In the sandbox a machine's agents see the interpreter, the agent's and the shared core's code (read-only),
their own work directories and their project's requirements cache, and nothing else of the worker's
files; they have a PID namespace of their own (no other process to read /proc/<pid>/environ of), a user
namespace in which they hold no capability, and, when storage is the emulator, a network namespace with
only a loopback in it: the one way out is a unix socket to the machine's own storage guard, which a relay
inside (agent/sandbox_relay.py) serves on the loopback port the agent is told. A real bucket needs the
internet, so there the sandbox shares the host's network, loopback included: whatever the host reaches
is open to the job, which still sees none of the worker's files or processes. That is a service that
trusts where a connection comes from (PostgreSQL with trust auth, or with a password the job can guess),
another machine's TF_CONFIG ports, and on a cloud VM the metadata server, which hands out the VM's own
credentials.

One sandbox per machine: the `workers: K` agents of a machine are one job, whose peers reach each other
on the sandbox's loopback (TF_CONFIG unchanged). Inside, the processes run as uid 1000 with no capability
and no-new-privileges; outside, that uid is the worker's own user (root, where the worker runs as root,
over the paths bound in only: run the worker as a user of its own for a second wall).

Why bubblewrap: Debian ships it (`bubblewrap`, /usr/bin/bwrap), it needs no daemon and no root (only
unprivileged user namespaces), and every namespace and mount is one flag on one command line, which
`bwrap_command` builds and a test can read. nsjail would do as well but is not packaged by Debian.

TRAINJOBS_LOCAL_SANDBOX: `auto` (the default: bubblewrap when a trivial sandbox starts on this host,
probed once at start-up), `bwrap` (required: the worker refuses to start without it), `off`.
Without the sandbox a job's code can read everything the worker can (its environment, its database),
so the host runs the jobs of the one project the operator names (worker/local/host_claim.py), unless the
operator says TRAINJOBS_LOCAL_TRUSTED=1 (every project on this host trusts every other).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from trainjobs.module_command import module_command

log = logging.getLogger("trainjobs.worker")

REPO_ROOT = Path(__file__).resolve().parents[2]
# What of the repository the agent imports: itself and the shared core (tests/unit/test_layers.py).
AGENT_PACKAGES = ("agent", "trainjobs")
GUARD_SOCKET = "/run/trainjobs/storage-guard.sock"  # inside the sandbox; the relay connects to it
SANDBOX_UID = 1000  # inside the user namespace; outside it stays the worker's own user, without capabilities
# What of /etc a Python program and TLS need, where they exist (certificates for real buckets).
ETC = ("/etc/ssl", "/etc/ca-certificates", "/etc/pki", "/etc/localtime", "/etc/nsswitch.conf", "/etc/hosts",
       "/etc/resolv.conf", "/etc/passwd", "/etc/group")
PROBE_TIMEOUT_S = 30.0


class SandboxUnavailable(ValueError):
    """TRAINJOBS_LOCAL_SANDBOX=bwrap, and bubblewrap cannot start a sandbox here; the message says why."""


@dataclass(frozen=True)
class LocalIsolation:
    """How this worker isolates its local machines. `sandbox`: each machine in a bubblewrap sandbox.
    `trusted`: without the sandbox, jobs of more than one project may still run on this host."""

    sandbox: bool
    trusted: bool = False

    @classmethod
    def from_env(cls) -> LocalIsolation:
        """From TRAINJOBS_LOCAL_SANDBOX and TRAINJOBS_LOCAL_TRUSTED, probing bubblewrap once for `auto`;
        a value other than those documented is refused, naming the variable."""
        mode = os.environ.get("TRAINJOBS_LOCAL_SANDBOX", "auto").strip().lower() or "auto"
        trusted_raw = os.environ.get("TRAINJOBS_LOCAL_TRUSTED", "0").strip().lower() or "0"
        if mode not in ("auto", "bwrap", "off"):
            raise ValueError(f"TRAINJOBS_LOCAL_SANDBOX={mode!r}: expected auto, bwrap or off")
        if trusted_raw not in ("0", "1", "true", "false"):
            raise ValueError(f"TRAINJOBS_LOCAL_TRUSTED={trusted_raw!r}: expected 0 or 1")
        trusted = trusted_raw in ("1", "true")
        if mode == "off":
            return cls(sandbox=False, trusted=trusted)
        problem = probe()
        if problem is None:
            return cls(sandbox=True, trusted=trusted)
        if mode == "bwrap":
            raise SandboxUnavailable(f"TRAINJOBS_LOCAL_SANDBOX=bwrap, but no sandbox starts here: {problem}")
        log.warning("local machines: no sandbox on this host (%s)", problem)
        return cls(sandbox=False, trusted=trusted)

    def describe(self) -> str:
        """The start-up line of a worker with local machines (`trainjobs up`, `trainjobs worker`)."""
        if self.sandbox:
            return ("local machines run sandboxed (bubblewrap): each job sees only its own files and processes, "
                    "and with the storage emulator reaches only its own storage guard (with a real bucket it "
                    "shares this host's network)")
        if self.trusted:
            return ("local machines run UNSANDBOXED as the worker's user, for every project "
                    "(TRAINJOBS_LOCAL_TRUSTED=1): any job's code can read the worker's environment, database "
                    "and every project's files")
        return ("local machines run UNSANDBOXED as the worker's user, for one project only, the one the operator "
                "names (TRAINJOBS_LOCAL_PROJECT; `up`: its own); other projects' jobs are refused "
                "(TRAINJOBS_LOCAL_TRUSTED=1 allows them); that project's code can still read the worker's "
                "environment and database")


def bwrap() -> str | None:
    return shutil.which("bwrap")


def probe() -> str | None:
    """None when bubblewrap starts a sandbox like a machine's here (user, PID and network namespaces, a
    fresh /proc); else why not, in its own words."""
    exe = bwrap()
    if exe is None:
        return "bwrap is not installed (Debian: apt-get install bubblewrap)"
    command = [exe, *_namespaces(exe, network=False), *_system(), "--", sys.executable, "-c", "pass"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap did not run: {exc}"
    if done.returncode != 0:
        return f"bwrap failed ({done.returncode}): {done.stderr.strip()[-500:]}"
    return None


def _namespaces(exe: str, network: bool) -> list[str]:
    # --unshare-all: user, IPC, PID, network, UTS and cgroup namespaces; no capability is kept inside
    # (bubblewrap drops them all unless --cap-add says otherwise). --disable-userns: nor may the job make
    # a user namespace of its own, where it would hold every capability (CAP_NET_ADMIN over nf_tables,
    # say: the kernel's most attacked surface). No --die-with-parent: a machine outlives a worker that
    # dies, as a VM does, and the next worker adopts it.
    return ["--unshare-all", *(["--share-net"] if network else []), "--unshare-user",
            *(["--disable-userns"] if _disables_userns(exe) else []),
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "trainjobs-machine"]


@functools.cache
def _disables_userns(exe: str) -> bool:
    """Whether this bubblewrap has --disable-userns (0.8 on; Debian bookworm ships 0.8.0)."""
    try:
        said = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--disable-userns" in said.stdout + said.stderr


def _ro(path: str | Path) -> list[str]:
    return ["--ro-bind", str(path), str(path)]


def _system() -> list[str]:
    """The operating system's files a Python interpreter needs, read-only, and private /proc, /dev, /tmp."""
    args = ["--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
            "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin",
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    # The interpreter's installation and the environment it runs in (a virtual environment's prefix),
    # where they are not under /usr already.
    for prefix in dict.fromkeys((Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), Path(sys.prefix))):
        if not prefix.is_relative_to("/usr"):
            args += _ro(prefix)
    # TensorFlow counts its cores here; nothing else of /sys (the cgroup tree would list the host's pids).
    args += ["--ro-bind-try", "/sys/devices/system/cpu", "/sys/devices/system/cpu"]
    return args


def bwrap_command(*, command: list[str], writable: list[Path], readable: list[Path], guard_socket: Path | None,
                  network: bool, cwd: Path) -> list[str]:
    """The bubblewrap command line that runs `command` in a machine's sandbox. `writable`: the machine's
    work directories and its project's cache (read-write, at their own paths); `readable`: more read-only
    paths (a token file's directory); `guard_socket`: the machine's storage guard's unix socket, seen
    inside at GUARD_SOCKET; `network`: share the host's network (a real bucket needs the internet)."""
    exe = bwrap()
    if exe is None:
        raise SandboxUnavailable("bwrap is not installed")
    args = [exe, *_namespaces(exe, network), *_system()]
    for package in AGENT_PACKAGES:
        args += _ro(REPO_ROOT / package)
    for etc in ETC:
        args += ["--ro-bind-try", etc, etc]
    for path in readable:
        args += _ro(path)
    for path in writable:
        args += ["--bind", str(path), str(path)]
    if guard_socket is not None:
        args += ["--bind", str(guard_socket), GUARD_SOCKET]  # connect() needs write access to a socket
    return [*args, "--setenv", "HOME", "/tmp", "--chdir", str(cwd), "--", *command]


@dataclass(frozen=True)
class AgentLaunch:
    """One agent of a machine: `python -m agent ARGS` with ENV, its output appended to LOG, its work
    directory DISK (the one of the machine's paths it may write, with its project's cache)."""

    args: list[str]
    env: dict[str, str]
    log: Path
    disk: Path


def start_machine(agents: list[AgentLaunch], *, machine_dir: Path, writable: list[Path], readable: list[Path],
                  guard: tuple[Path, int] | None, network: bool) -> subprocess.Popen[bytes]:
    """Start one sandbox running all of a machine's agents (agent/sandbox_relay.py) in a session of its
    own; return bubblewrap's process (the leader of the machine's process group). `guard`: the storage
    guard's unix socket and the loopback port to serve it on inside."""
    for a in agents:  # on the machine's disk, not the sandbox's /tmp, which is memory: pip's cache and builds
        for d in ("home", "tmp"):
            (a.disk / d).mkdir(parents=True, exist_ok=True)
    logs = [a.log.open("ab") for a in agents]
    try:
        plan = {"relay": {"port": guard[1], "socket": GUARD_SOCKET} if guard else None,
                "agents": [{"args": a.args, "env": {**a.env, "HOME": str(a.disk / "home"), "TMPDIR": str(a.disk / "tmp")},
                            "log_fd": f.fileno()} for a, f in zip(agents, logs)]}
        command = bwrap_command(command=module_command("agent.sandbox_relay", json.dumps(plan), cwd=writable[0]),
                                writable=writable, readable=readable, guard_socket=guard[0] if guard else None,
                                network=network, cwd=writable[0])
        with (machine_dir / "sandbox.log").open("ab") as out:
            return subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                pass_fds=[f.fileno() for f in logs],  # bubblewrap hands them on to the relay
                env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"},
                start_new_session=True)  # its own process group: delete signals the whole machine
    finally:
        for f in logs:
            f.close()
