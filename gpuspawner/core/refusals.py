"""Refusals: the :class:`Refusal` type, its reasons, and every refusal sentence in one table.

A refused spawn request is a :class:`Refusal`: a sentence (sometimes two) the
user can act on, the HTTP status, and a short reason code, which is also the
label of the hub's refusal metric (:mod:`gpuspawner.hub.metrics`).

Every refusal's words are in :data:`SENTENCES`: by reason, the reason's HTTP
status and its sentences by name, each a :meth:`str.format` template with
named fields. Code builds a refusal with :func:`refuse` and the values to fill
in, never with a sentence of its own::

    raise refuse(REASON_INVALID, "image-without-gpus", image=image.display_name)

A refusal of several sentences names them in order; their fields are filled
from the same keywords. A field written ``{value!q}`` is user input: it is
quoted and escaped with :func:`shown` (``{error!Q}`` keeps up to
:data:`LONG_SHOWN_LENGTH` characters), so a hostile value is shown as text,
never as a line break, a NUL or a terminal escape. The other fields are
numbers, the catalog's names, and lists the caller made of quoted values.

The text helpers are here too: :func:`shown` quotes user input (and every
log line that repeats it uses it), :func:`escape_unprintable` escapes what a
terminal or a log would act on, :func:`listing` joins choices ("a, b or c").

The bottom of the core: this module imports nothing of the package, so every
module can build refusals and quote user input.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType
from typing import Any

# ---------------------------------------------------------------------------
# text helpers: how user input is shown
# ---------------------------------------------------------------------------

#: How many characters of a value :func:`shown` keeps by default.
SHOWN_LENGTH = 40


def escape_unprintable(text: str) -> str:
    """``text`` with every character that is not printable written as an escape.

    NUL, CR/LF, ESC, bidirectional overrides: as ``\\x..`` or ``\\u....``, so that
    a user's string can neither start a terminal sequence, forge a log or table
    line, nor turn the rest of a line around.
    """
    return "".join(
        c if c.isprintable() else (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
        for c in text
    )


def shown(value: Any, limit: int = SHOWN_LENGTH) -> str:
    """User input as a message or a log line may show it: quoted, escaped and short.

    Strings are quoted as Python writes them (``'jax'``), every character
    that is not printable — NUL, newline, ESC, bidirectional overrides — is
    escaped (``'a\\nb'``), and anything longer than ``limit`` characters is cut,
    with "..." after the closing quote.
    """
    if isinstance(value, str):
        text = repr(value[:limit]) + ("..." if len(value) > limit else "")
    else:
        text = repr(value)
        if len(text) > limit:
            text = text[:limit] + "..."
    # repr escapes control characters already; this holds for any object's repr.
    return escape_unprintable(text)


def listing(values: Iterable[str], conjunction: str = "or") -> str:
    """ "a", "a or b", "a, b or c"."""
    values = list(values)
    if len(values) <= 1:
        return "".join(values)
    return ", ".join(values[:-1]) + f" {conjunction} " + values[-1]


# ---------------------------------------------------------------------------
# reasons (the label of the refusal metric)
# ---------------------------------------------------------------------------

#: The request is not one the catalog (or the profile list) accepts.
REASON_INVALID = "invalid-request"
#: An ``<option>--unlisted-choice`` that the option does not enable, or whose value it refuses.
REASON_UNLISTED_CHOICE = "unlisted-choice"
#: A profile that does not exist, or that the user may not use (the same answer for both).
REASON_NO_PROFILE = "no-such-profile"
#: Over the user's GPU limit (total or per type).
REASON_LIMIT = "limit"
#: Over a group's shared pool of GPUs.
REASON_GROUP_POOL = "group-pool"
#: The user's GPU-hours budget is spent, or its rest cannot run the request long enough.
REASON_BUDGET = "budget"
#: The user's GPUs could not be counted: the cluster did not answer.
REASON_USAGE_UNKNOWN = "usage-unknown"
#: No node could ever hold the request.
REASON_NEVER = "never-schedulable"
#: No node can hold the request now (or it waited in the queue too long).
REASON_NO_CAPACITY = "no-capacity"
#: The pod was created but the scheduler found no node for it for too long.
REASON_UNSCHEDULABLE = "unschedulable"
#: The catalog cannot be read, so no server can start.
REASON_CATALOG_INVALID = "catalog-invalid"
#: The GPUs a pod was given failed the in-pod check.
REASON_GPU_CHECK = "gpu-check"
#: The pod started but Jupyter did not answer in time.
REASON_TIMEOUT = "timeout"

#: How many characters of a long value (an error message) a ``{field!Q}`` keeps.
LONG_SHOWN_LENGTH = 200


@dataclass(frozen=True)
class Wording:
    """One reason's HTTP status and its sentences, by name."""

    status: int
    sentences: Mapping[str, str]


