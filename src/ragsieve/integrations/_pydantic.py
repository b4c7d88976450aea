"""What the pydantic components share: LangChain's compressor and LlamaIndex's postprocessor.

Imported by :mod:`ragsieve.integrations.langchain` and :mod:`ragsieve.integrations.llamaindex`
only, after their framework (which brings pydantic), so :mod:`ragsieve.integrations` itself
imports without pydantic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Self

from pydantic import model_validator

from ragsieve.integrations.filtering import check_score_source

__all__ = ["ScoreSourceCheck"]


class ScoreSourceCheck:
    """A pydantic component's ``score_source`` checked against its ``filter`` once it is
    built (:func:`~ragsieve.integrations.check_score_source`); ``native_score_name`` names
    the framework's native score in the error."""

    native_score_name: ClassVar[str]
    if TYPE_CHECKING:  # the component's fields (annotations here would become fields)
        filter: Any
        score_source: str

    @model_validator(mode="after")
    def _check_score_source(self) -> Self:
        check_score_source(self.filter, self.score_source, self.native_score_name)
        return self
