"""Children that end with the thread that started them (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import subprocess
import sys
import threading

from gpuspawner_sandbox import testing
from gpuspawner_sandbox.lifetime import alive, dying_with_us

STARTER = """
import subprocess
from gpuspawner_sandbox.lifetime import dying_with_us
for wanted in (True, False):
    child = subprocess.Popen(["sleep", "60"], preexec_fn=dying_with_us(wanted),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    print(child.pid, flush=True)
"""


def test_a_child_gets_sigterm_when_its_starter_ends_unless_it_should_outlive_it():
    starter = subprocess.run(
        [sys.executable, "-c", STARTER], capture_output=True, text=True, timeout=30
    )
    assert starter.returncode == 0, starter.stderr
    dying, outliving = (int(pid) for pid in starter.stdout.split())
    try:
        testing.wait_for(
            "the child to end with its starter", lambda: not alive(dying), timeout=10, interval=0.05
        )
        assert alive(outliving)  # what `gpuspawner-sandbox up` leaves running
    finally:
        subprocess.run(["kill", str(dying), str(outliving)], check=False, capture_output=True)


def test_only_the_main_threads_children_are_given_it():
    # The signal would come when the starting thread ends, not the run.
    found = []
    thread = threading.Thread(target=lambda: found.append(dying_with_us()))
    thread.start()
    thread.join()
    assert found == [None]
    assert dying_with_us() is not None
