"""Several `tether` command lines run one after another in this process: `python tether_in_sequence.py RUNS.json`,
RUNS.json a list of argument lists. Under `accelerate launch` every process runs the same list, so one launch (one
launcher, one start-up and one rendezvous per process: about 10 s of CPU on two processes) serves a test file's
two-process runs instead of one launch each (tests/test_online_parallel.py: launch_together).

Each run is the `tether` command's own main(), all of it, except that the process group stays up between runs:
main() shuts it down after every run (a process is not meant to rendezvous twice), and here it is shut down once,
after the last. A run that fails ends the process with its exit code, naming the run."""

import json
import os
import sys

import tether.cli.dispatch as dispatch


def main() -> int:
    runs = json.loads(open(sys.argv[1]).read())
    close_process_group, dispatch._close_process_group = dispatch._close_process_group, lambda: None
    code = 0
    for i, argv in enumerate(runs):
        code = dispatch.main(argv)
        if code != 0:
            print(f"tether_in_sequence: run {i + 1} of {len(runs)} ended with {code}: tether {' '.join(argv)}")
            break
    close_process_group()
    return code


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as tether's run() leaves a process that ran distributed (gloo's threads; see its docstring)
