"""Cluster-aware admission: can this GPU request be scheduled, now or ever, and what to tell the user.

Pure decisions over :class:`~gpuspawner.inventory.model.Availability` figures:

- :func:`check_capacity` refuses a request no node could *ever* hold
  ("No node has 8 NVIDIA A100 GPUs; the largest has 4…") and one that no node
  can hold *now* — or, when the admin enables queueing, lets it wait;
- :class:`WaitQueue` orders the requests that wait, per GPU type;
- :func:`explain_unschedulable` turns the scheduler's "0/5 nodes are
  available: 2 Insufficient nvidia.com/gpu, …" into plain words, and says
  whether too few free GPUs is the reason (the only case that fails fast);
- :func:`figures_label` is the "N free of M (at most K on one node)" text the
  form shows.

Refusals are :class:`~gpuspawner.core.refusals.Refusal` with reasons
``never-schedulable`` and ``no-capacity``, their sentences from the table in
:mod:`gpuspawner.core.refusals`, so they reach users like every other refusal.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from ..core.availability import Availability
from .refusals import REASON_NEVER, REASON_NO_CAPACITY, Refusal, listing, refuse
from .serverpod import is_gpu_resource

# Defined with the other facts read from pods and with the other refusal reasons;
# the hub's code reads them from here.
from .refusals import REASON_UNSCHEDULABLE as REASON_UNSCHEDULABLE  # isort: skip
from .serverpod import unschedulable_message as unschedulable_message  # isort: skip


def _gpus(n: int, name: str = "") -> str:
    noun = "GPU" if n == 1 else "GPUs"
    return f"{n} {name} {noun}" if name else f"{n} {noun}"


def figures_label(availability: Availability | None) -> str:
    """The form's figures for a type, e.g. "5 free of 8 (at most 4 on one node)"."""
    if availability is None:
        return ""
    if not availability.nodes:
        return "no node available"
    text = f"{availability.free} free of {availability.allocatable}"
    if len(availability.nodes) > 1:
        text += f" (at most {availability.largest_free} on one node)"
    return text


# ---------------------------------------------------------------------------
# admission
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """The outcome of :func:`check_capacity` for a request that is not refused."""

    wait: bool  # True: no node can hold it now and queueing is on
    message: str = ""


def _alternatives(
    gpus: int, others: Mapping[str, Availability], *, now: bool
) -> list[tuple[str, int]]:
    found = []
    for name, availability in others.items():
        if availability.fits_now(gpus) if now else availability.fits_ever(gpus):
            found.append((name, availability.free))
    return found


def never_refusal(
    display_name: str, gpus: int, availability: Availability, others: Mapping[str, Availability]
) -> Refusal:
    """Why a request can never be scheduled, and what would work instead."""
    alternatives = [name for name, _ in _alternatives(gpus, others, now=False)]
    choose = {"alternatives": listing(alternatives)} if alternatives else {}
    if not availability.nodes:
        excluded = len(availability.excluded)
        return refuse(
            REASON_NEVER,
            "no-node-of-type"
            if not excluded
            else "no-node-of-type-one-excluded"
            if excluded == 1
            else "no-node-of-type-excluded",
            "choose-or-ask-admin" if alternatives else "ask-admin",
            gpu_type=display_name,
            **({"excluded": excluded} if excluded else {}),
            **choose,
        )
    return refuse(
        REASON_NEVER,
        "too-large",
        "ask-for-fewer-or-choose" if alternatives else "ask-for-fewer",
        request=_gpus(gpus, display_name),
        largest=availability.largest_node,
        **choose,
    )


def never_message(
    display_name: str, gpus: int, availability: Availability, others: Mapping[str, Availability]
) -> str:
    """The sentences of :func:`never_refusal`."""
    return never_refusal(display_name, gpus, availability, others).message


