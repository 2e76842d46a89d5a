"""Whether a token where a speculative greedy output parts from the target's greedy output is the target's own
rounding (a near-tie) or a defect, judged by the noise measured between the two target computations.

The speculative token comes from a row of the target's verify block, the reference from its one-token decode
(dflash_runtime.paths recomputes both, teacher-forced). At a parting the reference takes `taken` and the
speculative output `other`, `gap` apart in the one-token decode and `verify_gap` apart in the verify block. The
paths moved the gap by `moved` = gap - verify_gap (the measured noise, in the direction of the speculative token).
The parting is a near-tie when the gap is within that noise plus MARGIN_ULPS units in the last place of the
target's dtype, that is when the verify block, recomputed, itself puts the speculative token at (or within the
margin of) the top of the two: the target's own rounding chose it. A fixed count of ulps held on one target and
failed on another (a lookalike target in bfloat16 parts at 3 ulps after a few layers, float32 nowhere). A defect
of the loop is not in the recomputation, which then leaves the gap where it is, and the parting fails.

The noise must itself be rounding-sized: no logit may move between the paths by more than NOISE_CAP_ULPS ulps of
the dtype (and NOISE_CAP_RELATIVE of the logits' binade: float32's ulps are too fine for a deep target's
reductions). Six lookalike targets of the bundled pair in bfloat16 moved a parting's logits by up to 26 ulps
(1.62 at 13.9) between the paths, where float32 parted nowhere: rounding reaches that far. Larger, the target's two paths disagree beyond rounding (a kernel wrong for blocks, say): the tool
cannot run this target exactly, and says so (exit 1) rather than judge the draft.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MANTISSA_BITS = {"bfloat16": 7, "float16": 10, "float32": 23}
MARGIN_ULPS = 1  # a parting within the measured noise plus this many ulps of the top logit is a near-tie
NOISE_CAP_ULPS = 32  # path noise above this many ulps (and NOISE_CAP_RELATIVE of the binade) is not rounding
NOISE_CAP_RELATIVE = 2.0 ** -10


def binade(logit: float) -> float:
    """2^floor(log2|logit|) (float16's smallest normal for logits nearer 0)."""
    return 2.0 ** math.floor(math.log2(max(abs(logit), 2.0 ** -14)))


def ulp(logit: float, dtype: str) -> float:
    """One unit in the last place of `logit` in `dtype` (bfloat16 for a dtype not known)."""
    return binade(logit) * 2.0 ** -MANTISSA_BITS.get(dtype, MANTISSA_BITS["bfloat16"])


@dataclass(frozen=True)
class PathParting:
    """Token `at` (0-based) of a speculative output is `other`, where the target's one-token decode takes `taken`;
    the two tokens' logits in the one-token decode and in the verify block (None: not recomputed)."""

    at: int
    taken: int | None
    other: int | None
    dtype: str
    taken_logit: float | None = None
    other_logit: float | None = None
    verify_taken: float | None = None
    verify_other: float | None = None

    @property
    def measured(self) -> bool:
        return None not in (self.taken_logit, self.other_logit, self.verify_taken, self.verify_other)

    @property
    def gap(self) -> float | None:
        return None if None in (self.taken_logit, self.other_logit) else self.taken_logit - self.other_logit

    @property
    def verify_gap(self) -> float | None:
        return self.verify_taken - self.verify_other if self.measured else None

    @property
    def moved(self) -> float | None:
        """The measured noise: how far the paths moved the gap towards the speculative token."""
        return None if not self.measured else self.gap - self.verify_gap

    @property
    def noise(self) -> float | None:
        """The largest move of either logit between the paths."""
        if not self.measured:
            return None
        return max(abs(self.verify_taken - self.taken_logit), abs(self.verify_other - self.other_logit))

    @property
    def margin(self) -> float:
        return MARGIN_ULPS * ulp(self.taken_logit or 0.0, self.dtype)

    @property
    def cap(self) -> float:
        top = self.taken_logit or 0.0
        return max(NOISE_CAP_ULPS * ulp(top, self.dtype), NOISE_CAP_RELATIVE * binade(top))

    @property
    def beyond_rounding(self) -> bool:
        """The two paths disagree here by more than rounding, and the gap is wider than the margin alone."""
        return self.measured and self.noise > self.cap and self.gap > self.margin

    @property
    def near_tie(self) -> bool:
        if self.gap is None:
            return False
        if self.gap <= self.margin:
            return True
        return self.measured and self.noise <= self.cap and self.gap <= self.moved + self.margin

    def describe(self) -> str:
        if self.gap is None:
            return f"the target's greedy output has {self.taken}, the speculative one {self.other}"
        u = ulp(self.taken_logit, self.dtype)
        what = (f"the target's one-token decode takes {self.taken} (logit {self.taken_logit:.4g}), the speculative "
                f"output {self.other} ({self.other_logit:.4g}): gap {self.gap:.3g} = {self.gap / u:.1f} {self.dtype} "
                "ulps")
        if not self.measured:
            return what + (", a near-tie within the margin" if self.near_tie else ", not a near-tie")
        paths = (f"; the verify block computes them {self.verify_taken:.4g} and {self.verify_other:.4g}, gap "
                 f"{self.verify_gap:.3g}: the paths moved it by {self.moved:.3g} = {self.moved / u:.1f} ulps (largest "
                 f"logit move {self.noise:.3g})")
        if self.near_tie:
            return what + paths + (f": a near-tie, the gap within that noise + {MARGIN_ULPS} ulp (the target's own "
                                   "rounding, not the draft)")
        if self.beyond_rounding:
            return what + paths + f": the paths differ beyond rounding (cap {self.cap:.3g})"
        return what + paths + f": not a near-tie, the gap is wider than that noise + {MARGIN_ULPS} ulp"
