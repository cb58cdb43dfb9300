"""`NappletIdentity.origin`: a napplet opened from a URL is named with its origin
(the chooser's and the consent dialog's input carry it; listed napplets do not)."""

from __future__ import annotations

from napllm.shell import NappletIdentity


def test_identity_without_origin_keeps_its_shape() -> None:
    napplet = NappletIdentity("chat", "ab" * 32)
    assert napplet.to_json() == {"name": "chat", "sha256": "ab" * 32, "shortHash": "ab" * 6}


def test_identity_from_a_url_carries_its_origin() -> None:
    napplet = NappletIdentity("chat", "cd" * 32, origin="http://127.0.0.1:8123")
    assert napplet.to_json()["origin"] == "http://127.0.0.1:8123"
    # identities loaded from different origins are not equal
    assert napplet != NappletIdentity("chat", "cd" * 32)