def busy_refusal(
    display_name: str,
    gpus: int,
    availability: Availability,
    others: Mapping[str, Availability],
    *,
    waited: float | None = None,
) -> Refusal:
    """Why a request cannot be scheduled right now, with the current figures.

    ``waited``: the seconds the request waited in the queue before it gave up,
    said first.
    """
    free, total, largest = availability.free, availability.allocatable, availability.largest_free
    alternatives = [f"{name} ({free} free)" for name, free in _alternatives(gpus, others, now=True)]
    # Each sentence's values, so the fields always match the sentences chosen.
    timeout = (
        {"gpus": gpus, "gpu_type": display_name, "seconds": waited} if waited is not None else {}
    )
    many_nodes = len(availability.nodes) > 1
    figures: dict[str, Any] = {"request": _gpus(gpus, display_name), "total": total}
    if free:
        figures |= {"free": free, "largest": largest} if many_nodes else {"free": free}
    advice: dict[str, Any] = {"largest": largest} if largest > 0 else {}
    if alternatives:
        advice["alternatives"] = listing(alternatives)
    return refuse(
        REASON_NO_CAPACITY,
        *(["queue-timeout"] if waited is not None else []),
        "all-in-use" if free == 0 else "free-on-nodes" if many_nodes else "free-on-node",
        "fewer-choose-or-later"
        if largest > 0 and alternatives
        else "fewer-or-later"
        if largest > 0
        else "choose-or-later"
        if alternatives
        else "later",
        **(timeout | figures | advice),
    )


def busy_message(
    display_name: str, gpus: int, availability: Availability, others: Mapping[str, Availability]
) -> str:
    """The sentences of :func:`busy_refusal`."""
    return busy_refusal(display_name, gpus, availability, others).message


def check_capacity(
    display_name: str,
    gpus: int,
    availability: Availability,
    others: Mapping[str, Availability] | None = None,
    *,
    queueing: bool = False,
) -> Verdict:
    """Admit, let wait, or refuse (:class:`Refusal`) a request for ``gpus`` GPUs of one type.

    ``others`` maps the display names of the other types the image may use
    to their figures, to suggest one that would work.
    """
    others = others or {}
    if gpus <= 0:
        return Verdict(wait=False)
    if not availability.fits_ever(gpus):
        raise never_refusal(display_name, gpus, availability, others)
    if availability.fits_now(gpus):
        return Verdict(wait=False)
    if queueing:
        return Verdict(wait=True, message=queue_message(display_name, gpus, availability, 1, 1))
    raise busy_refusal(display_name, gpus, availability, others)


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, …, 11th, 12th, 13th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def queue_message(
    display_name: str, gpus: int, availability: Availability, place: int, waiting: int
) -> str:
    """The progress line of a request that waits: its place and what it waits for.

    "2nd in line for 4 × NVIDIA A100 (3 waiting): 2 of 8 are free, at most 1
    on one node. It starts as soon as one node has 4 free."
    """
    if availability.free == 0:
        figures = f"all {availability.allocatable} are in use"
    else:
        figures = (
            f"{availability.free} of {availability.allocatable} are free, "
            f"at most {availability.largest_free} on one node"
        )
    return (
        f"{ordinal(place)} in line for {gpus} × {display_name} ({waiting} waiting): "
        f"{figures}. It starts as soon as one node has {gpus} free."
    )


def after_claims(availability: Availability, claims: Iterable[int]) -> Availability:
    """The figures once admitted requests whose pods are not placed yet take their GPUs.

    The inventory counts a pod's GPUs only once it is bound to a node; until
    then, GPUs promised to an admitted request still look free, and a second
    request (from the queue, or another user at the same moment) would be let
    in for the same GPUs, only to wait Pending. Each claim, largest first,
    takes the node with the fewest free GPUs that can hold it (the best fit);
    a claim no node can hold takes nothing (its pod will wait, holding none).
    """
    nodes = list(availability.nodes)
    for claim in sorted((c for c in claims if c > 0), reverse=True):
        fitting = [i for i, n in enumerate(nodes) if n.free >= claim]
        if not fitting:
            continue
        best = min(fitting, key=lambda i: (nodes[i].free, nodes[i].node))
        nodes[best] = replace(nodes[best], requested=nodes[best].requested + claim)
    return replace(availability, nodes=tuple(nodes))


