"""`python -m memgate --memgate-rank --request FILE [--parent-pid PID]`: one probe (or one rank) of a fixture in this
Python process, as memgate starts it for a Python fixture; exit 0 when it measured, 2 for bad arguments, 3 otherwise.
The probe itself is memgate._probe's (which a probe forked from the fork server runs too)."""
import sys

from memgate._probe import main

if __name__ == "__main__":
    # As a probe forked from the fork server ends (_forkserver.py): the exit handlers run and the output flushed,
    # without the rest of Python's teardown (0.4 s with torch imported, for a probe that has written its result).
    code = main()
    import atexit
    import os

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
