"""Exchange between stores (RFC 0002): push, fetch, handover, declare-record, take-back,
the transports that reach a remote, and the recorder that records locally and pushes."""

from .operations import UNSET, ExchangeResult, StoreEndpoint, declare_record, fetch, handover, push, take_back

__all__ = ["UNSET", "ExchangeResult", "StoreEndpoint", "declare_record", "fetch", "handover", "push", "take_back"]
