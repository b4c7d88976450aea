"""HTTP service around a calibrated :class:`~ragsieve.filter.ConformalFilter`.

``create_app(path)`` loads a filter artifact once and serves

* ``GET /healthz`` -- status, library version and the artifact's mode, guaranteed
  metric, guarantee, alpha, threshold, scorer spec and versions (no authentication,
  for liveness probes);
* ``POST /filter`` -- ``{"query", "snippets", "min_keep"?, "group"?, "query_vector"?}``
  -> kept snippets, all scores, tau, removal, note and the guarantee. A snippet is a
  string or an object with ``text``, ``score`` (an outside score, for filters
  calibrated on one), ``vector``, ``group`` and ``snippet_id``; with ``query_vector``
  the scores come from the vectors (no model call). A snippet longer than the filter's
  window is cut into pieces: the answer gives ``n_cut`` and each kept snippet's ``spans``.
  API key required when configured;
* ``POST /query`` -- ``{"query", "k"?, "min_keep"?}`` -> the ``k`` hits retrieved from a
  :class:`~ragsieve.store.SnippetIndex` (when the app is built with ``index_path``),
  scored from their stored vectors, each marked kept or not, plus tau, removal and the
  guarantee (API key required when configured; 404 without an index);
* ``GET /openapi.json`` -- the typed schema (models in :mod:`ragsieve.server.schemas`),
  with every error answer (401, 404, 408, 413, 415, 422) and the API-key schemes.

Bodies are read as strict JSON (:mod:`ragsieve.server.parsing`): a malformed one gets a
4xx with a JSON ``detail``, never a 500. :func:`run_server` closes idle and slow
connections (:mod:`ragsieve.server.connections`).

FastAPI, pydantic and uvicorn are optional (``pip install 'ragsieve[server]'``); this
package is imported only to serve, and importing it without them raises ``ImportError``
naming the extra.
"""

from .._optional import require

require("fastapi", "server")
require("pydantic", "server")

# imported after the extras are checked, so a missing one names the extra
from .app import create_app, run_server
from .connections import uvicorn_config
from .security import api_key_from_env, is_loopback_host

__all__ = ["api_key_from_env", "create_app", "is_loopback_host", "run_server", "uvicorn_config"]
