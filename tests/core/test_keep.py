"""Tests for gpuspawner.core.keep: the keep buttons' text and what a keep request may carry."""

import pytest

from gpuspawner.core.keep import (
    MAX_KEEP_SECONDS,
    KeepRequestError,
    keep_label,
    keep_request,
    kept_text,
)

AT = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC


@pytest.mark.parametrize(
    ("seconds", "label"),
    [
        (3600, "Keep for 1 h"),
        (14400.0, "Keep for 4 h"),
        (5400, "Keep for 90 min"),
        (20, "Keep for 1 min"),
    ],
)
def test_a_choice_reads_in_hours_when_whole_else_minutes(seconds, label):
    assert keep_label(seconds) == label


def test_kept_text_names_the_time_in_utc():
    assert kept_text(AT + 3600) == "Kept until 09:00 UTC."


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"server": "", "seconds": 3600}, ("", 3600)),
        ({"server": "train", "seconds": "14400"}, ("train", 14400)),
        ({"server": "é-1", "seconds": 3600.0}, ("é-1", 3600)),
        ({"seconds": " 60 "}, ("", 60)),
    ],
)
def test_a_request_gives_its_server_and_whole_seconds(data, expected):
    assert keep_request(data) == expected


@pytest.mark.parametrize(
    "data",
    [
        {"server": "a/b", "seconds": 3600},
        {"server": "x\n", "seconds": 3600},
        {"server": "x" * 256, "seconds": 3600},
        {"server": ["x"], "seconds": 3600},
        {"server": "", "seconds": True},
        {"server": "", "seconds": 0},
        {"server": "", "seconds": -3600},
        {"server": "", "seconds": 3600.5},
        {"server": "", "seconds": float("nan")},
        {"server": "", "seconds": "1e3"},
        {"server": "", "seconds": "٣٦٠٠"},  # digits, but not ASCII ones
        {"server": "", "seconds": MAX_KEEP_SECONDS + 1},
        {"server": ""},
    ],
)
def test_anything_else_is_refused_with_one_sentence(data):
    with pytest.raises(KeepRequestError) as e:
        keep_request(data)
    message = str(e.value)
    assert message.endswith(".") and message.count(". ") == 0, message
