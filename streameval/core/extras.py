"""Optional libraries, installed with streameval's extras (pyproject.toml): imported where a command
needs one, and when it is missing, one error that says how to install it, whatever way streameval
itself was installed (a wheel, ``pip install .``, or the clone's editable ``.venv``)."""

from __future__ import annotations

import importlib

from .errors import StreamevalError


def require_extra(module: str, *, package: str, extra: str, purpose: str, error: type[StreamevalError]):
    """Import ``module`` (from the PyPI ``package`` that the ``extra`` installs), or raise ``error``
    with one line: ``purpose`` needs the package and the commands that install it.  ``error``'s
    class sets the exit code, as the command's other failures of that kind (a store that cannot be
    read, a cluster that cannot be used, an option that cannot be served)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise error(f"{purpose} needs {package}, which is not installed: pip install {package} (the '{extra}' "
                    f"extra; in the streameval clone: .venv/bin/pip install -e '.[{extra}]')") from None
