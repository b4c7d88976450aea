"""Exceptions raised by ragsieve.

Every class also inherits the built-in exception a caller would naturally catch,
so ``except ValueError`` keeps working::

    RagsieveError (Exception)
    ├── NotFittedError (RagsieveError, ValueError, AttributeError)
    ├── DataError (RagsieveError, ValueError)          bad or unreadable input data
    │   └── CalibrationError (DataError)               calibration data unusable for alpha
    ├── ArtifactError (RagsieveError, ValueError)      a saved filter that cannot be used
    │   ├── ArtifactTooLargeError (ArtifactError)      a file over the artifact size cap
    │   └── ScorerMismatchError (ArtifactError)        artifact made with another scorer
    ├── ScorerError (RagsieveError, RuntimeError)      a scorer failed to produce scores
    │   └── RerankError (ScorerError)                  a reranker endpoint failed for good
    │       └── RerankResponseError (RerankError)      a reranker answer that is not the API's
    └── LLMError (RagsieveError, RuntimeError)         an LLM request failed for good
        └── LLMResponseError (LLMError)                a reply that cannot be used

Wrong *types* raise the built-in ``TypeError`` and a missing optional dependency raises
the built-in ``ImportError`` naming the extra to install.
"""

from __future__ import annotations

__all__ = [
    "ArtifactError",
    "ArtifactTooLargeError",
    "CalibrationError",
    "DataError",
    "LLMError",
    "LLMResponseError",
    "NotFittedError",
    "RagsieveError",
    "RerankError",
    "RerankResponseError",
    "ScorerError",
    "ScorerMismatchError",
]


class RagsieveError(Exception):
    """Base class of every error ragsieve raises on purpose."""


class NotFittedError(RagsieveError, ValueError, AttributeError):
    """An estimator was used before ``fit`` was called."""


class DataError(RagsieveError, ValueError):
    """Input data is malformed, empty, or unreadable."""


class CalibrationError(DataError):
    """Calibration data cannot support the requested guarantee."""


class ArtifactError(RagsieveError, ValueError):
    """A saved filter artifact is malformed or incompatible."""


class ArtifactTooLargeError(ArtifactError):
    """An artifact file is larger than the size cap of the reader (nothing was parsed)."""


class ScorerMismatchError(ArtifactError):
    """An artifact was calibrated with a different scorer than the one supplied."""


class ScorerError(RagsieveError, RuntimeError):
    """A scorer could not produce valid scores."""


class RerankError(ScorerError):
    """A reranker endpoint (the rerank API) failed after its retries: an HTTP error, a
    timeout, a refused connection.

    Attributes
    ----------
    url : str or None
        The endpoint's URL.
    status : int or None
        HTTP status of the last attempt, if any.
    """

    def __init__(self, message: str, *, url: str | None = None,
                 status: int | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.status = status


class RerankResponseError(RerankError):
    """A reranker answered, but not in the API's shape (an index out of range, repeated or
    missing; a score that is not a finite number): never turned into a score."""


class LLMError(RagsieveError, RuntimeError):
    """An LLM request failed after its retries (HTTP error, timeout, refused connection).

    Attributes
    ----------
    status : int or None
        HTTP status of the last attempt, if any.
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class LLMResponseError(LLMError):
    """An LLM reply arrived but cannot be used (malformed JSON, unparseable answer)."""
