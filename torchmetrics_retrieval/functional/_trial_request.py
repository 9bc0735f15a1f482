"""The checked options of the trial values (``TrialRequest``), shared by the checks and the score sweep."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from torchmetrics_retrieval.functional._checks import (
    check_bool,
    check_choice,
    check_fractions,
    check_open_fractions,
)
from torchmetrics_retrieval.functional._pairs.rates import RateRequest

__all__ = ["FAR_RULES", "TrialRequest"]

#: The rules of reading TAR at a FAR (``far_rule``).
FAR_RULES = ("exact", "nearest_roc_point")


class TrialRequest(NamedTuple):
    """The checked options of :func:`score_values`."""

    fmr_vals: tuple[float, ...]
    rates: RateRequest
    roc_auc: bool
    cllr: bool
    act_dcf_p_target: tuple[float, ...]
    far_rule: str

    @classmethod
    def checked(
        cls,
        fmr_vals: float | Iterable[float],
        eer: Any,
        min_dcf_p_target: float | Iterable[float],
        dcf_costs: Any,
        roc_auc: Any,
        cllr: Any,
        act_dcf_p_target: float | Iterable[float],
        far_rule: Any,
    ) -> TrialRequest:
        rates = RateRequest.checked(eer, min_dcf_p_target, dcf_costs)  # these three are checked before fmr_vals
        return cls(
            check_fractions("fmr_vals", fmr_vals),
            rates,
            check_bool("roc_auc", roc_auc),
            check_bool("cllr", cllr),
            check_open_fractions("act_dcf_p_target", act_dcf_p_target),
            check_choice("far_rule", far_rule, FAR_RULES),
        )
