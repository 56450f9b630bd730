import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpc.errors import HpcError
from hpc.slurm.formats import format_memory, format_time, parse_memory, parse_time


@pytest.mark.parametrize("text, seconds", [
    ("30", 30 * 60),                  # minutes
    ("30:15", 30 * 60 + 15),          # minutes:seconds
    ("2:03:04", 2 * 3600 + 3 * 60 + 4),
    ("1-0", 86400),                   # days-hours
    ("1-02", 86400 + 2 * 3600),
    ("1-02:30", 86400 + 2 * 3600 + 30 * 60),
    ("2-00:00:00", 2 * 86400),
    ("100:00:00", 100 * 3600),        # hours may exceed 23
    (90, 90 * 60),
])
def test_parse_time_spellings(text, seconds):
    assert parse_time(text) == seconds


@pytest.mark.parametrize("text", ["UNLIMITED", "infinite"])
def test_unlimited(text):
    assert parse_time(text) is None
    assert format_time(None) == "UNLIMITED"


@pytest.mark.parametrize("bad", ["", "1:60", "0", "00:00:00", "1-", "-5", "1h", "1:2:3:4", "1.5", True, 0, "1-2:61"])
def test_parse_time_rejects(bad):
    with pytest.raises(HpcError):
        parse_time(bad)


@settings(max_examples=500)
@given(st.integers(min_value=1, max_value=400 * 86400))
def test_time_round_trip(seconds):
    assert parse_time(format_time(seconds)) == seconds


@pytest.mark.parametrize("text, mib", [
    ("4000", 4000), (4000, 4000), ("64G", 65536), ("64g", 65536), ("1T", 1024 * 1024), ("512M", 512),
    ("2048K", 2), ("1K", 1), ("1.5G", 1536), ("16GB", 16384), ("16GiB", 16384),
])
def test_parse_memory(text, mib):
    assert parse_memory(text) == mib


@pytest.mark.parametrize("bad", ["", "4X", "-1G", "G", "0", 0, "1,5G", False])
def test_parse_memory_rejects(bad):
    with pytest.raises(HpcError):
        parse_memory(bad)


@settings(max_examples=500)
@given(st.integers(min_value=1, max_value=2**40))
def test_memory_round_trip(mib):
    text = format_memory(mib)
    assert parse_memory(text) == mib
    assert text[-1] in "MGT"
