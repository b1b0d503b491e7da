"""What every benchmark shares: ``--smoke``, ``--fail-after`` and stopping what it started.

A benchmark that crashed once left five real nodes, Prometheus and two hubs
running, and the machine claimed: the next benchmark was refused. So each one
runs its body through :func:`run`, which turns SIGTERM and SIGINT into an
exception (:class:`Stopped`) that unwinds like any other, and registers what it
starts on :func:`guarded`'s exit stack as soon as it has started it (the
sandbox's own teardown: ``SandboxStack.stop``, ``RealNodes.stop``,
``ControlPlane.stop``, ``Hub.stop``, ``Prometheus.stop``). Whatever ends the
run (an exception, Ctrl-C, ``kill``), everything is stopped and the host is
restored before the process exits; a signal during that teardown is reported and
does not cut it short. The processes the sandbox starts also die with the run's
main thread (``gpuspawner_sandbox.lifetime``), the backstop for SIGKILL.

``--smoke`` runs every step of the real run once, with few users and small sizes:
``tests/benchmarks`` run each benchmark that way in ``make test``, so a renamed
helper fails CI rather than a measurement. Its figures mean nothing.

``--fail-after STEP`` exists for those tests: it fails the run on purpose right after
STEP, by an exception (``--fail-with error``, the default) or by sending the
benchmark SIGTERM or SIGINT, to prove that nothing it started outlives it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

#: How ``--fail-after`` fails: an exception, or a signal the benchmark sends itself.
FAIL_WITH = {"error": None, "sigterm": signal.SIGTERM, "sigint": signal.SIGINT}

#: The line on stderr each finished step writes (the tests read it).
STEP_DONE = "# step done: "
#: The line on stderr naming a directory the benchmark keeps its state in (the
#: tests check that nothing there still runs afterwards).
WORK_DIR = "# work dir: "


class Stopped(KeyboardInterrupt):
    """A signal asked the benchmark to stop.

    A KeyboardInterrupt, so that code written for Ctrl-C (asyncio, the
    sandbox's ``except BaseException`` clean-ups) treats SIGTERM the same way,
    and no ``except Exception`` swallows it.
    """

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class InjectedFailure(RuntimeError):
    """The failure ``--fail-after`` asked for."""


_stopping = False


def _on_signal(signum: int, frame: Any) -> None:
    if _stopping:
        # Raising now would abandon the teardown half-way: the very leak this prevents.
        print(
            f"# {signal.Signals(signum).name}: still stopping what the benchmark started…",
            file=sys.stderr,
            flush=True,
        )
        return
    raise Stopped(signum)


def add_machine_wait(parser: argparse.ArgumentParser) -> None:
    """``--machine-wait``, for the benchmarks that start real nodes (one set per machine)."""
    parser.add_argument(
        "--machine-wait",
        type=float,
        default=0,
        metavar="SECONDS",
        help="how long to wait for other real nodes on this machine to stop (default: refuse)",
    )


def add_arguments(parser: argparse.ArgumentParser, steps: Sequence[str] = ()) -> None:
    """``--smoke``, and with ``steps`` (the benchmark's, in order) ``--fail-after``/``--fail-with``."""
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="every step once with few users and small sizes (make test runs this); "
        "the figures mean nothing",
    )
    if steps:
        parser.add_argument(
            "--fail-after",
            choices=list(steps),
            metavar="STEP",
            help="for tests: fail on purpose right after STEP (one of: "
            + ", ".join(steps)
            + "), to check that nothing the benchmark started outlives it",
        )
        parser.add_argument(
            "--fail-with",
            choices=list(FAIL_WITH),
            default="error",
            help="how --fail-after fails: an exception (default), or SIGTERM or SIGINT "
            "sent to the benchmark itself",
        )


def sizes(args: argparse.Namespace, full: Mapping[str, Any], smoke: Mapping[str, Any]) -> None:
    """Fill each size option left unset: the smoke run's value with ``--smoke``, else the real run's."""
    for name, value in full.items():
        if getattr(args, name, None) is None:
            setattr(args, name, smoke[name] if args.smoke else value)


def work_dir(path: Path) -> Path:
    """Say where the benchmark keeps the state of what it starts (logs, records); returns it."""
    print(f"{WORK_DIR}{path}", file=sys.stderr, flush=True)
    return path


class Steps:
    """The benchmark's progress on stderr, and the failure ``--fail-after`` injects."""

    def __init__(self, args: argparse.Namespace):
        self.fail_after: str | None = getattr(args, "fail_after", None)
        self.fail_with: str = getattr(args, "fail_with", "error")

    def done(self, step: str) -> None:
        print(f"{STEP_DONE}{step}", file=sys.stderr, flush=True)
        if step != self.fail_after:
            return
        signum = FAIL_WITH[self.fail_with]
        if signum is None:
            raise InjectedFailure(f"--fail-after {step}: failing on purpose")
        os.kill(os.getpid(), signum)
        # The handler raises Stopped in this thread at once; the sleep only
        # gives it the moment it needs.
        time.sleep(10)
        raise InjectedFailure(f"--fail-after {step}: {signal.Signals(signum).name} was not handled")


@contextlib.contextmanager
def guarded() -> Iterator[contextlib.ExitStack]:
    """An exit stack for what the benchmark starts; its teardown cannot be interrupted.

    Register each stop right after the start it undoes (``stack.callback``,
    ``stack.enter_context``): on every way out they run in reverse order.
    """
    global _stopping
    with contextlib.ExitStack() as stack:
        try:
            yield stack
        finally:
            _stopping = True
    _stopping = False


def run(main: Callable[[], int | None]) -> NoReturn:
    """Run a benchmark's ``main`` with SIGTERM and SIGINT unwinding it; exit with its status.

    A benchmark stopped by a signal exits with 128 + the signal's number, as a
    shell reports a process killed by it, after its teardown.
    """
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        status = main()
    except Stopped as e:
        print(
            f"Stopped by {signal.Signals(e.signum).name}; what the benchmark started is stopped.",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(128 + e.signum)
    sys.exit(status or 0)
