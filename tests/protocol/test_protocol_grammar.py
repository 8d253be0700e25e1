"""modelsvc.protocol's one reading of the two grammars both halves read: ``grpc-timeout`` and ``pad_inputs``."""

from __future__ import annotations

import logging

import pytest

from logicd._admission import DeadlineError, parse_deadline
from logicd._infer import Padding
from modelsvc.protocol import PadEntry, grpc_timeout_s, pad_entries


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("1500m", 1.5), (b"2S", 2.0), ("1H", 3600.0), ("3M", 180.0), ("250u", 250e-6), ("99999999n", 0.099999999),
     (" 5S ", 5.0), ("0S", 0.0)],
)  # fmt: skip
def test_grpc_timeout_values(value: str | bytes, seconds: float) -> None:
    assert grpc_timeout_s(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["", "S", "15", "1.5S", "-1S", "123456789S", "1s", "1 S", "١S", b"\xff"])
def test_grpc_timeout_refusals(value: str | bytes) -> None:
    assert grpc_timeout_s(value) is None


def test_logicd_refuses_what_the_grammar_cannot_read_and_a_zero_deadline() -> None:
    assert parse_deadline({"grpc-timeout": "1500m"}) == pytest.approx(1.5)
    for bad in ("0m", "1.5S", "123456789S"):
        with pytest.raises(DeadlineError, match="grpc-timeout must be 1 to 8 digits and a unit"):
            parse_deadline({"grpc-timeout": bad})


def test_pad_entries_as_written() -> None:
    assert pad_entries("input_ids:0=0, attention_mask:0,pixel:1=-1.5") == [
        PadEntry("input_ids", "0", "0"),
        PadEntry("attention_mask", "0", None),
        PadEntry("pixel", "1", "-1.5"),
    ]
    assert pad_entries("ns:name:0") == [PadEntry("ns:name", "0", None)]  # the last colon splits


@pytest.mark.parametrize(
    ("text", "message"),
    [("", "has an empty entry"), ("a:0,,b:0", "has an empty entry"), ("input_ids", "'input_ids' is not NAME:AXIS"),
     (":0", "':0' is not NAME:AXIS")],
)  # fmt: skip
def test_pad_entries_refusals(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pad_entries(text)


def test_logicd_reads_pad_inputs_as_the_server_does(caplog: pytest.LogCaptureFixture) -> None:
    def config(text: str) -> dict[str, object]:
        return {"parameters": {"pad_inputs": {"string_value": text}}}

    padding = Padding.from_config("m", config("input_ids:0=0,attention_mask:0=0,token_type_ids:0"))
    assert padding is not None
    assert padding.inputs == {"input_ids": 0, "attention_mask": 0, "token_type_ids": 0}
    with caplog.at_level(logging.WARNING, logger="logicd"):
        assert Padding.from_config("m", config("input_ids,attention_mask:0")) is None
        assert Padding.from_config("m", config("input_ids:x")) is None
    assert len(caplog.records) == 2
    assert "'input_ids' is not NAME:AXIS" in caplog.records[0].getMessage()
