"""Running the command line in-process and checking its failures are one ``error:`` line."""

from __future__ import annotations

from click.testing import CliRunner

from streameval.cli import main


def cli(*args, code=0):
    """``streameval ARGS`` (click's runner), asserting the exit code."""
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    return result


def one_error_line(result) -> str:
    """The single ``error:`` line of a refused command (progress lines aside); no traceback."""
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]
