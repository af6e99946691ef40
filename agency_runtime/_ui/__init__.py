"""``agency ui``: the run inspector, a local web app over any store (extra ``ui``).

:func:`create_app` builds the Starlette app (tests drive it with Starlette's TestClient);
:func:`serve` runs it with uvicorn, as ``agency ui`` does. Importing this package imports
starlette and jinja2, so ``import agency_runtime`` never does: only the ``ui`` command and
code that asks for the inspector import it.
"""

from ._app import create_app
from ._security import MIN_TOKEN_LENGTH, check_token, is_loopback
from ._server import serve

__all__ = ["MIN_TOKEN_LENGTH", "check_token", "create_app", "is_loopback", "serve"]
