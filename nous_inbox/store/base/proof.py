"""The read-back proof: a store acknowledges only an event it has shown decodes back equal.

For the two events every message makes (its send and its claim), :func:`reads_back` judges the
exact type and range of each field instead of decoding (the checks msgspec's decoder would
make); everything else is decoded and compared by the template (:meth:`StoreBase._prove
<nous_inbox.store.base.template.StoreBase._prove>`). The proof names every field it judges, and
refuses to import when a judged type gains one it does not name. The batch's digest (how a
retried append is recognised) and the refusal of an event no log format can hold live here too.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from nous_inbox.codec import JSON_LINES, MSGPACK
from nous_inbox.events import Event, MessageSent, QueueClaimed
from nous_inbox.message import ROLES, Message
from nous_inbox.verbs import Target

__all__ = [
    "PROVEN_FIELDS", "batch_digest", "check_proof", "first_unencodable", "reads_back", "refused",
]

_INF: Final = math.inf
_NO_METADATA: Final = next(f.default for f in msgspec.structs.fields(Message)
                           if f.name == "metadata")
_INT64_MAX: Final = 2**63 - 1


def reads_back(event: Event) -> bool:
    """Whether ``event`` decodes back equal from its bare encoding, judged by the exact type
    and range of every field: ``False`` means "decode it and see".

    The proof an append needs, made without decoding, for the two events every message makes
    (its send and its claim) when they hold only what a decoder gives back as it was given: a
    ``Target`` member, a ``bool``, an ``int`` count in range, an ``int`` seq, a finite ``float``
    time, and a message whose role is one of the four, whose content is ASCII text, whose
    blankness is what that text makes it, and which has no other field. These are the checks
    msgspec's decoder would make, made on the value; anything else (non-ASCII text, metadata, a
    value of a wrong type however it got there, a message altered past its own checks) is
    decoded and compared as before.
    """
    # (Read through ``Any``, not ``cast``: this runs for every send and claim, and a ``cast``
    # is a function call.)
    judged: Any = event
    kind = type(judged)
    seq = judged.seq
    at = judged.at
    if type(seq) is not int or type(at) is not float or not (
        0 <= seq <= _INT64_MAX and -_INF < at < _INF
    ):
        return False
    if kind is MessageSent:
        message = judged.message
        if type(message) is not Message or type(judged.target) is not Target or (
            type(judged.wakeup) is not bool
        ):
            return False
        role = message.role
        content = message.content
        calls = message.tool_calls
        return (
            type(role) is str and role in ROLES and type(content) is str and content.isascii()
            and message.name is None and message.tool_call_id is None and message.id is None
            and message.metadata is _NO_METADATA and type(calls) is tuple and not calls
            and message.blank is (not content or content.isspace())  # as decoding decides it
        )
    if kind is QueueClaimed:
        count = judged.count
        rest = judged.rest
        return (
            type(judged.target) is Target and type(count) is int and type(rest) is int
            and 0 <= count <= _INT64_MAX and 0 <= rest <= _INT64_MAX
        )
    return False


#: The fields :func:`reads_back` judges, type by type. It proves only what it names: a field
#: added to one of these types later would pass unjudged, and an event holding a value that
#: does not read back would be acknowledged. So the module refuses to import until the proof is
#: revisited (a raise, not an ``assert``, which ``python -O`` would drop).
PROVEN_FIELDS: Final[dict[type[msgspec.Struct], frozenset[str]]] = {
    MessageSent: frozenset({"seq", "at", "target", "wakeup", "message"}),
    QueueClaimed: frozenset({"seq", "at", "target", "count", "rest"}),
    Message: frozenset({"role", "content", "name", "tool_call_id", "id", "metadata",
                        "tool_calls", "blank"}),
}


def check_proof(proven_fields: Mapping[type[msgspec.Struct], frozenset[str]]) -> None:
    """Raise ``ImportError`` if a judged type has a field the proof does not name (or names one
    it lacks). Called once below, at import; a test calls it with a proof that falls short."""
    for kind, proven in proven_fields.items():
        if frozenset(kind.__struct_fields__) != proven:
            raise ImportError(
                f"reads_back judges {sorted(proven)} of {kind.__name__}, which has "
                f"{sorted(kind.__struct_fields__)}: extend the proof to every field"
            )


check_proof(PROVEN_FIELDS)


def batch_digest(records: list[bytes]) -> bytes:
    """What tells a batch of records from any other: their lengths and bytes, hashed."""
    digest = hashlib.blake2b(digest_size=16)
    for record in records:
        digest.update(len(record).to_bytes(8, "big"))
        digest.update(record)
    return digest.digest()


def first_unencodable(events: list[Event]) -> int:
    """The index of the first event either log format cannot encode (0 when every one encodes)."""
    for i, event in enumerate(events):
        try:
            JSON_LINES.encode(event)
            MSGPACK.encode(event)
        except (TypeError, ValueError, OverflowError, RecursionError):
            return i
    return 0


def refused(stream: str, index: int, event: Event, exc: BaseException) -> Exception:
    """The error refusing ``events[index]`` of an append to ``stream``, which ``exc`` stopped."""
    reason = "nested too deeply to encode or decode" if isinstance(exc, RecursionError) else str(exc)
    cls = TypeError if isinstance(exc, TypeError) else ValueError
    return cls(
        f"append to {stream!r}: events[{index}] ({type(event).__name__}) cannot be stored: "
        f"{reason}; nothing was written"
    )
