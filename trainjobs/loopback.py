"""Loopback ports for processes we start (the GCS emulator, TF_CONFIG's workers, test servers)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
