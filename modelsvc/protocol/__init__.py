"""The v2 (KServe/Triton) inference protocol: datatypes, messages, codecs and errors. No I/O."""

from ._datatypes import (
    ALL_DATATYPES,
    CONFIG_TO_WIRE,
    NUMPY_DTYPES,
    WIRE_TO_CONFIG,
    deserialize_bytes_tensor,
    element_size,
    numpy_dtype,
    serialize_bytes_tensor,
    wire_datatype,
)
from ._errors import (
    ErrorKind,
    InternalError,
    InvalidArgument,
    ModelsvcError,
    NotFound,
    Unavailable,
    Unsupported,
)
from ._http_codec import (
    HEADER_CONTENT_LENGTH,
    decode_infer_request,
    decode_infer_response,
    encode_error,
    encode_infer_request,
    encode_infer_response,
    encode_json,
)
from ._types import InferRequest, InferResponse, Parameters, RequestedOutput, Tensor

__all__ = [
    "ALL_DATATYPES",
    "CONFIG_TO_WIRE",
    "HEADER_CONTENT_LENGTH",
    "NUMPY_DTYPES",
    "WIRE_TO_CONFIG",
    "ErrorKind",
    "InferRequest",
    "InferResponse",
    "InternalError",
    "InvalidArgument",
    "ModelsvcError",
    "NotFound",
    "Parameters",
    "RequestedOutput",
    "Tensor",
    "Unavailable",
    "Unsupported",
    "decode_infer_request",
    "decode_infer_response",
    "deserialize_bytes_tensor",
    "element_size",
    "encode_error",
    "encode_infer_request",
    "encode_infer_response",
    "encode_json",
    "numpy_dtype",
    "serialize_bytes_tensor",
    "wire_datatype",
]