class WaitQueue:
    """Requests waiting for GPUs, first come first served per GPU type.

    A waiting request may start when it fits now and no request ahead of it
    (for the same type) fits: the oldest request that can start, starts, and
    a large request does not block smaller ones behind it forever.
    """

    def __init__(self) -> None:
        self._order = itertools.count()
        # type -> ticket -> (arrival, GPUs, owner)
        self._waiting: dict[str, dict[Any, tuple[int, int, Any]]] = {}

    def join(self, type_key: str, ticket: Any, gpus: int, owner: Any = None) -> None:
        """Add a request; ``owner`` (the server's ``(user, server)``) names it in :meth:`owners`."""
        self._waiting.setdefault(type_key, {})[ticket] = (next(self._order), gpus, owner)

    def leave(self, type_key: str, ticket: Any) -> None:
        waiting = self._waiting.get(type_key, {})
        waiting.pop(ticket, None)
        if not waiting:
            self._waiting.pop(type_key, None)

    def _ordered(self, type_key: str) -> list[tuple[Any, int]]:
        waiting = self._waiting.get(type_key, {})
        return [(t, g) for t, (_, g, _) in sorted(waiting.items(), key=lambda item: item[1][0])]

    def owners(self, type_key: str) -> set[Any]:
        """The owners of the requests waiting for a type (their GPUs are not promised yet)."""
        return {owner for _, _, owner in self._waiting.get(type_key, {}).values()}

    def requests(self) -> list[tuple[str, int]]:
        """``(type, GPUs)`` of every waiting request, in order of arrival per type."""
        return [(key, gpus) for key in sorted(self._waiting) for _, gpus in self._ordered(key)]

    def waiting(self) -> list[tuple[Any, str, int]]:
        """``(owner, type, GPUs)`` of every waiting request (for :func:`person_demand`)."""
        return [
            (owner, key, gpus)
            for key in sorted(self._waiting)
            for _, gpus, owner in sorted(self._waiting[key].values(), key=lambda w: w[0])
        ]

    def place(self, type_key: str, ticket: Any) -> tuple[int, int]:
        """(1-based place, number waiting) of a ticket."""
        ordered = [t for t, _ in self._ordered(type_key)]
        return ordered.index(ticket) + 1, len(ordered)

    def may_start(self, type_key: str, ticket: Any, availability: Availability) -> bool:
        for other, gpus in self._ordered(type_key):
            if other is ticket:
                return availability.fits_now(gpus)
            if availability.fits_now(gpus):
                return False
        return False

    def __len__(self) -> int:
        return sum(len(w) for w in self._waiting.values())


class RefusedDemand(NamedTuple):
    """A request refused for lack of free GPUs, counted as demand until ``until`` (monotonic)."""

    user: str
    gpu_type: str
    gpus: int
    until: float
    #: How many more GPUs of the type the user could take when refused (None: no limit).
    allowance: float | None = None