#: Every refusal sentence, by reason and name. ``{field!q}``: user input, quoted.
SENTENCES: Mapping[str, Wording] = MappingProxyType(
    {
        REASON_INVALID: Wording(
            400,
            {
                "options-not-object": (
                    'The server options must be a JSON object such as {{"profile": "..."}}.'
                ),
                "user-options-not-object": (
                    "'user_options' must be an object (or null) of server options."
                ),
                "options-not-accepted": "The server options were not accepted: {error!Q}.",
                "not-a-choice": "{value!q} is not a choice for {title}: choose one of {choices}.",
                "no-such-type": "There is no GPU type {value!q}: choose {types}.",
                "no-such-type-cpu-only": (
                    "There is no GPU type {value!q}, and {image} runs without GPUs."
                ),
                "type-not-for-image": "{image} cannot run on {gpu_type} GPUs: choose {types}.",
                "type-not-for-cpu-image": "{image} cannot run on {gpu_type} GPUs: choose 0 GPUs.",
                "no-gpu-type": "{image} has no GPU type configured; ask an admin.",
                "image-without-gpus": "{image} cannot be given GPUs: choose 0 GPUs.",
                "cpu-not-allowed": (
                    "{image} cannot run without GPUs: choose a number of GPUs ({counts})."
                ),
                "count-invalid": "{value!q} is not a valid number of GPUs: choose one of {counts}.",
                "count-not-allowed": (
                    "{gpus} is not an allowed number of GPUs: choose one of {counts}."
                ),
                "count-not-for-type": (
                    "{gpus} is not an allowed number of {gpu_type} GPUs: choose {counts}."
                ),
                # the idle timeout a user chooses (minutes, within the image's bounds)
                "idle-timeout-unreadable": (
                    "{value!q} is not an idle timeout: give minutes as a number from "
                    "{minimum} to {maximum}, such as {minimum}."
                ),
                "idle-timeout-bounds": (
                    "The idle timeout for {image} must be between {minimum} and {maximum} "
                    "minutes; you asked for {minutes}."
                ),
                "idle-timeout-not-offered": (
                    "{image} has no idle timeout to choose: leave it out, and the hub's "
                    "idle rule applies."
                ),
            },
        ),
        REASON_UNLISTED_CHOICE: Wording(
            400,
            {
                "no-such-option": (
                    "{key!q} is not accepted: there is no option {option!q} "
                    "with an unlisted choice."
                ),
                "not-enabled": (
                    "{key!q} is not accepted: {title} has no unlisted choice, "
                    "so send {option!q} with {choices}."
                ),
                "value-refused": "{value!q} is not accepted as the other choice for {title}: {hint}.",
            },
        ),
        # 403 where the catalog hides images: "you may not use this" is true of both.
        REASON_NO_PROFILE: Wording(
            400,
            {
                "no-such-profile": (
                    "There is no profile {value!q} you may use: choose one of {choices}."
                ),
            },
        ),
        REASON_LIMIT: Wording(
            403,
            {
                "limit-zero": (
                    "Your GPU limit is 0 ({rule}): you can start servers without GPUs. "
                    "Ask an admin if you need GPUs."
                ),
                "type-barred": "You may not use {gpu_type} GPUs ({rule}): choose another GPU type.",
                "over-limit": (
                    "You asked for {wanted} GPUs but your limit is {limit}. "
                    "Ask for {limit} or fewer."
                ),
                "over-type-limit": (
                    "You asked for {wanted} {gpu_type} GPUs but your limit is {limit}. "
                    "Ask for {limit} or fewer."
                ),
                "using": "You are using {used} of your {limit} GPUs (servers: {servers}).",
                "using-type": (
                    "You are using {used} of your {limit} {gpu_type} GPUs (servers: {servers})."
                ),
                "stop-or-ask-for-room": "Stop one of them or ask for {room} or fewer.",
                "stop-or-ask-for-fewer": "Stop one of them or ask for fewer GPUs.",
            },
        ),
        REASON_GROUP_POOL: Wording(
            403,
            {
                "pool-full": (
                    "The group '{group}' is using {used} of its {cap} shared GPUs. "
                    "Try again when its members stop servers, or ask for fewer GPUs."
                ),
            },
        ),
        REASON_BUDGET: Wording(
            403,
            {
                "budget-zero": (
                    "Your GPU-hours budget is 0 ({rule}): you can start servers without GPUs. "
                    "Ask an admin if you need GPUs."
                ),
                "spent": (
                    "You have used all {limit} of your GPU-hours {period}; "
                    "your budget resets {reset}."
                ),
                "short": (
                    "The {remaining} GPU-hours left of your budget {period} would run {label} "
                    "for only {duration}, less than {minimum}; choose fewer GPUs, "
                    "or wait until {reset}."
                ),
            },
        ),
        REASON_USAGE_UNKNOWN: Wording(
            503,
            {
                "cluster-silent": (
                    "Your GPU usage could not be checked because the cluster did not answer. "
                    "Please try again in a minute."
                ),
                "budget-unknown": (
                    "Your GPU-hours could not be checked against your budget because the "
                    "usage database did not answer. Please try again in a minute."
                ),
            },
        ),
        REASON_NEVER: Wording(
            400,
            {
                # first sentence: why
                "no-node-of-type": "No node that can run servers has {gpu_type} GPUs.",
                "no-node-of-type-one-excluded": (
                    "No node that can run servers has {gpu_type} GPUs "
                    "({excluded} is cordoned or not ready)."
                ),
                "no-node-of-type-excluded": (
                    "No node that can run servers has {gpu_type} GPUs "
                    "({excluded} are cordoned or not ready)."
                ),
                "too-large": "No node has {request}; the largest has {largest}.",
                "quota-too-small": (
                    "The cluster's GPU queue {queue!q} can never admit {request}: its quota, "
                    "with what it may borrow, is {largest} at most."
                ),
                "quota-none": "The cluster's GPU queue {queue!q} has no quota for {gpu_type} GPUs.",
                # second sentence: what to do
                "choose-or-ask-admin": "Choose {alternatives}, or ask an admin.",
                "ask-admin": "Please ask an admin.",
                "ask-for-fewer": "Ask for {largest} or fewer.",
                "ask-for-fewer-or-choose": "Ask for {largest} or fewer, or choose {alternatives}.",
            },
        ),
        REASON_NO_CAPACITY: Wording(
            503,
            {
                # first sentence: why
                "kueue-timeout": (
                    "The server waited {seconds:.0f} seconds in the cluster's GPU queue for "
                    "{request} without being admitted, so it was not started."
                ),
                "queue-timeout": (
                    "No node had {gpus} free {gpu_type} GPUs within {seconds:.0f} seconds, "
                    "so the server was not started."
                ),
                "all-in-use": "No node has {request} free right now: all {total} are in use.",
                "free-on-nodes": (
                    "No node has {request} free right now: {free} of {total} are free, "
                    "at most {largest} on one node."
                ),
                "free-on-node": "No node has {request} free right now: {free} of {total} are free.",
                # then what to do
                "fewer-choose-or-later": (
                    "Ask for {largest} or fewer, choose {alternatives}, or try again later."
                ),
                "fewer-or-later": "Ask for {largest} or fewer, or try again later.",
                "choose-or-later": "Choose {alternatives}, or try again later.",
                "later": "Try again later.",
            },
        ),
        # Spawns that fail after admission (or before it, for the whole hub): the
        # spawner raises them as its SpawnException, with these sentences.
        REASON_UNSCHEDULABLE: Wording(
            503,
            {
                "not-scheduled": (
                    "The server was not started because no node had the GPUs for it for "
                    "{seconds:.0f} seconds. {detail} Ask for fewer GPUs or another GPU type, "
                    "or try again later."
                ),
            },
        ),
        REASON_CATALOG_INVALID: Wording(
            500,
            {
                "queue-missing": (
                    "The cluster's GPU queue {queue!q} is not set up, so no GPU server can "
                    "start right now. Please tell an admin."
                ),
                "queue-unreadable": (
                    "The cluster's GPU queue could not be read, so the server was not started. "
                    "Please try again in a minute."
                ),
                "misconfigured": (
                    "The GPU catalog is misconfigured, so no server can start right now. "
                    "Please tell an admin (the hub log names the problem)."
                ),
            },
        ),
        REASON_GPU_CHECK: Wording(
            503,
            {
                "failed": "The GPUs given to this server failed their check, so it was not started: {detail}",
                # The check never ran (no python3 in its image): nothing is known of the GPUs.
                "not-run": "The GPUs given to this server could not be checked, so it was not started: {detail}",
            },
        ),
        REASON_TIMEOUT: Wording(
            503,
            {
                "no-answer": (
                    "Jupyter did not answer within {seconds:g} {unit} of its pod starting, so the "
                    "server was stopped: try again, and if it happens again ask an admin to read "
                    "the log of pod {pod}."
                ),
            },
        ),
    }
)


