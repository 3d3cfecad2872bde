"""API keys: format, hashing, the keys file (atomic, 0600, create/revoke/list) and the
gateway-side index that re-reads the file at most once a second on the injected clock."""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
import stat

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.clock import FakeClock
from policies.auth.keys import (
    KeyIndex,
    KeysFile,
    KeysFileError,
    generate_key,
    hash_key,
    parse_key_id,
)


def counting_bytes():
    counter = itertools.count(1)
    return lambda n: bytes([next(counter) % 256] * n)


def test_generated_key_has_the_documented_shape_and_only_its_hash_is_kept():
    plaintext, record = generate_key("acme", "ci", created=123.0, token_bytes=counting_bytes())
    assert plaintext.startswith("sy-010101010101-")
    assert record.key_id == "010101010101"
    secret = plaintext.removeprefix("sy-010101010101-")
    assert base64.urlsafe_b64decode(secret + "=") == bytes([2] * 32)
    assert record.sha256 == hashlib.sha256(plaintext.encode()).hexdigest()
    assert (record.tenant, record.name, record.created, record.revoked_at) == (
        "acme",
        "ci",
        123.0,
        None,
    )
    assert secret not in repr(record)


def test_real_randomness_gives_distinct_keys_with_256_bit_secrets():
    keys = {generate_key("t", "n")[0] for _ in range(50)}
    assert len(keys) == 50
    for key in keys:
        secret = key.split("-", 2)[2]
        assert len(base64.urlsafe_b64decode(secret + "=")) >= 32


@pytest.mark.parametrize(
    "text",
    [
        "",
        "sk-abc",
        "sy-",
        "sy-0123456789ab",
        "sy-0123456789ab-",
        "sy-0123-secret",
        "SY-0123456789ab-x",
    ],
)
def test_parse_key_id_rejects_other_shapes(text):
    assert parse_key_id(text) is None


def test_parse_key_id_allows_dashes_in_the_secret():
    assert parse_key_id("sy-0123456789ab-se-cr-et") == "0123456789ab"


def test_keys_file_create_list_revoke(tmp_path):
    keys = KeysFile(tmp_path / "keys.json")
    first, a = keys.create("acme", "ci", now=10.0)
    _, b = keys.create("beta", "web", now=20.0)
    assert [r.key_id for r in keys.list_keys()] == [a.key_id, b.key_id]
    revoked = keys.revoke(a.key_id, now=30.0)
    assert revoked.revoked_at == 30.0
    again = keys.revoke(a.key_id, now=99.0)  # idempotent: the first time stays
    assert again.revoked_at == 30.0
    listed = {r.key_id: r for r in keys.list_keys()}
    assert listed[a.key_id].revoked_at == 30.0
    assert listed[b.key_id].revoked_at is None
    with pytest.raises(KeyError):
        keys.revoke("ffffffffffff")
    text = (tmp_path / "keys.json").read_text()
    assert first not in text
    assert first.split("-", 2)[2] not in text
    assert hash_key(first) in text


def test_keys_file_is_written_atomically_with_mode_0600(tmp_path):
    path = tmp_path / "keys.json"
    keys = KeysFile(path)
    keys.create("acme", "one")
    inode = os.stat(path).st_ino
    keys.create("acme", "two")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.stat(path).st_ino != inode  # replaced by rename, not rewritten in place
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
    assert len(json.loads(path.read_text())["keys"]) == 2


def test_keys_file_reports_a_corrupt_file(tmp_path):
    path = tmp_path / "keys.json"
    path.write_text("{not json")
    with pytest.raises(KeysFileError, match="not a keys file"):
        KeysFile(path).list_keys()


def test_index_verifies_live_keys_and_rejects_wrong_secrets(tmp_path):
    path = tmp_path / "keys.json"
    plaintext, record = KeysFile(path).create("acme", "ci")
    index = KeyIndex(path, FakeClock())
    assert index.verify(plaintext) == record
    forged = f"sy-{record.key_id}-" + "A" * 43
    assert index.verify(forged) is None
    assert index.verify("sy-ffffffffffff-" + "A" * 43) is None
    assert index.verify("not-a-key") is None


def test_revocation_reaches_the_index_after_the_one_second_recheck(tmp_path):
    path = tmp_path / "keys.json"
    keys = KeysFile(path)
    plaintext, record = keys.create("acme", "ci")
    clock = FakeClock()
    index = KeyIndex(path, clock)
    assert index.verify(plaintext) is not None
    keys.revoke(record.key_id)
    clock.advance(0.5)
    assert index.verify(plaintext) is not None  # not re-checked yet: at most once a second
    clock.advance(0.5)
    assert index.verify(plaintext) is None


def test_index_picks_up_new_keys_and_a_file_created_later(tmp_path):
    path = tmp_path / "keys.json"
    clock = FakeClock()
    index = KeyIndex(path, clock)  # no file yet: no keys
    plaintext, _ = KeysFile(path).create("acme", "ci")
    assert index.verify(plaintext) is None
    clock.advance(1.0)
    assert index.verify(plaintext) is not None


def test_index_keeps_the_last_good_records_when_the_file_breaks(tmp_path):
    path = tmp_path / "keys.json"
    plaintext, _ = KeysFile(path).create("acme", "ci")
    clock = FakeClock()
    index = KeyIndex(path, clock)
    path.write_text("{broken")
    clock.advance(1.0)
    assert index.verify(plaintext) is not None
    path.write_text(json.dumps({"version": 1, "keys": []}))
    clock.advance(1.0)
    assert index.verify(plaintext) is None  # the repaired file is read on the next check


def test_index_refuses_a_corrupt_file_at_start(tmp_path):
    path = tmp_path / "keys.json"
    path.write_text('{"keys": [{"key_id": 1}]}')
    with pytest.raises(KeysFileError):
        KeyIndex(path, FakeClock())


@pytest.fixture(scope="module")
def one_key_index(tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "keys.json"
    plaintext, _ = KeysFile(path).create("acme", "prop")
    return plaintext, KeyIndex(path, FakeClock())


@given(position=st.integers(min_value=0), char=st.sampled_from("ABCXYZabcxyz0123456789-_"))
def test_any_single_character_change_is_refused(one_key_index, position, char):
    plaintext, index = one_key_index
    assert index.verify(plaintext) is not None
    at = position % len(plaintext)
    changed = plaintext[:at] + char + plaintext[at + 1 :]
    if changed != plaintext:
        assert index.verify(changed) is None