def person_demand(
    refused: Iterable[RefusedDemand], queued: Iterable[tuple[Any, str, int]]
) -> list[tuple[str, str, int]]:
    """``(source, type, GPUs)`` of what waits for GPUs, one entry per person and type.

    A person asks for GPUs once, however many servers they ask from: refusals
    are summed per person and capped at what that person may still take (the
    smallest allowance their refusals saw), so five named servers of a user
    with a 2-GPU limit are 2 GPUs of demand, not 10. ``queued`` holds
    ``(owner, type, GPUs)``: the queue admitted each request within the
    person's limits, so their sum is what they may take. An owner is a
    ``(user, server)`` pair; a request without one counts alone.
    """
    out: list[tuple[str, str, int]] = []
    per_person: dict[tuple[Any, str], int] = {}
    for index, (owner, gpu_type, gpus) in enumerate(queued):
        person = owner[0] if isinstance(owner, tuple) and owner else ("anonymous", index)
        per_person[(person, gpu_type)] = per_person.get((person, gpu_type), 0) + gpus
    out += [("queued", gpu_type, gpus) for (_, gpu_type), gpus in per_person.items() if gpus > 0]

    totals: dict[tuple[str, str], int] = {}
    caps: dict[tuple[str, str], float] = {}
    for r in refused:
        key = (r.user, r.gpu_type)
        totals[key] = totals.get(key, 0) + r.gpus
        if r.allowance is not None:
            caps[key] = min(caps.get(key, r.allowance), r.allowance)
    for key, total in totals.items():
        gpus = min(total, int(caps[key] + _EPSILON)) if key in caps else total
        if gpus > 0:
            out.append(("refused", key[1], gpus))
    return sorted(out)


_EPSILON = 1e-9


# ---------------------------------------------------------------------------
# the scheduler's reasons
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Unschedulable:
    """A pod the scheduler could not place: the reason in plain words."""

    message: str
    insufficient_gpus: bool
    raw: str


_TERM = re.compile(r"^\s*(\d+)\s+(.*?)\s*$")


def _plain_term(
    count: int, text: str, gpu_resources: Iterable[str], gpu_name: str
) -> tuple[str, bool]:
    nodes = "node" if count == 1 else "nodes"
    has = "has" if count == 1 else "have"
    is_ = "is" if count == 1 else "are"
    insufficient = re.fullmatch(r"Insufficient (\S+)", text)
    if insufficient:
        resource = insufficient.group(1)
        if is_gpu_resource(resource, gpu_resources):
            return f"{count} {nodes} {has} too few free {gpu_name or resource}", True
        what = {"cpu": "CPU", "memory": "memory", "pods": "pod slots"}.get(resource, resource)
        return f"{count} {nodes} {has} too little free {what}", False
    if "didn't match Pod's node affinity/selector" in text:
        return f"{count} {nodes} {is_} not of this GPU type", False
    if "were unschedulable" in text or "node.kubernetes.io/unschedulable" in text:
        return f"{count} {nodes} {is_} cordoned", False
    if "node.kubernetes.io/not-ready" in text or "node.kubernetes.io/unreachable" in text:
        return f"{count} {nodes} {is_} not ready", False
    if "untolerated taint" in text:
        return (
            f"{count} {nodes} {is_} reserved for other work (a taint this server does not tolerate)",
            False,
        )
    return f"{count} {nodes}: {text}", False


def explain_unschedulable(
    message: str, gpu_resources: Iterable[str] = (), gpu_name: str = ""
) -> Unschedulable:
    """The scheduler's message in plain words.

    ``"0/5 nodes are available: 2 Insufficient nvidia.com/gpu, 3 node(s) didn't
    match Pod's node affinity/selector. preemption: …"`` becomes "No node can
    take this server yet: 2 nodes have too few free NVIDIA A100 GPUs, 3 nodes
    are not of this GPU type."
    """
    resources = set(gpu_resources)
    head = message.split(". preemption:", 1)[0].strip().rstrip(".")
    match = re.match(r"^\s*\d+/(\d+) nodes are available:\s*(.*)$", head)
    if not match:
        if "no nodes available" in head:
            return Unschedulable(
                "The cluster has no node that can run servers yet.", False, message
            )
        return Unschedulable(f"The scheduler cannot place this server yet: {head}.", False, message)
    parts: list[str] = []
    gpus_short = False
    for term in match.group(2).split(", "):
        found = _TERM.match(term)
        if not found:
            parts.append(term)
            continue
        text, is_gpu = _plain_term(int(found.group(1)), found.group(2), resources, gpu_name)
        gpus_short = gpus_short or is_gpu
        parts.append(text)
    return Unschedulable(
        f"No node can take this server yet: {', '.join(parts)}.", gpus_short, message
    )
