"""A wheel made here, for tests of program requirements: pip installs it from a file:// URL, so no
package index is asked (tests must not depend on one)."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def make_wheel(directory: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A pure-Python wheel of `files` (paths inside site-packages -> text), with its dist-info."""
    dist_info = f"{name}-{version}.dist-info"
    contents = {**files,
                f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: trainjobs-tests\nRoot-Is-Purelib: true\n"
                                      "Tag: py3-none-any\n"}
    record = []
    for path, text in contents.items():
        data = text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in contents.items():
            zf.writestr(path, text)
        zf.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    return wheel
