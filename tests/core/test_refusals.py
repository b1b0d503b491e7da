"""The table of refusal sentences, the constructor, and the rule that every refusal uses them."""

from __future__ import annotations

import ast
import re
import string
from pathlib import Path

import pytest

from gpuspawner.core import admission, options, refusals
from gpuspawner.core.availability import Availability, NodeFigures
from gpuspawner.core.refusals import SENTENCES, Refusal, escape_unprintable, refuse, shown

from ..security.payloads import PAYLOADS

PACKAGE = Path(refusals.__file__).resolve().parents[1]
ENTRIES = [(reason, name) for reason, wording in SENTENCES.items() for name in wording.sentences]
#: Fields that take user input: ``{value!q}`` (or ``!Q``, kept longer).
QUOTED = [
    (reason, name, field, conversion)
    for reason, name in ENTRIES
    for _, field, _, conversion in string.Formatter().parse(SENTENCES[reason].sentences[name])
    if field and conversion in ("q", "Q")
]
#: A field left unfilled: ``{name}``, ``{name!q}``, ``{name:.0f}``.
_PLACEHOLDER = re.compile(r"\{\w+(![a-zA-Z])?(:[^{}]*)?\}")


def sample_values(reason: str, name: str) -> dict[str, object]:
    """A plain value for every field of a sentence (a number where it has a number format;
    a whole sentence for ``detail``, which is one)."""
    template = SENTENCES[reason].sentences[name]
    return {
        field: 3 if spec else ("It broke." if field == "detail" else "X")
        for _, field, spec, _ in string.Formatter().parse(template)
        if field
    }


def source_files() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts]


def calls_named(tree: ast.AST, name: str) -> list[ast.Call]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if called == name:
                found.append(node)
    return found


def reason_of(node: ast.expr) -> str | None:
    """The reason a ``refuse`` call names: a ``REASON_…`` constant, looked up in the table."""
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    if not name.startswith("REASON_"):
        return None
    return getattr(refusals, name, None)


