#!/usr/bin/env python3
"""No machine test lost: the machine tests' IDs at an earlier commit against the working tree's.

    python scripts/compare_test_ids.py [BEFORE]     # BEFORE: a commit, default origin/main's merge-base

Collects (``pytest --collect-only``) the machine tests (Makefile's MACHINE_TESTS) at
BEFORE, in a temporary git worktree, and in this checkout; writes both lists to
``build/machine-test-ids.before.txt`` and ``build/machine-test-ids.after.txt``; prints the
IDs that went and came. A test that moved (to a module or fixture of another name) must be
listed in ``tests/moved-machine-tests.toml`` as ``"old id" = "new id"``, so each lost ID is
either still run under its new name or a failure. Exit 1 when an ID is gone unexplained
(or a listed new ID does not exist), 0 otherwise.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parent.parent
MACHINE_TESTS = ("tests/sandbox", "tests/images", "tests/z2jh", "tests/e2e", "tests/benchmarks")
MOVED = REPO / "tests" / "moved-machine-tests.toml"


def collect(root: Path, python: str) -> list[str]:
    """The machine tests' node IDs in the tree at ``root``, collected by that tree's code."""
    env = {
        **os.environ,
        # That tree's packages first, ahead of the editable installs of this checkout.
        "PYTHONPATH": os.pathsep.join([str(root), str(root / "sandbox")]),
    }
    folders = [f for f in MACHINE_TESTS if (root / f).is_dir()]
    proc = subprocess.run(
        [python, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *folders],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    ids = [line for line in proc.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    if proc.returncode not in (0, 5) or not ids:
        raise SystemExit(
            f"collecting in {root} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}"
        )
    return ids


def compare(
    before: Iterable[str], after: Iterable[str], moved: Mapping[str, str]
) -> tuple[list[str], list[str], list[str]]:
    """(gone unexplained, new, moved to an ID that does not exist)."""
    before_set, after_set = set(before), set(after)
    gone = sorted(i for i in before_set - after_set if i not in moved)
    broken = sorted(
        f"{old} -> {new}"
        for old, new in moved.items()
        if old in before_set - after_set and new not in after_set
    )
    return gone, sorted(after_set - before_set), broken


def default_before() -> str:
    for ref in ("origin/main", "HEAD"):
        proc = subprocess.run(
            ["git", "merge-base", "HEAD", ref], cwd=REPO, capture_output=True, text=True
        )
        if proc.returncode == 0:
            return proc.stdout.strip()
    return "HEAD"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", nargs="?", help="the earlier commit (default: origin/main)")
    args = parser.parse_args(argv)
    before_rev = args.before or default_before()
    moved = tomllib.loads(MOVED.read_text()) if MOVED.is_file() else {}
    with tempfile.TemporaryDirectory(prefix="gs-test-ids-") as tmp:
        worktree = Path(tmp) / "before"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(worktree), before_rev],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        try:
            before = collect(worktree, sys.executable)
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(worktree)], cwd=REPO, check=False
            )
    after = collect(REPO, sys.executable)
    out = REPO / "build"
    out.mkdir(exist_ok=True)
    (out / "machine-test-ids.before.txt").write_text("\n".join(sorted(before)) + "\n")
    (out / "machine-test-ids.after.txt").write_text("\n".join(sorted(after)) + "\n")
    gone, new, broken = compare(before, after, moved)
    print(f"machine tests at {before_rev[:12]}: {len(before)}; now: {len(after)}")
    for name, ids in (("gone, unexplained", gone), ("moved to a missing ID", broken), ("new", new)):
        if ids:
            print(f"{name} ({len(ids)}):")
            print("\n".join(f"  {i}" for i in ids))
    renamed = [old for old in moved if old in set(before) - set(after)]
    if renamed:
        print(f"moved, still run ({len(renamed)}): see {MOVED.relative_to(REPO)}")
    if gone or broken:
        print("Machine tests were lost: run them again, or list where each moved.")
        return 1
    print("No machine test lost.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
