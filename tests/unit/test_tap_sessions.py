"""Session turns from the tap: linking turns by header or prefix chain, counting context misses."""

from kvscope.agent.tap.prefix import PrefixIndex, render_prompt
from kvscope.agent.tap.sessions import SessionTracker, parse_session_id


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _conversation(user: str, turns: int) -> list[dict]:
    """Chat bodies of one conversation: each turn repeats the history, then adds a message."""
    messages = [{"role": "system", "content": "You are a helpful assistant. " * 8}]
    bodies = []
    for i in range(turns):
        messages = [*messages, {"role": "user", "content": f"{user} question {i}: " + "why is the sky blue? " * 6}]
        bodies.append({"model": "m", "messages": list(messages)})
        messages = [*messages, {"role": "assistant", "content": f"answer {i} " + "because of scattering. " * 10}]
    return bodies


def _turn(tracker, index, body, headers=None, prompt_tokens=100, cached=None, upstream="http://10.0.0.5:8000"):
    match = index.observe(render_prompt(body), upstream)
    turn = tracker.begin(match, parse_session_id(headers or {}, body))
    return tracker.finish(turn, "acme", upstream, prompt_tokens, cached)


def _totals(tracker):
    return ({s.labels: s.value for s in tracker.turns.render()}, {s.labels: s.value for s in tracker.misses.render()})


def test_prefix_chain_links_turns_and_counts_lost_context():
    tracker, index = SessionTracker(clock=Clock()), PrefixIndex()
    bodies = _conversation("alice", 4)
    v = [
        _turn(tracker, index, bodies[0], prompt_tokens=120, cached=0),
        _turn(tracker, index, bodies[1], prompt_tokens=250, cached=112),  # kept turn 1's 120 (block-aligned)
        _turn(tracker, index, bodies[2], prompt_tokens=380, cached=0),  # evicted: recomputed everything
        _turn(tracker, index, bodies[3], prompt_tokens=510, cached=352),
    ]
    assert [x.follow_up for x in v] == [False, True, True, True]
    assert [x.missed for x in v] == [None, False, True, False]
    turns, misses = _totals(tracker)
    lab = (("instance", "10.0.0.5:8000"), ("tenant", "acme"))
    assert turns == {lab: 3} and misses == {lab: 1}
    assert tracker.stats["follow_up_chain"] == 3


def test_separate_conversations_with_a_shared_system_prompt_are_not_linked():
    tracker, index = SessionTracker(clock=Clock()), PrefixIndex()
    for user in ("alice", "bob", "carol"):
        assert not _turn(tracker, index, _conversation(user, 1)[0], cached=0).follow_up
    assert not _turn(tracker, index, _conversation("alice", 1)[0], cached=100).follow_up  # a resend is no new turn


def test_session_header_links_turns_whatever_the_prompt():
    tracker, index = SessionTracker(clock=Clock()), PrefixIndex()
    h = {"X-Session-ID": "conv-42"}
    _turn(tracker, index, {"prompt": "first"}, h, prompt_tokens=300, cached=0)
    v = _turn(tracker, index, {"prompt": "something else"}, h, prompt_tokens=400, cached=96)
    assert v.follow_up and v.missed
    assert tracker.stats["follow_up_id"] == 1
    body = {"prompt": "x", "session_id": "conv-7"}
    _turn(tracker, index, body, prompt_tokens=50, cached=0)
    assert _turn(tracker, index, body, prompt_tokens=60, cached=32).follow_up
    assert tracker.stats["follow_up_id"] == 2


def test_unknown_cached_tokens_leave_the_series_absent():
    tracker, index = SessionTracker(clock=Clock()), PrefixIndex()
    bodies = _conversation("alice", 2)
    _turn(tracker, index, bodies[0], prompt_tokens=120)
    v = _turn(tracker, index, bodies[1], prompt_tokens=250, cached=None)
    assert v.follow_up and v.missed is None
    assert tracker.render() == []


def test_a_session_idle_past_the_window_starts_over():
    clock = Clock()
    tracker, index = SessionTracker(window_s=600, clock=clock), PrefixIndex(window_s=10_000, clock=clock)
    h = {"X-Session-ID": "s"}
    _turn(tracker, index, {"prompt": "a"}, h, prompt_tokens=300, cached=0)
    clock.t += 601
    assert not _turn(tracker, index, {"prompt": "b"}, h, prompt_tokens=300, cached=0).follow_up


def test_memory_is_bounded_and_ids_are_not_kept():
    tracker, index = SessionTracker(max_sessions=100, clock=Clock()), PrefixIndex()
    for i in range(1000):
        _turn(tracker, index, {"prompt": f"p{i}"}, {"X-Session-ID": f"secret-session-{i}"}, cached=0)
    assert len(tracker) == 100 and tracker.stats["evicted"] == 900
    assert all(b"secret" not in k for k in tracker._sessions)


def test_session_id_sources():
    assert parse_session_id({"X-Session-ID": " a "}, {"session_id": "b"}, "X-Session-ID") == "a"
    assert parse_session_id({}, {"session_id": "b"}, "X-Session-ID") == "b"
    assert parse_session_id({}, {"session_id": 3}, "X-Session-ID") is None
    assert parse_session_id({"X-Session-ID": "a"}, None, None) is None
