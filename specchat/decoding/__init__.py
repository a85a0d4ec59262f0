"""Exact speculative decoding, independent of any inference library.

Owns the loop (`loop.generate`), the drafters (draft model, n-gram lookup; the model-free ones by
name in `registry`), the sampling settings' table (`settings`), sampling and verification, the
logits processors of the settings that need the answer so far (`processors`), the planner (how many
tokens to draft, from which drafter) and its cost calibration, the events the loop yields, the
`Model` protocol every engine implements, log-probabilities, and the chat session (history,
templates applied through the `Engine` protocol, KV-cache reuse).

May import: the foundations (`specchat.errors`, `specchat.store`, `specchat.terminal`) and numpy.
Never llama_cpp, nor `specchat.llama`, `specchat.models`, `specchat.server`, `specchat.cli` or
`specchat.bench`: engines come in through `decoding.model.Model`.
"""
