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


def message_to_json(message: Message, *, defaults: bool = False) -> dict[str, Any]:
    """``message`` as Triton's JSON. ``defaults``: every field, with its default where unset (messages and oneof
    members only where set), as Triton hands a config to python models; otherwise only the fields that are set."""
    out: dict[str, Any] = {}
    fields: list[tuple[Any, Any]]  # (FieldDescriptor, value): protobuf's stubs type the descriptor two ways
    if defaults:
        fields = [(f, getattr(message, f.name)) for f in message.DESCRIPTOR.fields]
    else:
        fields = list(message.ListFields())
    for field, value in fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {str(k): _scalar(value_field, v, defaults) for k, v in value.items()}
        elif field.label == FieldDescriptor.LABEL_REPEATED:
            out[field.name] = [_scalar(field, v, defaults) for v in value]
        elif defaults and (field.message_type is not None or field.containing_oneof is not None) and not (
            message.HasField(field.name)
        ):
            continue  # an unset message, or an unset member of a oneof: absent, as protobuf prints them
        else:
            out[field.name] = _scalar(field, value, defaults)
    return out


def _scalar(field: FieldDescriptor, value: Any, defaults: bool = False) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return message_to_json(value, defaults=defaults)
    if field.type == FieldDescriptor.TYPE_ENUM and field.enum_type is not None:
        enum_value = field.enum_type.values_by_number.get(value)
        return enum_value.name if enum_value is not None else value
    if field.type in _INT64:
        return int(value)
    return value