def sentence_names(call: ast.Call) -> set[str]:
    """Every string literal among a ``refuse`` call's sentence names (``a if x else b`` too)."""
    return {
        node.value
        for arg in call.args[1:]
        for node in ast.walk(arg)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


# ---------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------


def test_every_reason_has_a_status_and_a_constant():
    constants = {v for k, v in vars(refusals).items() if k.startswith("REASON_")}
    assert set(SENTENCES) == constants
    for wording in SENTENCES.values():
        assert wording.status in (400, 403, 500, 503)


@pytest.mark.parametrize(("reason", "name"), ENTRIES, ids=[f"{r}:{n}" for r, n in ENTRIES])
def test_every_sentence_formats_with_its_fields_into_one_sentence(reason, name):
    values = sample_values(reason, name)
    assert set(values) == refusals.fields(reason, name)
    refusal = refuse(reason, name, **values)
    text = refusal.message
    assert text == refusals.sentence(reason, name, **values)
    assert refusal.reason == reason and refusal.status == SENTENCES[reason].status
    assert text.endswith("."), text
    assert text[0].isupper() or text[0] in "'0123456789", text
    assert not _PLACEHOLDER.search(text), text
    assert "\n" not in text and "  " not in text and text == text.strip()
    for word in ("Traceback", "Error", "Exception", "None", "{}", "[]"):
        assert word not in text, text


@pytest.mark.parametrize(
    ("reason", "name", "field", "conversion"),
    QUOTED,
    ids=[f"{r}:{n}:{f}" for r, n, f, _ in QUOTED],
)
@pytest.mark.parametrize(("payload_name", "payload"), PAYLOADS, ids=[p for p, _ in PAYLOADS])
def test_user_input_is_quoted_and_escaped(reason, name, field, conversion, payload_name, payload):
    values = sample_values(reason, name) | {field: payload}
    text = refuse(reason, name, **values).message
    limit = refusals.LONG_SHOWN_LENGTH if conversion == "Q" else refusals.SHOWN_LENGTH
    assert shown(payload, limit) in text
    assert all(c.isprintable() for c in text), ascii(text)
    assert len(text) < len(SENTENCES[reason].sentences[name]) + limit + 100
    if not payload.isprintable() or len(payload) > limit:
        assert payload not in text


def test_non_string_user_input_is_quoted_too():
    text = refuse(refusals.REASON_INVALID, "count-invalid", value=[1, "a\nb"], counts="1").message
    assert text.startswith("[1, 'a\\nb'] is not a valid number of GPUs")


# ---------------------------------------------------------------------------
# refuse()
# ---------------------------------------------------------------------------


def test_sentences_are_joined_in_order_with_one_set_of_values():
    refusal = refuse(
        refusals.REASON_LIMIT,
        "using",
        "stop-or-ask-for-room",
        used="1",
        limit="2",
        servers="default",
        room="1",
    )
    assert refusal.message == (
        "You are using 1 of your 2 GPUs (servers: default). Stop one of them or ask for 1 or fewer."
    )
    assert (refusal.status, refusal.reason) == (403, "limit")


def test_a_status_can_be_given():
    refusal = refuse(
        refusals.REASON_NO_PROFILE, "no-such-profile", status=403, value="x", choices=""
    )
    assert refusal.status == 403


@pytest.mark.parametrize(
    "values",
    [{}, {"image": "PyTorch", "colour": "blue"}, {"imag": "PyTorch"}],
    ids=["missing", "extra", "misspelt"],
)
def test_the_fields_must_be_exactly_the_sentences(values):
    with pytest.raises(TypeError, match="takes the fields"):
        refuse(refusals.REASON_INVALID, "image-without-gpus", **values)


def test_an_unknown_reason_or_sentence_is_an_error():
    with pytest.raises(KeyError):
        refuse("no-such-reason", "image-without-gpus", image="x")
    with pytest.raises(KeyError):
        refuse(refusals.REASON_INVALID, "no-such-sentence")
    with pytest.raises(TypeError):
        refuse(refusals.REASON_INVALID)


def test_a_refusal_is_a_value_error_with_its_message():
    refusal = refuse(refusals.REASON_INVALID, "options-not-object")
    assert isinstance(refusal, ValueError)
    assert str(refusal) == refusal.message == refusal.jupyterhub_message
    assert refusal.message == 'The server options must be a JSON object such as {"profile": "..."}.'


def test_the_old_names_still_import_from_options():
    assert options.Refusal is Refusal
    assert options.shown is shown
    assert options.escape_unprintable is escape_unprintable
    assert options.REASON_INVALID == refusals.REASON_INVALID


def test_the_queue_timeout_says_how_long_it_waited_then_why():
    busy = Availability("a100", "nvidia.com/gpu", "NVIDIA A100", (NodeFigures("n1", 4, 4),))
    refusal = admission.busy_refusal("NVIDIA A100", 2, busy, {}, waited=59.6)
    assert refusal.message == (
        "No node had 2 free NVIDIA A100 GPUs within 60 seconds, so the server was not started. "
        "No node has 2 NVIDIA A100 GPUs free right now: all 4 are in use. Try again later."
    )
    assert (refusal.status, refusal.reason) == (503, refusals.REASON_NO_CAPACITY)


# ---------------------------------------------------------------------------
# the rule: every refusal in the package comes from the table
# ---------------------------------------------------------------------------


def test_no_module_builds_a_refusal_of_its_own_words():
    """Only refusals.refuse constructs a ``Refusal``; everything else calls ``refuse``."""
    offenders = []
    for path in source_files():
        if path == Path(refusals.__file__).resolve():
            continue
        tree = ast.parse(path.read_text(), str(path))
        offenders += [
            f"{path.relative_to(PACKAGE.parent)}:{call.lineno}"
            for call in calls_named(tree, "Refusal")
        ]
    assert not offenders, "Refusal(...) outside core/refusals.py: " + ", ".join(offenders)


def test_every_refuse_call_names_a_reason_constant_and_sentences_of_the_table():
    used: set[tuple[str, str]] = set()
    problems = []
    for path in source_files():
        tree = ast.parse(path.read_text(), str(path))
        for call in calls_named(tree, "sentence"):
            # refusals.sentence(REASON_X, "name", ...): the spawner's own failures
            reason = reason_of(call.args[0]) if call.args else None
            if (
                reason in SENTENCES
                and len(call.args) > 1
                and isinstance(call.args[1], ast.Constant)
            ):
                used.add((reason, call.args[1].value))
        for call in calls_named(tree, "refuse"):
            where = f"{path.relative_to(PACKAGE.parent)}:{call.lineno}"
            reason = reason_of(call.args[0]) if call.args else None
            if reason not in SENTENCES:
                problems.append(f"{where}: the reason is not a REASON_ constant")
                continue
            for name in sentence_names(call):
                if name not in SENTENCES[reason].sentences:
                    problems.append(f"{where}: no sentence {name!r} for {reason!r}")
                used.add((reason, name))
    assert not problems, problems
    unused = sorted(set(ENTRIES) - used)
    assert not unused, f"sentences no code uses: {unused}"


def test_refusals_imports_nothing_of_the_package():
    tree = ast.parse(Path(refusals.__file__).read_text())
    imported = [
        node.module or "."
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and (node.level or (node.module or "").startswith("gpuspawner"))
    ] + [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name.startswith("gpuspawner")
    ]
    assert not imported


def test_every_reason_the_metric_counts_is_in_the_table():
    metrics = pytest.importorskip("gpuspawner.hub.metrics")
    assert set(metrics.REFUSAL_REASONS) <= set(SENTENCES)
