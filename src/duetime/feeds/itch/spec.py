"""The 23 messages of Nasdaq TotalView-ITCH 5.0, written once as typed message classes.

Each class below is both the decoded message (an immutable NamedTuple, cheap to build, which
the parser returns) and the wire layout: every field's annotation carries its byte width and
kind, and `SPECS` is derived from those annotations when the module is imported, so the layout
and the Python names can never disagree. The lengths are checked against the published ones.

Wire rules (all of ITCH 5.0):
- every message starts with type (1 byte, ASCII letter), stock locate (uint16, 0 for
  market-wide messages), tracking number (uint16) and timestamp (6 bytes, ns since midnight);
- integers are unsigned big-endian; order reference and match numbers are uint64;
- `price4` is a uint32 with 4 implied decimals (1234500 = $123.45), `price8` (MWCB levels only)
  a uint64 with 8 implied decimals; prices stay raw integers everywhere in this package;
- `alpha` fields are ASCII, left-justified and space-padded (stock symbols: 8 bytes). Decoded,
  fields wider than one byte lose their right padding ("A       " → "A"); one-byte fields
  stay one character, since a space is a meaningful value there (e.g. "not available");
- in files (and MoldUDP64 blocks) every message is preceded by a 2-byte big-endian length.

Field names are the snake_case of the specification's names (`order_reference_number`,
`buy_sell_indicator` 'B'/'S', `executed_shares`, `printable` 'Y'/'N', `cancelled_shares`,
`original_order_reference_number`, `cross_price`, `cross_type`, …); the writer takes the same
names as keyword arguments. Source: Nasdaq TotalView-ITCH 5.0 specification, including the
2023 addendum that added the 'O' (DLCR price discovery) message.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Annotated, Literal, NamedTuple

Kind = Literal["uint", "alpha", "price4", "price8", "timestamp6"]


@dataclass(frozen=True, slots=True)
class Wire:
    """How one field is laid out on the wire: its width in bytes and how to read it."""

    width: int
    kind: Kind


U2 = Annotated[int, Wire(2, "uint")]
U4 = Annotated[int, Wire(4, "uint")]
U8 = Annotated[int, Wire(8, "uint")]
Price4 = Annotated[int, Wire(4, "price4")]
Price8 = Annotated[int, Wire(8, "price8")]
Timestamp6 = Annotated[int, Wire(6, "timestamp6")]
Char = Annotated[str, Wire(1, "alpha")]
Alpha2 = Annotated[str, Wire(2, "alpha")]
Alpha4 = Annotated[str, Wire(4, "alpha")]
Stock = Annotated[str, Wire(8, "alpha")]

PRICE4_SCALE = 10_000
PRICE8_SCALE = 100_000_000
MAX_TIMESTAMP = (1 << 48) - 1
HEADER_LENGTH = 11
"""type + stock locate + tracking number + timestamp."""
PREFIX_LENGTH = 2
"""The big-endian length before each message in a file or a MoldUDP64 block."""


# --- system-wide and stock-related messages ------------------------------------------------


class SystemEvent(NamedTuple):
    """S: System Event (12 bytes). event_code: O S Q M E C (start/end of messages, hours)."""

    type: Literal["S"]
    stock_locate: U2
    tracking_number: U2
    timestamp: Timestamp6
    event_code: Char


class StockDirectory(NamedTuple):
    """R: Stock Directory (39 bytes), one per symbol at the start of the day."""

    type: Literal["R"]
    stock_locate: U2
    tracking_number: U2
    timestamp: Timestamp6
    stock: Stock
    market_category: Char
    financial_status_indicator: Char
    round_lot_size: U4
    round_lots_only: Char
    issue_classification: Char
    issue_sub_type: Alpha2
    authenticity: Char
    short_sale_threshold_indicator: Char
    ipo_flag: Char
    luld_reference_price_tier: Char
    etp_flag: Char
    etp_leverage_factor: U4
    inverse_indicator: Char


class StockTradingAction(NamedTuple):
    """H: Stock Trading Action (25 bytes). trading_state: H P Q T."""

    type: Literal["H"]
    stock_locate: U2
    tracking_number: U2
    timestamp: Timestamp6
    stock: Stock
    trading_state: Char
    reserved: Char
    reason: Alpha4


class RegShoRestriction(NamedTuple):
    """Y: Reg SHO Short Sale Price Test Restricted Indicator (20 bytes). action: 0 1 2."""

    type: Literal["Y"]
    stock_locate: U2
    tracking_number: U2
    timestamp: Timestamp6
    stock: Stock
    reg_sho_action: Char


class MarketParticipantPosition(NamedTuple):
    """L: Market Participant Position (26 bytes)."""

    type: Literal["L"]
    stock_locate: U2
    tracking_number: U2
    timestamp: Timestamp6
    mpid: Alpha4
    stock: Stock
    primary_market_maker: Char
    market_maker_mode: Char
    market_participant_state: Char


class MwcbDeclineLevel(NamedTuple):
    """V: MWCB Decline Level (35 bytes), market-wide (locate 0); levels are Price(8)."""

    type: Literal["V"]
    stock_locate: U2
    tracking_number: U2
    timestamp: Timestamp6
    level1: Price8
    level2: Price8
    level3: Price8


class MwcbStatus(NamedTuple):
    """W: MWCB Status (12 bytes), market-wide (locate 0). breached_level: 1 2 3."""

    type: Literal["W"]
    stock_locate: U2
    tracking_number: U2
    timestamp: Timestamp6
    breached_level: Char


class IpoQuotingPeriodUpdate(NamedTuple):
    """K: IPO Quoting Period Update (28 bytes). Release time in seconds since midnight."""

    type: Literal["K"]
    stock_locate: U2
    tracking_number: U2
    timestamp: Timestamp6
    stock: Stock
    ipo_quotation_release_time: U4
    ipo_quotation_release_qualifier: Char
    ipo_price: Price4


class LuldAuctionCollar(NamedTuple):
    """J: LULD Auction Collar (35 bytes)."""

    type: Literal["J"]
    stock_locate: U2
    tracking_number: U2
    timestamp: Timestamp6
    stock: Stock
    auction_collar_reference_price: Price4
    upper_auction_collar_price: Price4
    lower_auction_collar_price: Price4
    auction_collar_extension: U4


class OperationalHalt(NamedTuple):
    """h: Operational Halt (21 bytes). market_code Q B X; operational_halt_action H T."""

    type: Literal["h"]
    stock_locate: U2
    tracking_number: U2
    timestamp: Timestamp6
    stock: Stock
    market_code: Char
    operational_halt_action: Char


# --- order book messages -------------------------------------------------------------------


class AddOrder(NamedTuple):
    """A: Add Order, no MPID attribution (36 bytes)."""

    type: Literal["A"]
    stock_locate: U2
    tracking_number: U2
    timestamp: Timestamp6
    order_reference_number: U8
    buy_sell_indicator: Char
    shares: U4
    stock: Stock
    price: Price4


class AddOrderMpid(NamedTuple):
    """F: Add Order with MPID attribution (40 bytes)."""

    type: Literal["F"]
    stock_locate: U2
    tracking_number: U2
    timestamp: Timestamp6
    order_reference_number: U8
    buy_sell_indicator: Char
    shares: U4
    stock: Stock
    price: Price4
    attribution: Alpha4


class OrderExecuted(NamedTuple):
    """E: Order Executed (31 bytes), at the order's own price."""

    type: Literal["E"]
    stock_locate: U2
    tracking_number: U2
    timestamp: Timestamp6
    order_reference_number: U8
    executed_shares: U4
    match_number: U8


