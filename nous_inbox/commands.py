"""What the loop tells its driver to do, and which claim each boundary of a run makes.

The loop (:func:`~nous_inbox.loop.advance`) answers every happening with one command:
:class:`Claim` a queue, :class:`CallModel`, :class:`RunTools` or :class:`EndTurn`. The claims are
read from one table, :data:`CLAIMS`, keyed by the boundary they are made at
(:data:`~nous_inbox.boundary.BoundaryKind`): the loop's transitions issue them, an owner names the
boundary it tells its subscribers by them (:attr:`Claim.boundary`), and a driver whose framework
does not say which boundary it reached (the aimu adapter) asks :func:`round_claims` and
:func:`worth_a_round`. None of them decides a claim of its own.

>>> CLAIMS["stop"]
Claim(target=<Target.NEXT_STEP: 'next_step'>, wake_only=True)
>>> CLAIMS["stop"].boundary
'stop'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final

import msgspec
from pyrsistent import PVector

from nous_inbox.boundary import BoundaryKind
from nous_inbox.events import TurnEndReason
from nous_inbox.frozen import freeze_json
from nous_inbox.inbox import is_blank
from nous_inbox.message import Message, ToolCall
from nous_inbox.verbs import Target

__all__ = [
    "CLAIMS",
    "OPENING",
    "CallModel",
    "Claim",
    "Command",
    "EndTurn",
    "RunTools",
    "ToolSpec",
    "round_claims",
    "worth_a_round",
]


class ToolSpec(msgspec.Struct, frozen=True, omit_defaults=True, repr_omit_defaults=True):
    """What a model is told about one tool: its name, what it is for, and a JSON schema of its
    arguments (``{"type": "object", "properties": ...}``). Treat ``parameters`` as read-only: it
    is the spec's own copy, in key order.

    >>> ToolSpec("ls", "List a folder.", {"type": "object"}).to_dict()
    {'name': 'ls', 'description': 'List a folder.', 'parameters': {'type': 'object'}}
    """

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"ToolSpec.name must be a non-empty str, got {self.name!r}")
        if not isinstance(self.description, str):
            raise TypeError(
                f"ToolSpec.description must be a str, got {type(self.description).__name__}"
            )
        if not isinstance(self.parameters, Mapping):
            raise TypeError(
                f"ToolSpec.parameters must be a mapping, got {type(self.parameters).__name__}"
            )
        freeze_json(self.parameters, "ToolSpec.parameters")  # refuses what JSON cannot carry
        # A private deep copy, in the given key order (models read a schema in order).
        copied = msgspec.json.decode(msgspec.json.encode(self.parameters))
        msgspec.structs.force_setattr(self, "parameters", copied)

    def to_dict(self) -> dict[str, Any]:
        """Plain dicts and lists (a copy), ready to hand to a model API."""
        parameters = msgspec.json.decode(msgspec.json.encode(self.parameters))
        return {"name": self.name, "description": self.description, "parameters": parameters}


class Claim(msgspec.Struct, frozen=True, repr_omit_defaults=True):
    """The command: claim ``target`` and report ``ClaimAnswered``. With ``wake_only``, claim
    only if an entry on it asked for a wake and is worth a model round (``Inbox.claim(target,
    wake_only=True)`` decides); otherwise report ``ClaimAnswered`` with no messages and leave
    the queue alone. Which claim each boundary makes is :data:`CLAIMS`.

    Claiming: ``Claim`` asks, ``ClaimAnswered`` answers, ``QueueClaimed`` is recorded, ``Claimed``
    is the view."""

    target: Target
    wake_only: bool = False

    @property
    def boundary(self) -> BoundaryKind:
        """The boundary this claim is made at, read back from :data:`CLAIMS`: what an owner
        tells its boundary subscribers before it claims (a wake-only claim of ``next_turn``,
        which no boundary makes, is still a turn's opening).

        >>> Claim(Target.NEXT_STEP, wake_only=True).boundary
        'stop'
        """
        return _BOUNDARY_OF.get((self.target, self.wake_only), "turn_opening")


class CallModel(msgspec.Struct, frozen=True):
    """Ask the model, with this transcript and these tools; report ``ModelAnswered``."""

    transcript: PVector[Message]
    tools: tuple[ToolSpec, ...] = ()


class RunTools(msgspec.Struct, frozen=True):
    """Run these tool calls; report ``ToolsFinished`` with one tool message per call, in order."""

    calls: tuple[ToolCall, ...]


class EndTurn(msgspec.Struct, frozen=True):
    """The turn is over; nothing more to do."""

    reason: TurnEndReason


Command = Claim | CallModel | RunTools | EndTurn


CLAIMS: Final[Mapping[BoundaryKind, Claim]] = MappingProxyType({
    "turn_opening": Claim(Target.NEXT_TURN),
    "step": Claim(Target.NEXT_STEP),
    "stop": Claim(Target.NEXT_STEP, wake_only=True),
})
"""The claim each boundary of a run makes: a turn opening claims ``next_turn`` and a step
boundary ``next_step`` (ruling 1); where the run would stop (a would-be final answer, a spent
budget) it claims ``next_step`` only for a waking message worth a round (ruling 2)."""

_BOUNDARY_OF: Final[Mapping[tuple[str, bool], BoundaryKind]] = MappingProxyType({
    (claim.target, claim.wake_only): kind for kind, claim in CLAIMS.items()
})

OPENING: Final[tuple[Claim, ...]] = (CLAIMS["turn_opening"], CLAIMS["step"])
"""The claims before a turn's first request: the turn's opening, then its first step."""


def round_claims(first: bool) -> tuple[Claim, ...]:
    """The claims at a round boundary of a framework that runs its own rounds and does not say
    which boundary it reached (aimu calls its inbox's drain alike after tools ran, after an
    empty reply and at what would be its final answer): at the run's ``first`` such boundary,
    the turn's opening claims (:data:`OPENING`), since the framework made its first request
    without asking; after it, a step boundary's.

    They are plain claims, never wake-only: the driver cannot tell a would-be final answer
    from a step, so it cannot make the difference ruling 2 makes there, and an injection then
    extends the run as a steer does. Such a framework makes a round of whatever it is handed,
    so what the claims take is handed over only when :func:`worth_a_round`.

    >>> [claim.boundary for claim in round_claims(first=True)], round_claims(first=False)
    (['turn_opening', 'step'], (Claim(target=<Target.NEXT_STEP: 'next_step'>),))
    """
    return OPENING if first else (CLAIMS["step"],)


def worth_a_round(messages: Iterable[Message]) -> bool:
    """Whether claimed ``messages`` are worth a model round (ruling 4): one of them is not blank
    (``Message.blank``: whitespace, or only invisible characters). A claim that is not worth it
    still delivers, with a request the run makes anyway, but it never extends a run, replaces
    a nudge or refills the budget.

    >>> worth_a_round([Message.user(" \\u200b")]), worth_a_round([Message.user("stop")])
    (False, True)
    """
    return not is_blank(messages)
