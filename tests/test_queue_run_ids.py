"""``queue.new_run_id``: the id of every run the claim starts (and every skipped run) is a random version 4 UUID in its
canonical text form, exactly what ``str(uuid.uuid4())`` gives, with every random bit used."""

from __future__ import annotations

import uuid

from scheduler.core.queue import new_run_id


def test_a_new_run_id_is_a_canonical_version_4_uuid() -> None:
    ids = [new_run_id() for _ in range(4000)]
    assert len(set(ids)) == len(ids)
    for run_id in ids:
        parsed = uuid.UUID(run_id)
        assert str(parsed) == run_id and len(run_id) == 36
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
    # every other digit is random: each position shows all 16 digits (the variant digit its four) over 4000 ids
    for position in range(36):
        seen = {run_id[position] for run_id in ids}
        expected = {"-"} if position in (8, 13, 18, 23) else {"4"} if position == 14 else set("89ab") if position == 19 \
            else set("0123456789abcdef")
        assert seen == expected, position
