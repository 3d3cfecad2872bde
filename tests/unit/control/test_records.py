"""Which secrets open a key, as pure functions of the record and the time: the current
secret while the key is active; the one a rotation replaced only until its grace period
ends; nothing once revoked or expired. Plus the refused changes and the admin view."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.control.errors import ConflictError
from policies.control.records import (
    MAX_TAGS,
    check_metadata,
    edited,
    new_key,
    new_secret_for,
    public_view,
    revoked,
    rotated,
)

T0 = 1_700_000_000.0


def digest(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def counter_bytes():
    state = {"n": 0}

    def token_bytes(size: int) -> bytes:
        state["n"] += 1
        return bytes([state["n"] % 256]) * size

    return token_bytes


def test_a_new_key_opens_with_its_secret_only() -> None:
    plaintext, record = new_key("acme", "ci", T0, token_bytes=counter_bytes())
    assert plaintext.startswith(f"sy-{record.key_id}-") and len(record.key_id) == 12
    assert record.sha256 == digest(plaintext) and record.created == record.updated == T0
    assert record.opens(digest(plaintext), T0)
    assert not record.opens(digest(plaintext + "x"), T0)


def test_expiry_is_exclusive_of_its_instant_and_revocation_is_final() -> None:
    plaintext, record = new_key("acme", "ci", T0, expires_at=T0 + 10)
    assert record.opens(digest(plaintext), T0 + 9.999)
    assert not record.opens(digest(plaintext), T0 + 10)
    assert record.state(T0 + 10) == "expired"
    gone = revoked(record, T0 + 1)
    assert gone.state(T0 + 1) == "revoked" and not gone.opens(digest(plaintext), T0 + 1)
    with pytest.raises(ConflictError) as info:
        revoked(gone, T0 + 2)
    assert info.value.status == 409 and info.value.code == "key_revoked"


def test_rotation_keeps_the_old_secret_for_the_grace_period_only() -> None:
    old, record = new_key("acme", "ci", T0)
    new = new_secret_for(record.key_id)
    assert new.startswith(f"sy-{record.key_id}-") and new != old
    after = rotated(record, new, T0 + 5, grace_s=60)
    assert after.opens(digest(new), T0 + 5) and after.opens(digest(old), T0 + 64.9)
    assert not after.opens(digest(old), T0 + 65)
    assert after.opens(digest(new), T0 + 1e6)
    no_grace = rotated(record, new, T0 + 5, grace_s=0)
    assert no_grace.previous_sha256 is None and not no_grace.opens(digest(old), T0 + 5)


def test_a_revoked_key_ends_its_grace_period_too() -> None:
    old, record = new_key("acme", "ci", T0)
    after = revoked(rotated(record, new_secret_for(record.key_id), T0, grace_s=60), T0 + 1)
    assert not after.opens(digest(old), T0 + 2)
    with pytest.raises(ConflictError):
        rotated(after, new_secret_for(record.key_id), T0 + 3, grace_s=1)
    with pytest.raises(ConflictError):
        edited(after, {"name": "x"}, T0 + 3)


@given(
    steps=st.lists(
        st.tuples(st.floats(0, 100), st.floats(0, 100)), min_size=1, max_size=8
    ),  # (seconds later, grace of that rotation)
    probe=st.floats(0, 300),
)
def test_only_the_newest_and_the_previous_in_grace_ever_open(steps, probe) -> None:
    secrets = []
    plaintext, record = new_key("acme", "ci", T0, token_bytes=counter_bytes())
    secrets.append(plaintext)
    now = T0
    for later, grace in steps:
        now += later
        fresh = new_secret_for(record.key_id)
        record = rotated(record, fresh, now, grace)
        secrets.append(fresh)
    at = now + probe
    opened = [record.opens(digest(s), at) for s in secrets]
    assert opened[-1]  # the newest always
    assert not any(opened[:-2])  # nothing older than the previous one
    grace = steps[-1][1]
    assert opened[-2] == (grace > 0 and at < now + grace)  # the same float sums as the rule


def test_metadata_limits() -> None:
    assert check_metadata({"team": "search"}) is None
    assert "at most" in (check_metadata({f"k{i}": "v" for i in range(MAX_TAGS + 1)}) or "")
    assert check_metadata({"": "v"}) is not None
    assert check_metadata({"k" * 65: "v"}) is not None
    assert check_metadata({"k": "v" * 257}) is not None


def test_edits_touch_only_editable_fields() -> None:
    _, record = new_key("acme", "ci", T0)
    changed = edited(record, {"metadata": {"a": "b"}, "allowed_models": ["chat"]}, T0 + 1)
    assert changed.metadata == {"a": "b"} and changed.allowed_models == ["chat"]
    assert changed.updated == T0 + 1 and changed.sha256 == record.sha256
    with pytest.raises(ValueError, match="not editable"):
        edited(record, {"sha256": "0" * 64}, T0)


def test_the_admin_view_never_holds_a_hash() -> None:
    _, record = new_key("acme", "ci", T0, metadata={"team": "x"})
    record = rotated(record, new_secret_for(record.key_id), T0, grace_s=10)
    view = public_view(record, T0 + 1)
    assert view["previous_valid_until"] == T0 + 10 and view["status"] == "active"
    assert record.sha256 not in str(view) and str(record.previous_sha256) not in str(view)
    assert public_view(record, T0 + 11)["previous_valid_until"] is None
