"""Which standing grants belong to a napplet (napllm.grants; docs/design.md, "Napplet identity").

The page revokes a napplet's grants when its frame leaves the sandboxed page;
it used to pick them by the name and the 12-digit hash the panel shows, so a
napplet sharing both with another lost the other's grants too. The runtime
now picks them by the identity it keyed them by.
"""

from __future__ import annotations

from napllm.grants import Grants, keys_of_napplet
from napllm.shell_ports import NappletIdentity

CHAT = NappletIdentity("chat", "ab" * 32)
# Same name, same shown hash (first 12 digits), other bytes.
LOOKALIKE = NappletIdentity("chat", "ab" * 6 + "cd" * 26)
OTHER_NAME = NappletIdentity("chat2", "ab" * 32)


def test_a_napplets_grants_are_picked_by_its_full_identity() -> None:
    grants = Grants(lambda: None)
    for napplet in (CHAT, LOOKALIKE, OTHER_NAME):
        grants.remember(napplet, "fx", "default")
    grants.remember(CHAT, "other", "work")
    keys = keys_of_napplet(grants.all(), CHAT)
    assert [grants_by_key(grants)[k] for k in keys] == [
        (CHAT, "fx", "default"),
        (CHAT, "other", "work"),
    ]
    # the look-alike shows the same name and short hash, but is not covered
    assert LOOKALIKE.short_hash == CHAT.short_hash
    assert keys_of_napplet(grants.all(), LOOKALIKE) == [grants.all()[1].key]


def test_origin_and_domains_do_not_change_which_grants_are_a_napplets() -> None:
    grants = Grants(lambda: None)
    grants.remember(CHAT, "fx", "default")
    from_url = NappletIdentity("chat", "ab" * 32, frozenset(), "https://example.org")
    assert keys_of_napplet(grants.all(), from_url) == [grants.all()[0].key]


def grants_by_key(grants: Grants) -> dict[str, tuple[NappletIdentity, str, str]]:
    return {g.key: (g.napplet, g.connection_id, g.account) for g in grants.all()}
