"""Audit records (pure): content-free by construction, versioned, lossless round trip."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memd.core.audit import (
    AUDIT_FORMAT_VERSION,
    MAX_RECORD_BYTES,
    AuditEvent,
    NewerFormat,
    UnreadableLine,
    allowed_fields,
    as_word,
    decode,
    describe_fields,
    encode,
    make_record,
    parse_log,
)

HEAD = {"ts": 1_764_648_000.25, "actor": "daemon", "pid": 42, "uid": 1000}

# A record written by the first release of the format, byte for byte: every
# later release must keep reading it (the format's compatibility promise).
V1_LINE = (
    b'{"v":1,"ts":"2026-12-02T04:00:00.250Z","event":"compaction","agent":"alpha",'
    b'"actor":"daemon","pid":42,"uid":1000,"trigger":"threshold","model":"openai/gpt-4o-mini",'
    b'"remote":true,"redactions":3,"tokens_before":9100,"tokens_after":1200,'
    b'"archive":"history_2026-12-02_04-00-00.md","calls":1,"partial":false}\n'
)


def test_round_trip() -> None:
    record = make_record(
        AuditEvent.PRUNE,
        agent="alpha",
        fields={"archives": 2, "bytes": 4096, "reasons": ["max_archives"], "trigger": "daily"},
        **HEAD,
    )
    line = encode(record)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    back = decode(line)
    assert back.event == "prune" and back.agent == "alpha"
    assert back.fields == {
        "archives": 2,
        "bytes": 4096,
        "reasons": ("max_archives",),
        "trigger": "daily",
    }
    assert back.ts == pytest.approx(HEAD["ts"], abs=1e-3)
    assert json.loads(line)["v"] == AUDIT_FORMAT_VERSION


def test_first_format_version_stays_readable() -> None:
    record = decode(V1_LINE)
    assert record.event == "compaction" and record.agent == "alpha"
    assert record.fields["remote"] is True and record.fields["redactions"] == 3
    assert record.fields["archive"] == "history_2026-12-02_04-00-00.md"


def test_newer_format_is_reported_not_guessed() -> None:
    line = V1_LINE.replace(b'"v":1', b'"v":99')
    with pytest.raises(NewerFormat, match="v99 is newer"):
        decode(line)
    contents = parse_log(V1_LINE + line)
    assert len(contents.records) == 1 and contents.newer == 1 and contents.unreadable == 0


def test_torn_last_line_and_garbage_are_counted_not_read() -> None:
    contents = parse_log(V1_LINE + b"not json\n" + b"[1]\n" + V1_LINE[:40])
    assert len(contents.records) == 1
    assert contents.unreadable == 3


@pytest.mark.parametrize(
    "line", [b'{"ts":"2026-12-02T04:00:00Z","event":"x"}', b'{"v":"1"}', b'{"v":1,"event":"x"}']
)
def test_lines_without_version_or_head_are_unreadable(line: bytes) -> None:
    with pytest.raises(UnreadableLine):
        decode(line)


@pytest.mark.parametrize(
    ("event", "fields", "message"),
    [
        (AuditEvent.ERASE_MATCH, {"pattern": "sk-live-123"}, "not an audit field"),
        (AuditEvent.COMPACTION, {"model": "the user said hello"}, "short word"),
        (AuditEvent.COMPACTION, {"summary": "anything"}, "not an audit field"),
        (AuditEvent.COMPACTION, {"tokens_before": -1}, "non-negative int"),
        (AuditEvent.COMPACTION, {"tokens_before": True}, "non-negative int"),
        (AuditEvent.COMPACTION, {"remote": "yes"}, "expected a bool"),
        (AuditEvent.ERASE_MATCH, {"pattern_hash": "password=hunter2"}, "hex digest"),
        (AuditEvent.PRUNE, {"reasons": "max_archives"}, "list of words"),
        (AuditEvent.PRUNE, {"names": ["a b"]}, "short word"),
    ],
)
def test_anything_but_counts_flags_digests_and_words_is_refused(
    event: AuditEvent, fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message) as info:
        make_record(event, agent="alpha", fields=fields, **HEAD)
    # The refused value is never echoed (it may be the very secret).
    for value in fields.values():
        if isinstance(value, str) and len(value) > 3:
            assert value not in str(info.value)


def test_unknown_event_and_actor_are_refused() -> None:
    with pytest.raises(ValueError):
        make_record("summary_text", **HEAD)
    with pytest.raises(ValueError, match="actor"):
        make_record(AuditEvent.PRUNE, ts=0.0, actor="someone", pid=1, uid=0)


def test_record_size_is_bounded() -> None:
    record = make_record(AuditEvent.PRUNE, fields={"names": ["h" * 200] * 64}, **HEAD)
    with pytest.raises(ValueError, match=str(MAX_RECORD_BYTES)):
        encode(record)


def test_as_word_makes_any_model_name_a_word() -> None:
    assert as_word("openai/gpt-4o-mini") == "openai/gpt-4o-mini"
    cleaned = as_word(" weird model (v2)")
    make_record(AuditEvent.COMPACTION, fields={"model": cleaned}, **HEAD)
    assert " " not in cleaned


def test_describe_fields() -> None:
    record = make_record(
        AuditEvent.PRUNE,
        fields={"archives": 2, "reasons": ["max_archives", "max_age_days"], "dry_run": False},
        **HEAD,
    )
    assert describe_fields(record) == "archives=2 reasons=max_archives,max_age_days dry_run=no"


_ALNUM = "abcXYZ0189"
_words = st.builds(
    str.__add__, st.sampled_from(_ALNUM), st.text(alphabet=_ALNUM + "._:/@+=-", max_size=30)
)


@given(
    event=st.sampled_from(list(AuditEvent)),
    data=st.data(),
    ts=st.floats(min_value=0, max_value=4e9),
)
def test_every_valid_record_round_trips(event: AuditEvent, data: st.DataObject, ts: float) -> None:
    fields: dict[str, object] = {}
    for key, kind in allowed_fields(event).items():
        if not data.draw(st.booleans()):
            continue
        fields[key] = data.draw(
            {
                "count": st.integers(min_value=0, max_value=2**53),
                "flag": st.booleans(),
                "word": _words,
                "words": st.lists(_words, max_size=4),
                "digest": st.text(alphabet="0123456789abcdef", min_size=16, max_size=16),
            }[kind.value]
        )
    record = make_record(event, ts=ts, actor="cli", pid=7, uid=0, agent="a", fields=fields)
    back = decode(encode(record))
    expected = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
    assert back.fields == expected
    assert back.event == event.value
