"""The service's settings as one value: :class:`ServeOptions`.

A small frozen record with its defaults beside it (httpx's ``Timeout`` / ``Limits`` are the
model): checked once when built, then passed down whole to
:func:`~ragsieve.server.create_app`, :func:`~ragsieve.server.run_server`, the
:class:`~ragsieve.server.runtime.Runtime` and, as JSON (:meth:`ServeOptions.to_dict`), to
the worker processes of :mod:`ragsieve.server.workers`. ``ragsieve serve`` builds it from
its parsed options in one function; an option left unset on the command line takes the
default defined here.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._validation import (
    check_bool,
    check_instance,
    check_int,
    check_path,
    check_real,
    check_str,
)
from ..artifact import key_from_env
from .connections import check_seconds
from .feedback import (
    DEFAULT_FEEDBACK_RETENTION,
    DEFAULT_MAX_LABELS_PER_MINUTE,
    DEFAULT_MAX_LABELS_PER_QUERY,
    DEFAULT_MAX_SERVED_ROWS,
)
from .reload import DEFAULT_MAX_ARTIFACT_BYTES
from .security import BODY_IDLE_TIMEOUT, PER_CLIENT_FACTOR, RECEIVING_FACTOR, check_allowed_hosts

__all__ = [
    "DEFAULT_MAX_PIECES",
    "DEFAULT_MAX_QUEUE",
    "RERANK_RETURNS",
    "ServeOptions",
    "check_delta",
    "serve_options",
]

#: Most model work one request may cause (413 beyond), in pieces of 500 characters the
#: model reads (``ragsieve.server.scheduling.work_pieces``: the query, every snippet piece,
#: sentence or piece of a long sentence, and for a sentence filter each snippet read whole;
#: see ``ConformalFilter.piece_texts``). Sized to about 2 s of model time on 2 cores
#: (docs/serving.md, "Model work", has the throughput and its command).
DEFAULT_MAX_PIECES = 128
#: Most requests waiting for model work at once (429 beyond).
DEFAULT_MAX_QUEUE = 64

#: What the rerank routes may answer: the kept documents, or every document ranked.
RERANK_RETURNS = ("kept", "all")

#: Options that are counts: an int >= 1.
_COUNTS = ("workers", "max_body_bytes", "max_snippets", "max_k", "max_served_rows",
           "max_pieces", "max_queue", "max_artifact_bytes", "max_labels_per_query",
           "max_labels_per_minute")
#: Options that are durations: a number of seconds > 0.
_SECONDS = ("timeout_keep_alive", "timeout_request_header", "body_timeout",
            "feedback_retention", "body_idle_timeout")
#: Options that are switches: a bool.
_SWITCHES = ("warmup", "adaptive", "watch")
#: Options that are paths (or None).
_PATHS = ("index_path", "state_dir", "feedback_db")


def check_delta(delta: Any) -> float:
    """``delta`` of the exchangeability alarm, a number in (0, 1)."""
    return check_real(delta, "monitor_delta", min_value=0, max_value=1,
                      include_boundaries="neither", hint="e.g. 0.01")


@dataclass(frozen=True)
class ServeOptions:
    """How a filter is served: limits, state, reloads, workers and where to listen.

    Parameters
    ----------
    api_key : str, optional
        When set, every route but ``/healthz`` requires ``Authorization: Bearer <key>`` or
        ``X-API-Key: <key>`` (401 otherwise; compared in constant time). The key is also
        the password of HTTP Basic (any user name): on ``GET /`` from anywhere, on the
        other routes from same-origin requests only (403 otherwise). Never shown by
        ``repr`` nor written by :meth:`to_dict`.
    host, port : str, int, default="127.0.0.1", 8000
        Where :func:`~ragsieve.server.run_server` listens. A non-loopback host requires
        ``api_key``.
    workers : int, default=1
        Worker processes of :func:`~ragsieve.server.run_server` (each loads the model;
        they share the state directory, see :mod:`ragsieve.server.workers`).
    log_level : str, default="info"
        uvicorn's log level.
    timeout_keep_alive : int, default=5
        Seconds an idle keep-alive connection stays open after a response.
    timeout_request_header : float, default=10.0
        Seconds a connection has to deliver a complete request head after it opens or
        after its previous response; then it is closed (idle and slowloris connections).
    allowed_hosts : str or sequence of str, default=()
        ``Host`` names the service answers to besides the address it listens on (``host``,
        the address each connection arrived on, and ``localhost`` / ``127.0.0.1`` /
        ``[::1]`` for a loopback one): ``"a.example,b.example:8443"`` or a sequence; an
        entry without a port takes any port. Any other Host gets 400 (DNS rebinding).
        ``"*"`` answers to any Host: unsafe, a page of any site can then reach the service
        through a rebound name. Stored as a tuple.
    max_body_bytes : int, default=1_000_000
        Larger request bodies get 413.
    max_receiving_bytes : int, optional
        Most bytes of request bodies being received at once, over all connections of a
        process (a request reserves its ``Content-Length`` before its body is read); one
        that would pass it gets 503 with ``Retry-After``. Default (None):
        ``4 * max_body_bytes``; at least ``max_body_bytes``.
    max_snippets : int, default=1000
        Requests with more snippets (or feedback labels) get 413.
    body_timeout : float, default=60.0
        Seconds a request has, after its head, to deliver the whole body (408 and the
        connection closed otherwise).
    body_idle_timeout : float, default=10.0
        Seconds a body may go without a byte arriving (408 and the connection closed).
    max_receiving_per_client : int, optional
        Most bytes of request bodies one client address may be sending at once (429 with
        ``Retry-After`` beyond). Default (None): ``2 * max_body_bytes``, at most
        ``max_receiving_bytes``; at least ``max_body_bytes``. Behind a reverse proxy every
        client has the proxy's address: raise it to ``max_receiving_bytes``.
    scorer_options : Mapping, optional
        Passed to ``ConformalFilter.load`` (e.g. ``{"cache_dir": ...}``).
    warmup : bool, default=True
        Score one dummy snippet at startup (and after a reload to another scorer) so the
        model is loaded before serving.
    index_path : str or Path, optional
        A :class:`~ragsieve.store.SnippetIndex` directory served by ``POST /query``. The
        filter must be one the index can compute from its stored vectors (see
        :func:`~ragsieve.filtered_search.list_scorer`); checked at start and on reloads.
    max_k : int, default=100
        Largest ``k`` a ``/query`` request may ask for (413 above).
    state_dir : str or Path, optional
        Directory of the feedback, control and monitor files (:mod:`ragsieve.server.state`),
        locked while the service lives. None: a temporary directory removed at shutdown
        (``ragsieve serve`` passes a stable one so restarts continue).
    feedback_db : str or Path, optional
        The feedback database (default ``<state_dir>/feedback.sqlite``).
    adaptive : bool, default=False
        Serve the threshold followed from ``POST /feedback`` by adaptive conformal
        inference; the artifact must be of mode ``adaptive``.
    monitor_delta : float, default=0.01
        The exchangeability alarm fires on exchangeable traffic with probability at most
        ``monitor_delta``.
    watch : bool, default=False
        Reload when the artifact file changes (its mtime, size or inode, polled every
        0.5 s).
    max_served_rows : int, default=1_000_000
        Served-score rows kept in the feedback database (oldest pruned).
    max_pieces : int, default=128
        Most model work one request may cause, in pieces of 500 characters the model reads
        (the query, snippet pieces, sentences, and for a sentence filter each snippet read
        whole); more get 413 with the work, the limit and the unit in the message.
    max_queue : int, default=64
        Most requests waiting for model work at once; more get 429 with ``Retry-After``.
    max_artifact_bytes : int, default=64 MiB
        Larger artifact files are refused on a reload (413 from ``/admin/reload``) and
        at start.
    feedback_retention : float, default=7 days
        Seconds a served score can be labelled; older served rows and their labels are
        pruned.
    max_labels_per_query : int, default=1000
        Most labels counted for one query_id.
    max_labels_per_minute : int, default=6000
        Most labels one client may send per minute (429 beyond).
    rerank_return : {"kept", "all"}, default="kept"
        What the rerank routes (``/v1/rerank``, ``/v2/rerank``, ``/rerank``) answer when the
        URL does not say: the documents the filter keeps, or every document ranked with its
        p-value (for clients that cut themselves). A request chooses with ``?return=`` or
        the ``/all`` path prefix (:mod:`ragsieve.server.rerank`).
    verify_key_env : str, optional
        The environment variable holding the key every served artifact must be signed
        with (``serve --verify-key-env``; :meth:`verify_key`): an unsigned or wrongly
        signed one is refused at start and on reload. The name travels; the key is read
        from the environment, never stored here.

    Raises
    ------
    ValueError
        A count is not an int >= 1, a duration not a number of seconds > 0, ``api_key``
        is empty, ``monitor_delta`` is not in (0, 1), ``rerank_return`` not "kept" or
        "all", ``port`` not in [0, 65535], an
        ``allowed_hosts`` entry no host name or ``max_receiving_bytes`` below
        ``max_body_bytes``; the message names the option, the value received and the rule.
    TypeError
        A switch is not a bool, a path not a str / PathLike / None, ``scorer_options``
        not a mapping, or ``api_key`` / ``host`` / ``log_level`` not a string.

    Examples
    --------
    >>> ServeOptions(max_snippets=50).max_snippets
    50
    >>> ServeOptions(max_snippets=0)
    Traceback (most recent call last):
    ...
    ValueError: max_snippets == 0, must be an int >= 1.
    """

    api_key: str | None = field(default=None, repr=False)
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1
    log_level: str = "info"
    timeout_keep_alive: int = 5
    timeout_request_header: float = 10.0
    allowed_hosts: tuple[str, ...] = ()
    max_body_bytes: int = 1_000_000
    max_receiving_bytes: int | None = None
    max_snippets: int = 1000
    body_timeout: float = 60.0
    scorer_options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    warmup: bool = True
    index_path: Path | None = None
    max_k: int = 100
    state_dir: Path | None = None
    feedback_db: Path | None = None
    adaptive: bool = False
    monitor_delta: float = 0.01
    watch: bool = False
    max_served_rows: int = DEFAULT_MAX_SERVED_ROWS
    max_pieces: int = DEFAULT_MAX_PIECES
    max_queue: int = DEFAULT_MAX_QUEUE
    max_artifact_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES
    feedback_retention: float = DEFAULT_FEEDBACK_RETENTION
    max_labels_per_query: int = DEFAULT_MAX_LABELS_PER_QUERY
    max_labels_per_minute: int = DEFAULT_MAX_LABELS_PER_MINUTE
    rerank_return: str = "kept"
    verify_key_env: str | None = None
    body_idle_timeout: float = BODY_IDLE_TIMEOUT
    max_receiving_per_client: int | None = None

    def __post_init__(self) -> None:
        for name in _COUNTS:  # stored converted: a numpy int becomes an int (JSON-safe)
            object.__setattr__(self, name, check_int(getattr(self, name), name, min_value=1))
        for name in _SECONDS:
            check_seconds(name, getattr(self, name))  # kept as given: uvicorn takes either
        for name in _SWITCHES:
            object.__setattr__(self, name, check_bool(getattr(self, name), name))
        for name in _PATHS:
            path = check_path(getattr(self, name), name, allow_none=True)
            object.__setattr__(self, name, None if path is None else Path(path))
        object.__setattr__(self, "monitor_delta", check_delta(self.monitor_delta))
        if check_str(self.rerank_return, "rerank_return") not in RERANK_RETURNS:
            raise ValueError(f"rerank_return == {self.rerank_return!r}, must be one of "
                             f"{RERANK_RETURNS}.")
        scorer_options = check_instance(self.scorer_options, Mapping, "scorer_options",
                                        expected="a mapping (e.g. {'cache_dir': ...})",
                                        allow_none=True)
        object.__setattr__(self, "scorer_options", dict(scorer_options or {}))
        check_str(self.api_key, "api_key", non_blank=True, allow_none=True)
        check_str(self.host, "host", non_blank=True)
        check_str(self.verify_key_env, "verify_key_env", non_blank=True, allow_none=True)
        check_str(self.log_level, "log_level", non_blank=True)
        port = check_int(self.port, "port", min_value=0, max_value=65535)
        object.__setattr__(self, "port", port)
        object.__setattr__(self, "allowed_hosts", check_allowed_hosts(self.allowed_hosts))
        receiving = check_int(self.max_receiving_bytes, "max_receiving_bytes",
                              min_value=self.max_body_bytes, allow_none=True,
                              hint="at least max_body_bytes")
        object.__setattr__(self, "max_receiving_bytes", receiving)
        per_client = check_int(self.max_receiving_per_client, "max_receiving_per_client",
                               min_value=self.max_body_bytes, allow_none=True,
                               hint="at least max_body_bytes")
        object.__setattr__(self, "max_receiving_per_client", per_client)

    @property
    def per_client_limit(self) -> int:
        """``max_receiving_per_client``, or its default ``2 * max_body_bytes`` (at most
        :attr:`receiving_limit`)."""
        if self.max_receiving_per_client is None:
            return min(PER_CLIENT_FACTOR * self.max_body_bytes, self.receiving_limit)
        return self.max_receiving_per_client

    def verify_key(self) -> bytes | None:
        """The key served artifacts must be signed with (from ``verify_key_env``), or None.

        Raises
        ------
        ArtifactError
            The variable is unset or holds a key too short (:func:`ragsieve.artifact.key_from_env`).
        """
        return None if self.verify_key_env is None else key_from_env(self.verify_key_env)

    @property
    def receiving_limit(self) -> int:
        """``max_receiving_bytes``, or its default ``4 * max_body_bytes``."""
        if self.max_receiving_bytes is None:
            return RECEIVING_FACTOR * self.max_body_bytes
        return self.max_receiving_bytes

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The option names, in field order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    def replace(self, **changes: Any) -> ServeOptions:
        """A copy with ``changes`` (checked like a new record; unknown names: ``TypeError``)."""
        _check_names(changes, "ServeOptions.replace()")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The options as JSON-safe values (paths as strings), without ``api_key``.

        :meth:`from_dict` reads it back; the worker processes receive it this way (their
        API key travels apart, see :mod:`ragsieve.server.workers`).
        """
        return {name: _plain(getattr(self, name)) for name in self.names() if name != "api_key"}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, api_key: str | None = None) -> ServeOptions:
        """Options from :meth:`to_dict`'s form; missing names take their defaults.

        Raises
        ------
        TypeError
            ``data`` is not a mapping, holds an unknown name, or ``api_key`` is in it.
        """
        check_instance(data, Mapping, "ServeOptions.from_dict: data",
                       expected="a mapping of option names to values")
        if "api_key" in data:
            raise TypeError("ServeOptions.from_dict: 'api_key' is passed as the keyword "
                            "api_key=, never inside the data.")
        _check_names(data, "ServeOptions.from_dict()")
        return cls(api_key=api_key, **data)


def serve_options(options: ServeOptions | None = None,
                  changes: Mapping[str, Any] | None = None, *,
                  caller: str = "create_app") -> ServeOptions:
    """``options`` (default :class:`ServeOptions`) with ``changes`` (option name -> value):
    the one place the keyword conveniences of ``create_app`` / ``run_server`` become a
    record.

    Raises
    ------
    TypeError
        ``options`` is not a :class:`ServeOptions`, or a keyword is no option (the message
        lists them).
    """
    if options is None:
        options = ServeOptions()
    check_instance(options, ServeOptions, f"{caller}(): options", expected="a ServeOptions "
                   "or None (or pass the options as keyword arguments)")
    changes = dict(changes or {})
    _check_names(changes, f"{caller}()")
    return dataclasses.replace(options, **changes) if changes else options


def _check_names(given: Mapping[str, Any], where: str) -> None:
    unknown = sorted(set(given) - set(ServeOptions.names()))
    if unknown:
        raise TypeError(f"{where} got unknown option(s) {', '.join(map(repr, unknown))}; the "
                        f"options of ServeOptions are: {', '.join(ServeOptions.names())}.")


def _plain(value: Any) -> Any:
    """A JSON-safe copy of ``value`` (paths as strings, mappings as dicts)."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value
