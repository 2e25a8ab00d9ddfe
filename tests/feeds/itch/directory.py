"""The fields of a stock directory (R) message that tests leave at ordinary values."""

from __future__ import annotations

from typing import Any

R_FIELDS: dict[str, Any] = {
    "market_category": "Q",
    "financial_status_indicator": "N",
    "round_lot_size": 100,
    "round_lots_only": "N",
    "issue_classification": "C",
    "issue_sub_type": "Z",
    "authenticity": "P",
    "short_sale_threshold_indicator": "N",
    "ipo_flag": " ",
    "luld_reference_price_tier": "1",
    "etp_flag": "N",
    "etp_leverage_factor": 0,
    "inverse_indicator": "N",
}
