"""Where pip may be pointed by a program's requirement that names its own URL (`name @ url`, issue 36
finding 9). pip fetches it on the job's machine, following redirects and resolving names where no check
of ours sees them, so whatever the operator allows, never: a scheme but https:// (http://, and git+ssh://
and every other version-control URL, which run git), localhost or a literal address that is not public,
or `${` (pip fills it in from the machine's environment). file:// is left to the operator's host folders.
This is the pure part, for the spec at submit and for the agent before pip runs; which hosts and folders
the operator allows is DataAccessRules.check_requirement's (trainjobs/source_rules.py), at the API.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from trainjobs.addresses import is_public, literal_address, shown


def requirement_url(line: str) -> str | None:
    """The URL a PEP 508 requirement line names (`name @ url`); None for a line without one, or not PEP 508."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        return Requirement(line.strip()).url
    except InvalidRequirement:
        return None


def requirement_url_problem(line: str) -> str | None:
    """Why pip may never be pointed where a requirement line says, whatever the operator allows, or None.
    Pure, for the spec at submit and the agent before pip runs; the operator's part: check_requirement."""
    if "${" in line:
        return f"{shown(line)}: '${{' is filled in by pip from the machine's environment; it is not taken"
    url = requirement_url(line)
    if url is None:
        return None
    try:
        parts = urlsplit(url)
    except ValueError:  # a bracketed host that is not an address
        return f"{shown(url)} is not a URL"
    if parts.scheme == "file":
        return None  # the operator's host directories decide
    host = (parts.hostname or "").rstrip(".")
    if parts.scheme != "https" or not host:
        return (f"{shown(url)}: a requirement's own URL must be https:// with a host name (or a file:// the operator "
                "allows); http://, version-control (git+...) and other URLs are not fetched")
    address = literal_address(host)
    if host == "localhost" or host.endswith(".localhost") or (address is not None and not is_public(address)):
        return f"{shown(url)}: {host} is not a public address; pip fetches only from public hosts"
    return None
