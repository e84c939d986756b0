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


PAUSED = "paused, waiting for a signal"


def paused_script(module: str, name: str, call: str) -> str:
    """A script replacing ``module.name`` by a pause (it prints PAUSED and sleeps: the moment a signal
    is to land), then running ``call`` (Python source; ``sys.argv`` holds the arguments); a
    KeyboardInterrupt ends it with exit 130, as the console script would."""
    return "\n".join([
        "import importlib, signal, sys, time",
        # Python's own Ctrl-C handler even where SIGINT came in ignored (a job started in the background)
        "signal.signal(signal.SIGINT, signal.default_int_handler)",
        "import numpy as np",
        "import streameval",
        "def pause(*args, **kwargs):",
        f"    print({PAUSED!r}, flush=True)",
        "    time.sleep(120)",
        "    raise AssertionError('no signal came')",
        f"setattr(importlib.import_module({module!r}), {name!r}, pause)",
        "try:",
        f"    {call}",
        "except KeyboardInterrupt:",
        "    sys.exit(130)",
    ])


def ctrl_c_at_pause(script: str, *args, timeout: float = 120) -> None:
    """Run ``paused_script``'s script; once paused, send it a real SIGINT; it must end interrupted."""
    proc = subprocess.Popen([sys.executable, "-c", script, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    if line != PAUSED:
        _, err = proc.communicate(timeout=timeout)
        pytest.fail(f"never paused (exit {proc.returncode}): {line}\n{err}")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 130, (proc.returncode, err)
