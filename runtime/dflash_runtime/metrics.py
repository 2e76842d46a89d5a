"""What a decode run measured: acceptance (tau, per-position rates) and where the time went."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class DecodeStats:
    """One generation. tau = mean over draft steps of (accepted drafts + 1), i.e. vLLM's
    1 + accepted / num_drafts; per_position_rates[k] = share of draft steps whose draft k+1 was
    accepted. Times in seconds; tokens_per_s counts new tokens over the decode time after prefill
    (as z-lab's time per output token); the target-only baseline reports tau 1 and no drafts.
    predicted_rates[k]: a dspark confidence head's estimate of per_position_rates[k], the mean over draft
    steps of the product of its confidences up to slot k (what vLLM's adaptive verification ranks a slot
    by); empty without a confidence head."""

    new_tokens: int = 0
    num_drafts: int = 0
    drafted: int = 0
    accepted: int = 0
    tau: float = 1.0
    per_position_rates: list[float] = field(default_factory=list)
    prefill_time_s: float = 0.0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    total_time_s: float = 0.0
    tokens_per_s: float = 0.0
    predicted_rates: list[float] = field(default_factory=list)

    @classmethod
    def from_steps(cls, accepted_per_step: list[int], block_size: int, *, new_tokens: int, prefill_time_s: float,
                   draft_time_s: float, verify_time_s: float, total_time_s: float,
                   drafted: int, survival_per_step: list[list[float]] | None = None) -> "DecodeStats":
        num = len(accepted_per_step)
        width = max(block_size - 1, 0)
        rates = [sum(a > k for a in accepted_per_step) / num if num else 0.0 for k in range(width)]
        # a shorter last block's missing slots count as not accepted, in both
        predicted = [sum(s[k] for s in survival_per_step if k < len(s)) / num for k in range(width)] \
            if survival_per_step and num else []
        decode_time = total_time_s - prefill_time_s
        return cls(new_tokens=new_tokens, num_drafts=num, drafted=drafted, accepted=sum(accepted_per_step),
                   tau=1.0 + sum(accepted_per_step) / num if num else 1.0, per_position_rates=rates,
                   prefill_time_s=prefill_time_s, draft_time_s=draft_time_s, verify_time_s=verify_time_s,
                   total_time_s=total_time_s, tokens_per_s=new_tokens / decode_time if decode_time > 0 else 0.0,
                   predicted_rates=predicted)

    @classmethod
    def merge(cls, runs: list["DecodeStats"]) -> "DecodeStats":
        """The statistics of several generations as one run: tau and per-position rates over all their
        draft steps, times and tokens summed (tokens_per_s over the summed decode time)."""
        num = sum(r.num_drafts for r in runs)
        width = max((len(r.per_position_rates) for r in runs), default=0)
        # rates[k] * num_drafts is the count of steps whose draft k+1 was accepted: exact in floats of this size
        rates = [sum(r.per_position_rates[k] * r.num_drafts for r in runs if k < len(r.per_position_rates)) / num
                 if num else 0.0 for k in range(width)]
        predicted = [sum(r.predicted_rates[k] * r.num_drafts for r in runs if k < len(r.predicted_rates)) / num
                     if num else 0.0 for k in range(width)] if any(r.predicted_rates for r in runs) else []
        total = {k: sum(getattr(r, k) for r in runs) for k in
                 ("new_tokens", "drafted", "accepted", "prefill_time_s", "draft_time_s", "verify_time_s", "total_time_s")}
        decode_time = total["total_time_s"] - total["prefill_time_s"]
        return cls(num_drafts=num, tau=1.0 + total["accepted"] / num if num else 1.0, per_position_rates=rates,
                   tokens_per_s=total["new_tokens"] / decode_time if decode_time > 0 else 0.0,
                   predicted_rates=predicted, **total)

    def to_dict(self) -> dict:
        return asdict(self)
