"""What the speculative loop yields. Frozen dataclasses, so consumers (CLI, chat, bench) cannot
change the loop's record of what happened."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .logprobs import TokenLogprob


class Source(str, Enum):
    """Where a token came from. The colour legend is built from these."""

    DRAFT = "draft"  # proposed by a draft model and accepted by the target
    NGRAM = "ngram"  # proposed by n-gram prompt lookup and accepted by the target
    MTP = "mtp"  # proposed by a drafter reading the target (NextN head, Gemma 4 assistant, EAGLE-3), accepted
    CORRECTION = "correction"  # target's own token where a draft token was rejected
    BONUS = "bonus"  # target's extra token after all drafts of a round were accepted
    TARGET = "target"  # plain decoding (no draft this round)


#: The token-source legend, shared by the terminal's stream and the web page (both import it from here).
#: One colour per provenance. Green = the draft was right; red = the target had to correct it;
#: blue = the target's free extra token after a fully accepted round; magenta = n-gram lookup; cyan =
#: a drafter that reads the target's hidden states (its multi-token-prediction head, an EAGLE-3 head).
STYLES: dict[Source, str] = {
    Source.DRAFT: "green",
    Source.NGRAM: "magenta",
    Source.MTP: "cyan",
    Source.CORRECTION: "red",
    Source.BONUS: "blue",
    Source.TARGET: "",
}

LABELS: dict[Source, str] = {
    Source.DRAFT: "accepted from draft",
    Source.NGRAM: "accepted from n-gram lookup",
    Source.MTP: "accepted from the model's MTP or EAGLE-3 head",
    Source.CORRECTION: "corrected by target",
    Source.BONUS: "added by target",
    Source.TARGET: "target (no draft)",
}


def sources_for(drafter_sources: list[Source]) -> tuple[Source, ...]:
    """The sources a run can produce, for its legend: each drafter's, then the target's two."""
    if not drafter_sources:
        return (Source.TARGET,)
    return (*dict.fromkeys(drafter_sources), Source.CORRECTION, Source.BONUS)


@dataclass(frozen=True, slots=True)
class Token:
    """One committed token. `text` may be "" when the token ends inside a multi-byte character;
    the following token then carries the whole character. `logprob`: the target's log-probabilities
    at this position, only when the loop was asked for them (loop.Settings.logprobs)."""

    id: int
    text: str
    source: Source
    drafter: str | None = None
    logprob: TokenLogprob | None = None


@dataclass(frozen=True, slots=True)
class Round:
    """One verify pass of the target: how many tokens were drafted and how many the target kept."""

    drafter: str | None
    k: int
    drafted: int
    accepted: int
    emitted: int
    seconds: float  # the whole round: drafting + verification
    draft_seconds: float = 0.0
    recheck: bool = False  # stopped at a near-tie, which the next round evaluates one token alone
    route: str | None = None  # the drafter's context class this round (Drafter.route)
    proposed: int | None = None  # draft tokens in the verify batch (None: `drafted`); batch = this + 1
    catch_up_seconds: float = 0.0  # part of draft_seconds spent catching the draft's cache up
    #: one-token draft decodes the rest of draft_seconds paid for (Proposal.decodes; None: one per
    #: proposed token)
    draft_decodes: int | None = None
    confidence: tuple[float, ...] = ()  # the drafter's confidence in each judged draft token
    margin_rows: int = 0  # rows judged with the tie margin (a near-tie there stopped the walk)
    #: rows that decided a token this round, and how many of them had a top-2 gap within the tie
    #: margin (counted in every round, plain ones too: prose has many near-ties, copied code few)
    gap_rows: int = 0
    near_ties: int = 0
    drifted: int = 0  # tokens this round left in the target cache with batched, not one-token, K/V
    repaired: int = 0  # tokens re-decoded in exact batches after a near-tie on a drifted cache
    repair_seconds: float = 0.0  # time of that repair (not part of `seconds`)
    #: a token tree's side nodes in the verify batch (decoding/tree.py), and the accepted tokens
    #: among them; `drafted`, `accepted` and `confidence` count the main chain only
    side_nodes: int = 0
    side_accepted: int = 0
    #: the tree offered a side node where the target turned the chain's token down (whether one was
    #: then accepted: side_accepted)
    side_tried: bool = False
    #: tokens a recurrent target's last rollback left, decoded in front of this round's verify batch
    #: (llama/rollback.py): the batch had proposed + 1 + replayed rows
    replayed: int = 0


@dataclass(frozen=True, slots=True)
class Notice:
    """Something the user should know that is not an error (e.g. context window full)."""

    message: str


@dataclass(frozen=True, slots=True)
class DrafterStats:
    name: str
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    seconds: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def __add__(self, other: DrafterStats) -> DrafterStats:
        """Both counts of one drafter added up (a running total and one round, or two answers'
        totals): the frozen record is replaced, never changed, so a snapshot handed out stays as it was."""
        return DrafterStats(
            name=self.name,
            rounds=self.rounds + other.rounds,
            drafted=self.drafted + other.drafted,
            accepted=self.accepted + other.accepted,
            seconds=self.seconds + other.seconds,
        )


@dataclass(frozen=True, slots=True)
class RouteStats:
    """One drafter on one route (its context class, e.g. an n-gram match of 16+ tokens): how the
    planner's per-context choices worked out."""

    drafter: str
    route: str | None
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    rechecked: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def __add__(self, other: RouteStats) -> RouteStats:
        """Both counts of one drafter on one route added up (see DrafterStats.__add__)."""
        return RouteStats(
            drafter=self.drafter,
            route=self.route,
            rounds=self.rounds + other.rounds,
            drafted=self.drafted + other.drafted,
            accepted=self.accepted + other.accepted,
            rechecked=self.rechecked + other.rechecked,
        )


