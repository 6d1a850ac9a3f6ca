"""Did the target give the logprobs a check asked for? One tally, and the words a finding uses.

Servers may ignore ``logprobs`` (Ollama answers without them), or refuse them, and the ``openai:``
target then asks again without (``OpenAITarget.chat_logprobs``). A check that compares logprobs
must not then report a logprob measurement it never made: its evidence says the server gave none,
and its title leaves the number out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mmchaos.targets.generation import Completion
from mmchaos.targets.wrappers import unwrap

__all__ = ["LogprobsTally"]


@dataclass
class LogprobsTally:
    """Completions asked for logprobs, and how many came with them."""

    asked: int = 0
    given: int = 0

    def add(self, *completions: Completion) -> None:
        for c in completions:
            self.asked += 1
            self.given += c.logprobs is not None

    @property
    def measured(self) -> bool:
        """Whether every completion asked carried logprobs (so a logprob number means what it says)."""
        return self.asked > 0 and self.given == self.asked

    def evidence(self, target: Any) -> dict[str, Any]:
        """``{"asked", "given"}`` and, where some were missing, a note naming how the server behaved."""
        out: dict[str, Any] = {"asked": self.asked, "given": self.given}
        if self.asked and self.given < self.asked:
            refused = getattr(unwrap(target), "chat_logprobs", True) is False
            how = (
                "the server refused logprobs, so they were asked for again without them"
                if refused
                else "the server ignored logprobs"
            )
            out["note"] = (
                f"{how}: {self.asked - self.given} of {self.asked} completions carry none; those were compared "
                "by their tokens (or text) only"
            )
        return out

    def clause(self) -> str:
        """What a title says in place of a logprob number the target did not give ('' when it gave them)."""
        if self.measured or not self.asked:
            return ""
        return f"the target gave no logprobs for {self.asked - self.given} of {self.asked} completions"
