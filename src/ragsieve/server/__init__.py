"""HTTP service around a calibrated :class:`~ragsieve.filter.ConformalFilter`.

``create_app(path)`` loads a filter artifact and serves

* ``GET /healthz`` -- status, library version and the artifact's mode, guaranteed
  metric, guarantee, alpha, threshold, checksum, scorer spec and versions, the artifact
  generation, the exchangeability monitor (alarm, martingale, when it fired) and the
  adaptive threshold (no authentication, for liveness probes);
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
* ``POST /feedback`` -- ``{"items": [{"query_id", "snippet_id", "relevant"}]}`` stores
  labels of served snippets with their served scores (:mod:`ragsieve.server.feedback`;
  unknown pairs are counted, never stored; 429 beyond the per-client rate); under
  ``adaptive=True`` they move the served threshold (adaptive conformal inference);
* ``GET /metrics`` -- Prometheus metrics (:mod:`ragsieve.server.metrics`);
* ``POST /admin/reload`` -- re-read the artifact file and serve it if it is valid
  (:mod:`ragsieve.server.reload`; also on SIGHUP and, with ``watch``, on file change);
* ``GET /openapi.json`` -- the typed schema (models in :mod:`ragsieve.server.schemas`),
  with every error answer (401, 403, 404, 408, 413, 415, 422) and the API-key schemes.

``/filter`` and ``/query`` answers carry a ``query_id`` (yours or generated) under which
the served scores are recorded, so feedback can be joined to them. Every answered request
is fed to the exchangeability monitor (:mod:`ragsieve.monitoring`), whose alarm says when
served traffic stops looking like the calibration data. ``run_server(workers=N)`` serves
with N processes (:mod:`ragsieve.server.workers`).

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
require("prometheus_client", "server")

# imported after the extras are checked, so a missing one names the extra
from .app import create_app
from .connections import uvicorn_config
from .run import run_server
from .security import api_key_from_env, is_loopback_host

__all__ = ["api_key_from_env", "create_app", "is_loopback_host", "run_server", "uvicorn_config"]