class OrderExecutedWithPrice(NamedTuple):
    """C: Order Executed With Price (36 bytes), at a price other than the order's."""

    type: Literal["C"]
    stock_locate: U2
    tracking_number: U2
    timestamp: Timestamp6
    order_reference_number: U8
    executed_shares: U4
    match_number: U8
    printable: Char
    execution_price: Price4


class OrderCancel(NamedTuple):
    """X: Order Cancel (23 bytes): part of the order's shares removed, the order stays."""

    type: Literal["X"]
    stock_locate: U2
    tracking_number: U2
    timestamp: Timestamp6
    order_reference_number: U8
    cancelled_shares: U4


class OrderDelete(NamedTuple):
    """D: Order Delete (19 bytes)."""

    type: Literal["D"]
    stock_locate: U2
    tracking_number: U2
    timestamp: Timestamp6
    order_reference_number: U8


class OrderReplace(NamedTuple):
    """U: Order Replace (35 bytes): the original order is gone, the new one keeps its side."""

    type: Literal["U"]
    stock_locate: U2
    tracking_number: U2
    timestamp: Timestamp6
    original_order_reference_number: U8
    new_order_reference_number: U8
    shares: U4
    price: Price4


# --- trade and auction messages ------------------------------------------------------------


class Trade(NamedTuple):
    """P: Trade, non-cross (44 bytes): a match against a hidden order; the book is unchanged."""

    type: Literal["P"]
    stock_locate: U2
    tracking_number: U2
    timestamp: Timestamp6
    order_reference_number: U8
    buy_sell_indicator: Char
    shares: U4
    stock: Stock
    price: Price4
    match_number: U8


class CrossTrade(NamedTuple):
    """Q: Cross Trade (40 bytes). shares is uint64; cross_type O C H I."""

    type: Literal["Q"]
    stock_locate: U2
    tracking_number: U2
    timestamp: Timestamp6
    shares: U8
    stock: Stock
    cross_price: Price4
    match_number: U8
    cross_type: Char


class BrokenTrade(NamedTuple):
    """B: Broken Trade (19 bytes): the execution with this match number is void."""

    type: Literal["B"]
    stock_locate: U2
    tracking_number: U2
    timestamp: Timestamp6
    match_number: U8


