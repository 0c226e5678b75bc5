"""The ways to send: the two queues a message can wait on, and the one table of send verbs.

A send names the queue it joins (:class:`Target`) and whether it asks to wake an idle agent. The
combinations worth a name are the verbs, and every place that offers them reads this table (the
inbox value's presets, a session port's, the owners', the command line's commands, the web face's
modes, the mailbox's notices), so a verb means the same wherever it is said:

============  =============  =====  ===============================================================
verb          queue          wakes  meaning
============  =============  =====  ===============================================================
``steer``     ``next_step``  yes    read this before your next model request
``inject``    ``next_step``  no     have this to hand if you make another request
``followup``  ``next_turn``  yes    answer this after you finish what you are doing
``prompt``    ``next_turn``  yes    a person's prompt: a turn of its own, after any turn in progress
============  =============  =====  ===============================================================

A prompt waits like a followup and the log stores it as one (a send has one form); what makes it
a turn of its own (``Verb.own_turn``) is the owner that takes it, which opens the turn it wakes
as a prompt's (``TurnStarted.reason == "prompt"``). Any other send is the primitive,
``send(message, target, wakeup)``: a next-turn message that wakes nothing (the mailbox's notice
joining the turn that opens) has no verb.

>>> VERBS["steer"].target, VERBS["steer"].wakeup
(<Target.NEXT_STEP: 'next_step'>, True)
>>> list(VERBS)
['steer', 'inject', 'followup', 'prompt']
>>> as_verb("nudge")
Traceback (most recent call last):
...
ValueError: verb must be one of steer, inject, followup, prompt, got 'nudge'
>>> name_of("next_turn", True), name_of("next_turn", False)
('followup', None)
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, Literal, get_args

import msgspec

__all__ = [
    "FOLLOWUP", "INJECT", "PROMPT", "STEER", "VERBS", "Target", "Verb", "VerbName", "as_verb",
    "name_of",
]


class Target(enum.StrEnum):
    """Which boundary a message waits for. Plain strings ``"next_turn"``/``"next_step"`` work too."""

    NEXT_TURN = "next_turn"
    NEXT_STEP = "next_step"

    def __str__(self) -> str:
        return self.value


VerbName = Literal["steer", "inject", "followup", "prompt"]
"""A verb's name, as a type: a request body decoded with it refuses any other (the web face's)."""


class Verb(msgspec.Struct, frozen=True):
    """One way to send: where the message waits and what the send asks for.

    ``target`` is the queue it joins; ``wakeup`` whether it asks to wake an idle agent;
    ``own_turn`` whether the turn it wakes is its own, opened as a prompt's by the owner that
    takes it (the log stores the send as it stores a followup); ``meaning`` the verb in a
    sentence, as the command line's help says it.

    >>> PROMPT.own_turn, FOLLOWUP.own_turn
    (True, False)
    >>> (PROMPT.target, PROMPT.wakeup) == (FOLLOWUP.target, FOLLOWUP.wakeup)
    True
    """

    name: VerbName
    target: Target
    wakeup: bool
    own_turn: bool
    meaning: str


STEER: Final = Verb("steer", Target.NEXT_STEP, True, False,
                    "read this before your next model request")
INJECT: Final = Verb("inject", Target.NEXT_STEP, False, False,
                     "have this to hand if you make another request")
FOLLOWUP: Final = Verb("followup", Target.NEXT_TURN, True, False,
                       "answer this after you finish what you are doing")
PROMPT: Final = Verb("prompt", Target.NEXT_TURN, True, True,
                     "a person's prompt: a turn of its own, after any turn in progress")

VERBS: Final[Mapping[str, Verb]] = MappingProxyType(
    {verb.name: verb for verb in (STEER, INJECT, FOLLOWUP, PROMPT)})
"""Every send verb by name, in the order a person meets them (read-only)."""
assert tuple(VERBS) == get_args(VerbName), "VerbName names the table's verbs, in its order"

# The first verb of a (queue, wake) pair names it, so a stored prompt reads as a followup.
_NAMED: Final = {(verb.target.value, verb.wakeup): verb.name
                 for verb in reversed(tuple(VERBS.values()))}


def as_verb(name: object, what: str = "verb") -> Verb:
    """The verb called ``name``; else a ``ValueError`` (a ``TypeError`` for a name that is not a
    string) saying what was asked for (``what``) and naming the verbs.

    >>> as_verb("inject").wakeup
    False
    >>> as_verb(["steer"], "mode")
    Traceback (most recent call last):
    ...
    TypeError: mode must be a string (one of steer, inject, followup, prompt), got list
    """
    if type(name) is not str:  # a list or a dict would not even hash
        raise TypeError(f"{what} must be a string (one of {', '.join(VERBS)}), got "
                        f"{type(name).__name__}")
    found = VERBS.get(name)
    if found is None:
        raise ValueError(f"{what} must be one of {', '.join(VERBS)}, got {name!r}")
    return found


def name_of(target: Target | str, wakeup: bool) -> str | None:
    """The verb a stored send reads as: the first in the table with its queue and wake (a prompt
    is stored as a followup, so it reads as one), or ``None`` for a send no verb names.

    >>> name_of(Target.NEXT_STEP, False)
    'inject'
    """
    return _NAMED.get((str(target), wakeup))
