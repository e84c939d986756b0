"""The console script in a real process, stopped by real signals (os.kill) at a chosen moment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

CONSOLE_SCRIPT = [sys.executable, "-c", "from streameval.entry import main; main()"]
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


def stopped_run(args, at, signals=(signal.SIGINT,), tmpdir=None, timeout: float = 120) -> tuple[int, str]:
    """``streameval ARGS`` sent ``signals`` (10 ms apart) at ``at``: seconds after its start, or the
    first stderr line holding that text (a progress line, the conversion's line): a moment the run
    is known to have reached and not finished.  ``tmpdir``: its $TMPDIR.  (exit code, stderr)."""
    env = dict(os.environ, **({"TMPDIR": str(tmpdir)} if tmpdir is not None else {}))
    proc = subprocess.Popen(CONSOLE_SCRIPT + [str(a) for a in args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)
    seen = []
    if isinstance(at, str):
        for line in proc.stderr:
            seen.append(line)
            if at in line:
                break
        else:
            proc.wait(timeout)
            pytest.fail(f"the run ended (exit {proc.returncode}) before a line with '{at}':\n{''.join(seen)}")
    else:
        time.sleep(at)
    for number in signals:
        proc.send_signal(number)
        time.sleep(0.01)
    _, rest = proc.communicate(timeout=timeout)
    return proc.returncode, "".join(seen) + rest


def assert_stopped_in_one_line(code: int, stderr: str, signals) -> None:
    """The run was stopped by the first signal (not finished first) and said so in its last line, the
    only ``error:`` line; no traceback."""
    assert "Traceback" not in stderr, stderr
    assert code == EXIT_CODES[signals[0]], (code, stderr)
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert errors == [stderr.strip().splitlines()[-1]], stderr
    assert errors[0].startswith("error: interrupted (Ctrl-C)" if signals[0] == signal.SIGINT
                                else "error: terminated (SIGTERM)"), stderr
