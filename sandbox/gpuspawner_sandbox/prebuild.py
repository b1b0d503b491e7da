"""Build what the machine tests need before they start, beside the unit tests.

``make test`` (scripts/run-suite.sh) starts ``python -m gpuspawner_sandbox.prebuild go``
and ``… prebuild images`` at the start of the run, in the background, while lint, the
docs and the unit and hub-level tests run; the machine tests start when both have ended.
Without them the first machine test that needs a program or an image builds it while
nothing else can use the machine's cores for anything but waiting (a cold Go cache makes
that half an hour on 2 cores).

``go``: the control plane, every node program (:func:`.nodebuild.build_all`) and Helm;
``kueue`` (after ``go``): Kueue, which only a few machine tests need, so they start
without waiting for it (a test that needs it first waits on its build's lock,
:func:`.build.exclusive`, and never compiles it a second time). ``images``: the notebook images' Jupyter stage and the GPU check's image;
``chart-images`` (after both): the hub's and z2jh's images. Each is built once into
``.cache/images`` (the tests find them cached). Everything lands in the caches the tests already read, so a test run
without the prebuild behaves as before, only slower.

Where the machine tests cannot run here (no Go, not root, no runc) this says so in one
line and exits 0: the tests themselves then skip, or fail in CI, with their own words.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Sequence

from . import build


def build_go() -> None:
    from . import helm, nodebuild

    nodebuild.build_all(out=sys.stderr)
    helm.build_helm(out=sys.stderr)


def build_kueue() -> None:
    from . import kueue

    kueue.build_kueue(out=sys.stderr)


def build_images() -> None:
    from . import notebookimage, validationimage
    from .demo import IMAGE_CACHE

    notebookimage.ensure_notebook_images(IMAGE_CACHE, build.REPO_ROOT, _emit)
    validationimage.ensure_validation_image(IMAGE_CACHE, build.REPO_ROOT, _emit)


def build_chart_images() -> None:
    from . import chartimages
    from .demo import IMAGE_CACHE

    chartimages.ensure_deploy_images(IMAGE_CACHE, build.REPO_ROOT, _emit, build_out=sys.stderr)


def _emit(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


#: ``chart-images`` needs the control plane's binary (the pause image's programs) and the
#: images' engine: it runs after both ``go`` and ``images`` have ended.
PARTS = {
    "go": build_go,
    "kueue": build_kueue,
    "images": build_images,
    "chart-images": build_chart_images,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpuspawner_sandbox.prebuild",
        description="Build the machine tests' programs (go) or images (images) ahead of them.",
    )
    parser.add_argument("part", choices=sorted(PARTS))
    args = parser.parse_args(argv)
    # Started as a shell's background job, SIGINT comes ignored: let Ctrl-C stop the build.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if os.geteuid() != 0:
        print(f"prebuild {args.part}: not root, so no real nodes here; nothing built.")
        return 0
    started = time.monotonic()
    try:
        PARTS[args.part]()
    except build.GoMissing as e:
        print(f"prebuild {args.part}: {e}; nothing built.")
        return 0
    except KeyboardInterrupt:
        print(f"prebuild {args.part}: interrupted; nothing incomplete was cached.")
        return 130
    print(f"prebuild {args.part}: done in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
