"""Exchange between stores (RFC 0002): push, fetch, handover, declare-record, take-back,
the transports that reach a remote, and the recorder that records locally and pushes.

:mod:`.transport` is the interface (what crosses between stores),
:mod:`.endpoint` the receiving rules, :mod:`.local` the transport to a store
this process opens, :mod:`.remembered` what a store keeps of each remote, and
:mod:`.operations` the initiating side."""

from .endpoint import UNSET, StoreEndpoint
from .operations import ExchangeResult, declare_record, fetch, handover, push, take_back

__all__ = ["UNSET", "ExchangeResult", "StoreEndpoint", "declare_record", "fetch", "handover", "push", "take_back"]
