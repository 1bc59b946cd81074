"""The envelope a cloud VM's first storage token travels in (trainjobs/sealed_token.py): it opens
with the host's key for its machine alone, holds nothing of the token in the clear, and malformed
values are errors. Delivery through the fake clouds: tests/integration/test_sealed_tokens.py."""

from __future__ import annotations

import json

import pytest

from trainjobs.sealed_token import KeyPair, SealError, open_mine, open_sealed, recipients, seal, seal_all
from trainjobs.vm_metadata import PUBLIC_KEY_ATTRIBUTE, PUBLIC_KEY_NAMESPACE
from worker.gcp.token_delivery import published_keys, sealed_value

TOKEN = json.dumps({"access_token": "ya29.job-token", "expiry": "2030-01-01T00:00:00+00:00"})


def test_a_sealed_token_opens_with_the_hosts_key_for_its_machine() -> None:
    host = KeyPair.generate()
    assert open_sealed(seal(TOKEN, host.public_text, "tj-job-a1"), host, "tj-job-a1") == TOKEN


def test_the_envelope_holds_nothing_of_the_token_in_the_clear() -> None:
    host = KeyPair.generate()
    text = json.dumps(seal(TOKEN, host.public_text, "tj-job-a1"))
    assert "ya29" not in text and "job-token" not in text


@pytest.mark.parametrize("case", ["another key", "another machine", "altered ciphertext", "altered ephemeral key",
                                  "readdressed to the reader"])
def test_an_envelope_does_not_open_for_anyone_else(case: str) -> None:
    host, reader = KeyPair.generate(), KeyPair.generate()
    envelope = seal(TOKEN, host.public_text, "tj-job-a1")
    keys, machine = host, "tj-job-a1"
    match case:
        case "another key":
            keys = reader
        case "another machine":
            machine = "tj-other-a1"
        case "altered ciphertext":
            ct = bytearray(envelope["ct"].encode())
            ct[5] = ord("A") if ct[5] != ord("A") else ord("B")
            envelope["ct"] = ct.decode()
        case "altered ephemeral key":
            envelope["epk"] = KeyPair.generate().public_text
        case "readdressed to the reader":
            envelope["to"], keys = reader.public_text, reader
    with pytest.raises(SealError):
        open_sealed(envelope, keys, machine)


def test_each_host_of_a_slice_opens_its_own_envelope_and_waits_while_it_has_none() -> None:
    hosts = [KeyPair.generate() for _ in range(3)]
    value = seal_all(TOKEN, [h.public_text for h in hosts[:2]], "tj-slice-a1")
    assert recipients(value) == {h.public_text for h in hosts[:2]}
    assert [open_mine(value, h, "tj-slice-a1") for h in hosts] == [TOKEN, TOKEN, None]


@pytest.mark.parametrize("value", ["", "not json", "{}", "[1]"])
def test_a_malformed_metadata_value_is_an_error_and_names_no_recipient(value: str) -> None:
    with pytest.raises(SealError):
        open_mine(value, KeyPair.generate(), "m")
    assert recipients(value) == set()


@pytest.mark.parametrize("published", ["", "short", "x" * 44, "A" * 43 + "="])
def test_a_published_key_that_is_no_x25519_key_is_refused(published: str) -> None:
    with pytest.raises(SealError):
        seal_all(TOKEN, [published], "m")


def test_a_published_value_that_is_no_key_gets_no_token() -> None:
    assert published_keys("m", [(PUBLIC_KEY_NAMESPACE, PUBLIC_KEY_ATTRIBUTE, "not a key"), ("other", PUBLIC_KEY_ATTRIBUTE, "x")]) == []
    assert sealed_value("m", [], None, TOKEN) is None