class Refusal(ValueError):
    """A spawn request that is refused, with a message for the user.

    A ``ValueError`` as well, because that is what KubeSpawner raises for bad
    ``user_options``: code written for KubeSpawner that catches it around
    ``load_user_options`` sees GPUSpawner's refusals too. Build one with
    :func:`refuse`, so that its words come from :data:`SENTENCES`.
    """

    def __init__(self, message: str, *, status: int = 400, reason: str = REASON_INVALID):
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason

    @property
    def jupyterhub_message(self) -> str:
        """The sentence JupyterHub shows on its pages and in API errors."""
        return self.message


class _Wording(string.Formatter):
    """``str.format`` with ``!q`` (quoted, :func:`shown`) and ``!Q`` (the same, longer)."""

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        if conversion == "q":
            return shown(value)
        if conversion == "Q":
            return shown(value, LONG_SHOWN_LENGTH)
        return super().convert_field(value, conversion)


_FORMATTER = _Wording()


@cache
def fields(reason: str, name: str) -> frozenset[str]:
    """The named fields of one sentence (KeyError: no such reason or sentence)."""
    template = SENTENCES[reason].sentences[name]
    return frozenset(field for _, field, _, _ in _FORMATTER.parse(template) if field)


def sentence(reason: str, name: str, **values: Any) -> str:
    """One sentence of the table, filled in."""
    return _FORMATTER.format(SENTENCES[reason].sentences[name], **values)


def refuse(reason: str, *names: str, status: int | None = None, **values: Any) -> Refusal:
    """The :class:`Refusal` for ``reason``: its sentences ``names``, filled with ``values``.

    ``status`` overrides the reason's HTTP status. The values must be exactly
    the sentences' fields, so a misspelt or forgotten one fails at once.
    """
    if reason not in SENTENCES:
        raise KeyError(f"no refusal reason {reason!r}")
    if not names:
        raise TypeError(f"refuse({reason!r}) names no sentence")
    wording = SENTENCES[reason]
    for name in names:
        if name not in wording.sentences:
            raise KeyError(f"no sentence {name!r} for the refusal reason {reason!r}")
    wanted = frozenset().union(*(fields(reason, name) for name in names))
    if wanted != values.keys():
        raise TypeError(
            f"refuse({reason!r}, {', '.join(map(repr, names))}) takes the fields "
            f"{sorted(wanted)}, not {sorted(values)}"
        )
    message = " ".join(sentence(reason, name, **values) for name in names)
    return Refusal(message, status=wording.status if status is None else status, reason=reason)
