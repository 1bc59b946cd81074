"""A cloud VM's first storage token, sealed to a key only that VM holds (README, "Security").

Node and instance metadata is readable by every identity that may get the node, and on a shared
deployment that includes the other tenants' VMs. So the token that metadata carries is sealed: each VM
makes an X25519 key pair at boot and publishes the public half as a guest attribute, which only code on
that VM can write; the worker reads it through the cloud API and writes back, into the metadata, the
token encrypted to it. A reader of the metadata learns nothing it can use.

The seal is ECIES as libsodium's sealed boxes and HPKE do it: an ephemeral X25519 key agreed with the
recipient's, HKDF-SHA256 over the shared secret (salt: both public keys; info: the machine's name), and
AES-256-GCM with the machine's name as associated data, so an envelope made for one machine opens on no
other. Both halves live here, in the shared core, because the worker seals and the agent's wheel opens:
one format, one module.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from typing import Any

VERSION = 1
_INFO = b"trainjobs sealed storage token v1 "


class SealError(ValueError):
    """An envelope that is malformed, or not for this key and machine."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode()


def _unb64(text: object, size: int | None = None) -> bytes:
    if not isinstance(text, str):
        raise SealError("an envelope field is not a string")
    try:
        data = base64.urlsafe_b64decode(text.encode())
    except (ValueError, TypeError) as exc:
        raise SealError(f"an envelope field is not base64: {exc}") from None
    if size is not None and len(data) != size:
        raise SealError(f"an envelope field has {len(data)} bytes, not {size}")
    return data


def _key(shared: bytes, ephemeral: bytes, recipient: bytes, machine: str) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=32, salt=ephemeral + recipient,
                info=_INFO + machine.encode()).derive(shared)


def _exchange(private: Any, public: Any) -> bytes:
    try:
        return bytes(private.exchange(public))
    except ValueError:  # a low-order point (all zeros, say): no shared secret, so no key to trust
        raise SealError("the public key is not usable for X25519") from None


@dataclass(frozen=True)
class KeyPair:
    """The VM's half: made at boot, the private key never written anywhere but this process's memory."""

    private: bytes
    public: bytes

    @classmethod
    def generate(cls) -> KeyPair:
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

        key = X25519PrivateKey.generate()
        return cls(key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption()),
                   key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))

    @property
    def public_text(self) -> str:
        """What the VM publishes as its guest attribute."""
        return _b64(self.public)


def public_key(text: str) -> bytes:
    """A published public key, checked: 32 bytes of URL-safe base64."""
    return _unb64(text.strip(), 32)


def canonical(text: str) -> str:
    """A published public key as envelopes name it (SealError if it is none)."""
    return _b64(public_key(text))


def seal(plaintext: str, recipient_text: str, machine: str) -> dict[str, str]:
    """The worker's half: `plaintext` encrypted to the published key `recipient_text`, for `machine` only."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    recipient = public_key(recipient_text)
    ephemeral = X25519PrivateKey.generate()
    ephemeral_public = ephemeral.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    shared = _exchange(ephemeral, X25519PublicKey.from_public_bytes(recipient))
    nonce = os.urandom(12)
    ciphertext = AESGCM(_key(shared, ephemeral_public, recipient, machine)).encrypt(
        nonce, plaintext.encode(), machine.encode())
    return {"v": str(VERSION), "to": _b64(recipient), "epk": _b64(ephemeral_public), "nonce": _b64(nonce),
            "ct": _b64(ciphertext)}


def open_sealed(envelope: dict[str, str], keys: KeyPair, machine: str) -> str:
    """The VM's half: the plaintext of an envelope sealed to `keys` for `machine`; SealError otherwise."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    if envelope.get("v") != str(VERSION):
        raise SealError(f"unknown envelope version {envelope.get('v')!r}")
    if _unb64(envelope.get("to"), 32) != keys.public:
        raise SealError("the envelope is sealed to another key")
    ephemeral = _unb64(envelope.get("epk"), 32)
    shared = _exchange(X25519PrivateKey.from_private_bytes(keys.private), X25519PublicKey.from_public_bytes(ephemeral))
    try:
        plaintext = AESGCM(_key(shared, ephemeral, keys.public, machine)).decrypt(
            _unb64(envelope.get("nonce"), 12), _unb64(envelope.get("ct")), machine.encode())
    except InvalidTag:
        raise SealError(f"the envelope does not open for machine {machine!r} (altered, or made for another)") from None
    return plaintext.decode()


# --- the metadata value: one envelope per host of the machine, each to that host's own key ---

def envelopes(value: str) -> list[dict[str, str]]:
    """The envelopes a metadata value holds; SealError if it is not a list of them."""
    try:
        data = json.loads(value)
    except ValueError as exc:
        raise SealError(f"the sealed token is not JSON: {exc}") from None
    if not isinstance(data, list) or not all(isinstance(e, dict) for e in data):
        raise SealError("the sealed token is not a list of envelopes")
    return data


def recipients(value: str | None) -> set[str]:
    """The public keys a metadata value has envelopes for (none for no value or a malformed one)."""
    try:
        return {str(e.get("to")) for e in envelopes(value)} if value else set()
    except SealError:
        return set()


def seal_all(plaintext: str, recipient_texts: list[str], machine: str) -> str:
    """The metadata value: `plaintext` sealed to each host's published key."""
    return json.dumps([seal(plaintext, key, machine) for key in sorted({canonical(k) for k in recipient_texts})])


def open_mine(value: str, keys: KeyPair, machine: str) -> str | None:
    """This host's plaintext from a metadata value, or None while it holds no envelope to this host's key
    (the worker has sealed to the hosts that had published so far)."""
    mine = [e for e in envelopes(value) if e.get("to") == keys.public_text]
    return open_sealed(mine[0], keys, machine) if mine else None
