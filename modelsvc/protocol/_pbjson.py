"""Protobuf messages as the JSON Triton serves: field names as in the proto, 64-bit integers as numbers.

Shared by the server (``/config``) and the gRPC client (``ModelConfig`` answers read as that same JSON).

protobuf's own json_format writes int64 as strings; Triton's /config writes them as numbers, and
clients such as perf_analyzer read them as numbers.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

_INT64 = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}


def message_to_json(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field, value in message.ListFields():
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {str(k): _scalar(value_field, v) for k, v in value.items()}
        elif field.label == FieldDescriptor.LABEL_REPEATED:  # type: ignore[attr-defined]
            out[field.name] = [_scalar(field, v) for v in value]
        else:
            out[field.name] = _scalar(field, value)
    return out


def _scalar(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return message_to_json(value)
    if field.type == FieldDescriptor.TYPE_ENUM and field.enum_type is not None:
        enum_value = field.enum_type.values_by_number.get(value)
        return enum_value.name if enum_value is not None else value
    if field.type in _INT64:
        return int(value)
    return value
