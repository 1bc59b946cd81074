"""`python -m agent.first_token --out FILE`: at boot, receive this host's first storage token.

The startup script runs this before the agent (README, "Security"; trainjobs/sealed_token.py). It makes
a key pair, publishes the public key as this VM's guest attribute `trainjobs/public-key` (only code on
this VM can write its guest attributes), then waits on the metadata server until the worker has written
the token sealed to that key into `trainjobs-storage-token-sealed`, opens it, and writes it to FILE
(mode 0600) for the agent's storage client. The private key lives only in this process. Exit 1 if no
token for this host comes within --timeout-s: the startup script stops, the agent never starts, and the
driver's boot limit gives the attempt up.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import httpx

from trainjobs.sealed_token import KeyPair, SealError, open_mine
from trainjobs.vm_metadata import MACHINE_KEY, PUBLIC_KEY_PATH, SEALED_KEY

HEADERS = {"Metadata-Flavor": "Google"}
WAIT_S = 60  # one wait_for_change; the metadata server answers when the attributes change or this passes


def publish(meta: httpx.Client, keys: KeyPair) -> None:
    response = meta.put(f"/instance/guest-attributes/{PUBLIC_KEY_PATH}", content=keys.public_text)
    if response.status_code != 200:
        # Guest attributes are off unless the VM's metadata has enable-guest-attributes=TRUE (set at create).
        raise RuntimeError(f"cannot publish this VM's key as a guest attribute: {response.status_code} "
                           f"{response.text[:300]}")


def wait_for_token(meta: httpx.Client, keys: KeyPair, machine: str, timeout_s: float) -> str:
    """The token sealed to `keys`, once the worker has written it into this VM's metadata."""
    deadline = time.monotonic() + timeout_s
    etag = ""
    while True:
        params: dict[str, str | int] = {"recursive": "true"}
        if etag:  # an ETag we have seen: wait until the attributes differ from it
            params.update(wait_for_change="true", last_etag=etag,
                          timeout_sec=max(1, min(WAIT_S, int(deadline - time.monotonic()))))
        try:
            response = meta.get("/instance/attributes/", params=params, timeout=WAIT_S + 10)
            response.raise_for_status()
            etag, attributes = response.headers.get("ETag", ""), response.json()
        except (httpx.HTTPError, ValueError) as exc:  # the metadata server may blink: the deadline decides
            print(f"first_token: cannot read this VM's metadata yet: {exc}", file=sys.stderr)
            etag, attributes = "", {}
            time.sleep(1.0)
        sealed = attributes.get(SEALED_KEY) if isinstance(attributes, dict) else None
        if isinstance(sealed, str) and (token := open_mine(sealed, keys, machine)) is not None:
            return token
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no storage token sealed to this host's key after {timeout_s:.0f}s")


def write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)  # an existing file keeps its mode through O_CREAT


def receive(metadata_url: str, out: Path, timeout_s: float) -> None:
    keys = KeyPair.generate()
    with httpx.Client(base_url=metadata_url.rstrip("/"), headers=HEADERS, timeout=10.0) as meta:
        machine = meta.get(f"/instance/attributes/{MACHINE_KEY}")
        machine.raise_for_status()
        publish(meta, keys)
        token = wait_for_token(meta, keys, machine.text, timeout_s)
    if not isinstance(json.loads(token), dict):
        raise SealError("the sealed token is not a token")
    write_private(out, token)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent.first_token", description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--metadata-url", required=True)
    parser.add_argument("--timeout-s", type=float, default=1800.0)
    args = parser.parse_args(argv)
    try:
        receive(args.metadata_url, args.out, args.timeout_s)
    except (TimeoutError, SealError, RuntimeError, httpx.HTTPError, ValueError) as exc:
        print(f"agent.first_token: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