@dataclass(frozen=True, slots=True)
class Stats:
    """Totals for one generation. Times are wall-clock seconds measured by the loop."""

    prompt_tokens: int
    prefill_tokens: int
    generated_tokens: int
    prefill_seconds: float
    decode_seconds: float
    drafted: int
    accepted: int
    target_passes: int
    stop_reason: str
    accepted_by_position: tuple[int, ...] = ()
    drafted_by_position: tuple[int, ...] = ()
    drafters: tuple[DrafterStats, ...] = field(default_factory=tuple)
    k_history: tuple[int, ...] = ()
    rechecked: int = 0  # near-tie positions re-evaluated one token alone (Settings.tie_margin)
    routes: tuple[RouteStats, ...] = ()
    repaired: int = 0  # tokens re-decoded after near-ties on a drifted cache (loop.generate)

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_per_pass(self) -> float:
        return self.accepted / self.target_passes if self.target_passes else 0.0

    @property
    def tokens_per_pass(self) -> float:
        return self.generated_tokens / self.target_passes if self.target_passes else 0.0

    def to_dict(self) -> dict[str, object]:
        """JSON-ready view, with the derived rates included."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "prefill_tokens": self.prefill_tokens,
            "generated_tokens": self.generated_tokens,
            "prefill_seconds": round(self.prefill_seconds, 6),
            "decode_seconds": round(self.decode_seconds, 6),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "target_passes": self.target_passes,
            "mean_accepted_per_pass": round(self.mean_accepted_per_pass, 4),
            "tokens_per_pass": round(self.tokens_per_pass, 4),
            "stop_reason": self.stop_reason,
            "accepted_by_position": list(self.accepted_by_position),
            "drafted_by_position": list(self.drafted_by_position),
            "k_history": list(self.k_history),
            "rechecked": self.rechecked,
            "repaired": self.repaired,
            "drafters": [
                {
                    "name": d.name,
                    "rounds": d.rounds,
                    "drafted": d.drafted,
                    "accepted": d.accepted,
                    "acceptance_rate": round(d.acceptance_rate, 4),
                    "seconds": round(d.seconds, 6),
                }
                for d in self.drafters
            ],
            "routes": [
                {
                    "drafter": r.drafter,
                    "route": r.route,
                    "rounds": r.rounds,
                    "drafted": r.drafted,
                    "accepted": r.accepted,
                    "acceptance_rate": round(r.acceptance_rate, 4),
                    "rechecked": r.rechecked,
                }
                for r in self.routes
            ],
        }


@dataclass(frozen=True, slots=True)
class Done:
    """Last event of a generation."""

    stats: Stats


Event = Token | Round | Notice | Done


def total(stats: Sequence[Stats], *, one_prompt: bool) -> Stats:
    """Several generations' stats added up (rates are recomputed from the sums). `one_prompt`: n
    answers to one prompt (the server's `n`), whose prompt counts once and whose stop reason is theirs
    when they share it, else "mixed"; otherwise turns of a conversation, whose prompts add up and
    which have no one stop reason."""
    if one_prompt and len(stats) == 1:
        return stats[0]
    drafters: dict[str, DrafterStats] = {}
    for d in (d for s in stats for d in s.drafters):
        drafters[d.name] = drafters.get(d.name, DrafterStats(d.name)) + d
    routes: dict[tuple[str, str | None], RouteStats] = {}
    for r in (r for s in stats for r in s.routes):
        key = (r.drafter, r.route)
        routes[key] = routes.get(key, RouteStats(drafter=r.drafter, route=r.route)) + r
    reasons = {s.stop_reason for s in stats}
    return Stats(
        prompt_tokens=stats[0].prompt_tokens if one_prompt else sum(s.prompt_tokens for s in stats),
        prefill_tokens=sum(s.prefill_tokens for s in stats),
        generated_tokens=sum(s.generated_tokens for s in stats),
        prefill_seconds=sum(s.prefill_seconds for s in stats),
        decode_seconds=sum(s.decode_seconds for s in stats),
        drafted=sum(s.drafted for s in stats),
        accepted=sum(s.accepted for s in stats),
        target_passes=sum(s.target_passes for s in stats),
        stop_reason=(reasons.pop() if len(reasons) == 1 else "mixed") if one_prompt else "",
        accepted_by_position=_add(s.accepted_by_position for s in stats),
        drafted_by_position=_add(s.drafted_by_position for s in stats),
        drafters=tuple(drafters.values()),
        k_history=tuple(k for s in stats for k in s.k_history),
        rechecked=sum(s.rechecked for s in stats),
        routes=tuple(routes.values()),
        repaired=sum(s.repaired for s in stats),
    )


def _add(rows: Iterable[tuple[int, ...]]) -> tuple[int, ...]:
    """Element-wise sum of per-position counts of different lengths."""
    out: list[int] = []
    for row in rows:
        out.extend([0] * (len(row) - len(out)))
        for i, v in enumerate(row):
            out[i] += v
    return tuple(out)
