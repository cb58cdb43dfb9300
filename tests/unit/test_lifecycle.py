"""The generation lifecycle table (`napllm.lifecycle`): one terminal result by construction."""

from __future__ import annotations

import itertools

import pytest

from napllm.lifecycle import (
    TRANSITIONS,
    GenEvent,
    GenState,
    Lifecycle,
    LifecycleError,
)


def at(state: GenState) -> Lifecycle:
    life = Lifecycle()
    path = {
        GenState.CHECKING: [],
        GenState.CONSENT: [GenEvent.ASK_CONSENT],
        GenState.RUNNING: [GenEvent.SUBMIT],
        GenState.FLUSHING: [GenEvent.SUBMIT, GenEvent.FLUSH],
        GenState.SETTLED: [GenEvent.SETTLE],
    }[state]
    for event in path:
        life.fire(event)
    assert life.state is state
    return life


@pytest.mark.parametrize(("state", "event"), list(itertools.product(GenState, GenEvent)))
def test_only_the_table_moves_a_generation(state: GenState, event: GenEvent) -> None:
    life = at(state)
    if (state, event) in TRANSITIONS:
        assert life.can(event)
        assert life.fire(event) is TRANSITIONS[(state, event)]
    else:
        assert not life.can(event)
        with pytest.raises(LifecycleError):
            life.fire(event)
        assert life.state is state  # a refused event changes nothing


def test_settled_is_final_and_reachable_from_every_other_state() -> None:
    assert not [row for row in TRANSITIONS if row[0] is GenState.SETTLED]
    for state in GenState:
        if state is not GenState.SETTLED:
            assert TRANSITIONS[(state, GenEvent.SETTLE)] is GenState.SETTLED
    # so SETTLE succeeds exactly once, whatever happened before
    life = at(GenState.FLUSHING)
    life.fire(GenEvent.SETTLE)
    assert life.settled and not life.can(GenEvent.SETTLE)


def test_deltas_flow_only_while_submitted() -> None:
    assert [s for s in GenState if at(s).delivering] == [GenState.RUNNING, GenState.FLUSHING]


def test_consent_comes_before_submission_never_after() -> None:
    assert not at(GenState.RUNNING).can(GenEvent.ASK_CONSENT)
    assert not at(GenState.CONSENT).can(GenEvent.ASK_CONSENT)


def test_an_endpoint_is_live_until_it_closes_and_closes_once() -> None:
    from napllm.lifecycle import ENDPOINT_TRANSITIONS, EndpointEvent, EndpointLife, EndpointState

    life = EndpointLife()
    assert life.state is EndpointState.LIVE and life.live
    assert life.fire(EndpointEvent.CLOSE) is EndpointState.CLOSED
    assert not life.live and not life.can(EndpointEvent.CLOSE)
    with pytest.raises(LifecycleError):
        life.fire(EndpointEvent.CLOSE)
    # CLOSED has no row: a closed endpoint never comes back (a reload is a new one).
    assert all(state is not EndpointState.CLOSED for state, _ in ENDPOINT_TRANSITIONS)


def test_a_closed_endpoints_messages_are_not_read() -> None:
    import asyncio

    from harness import Harness, generate

    async def go() -> list[object]:
        h = Harness()
        h.connect()
        ep = h.endpoint()
        handle = await h.select(ep)
        endpoint = h.shell._endpoints[ep]
        h.shell.close_endpoint(ep)
        assert not endpoint.life.live
        h.send(ep, generate("g1", handle))
        await h.settle()
        return h.out(ep)

    assert all(e.get("id") != "g1" for e in asyncio.run(go()) if isinstance(e, dict))


def test_an_endpoints_close_transition_is_observable_before_it_is_forgotten() -> None:
    import asyncio

    from harness import Harness, Recorder

    from napllm.lifecycle import EndpointState

    seen: list[tuple[str, EndpointState | None]] = []

    async def go() -> tuple[EndpointState | None, EndpointState | None]:
        h = Harness()
        h.connect()
        ep = h.endpoint()
        await h.select(ep)

        class Watch(Recorder):
            def endpoint_closed(self, endpoint_id: str) -> None:
                seen.append((endpoint_id, h.shell.endpoint_state(endpoint_id)))

        h.shell._observer = Watch()
        before = h.shell.endpoint_state(ep)
        h.shell.close_endpoint(ep)
        h.shell.close_endpoint(ep)  # closing twice reports once
        return before, h.shell.endpoint_state(ep)

    before, after = asyncio.run(go())
    assert before is EndpointState.LIVE
    assert [state for _, state in seen] == [EndpointState.CLOSED]
    assert after is None


def test_the_select_flow_is_one_row_per_chooser_answer() -> None:
    from napllm.errors import ErrorCode
    from napllm.selections import SELECT_FLOW, PickVerdict

    assert set(SELECT_FLOW) == set(PickVerdict)
    assert [v for v, step in SELECT_FLOW.items() if step.binds] == [PickVerdict.BOUND]
    assert [v for v, step in SELECT_FLOW.items() if step.show_again] == [PickVerdict.OLD_LIST]
    # A row binds, shows again or answers one error; only GONE does none (nothing is sent).
    for verdict, step in SELECT_FLOW.items():
        assert step.binds + step.show_again + (step.error is not None) == (
            verdict is not PickVerdict.GONE
        )
    assert SELECT_FLOW[PickVerdict.DECLINED].error is ErrorCode.USER_CANCELLED
    assert SELECT_FLOW[PickVerdict.NOT_OFFERED].error is ErrorCode.SELECTION_EXPIRED