class Noii(NamedTuple):
    """I: Net Order Imbalance Indicator (50 bytes), before the crosses."""

    type: Literal["I"]
    stock_locate: U2
    tracking_number: U2
    timestamp: Timestamp6
    paired_shares: U8
    imbalance_shares: U8
    imbalance_direction: Char
    stock: Stock
    far_price: Price4
    near_price: Price4
    current_reference_price: Price4
    cross_type: Char
    price_variation_indicator: Char


class RetailInterest(NamedTuple):
    """N: Retail Price Improvement Indicator (20 bytes). interest_flag: B S A N."""

    type: Literal["N"]
    stock_locate: U2
    tracking_number: U2
    timestamp: Timestamp6
    stock: Stock
    interest_flag: Char


class DirectListingPriceDiscovery(NamedTuple):
    """O: Direct Listing with Capital Raise Price Discovery (48 bytes), added in 2023.

    near_execution_time is a uint64 time (ns); the collars are Price(4).
    """

    type: Literal["O"]
    stock_locate: U2
    tracking_number: U2
    timestamp: Timestamp6
    stock: Stock
    open_eligibility_status: Char
    minimum_allowable_price: Price4
    maximum_allowable_price: Price4
    near_execution_price: Price4
    near_execution_time: U8
    lower_price_range_collar: Price4
    upper_price_range_collar: Price4


Message = (
    SystemEvent
    | StockDirectory
    | StockTradingAction
    | RegShoRestriction
    | MarketParticipantPosition
    | MwcbDeclineLevel
    | MwcbStatus
    | IpoQuotingPeriodUpdate
    | LuldAuctionCollar
    | OperationalHalt
    | AddOrder
    | AddOrderMpid
    | OrderExecuted
    | OrderExecutedWithPrice
    | OrderCancel
    | OrderDelete
    | OrderReplace
    | Trade
    | CrossTrade
    | BrokenTrade
    | Noii
    | RetailInterest
    | DirectListingPriceDiscovery
)

PUBLISHED_LENGTHS: dict[str, int] = {
    "S": 12, "R": 39, "H": 25, "Y": 20, "L": 26, "V": 35, "W": 12, "K": 28, "J": 35, "h": 21,
    "A": 36, "F": 40, "E": 31, "C": 36, "X": 23, "D": 19, "U": 35, "P": 44, "Q": 40, "B": 19,
    "I": 50, "N": 20, "O": 48,
}  # fmt: skip
"""Total message lengths (type byte included) as the specification lists them."""


@dataclass(frozen=True, slots=True)
class Field:
    """One field of one message: its name, where it starts in the message, width and kind."""

    name: str
    offset: int
    width: int
    kind: Kind


@dataclass(frozen=True, slots=True)
class MessageSpec:
    """One message type: its letter, class, title, length and fields after the type byte."""

    letter: str
    cls: type[Message]
    title: str
    length: int
    fields: tuple[Field, ...]

    @property
    def body_fields(self) -> tuple[Field, ...]:
        """The fields after the common header (stock locate, tracking number, timestamp)."""
        return self.fields[3:]

    @property
    def struct_format(self) -> str:
        """A `struct` format packing the whole message: the type byte as 'c', the timestamp
        as its high 16 and low 32 bits, one-byte alpha fields as 'c', wider ones as 'Ns'."""
        return ">c" + "".join(_struct_code(f) for f in self.fields)


def _struct_code(field: Field) -> str:
    if field.kind == "timestamp6":
        return "HI"
    if field.kind == "alpha":
        return "c" if field.width == 1 else f"{field.width}s"
    return {2: "H", 4: "I", 8: "Q"}[field.width]


def _build_spec(cls: type[Message]) -> MessageSpec:
    hints = typing.get_type_hints(cls, include_extras=True)
    (letter,) = typing.get_args(hints["type"])
    fields: list[Field] = []
    offset = 1
    for name in cls._fields[1:]:
        (wire,) = (m for m in hints[name].__metadata__ if isinstance(m, Wire))
        fields.append(Field(name, offset, wire.width, wire.kind))
        offset += wire.width
    title = (cls.__doc__ or "").split("\n")[0].split(": ", 1)[1].split(" (")[0]
    published = PUBLISHED_LENGTHS[letter]
    if published != offset:
        raise AssertionError(f"{cls.__name__}: {offset} bytes, the specification says {published}")
    return MessageSpec(letter, cls, title, offset, tuple(fields))


SPECS: dict[str, MessageSpec] = {
    spec.letter: spec for spec in map(_build_spec, typing.get_args(Message))
}
"""Every message type by its letter, in the order of the specification's sections."""
LENGTHS: dict[str, int] = {letter: spec.length for letter, spec in SPECS.items()}
LETTERS = "".join(SPECS)
"""The 23 type letters: SRHYLVWKJhAFECXDUPQBINO."""
