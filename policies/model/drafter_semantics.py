"""What a drafter allows and guarantees, per method: whether a shorter draft is the prefix of a longer one, and
which numbers of draft tokens k a deployment may run.

Prefix-stable drafters make the acceptance at gamma < k readable off the k-run's per-position counters
(policies/model/acceptance.py: a chain of gamma drafts is accepted exactly as far as the first gamma positions of
a k chain). That holds when draft token i depends only on the context and drafts before it, and the proposal does
not depend on k:

    ngram        yes: the tokens after the longest n-gram match, cut at k (vLLM ngram_proposer.py)
    eagle/eagle3 yes: autoregressive head, greedy draft sampling by default (vLLM 0.33 spec_decode/)
    mtp          yes: the MTP layer run autoregressively (vLLM 0.33 config/speculative.py)
    draft_model  yes: an autoregressive model
    suffix       no: each request's draft length is capped at min(k, factor x match length) and the suffix tree's
                 best path depends on it (arctic-inference suffix_decoding.py), so the k-run's positions are not
                 a shorter run's
A block drafter (DFlash, DSpark: a non-causal block of 1 + k query tokens) is not prefix-stable either; it is not
a method here, and a deployment that runs one states its allowed k (below).

A deployment can state otherwise (`drafter.prefix_stable`): a multi-layer MTP module whose first positions change
with k (reported: 83.4% first-position acceptance at k=1 against 76.2% at k=8), or a block drafter.

For a drafter that is not prefix-stable every gamma < k is flagged extrapolated: the counters measured the k
chain, and a shorter configuration drafts other tokens.

Allowed k: most methods run any k >= 1. Constraints the engine enforces at start-up (vLLM 0.33: MTP with n_predict
> 1 needs k a multiple of n_predict; a DSpark drafter of block size b needs k = b on some models; DFlash
checkpoints are trained for one block size) are the deployment's to state: the drafter setting `allowed_k` lists
them, and the curve then prices only those k (and off, and the running k). Example: allowed_k (2, 4) at gamma_max
6 -> the curve holds gamma 0, 2, 4 (and 3 if the engine runs k 3 now).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from policies.types import CurvePoint, DraftMethod

PREFIX_STABLE: Mapping[DraftMethod, bool] = MappingProxyType({
    DraftMethod.NGRAM: True,
    DraftMethod.SUFFIX: False,
    DraftMethod.EAGLE: True,
    DraftMethod.EAGLE3: True,
    DraftMethod.MTP: True,
    DraftMethod.DRAFT_MODEL: True,
})


FULL_LENGTH: frozenset[DraftMethod] = frozenset({DraftMethod.EAGLE, DraftMethod.EAGLE3, DraftMethod.MTP,
                                                  DraftMethod.DRAFT_MODEL})
"""Drafters that propose all k tokens every step unless the engine's own controller or schedule cuts them short
(model heads and draft models); n-gram and suffix drafts end where the match does."""


def drafts_full_length(method: DraftMethod) -> bool:
    """Whether a draft of `method` runs to k unless the engine cuts it (`FULL_LENGTH`)."""
    return method in FULL_LENGTH


def prefix_stable(method: DraftMethod, declared: bool | None = None) -> bool:
    """Whether a shorter draft of `method` is the prefix of a longer one (module docstring); `declared` (the
    deployment's own statement) wins. Example: (MTP, None) -> True; (MTP, False) -> False."""
    return PREFIX_STABLE[method] if declared is None else declared


def allowed_curve(
    curve: tuple[CurvePoint, ...], allowed_k: tuple[int, ...], *, running: int
) -> tuple[CurvePoint, ...]:
    """The points of `curve` a deployment may run: off (gamma 0), the running gamma, and every gamma in
    `allowed_k`; the whole curve when `allowed_k` is empty (any k). Example: gammas 0..4, allowed (2, 4), running
    3 -> gammas 0, 2, 3, 4."""
    if not allowed_k:
        return curve
    keep = {0, running, *allowed_k}
    return tuple(point for point in curve if point.gamma in keep)
