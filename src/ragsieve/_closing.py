"""What ``with`` does to a ragsieve object that holds a resource: it calls ``close()`` on exit.

:class:`Closing` is the base of the objects that open something (pooled HTTP connections,
a SQLite file, a Ray runtime, a local LLM server) and give it back in their ``close()``:
``with obj:`` gives the object itself and closes it on the way out, whatever happened
inside (what :func:`contextlib.closing` does for any object).
"""

from __future__ import annotations

from typing import Self

__all__ = ["Closing"]


class Closing:
    """An object whose ``close()`` gives back what it holds; ``with`` closes it on exit.

    Examples
    --------
    >>> class Door(Closing):
    ...     def close(self) -> None:
    ...         print("closed")
    >>> with Door() as door:
    ...     print(type(door).__name__)
    Door
    closed
    """

    def close(self) -> None:
        """Give back what the object holds (each subclass says what)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
